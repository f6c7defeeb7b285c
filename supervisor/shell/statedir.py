"""The guard's files: safe directories, atomic writes, the one-guard-per-state-dir lock, GPU turns,
learned flags, and bounded append-only logs.

Everything here survives the guard being SIGKILLed at any instant: files are replaced atomically
(a reader sees the old or the new content, never half), and locks are ``flock`` locks, which the
kernel drops when the holder dies, so a dead guard never blocks the next one.

And nothing here can be turned against the machine when the guard runs as root:

* every file is opened with ``O_NOFOLLOW``: a symbolic link planted at a name the guard writes is
  removed (the link, never its target) and a fresh file made; one planted at a name it only reads
  is set aside like a corrupt file;
* the state dir must belong to the guard's user (or root) and is made private (0700) when it is
  ours; a state dir another user owns or can write is refused (exit 78);
* the machine-wide GPU lock dir must be sticky and belong to root or to us; otherwise the guard
  uses a private lock dir of its user and says that turns are then not shared with other users;
* the guard's own files that are corrupt (not UTF-8, not JSON, the wrong shape, a directory in
  their place) are moved aside and the guard goes on; nothing is read past a size bound.
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
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import structlog

from supervisor.errors import EX_CONFIG, GuardError

log = structlog.get_logger("vllm-guard")

GUARD_LOCK = "guard.lock"
GUARD_INFO = "guard.json"
LEARNED = "learned.json"
MAX_STATE_FILE = 16 << 20        # a state file larger than this is corrupt, not read
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class StateError(Exception):
    """A state file cannot be read or written; the message names the file and what to do."""


class UnsafeDir(GuardError):
    """A directory the guard would write in belongs to someone else or is writable by others."""

    exit_code = EX_CONFIG


class AlreadyRunning(GuardError):
    """Another guard holds the state dir; ``holder`` has its pid, start time and status port."""

    exit_code = EX_CONFIG

    def __init__(self, state_dir: str, holder: dict[str, Any]) -> None:
        self.holder = holder
        parts = [f"pid {holder.get('pid', 'unknown')}"]
        if holder.get("started"):
            parts.append(f"started {holder['started']}")
        if holder.get("status_port"):
            parts.append(f"status port {holder['status_port']}")
        super().__init__(
            f"another vllm-guard is already running on state dir {state_dir} ({', '.join(parts)}); "
            "stop it or give this one its own state dir (--state-dir or VLLM_GUARD_STATE_DIR)"
        )


class GpuTurnTimeout(TimeoutError):
    """Waiting for the GPU turn took longer than allowed; ``holder`` names who has it."""

    def __init__(self, key: str, timeout: float, holder: dict[str, Any]) -> None:
        self.key = key
        self.holder = holder
        who = f"pid {holder['pid']}" if holder.get("pid") else "another process"
        super().__init__(f"waited {timeout:g}s for the start-up turn on GPU {key}, still held by {who}")


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- directories ----------------------------------------------------------------------------


def _owner_ok(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def ensure_dir(path: str | Path, mode: int = 0o700) -> Path:
    """Create ``path`` (and parents) when missing and make sure the guard alone can write in it.

    Raises :class:`UnsafeDir` for a directory (or a symbolic link to one) that another user owns
    or that others can write; a directory of ours that others can write is made 0700.
    """
    p = Path(path).expanduser()
    try:
        link = os.lstat(p)
    except FileNotFoundError:
        p.mkdir(parents=True, exist_ok=True, mode=mode)
        link = os.lstat(p)
    if stat.S_ISLNK(link.st_mode) and not _owner_ok(link.st_uid):
        raise UnsafeDir(f"the state dir {p} is a symbolic link made by uid {link.st_uid}; refusing to follow it "
                        "(give the guard a directory of its own)")
    st = os.stat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"the state dir {p} is not a directory")
    if st.st_uid != os.geteuid():
        if st.st_uid != 0 or st.st_mode & 0o022:
            others = " and others can write it" if st.st_mode & 0o022 else ""
            raise UnsafeDir(f"the state dir {p} belongs to uid {st.st_uid}{others}; "
                            "another user could plant links there that this guard would follow: give it a "
                            "directory of its own (chown it, or --state-dir)")
    elif st.st_mode & 0o022:
        os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o077)
        log.warning(f"the state dir {p} was writable by other users; made it private (0700)")
    return p


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


# --- files ----------------------------------------------------------------------------------


def open_for_writing(path: str | Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` for a file the guard owns: never through a symbolic link (a planted one is
    removed, never followed) and only a regular file."""
    path = Path(path)
    for _ in range(3):
        try:
            fd = os.open(path, flags | _NOFOLLOW, mode)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            log.warning(f"{path} was a symbolic link; removed it (its target is untouched)")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            return fd
        os.close(fd)
        raise StateError(f"{path} is not a regular file; move it away")
    raise StateError(f"{path} keeps being replaced by a symbolic link; refusing to write it")


