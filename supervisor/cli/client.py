"""The CLI clients: ``status [--json] [--watch]``, ``restart [--reset]`` and ``stop`` talk to a running
guard; ``history``, ``logs`` and ``ps`` read state dirs, also when no guard runs.

A guard is the process that holds its state dir's lock (``<state_dir>/guard.lock``, which names its
pid); ``guard.json``, written by that same pid once its status endpoint listens, says where. So a
client asks only a guard that is alive, and checks that the endpoint answering is that guard's
(its ``guard_pid``) before it believes it or sends it anything. The bearer token goes only with a
``POST``, only to such a guard: never to whatever answers on a port. A state dir no guard holds is
one clear line and exit status 1 (with ``--json``, a JSON object with ``error``); ``--status-port``
alone asks that port for ``GET /status`` (no token).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import psutil

from supervisor import config
from supervisor.core.progress import PHASE_TEXT, last_failure, probe_text, seconds_text
from supervisor.errors import EX_FAILURE, EX_OK, StateError
from supervisor.shell import auth, history, locks, output
from supervisor.shell.probe import probe_host
from supervisor.shell.signalling import pid_alive
from supervisor.shell.statefiles import read_json

TIMEOUT = httpx.Timeout(5.0, connect=2.0)

def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a snapshot's parts may be missing)."""
    return value if isinstance(value, Mapping) else {}



class ClientError(Exception):
    """Reaching or using the guard failed; the message is for the user."""


@dataclass(frozen=True)
class Endpoint:
    """Where a running guard listens, and which guard it is (``pid`` None: a port given by hand)."""

    url: str
    token_file: str | None
    state_dir: str
    pid: int | None


