"""Where vLLM's lines go: the guard's own stdout/stderr (or the live view on a TTY), and a bounded
ring of files in the state dir that ``vllm-guard logs`` reads, across launches and after the guard
stopped.

Every line is masked first (the secrets the guard knows, such as ``--api-key``, which vLLM prints
back in its "non-default args"), so neither the terminal, the journal, the ring file nor the
classifier's evidence ever holds one. Writing to a terminal that went away (SSH closed, a pipe
whose reader died) is not an error: the line still reaches the ring file.

The path keeps up with a busy vLLM: lines are buffered and written once per batch (the lines of one
read of vLLM's pipe: the flush is scheduled on the event loop when the first line of a batch comes),
into a ring file kept open (:class:`~supervisor.shell.statelog.AppendLog`, re-verified through the
state-file door on rotation and after a fault), and to the guard's stdout/stderr in the order they
came. A disk that refuses the ring file is a warning once; the lines still reach the terminal or
journal, and the file is tried again later.

On the journal (``$JOURNAL_STREAM`` names the guard's stdout or stderr) every passed-through line
starts with the guard's own syslog priority, taken from the level vLLM printed (``INFO`` is
``<6>``, ``WARNING`` ``<4>``, ``ERROR`` and ``CRITICAL`` ``<3>``; a line without a level, a
traceback's, keeps the level of the line before it on that stream), so journald never reads a
priority vLLM's text happens to start with (``<0>``, emerg, is broadcast to every terminal).
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from supervisor.core.vllm_text import level_word
from supervisor.secrets import REGISTRY
from supervisor.shell.logs import on_journal
from supervisor.shell.statelog import AppendLog, open_follow, read_lines, same_file

LOG_FILE = "vllm.log"
MAX_BYTES = 8 << 20            # per file; with the previous generation, at most 16 MiB
_FLUSH_AT = 256 << 10          # a batch larger than this is written at once

# vLLM's levels as syslog priorities; nothing vLLM prints is filed above err (the guard's own messages are).
_PRIORITY = {b"DEBUG": b"<7>", b"INFO": b"<6>", b"WARNING": b"<4>", b"ERROR": b"<3>", b"CRITICAL": b"<3>"}
_INFO, _ERR = b"<6>", b"<3>"


def priority(line: bytes, previous: bytes = _INFO) -> bytes:
    """The journald prefix for one vLLM line: from the level it printed, else ``previous`` (a traceback
    starts at err)."""
    word = level_word(line)          # vLLM's text is read in one place (core/vllm_text.py)
    if word is not None:
        return _PRIORITY[word]
    if line.startswith(b"Traceback (most recent call last)"):
        return _ERR
    return previous


class VllmOutput:
    """vLLM's output for one guard run."""

    def __init__(self, state_dir: str | None, *, secrets: Iterable[str] = (), quiet: bool = False,
                 live: Any = None) -> None:
        self.path = Path(state_dir) / LOG_FILE if state_dir else None
        self._file = AppendLog(self.path, MAX_BYTES) if self.path is not None else None
        self.quiet, self.live = quiet, live
        for secret in secrets:
            REGISTRY.add(secret)
        self._journal = {"stdout": on_journal(sys.stdout), "stderr": on_journal(sys.stderr)}
        self._level = {"stdout": _INFO, "stderr": _INFO}
        self._through = not quiet and live is None           # lines go through to the guard's stdout/stderr
        self._segments: list[tuple[str, bytearray]] = []     # lines not yet written, in order, by stream
        self._stream = ""                                    # the stream of the last segment
        self._buf = bytearray()                              # the last segment's bytes
        self._scheduled = False

    def mask(self, line: bytes) -> bytes:
        """``line`` with every secret masked (the registry as it is now, and the known shapes)."""
        return REGISTRY.line(line)

    def mask_lines(self, lines: list[bytes]) -> list[bytes]:
        """:meth:`mask` for each of the lines of one read (decided once for the read)."""
        return REGISTRY.lines(lines)

    def launch(self, n: int, argv_text: str) -> None:
        """Mark the start of launch ``n`` in the ring file."""
        self.flush()                        # what came before the mark stays before it
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if self._file is not None:
            self._file.write(self.mask(f"=== vllm-guard: launch {n} at {stamp}: {argv_text}".encode()))
        self._schedule()

    def line(self, line: bytes, stream: str) -> bytes:
        """Show and keep one (already masked) line of vLLM's; returns it."""
        self.lines([line], stream)
        return line

    def lines(self, lines: list[bytes], stream: str) -> None:
        """Show and keep (already masked) lines of vLLM's. Called for every read of vLLM's pipes, so it only
        buffers: :meth:`flush` writes the batch to the ring file and the guard's streams."""
        if stream != self._stream:
            self._buf = bytearray()
            self._segments.append((stream, self._buf))
            self._stream = stream
        buf = self._buf
        buf += b"\n".join(lines)
        buf += b"\n"
        if self.live is not None and not self.quiet:
            for line in lines:
                self.live.above(line, stream)
        if len(buf) >= _FLUSH_AT:
            self.flush()
        elif not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        """Flush once the lines of this batch are in: on the event loop's next turn (at once without one)."""
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is buffered: to the ring file, and through to the guard's stdout/stderr."""
        self._scheduled = False
        segments, self._segments, self._stream = self._segments, [], ""
        if self._file is not None:
            for _stream, data in segments:
                self._file.write_lines(data)
            self._file.flush()
        if not self._through:
            return
        for stream, data in segments:
            out = sys.stdout if stream == "stdout" else sys.stderr
            shown = self._prefixed(data, stream) if self._journal[stream] else data
            try:
                out.buffer.write(shown)
                out.flush()
            except (ValueError, OSError, AttributeError):
                pass                        # a terminal that went away: the ring file still has the lines

    def _prefixed(self, data: bytes | bytearray, stream: str) -> bytes:
        """The lines of ``data``, each with the journald priority of its vLLM level."""
        level = self._level[stream]
        out = []
        for line in bytes(data).split(b"\n")[:-1]:
            level = priority(line, level)
            out.append(level + line + b"\n")
        self._level[stream] = level
        return b"".join(out)

    def close(self) -> None:
        """Write what is buffered and let go of the ring file."""
        self.flush()
        if self._file is not None:
            self._file.close()


def tail(state_dir: str, n: int) -> list[bytes]:
    """The last ``n`` lines kept in ``state_dir`` (both generations), oldest first."""
    return list(collections.deque(read_lines(Path(state_dir) / LOG_FILE), maxlen=max(0, n)))


def follow(state_dir: str, poll: float = 0.5) -> Iterator[bytes]:
    """New lines of the ring file as they are written (through rotations), until interrupted. Lines
    already in the file when it is first opened are skipped (``tail`` has shown them)."""
    path = Path(state_dir) / LOG_FILE
    f = None
    skip_existing = True
    while True:
        if f is None:
            f = open_follow(path)
            if f is None:
                skip_existing = False            # a file that appears later is read from its start
                time.sleep(poll)
                continue
            if skip_existing:
                f.seek(0, 2)
        line = f.readline()
        if line:
            yield line.rstrip(b"\r\n")
            continue
        if not same_file(f, path):
            f.close()
            f, skip_existing = None, False
            continue
        time.sleep(poll)
