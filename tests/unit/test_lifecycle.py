"""The lifecycle, checked against a table written out here from what the README promises.

The expectations are not read from the code's own ``TRANSITIONS``: each allowed edge below is one
line, with the behaviour that needs it, and every other ordered pair of states (72 pairs of 9
states, less the 24 edges) must raise. An edge added to or dropped from the code fails here
until this table, the specification, says so too.
"""

from __future__ import annotations

import pytest

from supervisor.core.lifecycle import TRANSITIONS, BadTransition, Lifecycle, State

P, ST, H, U, R, B, F, SG, SD = (State.PLANNING, State.STARTING, State.HEALTHY, State.UNHEALTHY, State.RESTARTING,
                                State.BACKOFF, State.FAILED, State.STOPPING, State.STOPPED)

#: (from, to): why the guard takes that edge (README: "What it heals", "What the guard promises").
ALLOWED = {
    (P, ST): "the first launch's flags are chosen",
    (P, SG): "a stop, or a refusal to start (another guard, a bad state dir), before any launch",
    (ST, H): "a real chat completion succeeded",
    (ST, R): "the launch failed and a remedy changes the flags, or a restart was asked for",
    (ST, B): "the launch failed and the same flags come again after a backoff",
    (ST, F): "nothing more can be changed, or the launch budget is spent (exit 75/78)",
    (ST, SG): "a signal or POST /stop while starting",
    (H, U): "probes fail while vLLM's process lives",
    (H, R): "a restart was asked for, or vLLM died and the next flags differ",
    (H, B): "vLLM died or hung: the same flags after a backoff",
    (H, F): "it keeps dying soon after becoming healthy (the crash-loop limit)",
    (H, SG): "a stop while serving",
    (U, H): "a probe passes again",
    (U, R): "a restart was asked for while probes fail",
    (U, B): "the failed probes made it hung: relaunched after a backoff",
    (U, F): "hung once too often (the crash-loop limit)",
    (U, SG): "a stop while probes fail",
    (R, ST): "the next launch is issued",
    (R, SG): "a stop before the next launch",
    (B, ST): "the delay is over",
    (B, R): "a restart asked during the backoff skips the wait",
    (B, SG): "a stop ends the backoff at once",
    (F, SG): "the guard gave up: it stops vLLM and exits",
    (SG, SD): "vLLM is stopped; nothing runs any more",
}
PAIRS = [(a, b) for a in State for b in State if a is not b]


def test_the_table_covers_the_nine_states_and_their_72_pairs():
    assert len(State) == 9 and len(PAIRS) == 72 and len(ALLOWED) == 24
    assert {s.value for s in State} == {"planning", "starting", "healthy", "unhealthy", "restarting", "backoff",
                                        "failed", "stopping", "stopped"}


@pytest.mark.parametrize("start,end", PAIRS, ids=lambda s: s.value)
def test_an_edge_moves_exactly_when_the_specification_allows_it(start, end):
    lc = Lifecycle()
    lc.state = start
    if (start, end) in ALLOWED:
        assert lc.to(end, "why") is True and lc.state is end
    else:
        with pytest.raises(BadTransition, match=f"^{start} -> {end} \\(why\\)$"):
            lc.to(end, "why")
        assert lc.state is start


def test_the_code_table_is_the_specification():
    """The table the shell shows states from (``TRANSITIONS``) has exactly the edges above."""
    assert {(a, b) for a, ends in TRANSITIONS.items() for b in ends} == set(ALLOWED)
    assert set(TRANSITIONS) == set(State)


def test_a_new_lifecycle_is_planning_and_the_same_state_is_no_transition():
    lc = Lifecycle()
    assert lc.state is State.PLANNING
    assert lc.to(State.PLANNING) is False and lc.state is State.PLANNING


def test_a_guard_that_gave_up_never_launches_again():
    """failed -> stopping -> stopped; from failed nothing starts, restarts or backs off."""
    for nxt in (ST, H, R, B, U, P):
        lc = Lifecycle()
        lc.state = F
        with pytest.raises(BadTransition):
            lc.to(nxt)
    lc = Lifecycle()
    for s in (ST, F, SG, SD):
        assert lc.to(s)
    assert lc.state is SD


def test_stopped_is_the_end_and_every_state_can_reach_it():
    for nxt in State:
        if nxt is not SD:
            lc = Lifecycle()
            lc.state = SD
            with pytest.raises(BadTransition):
                lc.to(nxt)
    for state in State:
        seen, todo = {state}, [state]
        while todo:
            here = todo.pop()
            for a, b in ALLOWED:
                if a is here and b not in seen:
                    seen.add(b)
                    todo.append(b)
        assert SD in seen, state


def test_states_read_as_their_names():
    """/status, the metrics and systemd's STATUS= line show the state as its lower-case name."""
    assert str(State.BACKOFF) == "backoff" and f"{State.HEALTHY}" == "healthy"
