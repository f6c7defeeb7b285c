"""Processes of a launch: mark them, record them, and find what a dead guard left.

vLLM's ``VLLM::EngineCore`` and ``VLLM::Worker_*`` processes outlive a SIGKILLed API server and keep
the GPU. So every launch is found three ways at once: its process group (while its leader lives),
the processes recorded in ``launch.json`` by identity (pid and start time, see
:mod:`supervisor.shell.signalling`), and a scan for the marker variable ``VLLMGUARD_LAUNCH`` that
every process of a launch inherits. Nothing unmarked and unrecorded is ever signalled, and every
signal goes through :mod:`~supervisor.shell.signalling`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from supervisor.errors import StateError
from supervisor.secrets import NOT_FOR_VLLM, REGISTRY
from supervisor.shell import signalling
from supervisor.shell.diskfaults import FAULTS
from supervisor.shell.signalling import Proc
from supervisor.shell.statefiles import ensure_dir, read_json, remove, set_aside, write_json

MARKER = "VLLMGUARD_LAUNCH"
LAUNCH_FILE = "launch.json"


def state_id(state_dir: str) -> str:
    """A short stable id of the absolute, resolved state dir path."""
    path = os.path.realpath(os.path.abspath(os.path.expanduser(state_dir)))
    return hashlib.sha256(path.encode()).hexdigest()[:12]


def child_env(
    base: Mapping[str, str],
    state_dir: str,
    launch_id: int,
    drop: Iterable[str] = NOT_FOR_VLLM,
) -> dict[str, str]:
    """The child's environment: ``base`` minus secrets, plus the launch marker and plain output."""
    env = {k: v for k, v in base.items() if k not in set(drop)}
    env[MARKER] = f"{state_id(state_dir)}:{launch_id}"
    env["NO_COLOR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # vLLM names its processes with setproctitle, which by default overwrites the memory behind
    # /proc/<pid>/environ, erasing the marker; SPT_NOENV makes it leave the environment alone.
    env["SPT_NOENV"] = "1"
    return env


# --- the launch record ----------------------------------------------------------------------


def _launch_path(state_dir: str) -> Path:
    return Path(state_dir).expanduser() / LAUNCH_FILE


def record_launch(state_dir: str, leader: Proc, pgid: int) -> None:
    """Atomically write ``launch.json``: the leader's identity (pid, start, boot), pgid, started_at, marker
    (best effort: a disk that refuses it is a warning; the marker still finds the launch's processes)."""
    marker = f"{state_id(state_dir)}:"
    with contextlib.suppress(psutil.Error, AttributeError):
        marker = leader.psutil().environ().get(MARKER, marker)  # type: ignore[union-attr]
    record = {
        **leader.record(),
        "pgid": pgid,
        "started_at": time.time(),
        "marker": marker,
        "guard_pid": os.getpid(),
        "tree": [],
    }
    _write_record(state_dir, record)


def _write_record(state_dir: str, record: dict[str, Any]) -> None:
    path = _launch_path(state_dir)

    def write() -> None:
        ensure_dir(state_dir)
        write_json(path, record, 0o600)
    FAULTS.attempt(path, write)


def note_tree(state_dir: str, procs: Iterable[Proc]) -> None:
    """Add processes (e.g. a :func:`~supervisor.shell.signalling.snapshot_tree` once healthy) to
    ``launch.json`` by identity (best effort, as :func:`record_launch`)."""
    record = _read_record(state_dir)
    if record is None:
        return
    tree = _tree(record)
    known = {(e.get("pid"), e.get("start")) for e in tree}
    for p in procs:
        if (p.pid, p.start) not in known:
            tree.append(p.record())
    record["tree"] = tree
    _write_record(state_dir, record)


def _read_record(state_dir: str) -> dict[str, Any] | None:
    """``launch.json``, or None when absent; one that cannot be trusted is set aside (the marker scan
    still finds the processes of its launch)."""
    path = _launch_path(state_dir)
    try:
        record = read_json(path)
        if record is not None and not isinstance(record, dict):
            set_aside(path, f"{path} holds {type(record).__name__}, not a launch record")
            return None
    except StateError as e:
        with contextlib.suppress(StateError):
            set_aside(path, str(e))
        return None
    return record


def _tree(record: dict[str, Any]) -> list[dict[str, Any]]:
    tree = record.get("tree")
    return [e for e in tree if isinstance(e, dict)] if isinstance(tree, list) else []


def clear_launch(state_dir: str) -> None:
    """Remove ``launch.json`` (the launch ended and all of its processes with it; best effort)."""
    path = _launch_path(state_dir)
    FAULTS.attempt(path, lambda: remove(path), proves=False)


# --- finding processes ----------------------------------------------------------------------


def marked_processes(state_dir: str) -> list[Proc]:
    """Every live process whose environment has ``VLLMGUARD_LAUNCH=<state_id>:*``."""
    sid = state_id(state_dir)
    me = os.getpid()
    found = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        proc = Proc.live(p.pid)
        if proc is None:
            continue
        try:
            marked = p.environ().get(MARKER, "").startswith(sid + ":")
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
        if marked and proc.is_alive():   # the same process before and after reading its environment
            found.append(proc)
    return found


def _recorded(entry: Mapping[str, Any]) -> Proc | None:
    return Proc.recorded(entry.get("pid"), entry.get("start"), entry.get("boot"))


def sweep_orphans(state_dir: str, grace: float = 5.0) -> list[dict[str, Any]]:
    """End what a previous guard on ``state_dir`` left; return ``[{pid, name, cmdline}]`` ended.

    Ours means: the recorded leader and tree entries that are still those very processes, the
    recorded group while its recorded leader still lives (and leads it), processes carrying our
    marker, and descendants of all of those. Everything else is left alone, however much it looks
    like vLLM, and whatever now has a recorded pid.
    """
    record = _read_record(state_dir)
    found: dict[int, Proc] = {}
    pgid = None
    if record is not None:
        for entry in _tree(record):
            if p := _recorded(entry):
                found[p.pid] = p
        leader = _recorded(record)
        if leader is not None:
            found[leader.pid] = leader
            rec_pgid = record.get("pgid")
            if isinstance(rec_pgid, int) and rec_pgid == leader.pid:
                pgid = rec_pgid       # signalling.end uses it only while the leader leads it
    for p in marked_processes(state_dir):
        found[p.pid] = p
    for p in list(found.values()):
        for child in signalling.snapshot_tree(p)[1:]:
            found.setdefault(child.pid, child)
    keep_out = signalling.protected()
    found = {pid: p for pid, p in found.items() if pid not in keep_out}
    described = {pid: _describe(p) for pid, p in found.items()}
    ended = signalling.end(found.values(), pgid, grace, find=lambda: marked_processes(state_dir))
    clear_launch(state_dir)
    return [described.get(pid) or {"pid": pid, "name": "?", "cmdline": []} for pid in ended]


def _describe(p: Proc) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": p.pid, "name": "?", "cmdline": []}
    handle = p.psutil()
    if handle is not None:
        with contextlib.suppress(psutil.Error):
            info["name"] = handle.name()
            info["cmdline"] = handle.cmdline()
    return info


# --- ports ----------------------------------------------------------------------------------


def _bind_error(host: str, port: int) -> OSError | None:
    """Bind as vLLM's ``create_server_socket`` does (family by address, SO_REUSEADDR)."""
    family = socket.AF_INET
    with contextlib.suppress(OSError):
        socket.inet_pton(socket.AF_INET6, host)
        family = socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers set it: TIME_WAIT leftovers do not count as held.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "", port))
        except socket.gaierror as e:
            return OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {e.strerror}")
        except OSError as e:
            return e
    return None


