"""The session as a specification: (facts, what each launch did) -> the guard's next step.

Each scenario reads "with <flags> and <facts>, after <launch results>, the guard <steps>". A
step is written the way an operator would say it: ``launch <flags>`` (``after N s`` when it backs
off first) or ``give up <exit code>: <reason>``. The session is pure, so every scenario runs in
microseconds with a seeded random source; the states it passes through are recorded too, and
every edge of the lifecycle table must be taken by some scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config import GuardConfig, build, flatten
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice
from supervisor.core.lifecycle import TRANSITIONS, State
from supervisor.core.session import (DIED, FAILED, RESET, RESTART, STOPPED, End, Facts, Launch, Learned, Outcome,
                                     Session)
from supervisor.facts.model_files import load_model_info

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30


def config(args: str = "", **flat: Any) -> GuardConfig:
    """The default config with the user's vLLM args and flat overrides (``backoff.jitter=0``)."""
    values = flatten(GuardConfig(model="m", vllm_args=tuple(Flags.parse(args).argv())))
    values.update({"backoff.jitter": 0.0, **flat})
    return build(values)


def fail(kind: Kind, evidence: str = "", **numbers: Any) -> Outcome:
    return Outcome(FAILED, Diagnosis(kind, evidence=evidence or f"{kind} happened", numbers=numbers))


def died(kind: Kind, after_s: float, **numbers: Any) -> Outcome:
    return Outcome(DIED, Diagnosis(kind, evidence=f"{kind} while serving", numbers=numbers), True, after_s)


def say(step: Launch | End | None) -> str:
    """A step in words: ``launch --max-model-len 8192 after 2.0 s`` or ``give up 75: ...``."""
    if step is None:
        return "stop"
    if isinstance(step, End):
        return f"give up {step.exit_code}: {step.reason}"
    flags = " ".join(step.flags.argv())
    return f"launch {flags}".rstrip() + (f" after {step.delay:.1f} s" if step.delay else "")


def l4(held_gib: float = 0.0, index: int = 0) -> GpuDevice:
    total = int(22.06 * GiB)
    return GpuDevice(index, "NVIDIA L4", total, int(held_gib * GiB), total - int(held_gib * GiB), (8, 9), ())


def on_gpus(*devices: GpuDevice, model: str | None = None, version: str | None = "0.32.0") -> Facts:
    d = min(devices, key=lambda x: x.free_bytes)
    return Facts(devices=devices, free_gib=d.free_bytes / GiB, total_gib=d.total_bytes / GiB, vllm_version=version,
                 model=load_model_info(str(MODELS / model)) if model else None)


@dataclass(frozen=True)
class Scenario:
    name: str
    cfg: GuardConfig = field(default_factory=config)
    facts: Facts = field(default_factory=Facts)
    outcomes: tuple[Outcome, ...] = ()
    first: str = "launch"                 # the first launch, in words (a prefix)
    steps: tuple[str, ...] = ()           # the step after each outcome (each a prefix of say(step))
    healthy_after: int | None = None      # the launch (1-based) that became healthy before its outcome


