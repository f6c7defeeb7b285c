"""Tell someone: a JSON POST to ``notify_url`` on what an operator acts on.

Events: ``launch_failed`` (with the diagnosis), ``relaunch`` (with the flags changed and why),
``healthy``, ``died`` (a runtime death) and ``gave_up``. Each carries the model, the host, the
kind, and a one-line human ``text`` (so a chat webhook shows something readable). Sending never
blocks the guard's loop: events go on a bounded queue that a task drains, each retried with
backoff (tenacity) and then dropped with a warning; the oldest is dropped when the queue is full.
Every payload is redacted first: no ``--api-key``, ``HF_TOKEN`` or bearer token leaves the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import httpx
import structlog
import tenacity

from supervisor import __version__
from supervisor.shell import auth

log = structlog.get_logger("vllm-guard")

QUEUE = 64          # events waiting to be sent; more: the oldest is dropped
ATTEMPTS = 4        # per event, with exponential backoff between them
TIMEOUT = httpx.Timeout(5.0, connect=3.0)


class Webhook:
    """One guard's notifications; ``url`` empty: everything is a no-op."""

    def __init__(self, url: str, *, model: str, transport: httpx.AsyncBaseTransport | None = None,
                 wait: tenacity.wait.wait_base | None = None) -> None:
        self.url, self.model = url, model
        self.host = socket.gethostname()
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUE)
        self._transport = transport
        self._wait = wait or tenacity.wait_exponential(multiplier=1, max=30)
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def event(self, event: str, text: str, **fields: Any) -> None:
        """Queue one event (never blocks, never raises)."""
        if not self.url:
            return
        payload = {"event": event, "text": f"vllm-guard on {self.host}: {self.model}: {text}", "model": self.model,
                   "host": self.host, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "guard_version": __version__, **fields}
        payload = auth.redact_obj(payload)
        if self._queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self._queue.get_nowait()
            log.warning("notify: too many events waiting; dropped the oldest")
        self._queue.put_nowait(payload)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT, transport=self._transport) as client:
            while not self._queue.empty():
                payload = self._queue.get_nowait()
                try:
                    async for attempt in tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(ATTEMPTS),
                                                                wait=self._wait, reraise=True):
                        with attempt:
                            r = await client.post(self.url, json=payload)
                            r.raise_for_status()
                    self.sent += 1
                except (httpx.HTTPError, OSError) as e:
                    log.warning(f"notify: could not deliver {payload['event']} to the webhook after {ATTEMPTS} "
                                f"tries: {auth.redact_text(str(e))[:200]}")

    async def aclose(self, timeout: float = 5.0) -> None:
        """Give what is queued (the last words: gave_up) a moment to go out, then stop."""
        task = self._task
        if task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout)
        task.cancel()
