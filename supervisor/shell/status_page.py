"""The status web page (``GET /`` on the status endpoint), for people who would rather look than read.

Pure: :func:`render_page` turns a ``/status`` snapshot into one self-contained HTML document (no
CDN, no fonts, no images from elsewhere: it works offline). Every value in it is text the guard did
not write itself (vLLM's lines, its evidence, the model's name, flag values) and goes through
:func:`_e` (``html.escape`` with quotes), and the only attribute values taken from the snapshot are
numbers (the bars' widths) or names from a fixed list (the state's class), so no string in a
snapshot can make an element or an attribute. ``PAGE_HEADERS`` carry a Content-Security-Policy
that runs only the page's own script and style (by their hashes) and lets it talk only to this
endpoint.

Why a small script rather than ``<meta http-equiv="refresh">``: the page is live (vLLM's output,
the phase) and has buttons that ask for the token; a reload every few seconds would empty the
token field and jump the scroll. The script fetches ``/`` every 2 s and swaps the ``#live`` part
(parsed, never evaluated), and sends ``POST /restart`` or ``/stop`` with the token typed in, as a
bearer header, only when a button is pressed; the token is never in the page, nor kept. Without
JavaScript the page still shows everything and reloads itself every 5 s.
"""

from __future__ import annotations

import base64
import hashlib
import html
import time
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.core.lifecycle import State
from supervisor.core.picture import LABELS
from supervisor.core.progress import PHASE_TEXT, seconds_text

_STATES = frozenset(s.value for s in State)
POLL_MS = 2000

_STYLE = """
:root{--fg:#1d2330;--muted:#5b6475;--bg:#f6f7f9;--card:#fff;--line:#dde1e8}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);background:var(--bg)}
header{padding:16px 24px;background:#1d2330;color:#fff;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header h1{margin:0;font-size:18px;font-weight:600}
header .model{font-family:ui-monospace,monospace;opacity:.85}
main{padding:16px 24px;display:grid;gap:16px;grid-template-columns:repeat(auto-fit,minmax(420px,1fr))}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 16px;min-width:0}
section.wide{grid-column:1/-1}
h2{font-size:14px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);margin:0 0 8px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;background:#888;color:#fff}
.state-healthy{background:#1f8a4c}.state-starting,.state-planning,.state-restarting{background:#2764c5}
.state-unhealthy,.state-backoff{background:#c77d0a}.state-failed{background:#c0392b}
.state-stopping,.state-stopped,.state-unknown{background:#6b7280}
dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
dt{color:var(--muted)}dd{margin:0;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top;overflow-wrap:anywhere}
th{color:var(--muted);font-weight:600;white-space:nowrap}
.nw{white-space:nowrap;overflow-wrap:normal}
.mono,pre,code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
pre{margin:0;max-height:420px;overflow:auto;background:#11151c;color:#d7dce5;padding:10px;border-radius:6px;
font-size:12px;line-height:1.35;white-space:pre-wrap;overflow-wrap:anywhere}
.failed,.died{color:#c0392b}.healthy{color:#1f8a4c}
svg{display:block;width:100%;height:auto}
.seg-weights{fill:#5b6bd5}.seg-activation{fill:#9b59b6}.seg-non_torch{fill:#8e8e8e}.seg-cudagraph{fill:#e67e22}
.seg-overhead{fill:#b07cc6}.seg-other_processes{fill:#c0392b}.seg-kv_cache{fill:#27ae60}.seg-unused{fill:#e3e6ea}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);margin:4px 0 10px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.legend .seg-weights{background:#5b6bd5}.legend .seg-activation{background:#9b59b6}
.legend .seg-non_torch{background:#8e8e8e}.legend .seg-cudagraph{background:#e67e22}
.legend .seg-overhead{background:#b07cc6}.legend .seg-other_processes{background:#c0392b}
.legend .seg-kv_cache{background:#27ae60}.legend .seg-unused{background:#e3e6ea}
.seg-runtime{fill:#b07cc6}.legend .seg-runtime{background:#b07cc6}
.controls{display:flex;gap:8px;flex-wrap:wrap;align-items:center}
input{font:inherit;padding:4px 8px;border:1px solid var(--line);border-radius:4px;min-width:16em}
button{font:inherit;padding:4px 12px;border-radius:4px;border:1px solid #2764c5;background:#2764c5;color:#fff;cursor:pointer}
button.danger{background:#c0392b;border-color:#c0392b}
#message{min-height:1.4em;color:var(--muted)}#message.error{color:#c0392b}
.muted{color:var(--muted)}
body>section{margin:0 24px 24px}
""".strip()

