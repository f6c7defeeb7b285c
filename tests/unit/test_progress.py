"""core/progress.py: the launch's phase in words, fed by vLLM's real lines through the classifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.classifier import Classifier
from supervisor.core.progress import Progress, last_failure, probe_text, seconds_text, summary

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.32"


def walk(log: str) -> list[str]:
    """The distinct texts a person sees while the real log streams (the classifier reads each line first)."""
    c, p, seen = Classifier(), Progress(1, 0.0), []
    for raw in (REAL / log).read_bytes().splitlines():
        c.feed(raw)
        p.line(raw, c.phase)
        if not seen or seen[-1] != p.what():
            seen.append(p.what())
    return seen


def test_a_real_healthy_start_up_reads_as_its_phases_in_order():
    seen = walk("healthy-max-model-len-65408.log")
    # the real CPU vLLM 0.32's start-up, as its own lines say it (the file's lines 46-47: the tqdm bar)
    for text in ("reading the config", "starting the engine", "loading weights", "loading weights 0%",
                 "loading weights 100%", "allocating the KV cache", "starting the API server", "serving"):
        assert text in seen, (text, seen)
    order = [seen.index(t) for t in ("loading weights 0%", "loading weights 100%", "allocating the KV cache",
                                     "serving")]
    assert order == sorted(order)


@pytest.mark.parametrize("line, phase, expected", [
    # (a line, the classifier's phase after it, what the person reads)
    ("Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:01<00:01]", "loading", "loading weights 40%"),
    # tqdm redraws with \r inside one line: the last state counts
    ("shards:  20% Completed | 1/5\rshards:  60% Completed | 3/5", "loading", "loading weights 60%"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  55%|█████▌    | 37/67", "cudagraph",
     "capturing CUDA graphs 55%"),
    # a percent outside a phase with a progress bar is no progress of that phase
    ("Memory profiling takes 3.2 seconds; 90% of the GPU |", "profiling", "profiling memory"),
    ("INFO Model loading took 14.96 GiB", "profiling", "profiling memory"),
    ("Graph capturing finished in 4 secs", "warmup", "warming up"),
])
def test_one_line_in_words(line, phase, expected):
    p = Progress(1, 0.0)
    p.line(line, phase)
    assert p.what() == expected


def test_a_new_phase_drops_the_last_phases_percent():
    p = Progress(2, 100.0)
    p.line("Loading safetensors checkpoint shards: 100% Completed | 4/4", "loading")
    p.line("Model loading took 14.96 GiB", "profiling")
    assert p.what() == "profiling memory" and p.percent is None
    assert p.to_dict(112.34)["elapsed_s"] == 12.3


@pytest.mark.parametrize("probe, state, elapsed, expected", [
    (None, "starting", 3.0, "none yet"),
    ({"ok": False, "refused": True, "error": "All connection attempts failed"}, "starting", 12.4,
     "vLLM not listening yet (starting, 12 s)"),
    ({"ok": False, "refused": True, "error": "All connection attempts failed"}, "healthy", 99.0,
     "vLLM is not listening (connection refused)"),
    ({"ok": True, "latency_ms": 212.5}, "healthy", None, "ok in 212.5 ms"),
    ({"ok": False, "status": 500, "error": "HTTP 500: boom"}, "unhealthy", None, "failed: HTTP 500: boom"),
])
def test_probe_in_words(probe, state, elapsed, expected):
    assert probe_text(probe, state, elapsed) == expected


@pytest.mark.parametrize("seconds, expected", [(0, "0 s"), (59.9, "59 s"), (62.4, "1 min 02 s"), (7440, "2 h 04 min")])
def test_seconds_in_words(seconds, expected):
    assert seconds_text(seconds) == expected


def test_the_last_failure_and_whether_a_later_launch_healed_it():
    records = [{"n": 1, "outcome": "failed", "kind": "kv_cache_insufficient", "evidence": "ValueError: ..."},
               {"n": 2, "outcome": "healthy", "time_to_healthy_s": 9.1}]
    assert last_failure(records) == {"launch": 1, "outcome": "failed", "kind": "kv_cache_insufficient",
                                     "phase": None, "evidence": "ValueError: ...", "healed": True, "at": None}
    assert last_failure(records[:1])["healed"] is False
    assert last_failure([{"n": 1, "outcome": "healthy"}]) is None
    assert last_failure([{"event": "gave_up", "kind": "x"}]) is None


def test_summary_names_state_phase_elapsed_url_and_what_was_healed():
    failure = {"launch": 1, "kind": "kv_cache_insufficient", "healed": True}
    starting = {"launch": 2, "text": "loading weights 40%", "elapsed_s": 12.3}
    assert summary("starting", starting, "http://127.0.0.1:8000", failure) == (
        "starting: launch 2, loading weights 40%, 12 s; vLLM on http://127.0.0.1:8000; "
        "healed kv_cache_insufficient (launch 1)")
    assert summary("healthy", {"launch": 2}, "http://127.0.0.1:8000", failure, 41840) == (
        "healthy: launch 2 serves on http://127.0.0.1:8000 (context 41840); healed kv_cache_insufficient (launch 1)")
    assert summary("backoff", None, "http://h:1", {**failure, "healed": False}) == (
        "backoff; last failure kv_cache_insufficient (launch 1)")
