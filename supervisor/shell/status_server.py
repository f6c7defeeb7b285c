"""The guard's HTTP status endpoint: /status, /healthz, /ready, /metrics, POST /restart and /stop.

A stdlib ``ThreadingHTTPServer`` in a daemon thread, so it works beside the guard's asyncio loop
without sharing it: the guard passes a ``snapshot()`` (a plain dict, served redacted), a
``ready()`` predicate and a ``command(name, params)`` callback that it makes thread-safe with
``loop.call_soon_threadsafe``. Hostile clients get 4xx or a closed socket: each connection has a
socket timeout, bodies are capped, connections are capped, and every response closes.

The endpoint file ``<state_dir>/guard.json`` tells the CLI clients where the guard listens.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import structlog

from supervisor import __version__
from supervisor.shell import auth
from supervisor.shell.metrics import Metrics

log = structlog.get_logger("vllm_guard.status")

ENDPOINT_FILE = "guard.json"
MAX_BODY = 64 * 1024           # POST bodies are ignored; anything larger is refused
REQUEST_TIMEOUT = 10.0         # per-connection socket timeout (slow or silent clients)
MAX_CONNECTIONS = 64           # concurrent connections; more are closed at once

_GET_ROUTES = ("/status", "/healthz", "/ready", "/metrics")
_POST_ROUTES = ("/restart", "/stop")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class StatusServerError(RuntimeError):
    """The status endpoint cannot listen (port taken, address not available)."""


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"   # and "Connection: close" on every response
    server_version = f"vllm-guard/{__version__}"
    sys_version = ""
    # A two-word request line is HTTP/0.9 to the stdlib, which then answers without a status
    # line; answer every malformed request as HTTP/1.0 so clients see the 400.
    default_request_version = "HTTP/1.0"
    error_content_type = "application/json"
    error_message_format = '{"error": "%(message)s", "code": %(code)d}\n'

    def setup(self) -> None:
        owner = self.server.owner
        self.timeout = owner.request_timeout  # per recv/send, applied by StreamRequestHandler
        super().setup()
        # A client trickling one byte per timeout would never trip the socket timeout; give the
        # whole exchange a deadline too, after which the socket is shut down under the reader.
        self._deadline = threading.Timer(owner.request_timeout * 3, self._abort)
        self._deadline.daemon = True
        self._deadline.start()

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass  # the client went away first

    def _abort(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # Unknown methods: 405 (the stdlib would answer 501, a server error).
    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        allow = "POST" if self._path() in _POST_ROUTES else "GET, HEAD"
        self._json(405, {"error": f"method {self.command} not allowed"}, {"Allow": allow})

    def do_HEAD(self) -> None:
        self._get(head=True)

    def do_GET(self) -> None:
        self._get(head=False)

    def do_POST(self) -> None:
        path = self._path()
        if path not in _POST_ROUTES:
            status = 405 if path in _GET_ROUTES else 404
            self._json(status, {"error": f"no POST {path}"}, {"Allow": "GET, HEAD"} if status == 405 else None)
            return
        if not self._drain_body():
            return
        code = auth.check_token(self.headers.get("Authorization"), self.server.owner.token)
        if code == 401:
            self._json(401, {"error": "missing bearer token"}, {"WWW-Authenticate": "Bearer"})
            return
        if code == 403:
            self._json(403, {"error": "wrong token"})
            return
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        params: dict[str, Any] = {}
        if path == "/restart":
            value = (query.get("reset") or [""])[-1].lower()
            if value not in _TRUE + _FALSE:
                self._json(400, {"error": f"reset must be 0 or 1, not {value!r}"})
                return
            params["reset"] = value in _TRUE
        name = path.lstrip("/")
        try:
            self.server.owner.command(name, params)
        except Exception as exc:  # the guard refused (shutting down): say so, keep serving
            log.warning("status command refused", command=name, error=str(exc))
            self._json(503, {"error": f"{name} not accepted: {exc}"})
            return
        log.info("status command", command=name, client=self.client_address[0], **params)
        self._json(202, {"accepted": name, **params})

    # -- GET ------------------------------------------------------------------------------------
    def _get(self, head: bool) -> None:
        path = self._path()
        owner = self.server.owner
        if path not in _GET_ROUTES:
            status = 405 if path in _POST_ROUTES else 404
            self._json(status, {"error": f"no GET {path}", "endpoints": list(_GET_ROUTES + _POST_ROUTES)},
                       {"Allow": "POST"} if status == 405 else None, head=head)
            return
        if not self._drain_body():
            return
        if path == "/healthz":
            alive = owner.alive is None or _safe(owner.alive, False)
            self._send(200 if alive else 503, b"ok\n" if alive else b"guard loop stalled\n",
                       "text/plain; charset=utf-8", head=head)
        elif path == "/ready":
            ready = _safe(owner.ready, False)
            self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n",
                       "text/plain; charset=utf-8", head=head)
        elif path == "/metrics":
            body, ctype = owner.metrics.render()
            self._send(200, body, ctype, head=head)
        else:
            try:
                snap = auth.redact_obj(owner.snapshot(), (owner.token,))
                body = json.dumps(snap, indent=2, default=str).encode() + b"\n"
            except Exception as exc:  # a guard bug must not take the endpoint down
                log.exception("status snapshot failed")
                self._json(500, {"error": f"snapshot failed: {type(exc).__name__}"}, head=head)
                return
            self._send(200, body, "application/json", head=head)

    # -- helpers --------------------------------------------------------------------------------
    def _path(self) -> str:
        path = urlsplit(self.path).path
        return path.rstrip("/") or "/"

    def _drain_body(self) -> bool:
        """Read and discard a small body; refuse big, chunked or malformed ones (then close)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self._json(411, {"error": "chunked bodies are not accepted; send Content-Length"})
            return False
        raw = self.headers.get("Content-Length")
        if raw is None:
            return True
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self._json(400, {"error": "bad Content-Length"})
            return False
        if length > MAX_BODY:
            self._json(413, {"error": f"body over {MAX_BODY} bytes"})
            return False
        if length:
            self.rfile.read(length)  # bounded by the socket timeout
        return True

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None, head: bool = False) -> None:
        self._send(status, json.dumps(obj).encode() + b"\n", "application/json", headers, head)

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.close_connection = True
        if not head:
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The stdlib's own errors (bad request line, header too long): plain, and always close.
        self.close_connection = True
        super().send_error(code, message, explain)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("status request", line=format % args, client=self.client_address[0])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    owner: "StatusServer"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.owner._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the connection cap: close rather than queue
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.owner._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("status connection error", client=client_address[0], exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class StatusServer:
    """The status endpoint; ``start()`` binds (port 0: ephemeral, see ``.port``), ``stop()`` closes."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        snapshot: Callable[[], dict],
        command: Callable[[str, dict], None],
        metrics: Metrics,
        ready: Callable[[], bool],
        *,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        if not token:
            raise ValueError("StatusServer needs a token (see auth.resolve_token)")
        self.host, self.port, self.token = host, port, token
        self.snapshot, self.command, self.metrics, self.ready = snapshot, command, metrics, ready
        self.request_timeout = request_timeout
        self.alive = alive          # /healthz: the guard's loop still turns (None: always)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        auth.register_secret(token)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises StatusServerError when the address is taken."""
        cls = _Server6 if ":" in self.host.strip("[]") else _Server
        try:
            server = cls((self.host.strip("[]"), self.port), _Handler, bind_and_activate=False)
            server.owner = self
            try:
                server.server_bind()
                server.server_activate()
            except BaseException:
                server.server_close()
                raise
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StatusServerError(
                    f"status port {self.host}:{self.port} is already in use (another vllm-guard?); "
                    f"choose another with --status-port or status.port, or 0 to disable it"
                ) from None
            raise StatusServerError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="vllm-guard-status", daemon=True)
        self._thread.start()
        log.info("status endpoint listening", url=self.url)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        log.exception("status callback failed")
        return default


