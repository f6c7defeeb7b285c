"""The guard's locks: one guard per state dir, and one vLLM start-up at a time per GPU.

Both are ``flock`` locks, which the kernel drops when the holder dies, so a SIGKILLed guard never
blocks the next one. Every lock file is opened through :func:`supervisor.shell.statefiles.open_state`
(never through a link, never blocking, only a regular file with one link), the state dir's lock file
only when it is the guard's own; the GPU lock files live in a machine-wide dir that guards of every
user share, which is used only when it is sticky and belongs to root or to us (otherwise the guard
takes its turns in a private dir of its user and says that turns are then not shared with others).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from supervisor.errors import AlreadyRunning, StateError, UnsafeDir
from supervisor.shell.diskfaults import FAULTS
from supervisor.shell.statefiles import ensure_dir, open_state, owner_ok, read_json, temp_root, write_json

log = structlog.get_logger("vllm-guard")

GUARD_LOCK = "guard.lock"
GUARD_INFO = "guard.json"
_LOCK_RECORD = 4096          # a lock file holds one short JSON record; a larger one is not a lock file


class GpuTurnTimeout(TimeoutError):
    """Waiting for the GPU turn took longer than allowed; ``holder`` names who has it."""

    def __init__(self, key: str, timeout: float, holder: dict[str, Any]) -> None:
        self.key = key
        self.holder = holder
        who = f"pid {holder['pid']}" if holder.get("pid") else "another process"
        super().__init__(f"waited {timeout:g}s for the start-up turn on GPU {key}, still held by {who}")


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _record(fd: int) -> dict[str, Any]:
    """The JSON record in a lock file ({} when there is none to read)."""
    with contextlib.suppress(ValueError, OSError, TypeError, RecursionError):
        data = json.loads(os.pread(fd, _LOCK_RECORD, 0) or b"{}")
        return data if isinstance(data, dict) else {}
    return {}


def _write_record(fd: int, record: dict[str, Any], path: Path) -> None:
    """Put ``record`` in a lock file the guard holds (best effort: the lock is the flock, not the bytes)."""
    def write() -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    FAULTS.attempt(path, write)


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
        # O_CLOEXEC (open_state's) matters: a vLLM child that inherited this descriptor would keep the
        # state dir locked after the guard's death.
        fd = open_state(d / GUARD_LOCK, os.O_RDWR | os.O_CREAT, cap=_LOCK_RECORD)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd, d)
            os.close(fd)
            raise AlreadyRunning(self.state_dir, holder) from None
        self._info = {"pid": os.getpid(), "started": _now_iso()}
        _write_record(fd, self._info, d / GUARD_LOCK)
        self._fd = fd

    def publish(self, **info: Any) -> None:
        """Write ``guard.json`` (pid, started and e.g. ``status_port``) for clients and a second guard (best
        effort: on a full disk the guard serves without it)."""
        self._info.update(info)
        path = Path(self.state_dir) / GUARD_INFO
        FAULTS.attempt(path, lambda: write_json(path, self._info, 0o600))

    def release(self) -> None:
        """Drop the lock; safe to call twice. ``guard.json`` stays (clients read the last endpoint)."""
        if self._fd is None:
            return
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
        holder = _record(fd)
        if holder.get("pid") or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    with contextlib.suppress(StateError):
        info = read_json(state_dir / GUARD_INFO)
        if isinstance(info, dict) and info.get("pid") == holder.get("pid"):
            holder = {**info, **holder}
    return holder


def is_running(state_dir: str) -> bool:
    """Whether a guard holds ``state_dir`` now (its lock is taken); never blocks, never follows a link."""
    try:
        fd = open_state(Path(state_dir) / GUARD_LOCK, os.O_RDONLY, cap=_LOCK_RECORD)
    except (OSError, StateError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# --- GPU turns ------------------------------------------------------------------------------


def _shared_dir_ok(d: Path) -> bool:
    """A machine-wide lock dir is trusted when it is sticky and belongs to root or to us."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and owner_ok(st.st_uid)
            and (bool(st.st_mode & stat.S_ISVTX) or not st.st_mode & 0o022))


