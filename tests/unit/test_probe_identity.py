"""A 200 is healthy only when this launch's own server gave it (:func:`supervisor.shell.probe.answered_by`).

Real servers in child processes, each answering a chat completion with its own pid: the probe's
verdict must say "ours" exactly when the pid that answered is the launch's. Two servers share one
port with ``SO_REUSEPORT`` (as vLLM 0.7.3-0.24 bind it), so the kernel hands each new connection to
either: the verdict follows the connection, not the port.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from supervisor.shell.probe import Prober, answered_by

SERVER = r"""
import json, os, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps({"choices": [{"index": 0}], "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen(64)
httpd = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H, bind_and_activate=False)
httpd.socket = sock
print("ready", flush=True)
httpd.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers():
    started: list[subprocess.Popen[str]] = []

    def start(port: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def probe_once(port: int, root: int | None, marker: str = "") -> tuple[bool, str, int]:
    """A fresh prober (a new connection): (healthy, who answered instead, the pid that really answered)."""
    answered: list[int] = []

    async def main():
        p = Prober("127.0.0.1", port, "m", identity=lambda prt, client: answered_by(root, marker, prt, client))
        original = p._client.post

        async def post(*a, **k):
            r = await original(*a, **k)
            answered.append(r.json()["pid"])
            return r

        p._client.post = post
        try:
            return await p.probe()
        finally:
            await p.aclose()

    r = asyncio.run(main())
    return r.ok, r.foreign, answered[-1]


def test_the_launchs_own_server_is_healthy_and_another_is_named(servers) -> None:
    port = free_port()
    server = servers(port)
    assert probe_once(port, server.pid)[:2] == (True, "")
    other_launch = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:                                                # a launch whose tree holds no such server
        ok, foreign, _ = probe_once(port, other_launch.pid)
    finally:
        other_launch.kill()
        other_launch.wait()
    assert not ok and foreign.startswith(f"another process (pid {server.pid}: {sys.executable} -c ")


def test_a_server_marked_as_another_guards_launch_is_named_so_and_this_launchs_mark_is_ours(servers) -> None:
    port = free_port()
    server = servers(port, env={"VLLMGUARD_LAUNCH": "0123456789ab:1"})
    ok, foreign, _ = probe_once(port, None, marker="ffffffffffff:3")
    assert not ok and foreign.startswith(f"another vllm-guard's vLLM (pid {server.pid}: ")
    assert probe_once(port, None, marker="0123456789ab:1")[:2] == (True, "")


def test_on_a_shared_port_the_verdict_follows_the_server_that_answered(servers) -> None:
    port = free_port()
    ours, theirs = servers(port), servers(port)
    seen = set()
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        ok, foreign, pid = probe_once(port, ours.pid)
        assert ok == (pid == ours.pid), (ok, foreign, pid)
        assert ok or foreign.startswith(f"another process (pid {theirs.pid}: ")
        seen.add(pid)
    assert seen == {ours.pid, theirs.pid}, "the kernel gave every connection to one server"
