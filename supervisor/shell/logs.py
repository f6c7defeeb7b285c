"""structlog set-up, called once from the CLI: JSON lines for journald and pipes, colours on a TTY.

Every event passes a redaction processor, so a secret passed as an event field (``argv=``,
``env=``) or quoted in a vLLM line never reaches the log. Under systemd (``$JOURNAL_STREAM``
names our stream) each line starts with a ``<N>`` syslog priority so journald files it at the
right level.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO, cast

import structlog

from supervisor.secrets import REGISTRY

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "critical": 2, "exception": 3}


def redact_event(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: mask secret fields and secret values in every event."""
    return cast(dict[str, Any], REGISTRY.obj(event))


def _journald_prefix(_logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    event["_priority"] = _PRIORITY.get(method, 6)
    return event


class _PriorityRenderer:
    """Wraps the final renderer and prepends journald's ``<N>`` priority (SyslogLevelPrefix)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> str:
        priority = event.pop("_priority", 6)
        return f"<{priority}>{self._inner(logger, method, event)}"


def on_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is the journald stream systemd connected ($JOURNAL_STREAM = dev:inode)."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Tolerant:
    """A stream whose writes never raise: the guard's log going to a terminal that closed (SSH gone,
    a pipe whose reader died) must not end the guard while it supervises vLLM."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return _isatty(self._stream)

    def fileno(self) -> int:
        return self._stream.fileno()


class _MaskingFormatter(logging.Formatter):
    """The libraries' records (httpx, asyncio: a traceback may quote a URL or a payload), masked too."""

    def format(self, record: logging.LogRecord) -> str:
        return REGISTRY.text(super().format(record))


def configure_logging(json: bool | None = None, level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog (and the stdlib root logger) once: JSON unless ``stream`` is a TTY.

    ``json=None`` decides by the stream; ``level`` is debug/info/warning/error. Logs go to
    stderr by default so stdout stays clean for commands that print data (``status --json``).
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    stream = sys.stderr if stream is None else stream
    as_json = (not _isatty(stream)) if json is None else json
    journal = as_json and on_journal(stream)
    REGISTRY.add_environ(os.environ)

    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if as_json:
        processors.append(structlog.processors.format_exc_info)
    processors.append(redact_event)
    if journal:
        processors.append(_journald_prefix)
    renderer: Any = (structlog.processors.JSONRenderer(sort_keys=False) if as_json
                     else structlog.dev.ConsoleRenderer(colors=_isatty(stream) and not os.environ.get("NO_COLOR")))
    processors.append(_PriorityRenderer(renderer) if journal else renderer)

    out = _Tolerant(stream)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level.lower()]),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # Libraries (httpx, asyncio) log through the stdlib: warnings and worse, same stream.
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_vllm_guard", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(out)
    handler._vllm_guard = True  # type: ignore[attr-defined]
    handler.setFormatter(_MaskingFormatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(max(LEVELS[level.lower()], logging.WARNING))
