"""The guard's files: atomic writes, the one-guard-per-state-dir lock, GPU turns, learned flags.

Everything here survives the guard being SIGKILLed at any instant: files are replaced atomically
(a reader sees the old or the new content, never half), and locks are ``flock`` locks, which the
kernel drops when the holder dies, so a dead guard never blocks the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog

GUARD_LOCK = "guard.lock"
GUARD_INFO = "guard.json"
LEARNED = "learned.json"


class StateError(Exception):
    """A state file cannot be read or written; the message names the file and what to do."""


class AlreadyRunning(Exception):
    """Another guard holds the state dir; ``holder`` has its pid, start time and status port."""

    def __init__(self, state_dir: str, holder: dict[str, Any]) -> None:
        self.holder = holder
        parts = [f"pid {holder.get('pid', 'unknown')}"]
        if holder.get("started"):
            parts.append(f"started {holder['started']}")
        if holder.get("status_port"):
            parts.append(f"status port {holder['status_port']}")
        super().__init__(
            f"another vllm-guard is already running on state dir {state_dir} ({', '.join(parts)}); "
            "stop it or give this one its own state dir"
        )


class GpuTurnTimeout(TimeoutError):
    """Waiting for the GPU turn took longer than allowed; ``holder`` names who has it."""

    def __init__(self, key: str, timeout: float, holder: dict[str, Any]) -> None:
        self.key = key
        self.holder = holder
        who = f"pid {holder['pid']}" if holder.get("pid") else "another process"
        super().__init__(f"waited {timeout:g}s for the start-up turn on GPU {key}, still held by {who}")


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def ensure_dir(path: str | Path, mode: int = 0o700) -> Path:
    """Create ``path`` (and parents) with ``mode`` when missing; return it."""
    p = Path(path).expanduser()
    p.mkdir(parents=True, exist_ok=True, mode=mode)
    return p


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that readers and crashes see the old or the new file, whole."""
    target = Path(path)
    directory = target.parent
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600; the umask must not decide either
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)  # the rename itself is durable only once the directory is


def write_json(path: str | Path, obj: Any, mode: int = 0o644) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


def read_json(path: str | Path) -> Any:
    """Read a JSON state file: None when missing, :class:`StateError` when broken."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise StateError(f"{path} is not valid JSON ({e}); move it aside or delete it") from e


# --- one guard per state dir ---------------------------------------------------------------


class StateDirLock:
    """An exclusive ``flock`` on ``<state_dir>/guard.lock``; the file holds the holder's pid."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = str(state_dir)
        self._fd: int | None = None
        self._info: dict[str, Any] = {}

    def acquire(self) -> None:
        """Take the lock without waiting, or raise :class:`AlreadyRunning` naming the holder."""
        if self._fd is not None:
            return
        d = ensure_dir(self.state_dir)
        # O_CLOEXEC (Python's default) matters: a vLLM child that inherited this descriptor would
        # keep the state dir locked after the guard's death.
        fd = os.open(d / GUARD_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd, d)
            os.close(fd)
            raise AlreadyRunning(self.state_dir, holder) from None
        self._info = {"pid": os.getpid(), "started": _now_iso()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._info).encode(), 0)
        self._fd = fd

    def publish(self, **info: Any) -> None:
        """Write ``guard.json`` (pid, started and e.g. ``status_port``) for a second guard to quote."""
        self._info.update(info)
        write_json(Path(self.state_dir) / GUARD_INFO, self._info)

    def release(self) -> None:
        """Drop the lock (and our ``guard.json``); safe to call twice."""
        if self._fd is None:
            return
        info = Path(self.state_dir) / GUARD_INFO
        with contextlib.suppress(StateError, OSError):
            if (read_json(info) or {}).get("pid") == os.getpid():
                info.unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock_holder(fd: int, state_dir: Path) -> dict[str, Any]:
    holder: dict[str, Any] = {}
    deadline = time.monotonic() + 1.0
    while True:  # the holder writes its pid just after locking; give it that moment
        with contextlib.suppress(ValueError, OSError):
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if holder.get("pid") or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    with contextlib.suppress(StateError):
        info = read_json(state_dir / GUARD_INFO)
        if isinstance(info, dict) and info.get("pid") == holder.get("pid"):
            holder = {**info, **holder}
    return holder


# --- GPU turns ------------------------------------------------------------------------------


def gpu_lock_dir() -> Path:
    """The machine-wide directory for GPU turn locks (shared by every user's guards)."""
    for base, name in ((Path("/run/lock"), "vllm-guard"), (Path(tempfile.gettempdir()), "vllm-guard-locks")):
        d = base / name
        try:
            d.mkdir(mode=0o1777)
            os.chmod(d, 0o1777)  # sticky and world-writable like /tmp: guards of other users share it
        except FileExistsError:
            pass
        except OSError:
            continue
        if d.is_dir() and os.access(d, os.W_OK | os.X_OK):
            return d
    raise StateError("no writable directory for GPU locks (/run/lock or $TMPDIR)")


def _lock_name(key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:80]
    if safe != key:
        safe += "-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"gpu-{safe}.lock"


def _open_shared(path: Path) -> int:
    # Open an existing file without O_CREAT first: with fs.protected_regular, O_CREAT on another
    # user's file in a sticky directory fails even though plain opening is allowed.
    while True:
        try:
            return os.open(path, os.O_RDWR)
        except FileNotFoundError:
            pass
        except PermissionError:
            return os.open(path, os.O_RDONLY)  # flock works on a read-only descriptor too
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)
            return fd
        except FileExistsError:
            continue


