"""Where vLLM's lines go: the guard's own stdout/stderr (or the live view on a TTY), and a bounded
ring of files in the state dir that ``vllm-guard logs`` reads, across launches and after the guard
stopped.

Every line is masked first (the secrets the guard knows, such as ``--api-key``, which vLLM prints
back in its "non-default args"), so neither the terminal, the journal, the ring file nor the
classifier's evidence ever holds one. Writing to a terminal that went away (SSH closed, a pipe
whose reader died) is not an error: the line still reaches the ring file.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import structlog

from supervisor.secrets import REGISTRY
from supervisor.shell.statedir import StateError, append_line, read_lines, safe_open_read

LOG_FILE = "vllm.log"
MAX_BYTES = 8 << 20            # per file; with the previous generation, at most 16 MiB


class VllmOutput:
    """vLLM's output for one guard run."""

    def __init__(self, state_dir: str | None, *, secrets: Iterable[str] = (), quiet: bool = False,
                 live: Any = None) -> None:
        self.path = Path(state_dir) / LOG_FILE if state_dir else None
        self.quiet, self.live = quiet, live
        for secret in secrets:
            REGISTRY.add(secret)
        self._broken = False               # the ring file failed once: the guard goes on without it

    def mask(self, line: bytes) -> bytes:
        """``line`` with every secret masked (the registry as it is now, and the known shapes)."""
        return REGISTRY.line(line)

    def launch(self, n: int, argv_text: str) -> None:
        """Mark the start of launch ``n`` in the ring file."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._keep(self.mask(f"=== vllm-guard: launch {n} at {stamp}: {argv_text}".encode()))

    def line(self, line: bytes, stream: str) -> bytes:
        """Show and keep one (already masked) line of vLLM's; returns it."""
        self._keep(line)
        if not self.quiet:
            if self.live is not None:
                self.live.note_progress(line)
                self.live.above(line, sys.stdout if stream == "stdout" else sys.stderr)
            else:
                passthrough(line, stream)
        return line

    def _keep(self, line: bytes) -> None:
        if self.path is None or self._broken:
            return
        try:
            append_line(self.path, line, max_bytes=MAX_BYTES)
        except (OSError, StateError) as e:
            self._broken = True
            structlog.get_logger("vllm-guard").warning(f"cannot keep vLLM's output in {self.path} ({e}); it still goes to the terminal or journal")


def passthrough(line: bytes, stream: str) -> None:
    """Write one vLLM line to the guard's own stdout/stderr, unchanged (a closed stream is ignored)."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    try:
        out.buffer.write(line + b"\n")
        out.flush()
    except (ValueError, OSError, AttributeError):
        pass


def tail(state_dir: str, n: int) -> list[bytes]:
    """The last ``n`` lines kept in ``state_dir`` (both generations), oldest first."""
    return list(collections.deque(read_lines(Path(state_dir) / LOG_FILE), maxlen=max(0, n)))


def follow(state_dir: str, poll: float = 0.5) -> Iterator[bytes]:
    """New lines of the ring file as they are written (through rotations), until interrupted. Lines
    already in the file when it is first opened are skipped (``tail`` has shown them)."""
    path = Path(state_dir) / LOG_FILE
    f: IO[bytes] | None = None
    skip_existing = True
    while True:
        if f is None:
            try:
                f = safe_open_read(path)
            except (FileNotFoundError, StateError):
                skip_existing = False            # a file that appears later is read from its start
                time.sleep(poll)
                continue
            if skip_existing:
                f.seek(0, os.SEEK_END)
        line = f.readline()
        if line:
            yield line.rstrip(b"\r\n")
            continue
        try:
            rotated = os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
        except OSError:
            rotated = True
        if rotated:
            f.close()
            f, skip_existing = None, False
            continue
        time.sleep(poll)
