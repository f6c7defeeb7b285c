"""What a webhook receiver sends back is bounded: real loopback servers that answer 512 MiB, trickle
a byte a second, or never answer (tests/fakes/hostile_http.py), against the Webhook and a real guard.

Measured, not assumed: the bytes the receiver managed to send, the Python heap's peak (tracemalloc),
the guard process's resident memory (psutil), the gaps in the event loop, the time a drain takes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import tracemalloc
from pathlib import Path

import httpx
import psutil
import pytest
import tenacity

from supervisor.shell.metrics import Metrics
from supervisor.shell.webhook import ATTEMPTS, MAX_BODY, QUEUE, Webhook

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
from hostile_http import HUGE, HostileServer  # noqa: E402

MiB = 1 << 20


def deliver(url: str, *, events: int = 1, deadline: float = 1.0, close_after: float = 60.0):
    """Queue ``events`` events at ``url`` and wait (at most ``close_after``) for the drain; return
    (hook, metrics text, seconds, the loop's longest gap, the heap's peak in bytes)."""
    async def main():
        metrics = Metrics()
        hook = Webhook(url, model="m", wait=tenacity.wait_none(), deadline=deadline, on_result=metrics.webhook)
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        t0 = time.monotonic()
        for i in range(events):
            hook.event("healthy", f"launch {i} serves")
        await hook.aclose(timeout=close_after)
        took = time.monotonic() - t0
        done.set()
        await tick
        return hook, metrics.render()[0].decode(), took, max(gaps, default=0.0)

    tracemalloc.start()
    try:
        hook, text, took, gap = asyncio.run(main())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return hook, text, took, gap, peak


def test_a_512_mib_answer_is_read_a_few_kib_then_closed():
    with HostileServer("huge") as srv:
        hook, text, took, gap, peak = deliver(srv.url)
        deadline = time.monotonic() + 10
        while srv.closed < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert hook.sent == 1 and srv.requests == 1          # a 200 is delivered: one attempt, not retried
    assert took < 5.0
    assert srv.sent < 64 * MiB, f"the receiver got {srv.sent / MiB:.0f} MiB of {HUGE / MiB:.0f} MiB out"
    assert peak < 8 * MiB, f"the heap peaked at {peak / MiB:.1f} MiB"
    assert gap < 0.5
    assert 'vllm_guard_webhook_events_total{result="sent"} 1.0' in text


@pytest.mark.parametrize("mode", ["trickle", "trickle_head", "silent"])
def test_a_receiver_that_trickles_or_never_answers_costs_each_attempt_its_deadline(mode):
    with HostileServer(mode, interval=0.2) as srv:
        hook, text, took, gap, _ = deliver(srv.url, deadline=1.0)
    assert hook.sent == 0 and hook.failed == 1
    assert srv.requests == ATTEMPTS
    assert ATTEMPTS * 1.0 <= took < ATTEMPTS * 1.0 + 3.0, f"{ATTEMPTS} attempts took {took:.1f} s"
    assert gap < 0.5, "the loop was held up"
    assert 'vllm_guard_webhook_events_total{result="failed"} 1.0' in text


def test_the_queue_is_bounded_drops_the_oldest_and_counts_them():
    with HostileServer("silent") as srv:
        hook, text, took, gap, _ = deliver(srv.url, events=QUEUE + 136, deadline=30.0, close_after=1.0)
    assert hook.dropped == 136
    assert 'vllm_guard_webhook_events_total{result="dropped"} 136.0' in text
    assert took < 3.0, "the drain at stop waits its bound, not for the receiver"
    assert gap < 0.5


def test_only_a_2xx_is_delivered():
    with HostileServer("ok") as srv:
        hook, *_ = deliver(srv.url)
    assert hook.sent == 1 and srv.requests == 1
    assert MAX_BODY <= 64 * 1024


# --- a real guard ----------------------------------------------------------------------------


def rss_while(g, until, timeout: float = 60.0) -> tuple[int, list[float]]:
    """Sample the guard's RSS and /status latency at 20 Hz until ``until()``; (peak RSS, latencies)."""
    proc = psutil.Process(g.proc.pid)
    peak, latencies = 0, []
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out\n{g.output()[-3000:]}"
        peak = max(peak, proc.memory_info().rss)
        t0 = time.monotonic()
        try:
            httpx.get(f"http://127.0.0.1:{g.status_port}/healthz", timeout=5)
            latencies.append(time.monotonic() - t0)
        except httpx.ConnectError:
            pass                 # not listening yet (start-up)
        time.sleep(0.05)
    return peak, latencies


def test_a_guard_notifying_a_512_mib_receiver_stays_small_and_supervising(run):
    with HostileServer("huge") as srv:
        g = run(guard_args=["--notify-url", srv.url])
        baseline, _ = rss_while(g, lambda: srv.requests >= 1)          # start-up, until "healthy" is sent
        peak, latencies = rss_while(g, lambda: srv.closed >= 1)
        for _ in range(20):                                             # and a second beyond
            peak = max(peak, psutil.Process(g.proc.pid).memory_info().rss)
            time.sleep(0.05)
        g.wait_healthy()
        assert g.terminate(timeout=30) == 0
    assert peak - baseline < 32 * MiB, f"RSS {baseline / MiB:.0f} -> {peak / MiB:.0f} MiB"
    assert srv.sent < 64 * MiB
    assert max(latencies, default=0) < 1.0


@pytest.mark.parametrize("mode", ["trickle", "silent"])
def test_a_guard_stops_on_time_while_its_receiver_hangs(run, mode):
    with HostileServer(mode) as srv:
        g = run(guard_args=["--notify-url", srv.url])
        g.wait_healthy()
        srv.wait_requests(1)
        s = g.status()
        assert s is not None and s["state"] == "healthy"               # supervising meanwhile
        assert g.post("/restart", g.token).status_code == 202
        g.wait_for(lambda s: len(s["launches"]) == 2 and s["state"] == "healthy", 60, "the restart")
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGTERM)
        code = g.wait_exit(30)
        took = time.monotonic() - t0
    assert code == 0
    # the stop's grace (3 s here) for vLLM, then the webhook's drain bound (5 s), and the exit
    assert took < 3 + 5 + 4, f"the stop took {took:.1f} s"
