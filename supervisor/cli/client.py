"""The CLI clients: ``status [--json]``, ``restart [--reset]`` and ``stop`` talk to a running guard;
``history``, ``logs`` and ``ps`` read state dirs, also when no guard runs.

A guard is found the way it announced itself (``<state_dir>/guard.json``, kept after it stops, so
a client names the port it used), else by the configured status host and port. The bearer token
is ``$VLLM_GUARD_TOKEN``, ``--token-file``, or the token file named in that same guard.json:
never a token file of another state dir. A guard that is not running is one clear line (with
``--json``, a JSON object with ``error``) and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TextIO

import httpx

from supervisor import config
from supervisor.errors import EX_FAILURE, EX_OK
from supervisor.shell import auth, history, output, statedir
from supervisor.shell.probe import probe_host
from supervisor.shell.signalling import pid_alive

TIMEOUT = httpx.Timeout(5.0, connect=2.0)


class ClientError(Exception):
    """Reaching or using the guard failed; the message is for the user."""


@dataclass(frozen=True)
class Endpoint:
    """Where a running guard listens and how to authenticate to it."""

    url: str
    token: str | None
    state_dir: str
    pid: int | None


def add_client_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Options for ``status``/``restart``/``stop``: where to find the guard (and --json/--reset)."""
    _where(parser)
    parser.add_argument("--status-host", metavar="HOST", default=None, help="status endpoint address")
    parser.add_argument("--status-port", metavar="PORT", type=int, default=None, help="status endpoint port")
    parser.add_argument("--token-file", metavar="FILE", default=None, help="bearer token file")
    if command == "status":
        parser.add_argument("--json", action="store_true", help="print the full /status JSON (or an error object)")
    if command == "restart":
        parser.add_argument("--reset", action="store_true",
                            help="go back to the flags you asked for instead of the current ones")


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=None, help="the guard's TOML config")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="the guard's state dir (default: as the guard resolves it, e.g. $VLLM_GUARD_STATE_DIR)")


