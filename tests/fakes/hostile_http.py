"""A real HTTP receiver on loopback that misbehaves on purpose: what a webhook may answer.

Modes (one per server):

- ``huge``: ``200 OK`` with ``Content-Length`` of 512 MiB, then zeros as fast as the peer reads;
- ``trickle``: ``200 OK`` with a 1 MB ``Content-Length``, then one byte a second;
- ``trickle_head``: the status line and headers one byte a second, never finished;
- ``silent``: reads the request and never answers;
- ``ok``: ``204 No Content``, after reading the body (kept in ``bodies``).

It counts requests and the bytes it managed to send, so a test can tell how much the client read
before it closed. Raw sockets (socketserver), because a well-behaved HTTP server library would not
send these answers. Stdlib only.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time

HUGE = 512 << 20
_ZEROS = bytes(64 << 10)


class _Handler(socketserver.BaseRequestHandler):
    server: HostileServer._Server

    def handle(self) -> None:
        srv = self.server.owner
        conn: socket.socket = self.request
        conn.settimeout(60)
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            self._head = head
            with srv.lock:
                srv.requests += 1
            getattr(self, f"_{srv.mode}")(conn, srv)
        except OSError:
            pass                      # the client closed on us: that is what is being tested
        finally:
            with srv.lock:
                srv.closed += 1

    def _send(self, conn: socket.socket, srv: HostileServer, data: bytes) -> None:
        conn.sendall(data)
        with srv.lock:
            srv.sent += len(data)

    def _ok(self, conn: socket.socket, srv: HostileServer) -> None:
        head, _, body = self._head.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        while len(body) < min(length, 1 << 20):
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        with srv.lock:
            srv.bodies.append(body)
        self._send(conn, srv, b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    def _huge(self, conn: socket.socket, srv: HostileServer) -> None:
        self._send(conn, srv, f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                              f"Content-Length: {HUGE}\r\n\r\n".encode())
        left = HUGE
        while left > 0 and not srv.stopping.is_set():
            piece = _ZEROS[:min(left, len(_ZEROS))]
            self._send(conn, srv, piece)
            left -= len(piece)

    def _trickle(self, conn: socket.socket, srv: HostileServer) -> None:
        self._send(conn, srv, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while not srv.stopping.wait(srv.interval):
            self._send(conn, srv, b"x")

    def _trickle_head(self, conn: socket.socket, srv: HostileServer) -> None:
        head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100000
        for i in range(len(head)):
            if srv.stopping.wait(srv.interval if i else 0):
                return
            self._send(conn, srv, head[i:i + 1])

    def _silent(self, conn: socket.socket, srv: HostileServer) -> None:
        while not srv.stopping.wait(0.1):
            pass


class HostileServer:
    """``with HostileServer("huge") as s: s.url ...``; ``requests``, ``sent``, ``closed`` count."""

    class _Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        owner: HostileServer

    def __init__(self, mode: str, interval: float = 1.0) -> None:
        self.mode, self.interval = mode, interval
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests = self.sent = self.closed = 0
        self.bodies: list[bytes] = []
        self._srv = self._Server(("127.0.0.1", 0), _Handler)
        self._srv.owner = self
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._srv.serve_forever, name=f"hostile-{mode}", daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._srv.shutdown()
        self._srv.server_close()

    def wait_requests(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.requests < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.mode}: {self.requests} requests, not {n}, within {timeout} s")
            time.sleep(0.02)
