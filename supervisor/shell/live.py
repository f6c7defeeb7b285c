"""The workstation view: one live line under vLLM's scrolling output, on a TTY only.

vLLM's lines are written above the live line (clear it, write the line, redraw it), so the
person sees vLLM's own log and, at the bottom, where the launch is: loading weights with its
progress, profiling, capturing graphs, serving; the launch number and the flags changed so far.
"""

from __future__ import annotations

import re
import threading
import time
from typing import TextIO

_PROGRESS = re.compile(rb"(\d{1,3})%\s*(?:Completed\s*)?\|")
_PHASE_TEXT = {
    "launching": "launching",
    "config": "reading the config",
    "engine_init": "starting the engine",
    "loading": "loading weights",
    "profiling": "profiling memory",
    "kv_cache": "allocating the KV cache",
    "cudagraph": "capturing CUDA graphs",
    "warmup": "warming up",
    "api_starting": "starting the API server",
    "serving": "serving",
}


def render(launch: int, phase: str, progress: int | None, changed: dict[str, str],
           elapsed: float, state: str, width: int = 100) -> str:
    """The live line's text (pure)."""
    what = _PHASE_TEXT.get(phase, phase)
    if progress is not None and phase in ("loading", "cudagraph"):
        what += f" {progress}%"
    parts = [f"vllm-guard: launch {launch}", state, what, f"{elapsed:.0f}s"]
    if changed:
        parts.append("changed " + " ".join(f"{k} {v or '(on)'}" for k, v in changed.items()))
    text = " · ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


class LiveLine:
    """Draws the live line on ``stream`` (a TTY); thread-safe; ``close()`` erases it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.text = ""
        self.progress: int | None = None
        self._lock = threading.Lock()
        self._last_draw = 0.0

    def note_progress(self, line: bytes) -> None:
        m = _PROGRESS.search(line)
        if m:
            self.progress = min(100, int(m.group(1)))

    def above(self, line: bytes, stream: TextIO) -> None:
        """Write one vLLM line above the live line."""
        with self._lock:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                stream.buffer.write(line + b"\n")
                stream.flush()
                self._draw()
            except (ValueError, OSError, AttributeError):
                pass

    def update(self, text: str, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if text == self.text and not force:
                return
            if not force and now - self._last_draw < 0.1:
                self.text = text
                return
            self.text = text
            self._draw()

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        try:
            self.stream.write("\r\x1b[K\x1b[7m" + self.text + "\x1b[0m")
            self.stream.flush()
        except (ValueError, OSError):
            pass

    def close(self) -> None:
        with self._lock:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (ValueError, OSError):
                pass


class _Proxy:
    """A text stream for the guard's own log lines that keeps the live line at the bottom."""

    def __init__(self, live: LiveLine) -> None:
        self._live = live

    def write(self, text: str) -> int:
        live = self._live
        with live._lock:
            try:
                live.stream.write("\r\x1b[K" + text)
                if text.endswith("\n"):
                    live._draw()
                live.stream.flush()
            except (ValueError, OSError):
                pass
        return len(text)

    def flush(self) -> None:
        try:
            self._live.stream.flush()
        except (ValueError, OSError):
            pass

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._live.stream.fileno()


def proxy(live: LiveLine) -> _Proxy:
    return _Proxy(live)