def add_parsers(sub: Any) -> None:
    """Register the client commands on an argparse subparsers object."""
    helps = {"status": "show the running guard's state (--json for everything)",
             "restart": "relaunch vLLM now (--reset: with the flags you asked for)",
             "stop": "stop the guard and vLLM"}
    for command, text in helps.items():
        p = sub.add_parser(command, help=text, description=text)
        add_client_arguments(p, command)
        p.set_defaults(func=lambda args, c=command: run_client(c, args, os.environ))
    h = sub.add_parser("history", help="the launches recorded in a state dir: flags, failures, outcomes",
                       description="Every launch a guard made in this state dir (kept across restarts), oldest first.")
    _where(h)
    h.add_argument("--json", action="store_true", help="one JSON object a line")
    h.add_argument("-n", type=int, default=0, metavar="N", help="only the last N launches")
    h.set_defaults(func=lambda args: run_history(args, os.environ))
    lg = sub.add_parser("logs", help="vLLM's own output, kept across launches (also after the guard stopped)",
                        description="vLLM's output as the guard kept it (a bounded ring of files in the state dir).")
    _where(lg)
    lg.add_argument("-n", type=int, default=100, metavar="N", help="the last N lines (default 100)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    lg.set_defaults(func=lambda args: run_logs(args, os.environ))
    ps = sub.add_parser("ps", help="the guards on this host: state, model, ports, GPU memory",
                        description="Guards found in the default state dirs (yours and the systemd units') "
                                    "and any --state-dir given.")
    ps.add_argument("--state-dir", metavar="DIR", action="append", default=[], help="also look here (repeatable)")
    ps.add_argument("--json", action="store_true", help="one JSON object a line")
    ps.set_defaults(func=lambda args: run_ps(args, os.environ))


def _state_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    try:
        cfg = config.resolve(argparse.Namespace(config=getattr(args, "config", None),
                                                state_dir=getattr(args, "state_dir", None)),
                             environ, require_model=False)
    except config.ConfigError as exc:
        raise ClientError(f"vllm-guard: {exc}") from None
    return cfg.state_dir


def find_endpoint(args: argparse.Namespace, environ: Mapping[str, str]) -> Endpoint:
    """Locate the running guard from guard.json, else the config; ClientError when it is not there."""
    try:
        cfg = config.resolve(args, environ, require_model=False)
    except config.ConfigError as exc:
        raise ClientError(f"vllm-guard: {exc}") from None
    data = read_endpoint_file(cfg.state_dir)
    pid: int | None = None
    token_file = getattr(args, "token_file", None) or cfg.status.token_file or None
    host, port = cfg.status.host, cfg.status.port
    if data is not None:
        pid = data.get("pid") if isinstance(data.get("pid"), int) else None
        used = data.get("status_port")
        if pid is not None and not pid_alive(pid):
            on = f"; it listened on port {used}" if isinstance(used, int) else ""
            raise ClientError(f"vllm-guard is not running (pid {pid} of {cfg.state_dir} is gone{on})")
        if not isinstance(used, int) and getattr(args, "status_port", None) is None:
            raise ClientError(f"vllm-guard (pid {pid}) has no status endpoint "
                              f"(still starting, or status.port = 0)")
        host, port = data.get("status_host") or host, used if isinstance(used, int) else port
        token_file = token_file or data.get("token_file")
    if getattr(args, "status_host", None):
        host = args.status_host
    if getattr(args, "status_port", None) is not None:
        port = args.status_port
    if not port:
        raise ClientError("vllm-guard's status endpoint is disabled (status.port = 0)")
    token = auth.read_client_token(token_file, environ)
    return Endpoint(f"http://{probe_host(host)}:{port}", token, cfg.state_dir, pid)


def _request(ep: Endpoint, method: str, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ep.token}"} if ep.token else {}
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            response = client.request(method, ep.url + path, headers=headers)
    except httpx.ConnectError:
        raise ClientError(f"vllm-guard is not running (nothing listens on {ep.url})") from None
    except httpx.TimeoutException:
        raise ClientError(f"vllm-guard at {ep.url} did not answer within {TIMEOUT.read:g} s") from None
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach vllm-guard at {ep.url}: {exc}") from None
    if response.status_code == 401:
        raise ClientError(f"no token to send: set {auth.TOKEN_ENV}, --token-file, or --state-dir of the guard "
                          f"(it writes one to <state dir>/{auth.TOKEN_FILE_NAME} and names it in guard.json)")
    if response.status_code == 403:
        raise ClientError("the guard rejected the token (it changes each start unless you set one)")
    return response


def read_endpoint_file(state_dir: str) -> dict[str, Any] | None:
    """``<state_dir>/guard.json``, which a guard writes when it takes the state dir and again once its
    status endpoint listens (``status_port``); None when absent or unreadable."""
    try:
        data = statedir.read_json(f"{state_dir}/{statedir.GUARD_INFO}")
    except statedir.StateError:
        return None
    return data if isinstance(data, dict) else None


# -- rendering ------------------------------------------------------------------------------------

def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _changed(snap: Mapping[str, Any]) -> list[str]:
    changed = snap.get("changed_flags") or {}
    items: list[tuple[str, Mapping[str, Any]]]
    if isinstance(changed, Mapping):
        items = [(str(k), v if isinstance(v, Mapping) else {"value": v}) for k, v in changed.items()]
    else:
        items = [(str(c.get("flag", "?")), c) for c in changed if isinstance(c, Mapping)]
    lines = []
    for flag, note in items:
        was = note.get("requested", note.get("asked"))
        now = note.get("value", note.get("now"))
        was_s = "(unset)" if was is None else (was or "(on)")
        now_s = "(removed)" if now is None else (now or "(on)")
        why = note.get("why") or note.get("reason") or ""
        lines.append(f"{flag} {was_s} -> {now_s}" + (f"  ({why})" if why else ""))
    return lines


def _probe(snap: Mapping[str, Any]) -> str:
    p = snap.get("last_probe") or snap.get("probe")
    if not isinstance(p, Mapping):
        return "none yet"
    if "latency_ms" in p:
        latency = f"{p['latency_ms']:g} ms" if isinstance(p["latency_ms"], (int, float)) else "-"
    elif isinstance(p.get("latency_s"), (int, float)):
        latency = f"{p['latency_s'] * 1000:.0f} ms"
    else:
        latency = "-"
    text = ("ok" if p.get("ok") else "failed") + f" in {latency}"
    if not p.get("ok") and p.get("error"):
        text += f": {p['error']}"
    at = p.get("at")
    if isinstance(at, (int, float)):
        text += f", {_duration(max(0.0, time.time() - at))} ago"
    return text


def render_human(snap: Mapping[str, Any]) -> str:
    """The compact view of a /status document: state, model, pid, uptime, launches, probe, context, flags."""
    launches = snap.get("launches") or []
    rows = [
        ("state", str(snap.get("state", "?"))),
        ("model", str(snap.get("model") or "-")),
        ("pid", str(snap.get("pid") or "-")
         + (f" (guard {snap['guard_pid']})" if snap.get("guard_pid") else "")),
        ("uptime", _duration(snap.get("uptime_s", snap.get("uptime")))),
        ("launches", str(len(launches)) + (f", {_plural(snap['restarts'], 'restart')}" if snap.get("restarts") else "")),
        ("probe", _probe(snap)),
    ]
    context = snap.get("context")
    if isinstance(context, Mapping) and context.get("text"):
        rows.append(("context", str(context["text"]).removeprefix("context ")))
    last = launches[-1] if launches and isinstance(launches[-1], Mapping) else None
    if last and last.get("kind"):
        rows.append(("last exit", f"{last.get('outcome', '?')}: {last['kind']}"))
        if last.get("evidence"):
            rows.append(("evidence", str(last["evidence"])[:200]))
    changed = _changed(snap)
    rows.append(("flags", changed[0] if changed else "as asked"))
    rows.extend(("", line) for line in changed[1:])
    if snap.get("exit_reason"):
        rows.append(("reason", str(snap["exit_reason"])))
    return "\n".join(f"{k:<10} {v}".rstrip() for k, v in rows) + "\n"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# -- commands -------------------------------------------------------------------------------------

def run_client(command: str, args: argparse.Namespace, environ: Mapping[str, str],
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``status``, ``restart`` or ``stop`` against the running guard; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    as_json = command == "status" and getattr(args, "json", False)
    try:
        ep = find_endpoint(args, environ)
        if command == "status":
            r = _request(ep, "GET", "/status")
            if r.status_code != 200:
                raise ClientError(f"/status answered {r.status_code}: {r.text.strip()[:200]}")
            snap = r.json()
            out.write(json.dumps(snap, indent=2) + "\n" if as_json else render_human(snap))
            return EX_OK
        if command in ("restart", "stop"):
            path = "/restart?reset=1" if command == "restart" and getattr(args, "reset", False) else f"/{command}"
            r = _request(ep, "POST", path)
            if r.status_code != 202:
                raise ClientError(f"{command} answered {r.status_code}: {r.text.strip()[:200]}")
            what = "restart (back to the flags you asked for)" if "reset" in path else command
            out.write(f"vllm-guard: {what} requested\n")
            return EX_OK
        raise ValueError(f"unknown client command {command!r}")
    except ClientError as exc:
        if as_json:
            out.write(json.dumps({"error": str(exc), "running": False}) + "\n")
        err.write(f"{exc}\n")
        return EX_FAILURE


def run_history(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO | None = None) -> int:
    """Print the launches recorded in a state dir."""
    out = sys.stdout if out is None else out
    try:
        state_dir = _state_dir(args, environ)
    except ClientError as exc:
        print(exc, file=sys.stderr)
        return EX_FAILURE
    records = list(history.read(state_dir))
    if getattr(args, "n", 0):
        records = records[-args.n:]
    if getattr(args, "json", False):
        for r in records:
            out.write(json.dumps(r, default=str) + "\n")
        return EX_OK
    if not records:
        out.write(f"no launches recorded in {state_dir}\n")
        return EX_OK
    for r in records:
        out.write(_history_line(r) + "\n")
    return EX_OK


def _history_line(r: Mapping[str, Any]) -> str:
    when = r.get("started_at") or r.get("at")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    if r.get("event") == "gave_up":
        return f"{stamp}  gave up (exit {r.get('exit_code')}): {r.get('message', '')}"
    line = f"{stamp}  launch {r.get('n')}  {r.get('outcome', '?')}"
    if r.get("time_to_healthy_s") is not None:
        line += f" in {r['time_to_healthy_s']} s"
    if r.get("kind"):
        line += f"  {r['kind']}: {str(r.get('evidence') or '')[:160]}"
    changed = r.get("changed_flags") or {}
    if isinstance(changed, Mapping) and changed:
        line += "  [" + ", ".join(f"{k} {v.get('value') if isinstance(v, Mapping) else v}" for k, v in changed.items()) + "]"
    measured = r.get("measured") or {}
    if isinstance(measured, Mapping) and measured.get("kv_cache_tokens"):
        line += f"  KV {measured['kv_cache_tokens']} tokens"
    return line


def run_logs(args: argparse.Namespace, environ: Mapping[str, str], out: Any = None) -> int:
    """Print vLLM's kept output (and follow it with -f)."""
    out = sys.stdout.buffer if out is None else out
    try:
        state_dir = _state_dir(args, environ)
    except ClientError as exc:
        print(exc, file=sys.stderr)
        return EX_FAILURE
    lines = output.tail(state_dir, max(0, args.n))
    if not lines and not args.follow:
        print(f"no vLLM output kept in {state_dir}", file=sys.stderr)
        return EX_OK
    for line in lines:
        out.write(line + b"\n")
    out.flush()
    if not args.follow:
        return EX_OK
    try:
        for line in output.follow(state_dir):
            out.write(line + b"\n")
            out.flush()
    except KeyboardInterrupt:
        pass
    return EX_OK


def run_ps(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO | None = None) -> int:
    """List the guards on this host."""
    out = sys.stdout if out is None else out
    rows = [_guard_row(d) for d in _candidate_state_dirs(args, environ)]
    rows = [r for r in rows if r is not None]
    if getattr(args, "json", False):
        for r in rows:
            out.write(json.dumps(r) + "\n")
        return EX_OK
    if not rows:
        out.write("no vllm-guard found (looked in the default state dirs; give --state-dir)\n")
        return EX_OK
    head = ("STATE DIR", "PID", "STATE", "MODEL", "VLLM", "STATUS", "GPU MEMORY")
    table = [head] + [(r["state_dir"], str(r["pid"] or "-"), r["state"], r["model"] or "-",
                       r["vllm"] or "-", r["status"] or "-", r["gpu"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    return EX_OK


def _candidate_state_dirs(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """The default state dir, its siblings, the systemd units' (/var/lib/vllm-guard[/*]), and --state-dir."""
    dirs = list(getattr(args, "state_dir", []) or [])
    default = config.default_state_dir(environ)
    for root in (default, "/var/lib/vllm-guard"):
        dirs.append(root)
        try:
            dirs += sorted(str(p) for p in Path(root).iterdir() if p.is_dir())
        except OSError:
            pass
    seen: list[str] = []
    for d in dirs:
        d = os.path.abspath(os.path.expanduser(d))
        if d not in seen and (Path(d) / statedir.GUARD_INFO).exists():
            seen.append(d)
    return seen


def _guard_row(state_dir: str) -> dict[str, Any] | None:
    info = read_endpoint_file(state_dir)
    if info is None:
        return None
    pid = info.get("pid") if isinstance(info.get("pid"), int) else None
    running = pid is not None and pid_alive(pid) and statedir.is_running(state_dir)
    row: dict[str, Any] = {"state_dir": state_dir, "pid": pid if running else None,
                           "state": "running" if running else "stopped", "model": None, "vllm": None,
                           "status": None, "gpu": None}
    port = info.get("status_port")
    if running and isinstance(port, int):
        row["status"] = f"{info.get('status_host') or '127.0.0.1'}:{port}"
        try:
            r = httpx.get(f"http://{probe_host(info.get('status_host') or '127.0.0.1')}:{port}/status", timeout=TIMEOUT)
            snap = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            snap = {}
        if isinstance(snap, Mapping) and snap:
            vllm = snap.get("vllm") or {}
            row.update(state=str(snap.get("state", "running")), model=snap.get("model"),
                       vllm=f"{vllm.get('host')}:{vllm.get('port')}" if vllm.get("port") else None,
                       gpu=", ".join(f"GPU{d.get('index')} {d.get('used_gib')}/{d.get('total_gib')} GiB"
                                     for d in snap.get("gpu") or [] if isinstance(d, Mapping)) or None)
    return row
