"""The guard's kept logs (``vllm.log``, ``history.jsonl``): bounded, append-only, kept open, in two
generations (``<name>`` and ``<name>.1``), and read back for ``vllm-guard logs`` and ``history``.

Every descriptor here comes from the door (:func:`supervisor.shell.statefiles.open_state`): the checks
against links, FIFOs and other owners are made there, not here. This module only decides when to
write, when to rotate (``<name>`` becomes ``<name>.1``) and what to keep while the disk refuses
writes (:data:`supervisor.shell.diskfaults.FAULTS`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import structlog

from supervisor.errors import StateError
from supervisor.shell.diskfaults import FAULTS
from supervisor.shell.statefiles import open_state, set_aside

log = structlog.get_logger("vllm-guard")

_FLUSH_AT = 1 << 20              # an AppendLog writes its buffer once it holds this much, whoever flushes


class AppendLog:
    """An append-only log of bounded size (``<name>`` plus one older generation ``<name>.1``), kept open.

    Lines are buffered and written in batches (:meth:`flush`), so a busy vLLM costs a write per batch,
    not an open, a write and a close per line. Past ``max_bytes`` the file becomes ``<name>.1`` and a
    new one is made. Every open, first, after a rotation, when the name no longer names the file held,
    and after a fault, goes through :func:`open_state`. A write that fails is a fault (:data:`FAULTS`):
    the log keeps the latest ``keep_while_failing`` bytes, tries again ``retry_s`` later, and writes a
    line saying how much it could not keep once the disk takes writes again.
    """

    def __init__(self, path: str | Path, max_bytes: int, *, retry_s: float = 5.0,
                 keep_while_failing: int = 512 << 10) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.retry_s = retry_s
        self.keep_while_failing = keep_while_failing
        self._fd = -1
        self._ino: tuple[int, int] | None = None
        self._size = 0               # bytes in the open file
        self._buf = bytearray()
        self._retry_at = 0.0
        self._lost = 0               # bytes dropped while the disk refused them
        self._torn = False           # the file ends inside a line (a write the disk cut short)

    def write(self, line: bytes) -> None:
        """Buffer one line (without its newline)."""
        self.write_lines(line + b"\n")

    def write_lines(self, block: bytes | bytearray) -> None:
        """Buffer whole lines, each ending with a newline (a batch of them: one call, not one per line).
        A batch that would take the file past ``max_bytes`` is cut at a line end: what fits goes to this
        file, the rest to the next."""
        while self._size + len(self._buf) + len(block) > self.max_bytes:
            room = self.max_bytes - self._size - len(self._buf)
            cut = block.rfind(b"\n", 0, room) + 1 if room > 0 else 0
            if cut:
                self._buf += block[:cut]
                block = block[cut:]
            if not self.flush() or not self._size:
                break                   # the disk refused it (kept, bounded), or one line alone is that long
            self._rotate()
        self._buf += block
        if len(self._buf) >= _FLUSH_AT:
            self.flush()

    @property
    def pending(self) -> int:
        """Bytes buffered, not yet written."""
        return len(self._buf)

    def flush(self) -> bool:
        """Write what is buffered; False when the disk refused it (kept for the next try, bounded)."""
        if not self._buf:
            return True
        if self._fd < 0 or not self._still_ours():
            if not self._open():
                self._bound()
                return False
        if self._lost:
            note = f"=== vllm-guard: {self._lost} bytes were not kept here (the disk refused them)\n".encode()
            self._buf[:0] = (b"\n" if self._torn else b"") + note
            self._lost = 0
        view = memoryview(self._buf)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError as e:
            if written:
                self._torn = view[written - 1] != ord("\n")
            view.release()
            del self._buf[:written]
            self._size += written
            self._fault(e)
            self._bound()
            return False
        view.release()
        self._size += written
        self._buf.clear()
        self._torn = False
        FAULTS.ok(self.path)
        return True

    def close(self) -> None:
        """Write what is buffered (best effort) and let go of the file."""
        self.flush()
        self._close()

    # -- inside ----------------------------------------------------------------------------
    def _open(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        try:
            fd = open_state(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            st = os.fstat(fd)
        except (OSError, StateError) as e:
            self._fault(e)
            return False
        self._close()
        self._fd, self._ino, self._size = fd, (st.st_dev, st.st_ino), st.st_size
        if self._size + len(self._buf) > self.max_bytes and self._size:
            self._rotate()
        return self._fd >= 0

    def _still_ours(self) -> bool:
        """Whether the name still names the file held (someone may have moved or removed it)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ino

    def _rotate(self) -> None:
        """``<name>`` becomes ``<name>.1`` (a directory or the like in the way is set aside), a new file is made."""
        older = self.path.with_name(self.path.name + ".1")
        try:
            if self._still_ours():
                try:
                    os.rename(self.path, older)
                except OSError as e:
                    if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    set_aside(older, f"{older} was a directory")
                    os.rename(self.path, older)
        except (OSError, StateError) as e:
            # Cannot rotate (a read-only remount ...): start the file over rather than grow past its bound.
            log.warning(f"cannot rotate {self.path} ({getattr(e, 'strerror', None) or e}); starting it over")
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                self._size = 0
                return
        self._close()
        self._retry_at = 0.0
        self._open()

    def _close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._ino, self._size = -1, None, 0

    def _fault(self, e: BaseException) -> None:
        self._close()
        self._retry_at = time.monotonic() + self.retry_s
        FAULTS.failed(self.path, e)

    def _bound(self) -> None:
        extra = len(self._buf) - self.keep_while_failing
        if extra > 0:
            cut = self._buf.find(b"\n", extra)
            cut = len(self._buf) if cut < 0 else cut + 1
            self._lost += cut
            del self._buf[:cut]


def _generations(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".1"), path


def read_lines(path: str | Path) -> Iterator[bytes]:
    """The lines an :class:`AppendLog` kept at ``path``, both generations, oldest first, without their line
    ends; a generation that is absent or not a file to trust (a planted link, a FIFO) reads as empty."""
    for generation in _generations(Path(path)):
        f = open_follow(generation)
        if f is None:
            continue
        with f:
            for raw in f:
                yield raw.rstrip(b"\r\n")


def open_follow(path: str | Path) -> IO[bytes] | None:
    """The state log ``path`` open for reading (``vllm-guard logs -f``); None when it is absent, not a file
    to trust or not readable (a follower tries again later)."""
    try:
        fd = open_state(path, os.O_RDONLY)
    except (OSError, StateError):
        return None
    return os.fdopen(fd, "rb")


def same_file(f: IO[bytes], path: str | Path) -> bool:
    """Whether ``path`` still names the file ``f`` reads (False once it was rotated or removed)."""
    try:
        return os.lstat(path).st_ino == os.fstat(f.fileno()).st_ino
    except OSError:
        return False
