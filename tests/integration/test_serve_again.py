"""Time to serve again after an engine death: vLLM's own start-up plus at most a second.

A real guard process on the fake vLLM serves; its ``VLLM::EngineCore`` is SIGKILLed (as the OOM killer
would end it); the guard's history says when the next launch started and when it served. The first
relaunch after serving has no backoff, so what the guard adds (noticing the death, stopping what is
left, relaunching) stays under a second. ``scripts/bench`` reports the same figure over several runs.
"""

from __future__ import annotations

from benchmarks.serve_again import one_run


def test_serving_again_after_an_engine_death_takes_vllms_start_up_plus_at_most_a_second():
    r = one_run(speed=0.05)
    assert r["added_s"] <= 1.0, r
    assert r["again_s"] <= r["vllm_start_s"] + 1.0, r
