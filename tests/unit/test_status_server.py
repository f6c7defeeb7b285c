"""The status endpoint over real HTTP: routes, auth, redaction, and hostile clients.

The server runs in an event loop of its own thread, as it runs in the guard's loop; the tests are
its clients, over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.shell.metrics import Metrics
from supervisor.shell.status_server import StatusServer, StatusServerError
from tests.fakes.serve import serving

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeGuard:
    """What the guard hands the server: a snapshot, a ready flag, and a command inbox."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict]] = []
        self.is_ready = False
        self.snap = {
            "state": "starting",
            "model": "org/model",
            "pid": 4242,
            "argv": ["vllm", "serve", "org/model", "--api-key", "sk-live-abcdefghijklmnop", "--max-model-len", "8192"],
            "changed_flags": {"--max-model-len": {"value": "8192", "requested": "32768",
                                                   "why": "KV cache holds 9000 tokens"}},
            "launches": [{"argv": ["vllm", "serve", "--hf-token=hf_abcdefghijklmnopqrstuvwxyz"],
                          "outcome": "failed", "kind": "kv_cache_insufficient",
                          "evidence": "ValueError: ... sk-live-abcdefghijklmnop appeared here"}],
            "env": {"HF_TOKEN": "hf_zyxwvutsrqponmlkjihgfedcba", "CUDA_VISIBLE_DEVICES": "0"},
        }

    def command(self, name: str, params: dict) -> None:
        self.commands.append((name, params))


@pytest.fixture
def guard():
    return FakeGuard()


@pytest.fixture
def server(guard):
    srv = StatusServer("127.0.0.1", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(),
                       lambda: guard.is_ready, request_timeout=1.0)
    with serving(srv):
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=5.0) as c:
        yield c


