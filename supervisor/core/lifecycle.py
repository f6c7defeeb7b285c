"""The guard's lifecycle as a state machine: states, the allowed transitions, and why each exists.

Pure. The guard calls :meth:`Lifecycle.to` on every change; an edge not in :data:`TRANSITIONS`
is a bug and raises, so the states shown in ``/status`` and to systemd are always coherent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class State(str, enum.Enum):
    PLANNING = "planning"
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    # planning -> starting because the first launch's flags are chosen
    S.PLANNING: frozenset({S.STARTING, S.FAILED, S.STOPPING, S.BACKOFF}),
    # starting -> healthy because a generation request succeeded; -> restarting because the
    # launch failed and a remedy applies; -> backoff before retrying the same flags
    S.STARTING: frozenset({S.HEALTHY, S.RESTARTING, S.BACKOFF, S.FAILED, S.STOPPING}),
    # healthy -> unhealthy because probes fail while the process lives; -> restarting because it died
    S.HEALTHY: frozenset({S.UNHEALTHY, S.RESTARTING, S.BACKOFF, S.STOPPING, S.FAILED}),
    # unhealthy -> healthy because a probe succeeded again
    S.UNHEALTHY: frozenset({S.HEALTHY, S.RESTARTING, S.BACKOFF, S.STOPPING, S.FAILED}),
    S.RESTARTING: frozenset({S.STARTING, S.BACKOFF, S.FAILED, S.STOPPING, S.PLANNING}),
    S.BACKOFF: frozenset({S.STARTING, S.RESTARTING, S.FAILED, S.STOPPING, S.PLANNING}),
    S.FAILED: frozenset({S.STOPPING, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
}


class BadTransition(RuntimeError):
    pass


@dataclass
class Lifecycle:
    state: State = S.PLANNING
    history: list[tuple[float, State, str]] = field(default_factory=list)

    def to(self, new: State, now: float, why: str = "") -> bool:
        """Move to ``new``; False when already there; raises on an edge that should not exist."""
        if new is self.state:
            return False
        if new not in TRANSITIONS[self.state]:
            raise BadTransition(f"{self.state} -> {new} ({why})")
        self.state = new
        self.history.append((now, new, why))
        del self.history[:-100]
        return True

    @property
    def final(self) -> bool:
        return self.state in (S.STOPPED,)
