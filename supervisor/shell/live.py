"""The workstation view: one live line under the scrolling output, on a TTY only.

Every writer to the terminal goes through one :class:`Terminal`: the guard's own log (structlog
and the stdlib's logging), vLLM's passed-through lines, and anything else written to
``sys.stdout``/``sys.stderr`` (a warning, a traceback), which :func:`attach` replaces with streams
that feed it. The terminal holds back a write until its line is complete, then, in one write to
the TTY, clears the live line, writes the complete lines and redraws the live line below them; so
the screen is the same however the text was cut into writes (structlog writes a message and its
newline separately), lines longer than the terminal wrap over several rows and stay whole, and the
live line, kept one column short of the width, always sits on one row it can clear. ``close``
takes the live line away for good (the exit line, logged just before, is then the last one).
``NO_COLOR`` (set and not empty) draws the live line without reverse video.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from supervisor.core.progress import seconds_text

_CLEAR = b"\r\x1b[K"


def _columns(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal columns (an ellipsis marks the cut); no newline survives."""
    text = " ".join(text.split())
    if sum(map(_columns, text)) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = _columns(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def render(state: str, progress: Mapping[str, Any] | None, changed: Mapping[str, str], width: int = 100,
           stopping: str = "") -> str:
    """The live line's text (pure): launch, state, phase with its percent, elapsed time, changed flags."""
    p = progress or {}
    parts = ["vllm-guard: " + (f"launch {p['launch']}" if p.get("launch") else "starting"), state]
    if stopping:
        parts.append(stopping)
    elif state != "healthy":
        parts.append(str(p.get("text") or "launching vLLM"))
        if isinstance(p.get("elapsed_s"), (int, float)):
            parts.append(seconds_text(p["elapsed_s"]))
    if changed:
        parts.append("changed " + " ".join(f"{k} {v or '(on)'}" for k, v in changed.items()))
    return fit(" · ".join(parts), width)


class Terminal:
    """The one writer to a TTY: complete lines above, the live line below them."""

    def __init__(self, out: BinaryIO, *, width: Callable[[], int] | None = None, color: bool = True) -> None:
        self._out = out
        self._width = width or self._tty_width
        self.color = color
        self.text = ""
        self.closed = False
        self._drawn = False
        self._pending: dict[str, bytes] = {}
        self._lock = threading.RLock()
        self._last_draw = 0.0

    def _tty_width(self) -> int:
        try:
            return os.get_terminal_size(self._out.fileno()).columns or 80
        except (OSError, ValueError, AttributeError):
            return 80

    # -- writers ------------------------------------------------------------------------------------
    def write(self, data: bytes, source: str = "guard") -> None:
        """Bytes from one writer (``source``), cut anywhere: shown once their line is complete."""
        with self._lock:
            data = self._pending.pop(source, b"") + data
            head, nl, tail = data.rpartition(b"\n")
            if tail:
                self._pending[source] = tail
            if nl:
                self._emit(head + nl)

    def line(self, line: bytes) -> None:
        """One complete line (vLLM's): above the live line."""
        self.write(line + b"\n", "vllm")

    def above(self, line: bytes, stream: str = "stderr") -> None:
        """vLLM's ``line`` from its ``stream``: to the terminal (or to a redirected stdout as it is)."""
        if stream == "stdout" and not isinstance(sys.stdout, TerminalStream):
            try:
                sys.stdout.buffer.write(line + b"\n")
                sys.stdout.flush()
            except (ValueError, OSError, AttributeError):
                pass
            return
        self.line(line)

    def update(self, text: str, force: bool = False) -> None:
        """The live line's new text (redrawn at most 10 times a second unless ``force``)."""
        with self._lock:
            if self.closed or (text == self.text and not force):
                return
            self.text = text
            if force or time.monotonic() - self._last_draw >= 0.1:
                self._send(_CLEAR + self._live() if self._drawn or self.text else b"")

    def close(self) -> None:
        """Show what is still held back, take the live line away, and from now on write straight through."""
        with self._lock:
            if self.closed:
                return
            rest = b"".join(p + b"\n" for p in self._pending.values())
            self._pending.clear()
            self._send((_CLEAR if self._drawn else b"") + rest)
            self._drawn, self.closed = False, True

    # -- drawing ------------------------------------------------------------------------------------
    def _emit(self, lines: bytes) -> None:
        if self.closed:
            self._send(lines)
            return
        self._send((_CLEAR if self._drawn else b"") + lines + self._live())

    def _live(self) -> bytes:
        if not self.text:
            self._drawn = False
            return b""
        text = fit(self.text, max(1, self._width() - 1)).encode("utf-8", "replace")
        self._drawn, self._last_draw = True, time.monotonic()
        return b"\x1b[7m" + text + b"\x1b[0m" if self.color else text

    def _send(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._out.write(data)
            self._out.flush()
        except (ValueError, OSError):
            pass


class _Bytes(io.RawIOBase):
    """``TerminalStream.buffer``: bytes written to it reach the terminal as the stream's own."""

    def __init__(self, stream: TerminalStream) -> None:
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        b = bytes(data)
        self._stream.terminal.write(b, self._stream.source)
        return len(b)


class TerminalStream(io.TextIOBase):
    """A text stream (``sys.stderr``, the log's stream) whose every write goes through the terminal."""

    def __init__(self, terminal: Terminal, source: str, fileno: int | None = None,
                 encoding: str = "utf-8") -> None:
        self.terminal, self.source, self._fileno = terminal, source, fileno
        self._encoding = encoding
        self.buffer = _Bytes(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.terminal.write(text.encode(self._encoding, "replace"), self.source)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        if self._fileno is None:
            raise io.UnsupportedOperation("fileno")
        return self._fileno


def _same_tty(a: Any, b: Any) -> bool:
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return a.isatty() and b.isatty() and (sa.st_rdev, sa.st_ino) == (sb.st_rdev, sb.st_ino)


def attach(environ: Mapping[str, str] | None = None) -> tuple[Terminal, TerminalStream]:
    """Put the terminal between this process and its TTY (stderr, and stdout when it is the same TTY);
    returns it and the stream for the guard's log."""
    env = os.environ if environ is None else environ
    err = sys.stderr
    terminal = Terminal(err.buffer, color=not env.get("NO_COLOR"))
    stream = TerminalStream(terminal, "guard", err.fileno(), err.encoding or "utf-8")
    if _same_tty(sys.stdout, err):
        sys.stdout = TerminalStream(terminal, "stdout", sys.stdout.fileno(), sys.stdout.encoding or "utf-8")
    sys.stderr = TerminalStream(terminal, "stderr", err.fileno(), err.encoding or "utf-8")
    return terminal, stream