SCENARIOS = [
    Scenario("no model facts: the first launch is the flags as given", config("--max-model-len 8192"),
             first="launch --max-model-len 8192"),
    Scenario("learned flags are used first", config("--max-model-len 32768"),
             Facts(learned=Learned(("--max-model-len", "30368"), "2026-11-29", {"--max-model-len": "cut"})),
             first="launch --max-model-len 30368"),
    Scenario("learned flags that fail are forgotten: the flags as given again, and that counts as a launch",
             config("--max-model-len 32768"), Facts(learned=Learned(("--max-model-len", "30368"))),
             (fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=30368, fit_max_model_len=20000),),
             first="launch --max-model-len 30368", steps=("launch --max-model-len 32768",)),
    Scenario("plan.auto_fit on vLLM 0.14+: vLLM sizes the length", config(**{"plan.auto_fit": True}),
             Facts(vllm_version="0.14.0"), first="launch --max-model-len auto"),
    Scenario("plan.auto_fit on an unknown vLLM: no flag it may not know", config(**{"plan.auto_fit": True}),
             first="launch"),
    Scenario("the plan cuts 131072 to vLLM's own measurement on a 24 GB card (0.32: auto)", config(),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct"), first="launch --max-model-len auto"),
    Scenario("the plan cuts to a number before 0.14 (no auto-fit)", config(),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct", version="0.10.2"), first="launch --max-model-len 2"),
    Scenario("--no-plan: the flags as given even when the plan would cut", config(**{"plan.enabled": False}),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct"), first="launch"),
    Scenario("a KV cache too small: the length vLLM says fits, in one relaunch", config(),
             outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368),),
             steps=("launch --max-model-len 30368",)),
    Scenario("an unknown failure at start-up: the same flags after backoff, until the launch budget is spent",
             config("--max-model-len 8192", max_launches=3),
             outcomes=(fail(Kind.UNKNOWN_FAILURE, "KeyError: 'x'"),) * 3,
             steps=("launch --max-model-len 8192 after 2.0 s", "launch --max-model-len 8192 after 4.0 s",
                    "give up 75: 3 launches in a row failed")),
    Scenario("the engine dies soon after serving: relaunched at once, then backoff grows, then failed at the "
             "crash-loop limit", config(**{"backoff.crash_loop_limit": 3}), outcomes=(died(Kind.ENGINE_DEAD, 30.0),) * 4,
             steps=("launch", "launch after 2.0 s", "launch after 4.0 s", "give up 75: vLLM died 4 times"),
             healthy_after=1),
    Scenario("a death after a long healthy run starts the count afresh: relaunched at once again",
             config(**{"backoff.crash_loop_limit": 1}),
             outcomes=(died(Kind.ENGINE_DEAD, 30.0), died(Kind.ENGINE_DEAD, 3600.0), died(Kind.ENGINE_DEAD, 30.0)),
             steps=("launch", "launch", "give up 75: vLLM died 2 times"),
             healthy_after=1),
    Scenario("backoff is capped at backoff.maximum", config(**{"backoff.maximum": 5.0, "max_launches": 9}),
             outcomes=(fail(Kind.ENGINE_DEAD),) * 4,
             steps=("launch after 2.0 s", "launch after 4.0 s", "launch after 5.0 s", "launch after 5.0 s")),
    Scenario("the port is in use: retried a few times, then a configuration error",
             config(**{"remedies.port_retries": 2}),
             outcomes=(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"),) * 3,
             steps=("launch after 2.0 s", "launch after 4.0 s", "give up 78: vLLM refused")),
    Scenario("a configuration vLLM refuses: exit 78 at once",
             outcomes=(fail(Kind.CONFIG_ERROR, "vllm: error: unrecognized arguments: --foo"),),
             steps=("give up 78: vLLM refused its configuration",)),
    Scenario("OOM while serving: the last good flags with half the sequences, at once (it had served)",
             config("--max-num-seqs 64"), outcomes=(died(Kind.OOM_RUNTIME, 60.0),),
             steps=("launch --max-num-seqs 32",), healthy_after=1),
    Scenario("a restart request: the current flags again, no backoff",
             config("--max-model-len 8192"), outcomes=(Outcome(RESTART),), steps=("launch --max-model-len 8192",)),
    Scenario("a reset request: back to the flags the user asked for",
             config(), outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368),
                                 Outcome(RESET)),
             steps=("launch --max-model-len 30368", "launch")),
    Scenario("asked to stop: nothing more", outcomes=(Outcome(STOPPED),), steps=("stop",)),
]


def play(s: Scenario) -> tuple[Session, list[str], list[State]]:
    states: list[State] = []
    session = Session(s.cfg, s.facts, rng=random.Random(0), on_state=lambda st, why: states.append(st))
    said = [say(session.first_launch())]
    for n, outcome in enumerate(s.outcomes, 1):
        session.launching()
        if s.healthy_after is not None and n >= s.healthy_after and outcome.was_healthy:
            session.healthy({}, 10.0)
        said.append(say(session.ended(outcome)))
    return session, said, states


@pytest.mark.parametrize("s", SCENARIOS, ids=lambda s: s.name)
def test_scenario(s: Scenario) -> None:
    _, said, _ = play(s)
    assert said[0].startswith(s.first), said[0]
    assert len(said) == len(s.steps) + 1
    for got, want in zip(said[1:], s.steps):
        assert got.startswith(want), f"{got!r} does not start with {want!r}"
        if want.startswith("launch"):
            assert (" after " in got) == (" after " in want), f"{got!r}: the wait is not the one written"


def _serving(cfg: GuardConfig | None = None) -> tuple[Session, list[State]]:
    states: list[State] = []
    s = Session(cfg or config(), Facts(), rng=random.Random(0), on_state=lambda st, why: states.append(st))
    s.first_launch()
    s.launching()
    s.healthy({}, 5.0)
    return s, states