def _keys(key: str) -> list[str]:
    keys = sorted({k.strip() for k in key.split(",") if k.strip()})
    if not keys:
        raise ValueError("gpu_turn needs a non-empty key")
    return keys


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "since": _now_iso()}).encode(), 0)
    return True


def _holder_of(fd: int) -> dict[str, Any]:
    with contextlib.suppress(ValueError, OSError):
        return dict(json.loads(os.pread(fd, 4096, 0) or b"{}"))
    return {}


class GpuTurn:
    """The lock files of one turn; several GPUs are locked in sorted order so turns cannot deadlock.

    ``step()`` tries once without blocking (True when every lock is held); ``close()`` lets go.
    :func:`gpu_turn` and :func:`gpu_turn_async` wrap it with a deadline.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        d = gpu_lock_dir()
        self.fds: list[int] = []
        self.held = 0
        try:
            for k in _keys(key):
                self.fds.append(_open_shared(d / _lock_name(k)))
        except BaseException:
            self.close()
            raise

    def step(self) -> bool:
        """Take whatever locks are free now; True once all of them are held."""
        while self.held < len(self.fds) and _try_lock(self.fds[self.held]):
            self.held += 1
        return self.held == len(self.fds)

    def timeout(self, timeout: float) -> GpuTurnTimeout:
        """The error to raise when the turn did not come in ``timeout`` seconds."""
        return GpuTurnTimeout(self.key, timeout, _holder_of(self.fds[self.held]))

    def close(self) -> None:
        """Release every lock of the turn (idempotent)."""
        fds, self.fds, self.held = self.fds, [], 0
        for fd in fds:
            os.close(fd)  # closing the last descriptor drops its flock


@contextlib.contextmanager
def gpu_turn(key: str, timeout: float, poll: float = 0.1) -> Iterator[None]:
    """Hold the start-up turn on GPU ``key`` (comma-separated for several); raise GpuTurnTimeout."""
    turn = GpuTurn(key)
    try:
        deadline = time.monotonic() + timeout
        while not turn.step():
            if time.monotonic() >= deadline:
                raise turn.timeout(timeout)
            time.sleep(poll)
        yield
    finally:
        turn.close()


@contextlib.asynccontextmanager
async def gpu_turn_async(key: str, timeout: float, poll: float = 0.5,
                         on_wait: Callable[[], None] | None = None) -> AsyncIterator[GpuTurn]:
    """:func:`gpu_turn` for asyncio: polls the lock without blocking the event loop. ``on_wait`` is
    called once if the turn is not free at first; the turn is yielded so it can be closed early
    (closing twice is harmless)."""
    turn = GpuTurn(key)
    try:
        deadline = time.monotonic() + timeout
        waited = False
        while not turn.step():
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            if time.monotonic() >= deadline:
                raise turn.timeout(timeout)
            await asyncio.sleep(poll)
        yield turn
    finally:
        turn.close()


# --- learned flags --------------------------------------------------------------------------


def learned_key(
    *,
    model: str,
    revision: str | None,
    gpus: list[tuple[str, int]],
    tp: int,
    vllm_version: str | None,
    user_args: list[str],
) -> str:
    """A stable key for flags learned under these conditions: ``<model>@<revision>#<digest>``."""
    what = {
        "model": model,
        "revision": revision,
        "gpus": sorted([str(name), int(mem)] for name, mem in gpus),
        "tp": int(tp),
        "vllm_version": vllm_version,
        "user_args": list(user_args),
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return f"{model}@{revision or '-'}#{digest}"


def _log_warning(message: str) -> None:
    structlog.get_logger("vllm_guard.state").warning(message)


class LearnedStore:
    """Flags that made a launch healthy, in ``<state_dir>/learned.json`` (a dict by key)."""

    def __init__(self, state_dir: str, warn: Callable[[str], None] = _log_warning) -> None:
        self.path = ensure_dir(state_dir) / LEARNED
        self._warn = warn

    def _load(self) -> dict[str, Any]:
        try:
            data = read_json(self.path)
        except StateError as e:
            self._set_aside(str(e))
            return {}
        if data is None:
            return {}
        if not isinstance(data, dict):
            self._set_aside(f"{self.path} holds {type(data).__name__}, not an object")
            return {}
        return data

    def _set_aside(self, why: str) -> None:
        # Learned flags are an optimisation: a broken store must never stop the guard.
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            if e.errno != errno.ENOENT:
                self._warn(f"{why}; could not move it aside ({e.strerror}); ignoring it")
            return
        self._warn(f"{why}; moved it to {aside} and starting without learned flags")

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry ``{"argv", "saved_at", "meta"}`` for ``key``, or None."""
        entry = self._load().get(key)
        if entry is None:
            return None
        argv = entry.get("argv") if isinstance(entry, dict) else None
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            self._warn(f"learned flags for {key} in {self.path} are malformed; ignoring them")
            return None
        return entry

    def put(self, key: str, argv: list[str], meta: dict[str, Any]) -> None:
        """Store the vLLM args that became healthy under ``key``."""
        data = self._load()
        data[key] = {"argv": list(argv), "saved_at": _now_iso(), "meta": dict(meta)}
        write_json(self.path, data, 0o600)

    def drop(self, key: str) -> None:
        """Forget ``key`` (a launch with these flags failed)."""
        data = self._load()
        if data.pop(key, None) is not None:
            write_json(self.path, data, 0o600)
