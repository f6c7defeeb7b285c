"""The guard's HTTP status endpoint: the page at /, /status, /healthz, /ready, /metrics, POST /restart and /stop.

An asyncio server in the guard's own loop; HTTP/1.1 is parsed by ``h11`` (the parser httpx's
transport uses, already installed with it), so no HTTP is hand-parsed here. Why not a thread per
connection (what this was) or a framework: a slow or silent client costs a thread (or a slot) for
as long as it dawdles, and 200 of them took the endpoint down; a coroutine costs a few KiB, and
aiohttp or uvicorn would add tens of MiB and a second of start-up for four routes.

What keeps /healthz answering under slow or many clients:

* each connection has a short deadline for its whole request, head and body (``request_timeout``,
  5 s), not a per-read timeout that a byte every few seconds resets;
* past ``max_connections`` the oldest connection still sending its request is dropped to make room
  for the new one, so nobody holds a slot for its lifetime;
* every response closes its connection; heads are bounded (16 KiB) and bodies refused past 64 KiB.

Bound to a loopback address, it answers only requests whose ``Host`` is that address or
``localhost`` (with this port, or none): a page elsewhere that points its own name at 127.0.0.1
(DNS rebinding) reads nothing and sends nothing (421). The routes are one table of :class:`Route`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import h11
import structlog

from supervisor import __version__
from supervisor.secrets import REGISTRY
from supervisor.shell import auth, status_page
from supervisor.shell.metrics import Metrics

log = structlog.get_logger("vllm_guard.status")

MAX_HEAD = 16 * 1024           # request line and headers
MAX_BODY = 64 * 1024           # POST bodies are read and ignored; anything larger is refused
REQUEST_TIMEOUT = 5.0          # the whole request must arrive within this
MAX_CONNECTIONS = 256          # more: the oldest connection still sending its request is dropped

Reply = tuple[int, bytes, str, dict[str, str]]
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class StatusServerError(RuntimeError):
    """The status endpoint cannot listen (port taken, address not available)."""


class _Reply(Exception):
    """Answer the request with this status and JSON body (raised from deep inside the handling)."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


@dataclass(frozen=True)
class Route:
    """One route: ``handler(request, target)`` answers it; ``token``: only with the bearer token."""

    method: str
    path: str
    handler: Callable[[h11.Request, str], Reply]
    token: bool = False