def add_client_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Options for ``status``/``restart``/``stop``: where to find the guard (and --json/--reset/--watch)."""
    _where(parser)
    parser.add_argument("--status-host", metavar="HOST", default=None, help="status endpoint address")
    parser.add_argument("--status-port", metavar="PORT", type=int, default=None,
                        help="ask this port for GET /status when no guard holds the state dir (no token is sent)")
    parser.add_argument("--token-file", metavar="FILE", default=None, help="bearer token file")
    if command == "status":
        parser.add_argument("--json", action="store_true", help="print the full /status JSON (or an error object)")
        parser.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                            help="show it again every SECONDS (default 2) until interrupted")
    if command == "restart":
        parser.add_argument("--reset", action="store_true",
                            help="go back to the flags you asked for instead of the current ones")


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=None, help="the guard's TOML config")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="the guard's state dir (default: as the guard resolves it, e.g. $VLLM_GUARD_STATE_DIR)")


def add_parsers(sub: Any) -> None:
    """Register the client commands on an argparse subparsers object."""
    helps = {"status": "show the running guard's state, phase and last failure (--json for everything)",
             "restart": "relaunch vLLM now (--reset: with the flags you asked for)",
             "stop": "stop the guard and vLLM"}
    for command, text in helps.items():
        p = sub.add_parser(command, help=text, description=text)
        add_client_arguments(p, command)
        p.set_defaults(func=lambda args, c=command: run_client(c, args, os.environ))
    h = sub.add_parser("history", help="the launches recorded in a state dir: flags, failures, outcomes",
                       description="Every launch a guard made in this state dir (kept across restarts), oldest "
                                   "first, each guard run under its own heading.")
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
    ps = sub.add_parser("ps", help="the guards on this host: state, phase, model, ports, GPU memory",
                        description="Every guard on this host: the running ones from the process table (the state "
                                    "dir each holds), and the state dirs of stopped ones in the default places, "
                                    "$VLLM_GUARD_STATE_DIR and any --state-dir given.")
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
    return os.path.abspath(cfg.state_dir)


def read_endpoint_file(state_dir: str) -> dict[str, Any] | None:
    """``<state_dir>/guard.json``, which a guard writes when its status endpoint listens (``status_port``);
    None when absent or unreadable. It is kept after the guard stops: alone it proves nothing."""
    try:
        data = read_json(f"{state_dir}/{locks.GUARD_INFO}")
    except StateError:
        return None
    return data if isinstance(data, dict) else None


def live_guard(state_dir: str) -> dict[str, Any] | None:
    """The guard holding ``state_dir`` now: ``{"pid": ...}`` from its lock, with what its guard.json says
    when that pid wrote it (its endpoint); None when no live process holds the lock."""
    if not locks.is_running(state_dir):
        return None
    try:
        lock = read_json(Path(state_dir) / locks.GUARD_LOCK)
    except StateError:
        lock = None
    pid = lock.get("pid") if isinstance(lock, dict) else None
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    info = read_endpoint_file(state_dir) or {}
    return {**info, "pid": pid} if info.get("pid") == pid else {"pid": pid, "started": lock.get("started")}


def find_endpoint(args: argparse.Namespace, environ: Mapping[str, str]) -> Endpoint:
    """The running guard of the state dir (or, with --status-port and no guard there, that port)."""
    try:
        cfg = config.resolve(args, environ, require_model=False)
    except config.ConfigError as exc:
        raise ClientError(f"vllm-guard: {exc}") from None
    state_dir = os.path.abspath(cfg.state_dir)
    token_file = getattr(args, "token_file", None) or cfg.status.token_file or None
    guard = live_guard(state_dir)
    if guard is None:
        port = getattr(args, "status_port", None)
        if port is not None:           # a port given by hand: asked for /status, never sent the token
            if not port:
                raise ClientError("vllm-guard's status endpoint is disabled (status.port = 0)")
            host = getattr(args, "status_host", None) or cfg.status.host
            return Endpoint(f"http://{probe_host(host)}:{port}", None, state_dir, None)
        stale = read_endpoint_file(state_dir)
        if stale and isinstance(stale.get("pid"), int):
            used = stale.get("status_port")
            on = f"; it listened on port {used}" if isinstance(used, int) else ""
            gone = "no longer holds it" if pid_alive(stale["pid"]) else "is gone"
            raise ClientError(f"vllm-guard is not running in {state_dir} (pid {stale['pid']} {gone}{on})")
        raise ClientError(f"no vllm-guard is running in {state_dir} (no guard holds it; "
                          f"give the guard's --state-dir, or see `vllm-guard ps`)")
    used = guard.get("status_port")
    if not isinstance(used, int):
        raise ClientError(f"vllm-guard (pid {guard['pid']}) has no status endpoint "
                          f"(still starting, or status.port = 0)")
    host = guard.get("status_host") or cfg.status.host
    return Endpoint(f"http://{probe_host(host)}:{used}", token_file or guard.get("token_file"), state_dir,
                    guard["pid"])


def _call(ep: Endpoint, method: str, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            response = client.request(method, ep.url + path, headers=headers)
    except httpx.ConnectError:
        raise ClientError(f"vllm-guard is not running (nothing listens on {ep.url})") from None
    except httpx.TimeoutException:
        raise ClientError(f"vllm-guard at {ep.url} did not answer within {TIMEOUT.read:g} s") from None
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach vllm-guard at {ep.url}: {exc}") from None
    return response


def get_status(ep: Endpoint) -> dict[str, Any]:
    """``GET /status`` (no token), checked to come from the guard that holds the state dir."""
    r = _call(ep, "GET", "/status")
    if r.status_code != 200:
        raise ClientError(f"/status answered {r.status_code}: {r.text.strip()[:200]}")
    try:
        snap = r.json()
    except ValueError:
        raise ClientError(f"{ep.url}/status did not answer JSON: not a vllm-guard") from None
    if not isinstance(snap, dict):
        raise ClientError(f"{ep.url}/status did not answer a status document: not a vllm-guard")
    if ep.pid is not None and snap.get("guard_pid") != ep.pid:
        raise ClientError(f"{ep.url} answers for pid {snap.get('guard_pid')}, not for the guard that holds "
                          f"{ep.state_dir} (pid {ep.pid}); nothing was sent to it")
    return snap


def post(ep: Endpoint, path: str, environ: Mapping[str, str]) -> httpx.Response:
    """``POST`` with the bearer token, to the guard that holds the state dir and answers as itself."""
    if ep.pid is None:
        raise ClientError(f"no vllm-guard holds {ep.state_dir}: the token is sent only to a running guard "
                          f"found through its state dir (give --state-dir), not to whatever answers on a port")
    get_status(ep)                   # the endpoint is that guard's before the token goes to it
    token = auth.read_client_token(ep.token_file, environ)
    r = _call(ep, "POST", path, token)
    if r.status_code == 401:
        raise ClientError(f"no token to send: set {auth.TOKEN_ENV}, --token-file, or --state-dir of the guard "
                          f"(it writes one to <state dir>/{auth.TOKEN_FILE_NAME} and names it in guard.json)")
    if r.status_code == 403:
        raise ClientError("the guard rejected the token (it changes each start unless you set one)")
    return r


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
    progress = _mapping(snap.get("progress"))
    text = probe_text(p, str(snap.get("state", "")), progress.get("elapsed_s"))
    at = p.get("at")
    if isinstance(at, (int, float)):
        text += f", {_duration(max(0.0, time.time() - at))} ago"
    return text


def _state(snap: Mapping[str, Any]) -> str:
    """The state, with where the launch is: ``starting: launch 2, loading weights 40%, 12 s``."""
    state = str(snap.get("state", "?"))
    p = snap.get("progress")
    if not isinstance(p, Mapping) or not p.get("launch"):
        return state
    if state == "healthy":
        since = snap.get("healthy_for_s")
        return f"healthy: launch {p['launch']} serving" + (f" for {_duration(since)}" if since is not None else "")
    if state in ("starting", "restarting"):
        text = f"{state}: launch {p['launch']}, {p.get('text') or 'launching vLLM'}"
        if isinstance(p.get("elapsed_s"), (int, float)):
            text += f", {seconds_text(p['elapsed_s'])}"
        return text
    return state


def _failure(snap: Mapping[str, Any]) -> tuple[str, str] | None:
    f = snap.get("last_failure")
    if not isinstance(f, Mapping):
        f = last_failure(r for r in snap.get("launches") or [] if isinstance(r, Mapping))
    if not f:
        return None
    head = f"launch {f.get('launch')} {f.get('outcome', 'failed')}: {f.get('kind')}"
    if f.get("phase"):
        head += f" while {PHASE_TEXT.get(str(f['phase']), f['phase'])}"
    head += " (healed)" if f.get("healed") else ""
    return head, str(f.get("evidence") or "")[:200]


def render_human(snap: Mapping[str, Any]) -> str:
    """The compact view of a /status document: state and phase, vLLM's URL, model, pid, uptime, launches,
    probe, context, the last failure (and whether it was healed), changed flags."""
    launches = snap.get("launches") or []
    rows = [("state", _state(snap))]
    vllm = _mapping(snap.get("vllm"))
    if vllm.get("url"):
        rows.append(("vllm", str(vllm["url"]) + (f" (vLLM {vllm['version']})" if vllm.get("version") else "")))
    rows += [
        ("model", str(snap.get("model") or "-")),
        ("pid", str(snap.get("pid") or "-")
         + (f" (guard {snap['guard_pid']})" if snap.get("guard_pid") else "")),
        ("uptime", _duration(snap.get("uptime_s", snap.get("uptime")))),
        ("launches", str(len(launches))
         + (f", {_plural(snap['restarts'], 'restart')}" if snap.get("restarts") else "")),
        ("probe", _probe(snap)),
    ]
    context = snap.get("context")
    if isinstance(context, Mapping) and context.get("text"):
        rows.append(("context", str(context["text"]).removeprefix("context ")))
    failure = _failure(snap)
    if failure:
        rows.append(("failure", failure[0]))
        if failure[1]:
            rows.append(("evidence", failure[1]))
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
            watch = getattr(args, "watch", None)
            if watch is not None:
                return _watch(ep, max(0.2, watch), out, as_json)
            snap = get_status(ep)
            out.write(json.dumps(snap, indent=2) + "\n" if as_json else render_human(snap))
            return EX_OK
        if command in ("restart", "stop"):
            path = "/restart?reset=1" if command == "restart" and getattr(args, "reset", False) else f"/{command}"
            r = post(ep, path, environ)
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


def _watch(ep: Endpoint, every: float, out: TextIO, as_json: bool) -> int:
    """``status --watch``: the view again every ``every`` seconds (redrawn in place on a terminal), until
    interrupted (exit 0) or the guard goes away (its last words, exit 1)."""
    tty = _isatty(out)
    try:
        while True:
            snap = get_status(ep)
            text = json.dumps(snap) + "\n" if as_json else render_human(snap)
            if tty and not as_json:
                stamp = time.strftime("%H:%M:%S")
                out.write(f"\x1b[H\x1b[2J{text}\nevery {every:g} s, {stamp} (Ctrl-C to stop)\n")
            else:
                out.write(text + ("" if as_json else "\n"))
            out.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return EX_OK


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def run_history(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO | None = None) -> int:
    """Print the launches recorded in a state dir, each guard run under its own heading."""
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
    for line in history_lines(records, live_guard(state_dir)):
        out.write(line + "\n")
    return EX_OK


def _stamp(when: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"


def history_lines(records: Sequence[Mapping[str, Any]], guard: Mapping[str, Any] | None = None) -> Iterator[str]:
    """The history as a person reads it: a heading for each guard run, then one line a launch saying what
    happened in order (``healthy in 6 s, served 3 min 10 s, then restarted on request``)."""
    run = object()
    live_pid = guard.get("pid") if guard else None
    for r in records:
        if r.get("run") != run:
            run = r.get("run")
            pid, _, started = str(run or "").partition("-")
            when = _stamp(int(started)) if started.isdigit() else _stamp(r.get("started_at") or r.get("at"))
            yield f"── guard run started {when}" + (f" (pid {pid})" if pid.isdigit() else "") + " ──"
        alive = bool(live_pid) and str(r.get("run") or "").partition("-")[0] == str(live_pid)
        yield _history_line(r, alive)


_AFTER_HEALTHY = {"restart": "then restarted on request", "reset": "then restarted with the flags you asked for",
                  "stopped": "then stopped"}
_BEFORE_HEALTHY = {"restart": "restarted on request while starting",
                   "reset": "restarted with the flags you asked for while starting",
                   "stopped": "stopped while starting"}


def _history_line(r: Mapping[str, Any], alive: bool = False) -> str:
    stamp = _stamp(r.get("started_at") or r.get("at"))
    if r.get("event") == "gave_up":
        return f"{stamp}  gave up (exit {r.get('exit_code')}): {r.get('message', '')}"
    outcome = str(r.get("outcome") or "?")
    healthy_in = r.get("time_to_healthy_s")
    ended, started = r.get("ended_at"), r.get("started_at")
    failure = ""
    if r.get("kind"):
        failure = f"{r['kind']}: {str(r.get('evidence') or '')[:160]}"
    if isinstance(healthy_in, (int, float)):
        what = f"healthy in {seconds_text(healthy_in)}"
        if isinstance(ended, (int, float)) and isinstance(started, (int, float)):
            what += f", served {seconds_text(max(0.0, ended - started - healthy_in))}"
        if outcome == "died":
            what += f", then died: {failure}" if failure else ", then died"
        elif outcome in _AFTER_HEALTHY:
            what += ", " + _AFTER_HEALTHY[outcome]
        elif outcome == "healthy":
            what += ", still serving" if alive else ", then the guard ended without recording more"
        else:
            what += f", then {outcome}"
    elif outcome == "failed":
        phase = PHASE_TEXT.get(str(r.get("phase")), r.get("phase"))
        what = "failed" + (f" while {phase}" if phase else "") + (f": {failure}" if failure else "")
    elif outcome in _BEFORE_HEALTHY:
        what = _BEFORE_HEALTHY[outcome]
    elif outcome == "running":
        what = "starting" if alive else "started; the guard ended before it did"
    else:
        what = outcome + (f": {failure}" if failure else "")
    line = f"{stamp}  launch {r.get('n')}  {what}"
    changed = r.get("changed_flags") or {}
    if isinstance(changed, Mapping) and changed:
        line += "  [" + ", ".join(f"{k} {v.get('value') if isinstance(v, Mapping) else v}"
                                  for k, v in changed.items()) + "]"
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
    rows = [r for r in (_guard_row(d, pids) for d, pids in _find_guards(args, environ).items()) if r is not None]
    if getattr(args, "json", False):
        for r in rows:
            out.write(json.dumps(r) + "\n")
        return EX_OK
    if not rows:
        out.write("no vllm-guard found (none in the process table, nor in the default state dirs, "
                  "$VLLM_GUARD_STATE_DIR or --state-dir)\n")
        return EX_OK
    head = ("STATE DIR", "PID", "STATE", "MODEL", "VLLM", "STATUS", "GPU MEMORY", "NOW")
    table = [head] + [(r["state_dir"], str(r["pid"] or "-"), r["state"], r["model"] or "-", r["vllm"] or "-",
                       r["status"] or "-", r["gpu"] or "-", r["now"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() + "\n")
    return EX_OK


def _guard_processes() -> dict[str, list[int]]:
    """Running guards from the process table: state dir -> pids. A guard holds ``<state dir>/guard.lock``
    open (its flock) for its whole life, so the open file names the dir however it was chosen (flag,
    variable, config file, systemd); where another user's files cannot be read, its command line and
    environment say it (``--state-dir``, ``$VLLM_GUARD_STATE_DIR``, the default)."""
    found: dict[str, list[int]] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            argv = p.info.get("cmdline") or []
            if p.pid == me or not _is_guard_argv(argv):
                continue
            dirs = [os.path.dirname(f.path) for f in p.open_files()
                    if os.path.basename(f.path) == locks.GUARD_LOCK]
        except psutil.AccessDenied:
            dirs = _declared_state_dir(p, argv)
        except psutil.Error:
            continue
        for d in dirs:
            found.setdefault(os.path.abspath(d), []).append(p.pid)
    return found


def _is_guard_argv(argv: list[str]) -> bool:
    """``vllm-guard start|serve ...`` or ``python -m supervisor start|serve ...``."""
    for i, word in enumerate(argv[:4]):
        rest = argv[i + 1:i + 2]
        if os.path.basename(word) == "vllm-guard" or (word == "-m" and rest == ["supervisor"]):
            following = argv[i + (2 if word == "-m" else 1):]
            return bool(following) and following[0] in ("start", "serve")
    return False


def _declared_state_dir(p: psutil.Process, argv: list[str]) -> list[str]:
    try:
        cwd = p.cwd()
    except psutil.Error:
        cwd = "/"
    for i, word in enumerate(argv):
        if word == "--state-dir" and i + 1 < len(argv):
            return [os.path.join(cwd, os.path.expanduser(argv[i + 1]))]
        if word.startswith("--state-dir="):
            return [os.path.join(cwd, os.path.expanduser(word.split("=", 1)[1]))]
    try:
        env = p.environ()
    except psutil.Error:
        return []
    return [os.path.join(cwd, env.get("VLLM_GUARD_STATE_DIR") or config.default_state_dir(env))]


def _find_guards(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, list[int]]:
    """Every state dir to show: the running guards' (process table), --state-dir, this user's own
    (``$VLLM_GUARD_STATE_DIR`` included), the default dirs and the systemd units' (/var/lib/vllm-guard[/*])."""
    found = _guard_processes()
    dirs = list(getattr(args, "state_dir", []) or [])
    try:
        dirs.append(_state_dir(argparse.Namespace(), environ))
    except ClientError:
        pass
    for root in (config.default_state_dir(environ), "/var/lib/vllm-guard"):
        dirs.append(root)
        try:
            dirs += sorted(str(p) for p in Path(root).iterdir() if p.is_dir())
        except OSError:
            pass
    for d in dirs:
        d = os.path.abspath(os.path.expanduser(d))
        marks = (Path(d) / locks.GUARD_INFO, Path(d) / locks.GUARD_LOCK)
        if d not in found and any(os.path.lexists(p) for p in marks):
            found[d] = []
    return found