# -- endpoint file ------------------------------------------------------------------------------

def write_endpoint_file(state_dir: str, *, pid: int, status_host: str, status_port: int,
                        token_file: str | None) -> str:
    """Write ``<state_dir>/guard.json`` for the CLI clients (atomically, 0600); returns its path."""
    data = {"pid": pid, "status_host": status_host, "status_port": status_port, "token_file": token_file}
    path = str(Path(state_dir) / ENDPOINT_FILE)
    auth.write_secret_file(path, json.dumps(data) + "\n")
    return path


def read_endpoint_file(state_dir: str) -> dict[str, Any] | None:
    """The endpoint file's contents, or None when absent or unreadable.

    ``status_port`` may be missing: the guard writes the file when it takes the state dir and
    adds the endpoint once it listens (never, with ``status.port = 0``).
    """
    try:
        data = json.loads((Path(state_dir) / ENDPOINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_endpoint_file(state_dir: str, pid: int | None = None) -> None:
    """Remove the endpoint file at shutdown (only if it is still ours when ``pid`` is given)."""
    path = Path(state_dir) / ENDPOINT_FILE
    if pid is not None:
        data = read_endpoint_file(state_dir)
        if data is not None and data.get("pid") != pid:
            return
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (EPERM counts as alive: it is someone else's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