class StatusServer:
    """The status endpoint; ``await start()`` binds (port 0: ephemeral, see ``.port``), ``await stop()`` closes."""

    def __init__(self, host: str, port: int, token: str, snapshot: Callable[[], dict[str, Any]],
                 command: Callable[[str, dict[str, Any]], None], metrics: Metrics, ready: Callable[[], bool], *,
                 request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 alive: Callable[[], bool] | None = None) -> None:
        if not token:
            raise ValueError("StatusServer needs a token (see auth.resolve_token)")
        self.host, self.port, self.token = host, port, token
        self.snapshot, self.command, self.metrics, self.ready = snapshot, command, metrics, ready
        self.request_timeout = request_timeout
        self.max_connections = max(1, max_connections)
        self.alive = alive          # /healthz: the guard's loop still turns (None: always)
        self._server: asyncio.base_events.Server | None = None
        self._reading: dict[asyncio.Task[None], float] = {}   # connections still sending: task -> start
        self._tasks: set[asyncio.Task[None]] = set()
        REGISTRY.add(token)
        self.routes: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in (
            Route("GET", "/", self._page),
            Route("GET", "/status", self._status),
            Route("GET", "/healthz", self._healthz),
            Route("GET", "/ready", self._ready),
            Route("GET", "/metrics", self._metrics),
            Route("POST", "/restart", self._restart, token=True),
            Route("POST", "/stop", self._stop, token=True),
        )}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve in the running loop; raises StatusServerError when the address is taken."""
        host = self.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = await asyncio.start_server(self._accept, host, self.port, family=family,
                                                      reuse_address=True, limit=MAX_HEAD, backlog=512)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StatusServerError(
                    f"status port {self.host}:{self.port} is already in use (another vllm-guard?); "
                    f"choose another with --status-port or VLLM_GUARD_STATUS_PORT, or 0 to disable it"
                ) from None
            raise StatusServerError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.debug("status endpoint listening", url=self.url)

    async def stop(self) -> None:
        """Stop listening and drop every connection (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=2)

    # -- connections ------------------------------------------------------------------------------
    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._connection(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if len(self._tasks) > self.max_connections and self._reading:
            oldest = min(self._reading, key=self._reading.__getitem__)
            oldest.cancel()      # it has had the longest to send its request

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._reading[task] = time.monotonic()
        try:
            try:
                async with asyncio.timeout(self.request_timeout):
                    request, body = await self._read_request(conn, reader)
            finally:
                self._reading.pop(task, None)
            status, payload, ctype, headers = self._respond(request, body)
        except _Reply as r:
            status, payload, ctype, headers = r.status, _json(r.body), "application/json", r.headers
            request = None
        except h11.RemoteProtocolError as e:
            status, payload, ctype, headers = (e.error_status_hint or 400), _json({"error": "bad request"}), \
                "application/json", {}
            request = None
        except (TimeoutError, asyncio.CancelledError, ConnectionError, OSError):
            writer.transport.abort()
            return
        try:
            head = request is not None and request.method == b"HEAD"
            await self._send(conn, writer, status, payload, ctype, headers, head)
        except (h11.LocalProtocolError, ConnectionError, OSError, TimeoutError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes]:
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(8192)
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    if request is None:
                        raise ConnectionResetError("closed before a request")
                continue
            if isinstance(event, h11.Request):
                request = event
                self._check_body_headers(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _Reply(413, {"error": f"body over {MAX_BODY} bytes"})
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, body
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("closed mid-request")

    @staticmethod
    def _check_body_headers(request: h11.Request) -> None:
        headers = {k.lower(): v for k, v in request.headers}
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            raise _Reply(411, {"error": "chunked bodies are not accepted; send Content-Length"})
        length = headers.get(b"content-length")
        if length is not None and int(length) > MAX_BODY:     # h11 has checked it is a number
            raise _Reply(413, {"error": f"body over {MAX_BODY} bytes"})

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes,
                    ctype: str, headers: dict[str, str], head: bool) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        hdrs = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                ("Connection", "close"), ("Server", f"vllm-guard/{__version__}"), *headers.items()]
        data = conn.send(h11.Response(status_code=status, headers=hdrs, reason=HTTPStatus(status).phrase))
        if not head:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(self.request_timeout):
            await writer.drain()

    # -- routes -------------------------------------------------------------------------------------
    def _respond(self, request: h11.Request, body: bytes) -> Reply:
        method = request.method.decode("ascii", "replace").upper()
        target = request.target.decode("ascii", "replace")
        path = urlsplit(target).path.rstrip("/") or "/"
        refused = self._misdirected(request)
        if refused:
            return _answer(421, {"error": refused})
        route = self.routes.get(("GET" if method == "HEAD" else method, path))
        if route is None:
            allowed = sorted({m for m, p in self.routes if p == path})
            if not allowed:
                return _answer(404, {"error": f"no {method} {path}", "endpoints": sorted({p for _, p in self.routes})})
            allow = "GET, HEAD" if allowed == ["GET"] else ", ".join(allowed)
            return _answer(405, {"error": f"no {method} {path}"}, {"Allow": allow})
        if route.token:
            denied = self._check_token(request)
            if denied is not None:
                return denied
        return route.handler(request, target)

    def _misdirected(self, request: h11.Request) -> str:
        """Why a request on a loopback bind is refused: its Host names neither this address nor
        localhost (a page that rebound its own name to 127.0.0.1); "" when it is fine."""
        if not auth.is_loopback(self.host):
            return ""
        raw = next((v for k, v in request.headers if k.lower() == b"host"), None)
        if raw is None:              # HTTP/1.0 without Host: no browser sends that
            return ""
        host = raw.decode("latin-1").strip()
        if _host_allowed(host, self.host, self.port):
            return ""
        here = self.url.removeprefix("http://")
        return (f"Host {host[:100]!r} is not this endpoint's address; open http://localhost:{self.port}/ "
                f"or http://{here}/")

    def _check_token(self, request: h11.Request) -> Reply | None:
        header = next((v for k, v in request.headers if k.lower() == b"authorization"), None)
        code = auth.check_token(None if header is None else header.decode("latin-1"), self.token)
        if code == 401:
            return _answer(401, {"error": "missing bearer token"}, {"WWW-Authenticate": "Bearer"})
        if code == 403:
            return _answer(403, {"error": "wrong token"})
        return None

    def _snapshot(self) -> dict[str, Any]:
        """The guard's snapshot, redacted once (the token too) for every route that shows it."""
        return cast(dict[str, Any], REGISTRY.obj(self.snapshot(), (self.token,)))

    def _page(self, request: h11.Request, target: str) -> Reply:
        try:
            page = status_page.render_page(self._snapshot())
        except Exception as exc:  # a guard bug must not take the endpoint down
            log.exception("status page failed")
            return _answer(500, {"error": f"page failed: {type(exc).__name__}"})
        return 200, page, status_page.CONTENT_TYPE, dict(status_page.PAGE_HEADERS)

    def _status(self, request: h11.Request, target: str) -> Reply:
        try:
            return 200, json.dumps(self._snapshot(), indent=2, default=str).encode() + b"\n", "application/json", {}
        except Exception as exc:  # a guard bug must not take the endpoint down
            log.exception("status snapshot failed")
            return _answer(500, {"error": f"snapshot failed: {type(exc).__name__}"})

    def _healthz(self, request: h11.Request, target: str) -> Reply:
        alive = self.alive is None or _safe(self.alive, False)
        return (200 if alive else 503), (b"ok\n" if alive else b"guard loop stalled\n"), "text/plain; charset=utf-8", {}

    def _ready(self, request: h11.Request, target: str) -> Reply:
        ready = _safe(self.ready, False)
        return (200 if ready else 503), (b"ready\n" if ready else b"not ready\n"), "text/plain; charset=utf-8", {}

    def _metrics(self, request: h11.Request, target: str) -> Reply:
        body, ctype = self.metrics.render()
        return 200, body, ctype, {}

    def _restart(self, request: h11.Request, target: str) -> Reply:
        query = parse_qs(urlsplit(target).query, keep_blank_values=True)
        value = (query.get("reset") or [""])[-1].lower()
        if value not in _TRUE + _FALSE:
            return _answer(400, {"error": f"reset must be 0 or 1, not {value!r}"})
        return self._order("restart", {"reset": value in _TRUE})

    def _stop(self, request: h11.Request, target: str) -> Reply:
        return self._order("stop", {})

    def _order(self, name: str, params: dict[str, Any]) -> Reply:
        try:
            self.command(name, params)
        except Exception as exc:  # the guard refused (shutting down): say so, keep serving
            log.warning("status command refused", command=name, error=str(exc))
            return _answer(503, {"error": f"{name} not accepted: {exc}"})
        log.info("status command", command=name, **params)
        return _answer(202, {"accepted": name, **params})


def _host_allowed(host: str, bound: str, port: int) -> bool:
    """Whether a ``Host`` header names the bound address or localhost, with this port or none."""
    host = host.lower()
    if host.startswith("["):
        inner, close, rest = host[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return False
        name, given = f"[{inner}]", (rest[1:] if rest else None)
    else:
        head, colon, tail = host.rpartition(":")
        name, given = (head, tail) if colon else (host, None)
    if given is not None and given != str(port):
        return False
    bound = bound.lower().strip("[]")
    names = {"localhost", f"[{bound}]" if ":" in bound else bound}
    if bound == "localhost":         # bound by name: the addresses that name binds
        names |= {"127.0.0.1", "[::1]"}
    return name in names


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _answer(status: int, obj: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes, str, dict[str, str]]:
    return status, _json(obj), "application/json", headers or {}


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        log.exception("status callback failed")
        return default
