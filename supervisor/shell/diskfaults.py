"""Faults of the disk never end supervision: which state files the disk refuses now, each logged once.

A write of a state file is best effort (:meth:`Faults.attempt`): a full disk (ENOSPC, EDQUOT), an I/O
error, a read-only remount is logged once per file, tried again later, and the guard goes on from
memory. What is a fault of the disk (it may pass) rather than a refusal a person must act on
(EACCES, a planted object) is :data:`DISK_FAULTS`.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from supervisor.errors import StateError

log = structlog.get_logger("vllm-guard")

#: What a fault of the disk looks like (it may pass: a full disk is freed, a remount undone), as
#: opposed to a refusal a person must act on (EACCES, a planted object).
DISK_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


class Faults:
    """Which state files the disk refuses now: each fault is logged once per file (and once more when
    that file can be written again), so a full disk is one warning per file, not one per line."""

    def __init__(self) -> None:
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()

    def failed(self, path: str | Path, e: BaseException) -> None:
        why = getattr(e, "strerror", None) or str(e)
        with self._lock:
            first = str(path) not in self._failing
            self._failing[str(path)] = why
        if first:
            log.warning(f"cannot write {path} ({why}); the guard goes on without it and tries again later")

    def ok(self, path: str | Path) -> None:
        with self._lock:
            was = self._failing.pop(str(path), None)
        if was is not None:
            log.info(f"{path} can be written again")

    def failing(self) -> dict[str, str]:
        """The files the disk refuses now, with why."""
        with self._lock:
            return dict(self._failing)

    def attempt(self, path: str | Path, write: Callable[[], Any], *, proves: bool = True) -> bool:
        """Run ``write`` (a write of ``path``) as best effort: True when it worked; a fault (OSError,
        :class:`StateError`) is logged once per file and the caller goes on. ``proves``: that it worked
        shows the file can be written again (a removal, which a full disk allows, does not)."""
        try:
            write()
        except (OSError, StateError) as e:
            self.failed(path, e)
            return False
        if proves:
            self.ok(path)
        return True


#: The guard's one record of disk faults.
FAULTS = Faults()