def _guard_row(state_dir: str, pids: list[int]) -> dict[str, Any] | None:
    guard = live_guard(state_dir)
    info = guard or read_endpoint_file(state_dir)
    if info is None and not pids:
        return None
    row: dict[str, Any] = {"state_dir": state_dir, "pid": guard["pid"] if guard else (pids[0] if pids else None),
                           "state": "running" if guard or pids else "stopped", "model": None, "vllm": None,
                           "status": None, "gpu": None, "now": None, "progress": None, "last_failure": None}
    port = guard.get("status_port") if guard else None
    if guard and isinstance(port, int):
        host = guard.get("status_host") or "127.0.0.1"
        row["status"] = f"{host}:{port}"
        try:
            snap = get_status(Endpoint(f"http://{probe_host(host)}:{port}", None, state_dir, guard["pid"]))
        except ClientError:
            snap = {}
        if snap:
            vllm = snap.get("vllm") or {}
            row.update(state=str(snap.get("state", "running")), model=snap.get("model"),
                       vllm=vllm.get("url") or (f"{vllm.get('host')}:{vllm.get('port')}" if vllm.get("port") else None),
                       gpu=", ".join(f"GPU{d.get('index')} {d.get('used_gib')}/{d.get('total_gib')} GiB"
                                     for d in snap.get("gpu") or [] if isinstance(d, Mapping)) or None,
                       progress=snap.get("progress"), last_failure=snap.get("last_failure"),
                       now=_ps_now(snap))
    elif not guard and pids:
        row["now"] = "cannot read its state dir" if not info else "starting"
    return row


def _ps_now(snap: Mapping[str, Any]) -> str:
    """``ps``'s last column: where the launch is and the last failure (``launch 2, loading weights 40%, 12 s;
    healed kv_cache_insufficient``)."""
    text = _state(snap).partition(": ")[2] or str(snap.get("state", ""))
    f = snap.get("last_failure")
    if isinstance(f, Mapping) and f.get("kind"):
        text += f"; {'healed' if f.get('healed') else 'last failure'} {f['kind']}"
    return text