_SCRIPT = """
(function () {
  "use strict";
  var live = document.getElementById("live");
  function refresh() {
    fetch("/", {cache: "no-store"}).then(function (r) {
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.text();
    }).then(function (text) {
      var doc = new DOMParser().parseFromString(text, "text/html");
      var fresh = doc.getElementById("live");
      if (fresh) {
        var out = document.getElementById("output");
        var atEnd = !out || out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
        live.replaceChildren.apply(live, Array.prototype.slice.call(fresh.childNodes).map(function (n) {
          return document.adoptNode(n);
        }));
        document.title = doc.title;
        var now = document.getElementById("output");
        if (now && atEnd) { now.scrollTop = now.scrollHeight; }
        document.body.setAttribute("data-refreshed", String(Date.now()));
      }
    }).catch(function (e) {
      document.body.setAttribute("data-refresh-error", String(e));
    });
  }
  setInterval(refresh, %(poll)d);
  var out = document.getElementById("output");
  if (out) { out.scrollTop = out.scrollHeight; }
  var message = document.getElementById("message");
  function say(text, bad) { message.textContent = text; message.className = bad ? "error" : ""; }
  function command(path, what) {
    var token = document.getElementById("token").value.trim();
    if (!token) {
      say("Enter the guard's token first: $VLLM_GUARD_TOKEN, or the token file the guard names in its log.", true);
      return;
    }
    fetch(path, {method: "POST", cache: "no-store", headers: {"Authorization": "Bearer " + token}})
      .then(function (r) {
        if (r.status === 202) { say(what + " requested.", false); refresh(); }
        else if (r.status === 401 || r.status === 403) { say("The guard refused the token (HTTP " + r.status + ").", true); }
        else { say(what + " not accepted (HTTP " + r.status + ").", true); }
      })
      .catch(function (e) { say(what + " failed: " + e, true); });
  }
  document.getElementById("restart").addEventListener("click", function () { command("/restart", "Restart"); });
  document.getElementById("reset").addEventListener("click", function () {
    command("/restart?reset=1", "Restart with the flags you asked for");
  });
  document.getElementById("stop").addEventListener("click", function () { command("/stop", "Stop"); });
})();
""".strip() % {"poll": POLL_MS}

def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a snapshot's parts may be missing)."""
    return value if isinstance(value, Mapping) else {}



