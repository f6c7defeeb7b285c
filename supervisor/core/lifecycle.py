"""The guard's states and the transitions between them, each with the reason it exists.

Pure, and imported by nothing but the session (which moves the state) and the shell (which shows
it). An edge not in :data:`TRANSITIONS` is a bug and raises :class:`BadTransition`, so the state
in ``/status``, in the metrics and in systemd's status line is always one the table allows.
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    PLANNING = "planning"        # gathering facts, choosing the first launch's flags
    STARTING = "starting"        # a launch is on its way to its first successful completion
    HEALTHY = "healthy"          # a chat completion succeeded and probes keep passing
    UNHEALTHY = "unhealthy"      # probes fail while the process lives
    RESTARTING = "restarting"    # about to relaunch now (new flags, or a request)
    BACKOFF = "backoff"          # waiting before relaunching the same flags
    FAILED = "failed"            # gave up; the guard exits 75 or 78
    STOPPING = "stopping"        # stopping vLLM and the guard
    STOPPED = "stopped"          # nothing runs any more

    def __str__(self) -> str:
        return self.value


S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    # planning -> starting because the first launch's flags are chosen; -> stopping because a
    # stop came, or the guard refused to start, before any launch
    S.PLANNING: frozenset({S.STARTING, S.STOPPING}),
    # starting -> healthy because a chat completion succeeded; -> restarting because the launch
    # failed and a remedy changes flags (or a restart was requested); -> backoff before the same
    # flags again; -> failed because nothing more can be changed
    S.STARTING: frozenset({S.HEALTHY, S.RESTARTING, S.BACKOFF, S.FAILED, S.STOPPING}),
    # healthy -> unhealthy because probes fail while the process lives; -> restarting/backoff
    # because it died or hung; -> failed because it keeps dying (crash loop)
    S.HEALTHY: frozenset({S.UNHEALTHY, S.RESTARTING, S.BACKOFF, S.FAILED, S.STOPPING}),
    # unhealthy -> healthy because a probe succeeded again
    S.UNHEALTHY: frozenset({S.HEALTHY, S.RESTARTING, S.BACKOFF, S.FAILED, S.STOPPING}),
    # restarting -> starting because the next launch is issued
    S.RESTARTING: frozenset({S.STARTING, S.STOPPING}),
    # backoff -> starting once the delay is over; -> restarting because a restart was requested
    S.BACKOFF: frozenset({S.STARTING, S.RESTARTING, S.STOPPING}),
    # failed -> stopping because the guard now stops vLLM and exits
    S.FAILED: frozenset({S.STOPPING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
}


class BadTransition(RuntimeError):
    """A state change the table does not allow (a bug in the guard)."""


class Lifecycle:
    """The current state; :meth:`to` moves it along an allowed edge."""

    def __init__(self) -> None:
        self.state = S.PLANNING

    def to(self, new: State, why: str = "") -> bool:
        """Move to ``new``; False when already there; raises on an edge that should not exist."""
        if new is self.state:
            return False
        if new not in TRANSITIONS[self.state]:
            raise BadTransition(f"{self.state} -> {new} ({why})")
        self.state = new
        return True
