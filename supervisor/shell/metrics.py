"""Prometheus metrics for one guard, in a private registry (never the process-global one).

Names follow Prometheus' conventions (``_total`` counters, ``_seconds``, ``_tokens``, ``_ratio``
units; ``configs/monitoring/`` holds alert rules and a dashboard tested against them). Label
values are enumerations the guard controls (outcome, kind, state, reason), never free text, so no
secret or unbounded string can reach the exposition.
"""

from __future__ import annotations

import math
import re

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from supervisor import __version__
from supervisor.core.lifecycle import State
from supervisor.secrets import REGISTRY

#: The guard's states, in the order the ``vllm_guard_state`` enum lists them.
STATES = tuple(s.value for s in State)

# Start-ups take minutes (weights, profiling, CUDA graphs), so the buckets run to an hour.
_HEALTHY_BUCKETS = (5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800, 3600, math.inf)
_PROBE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, math.inf)
_LABEL = re.compile(r"[^a-z0-9_]+")
WEBHOOK_RESULTS = ("sent", "failed", "dropped")


def _label(value: str) -> str:
    """Keep label values to a small safe alphabet ("Engine Dead!" -> "engine_dead")."""
    cleaned = _LABEL.sub("_", str(value).lower()).strip("_")
    return cleaned[:64] or "unknown"


class Metrics:
    """The guard's counters and gauges; every method is thread-safe (prometheus_client locks)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("vllm_guard_build", "The vllm-guard that exports these metrics", registry=r).info(
            {"version": __version__})
        self._launches = Counter(
            "vllm_guard_launches", "vLLM launches that ended, by outcome and diagnosed kind",
            ["outcome", "kind"], registry=r)
        self._relaunches = Counter(
            "vllm_guard_relaunches", "Relaunches of vLLM, by reason: the diagnosis kind a heal answers, "
            "or request/reset/learned_failed", ["reason"], registry=r)
        self._last_failure = Gauge(
            "vllm_guard_last_failure_timestamp_seconds", "When a launch last failed or died (Unix time)", registry=r)
        self._gave_up = Gauge(
            "vllm_guard_gave_up_timestamp_seconds", "When a guard on this state dir last gave up (Unix time; "
            "0 when never), kept across restarts", registry=r)
        self._time_to_healthy = Histogram(
            "vllm_guard_time_to_healthy_seconds", "Seconds from a launch to its first healthy probe",
            buckets=_HEALTHY_BUCKETS, registry=r)
        self._healthy = Gauge("vllm_guard_healthy", "1 while vLLM answers health probes", registry=r)
        self._state = Enum("vllm_guard_state", "The guard's state", states=list(STATES), registry=r)
        self._served = Gauge("vllm_guard_context_served_tokens",
                             "The context length vLLM serves (--max-model-len, or auto-fit's choice)", registry=r)
        self._requested = Gauge("vllm_guard_context_requested_tokens",
                                "The context length asked for (--max-model-len as given, else the model's own)",
                                registry=r)
        self._fit = Gauge("vllm_guard_context_fit_tokens",
                          "The tokens vLLM's KV cache holds, as vLLM measured it at start-up", registry=r)
        self._utilization = Gauge("vllm_guard_gpu_memory_utilization_ratio",
                                  "The current --gpu-memory-utilization (NaN when vLLM's default)", registry=r)
        self._probe_latency = Histogram(
            "vllm_guard_probe_latency_seconds", "Latency of health probes (successful ones)",
            buckets=_PROBE_BUCKETS, registry=r)
        self._last_latency = Gauge(
            "vllm_guard_last_probe_latency_seconds", "Latency of the last health probe", registry=r)
        self._probes = Counter("vllm_guard_probes", "Health probes, by result", ["result"], registry=r)
        self._webhook = Counter("vllm_guard_webhook_events", "Webhook events, by result: sent, failed (after "
                                "every retry), dropped (the queue of waiting events was full)", ["result"], registry=r)
        for result in WEBHOOK_RESULTS:
            self._webhook.labels(result=result)
        for gauge in (self._served, self._requested, self._fit, self._utilization, self._last_failure):
            gauge.set(math.nan)
        self._gave_up.set(0)
        self._state.state("planning")

    def launch_finished(self, outcome: str, kind: str, at: float | None = None) -> None:
        """Count a launch that ended (``outcome``: failed/died/stopped/...; ``kind``: a Kind value)."""
        self._launches.labels(outcome=_label(outcome), kind=_label(kind)).inc()
        if outcome in ("failed", "died") and at is not None:
            self._last_failure.set(at)

    def relaunched(self, reason: str) -> None:
        """Count a relaunch (``reason``: the Kind it heals, ``request``, ``reset``, ``learned_failed``)."""
        self._relaunches.labels(reason=_label(reason)).inc()

    def gave_up(self, at: float) -> None:
        """A guard on this state dir gave up at ``at`` (this one, or an earlier one from the history)."""
        self._gave_up.set(at)

    def healthy_after(self, seconds: float) -> None:
        """Record how long a launch took to become healthy."""
        self._time_to_healthy.observe(max(0.0, seconds))

    def set_state(self, state: str) -> None:
        """Publish the guard's state; unknown names are a programming error (ValueError)."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        self._state.state(state)
        self._healthy.set(1 if state == "healthy" else 0)

    def set_context(self, *, served: int | None, requested: int | None, fit: int | None,
                    utilization: float | None) -> None:
        """Publish the context of the launch that serves (None: unknown, or vLLM's default)."""
        for gauge, value in ((self._served, served), (self._requested, requested), (self._fit, fit),
                             (self._utilization, utilization)):
            gauge.set(math.nan if value is None else value)

    def probe(self, ok: bool, latency_s: float) -> None:
        """Record one health probe."""
        self._probes.labels(result="ok" if ok else "fail").inc()
        self._last_latency.set(latency_s)
        if ok:
            self._probe_latency.observe(max(0.0, latency_s))

    def webhook(self, result: str) -> None:
        """Count one webhook event by how it ended (one of :data:`WEBHOOK_RESULTS`)."""
        self._webhook.labels(result=result if result in WEBHOOK_RESULTS else "failed").inc()

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition: ``(body, content_type)``."""
        return REGISTRY.line(generate_latest(self.registry)), CONTENT_TYPE_LATEST
