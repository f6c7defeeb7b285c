"""sd_notify against a real AF_UNIX datagram socket, as systemd would listen."""

from __future__ import annotations

import os
import socket

import pytest

from supervisor.shell.sdnotify import Notifier, child_environment


@pytest.fixture
def listener(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_status_watchdog_stopping_arrive_as_datagrams(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("planning: launch 1")
    assert received(sock) == "READY=1\nSTATUS=planning: launch 1"
    assert n.status("healthy:\n launch 2 serves")
    assert received(sock) == "STATUS=healthy: launch 2 serves"   # one line, as systemd shows it
    assert n.watchdog()
    assert received(sock) == "WATCHDOG=1"
    assert n.extend_timeout(90)
    assert received(sock) == "EXTEND_TIMEOUT_USEC=90000000"
    assert n.stopping()
    assert received(sock) == "STOPPING=1"


def test_abstract_socket_names(tmp_path):
    name = f"vllm-guard-test-{os.getpid()}-{id(tmp_path)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert received(sock) == "READY=1"
    finally:
        sock.close()


def test_no_socket_is_a_quiet_no_op():
    n = Notifier({})
    assert not n.enabled
    assert n.ready() is False and n.status("x") is False and n.watchdog() is False
    assert n.watchdog_interval() is None


def test_a_vanished_socket_does_not_raise(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.ready() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),  # someone else's watchdog
        ({"WATCHDOG_USEC": "nonsense"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_the_period(listener, env, expected):
    path, _ = listener
    assert Notifier({"NOTIFY_SOCKET": path, **env}).watchdog_interval() == expected


def test_child_environment_drops_the_notify_variables():
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    assert child_environment(env) == {"PATH": "/bin"}


def test_a_reader_that_lags_never_blocks_the_sender(listener):
    # A datagram socket queues only net.unix.max_dgram_qlen messages; an unread queue made sendto
    # wait, freezing the guard's loop (seen with a test that read the socket only at the end).
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    results = [n.watchdog() for _ in range(2000)]
    assert results[0] is True and results.count(False) > 0      # some were dropped, none waited
    assert sock.recv(4096) == b"WATCHDOG=1"                      # what was queued still arrives