def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE_HEADERS = {
    "Content-Security-Policy": (f"default-src 'none'; script-src {_hash(_SCRIPT)}; style-src {_hash(_STYLE)}; "
                                "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
CONTENT_TYPE = "text/html; charset=utf-8"


def _e(value: Any) -> str:
    """Any value as HTML text: every <, >, &, " and ' escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _duration(seconds: Any) -> str:
    return seconds_text(_num(seconds)) if isinstance(seconds, (int, float)) else "-"


def _rows(pairs: Iterable[tuple[str, Any]]) -> str:
    return "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in pairs if v is not None)


def _now(snap: Mapping[str, Any]) -> str:
    state = str(snap.get("state") or "unknown")
    p = _mapping(snap.get("progress"))
    vllm = _mapping(snap.get("vllm"))
    probe = _mapping(snap.get("last_probe"))
    phase = p.get("text") or PHASE_TEXT.get(str(p.get("phase")), p.get("phase"))
    failure = snap.get("last_failure") if isinstance(snap.get("last_failure"), Mapping) else None
    failed = None
    if failure:
        failed = (f"launch {failure.get('launch')} {failure.get('outcome') or 'failed'}: {failure.get('kind')}"
                  + (" (healed)" if failure.get("healed") else ""))
    pairs = [("state", state), ("launch", p.get("launch")), ("phase", phase),
             ("elapsed", _duration(p.get("elapsed_s")) if p else None),
             ("healthy for", _duration(snap.get("healthy_for_s")) if snap.get("healthy_for_s") is not None else None),
             ("vLLM", vllm.get("url")), ("vLLM version", vllm.get("version")),
             ("probe", probe.get("text") or (None if not probe else ("ok" if probe.get("ok") else probe.get("error")))),
             ("last failure", failed), ("evidence", (failure or {}).get("evidence")),
             ("guard uptime", _duration(snap.get("uptime_s"))), ("guard pid", snap.get("guard_pid")),
             ("vLLM pid", snap.get("pid")), ("exit", snap.get("exit_reason"))]
    return f'<section id="now"><h2>Now</h2><dl>{_rows(pairs)}</dl></section>'


def _context(snap: Mapping[str, Any]) -> str:
    c = snap.get("context") if isinstance(snap.get("context"), Mapping) else None
    if not c:
        body = '<p class="muted">Known once a launch serves (vLLM prints the KV cache it sized).</p>'
    else:
        body = (f'<dl><dt>served</dt><dd id="context-served">{_e(c.get("served") or "vLLM default")}</dd>'
                f'<dt>fit</dt><dd id="context-fit">{_e(c.get("fit") or "-")}</dd>'
                f'<dt>asked</dt><dd id="context-asked">{_e(c.get("requested") or "-")}</dd></dl>'
                f'<p>{_e(c.get("text"))}</p>')
    return f'<section id="context"><h2>Context (tokens)</h2>{body}</section>'


def _flags(snap: Mapping[str, Any]) -> str:
    changed = _mapping(snap.get("changed_flags"))
    if not changed:
        return '<section id="flags"><h2>Changed flags</h2><p class="muted">None: the flags as you gave them.</p></section>'
    rows = []
    for flag, note in changed.items():
        note = note if isinstance(note, Mapping) else {"value": note}
        was, now = note.get("requested"), note.get("value")
        rows.append(f'<tr><td class="mono nw">{_e(flag)}</td><td class="mono nw">{_e("(unset)" if was is None else was or "(on)")}'
                    f'</td><td class="mono nw">{_e("(removed)" if now is None else now or "(on)")}</td>'
                    f'<td>{_e(note.get("why"))}</td><td class="nw">{_e(note.get("source"))}</td></tr>')
    return ('<section id="flags"><h2>Changed flags</h2><table><thead><tr><th>flag</th><th>asked</th><th>now</th>'
            f'<th>why</th><th>by</th></tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def _launches(snap: Mapping[str, Any]) -> str:
    records = [r for r in snap.get("launches") or [] if isinstance(r, Mapping)]
    if not records:
        return '<section id="launches" class="wide"><h2>Launches</h2><p class="muted">None yet.</p></section>'
    rows = []
    for r in reversed(records):
        outcome = str(r.get("outcome") or "?")
        css = outcome if outcome in ("failed", "died", "healthy") else ""
        started = r.get("started_at")
        when = time.strftime("%H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "-"
        healthy = _duration(r.get("time_to_healthy_s")) if r.get("time_to_healthy_s") is not None else "-"
        changed = _mapping(r.get("changed_flags"))
        flags = ", ".join(f"{k} {v.get('value') if isinstance(v, Mapping) else v}" for k, v in changed.items())
        diagnosis = f"{r.get('kind')}: {r.get('evidence') or ''}" if r.get("kind") else ""
        rows.append(f'<tr><td>{_e(r.get("n"))}</td><td class="nw">{_e(when)}</td><td class="nw {css}">{_e(outcome)}</td>'
                    f'<td class="nw">{_e(healthy)}</td><td class="mono">{_e(diagnosis)}</td>'
                    f'<td class="mono">{_e(flags)}</td></tr>')
    return ('<section id="launches" class="wide"><h2>Launches (newest first)</h2><table><thead><tr><th>#</th>'
            '<th>started</th><th>outcome</th><th>healthy in</th><th>diagnosis</th><th>changed flags</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>')


def _bar(picture: Mapping[str, Any] | None, title: str, ident: str) -> str:
    if not isinstance(picture, Mapping) or not picture.get("segments"):
        return ""
    total = _num(picture.get("total_gib"))
    segments = [(str(name), _num(gib)) for name, gib in picture["segments"]
                if isinstance(name, str) and name in LABELS]
    if total <= 0 or not segments:
        return ""
    scale, x, rects, legend = 1000.0 / max(total, sum(g for _, g in segments)), 0.0, [], []
    for name, gib in segments:
        w = gib * scale
        rects.append(f'<rect class="seg-{name}" x="{x:.2f}" y="0" width="{w:.2f}" height="36">'
                     f'<title>{_e(LABELS[name])}: {gib:.2f} GiB</title></rect>')
        legend.append(f'<span><i class="seg-{name}"></i>{_e(LABELS[name])} {gib:.2f} GiB</span>')
        x += w
    util = picture.get("utilization")
    share = f", share {_num(util):.2f}" if isinstance(util, (int, float)) else ""
    return (f'<div id="{ident}"><p><strong>{_e(title)}</strong> <span class="muted">({total:.2f} GiB{share})</span></p>'
            f'<svg viewBox="0 0 1000 36" role="img" aria-label="{_e(title)}">{"".join(rects)}</svg>'
            f'<div class="legend">{"".join(legend)}</div></div>')


def _memory(snap: Mapping[str, Any]) -> str:
    m = _mapping(snap.get("memory"))
    bars = _bar(m.get("plan"), "as the plan expects it", "memory-plan") + \
        _bar(m.get("vllm"), "as vLLM printed it", "memory-vllm")
    if not bars:
        bars = ('<p class="muted">No picture yet: it needs the GPU\'s size (NVML) and the model\'s config for the '
                'plan, and vLLM\'s "Model loading took" and "Available KV cache memory" lines.</p>')
    return f'<section id="memory"><h2>GPU memory (one rank)</h2>{bars}</section>'


def _output(snap: Mapping[str, Any]) -> str:
    # a progress bar redrawn with \r shows, as on a terminal, its last state
    lines = [next((p for p in reversed(str(x).split("\r")) if p), "") for x in snap.get("recent_output") or []]
    body = "\n".join(_e(line) for line in lines) or "(nothing yet)"
    return (f'<section id="vllm-output" class="wide"><h2>vLLM\'s output (last {len(lines)} lines)</h2>'
            f'<pre id="output">{body}</pre></section>')


def _controls() -> str:
    return ('<section id="controls" class="wide"><h2>Control</h2><div class="controls">'
            '<label for="token">token</label><input id="token" type="password" autocomplete="off" '
            'spellcheck="false" placeholder="the guard\'s bearer token">'
            '<button id="restart" type="button">Restart vLLM</button>'
            '<button id="reset" type="button">Restart with the flags asked for</button>'
            '<button id="stop" type="button" class="danger">Stop the guard</button></div>'
            '<p id="message" role="status"></p><p class="muted">The token is sent only when you press a button, '
            'as a bearer header; it is never stored. From a shell: <code>vllm-guard restart</code>, '
            '<code>vllm-guard stop</code>.</p></section>')


def render_page(snap: Mapping[str, Any], *, now: float | None = None) -> bytes:
    """The whole page for one snapshot (pure; ``now`` is accepted for callers that pin the clock)."""
    state = str(snap.get("state") or "unknown")
    css = state if state in _STATES else "unknown"
    title = f"{state} · {snap.get('model') or 'vllm-guard'} · vllm-guard"
    live = (f'<header><h1>vllm-guard</h1><span id="state" class="badge state-{css}">{_e(state)}</span>'
            f'<span class="model" id="model">{_e(snap.get("model"))}</span>'
            f'<span id="summary">{_e(snap.get("summary"))}</span></header>'
            f'<main>{_now(snap)}{_context(snap)}{_flags(snap)}{_memory(snap)}{_launches(snap)}'
            f'{_output(snap)}</main>')
    page = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<noscript><meta http-equiv="refresh" content="5"></noscript>'
            f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{_STYLE}</style></head>'
            f'<body><div id="live">{live}</div>{_controls()}<script>{_SCRIPT}</script></body></html>')
    return page.encode("utf-8")
