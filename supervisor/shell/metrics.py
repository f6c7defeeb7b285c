"""Prometheus metrics for one guard, in a private registry (never the process-global one).

Label values are enumerations the guard controls (outcome, kind, state, reason), never free
text, so no secret or unbounded string can reach the exposition.
"""

from __future__ import annotations

import math
import re

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from supervisor.core.lifecycle import State

#: The guard's states, in the order the ``vllm_guard_state`` enum lists them.
STATES = tuple(s.value for s in State)

# Start-ups take minutes (weights, profiling, CUDA graphs), so the buckets run to an hour.
_HEALTHY_BUCKETS = (5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800, 3600, math.inf)
_PROBE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, math.inf)
_LABEL = re.compile(r"[^a-z0-9_]+")


def _label(value: str) -> str:
    """Keep label values to a small safe alphabet ("Engine Dead!" -> "engine_dead")."""
    cleaned = _LABEL.sub("_", str(value).lower()).strip("_")
    return cleaned[:64] or "unknown"


class Metrics:
    """The guard's counters and gauges; every method is thread-safe (prometheus_client locks)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._launches = Counter(
            "vllm_guard_launches", "vLLM launches that ended, by outcome and diagnosed kind",
            ["outcome", "kind"], registry=r,
        )
        self._restarts = Counter(
            "vllm_guard_restarts", "Relaunches of vLLM, by reason", ["reason"], registry=r,
        )
        self._time_to_healthy = Histogram(
            "vllm_guard_time_to_healthy_seconds", "Seconds from a launch to its first healthy probe",
            buckets=_HEALTHY_BUCKETS, registry=r,
        )
        self._healthy = Gauge("vllm_guard_healthy", "1 while vLLM answers health probes", registry=r)
        self._state = Enum("vllm_guard_state", "The guard's state", states=list(STATES), registry=r)
        self._max_model_len = Gauge(
            "vllm_guard_max_model_len", "The current --max-model-len (NaN when vLLM's default)", registry=r,
        )
        self._utilization = Gauge(
            "vllm_guard_gpu_memory_utilization",
            "The current --gpu-memory-utilization (NaN when vLLM's default)", registry=r,
        )
        self._probe_latency = Histogram(
            "vllm_guard_probe_latency_seconds", "Latency of health probes (successful ones)",
            buckets=_PROBE_BUCKETS, registry=r,
        )
        self._last_latency = Gauge(
            "vllm_guard_last_probe_latency_seconds", "Latency of the last health probe", registry=r,
        )
        self._probes = Counter("vllm_guard_probes", "Health probes, by result", ["result"], registry=r)
        self._max_model_len.set(math.nan)
        self._utilization.set(math.nan)
        self._state.state("planning")

    def launch_finished(self, outcome: str, kind: str) -> None:
        """Count a launch that ended (``outcome``: e.g. failed/stopped/healthy; ``kind``: a Kind value)."""
        self._launches.labels(outcome=_label(outcome), kind=_label(kind)).inc()

    def restarted(self, reason: str) -> None:
        """Count a relaunch (``reason``: a Kind value, ``hung``, ``manual``...)."""
        self._restarts.labels(reason=_label(reason)).inc()

    def healthy_after(self, seconds: float) -> None:
        """Record how long a launch took to become healthy."""
        self._time_to_healthy.observe(max(0.0, seconds))

    def set_state(self, state: str) -> None:
        """Publish the guard's state; unknown names are a programming error (ValueError)."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        self._state.state(state)
        self._healthy.set(1 if state == "healthy" else 0)

    def set_flags(self, max_model_len: int | None, utilization: float | None) -> None:
        """Publish the flags of the current launch (None: left to vLLM's default)."""
        self._max_model_len.set(math.nan if max_model_len is None else max_model_len)
        self._utilization.set(math.nan if utilization is None else utilization)

    def probe(self, ok: bool, latency_s: float) -> None:
        """Record one health probe."""
        self._probes.labels(result="ok" if ok else "fail").inc()
        self._last_latency.set(latency_s)
        if ok:
            self._probe_latency.observe(max(0.0, latency_s))

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition: ``(body, content_type)``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
