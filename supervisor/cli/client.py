"""The CLI clients of a running guard: ``vllm-guard status [--json]``, ``restart [--reset]``, ``stop``.

They find the guard the way it announced itself (``<state_dir>/guard.json``), falling back to
the configured status host/port, and send the bearer token from ``$VLLM_GUARD_TOKEN``, the
token file the guard named, or ``<state_dir>/token``. A guard that is not running is one clear
line and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, TextIO

import httpx

from supervisor import config
from supervisor.shell import auth, statedir
from supervisor.shell.probe import probe_host

TIMEOUT = httpx.Timeout(5.0, connect=2.0)
EXIT_OK = 0
EXIT_FAIL = 1


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
    parser.add_argument("--config", metavar="FILE", default=None, help="the guard's TOML config")
    parser.add_argument("--state-dir", metavar="DIR", default=None, help="the guard's state dir")
    parser.add_argument("--status-host", metavar="HOST", default=None, help="status endpoint address")
    parser.add_argument("--status-port", metavar="PORT", type=int, default=None, help="status endpoint port")
    parser.add_argument("--token-file", metavar="FILE", default=None, help="bearer token file")
    if command == "status":
        parser.add_argument("--json", action="store_true", help="print the full /status JSON")
    if command == "restart":
        parser.add_argument("--reset", action="store_true",
                            help="go back to the flags you asked for instead of the current ones")


def find_endpoint(args: argparse.Namespace, environ: Mapping[str, str]) -> Endpoint:
    """Locate the running guard from guard.json, else the config; ClientError when it is not there."""
    try:
        cfg = config.resolve(args, environ, require_model=False)
    except config.ConfigError as exc:
        raise ClientError(f"vllm-guard: {exc}") from None
    data = read_endpoint_file(cfg.state_dir)
    pid: int | None = None
    token_file = cfg.status.token_file or None
    host, port = cfg.status.host, cfg.status.port
    if data is not None:
        pid = data.get("pid") if isinstance(data.get("pid"), int) else None
        if pid is not None and not pid_alive(pid):
            raise ClientError(f"vllm-guard is not running (pid {pid} from "
                              f"{cfg.state_dir}/{statedir.GUARD_INFO} is gone)")
        if not isinstance(data.get("status_port"), int) and getattr(args, "status_port", None) is None:
            raise ClientError(f"vllm-guard (pid {pid}) has no status endpoint "
                              f"(still starting, or status.port = 0)")
        host, port = data.get("status_host") or host, data.get("status_port", port)
        token_file = getattr(args, "token_file", None) or data.get("token_file") or token_file
    if getattr(args, "status_host", None):
        host = args.status_host
    if getattr(args, "status_port", None) is not None:
        port = args.status_port
    if not port:
        raise ClientError("vllm-guard's status endpoint is disabled (status.port = 0)")
    token = auth.read_client_token(cfg.state_dir, token_file, environ)
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
        raise ClientError(f"no token to send: set {auth.TOKEN_ENV} or --token-file "
                          f"(the guard writes one to {ep.state_dir}/{auth.TOKEN_FILE_NAME})")
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


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (EPERM counts as alive: it is someone else's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    """The compact view of a /status document: state, model, pid, uptime, launches, flags, probe."""
    launches = snap.get("launches") or []
    rows = [
        ("state", str(snap.get("state", "?"))),
        ("model", str(snap.get("model") or "-")),
        ("pid", str(snap.get("pid") or "-")
         + (f" (guard {snap['guard_pid']})" if snap.get("guard_pid") else "")),
        ("uptime", _duration(snap.get("uptime_s", snap.get("uptime")))),
        ("launches", str(len(launches)) + (f", {snap['restarts']} restarts" if snap.get("restarts") else "")),
        ("probe", _probe(snap)),
    ]
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


# -- commands -------------------------------------------------------------------------------------

def run_client(command: str, args: argparse.Namespace, environ: Mapping[str, str],
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``status``, ``restart`` or ``stop`` against the running guard; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        ep = find_endpoint(args, environ)
        if command == "status":
            r = _request(ep, "GET", "/status")
            if r.status_code != 200:
                raise ClientError(f"/status answered {r.status_code}: {r.text.strip()[:200]}")
            snap = r.json()
            out.write(json.dumps(snap, indent=2) + "\n" if getattr(args, "json", False) else render_human(snap))
            return EXIT_OK
        if command in ("restart", "stop"):
            path = "/restart?reset=1" if command == "restart" and getattr(args, "reset", False) else f"/{command}"
            r = _request(ep, "POST", path)
            if r.status_code != 202:
                raise ClientError(f"{command} answered {r.status_code}: {r.text.strip()[:200]}")
            what = "restart (back to the flags you asked for)" if "reset" in path else command
            out.write(f"vllm-guard: {what} requested\n")
            return EXIT_OK
        raise ValueError(f"unknown client command {command!r}")
    except ClientError as exc:
        err.write(f"{exc}\n")
        return EXIT_FAIL
