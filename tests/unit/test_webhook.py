"""The webhook through httpx's MockTransport: the payload, redaction, retries, and never blocking."""

from __future__ import annotations

import asyncio
import json

import httpx
import tenacity

from supervisor.shell import auth
from supervisor.shell.webhook import QUEUE, Webhook


def run(events, handler):
    """Send ``events`` ((event, text, fields) tuples) through a Webhook whose transport is ``handler``."""
    bodies: list[dict] = []

    def record(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return handler(request)

    async def main() -> Webhook:
        hook = Webhook("http://hooks.example/x", model="org/model", transport=httpx.MockTransport(record),
                       wait=tenacity.wait_none())
        for event, text, fields in events:
            hook.event(event, text, **fields)
        await hook.aclose()
        return hook

    return asyncio.run(main()), bodies


def test_an_event_carries_what_an_operator_acts_on():
    hook, bodies = run([("relaunch", "relaunch 2: --max-model-len (unset) -> 30368",
                         {"kind": "kv_cache_insufficient", "launch": 2})], lambda r: httpx.Response(204))
    (body,) = bodies
    assert body["event"] == "relaunch" and body["kind"] == "kv_cache_insufficient" and body["launch"] == 2
    assert body["model"] == "org/model" and body["host"] and body["time"].endswith("Z")
    assert body["text"].startswith("vllm-guard on ") and "--max-model-len (unset) -> 30368" in body["text"]
    assert hook.sent == 1


def test_secrets_never_leave_the_host():
    auth.register_secret("sk-live-webhook-secret-1234")
    _, bodies = run([("launch_failed", "vLLM said: --api-key sk-live-webhook-secret-1234",
                      {"evidence": "Bearer abcdefghijklmnop", "argv": ["--api-key", "other-secret-value"]})],
                    lambda r: httpx.Response(200))
    text = json.dumps(bodies)
    assert "sk-live-webhook-secret-1234" not in text and "abcdefghijklmnop" not in text
    assert "other-secret-value" not in text


def test_a_failing_receiver_is_retried_then_the_event_dropped():
    calls = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503) if len(calls) < 3 else httpx.Response(200)

    hook, _ = run([("healthy", "serves", {})], flaky)
    assert len(calls) == 3 and hook.sent == 1
    hook, bodies = run([("gave_up", "giving up", {}), ("healthy", "x", {})], lambda r: httpx.Response(500))
    assert hook.sent == 0 and len(bodies) == 8           # 4 tries each, then given up


def test_queueing_never_blocks_and_drops_the_oldest_when_full():
    async def main() -> list[str]:
        sent: list[str] = []
        gate = asyncio.Event()

        async def slow(request: httpx.Request) -> httpx.Response:
            await gate.wait()
            sent.append(json.loads(request.content)["text"].rsplit(" ", 1)[-1])
            return httpx.Response(200)

        hook = Webhook("http://hooks.example/x", model="m", transport=httpx.MockTransport(slow),
                       wait=tenacity.wait_none())
        for i in range(QUEUE + 10):                      # all queued at once: none of these awaits
            hook.event("relaunch", f"n {i}")
        gate.set()
        await hook.aclose()
        return sent

    sent = asyncio.run(main())
    assert len(sent) <= QUEUE + 1 and sent[-1] == str(QUEUE + 9)
    assert "1" not in sent[1:]                           # old ones made room


def test_no_url_is_a_no_op():
    async def main() -> None:
        hook = Webhook("", model="m")
        hook.event("healthy", "x")
        await hook.aclose()
        assert hook.sent == 0

    asyncio.run(main())
