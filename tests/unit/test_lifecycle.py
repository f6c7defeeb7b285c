"""The lifecycle's edges: the allowed ones move, the others raise."""

import pytest

from supervisor.core.lifecycle import BadTransition, Lifecycle, State, TRANSITIONS


def test_planning_to_starting_to_healthy_to_restarting():
    lc = Lifecycle()
    assert lc.to(State.STARTING, 0)
    assert lc.to(State.HEALTHY, 1)
    assert lc.to(State.RESTARTING, 2)
    assert [s for _, s, _ in lc.history] == [State.STARTING, State.HEALTHY, State.RESTARTING]


def test_same_state_is_no_transition():
    lc = Lifecycle()
    assert lc.to(State.PLANNING, 0) is False


def test_stopped_is_final():
    lc = Lifecycle(State.STOPPING)
    lc.to(State.STOPPED, 0)
    with pytest.raises(BadTransition):
        lc.to(State.STARTING, 1)


def test_failed_cannot_restart():
    lc = Lifecycle(State.FAILED)
    with pytest.raises(BadTransition):
        lc.to(State.STARTING, 0)


def test_every_state_can_reach_stopped():
    for state in State:
        seen, todo = {state}, [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert State.STOPPED in seen or state is State.STOPPED
