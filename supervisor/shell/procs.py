"""Processes of a launch: mark them, record them, end all of them, and find what a dead guard left.

vLLM's ``VLLM::EngineCore`` and ``VLLM::Worker_*`` processes outlive a SIGKILLed API server and keep
the GPU. So every launch is ended three ways at once: its process group, a psutil walk of its
descendants taken while they were alive, and a scan for the marker variable ``VLLMGUARD_LAUNCH``
that every process of a launch inherits. Nothing unmarked and unrecorded is ever signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from supervisor.errors import StateError
from supervisor.shell import auth
from supervisor.shell.diskfaults import FAULTS
from supervisor.shell.statefiles import ensure_dir, read_json, remove, set_aside, write_json

MARKER = "VLLMGUARD_LAUNCH"
LAUNCH_FILE = "launch.json"

_KILL_WAIT = 5.0     # after SIGKILL, how long to wait for the kernel to finish them
_OWNER_GRACE = 0.5   # a zombie child is left this long for its owner (asyncio, Popen) to reap
_CREATE_SLACK = 0.05  # create_time is in clock ticks (10 ms); same process if within this

_LINUX = sys.platform.startswith("linux")
# Loaded now, not in the forked child: dlopen after fork can deadlock on the loader lock.
_LIBC = ctypes.CDLL(None, use_errno=True) if _LINUX else None
_PR_SET_PDEATHSIG = 1
_forking_pid = 0


def _remember_forking_pid() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


# Runs in the parent just before every fork that can run Python in the child (os.fork, and
# subprocess with a preexec_fn), so the child knows who its parent was even if it is gone.
os.register_at_fork(before=_remember_forking_pid)


def state_id(state_dir: str) -> str:
    """A short stable id of the absolute, resolved state dir path."""
    path = os.path.realpath(os.path.abspath(os.path.expanduser(state_dir)))
    return hashlib.sha256(path.encode()).hexdigest()[:12]


def child_env(
    base: Mapping[str, str],
    state_dir: str,
    launch_id: int,
    drop: Iterable[str] = ("VLLM_GUARD_TOKEN",),
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


def preexec_pdeathsig() -> None:
    """subprocess ``preexec_fn``: the child gets SIGKILL when the guard dies (Linux; else no-op).

    The kernel sends it when the *thread* that forked exits, so the guard must spawn vLLM from
    its main thread (asyncio's subprocess functions fork in the event loop's thread: run the loop
    in the main thread). Grandchildren do not inherit it; the marker finds those.
    """
    if _LIBC is None:
        return
    parent = _forking_pid or os.getppid()
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the guard died before prctl took effect: die now, as it would
        os.kill(os.getpid(), signal.SIGKILL)


# --- the launch record ----------------------------------------------------------------------


def _launch_path(state_dir: str) -> Path:
    return Path(state_dir).expanduser() / LAUNCH_FILE


def _identity(pid: int) -> dict[str, Any] | None:
    with contextlib.suppress(psutil.Error):
        return {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    return None


def record_launch(state_dir: str, pid: int, pgid: int) -> None:
    """Atomically write ``launch.json``: pid, pgid, create_time, started_at, marker (best effort: a disk that
    refuses it is a warning; the marker still finds the launch's processes)."""
    ident = _identity(pid) or {"create_time": None}
    marker = f"{state_id(state_dir)}:"
    with contextlib.suppress(psutil.Error):
        marker = psutil.Process(pid).environ().get(MARKER, marker)
    record = {
        "pid": pid,
        "pgid": pgid,
        "create_time": ident["create_time"],
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


def note_tree(state_dir: str, procs: Iterable[psutil.Process]) -> None:
    """Add processes (e.g. :func:`snapshot_tree` once healthy) to ``launch.json`` by pid+create_time (best
    effort, as :func:`record_launch`)."""
    record = _read_record(state_dir)
    if record is None:
        return
    tree = _tree(record)
    known = {(e.get("pid"), e.get("create_time")) for e in tree}
    for p in procs:
        ident = _identity(p.pid)
        if ident and (ident["pid"], ident["create_time"]) not in known:
            tree.append(ident)
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


def snapshot_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants now; [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _has_marker(p: psutil.Process, sid: str) -> bool:
    try:
        return p.environ().get(MARKER, "").startswith(sid + ":")
    except psutil.Error:  # gone, a zombie, or not ours to read
        return False


def marked_processes(state_dir: str) -> list[psutil.Process]:
    """Every live process whose environment has ``VLLMGUARD_LAUNCH=<state_id>:*``."""
    sid = state_id(state_dir)
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and _has_marker(p, sid)]


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) == pgid:
                members.append(p)
    return members


def _verified(pid: Any, create_time: Any) -> psutil.Process | None:
    """The process ``pid`` if it is still the one recorded (same create_time), else None."""
    if not isinstance(pid, int) or not isinstance(create_time, (int, float)):
        return None
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - create_time) < _CREATE_SLACK else None
    except psutil.Error:
        return None


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever their environment says."""
    pids = {os.getpid(), 0, 1}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


# --- ending processes -----------------------------------------------------------------------


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _signal(procs: Iterable[psutil.Process], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)  # psutil checks create_time first: a reused pid is not signalled


def _wait(procs: list[psutil.Process], deadline: float, hurry: threading.Event | None = None) -> list[psutil.Process]:
    delay = 0.01
    while True:
        alive = [p for p in procs if not _gone(p)]
        if not alive or time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            return alive
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.1)


def _reap(procs: Iterable[psutil.Process]) -> None:
    """Reap zombies that are our own children, once their owner had the chance to."""
    me = os.getpid()
    ours = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() == psutil.STATUS_ZOMBIE and p.ppid() == me:
                ours.append(p.pid)
    deadline = time.monotonic() + _OWNER_GRACE
    while ours:
        ours = [pid for pid in ours if psutil.pid_exists(pid)]
        if not ours or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for pid in ours:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def end_processes(procs: Iterable[psutil.Process], pgid: int | None, grace: float,
                  hurry: threading.Event | None = None) -> list[int]:
    """SIGTERM the group and each process, SIGKILL what is left after ``grace`` (or as soon as
    ``hurry`` is set: a second stop request); return ended pids.

    Never signals this process or its ancestors, nor our own process group. Zombies count as
    ended; those that are our children are reaped.
    """
    protected = _protected()
    if pgid is not None and (pgid <= 1 or pgid == os.getpgrp()):
        pgid = None  # the child shares our group: signalling it would end the guard
    targets = {p.pid: p for p in procs if p.pid not in protected}
    if pgid is not None:
        members = _group_members(pgid)
        if any(p.pid in protected for p in members):
            pgid = None  # an ancestor of ours is in that group: signal only the listed processes
        else:
            for p in members:
                targets.setdefault(p.pid, p)
    started = [p for p in targets.values() if not _gone(p)]
    _signal(started, pgid, signal.SIGTERM)
    alive = _wait(started, time.monotonic() + grace, hurry)
    if pgid is not None:  # a member forked after our scan still gets the SIGKILL by group
        alive += [p for p in _group_members(pgid) if p.pid not in targets and not _gone(p)]
    if alive:
        _signal(alive, pgid, signal.SIGKILL)
        alive = _wait(alive, time.monotonic() + _KILL_WAIT)
    _reap(targets.values())
    left = {p.pid for p in alive}
    return sorted(p.pid for p in started if p.pid not in left)


async def end_processes_async(
    procs: Iterable[psutil.Process], pgid: int | None, grace: float, hurry: threading.Event | None = None
) -> list[int]:
    """:func:`end_processes` without blocking the event loop (the waiting runs in a thread)."""
    return await asyncio.to_thread(end_processes, list(procs), pgid, grace, hurry)


def sweep_orphans(state_dir: str, grace: float = 5.0) -> list[dict[str, Any]]:
    """End what a previous guard on ``state_dir`` left; return ``[{pid, name, cmdline}]`` ended.

    Ours means: the recorded pid or tree entries with the same create_time, members of the
    recorded group while its recorded leader still lives, processes carrying our marker, and
    descendants of all of those. Everything else is left alone, however much it looks like vLLM.
    """
    sid = state_id(state_dir)
    record = _read_record(state_dir)
    found: dict[int, psutil.Process] = {}
    pgid = None
    if record is not None:
        leader = _verified(record.get("pid"), record.get("create_time"))
        for entry in _tree(record):
            if isinstance(entry, dict) and (p := _verified(entry.get("pid"), entry.get("create_time"))):
                found[p.pid] = p
        rec_pgid = record.get("pgid")
        if isinstance(rec_pgid, int) and rec_pgid > 1:
            for p in _group_members(rec_pgid):
                if leader is not None or _has_marker(p, sid):
                    found[p.pid] = p
            if leader is not None:
                found[leader.pid] = leader
                pgid = rec_pgid
    for p in marked_processes(state_dir):
        found[p.pid] = p
    for p in list(found.values()):
        for child in snapshot_tree(p.pid)[1:]:
            found.setdefault(child.pid, child)
    protected = _protected()
    found = {pid: p for pid, p in found.items() if pid not in protected}
    described = {pid: _describe(p) for pid, p in found.items()}
    ended = set(end_processes(found.values(), pgid, grace))
    clear_launch(state_dir)
    return [described[pid] for pid in sorted(ended)]


def _describe(p: psutil.Process) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": p.pid, "name": "?", "cmdline": []}
    with contextlib.suppress(psutil.Error):
        info["name"] = p.name()
        info["cmdline"] = p.cmdline()
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
    cmd = auth.redact_text(" ".join(auth.redact_argv(info.get("cmdline") or [])) or info.get("name", "?"))[:160]
    who = "another vllm-guard's vLLM" if marker else (info.get("name") or "a process")
    user = f", user {info['user']}" if info.get("user") else ""
    return f"port {port} is held by {who} (pid {info['pid']}{user}: {cmd})"
