"""Health probes: a real ``POST /v1/chat/completions`` (``max_tokens`` 1), not just ``/health``.

vLLM answers ``/health`` 200 with a dead engine in some versions, so healthy means a generation
request answered 200 with a choice. A model without a chat template falls back to
``/v1/completions``; a pooling model (embeddings, reranker) to ``/v1/embeddings``. Connection
refused during start-up means "still loading" (vLLM binds early but listens only when ready).

A 200 counts only when the server that gave it is this launch's own vLLM (:func:`answered_by`): on
a port another vLLM holds (a second guard given the same ``--port``; vLLM 0.7.3-0.24 even share a
port with ``SO_REUSEPORT``), its answer proves nothing about this launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from supervisor.shell import procs, signalling
from supervisor.shell.signalling import Proc

CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    latency: float                  # seconds
    status: int | None = None       # HTTP status, None when no response
    refused: bool = False           # connection refused: nothing listening (yet)
    error: str = ""
    endpoint: str = CHAT
    foreign: str = ""               # the process that answered instead of this launch's vLLM, in words

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "latency_ms": round(self.latency * 1000, 1), "status": self.status,
                "refused": self.refused, "error": self.error, "endpoint": self.endpoint}


def probe_host(host: str) -> str:
    """Where to reach a server bound to ``host`` (0.0.0.0 -> 127.0.0.1)."""
    if host in ("", "0.0.0.0", "*"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


#: (vLLM's port, the probe connection's local port) -> who answered, see answered_by.
Identity = Callable[[int, "int | None"], "tuple[bool | None, str]"]


def _connections(p: psutil.Process) -> list[Any]:
    fetch = getattr(p, "net_connections", None) or p.connections      # psutil < 6 names it connections
    return list(fetch(kind="tcp"))


def _serves(c: Any, port: int, client_port: int | None) -> bool:
    """``c`` is the server end of the probe's connection (or, without its port, a listener on ``port``)."""
    if not c.laddr or c.laddr.port != port:
        return False
    if client_port is not None:
        return bool(c.raddr) and bool(c.raddr.port == client_port)
    return bool(c.status == psutil.CONN_LISTEN)


def answered_by(root: Proc | int | None, marker: str, port: int,
                client_port: int | None) -> tuple[bool | None, str]:
    """Whether the server that answered the probe on ``port`` belongs to this launch: ``(True, "")``
    when a process of the launch's tree (``root`` and its descendants) holds the server end of
    the probe's connection (from ``client_port``; without it, a socket listening on the port);
    ``(False, who)`` when another process does; ``(None, why)`` when it cannot be told. Blocking
    (reads /proc): run it off the event loop.

    Only the launch's own few processes are read, never the whole host's connection table, unless the
    answer is not theirs: then once, to name who gave it (a process carrying the launch's ``marker``
    that started after the tree was read is this launch's too).
    """
    leader = Proc.live(root) if isinstance(root, int) and root > 0 else root if isinstance(root, Proc) else None
    tree = [h for q in signalling.snapshot_tree(leader) if (h := q.psutil()) is not None] if leader else []
    for p in tree:
        try:
            if any(_serves(c, port, client_port) for c in _connections(p)):
                return True, ""
        except psutil.Error:
            continue
    try:
        holders = [c.pid for c in psutil.net_connections(kind="tcp") if c.pid and _serves(c, port, client_port)]
    except (psutil.Error, OSError):
        holders = []
    if not holders:
        return None, "no process this user can see holds the connection"
    pid = holders[0]
    try:
        p = psutil.Process(pid)
        cmd, theirs = " ".join(p.cmdline()) or p.name(), p.environ().get(procs.MARKER, "")
    except psutil.Error:
        cmd, theirs = "?", ""
    if marker and theirs == marker:
        return True, ""
    who = "another vllm-guard's vLLM" if theirs else "another process"
    return False, f"{who} (pid {pid}: {cmd[:160]})"