def safe_open_read(path: str | Path) -> IO[bytes]:
    """Open a state file for reading without following a symbolic link (FileNotFoundError if absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateError(f"{path} is a symbolic link; not reading it") from None
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path)) from None
        raise StateError(f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StateError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that readers and crashes see the old or the new file, whole.

    ``mkstemp`` creates a new file (``O_EXCL``) and ``os.replace`` replaces a link itself, never its
    target, so neither follows a planted symbolic link.
    """
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
    """Read a JSON state file: None when missing, :class:`StateError` when it cannot be trusted
    (a link, not a regular file, too large, not UTF-8, not JSON)."""
    try:
        with safe_open_read(path) as f:
            raw = f.read(MAX_STATE_FILE + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from e
    if len(raw) > MAX_STATE_FILE:
        raise StateError(f"{path} is larger than {MAX_STATE_FILE >> 20} MiB")
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError as e:      # UnicodeDecodeError is a ValueError too
        raise StateError(f"{path} is not valid JSON ({e})") from e


def set_aside(path: str | Path, why: str) -> None:
    """Move a corrupt or hostile state file (or link, or directory) out of the way, saying so."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.corrupt-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}")
    try:
        os.replace(path, aside)
    except OSError as e:
        if e.errno != errno.ENOENT:
            log.warning(f"{why}; could not move {path} aside ({e.strerror}); ignoring it")
        return
    log.warning(f"{why}; moved it to {aside}")


def append_line(path: str | Path, line: str | bytes, *, max_bytes: int) -> None:
    """Append one line to a bounded log: past ``max_bytes`` the file becomes ``<name>.1`` first."""
    path = Path(path)
    data = (line.encode("utf-8", "replace") if isinstance(line, str) else line) + b"\n"
    fd = open_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        if os.fstat(fd).st_size + len(data) > max_bytes:
            os.close(fd)
            fd = -1
            os.replace(path, path.with_name(path.name + ".1"))
            fd = open_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, data)
    finally:
        if fd >= 0:
            os.close(fd)


def read_lines(path: str | Path) -> Iterator[bytes]:
    """The lines :func:`append_line` kept at ``path``, both generations, oldest first, without their
    line ends; a generation that is absent or not a file to trust (a planted link) reads as empty."""
    path = Path(path)
    for generation in (path.with_name(path.name + ".1"), path):
        try:
            f = safe_open_read(generation)
        except (FileNotFoundError, StateError):
            continue
        with f:
            for raw in f:
                yield raw.rstrip(b"\r\n")


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
        # O_CLOEXEC matters: a vLLM child that inherited this descriptor would keep the state dir
        # locked after the guard's death.
        fd = open_for_writing(d / GUARD_LOCK, os.O_RDWR | os.O_CREAT)
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
        """Write ``guard.json`` (pid, started and e.g. ``status_port``) for clients and a second guard."""
        self._info.update(info)
        write_json(Path(self.state_dir) / GUARD_INFO, self._info, 0o600)

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
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            holder = data if isinstance(data, dict) else {}
        if holder.get("pid") or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    with contextlib.suppress(StateError):
        info = read_json(state_dir / GUARD_INFO)
        if isinstance(info, dict) and info.get("pid") == holder.get("pid"):
            holder = {**info, **holder}
    return holder


def is_running(state_dir: str) -> bool:
    """Whether a guard holds ``state_dir`` now (its lock is taken)."""
    try:
        fd = os.open(Path(state_dir) / GUARD_LOCK, os.O_RDONLY | _NOFOLLOW)
    except OSError:
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
    return (stat.S_ISDIR(st.st_mode) and _owner_ok(st.st_uid)
            and (bool(st.st_mode & stat.S_ISVTX) or not st.st_mode & 0o022))


def _private_lock_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir())
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
    for base, name in ((Path("/run/lock"), "vllm-guard"), (Path(tempfile.gettempdir()), "vllm-guard-locks")):
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
    """Open a lock file another user's guard may have made: never through a link, only a regular file."""
    # Open an existing file without O_CREAT first: with fs.protected_regular, O_CREAT on another
    # user's file in a sticky directory fails even though plain opening is allowed.
    while True:
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)  # flock works on a read-only descriptor too
        if fd < 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
                os.fchmod(fd, 0o666)
            except FileExistsError:
                continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StateError(f"{path} is not a regular file")
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


