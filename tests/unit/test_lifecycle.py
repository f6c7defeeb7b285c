"""The lifecycle's table: allowed edges move, every other edge raises, and nothing is a dead end."""

import pytest

from supervisor.core.lifecycle import TRANSITIONS, BadTransition, Lifecycle, State


def walk(*states: State) -> Lifecycle:
    lc = Lifecycle()
    for s in states:
        lc.to(s)
    return lc


@pytest.mark.parametrize("start,end", [(a, b) for a in State for b in State if a is not b])
def test_an_edge_moves_exactly_when_the_table_has_it(start, end):
    lc = Lifecycle()
    lc.state = start
    if end in TRANSITIONS[start]:
        assert lc.to(end) and lc.state is end
    else:
        with pytest.raises(BadTransition, match=f"{start} -> {end}"):
            lc.to(end)
        assert lc.state is start


def test_the_same_state_is_no_transition():
    assert Lifecycle().to(State.PLANNING) is False


def test_a_guard_that_gave_up_only_stops():
    lc = walk(State.STARTING, State.FAILED)
    assert TRANSITIONS[State.FAILED] == {State.STOPPING}
    lc.to(State.STOPPING)
    lc.to(State.STOPPED)
    assert TRANSITIONS[State.STOPPED] == frozenset()


def test_every_state_can_reach_stopped():
    for state in State:
        seen, todo = {state}, [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert State.STOPPED in seen
