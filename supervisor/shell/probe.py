"""Health probes: a real ``POST /v1/chat/completions`` (``max_tokens`` 1), not just ``/health``.

vLLM answers ``/health`` 200 with a dead engine in some versions, so healthy means a generation
request answered 200 with a choice. A model without a chat template falls back to
``/v1/completions``; a pooling model (embeddings, reranker) to ``/v1/embeddings``. Connection
refused during start-up means "still loading" (vLLM binds early but listens only when ready).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    latency: float                  # seconds
    status: int | None = None       # HTTP status, None when no response
    refused: bool = False           # connection refused: nothing listening (yet)
    error: str = ""
    endpoint: str = CHAT

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


class Prober:
    """Probes one vLLM server; remembers which endpoint the model answers on."""

    def __init__(self, host: str, port: int, model: str, api_key: str | None = None,
                 timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base = f"http://{probe_host(host)}:{port}"
        self.model = model
        self.timeout = timeout
        self.endpoint = CHAT
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
                return result
            self.endpoint = switch
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