def _private_lock_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else temp_root()
    d = base / f"vllm-guard-locks-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UnsafeDir(f"{d} is not a private directory of this user; remove it")
    return d


_warned_private = False


def gpu_lock_dir() -> Path:
    """The machine-wide directory for GPU turn locks (sticky, shared by every user's guards), or,
    when that one cannot be trusted, a private one of this user (turns then not shared with others)."""
    global _warned_private
    for base, name in ((Path("/run/lock"), "vllm-guard"), (temp_root(), "vllm-guard-locks")):
        d = base / name
        try:
            d.mkdir(mode=0o1777)
            os.chmod(d, 0o1777)  # sticky and world-writable like /tmp: guards of other users share it
        except FileExistsError:
            pass
        except OSError:
            continue
        if _shared_dir_ok(d) and os.access(d, os.W_OK | os.X_OK):
            return d
        if d.exists() and not _warned_private:
            _warned_private = True
            log.warning(f"the GPU lock dir {d} belongs to another user or is not sticky; using a private one "
                        "(start-up turns are not shared with guards of other users)")
    return _private_lock_dir()


def _lock_name(key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:80]
    if safe != key:
        safe += "-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"gpu-{safe}.lock"


def _open_shared(path: Path) -> int:
    """A GPU lock file another user's guard may have made (any owner; never a link, a FIFO, a hard link)."""
    while True:
        try:
            return open_state(path, os.O_RDWR, shared=True, cap=_LOCK_RECORD)
        except FileNotFoundError:
            pass
        except PermissionError:      # another user's file: flock works on a read-only descriptor too
            return open_state(path, os.O_RDONLY, shared=True, cap=_LOCK_RECORD)
        try:
            fd = open_state(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666, shared=True, cap=_LOCK_RECORD)
        except FileExistsError:
            continue
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)
        return fd


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


class GpuTurn:
    """The lock files of one turn; several GPUs are locked in sorted order so turns cannot deadlock.

    ``step()`` tries once without blocking (True when every lock is held); ``close()`` lets go.
    :func:`gpu_turn` and :func:`gpu_turn_async` wrap it with a deadline.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.fds: list[int] = []
        self.held = 0
        try:
            try:
                self._open(gpu_lock_dir())
            except (OSError, StateError) as e:     # a planted link or a foreign file in the shared dir
                log.warning(f"cannot use the shared GPU lock for {key} ({e}); using a private one")
                self.close()
                self._open(_private_lock_dir())
        except BaseException:
            self.close()
            raise

    def _open(self, d: Path) -> None:
        for k in _keys(self.key):
            self.fds.append(_open_shared(d / _lock_name(k)))

    def step(self) -> bool:
        """Take whatever locks are free now; True once all of them are held."""
        while self.held < len(self.fds) and _try_lock(self.fds[self.held]):
            self.held += 1
        return self.held == len(self.fds)

    def timeout(self, timeout: float) -> GpuTurnTimeout:
        """The error to raise when the turn did not come in ``timeout`` seconds."""
        return GpuTurnTimeout(self.key, timeout, _record(self.fds[self.held]))

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
async def gpu_turn_async(key: str, timeout: float, poll: float = 0.5, on_wait: Callable[[], None] | None = None,
                         stop: asyncio.Event | None = None) -> AsyncIterator[GpuTurn | None]:
    """:func:`gpu_turn` for asyncio: polls the lock without blocking the event loop. ``on_wait`` is
    called once if the turn is not free at first; the turn is yielded so it can be closed early
    (closing twice is harmless). When ``stop`` is set while waiting, it yields None at once."""
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
            if stop is None:
                await asyncio.sleep(poll)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=poll)
            if stop.is_set():
                turn.close()
                yield None
                return
        yield turn
    finally:
        turn.close()
