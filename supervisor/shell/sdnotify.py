"""systemd's sd_notify protocol over ``$NOTIFY_SOCKET``; does nothing outside systemd.

Like gunicorn's ``systemd.py``: one AF_UNIX datagram per message, ``@name`` means the abstract
namespace, and a failure to notify is logged at debug level, never raised (the supervisor must
keep running even if systemd cannot hear it).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger("vllm_guard.sdnotify")


def _address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace
    if value.startswith("/"):
        return value
    return None  # vsock ("vsock:...") and other forms are not used for services


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING to systemd when ``NOTIFY_SOCKET`` is set."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_usec = env.get("WATCHDOG_USEC", "")
        self._watchdog_pid = env.get("WATCHDOG_PID", "")

    @property
    def enabled(self) -> bool:
        """Whether a notification socket was given."""
        return self._address is not None

    def notify(self, message: str) -> bool:
        """Send one raw message (``KEY=VALUE`` lines); True when it was delivered."""
        if self._address is None:
            return False
        try:
            # Never block the loop: a datagram socket whose reader lags (its queue holds only
            # net.unix.max_dgram_qlen messages) makes sendto wait; drop the message instead.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
                sock.sendto(message.encode("utf-8"), self._address)
            return True
        except OSError as exc:      # BlockingIOError (queue full) included
            log.debug("sd_notify failed", message=message.split("\n", 1)[0], error=str(exc))
            return False

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd the service is up (the status endpoint listens, the first launch is issued)."""
        return self.notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def status(self, text: str) -> bool:
        """Set the one-line status ``systemctl status`` shows."""
        return self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        """Keep-alive ping; send it from the main loop at watchdog_interval()."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd shutdown has begun."""
        return self.notify("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time for the current start-up or shutdown step."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when no watchdog is armed."""
        if self._address is None or not self._watchdog_usec:
            return None
        if self._watchdog_pid and self._watchdog_pid != str(os.getpid()):
            return None  # the watchdog belongs to another process (e.g. inherited environment)
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            return None
        return usec / 2 / 1_000_000 if usec > 0 else None


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the notify/watchdog variables, for vLLM (only the guard talks to systemd)."""
    drop = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}
    return {k: v for k, v in environ.items() if k not in drop}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
