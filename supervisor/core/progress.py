"""Where the current launch is, in words a person reads: its phase, the percent of vLLM's progress bar,
how long it has been going, whether vLLM listens yet, and the last failure healed.

Pure: the shell feeds it vLLM's lines (with the classifier's phase after each line, the one place
that reads vLLM's milestones), the probes' answers and the clock's readings. The same words then
go to the live line, ``/status``, ``vllm-guard status`` and ``ps``, and systemd's ``STATUS=``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The classifier's phases (``diagnosis.PHASES``) as a person reads them.
PHASE_TEXT = {
    "launching": "launching vLLM",
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
#: Phases whose lines carry a progress bar (tqdm's "40% Completed |", "100%|███|").
_WITH_PERCENT = frozenset({"loading", "cudagraph"})
_PERCENT = re.compile(r"(\d{1,3})%\s*(?:Completed\s*)?\|")


@dataclass
class Progress:
    """One launch's progress. ``started_at`` and every ``now`` are the shell's wall clock (seconds)."""

    launch: int
    started_at: float
    phase: str = "launching"
    percent: int | None = None
    listening: bool = False             # a probe got an HTTP answer (vLLM's API server is up)
    healthy_after: float | None = None  # seconds from the start to the first chat completion
    waiting: str = ""                   # what the guard waits for before starting vLLM (a GPU's turn)

    def line(self, text: str | bytes, phase: str) -> None:
        """One line of vLLM's output, and the classifier's phase after reading it."""
        if phase != self.phase:
            self.phase, self.percent = phase, None
        if phase in _WITH_PERCENT:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            found = _PERCENT.findall(text)          # a tqdm line redrawn with \r: its last state
            if found:
                self.percent = min(100, int(found[-1]))

    def probed(self, answered: bool) -> None:
        """A probe's outcome: ``answered`` when an HTTP response came (any status)."""
        self.listening = answered

    def healthy(self, seconds: float) -> None:
        self.healthy_after, self.phase, self.percent, self.listening = seconds, "serving", None, True

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.started_at)

    def what(self) -> str:
        """The phase in words, with its percent: ``loading weights 40%``."""
        if self.waiting:
            return f"waiting for {self.waiting}"
        text = PHASE_TEXT.get(self.phase, self.phase)
        return f"{text} {self.percent}%" if self.percent is not None else text

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"launch": self.launch, "phase": self.phase, "percent": self.percent, "text": self.what(),
                "elapsed_s": round(self.elapsed(now), 1), "listening": self.listening,
                "healthy_after_s": None if self.healthy_after is None else round(self.healthy_after, 1),
                "waiting": self.waiting or None}


def seconds_text(seconds: float) -> str:
    """``12 s``, ``3 min 05 s``, ``2 h 04 min``: a duration as a person reads it."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def probe_text(probe: Mapping[str, Any] | None, state: str, elapsed: float | None = None) -> str:
    """The last probe in words. While vLLM starts, a refused connection is the normal state of a start-up
    (vLLM listens only once it is ready), not a failure: ``vLLM not listening yet (starting, 12 s)``."""
    if not isinstance(probe, Mapping):
        return "none yet"
    if probe.get("ok"):
        latency = probe.get("latency_ms")
        return "ok" + (f" in {latency:g} ms" if isinstance(latency, (int, float)) else "")
    if probe.get("refused"):
        if state in ("planning", "starting", "restarting", "backoff"):
            return "vLLM not listening yet (starting" + (
                f", {seconds_text(elapsed)})" if isinstance(elapsed, (int, float)) else ")")
        return "vLLM is not listening (connection refused)"
    error = str(probe.get("error") or (f"HTTP {probe['status']}" if probe.get("status") else "no answer"))
    return f"failed: {error}"


def last_failure(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The most recent launch that failed or died, and whether a later launch was healthy (healed)."""
    last: Mapping[str, Any] | None = None
    healed = False
    for r in records:
        if not isinstance(r, Mapping) or r.get("event"):
            continue
        if r.get("kind") and r.get("outcome") in ("failed", "died"):
            last, healed = r, False
        elif last is not None and (r.get("outcome") == "healthy" or r.get("time_to_healthy_s") is not None):
            healed = True
    if last is None:
        return None
    return {"launch": last.get("n"), "outcome": last.get("outcome"), "kind": last.get("kind"),
            "phase": last.get("phase"), "evidence": last.get("evidence"), "healed": healed,
            "at": last.get("ended_at") or last.get("started_at")}


def summary(state: str, progress: Mapping[str, Any] | None, url: str, failure: Mapping[str, Any] | None,
            context_served: int | None = None) -> str:
    """One line for systemd's STATUS=, ``ps`` and the page's title: state, phase, elapsed, URL, last failure."""
    p = progress if isinstance(progress, Mapping) else {}
    launch = p.get("launch")
    if state == "healthy":
        text = f"healthy: launch {launch} serves on {url}" if launch else f"healthy: serves on {url}"
        if context_served:
            text += f" (context {context_served})"
    elif state == "starting" and p:
        text = f"starting: launch {launch}, {p.get('text') or 'launching vLLM'}"
        if isinstance(p.get("elapsed_s"), (int, float)):
            text += f", {seconds_text(p['elapsed_s'])}"
        text += f"; vLLM on {url}"
    else:
        text = state
    if failure:
        what = f"{failure.get('kind')} (launch {failure.get('launch')})"
        text += f"; healed {what}" if failure.get("healed") else f"; last failure {what}"
    return text