def port_holder_info(host: str, port: int) -> dict[str, Any] | None:
    """Who holds ``host:port``: None when it is free, else what can be learned (pid may be None)."""
    err = _bind_error(host, port)
    if err is None:
        return None
    info: dict[str, Any] = {
        "host": host, "port": port, "pid": None, "in_use": err.errno == errno.EADDRINUSE,
        "error": err.strerror or str(err),
    }
    if not info["in_use"]:
        return info
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return info
    on_port = [c for c in conns if c.laddr and c.laddr.port == port and c.pid]
    on_port.sort(key=lambda c: c.status != psutil.CONN_LISTEN)  # a listener first, if any
    if on_port:
        info["pid"] = on_port[0].pid
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(on_port[0].pid)
            info.update(name=p.name(), cmdline=p.cmdline(), user=p.username())
            info["marker"] = p.environ().get(MARKER)
    return info


def port_holder(host: str, port: int, ours: str | None = None) -> str | None:
    """What holds vLLM's port, in words; None when it is free or (``ours``: a state id) one of this guard's."""
    info = port_holder_info(host, port)
    if info is None:
        return None
    if not info["in_use"]:
        return f"vLLM cannot listen on {host or '*'}:{port}: {info['error']}"
    marker = info.get("marker") or ""
    if ours is not None and marker.startswith(ours + ":"):
        return None
    if info.get("pid") is None:
        return f"port {port} is in use by a process this user cannot see (another user's; `sudo ss -ltnp` names it)"
    cmd = REGISTRY.text(" ".join(REGISTRY.argv(info.get("cmdline") or [])) or info.get("name", "?"))[:160]
    who = "another vllm-guard's vLLM" if marker else (info.get("name") or "a process")
    user = f", user {info['user']}" if info.get("user") else ""
    return f"port {port} is held by {who} (pid {info['pid']}{user}: {cmd})"