def _holder_of(fd: int) -> dict[str, Any]:
    with contextlib.suppress(ValueError, OSError, TypeError):
        return dict(json.loads(os.pread(fd, 4096, 0) or b"{}"))
    return {}


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


# --- learned flags --------------------------------------------------------------------------


def learned_facts(cfg: Any, facts: Any, state_dir: str) -> tuple[Any, StoreKeys]:
    """``facts`` with what the state dir learned on this host: the flags that served this model on
    these GPUs and vLLM as asked, and vLLM's memory as a healthy launch printed it (for any flags);
    with the keys to store them under. Secret values come back from the flags given (the store
    never holds them)."""
    from dataclasses import replace

    from supervisor.core.session import Learned, Measured
    from supervisor.shell.auth import restore_masked

    requested = cfg.requested_flags()
    gpus = [(d.name, d.total_bytes) for d in facts.devices] or [("cpu", int((facts.cpu_kv_space_gib or 0) * (1 << 30)))]
    where = dict(model=cfg.model, revision=None, gpus=gpus, tp=requested.get_int("--tensor-parallel-size") or 1,
                 vllm_version=facts.vllm_version)
    keys = StoreKeys(learned_key(**where, user_args=list(cfg.vllm_args)),
                     MEASURED_PREFIX + learned_key(**where, user_args=[]))
    if not os.path.isdir(state_dir):
        return facts, keys
    store = LearnedStore(state_dir)
    entry = store.get(keys.measured)
    found = entry.get("meta") if entry is not None else None
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    if "measured" in meta:
        facts = replace(facts, measured=Measured.from_dict(meta["measured"]))
    entry = store.get(keys.flags)
    if entry is None:
        return facts, keys
    found = entry.get("meta")
    meta = found if isinstance(found, dict) else {}
    found = meta.get("reasons")
    reasons: dict[str, Any] = found if isinstance(found, dict) else {}
    argv = restore_masked(entry["argv"], list(cfg.vllm_args))
    return replace(facts, learned=Learned(tuple(argv), str(entry.get("saved_at") or ""),
                                          {str(k): str(v) for k, v in reasons.items()})), keys


#: learned.json keys of vLLM's measured memory (one per host, model, GPUs, TP and vLLM, whatever the flags).
MEASURED_PREFIX = "measured:"


@dataclass(frozen=True)
class StoreKeys:
    flags: str              # the flags that served, for the flags asked
    measured: str           # vLLM's memory as it printed it, for any flags


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
    log.warning(message)


class LearnedStore:
    """Flags that made a launch healthy, in ``<state_dir>/learned.json`` (a dict by key).

    Learned flags are an optimisation: a store that cannot be read is set aside and the guard
    starts without it. Secret values (``--api-key``) are never written: the user's own come back
    from the flags given at start.
    """

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
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
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
        if not isinstance(argv, list) or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            self._warn(f"learned flags for {key} in {self.path} are malformed; ignoring them")
            return None
        return cast(dict[str, Any], entry)

    def put(self, key: str, argv: list[str], meta: dict[str, Any]) -> None:
        """Store the vLLM args that became healthy under ``key`` (secret values masked)."""
        from supervisor.shell.auth import redact_argv

        data = self._load()
        data[key] = {"argv": redact_argv(argv), "saved_at": _now_iso(), "meta": dict(meta)}
        write_json(self.path, data, 0o600)

    def drop(self, key: str) -> None:
        """Forget ``key`` (a launch with these flags failed)."""
        data = self._load()
        if data.pop(key, None) is not None:
            write_json(self.path, data, 0o600)