def _walk_unhealthy_then(end: str) -> list[State]:
    s, states = _serving(config(**{"backoff.crash_loop_limit": 2}))
    s.unhealthy("HTTP 500")
    if end == "recovers":
        s.recovered()
    elif end == "stop":
        s.stopping("signal")
    elif end == "restart":
        s.restart(reset=False)
    else:       # hung: the watcher ends the launch; relaunched at once, then after a backoff, then a crash loop
        s.ended(died(Kind.ENGINE_DEAD, 30.0))
        for _ in range(2):
            s.launching()
            s.healthy({}, 5.0)
            s.unhealthy("HTTP 500")
            s.ended(died(Kind.ENGINE_DEAD, 30.0))
    return states


def _walk_healthy_then(end: str) -> list[State]:
    s, states = _serving()
    s.restart(reset=False) if end == "restart" else s.stopping("signal")
    return states


def _walk_restart_during_backoff() -> list[State]:
    states: list[State] = []
    s = Session(config(), Facts(), rng=random.Random(0), on_state=lambda st, why: states.append(st))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.ENGINE_DEAD))
    s.restart(reset=True)
    return states


WALKS = [
    lambda: _walk_unhealthy_then("recovers"), lambda: _walk_unhealthy_then("stop"),
    lambda: _walk_unhealthy_then("restart"), lambda: _walk_unhealthy_then("hung"),
    lambda: _walk_healthy_then("restart"), lambda: _walk_healthy_then("stop"), _walk_restart_during_backoff]


def test_every_edge_of_the_lifecycle_is_taken() -> None:
    """The scenarios above and a few walks through probe failures take every edge of the table:
    an edge nothing takes would be dead weight (or a missing scenario)."""
    paths = []
    for s in SCENARIOS:
        session, _, states = play(s)
        if session.state is not State.FAILED:
            session.stopping("stop")
        paths.append(states + [State.STOPPING, State.STOPPED])
    paths += [walk() for walk in WALKS]
    paths.append([State.STOPPING])              # a stop before the first launch
    taken = {(a, b) for path in paths for a, b in zip([State.PLANNING] + path, path) if a is not b}
    table = {(a, b) for a, ends in TRANSITIONS.items() for b in ends}
    assert table - taken == set(), "edges no scenario takes"
    assert taken <= table


def test_probes_that_fail_then_pass_move_between_healthy_and_unhealthy() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.healthy({}, 5.0)
    s.unhealthy("HTTP 500")
    assert s.state is State.UNHEALTHY
    s.recovered()
    assert s.state is State.HEALTHY


def test_a_restart_asked_during_backoff_skips_the_wait() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    step = s.ended(fail(Kind.ENGINE_DEAD))
    assert isinstance(step, Launch) and step.delay > 0 and s.state is State.BACKOFF
    again = s.restart(reset=False)
    assert again.delay == 0 and s.state is State.RESTARTING and s.restarts == 1


RUNTIME_KINDS = st.sampled_from([Kind.ENGINE_DEAD, Kind.UNKNOWN_FAILURE, Kind.HEALTHY, Kind.OOM_RUNTIME,
                                  Kind.INCOMPLETE, Kind.NO_VLLM_OUTPUT])


@settings(max_examples=200, deadline=None)
@given(first=RUNTIME_KINDS, second=RUNTIME_KINDS, served=st.floats(0.0, 1e6), soon=st.floats(0.0, 599.0),
       window=st.floats(1.0, 3600.0), jitter=st.floats(0.0, 5.0), seed=st.integers(0, 2**32))
def test_the_first_relaunch_after_serving_is_immediate_and_a_crash_loop_backs_off(
        first: Kind, second: Kind, served: float, soon: float, window: float, jitter: float, seed: int) -> None:
    """Time to serve again after an engine death is vLLM's own start-up: no backoff, no jitter, for the
    first death after serving however long it served; a second death within the crash-loop window of
    becoming healthy backs off (initial 2 s, plus jitter)."""
    cfg = config("--max-num-seqs 64", **{"backoff.jitter": jitter, "backoff.crash_loop_window": window,
                                         "backoff.crash_loop_limit": 5})
    s = Session(cfg, Facts(), rng=random.Random(seed))
    s.first_launch()
    s.launching()
    s.healthy({}, 10.0)
    step = s.ended(died(first, served))
    assert isinstance(step, Launch) and step.delay == 0.0 and s.state is State.RESTARTING
    s.launching()
    s.healthy({}, 10.0)
    again = s.ended(died(second, soon * window / 600.0))       # within the window
    assert isinstance(again, Launch) and 2.0 <= again.delay <= 2.0 + jitter and s.state is State.BACKOFF


