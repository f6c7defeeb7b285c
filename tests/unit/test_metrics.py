"""Metrics: a private registry per guard, rendered as Prometheus text."""

from __future__ import annotations

import math

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from supervisor.shell.metrics import STATES, Metrics


def samples(m: Metrics) -> dict[tuple[str, tuple], float]:
    body, ctype = m.render()
    assert ctype.startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_launches_restarts_and_time_to_healthy():
    m = Metrics()
    m.launch_finished("failed", "kv_cache_insufficient")
    m.launch_finished("failed", "kv_cache_insufficient")
    m.launch_finished("stopped", "none")
    m.relaunched("kv_cache_insufficient")
    m.healthy_after(42.0)
    s = samples(m)
    assert s[("vllm_guard_launches_total", (("kind", "kv_cache_insufficient"), ("outcome", "failed")))] == 2
    assert s[("vllm_guard_launches_total", (("kind", "none"), ("outcome", "stopped")))] == 1
    assert s[("vllm_guard_relaunches_total", (("reason", "kv_cache_insufficient"),))] == 1
    assert s[("vllm_guard_time_to_healthy_seconds_count", ())] == 1
    assert s[("vllm_guard_time_to_healthy_seconds_sum", ())] == 42.0
    assert s[("vllm_guard_time_to_healthy_seconds_bucket", (("le", "60.0"),))] == 1
    assert s[("vllm_guard_time_to_healthy_seconds_bucket", (("le", "30.0"),))] == 0


def test_state_enum_and_healthy_gauge_move_together():
    m = Metrics()
    m.set_state("healthy")
    s = samples(m)
    assert s[("vllm_guard_healthy", ())] == 1
    assert s[("vllm_guard_state", (("vllm_guard_state", "healthy"),))] == 1
    assert sum(v for (name, _), v in s.items() if name == "vllm_guard_state") == 1
    m.set_state("backoff")
    s = samples(m)
    assert s[("vllm_guard_healthy", ())] == 0
    assert s[("vllm_guard_state", (("vllm_guard_state", "backoff"),))] == 1
    assert len([k for k in s if k[0] == "vllm_guard_state"]) == len(STATES)


def test_unknown_state_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown state 'fine'"):
        Metrics().set_state("fine")


def test_context_gauges_are_nan_until_known():
    m = Metrics()
    s = samples(m)
    assert math.isnan(s[("vllm_guard_context_served_tokens", ())])
    m.set_context(served=16384, requested=32768, fit=20000, utilization=0.9)
    s = samples(m)
    assert s[("vllm_guard_context_served_tokens", ())] == 16384
    assert s[("vllm_guard_context_requested_tokens", ())] == 32768
    assert s[("vllm_guard_context_fit_tokens", ())] == 20000
    assert s[("vllm_guard_gpu_memory_utilization_ratio", ())] == 0.9
    m.set_context(served=None, requested=None, fit=None, utilization=None)
    assert math.isnan(samples(m)[("vllm_guard_gpu_memory_utilization_ratio", ())])


def test_failures_and_giving_up_are_times_and_the_build_is_named():
    m = Metrics()
    assert math.isnan(samples(m)[("vllm_guard_last_failure_timestamp_seconds", ())])
    m.launch_finished("stopped", "none", at=1000.0)
    assert math.isnan(samples(m)[("vllm_guard_last_failure_timestamp_seconds", ())])
    m.launch_finished("died", "engine_dead", at=2000.0)
    m.gave_up(3000.0)
    s = samples(m)
    assert s[("vllm_guard_last_failure_timestamp_seconds", ())] == 2000.0
    assert s[("vllm_guard_gave_up_timestamp_seconds", ())] == 3000.0
    assert [k for k in s if k[0] == "vllm_guard_build_info"][0][1][0][0] == "version"


def test_probes():
    m = Metrics()
    m.probe(True, 0.2)
    m.probe(False, 30.0)
    s = samples(m)
    assert s[("vllm_guard_probes_total", (("result", "ok"),))] == 1
    assert s[("vllm_guard_probes_total", (("result", "fail"),))] == 1
    assert s[("vllm_guard_last_probe_latency_seconds", ())] == 30.0
    assert s[("vllm_guard_probe_latency_seconds_count", ())] == 1   # failed probes time out, not latency


def test_registries_are_private_per_guard():
    a, b = Metrics(), Metrics()   # a second one would raise "Duplicated timeseries" on a shared registry
    a.relaunched("request")
    assert ("vllm_guard_relaunches_total", (("reason", "request"),)) not in samples(b)
    assert REGISTRY.get_sample_value("vllm_guard_relaunches_total", {"reason": "request"}) is None


def test_label_values_are_sanitised():
    m = Metrics()
    m.launch_finished("Failed!", 'x"} evil{')
    body = m.render()[0].decode()
    assert 'kind="x_evil"' in body and 'outcome="failed"' in body