class Prober:
    """Probes one vLLM server; remembers which endpoint the model answers on.

    ``identity`` (see :func:`answered_by`) is asked when a probe first succeeds: a 200 from a server
    that is not this launch's vLLM is not healthy (the result names who answered).
    """

    def __init__(self, host: str, port: int, model: str, api_key: str | None = None,
                 timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
                 identity: Identity | None = None) -> None:
        self.base = f"http://{probe_host(host)}:{port}"
        self.port = port
        self.model = model
        self.timeout = timeout
        self.endpoint = CHAT
        self.identity = identity
        self._client_port: int | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=self.base, headers=headers, transport=transport,
                                         timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)))

    async def aclose(self) -> None:
        await self._client.aclose()

    def _request(self) -> tuple[str, dict[str, Any]]:
        if self.endpoint == CHAT:
            return "/v1/chat/completions", {
                "model": self.model, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": "ping"}]}
        if self.endpoint == COMPLETIONS:
            return "/v1/completions", {"model": self.model, "prompt": "ping", "max_tokens": 1,
                                       "temperature": 0}
        return "/v1/embeddings", {"model": self.model, "input": "ping"}

    async def probe(self) -> ProbeResult:
        """One probe, with fallbacks to the endpoint the model serves; never raises."""
        for _ in range(3):
            result, switch = await self._once()
            if switch is None:
                return await self._ours(result)
            self.endpoint = switch
        return await self._ours(result)

    async def _ours(self, result: ProbeResult) -> ProbeResult:
        """A successful probe, until one is known to be this launch's: was it this launch's vLLM?"""
        if not result.ok or self.identity is None:
            return result
        ours, who = await asyncio.to_thread(self.identity, self.port, self._client_port)
        if ours is False:
            return ProbeResult(False, result.latency, result.status, endpoint=result.endpoint, foreign=who,
                               error=f"port {self.port} answers from {who}, not this launch's vLLM")
        self.identity = None          # this launch's (or it cannot be told): not asked again
        return result

    async def _once(self) -> tuple[ProbeResult, str | None]:
        path, body = self._request()
        t0 = time.monotonic()
        try:
            r = await self._client.post(path, json=body)
        except httpx.ConnectError as e:
            # vLLM listens only once it is ready: during a start-up this is its normal state, not a failure
            return ProbeResult(False, time.monotonic() - t0, refused=True,
                               error=f"nothing listens on {self.base} ({e or 'connection refused'})",
                               endpoint=self.endpoint), None
        except httpx.TimeoutException:
            return ProbeResult(False, time.monotonic() - t0, error=f"no answer in {self.timeout:g} s",
                               endpoint=self.endpoint), None
        except httpx.HTTPError as e:
            return ProbeResult(False, time.monotonic() - t0, error=f"{type(e).__name__}: {e}",
                               endpoint=self.endpoint), None
        latency = time.monotonic() - t0
        stream, self._client_port = r.extensions.get("network_stream"), None
        with contextlib.suppress(Exception):          # a test transport has no socket
            self._client_port = int(stream.get_extra_info("client_addr")[1]) if stream is not None else None
        text = r.text[:2000]
        if r.status_code == 200:
            try:
                data = r.json()
            except ValueError:
                data = None
            key = "data" if self.endpoint == EMBEDDINGS else "choices"
            if isinstance(data, dict) and data.get(key):
                return ProbeResult(True, latency, 200, endpoint=self.endpoint), None
            return ProbeResult(False, latency, 200, error=f"200 without {key}: {text[:200]}",
                               endpoint=self.endpoint), None
        lowered = text.lower()
        if self.endpoint == CHAT and r.status_code in (400, 422) and "chat template" in lowered:
            return ProbeResult(False, latency, r.status_code, error="no chat template"), COMPLETIONS
        if self.endpoint in (CHAT, COMPLETIONS) and r.status_code in (400, 404, 405, 422, 501) and (
                "does not support" in lowered or "embedding" in lowered or "pooling" in lowered):
            return ProbeResult(False, latency, r.status_code, error="pooling model"), EMBEDDINGS
        return ProbeResult(False, latency, r.status_code, error=f"HTTP {r.status_code}: {text[:300]}",
                           endpoint=self.endpoint), None