def raw(server: StatusServer, data: bytes, read_timeout: float = 5.0) -> bytes:
    """Send raw bytes, half-close, and return whatever comes back ('' when closed, reset counts too)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before we finished sending
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def status_code(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/"):
        return None
    return int(response.split(b" ", 2)[1])


# -- routes --------------------------------------------------------------------------------------------

def test_get_status_serves_the_snapshot_as_json(client):
    r = client.get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert (body["state"], body["model"], body["pid"]) == ("starting", "org/model", 4242)
    assert body["changed_flags"]["--max-model-len"]["requested"] == "32768"


def test_status_redacts_every_secret(client):
    text = client.get("/status").text
    for secret in ("sk-live-abcdefghijklmnop", "hf_abcdefghijklmnopqrstuvwxyz", "hf_zyxwvutsrqponmlkjihgfedcba", TOKEN):
        assert secret not in text
    body = json.loads(text)
    assert body["argv"][3:5] == ["--api-key", "***"]
    assert body["argv"][5:] == ["--max-model-len", "8192"]      # not a secret, left alone
    assert body["launches"][0]["argv"][-1] == "--hf-token=***"
    assert body["launches"][0]["evidence"] == "ValueError: ... *** appeared here"
    assert body["env"] == {"HF_TOKEN": "***", "CUDA_VISIBLE_DEVICES": "0"}


def test_status_never_shows_the_bearer_token_even_if_the_guard_puts_it_there(client, guard):
    guard.snap = {"state": "healthy", "note": f"token is {TOKEN}"}
    assert client.get("/status").json()["note"] == "token is ***"


def test_healthz_answers_while_the_guard_lives(client):
    r = client.get("/healthz")
    assert (r.status_code, r.text) == (200, "ok\n")


def test_ready_follows_the_ready_callback(client, guard):
    assert client.get("/ready").status_code == 503
    guard.is_ready = True
    assert client.get("/ready").status_code == 200
    guard.is_ready = False
    assert client.get("/ready").status_code == 503


def test_metrics_parse_as_prometheus_text(client, server):
    server.metrics.set_state("healthy")
    server.metrics.launch_finished("failed", "oom_weights")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families["vllm_guard_healthy"].samples[0].value == 1.0
    launches = [s for s in families["vllm_guard_launches"].samples if s.name.endswith("_total")]
    assert launches[0].labels == {"outcome": "failed", "kind": "oom_weights"}


def test_head_answers_without_a_body(client):
    r = client.head("/healthz")
    assert r.status_code == 200 and r.content == b""


def test_unknown_path_is_404_and_wrong_method_405(client):
    assert client.get("/nope").status_code == 404
    assert client.post("/nope", headers=AUTH).status_code == 404
    r = client.get("/restart")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert client.post("/status", headers=AUTH).status_code == 405
    assert client.put("/status").status_code == 405
    assert client.request("BREW", "/status").status_code == 405


def test_snapshot_failure_is_a_500_and_the_server_keeps_serving(server, client):
    def broken():
        raise KeyError("launches")
    good, server.snapshot = server.snapshot, broken
    r = client.get("/status")
    assert r.status_code == 500 and r.json() == {"error": "snapshot failed: KeyError"}
    server.snapshot = good
    assert client.get("/status").json()["state"] == "starting"


# -- auth and commands ---------------------------------------------------------------------------------

def test_restart_without_token_is_401(client, guard):
    r = client.post("/restart")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert guard.commands == []


def test_restart_with_wrong_token_is_403(client, guard):
    assert client.post("/restart", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert client.post("/restart", headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 403
    assert client.post("/restart", headers={"Authorization": "Basic dTpw"}).status_code == 401
    assert guard.commands == []


def test_restart_with_the_token_reaches_the_guard(client, guard):
    r = client.post("/restart", headers=AUTH)
    assert r.status_code == 202 and r.json() == {"accepted": "restart", "reset": False}
    assert guard.commands == [("restart", {"reset": False})]


def test_restart_reset(client, guard):
    assert client.post("/restart?reset=1", headers=AUTH).status_code == 202
    assert client.post("/restart?reset=maybe", headers=AUTH).status_code == 400
    assert guard.commands == [("restart", {"reset": True})]


def test_stop(client, guard):
    assert client.post("/stop").status_code == 401
    assert client.post("/stop", headers=AUTH).status_code == 202
    assert guard.commands == [("stop", {})]


def test_a_refusing_guard_gives_503(server, client, guard):
    def refuse(name, params):
        raise RuntimeError("shutting down")
    server.command = refuse
    r = client.post("/stop", headers=AUTH)
    assert r.status_code == 503 and "shutting down" in r.json()["error"]


def test_non_ascii_authorization_is_403_not_a_crash(server, guard):
    response = raw(server, b"POST /stop HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
    assert status_code(response) == 403
    assert guard.commands == []


# -- hostile clients -------------------------------------------------------------------------------------

def test_http11_without_host_is_400(server):
    assert status_code(raw(server, b"GET /healthz HTTP/1.1\r\n\r\n")) == 400
    assert status_code(raw(server, b"GET /healthz HTTP/1.0\r\n\r\n")) == 200


def test_garbage_request_line_is_400(server, client):
    assert status_code(raw(server, b"\x00\x01garbage garbage\r\n\r\n")) == 400
    assert status_code(raw(server, b"GET\r\n\r\n")) in (400, None)
    assert client.get("/healthz").status_code == 200


def test_huge_header_is_refused_and_later_requests_work(server, client):
    response = raw(server, b"GET /status HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    assert status_code(response) in (None, 431, 400)  # 431, or closed while we were still sending
    assert client.get("/healthz").status_code == 200


def test_huge_body_is_413_without_reading_it(server, client, guard):
    response = raw(server, b"POST /restart HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10000000\r\n"
                   + AUTH_LINE + b"\r\n")
    assert status_code(response) == 413
    assert guard.commands == []
    assert client.get("/healthz").status_code == 200


def test_bad_content_length_is_400(server):
    assert status_code(raw(server, b"POST /stop HTTP/1.1\r\nContent-Length: -5\r\n\r\n")) == 400
    assert status_code(raw(server, b"POST /stop HTTP/1.1\r\nContent-Length: x\r\n\r\n")) == 400


def test_chunked_body_is_refused(server, guard):
    response = raw(server, b"POST /stop HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n" + AUTH_LINE
                   + b"\r\n0\r\n\r\n")
    assert status_code(response) == 411
    assert guard.commands == []


def test_small_body_is_read_and_ignored(client, guard):
    assert client.post("/stop", headers=AUTH, content=b'{"why": "test"}').status_code == 202
    assert guard.commands == [("stop", {})]


def test_slow_client_does_not_block_others_and_is_dropped(guard):
    srv = StatusServer("127.0.0.1", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(), bool,
                       request_timeout=3.0)
    with serving(srv):
        slow = socket.create_connection(("127.0.0.1", srv.port))
        try:
            slow.sendall(b"GET /status HTTP/1.1\r\n")      # ...and never finishes
            with httpx.Client(base_url=srv.url, timeout=5.0) as c:
                assert c.get("/healthz").status_code == 200  # served while the slow one waits
                assert c.get("/status").status_code == 200
            slow.setblocking(False)
            with pytest.raises(BlockingIOError):              # the slow one is still open, unanswered
                slow.recv(1)
            slow.settimeout(10.0)
            assert slow.recv(1024) == b""                      # and closed at request_timeout
        finally:
            slow.close()


def test_trickling_client_hits_the_request_deadline(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.settimeout(0.2)
    t0 = time.monotonic()
    closed = False
    try:
        s.sendall(b"GET /status HTTP/1.1\r\n")
        while time.monotonic() - t0 < 8:
            try:
                s.sendall(b"X-A: b\r\n")                  # a header line every 0.5 s: never a timeout
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
            time.sleep(0.3)
    finally:
        s.close()
    assert closed and time.monotonic() - t0 < 3          # the whole request's deadline is 1 s


def test_over_the_cap_the_oldest_unfinished_request_makes_room(guard):
    srv = StatusServer("127.0.0.1", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(), bool,
                       request_timeout=30.0, max_connections=2)
    with serving(srv):
        hogs = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(2)]
        try:
            for h in hogs:
                h.sendall(b"GET /status HTTP/1.1\r\n")
                time.sleep(0.1)                                        # the first is the oldest
            assert status_code(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")) == 200
            hogs[0].settimeout(5)
            assert hogs[0].recv(1) == b""                              # dropped to make room
            hogs[1].setblocking(False)
            with pytest.raises(BlockingIOError):                       # the younger one still waits
                hogs[1].recv(1)
        finally:
            for h in hogs:
                h.close()


def test_healthz_answers_while_200_clients_trickle_bytes(guard):
    """The red-team case: 200 connections each sending a byte every few hundred ms, and more
    coming than the cap; liveness probes keep answering."""
    srv = StatusServer("127.0.0.1", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(), bool,
                       request_timeout=2.0, max_connections=150)
    with serving(srv):
        stop = threading.Event()

        def trickle() -> None:
            while not stop.is_set():
                try:
                    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                        s.sendall(b"GET /status HTTP/1.1\r\n")
                        while not stop.is_set():
                            s.sendall(b"X")
                            time.sleep(0.3)
                except OSError:
                    time.sleep(0.05)                                   # dropped: come back

        threads = [threading.Thread(target=trickle, daemon=True) for _ in range(200)]
        for th in threads:
            th.start()
        try:
            time.sleep(1.0)
            codes = []
            with httpx.Client(base_url=srv.url, timeout=2.0) as c:
                for _ in range(20):
                    codes.append(c.get("/healthz").status_code)
                    time.sleep(0.1)
            assert codes == [200] * 20
        finally:
            stop.set()
            for th in threads:
                th.join(10)


def test_many_parallel_clients(server):
    codes: list[int] = []
    lock = threading.Lock()

    def hit():
        with httpx.Client(base_url=server.url, timeout=5.0) as c:
            code = c.get("/status").status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=hit) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 20


# -- lifecycle ---------------------------------------------------------------------------------------------

def test_port_in_use_is_a_clear_error(server, guard):
    other = StatusServer("127.0.0.1", server.port, TOKEN, dict, guard.command, Metrics(), bool)
    with pytest.raises(StatusServerError, match=f"status port 127.0.0.1:{server.port} is already in use"):
        asyncio.run(other.start())


def test_ipv6_loopback(guard):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    srv = StatusServer("::1", 0, TOKEN, lambda: {"state": "healthy"}, guard.command, Metrics(), bool)
    try:
        with serving(srv):
            assert httpx.get(f"{srv.url}/healthz", timeout=5).status_code == 200
    except StatusServerError as exc:
        pytest.skip(f"::1 not available here: {exc}")


def test_stop_closes_the_port_and_is_idempotent(guard):
    srv = StatusServer("127.0.0.1", 0, TOKEN, dict, guard.command, Metrics(), bool)

    async def cycle() -> int:
        await srv.start()
        port = srv.port
        await srv.stop()
        await srv.stop()
        return port

    port = asyncio.run(cycle())
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_an_empty_token_is_refused():
    with pytest.raises(ValueError):
        StatusServer("127.0.0.1", 0, "", dict, lambda n, p: None, Metrics(), bool)


AUTH_LINE = f"Authorization: Bearer {TOKEN}\r\n".encode()


# -- the page and the Host check (DNS rebinding) ------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from supervisor.shell.status_server import _host_allowed  # noqa: E402


def test_the_page_is_html_with_a_strict_policy(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "style-src 'sha256-" in csp
    assert "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert TOKEN not in r.text and "hf_zyxwvutsrqponmlkjihgfedcba" not in r.text   # redacted like /status
    assert client.head("/").status_code == 200 and client.head("/").content == b""
    assert client.post("/", headers=AUTH).status_code == 405


def test_the_page_survives_a_snapshot_failure_with_a_500(server, client):
    server.snapshot = lambda: 1 / 0
    assert client.get("/").status_code == 500
    assert client.get("/healthz").status_code == 200


def _with_host(server: StatusServer, host: bytes, path: bytes = b"/healthz") -> int | None:
    return status_code(raw(server, b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"))


def test_a_loopback_endpoint_answers_its_own_address_and_localhost(server):
    port = str(server.port).encode()
    for host in (b"127.0.0.1:" + port, b"localhost:" + port, b"LocalHost:" + port, b"127.0.0.1", b"localhost"):
        assert _with_host(server, host) == 200, host
    for host in (b"evil.example:" + port, b"evil.example", b"127.0.0.1.nip.io:" + port, b"localhost.:" + port,
                 b"127.0.0.2:" + port, b"localhost:1" + port, b"[::1]:" + port, b"0.0.0.0:" + port):
        assert _with_host(server, host) == 421, host
    assert _with_host(server, b"evil.example", b"/status") == 421       # nothing to read...
    assert status_code(raw(server, b"POST /stop HTTP/1.1\r\nHost: evil.example\r\n" + AUTH_LINE + b"\r\n")) == 421


_NAME = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "P")), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(name=st.one_of(_NAME, st.sampled_from(["localhost", "LOCALHOST", "127.0.0.1", "[::1]", "::1", "localhost."])),
       port=st.one_of(st.none(), st.integers(0, 70000), st.text(max_size=6)))
def test_a_host_is_accepted_only_when_it_names_the_bound_address_or_localhost(name, port):
    host = name if port is None else f"{name}:{port}"
    allowed = name.lower() in ("localhost", "127.0.0.1") and (port is None or str(port) == "8077")
    assert _host_allowed(host, "127.0.0.1", 8077) is allowed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=st.binary(min_size=1, max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b))
def test_no_generated_host_but_ours_reaches_a_route(server, host):
    code = _with_host(server, host)
    if host.lower().decode("latin-1").strip() in ("localhost", "127.0.0.1", f"localhost:{server.port}",
                                                   f"127.0.0.1:{server.port}"):
        assert code == 200
    else:
        assert code in (400, 421), (host, code)      # h11 refuses what is not a header value at all


def test_ipv6_loopback_answers_its_bracketed_address(guard):
    srv = StatusServer("::1", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(), lambda: True)
    try:
        with serving(srv):
            with socket.create_connection(("::1", srv.port), timeout=5) as s:
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: [::1]:{srv.port}\r\n\r\n".encode())
                assert s.recv(100).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("::1", srv.port), timeout=5) as s:
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: evil.example:{srv.port}\r\n\r\n".encode())
                assert s.recv(100).startswith(b"HTTP/1.1 421")
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")


def test_a_bind_by_the_name_localhost_answers_its_addresses():
    assert _host_allowed("127.0.0.1:8077", "localhost", 8077) and _host_allowed("[::1]:8077", "localhost", 8077)
    assert not _host_allowed("evil.example:8077", "localhost", 8077)


def test_a_reachable_bind_takes_any_host(guard):
    srv = StatusServer("0.0.0.0", 0, TOKEN, lambda: guard.snap, guard.command, Metrics(), lambda: True)
    with serving(srv):
        assert _with_host(srv, b"gpu-host.internal:8077") == 200   # its own names are many; the token guards POST


def test_routes_are_one_table():
    srv = StatusServer("127.0.0.1", 0, TOKEN, dict, lambda *a: None, Metrics(), lambda: True)
    assert sorted(srv.routes) == [("GET", "/"), ("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/ready"),
                                  ("GET", "/status"), ("POST", "/restart"), ("POST", "/stop")]
    assert [p for (m, p), r in srv.routes.items() if r.token] == ["/restart", "/stop"]