def test_a_launch_that_never_served_still_backs_off_after_one_that_did() -> None:
    """Only a death after serving skips the wait: the relaunch after it failing at start-up backs off."""
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.healthy({}, 10.0)
    assert s.ended(died(Kind.ENGINE_DEAD, 120.0)).delay == 0.0
    s.launching()
    step = s.ended(fail(Kind.ENGINE_DEAD))
    assert isinstance(step, Launch) and step.delay == 2.0


def test_jitter_comes_from_the_random_source_given() -> None:
    cfg = config(**{"backoff.jitter": 1.0})
    delays = {Session(cfg, Facts(), rng=random.Random(seed)).backoff_delay(1) for seed in range(5)}
    assert len(delays) == 5 and all(2.0 <= d < 3.0 for d in delays)
    assert Session(cfg, Facts(), rng=random.Random(7)).backoff_delay(3) == \
        Session(cfg, Facts(), rng=random.Random(7)).backoff_delay(3)


def test_every_changed_flag_has_a_note_with_its_source() -> None:
    session, _, _ = play(SCENARIOS[8])          # the KV failure healed by a shorter length
    note = session.notes["--max-model-len"]
    assert (note.value, note.was, note.source) == ("30368", None, "heal") and "30368" in note.why
    learned, _, _ = play(SCENARIOS[1])
    assert learned.notes["--max-model-len"].source == "store" and learned.flags_source == "store"


def test_auto_fit_bounds_hold_vllms_choice_to_the_floor_and_the_request() -> None:
    s = Session(config("--max-model-len 8192", **{"remedies.min_model_len": 1024}), Facts(), rng=random.Random(0))
    s.first_launch()
    assert s.auto_fit_bounds() is None                   # a number: no bounds to hold
    s.current = s.current.set("--max-model-len", "auto")
    assert s.auto_fit_bounds() == (1024, 8192)
    over = s.check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache")
    assert over is not None and over.kind is Kind.AUTO_FIT_ABOVE_REQUEST
    assert s.check_auto_fit({"auto_fit_max_model_len": 4000}, "kv_cache") is None


def test_healthy_after_auto_fit_notes_vllms_choice_and_keeps_the_reason() -> None:
    s = Session(config(), on_gpus(l4(), model="Llama-3.1-8B-Instruct"), rng=random.Random(0))
    assert s.first_launch().flags.get("--max-model-len") == "auto"
    s.launching()
    h = s.healthy({"auto_fit_max_model_len": 29936}, 40.0)
    note = s.notes["--max-model-len"]
    assert note.value == "auto (29936)" and note.source == "plan"
    assert note.text.startswith("131072 tokens do not fit") and note.text.endswith("chose 29936 tokens for the KV cache")
    assert h.learn == tuple(s.current.argv())


def test_flags_this_vllm_removed_are_dropped_before_launching() -> None:
    s = Session(config("--swap-space 4 --max-model-len 8192"), Facts(vllm_version="0.20.0"), rng=random.Random(0))
    s.first_launch()
    flags, dropped = s.launching()
    assert flags.argv() == ["--max-model-len", "8192"]
    assert dropped and "removed in vLLM 0.18.0" in dropped[0]
    assert s.notes["--swap-space"].source == "version" and s.notes["--swap-space"].value is None


def test_what_the_log_says_about_vllm_replaces_what_was_guessed() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.ENGINE_DEAD, vllm_version="0.6.6", block_size=32))
    assert (s.vllm_version, s.block_size) == ("0.6.6", 32)


def test_the_busy_gpu_the_plan_saw_is_updated_between_launches() -> None:
    s = Session(config("--max-model-len 8192"), on_gpus(l4(held_gib=3.0), model="Llama-3.1-8B-Instruct"),
                rng=random.Random(0))
    s.first_launch()
    s.gpu_observed(10.0)
    assert s._context().gpu_free_gib == 10.0


@pytest.mark.parametrize("version,kept", [
    ("0.13.0", 41584),      # the KV cache's tokens are all usable: the next start keeps them all
    ("0.32.0", 41568),      # from 0.29 vLLM holds one block back (its null block): not a token more
])
def test_a_healed_length_below_what_vllm_measured_is_raised_for_the_next_start(version: str, kept: int) -> None:
    s = Session(config(), Facts(vllm_version=version), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=40000))
    s.launching()
    h = s.healthy({"kv_cache_tokens": 41584, "block_size": 16}, 30.0)
    assert h.learn is not None and Flags.parse(" ".join(h.learn)).get("--max-model-len") == str(kept)
    assert s.current.get("--max-model-len") == "40000"          # this launch keeps what it serves


