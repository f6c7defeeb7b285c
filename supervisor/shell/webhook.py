"""Tell someone: a JSON POST to ``notify_url`` on what an operator acts on.

Events: ``launch_failed`` (with the diagnosis), ``relaunch`` (with the flags changed and why),
``healthy``, ``died`` (a runtime death) and ``gave_up``. Each carries the model, the host, the
kind, and a one-line human ``text`` (so a chat webhook shows something readable). Sending never
blocks the guard's loop: events go on a bounded queue that a task drains, each retried with
backoff (tenacity) and then dropped with a warning; the oldest is dropped when the queue is full
(counted in ``/metrics``). Every payload is redacted first: no ``--api-key``, ``HF_TOKEN`` or
bearer token leaves the host.

What comes back is bounded, whatever the receiver does: the response is streamed and at most
:data:`MAX_BODY` bytes of it are read before it is closed (a receiver answering 512 MiB costs one
network read), and each attempt as a whole has a deadline (:data:`DEADLINE`), so a receiver that
trickles a byte a second, or never answers, ends the attempt on time; httpx's own timeouts are per
read and would wait forever on a trickle. Redirects are not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog
import tenacity

from supervisor import __version__
from supervisor.secrets import REGISTRY

log = structlog.get_logger("vllm-guard")

QUEUE = 64          # events waiting to be sent; more: the oldest is dropped
ATTEMPTS = 4        # per event, with exponential backoff between them
TIMEOUT = httpx.Timeout(5.0, connect=3.0)   # per connect / read / write
DEADLINE = 10.0     # one attempt, whole: connect, send, the answer's head, what is read of its body
MAX_BODY = 4096     # bytes of an answer read (nothing in it is used); then the connection is closed


class Webhook:
    """One guard's notifications; ``url`` empty: everything is a no-op."""

    def __init__(self, url: str, *, model: str, transport: httpx.AsyncBaseTransport | None = None,
                 wait: tenacity.wait.wait_base | None = None, deadline: float = DEADLINE,
                 on_result: Callable[[str], None] | None = None) -> None:
        self.url, self.model = url, model
        REGISTRY.add(url)       # a webhook URL is a credential (Slack's, Discord's): never shown
        self.host = socket.gethostname()
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUE)
        self._transport = transport
        self._wait = wait or tenacity.wait_exponential(multiplier=1, max=30)
        self._deadline = deadline
        self._on_result = on_result or (lambda result: None)   # "sent" | "failed" | "dropped"
        self._task: asyncio.Task[None] | None = None
        self.sent = self.failed = self.dropped = 0

    def event(self, event: str, text: str, **fields: Any) -> None:
        """Queue one event (never blocks, never raises)."""
        if not self.url:
            return
        payload = {"event": event, "text": f"vllm-guard on {self.host}: {self.model}: {text}", "model": self.model,
                   "host": self.host, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "guard_version": __version__, **fields}
        payload = REGISTRY.obj(payload)
        if self._queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self._queue.get_nowait()
            self.dropped += 1
            self._on_result("dropped")
            log.warning("notify: too many events waiting; dropped the oldest")
        self._queue.put_nowait(payload)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _post(self, client: httpx.AsyncClient, payload: dict[str, Any]) -> None:
        """One attempt: POST, read at most MAX_BODY bytes of the answer, close; raise unless 2xx."""
        # Raw bytes, not decoded: a small gzip answer could inflate a thousandfold in one chunk.
        async with client.stream("POST", self.url, json=payload, headers={"Accept-Encoding": "identity"}) as r:
            read = 0
            if not r.is_stream_consumed:    # (a transport may hand over an answer already read)
                async for chunk in r.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_BODY:
                        break         # leaving the block closes the connection: the rest is never read
            r.raise_for_status()

    async def _attempt(self, client: httpx.AsyncClient, payload: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(self._post(client, payload), self._deadline)
        except TimeoutError:
            raise httpx.TimeoutException(f"no complete answer within {self._deadline:g} s") from None

    async def _drain(self) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT, transport=self._transport, follow_redirects=False) as client:
            while not self._queue.empty():
                payload = REGISTRY.obj(self._queue.get_nowait())   # again: secrets registered since
                try:
                    async for attempt in tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(ATTEMPTS),
                                                                wait=self._wait, reraise=True):
                        with attempt:
                            await self._attempt(client, payload)
                    self.sent += 1
                    self._on_result("sent")
                except (httpx.HTTPError, OSError) as e:
                    self.failed += 1
                    self._on_result("failed")
                    log.warning(f"notify: could not deliver {payload['event']} to the webhook after {ATTEMPTS} "
                                f"tries: {REGISTRY.text(str(e))[:200]}")

    async def aclose(self, timeout: float = 5.0) -> None:
        """Give what is queued (the last words: gave_up) a moment to go out, then stop."""
        task = self._task
        if task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout)
        task.cancel()