# -- what a healthy launch printed sizes the next plan on this host --------------------------------
CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration"


def test_a_healthy_launchs_own_figures_size_the_next_plan_on_this_host() -> None:
    """Record 8 of the calibration set, a real start-up: Qwen3-32B on an H100 (79.18 GiB) at vLLM
    0.11, --gpu-memory-utilization 0.9; vLLM printed 61.03 GiB of weights and 4.45 GiB of KV cache,
    which holds 18224 tokens (256 KiB a token, 16-token blocks)."""
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    total = 79.18
    h100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", int(total * GiB), int(0.5 * GiB), int((total - 0.5) * GiB), (9, 0), ())
    facts = Facts(devices=(h100,), total_gib=total, free_gib=total - 0.5, vllm_version="0.11.0", model=info)
    first = Session(config("--gpu-memory-utilization 0.9 --max-model-len 16000"), facts, rng=random.Random(0))
    first.first_launch()
    first.launching()
    measured = first.healthy({"model_loading_gib": 61.03, "available_kv_gib": 4.45}, 60.0).measured
    assert measured is not None
    assert measured.overhead_bytes / GiB == pytest.approx(0.9 * total - 61.03 - 4.45, abs=0.01)   # 5.78 GiB

    def planned(measured_here: Any) -> int:
        """The next start asks for the whole context (40960); vLLM 0.11 has no auto-fit: the plan cuts."""
        s = Session(config("--gpu-memory-utilization 0.9"), replace(facts, measured=measured_here),
                    rng=random.Random(0))
        return int(s.first_launch().flags.get("--max-model-len"))

    real_fit = 18224
    assert planned(None) < 0.8 * real_fit                  # the estimate's band holds back a quarter
    assert 0.96 * real_fit <= planned(measured) <= real_fit  # what vLLM printed: within its run-to-run noise


def test_a_measured_overhead_holds_only_for_the_flags_that_shaped_it() -> None:
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    facts = Facts(total_gib=79.18, free_gib=78.68, vllm_version="0.11.0", model=info,
                  devices=(GpuDevice(0, "NVIDIA H100 80GB HBM3", int(79.18 * GiB), 0, int(79.18 * GiB), (9, 0), ()),))
    s = Session(config("--gpu-memory-utilization 0.9 --max-num-seqs 512"), facts, rng=random.Random(0))
    s.first_launch()
    s.launching()
    measured = s.healthy({"model_loading_gib": 61.03, "available_kv_gib": 4.45}, 60.0).measured
    assert measured is not None and ("--max-num-seqs", "512") in measured.under
    again = Session(config("--gpu-memory-utilization 0.9"), replace(facts, measured=measured), rng=random.Random(0))
    assert again.sizing is not None
    fit = again.sizing.fit(Flags.parse("--gpu-memory-utilization 0.9"), total_bytes=int(79.18 * GiB), free_bytes=None)
    # another batch: the estimated overhead (with the weights vLLM printed, which hold for any batch)
    estimate = replace(again.sizing, measured_overhead_bytes=None)
    assert fit == estimate.fit(Flags.parse("--gpu-memory-utilization 0.9"), total_bytes=int(79.18 * GiB),
                               free_bytes=None)
    same = again.sizing.fit(Flags.parse("--gpu-memory-utilization 0.9 --max-num-seqs 512"),
                            total_bytes=int(79.18 * GiB), free_bytes=None)
    assert int(same.flags["--max-model-len"]) > int(fit.flags["--max-model-len"])   # the same batch: measured


def test_no_measurement_on_the_cpu_build_or_without_vllms_figures() -> None:
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    s = Session(config(), Facts(platform="cpu", cpu_kv_space_gib=1.0, model=info), rng=random.Random(0))
    s.first_launch()
    s.launching()
    assert s.healthy({"model_loading_gib": 61.03, "kv_cache_tokens": 65536}, 20.0).measured is None
    g = Session(config(), Facts(total_gib=79.18, vllm_version="0.11.0", model=info), rng=random.Random(0))
    g.first_launch()
    g.launching()
    assert g.healthy({"available_kv_gib": 4.45}, 20.0).measured is None     # no "Model loading took"
