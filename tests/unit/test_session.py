"""The session as a specification: (facts, what each launch did) -> the guard's next step.

Each scenario reads "with <flags> and <facts>, after <launch results>, the guard <steps>", and
every step is written out whole: a launch (:class:`Go`) with all its flags, why, the delay, the
reason it answers and the remedy step taken, or giving up (:class:`Quit`) with the exit code, the
reason, the advice and the kind. Nothing is compared by prefix: a reset that relaunches the healed
flags, a backoff that is skipped or a length cut to another number fails its scenario. The
expectations come from the README's promises and the settings' defaults (backoff 2 s doubling to
120 s, 6 launches, 5 quick deaths in 600 s, 3 port retries), vLLM's own rules (the 16-token
block, auto-fit from 0.14, utilization 0.92 from 0.20) and, where the plan sizes a length, the
arithmetic on what vLLM printed in the calibration records, written out beside the scenario.

The session is pure, so every scenario runs in microseconds with a seeded random source; the
states it passes through are recorded too, and every edge of the lifecycle table must be taken by
some scenario.
"""

from __future__ import annotations

import math
import random
import re
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
from supervisor.core.session import (
    DIED,
    FAILED,
    RESET,
    RESTART,
    STOPPED,
    End,
    Facts,
    Healthy,
    Launch,
    Learned,
    Outcome,
    Session,
)
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


def l4(held_gib: float = 0.0, index: int = 0) -> GpuDevice:
    total = int(22.06 * GiB)
    return GpuDevice(index, "NVIDIA L4", total, int(held_gib * GiB), total - int(held_gib * GiB), (8, 9), ())


def on_gpus(*devices: GpuDevice, model: str | None = None, version: str | None = "0.32.0") -> Facts:
    d = min(devices, key=lambda x: x.free_bytes)
    return Facts(devices=devices, free_gib=d.free_bytes / GiB, total_gib=d.total_bytes / GiB, vllm_version=version,
                 model=load_model_info(str(MODELS / model)) if model else None)


class Within:
    """A number the scenario holds to a band it works out itself (the arithmetic is in its comment)."""

    def __init__(self, lo: float, hi: float, multiple: int = 1) -> None:
        self.lo, self.hi, self.multiple = lo, hi, multiple

    def __eq__(self, other: object) -> bool:
        try:
            n = int(str(other))
        except ValueError:
            return False
        return self.lo <= n <= self.hi and n % self.multiple == 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<a multiple of {self.multiple} in [{self.lo:.0f}, {self.hi:.0f}]>"


class Pattern:
    """Text that must match ``regex`` whole (only where a number in it is held by :class:`Within`)."""

    def __init__(self, regex: str, **numbers: Within) -> None:
        self.regex, self.numbers = regex, numbers

    def __eq__(self, other: object) -> bool:
        m = re.fullmatch(self.regex, str(other))
        return m is not None and all(m.group(k) == want for k, want in self.numbers.items())

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<text matching {self.regex!r} with {self.numbers}>"


@dataclass(frozen=True)
class Go:
    """A launch, the whole decision: every flag, why, the delay, the reason and the remedy step."""

    flags: tuple[Any, ...]
    why: Any
    delay: float = 0.0
    reason: str = "first"
    step: str = ""
    changes: tuple[tuple[Any, ...], ...] = ()      # (flag, what it was, what it is now)
    forget_learned: bool = False


@dataclass(frozen=True)
class Quit:
    """Giving up: the exit code, the reason, the advice and the failure kind."""

    exit_code: int
    reason: str
    advice: str
    kind: Kind


STOP = "stop"             # the session answers None: the guard was asked to stop


def decision(step: Launch | End | None) -> Go | Quit | str:
    """A step as the scenario table writes it, every field of it."""
    if step is None:
        return STOP
    if isinstance(step, End):
        return Quit(step.exit_code, step.reason, step.advice, step.kind)
    return Go(tuple(step.flags.argv()), step.why, step.delay, step.reason, step.step,
              tuple((c.flag, c.old, c.new) for c in step.changes), step.forget_learned)


@dataclass(frozen=True)
class Scenario:
    name: str
    cfg: GuardConfig = field(default_factory=config)
    facts: Facts = field(default_factory=Facts)
    outcomes: tuple[Outcome, ...] = ()
    first: Go | None = None               # the first launch
    steps: tuple[Go | Quit | str, ...] = ()   # the step after each outcome
    healthy_after: int | None = None      # the launch (1-based) that became healthy before its outcome


AS_GIVEN = "no config.json found for the model: the flags as given"
DIED_AGAIN = "the engine died ({}); relaunching with the last good flags"
PORT = "the port is in use; the previous holder may be exiting"
REFUSED = "vLLM refused its configuration: "
BUDGET = "see the diagnosis above; raise --max-launches to keep trying"
CRASHING = "look at the vLLM output above; the engine keeps crashing"


def kv_heal(fit: int, asked: int = 131072) -> str:
    return (f"the KV cache holds about {fit} tokens (vLLM's estimate), not {asked}; "
            f"{fit // 16 * 16} is that, aligned down to the 16-token block")


# Llama-3.1-8B on an L4 (22.06 GiB) with vLLM 0.10.2's defaults (utilization 0.90, V1, 256 sequences
# on a GPU under 70 GiB), from what vLLM printed in the calibration records (benchmarks/calibration):
#   budget      0.90 x 22.06                                   = 19.854 GiB
#   weights     "Model loading took 14.99 GiB" (record 5)       = 14.99
#   non-torch   0.13 GiB at TP 1 (records 5, 6, 8)              =  0.13
#   activation  the dummy sampler's logits scale with its rows: 4.76 GiB at 1024 rows (record 5),
#               so 4.76 x 256 / 1024                            =  1.19
#   KV cache    19.854 - 14.99 - 0.13 - 1.19                    =  3.544 GiB
#   tokens      3.544 GiB / 131072 B a token (32 layers x 8 KV heads x 128 x 2 x 2 B)
#                                                               = 29032 -> 29024 in 16-token blocks
# The plan holds an error band back below its estimate: the cut is at most 29024 and no more than
# a tenth below it, in whole blocks.
FIT_0_10_L4 = 29024
CUT_0_10_L4 = Within(0.9 * FIT_0_10_L4, FIT_0_10_L4, multiple=16)

SCENARIOS = [
    Scenario("no model facts: the first launch is the flags as given", config("--max-model-len 8192"),
             first=Go(("--max-model-len", "8192"), AS_GIVEN)),
    Scenario("learned flags are used first", config("--max-model-len 32768"),
             Facts(learned=Learned({"--max-model-len": "30368"}, "2026-11-29", {"--max-model-len": "cut"})),
             first=Go(("--max-model-len", "30368"), "using the flags learned on 2026-11-29", reason="learned")),
    Scenario("learned flags that fail are forgotten: the flags as given again, and that counts as a launch",
             config("--max-model-len 32768"), Facts(learned=Learned({"--max-model-len": "30368"})),
             (fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=30368, fit_max_model_len=20000),),
             first=Go(("--max-model-len", "30368"), "using the flags learned on an earlier start", reason="learned"),
             steps=(Go(("--max-model-len", "32768"),
                       f"the learned flags failed (kv_cache_insufficient); forgetting them: {AS_GIVEN}",
                       reason="learned_failed", forget_learned=True),)),
    Scenario("a reset after a start from learned flags: the user's own flags, and the learned ones are dropped",
             config("--max-model-len 32768"), Facts(learned=Learned({"--max-model-len": "30368"}, "2026-11-29")),
             (Outcome(RESET),),
             first=Go(("--max-model-len", "30368"), "using the flags learned on 2026-11-29", reason="learned"),
             steps=(Go(("--max-model-len", "32768"), "restart requested: back to the flags you asked for",
                       reason="reset", forget_learned=True),)),
    Scenario("plan.auto_fit on vLLM 0.14+: vLLM sizes the length", config(**{"plan.auto_fit": True}),
             Facts(vllm_version="0.14.0"),
             first=Go(("--max-model-len", "auto"), "--max-model-len auto (plan.auto_fit)")),
    Scenario("plan.auto_fit on vLLM 0.13, which has no auto: the flags as given", config(**{"plan.auto_fit": True}),
             Facts(vllm_version="0.13.0"), first=Go((), AS_GIVEN)),
    Scenario("plan.auto_fit on an unknown vLLM: no flag it may not know", config(**{"plan.auto_fit": True}),
             first=Go((), AS_GIVEN)),
    Scenario("plan.auto_fit leaves a length the user set alone",
             config("--max-model-len 8192", **{"plan.auto_fit": True}), Facts(vllm_version="0.14.0"),
             first=Go(("--max-model-len", "8192"), AS_GIVEN)),
    # vLLM 0.20+ defaults to utilization 0.92 (vllm/config/cache.py); 2048 is --min-model-len's default
    # and 131072 the model's own context (config.json): the bounds auto is held to.
    Scenario("the plan cuts 131072 to vLLM's own measurement on a 24 GB card (0.32: auto)", config(),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct"),
             first=Go(("--max-model-len", "auto"), Pattern(
                 r"planned first launch: --max-model-len auto \(131072 tokens do not fit in the KV cache at "
                 r"utilization 0\.92; about (?P<estimate>\d+) by the plan's estimate, so vLLM sizes the length "
                 r"to the KV cache it measures \(auto\), held between 2048 and 131072\)",
                 estimate=Within(0.8 * FIT_0_10_L4, 1.35 * FIT_0_10_L4)),
                 changes=(("--max-model-len", None, "auto"),))),
    Scenario("the plan cuts to a number before 0.14 (no auto-fit)", config(),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct", version="0.10.2"),
             first=Go(("--max-model-len", CUT_0_10_L4), Pattern(
                 r"planned first launch: --max-model-len (?P<cut>\d+) \(131072 tokens do not fit in the KV cache "
                 r"at utilization 0\.90; about (?P<estimate>\d+) by the plan's estimate, (?P=cut) with its error "
                 r"band held back \(block-aligned\)\)",
                 cut=CUT_0_10_L4, estimate=Within(0.97 * FIT_0_10_L4, 1.03 * FIT_0_10_L4)),
                 changes=(("--max-model-len", None, CUT_0_10_L4),))),
    Scenario("--no-plan: the flags as given even when the plan would cut", config(**{"plan.enabled": False}),
             on_gpus(l4(), model="Llama-3.1-8B-Instruct"),
             first=Go((), "planning is off (--no-plan): the flags as given")),
    Scenario("a KV cache too small: the length vLLM says fits, in one relaunch", config(),
             outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368),),
             first=Go((), AS_GIVEN),
             steps=(Go(("--max-model-len", "30368"), kv_heal(30368), reason="kv_cache_insufficient",
                       step="max_model_len", changes=(("--max-model-len", None, "30368"),)),)),
    Scenario("a KV estimate off the block is aligned down to it: 30370 -> 30368", config(),
             outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30370),),
             first=Go((), AS_GIVEN),
             steps=(Go(("--max-model-len", "30368"), kv_heal(30370), reason="kv_cache_insufficient",
                       step="max_model_len", changes=(("--max-model-len", None, "30368"),)),)),
    # backoff: initial 2 s x multiplier 2 per attempt, no jitter here (backoff.jitter=0)
    Scenario("an unknown failure at start-up: the same flags after backoff, until the launch budget is spent",
             config("--max-model-len 8192", max_launches=3),
             outcomes=(fail(Kind.UNKNOWN_FAILURE, "KeyError: 'x'"),) * 3,
             first=Go(("--max-model-len", "8192"), AS_GIVEN),
             steps=(Go(("--max-model-len", "8192"), DIED_AGAIN.format("unknown_failure"), 2.0, "unknown_failure",
                       "restart"),
                    Go(("--max-model-len", "8192"), DIED_AGAIN.format("unknown_failure"), 4.0, "unknown_failure",
                       "restart"),
                    Quit(75, "3 launches in a row failed without becoming healthy "
                             "(last: unknown_failure: KeyError: 'x')",
                         BUDGET, Kind.UNKNOWN_FAILURE))),
    Scenario("the launch budget at its default: 6 launches that never serve, then exit 75",
             outcomes=(fail(Kind.ENGINE_DEAD, "EngineDeadError"),) * 6, first=Go((), AS_GIVEN),
             steps=tuple(Go((), DIED_AGAIN.format("engine_dead"), delay, "engine_dead", "restart")
                         for delay in (2.0, 4.0, 8.0, 16.0, 32.0))
             + (Quit(75, "6 launches in a row failed without becoming healthy (last: engine_dead: EngineDeadError)",
                     BUDGET, Kind.ENGINE_DEAD),)),
    # issue 21 item 6: the first death after serving is relaunched at once; backoff is for crash loops
    Scenario("the engine dies soon after serving: relaunched at once, then backoff grows, then failed at the "
             "crash-loop limit", config(**{"backoff.crash_loop_limit": 2}),
             outcomes=(died(Kind.ENGINE_DEAD, 30.0),) * 3,
             first=Go((), AS_GIVEN),
             steps=(Go((), DIED_AGAIN.format("engine_dead"), 0.0, "engine_dead", "restart"),
                    Go((), DIED_AGAIN.format("engine_dead"), 2.0, "engine_dead", "restart"),
                    Quit(75, "vLLM died 3 times in a row soon after becoming healthy "
                             "(last: engine_dead: engine_dead while serving)", CRASHING, Kind.ENGINE_DEAD)),
             healthy_after=1),
    Scenario("the crash-loop limit at its default: 5 quick deaths are relaunched, the 6th is exit 75",
             outcomes=(died(Kind.ENGINE_DEAD, 30.0),) * 6, first=Go((), AS_GIVEN),
             steps=tuple(Go((), DIED_AGAIN.format("engine_dead"), delay, "engine_dead", "restart")
                         for delay in (0.0, 2.0, 4.0, 8.0, 16.0))
             + (Quit(75, "vLLM died 6 times in a row soon after becoming healthy "
                         "(last: engine_dead: engine_dead while serving)", CRASHING, Kind.ENGINE_DEAD),),
             healthy_after=1),
    Scenario("a death after a long healthy run starts the count afresh: relaunched at once again",
             config(**{"backoff.crash_loop_limit": 1}),
             outcomes=(died(Kind.ENGINE_DEAD, 30.0), died(Kind.ENGINE_DEAD, 3600.0), died(Kind.ENGINE_DEAD, 30.0)),
             first=Go((), AS_GIVEN),
             steps=(Go((), DIED_AGAIN.format("engine_dead"), 0.0, "engine_dead", "restart"),
                    Go((), DIED_AGAIN.format("engine_dead"), 0.0, "engine_dead", "restart"),
                    Quit(75, "vLLM died 2 times in a row soon after becoming healthy "
                             "(last: engine_dead: engine_dead while serving)", CRASHING, Kind.ENGINE_DEAD)),
             healthy_after=1),
    # the crash-loop window's default is 600 s: a death at 599.9 s is quick, one at 600 s is not
    Scenario("the crash-loop window at its default: 600 s of health make a death a fresh start",
             config(**{"backoff.crash_loop_limit": 1}),
             outcomes=(died(Kind.ENGINE_DEAD, 599.9), died(Kind.ENGINE_DEAD, 600.0), died(Kind.ENGINE_DEAD, 599.9)),
             first=Go((), AS_GIVEN),
             steps=(Go((), DIED_AGAIN.format("engine_dead"), 0.0, "engine_dead", "restart"),
                    Go((), DIED_AGAIN.format("engine_dead"), 0.0, "engine_dead", "restart"),
                    Quit(75, "vLLM died 2 times in a row soon after becoming healthy "
                             "(last: engine_dead: engine_dead while serving)", CRASHING, Kind.ENGINE_DEAD)),
             healthy_after=1),
    Scenario("backoff is capped at backoff.maximum", config(**{"backoff.maximum": 5.0, "max_launches": 9}),
             outcomes=(fail(Kind.ENGINE_DEAD),) * 4, first=Go((), AS_GIVEN),
             steps=tuple(Go((), DIED_AGAIN.format("engine_dead"), delay, "engine_dead", "restart")
                         for delay in (2.0, 4.0, 5.0, 5.0))),
    Scenario("backoff at its defaults: 2 s doubling up to 120 s", config(max_launches=9),
             outcomes=(fail(Kind.ENGINE_DEAD),) * 8, first=Go((), AS_GIVEN),
             steps=tuple(Go((), DIED_AGAIN.format("engine_dead"), delay, "engine_dead", "restart")
                         for delay in (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0, 120.0))),
    Scenario("the port is in use: retried a few times, then a configuration error",
             config(**{"remedies.port_retries": 2}),
             outcomes=(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"),) * 3,
             first=Go((), AS_GIVEN),
             steps=(Go((), PORT, 2.0, "config_error", "port_retry"), Go((), PORT, 4.0, "config_error", "port_retry"),
                    Quit(78, REFUSED + "OSError: [Errno 98] Address already in use",
                         "stop the process holding the port, or give vLLM another --port", Kind.CONFIG_ERROR))),
    Scenario("the port is in use: 3 retries at the default, the 4th time a configuration error",
             outcomes=(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"),) * 4,
             first=Go((), AS_GIVEN),
             steps=(Go((), PORT, 2.0, "config_error", "port_retry"), Go((), PORT, 4.0, "config_error", "port_retry"),
                    Go((), PORT, 8.0, "config_error", "port_retry"),
                    Quit(78, REFUSED + "OSError: [Errno 98] Address already in use",
                         "stop the process holding the port, or give vLLM another --port", Kind.CONFIG_ERROR))),
    Scenario("a configuration vLLM refuses: exit 78 at once",
             outcomes=(fail(Kind.CONFIG_ERROR, "vllm: error: unrecognized arguments: --foo"),),
             first=Go((), AS_GIVEN),
             steps=(Quit(78, REFUSED + "vllm: error: unrecognized arguments: --foo",
                         "remove or correct the flag vLLM names; check it against `vllm serve --help` of the "
                         "installed version", Kind.CONFIG_ERROR),)),
    Scenario("OOM while serving: the last good flags with half the sequences, at once (it had served)",
             config("--max-num-seqs 64"), outcomes=(died(Kind.OOM_RUNTIME, 60.0),),
             first=Go(("--max-num-seqs", "64"), AS_GIVEN),
             steps=(Go(("--max-num-seqs", "32"), "CUDA ran out of memory while serving", 0.0, "oom_runtime",
                       "oom_runtime", (("--max-num-seqs", "64", "32"),)),), healthy_after=1),
    Scenario("a restart request: the current flags again, no backoff",
             config("--max-model-len 8192"), outcomes=(Outcome(RESTART),),
             first=Go(("--max-model-len", "8192"), AS_GIVEN),
             steps=(Go(("--max-model-len", "8192"), "restart requested: relaunching with the current flags",
                       reason="request"),)),
    Scenario("a restart request after a heal keeps the healed flags",
             config(), outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368),
                                 Outcome(RESTART)),
             first=Go((), AS_GIVEN),
             steps=(Go(("--max-model-len", "30368"), kv_heal(30368), reason="kv_cache_insufficient",
                       step="max_model_len", changes=(("--max-model-len", None, "30368"),)),
                    Go(("--max-model-len", "30368"), "restart requested: relaunching with the current flags",
                       reason="request"))),
    Scenario("a reset request: back to the flags the user asked for",
             config(), outcomes=(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368),
                                 Outcome(RESET)),
             first=Go((), AS_GIVEN),
             steps=(Go(("--max-model-len", "30368"), kv_heal(30368), reason="kv_cache_insufficient",
                       step="max_model_len", changes=(("--max-model-len", None, "30368"),)),
                    Go((), "restart requested: back to the flags you asked for", reason="reset",
                       forget_learned=True))),
    Scenario("asked to stop: nothing more", outcomes=(Outcome(STOPPED),), first=Go((), AS_GIVEN), steps=(STOP,)),
]


@dataclass(frozen=True)
class After:
    """Where a scenario leaves the session: the source of its flags, each changed flag's note as
    /status shows it (value, what was asked, who decided, why), and the states it passed through."""

    states: str = ""                                   # space-separated, in order
    notes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    source: str = "user"


KV_NOTE = ("30368", None, "heal", kv_heal(30368))
AFTER = {
    "no model facts: the first launch is the flags as given": After(),
    "learned flags are used first": After(notes={"--max-model-len": ("30368", "32768", "store", "cut")},
                                          source="store"),
    "learned flags that fail are forgotten: the flags as given again, and that counts as a launch":
        After("starting restarting"),
    "a reset after a start from learned flags: the user's own flags, and the learned ones are dropped":
        After("starting restarting"),
    "plan.auto_fit on vLLM 0.14+: vLLM sizes the length": After(notes={"--max-model-len": (
        "auto", None, "plan", "vLLM sizes the context to the KV cache itself (--max-model-len auto)")}, source="plan"),
    "plan.auto_fit on vLLM 0.13, which has no auto: the flags as given": After(),
    "plan.auto_fit on an unknown vLLM: no flag it may not know": After(),
    "plan.auto_fit leaves a length the user set alone": After(),
    "the plan cuts 131072 to vLLM's own measurement on a 24 GB card (0.32: auto)": After(notes={"--max-model-len": (
        "auto", None, "plan", Pattern(r"131072 tokens do not fit in the KV cache at utilization 0\.92; about \d+ by "
                                      r"the plan's estimate, so vLLM sizes the length to the KV cache it measures "
                                      r"\(auto\), held between 2048 and 131072"))}, source="plan"),
    "the plan cuts to a number before 0.14 (no auto-fit)": After(notes={"--max-model-len": (
        CUT_0_10_L4, None, "plan", Pattern(r"131072 tokens do not fit in the KV cache at utilization 0\.90; about "
                                           r"\d+ by the plan's estimate, \d+ with its error band held back "
                                           r"\(block-aligned\)"))},
        source="plan"),
    "--no-plan: the flags as given even when the plan would cut": After(),
    "a KV cache too small: the length vLLM says fits, in one relaunch": After("starting restarting",
                                                                               {"--max-model-len": KV_NOTE}),
    "a KV estimate off the block is aligned down to it: 30370 -> 30368": After(
        "starting restarting", {"--max-model-len": ("30368", None, "heal", kv_heal(30370))}),
    "an unknown failure at start-up: the same flags after backoff, until the launch budget is spent":
        After("starting backoff starting backoff starting failed"),
    "the launch budget at its default: 6 launches that never serve, then exit 75":
        After("starting backoff " * 5 + "starting failed"),
    "the engine dies soon after serving: relaunched at once, then backoff grows, then failed at the "
    "crash-loop limit":
        After("starting healthy restarting starting healthy backoff starting healthy failed"),
    "the crash-loop limit at its default: 5 quick deaths are relaunched, the 6th is exit 75":
        After("starting healthy restarting " + "starting healthy backoff " * 4 + "starting healthy failed"),
    "a death after a long healthy run starts the count afresh: relaunched at once again":
        After("starting healthy restarting starting healthy restarting starting healthy failed"),
    "the crash-loop window at its default: 600 s of health make a death a fresh start":
        After("starting healthy restarting starting healthy restarting starting healthy failed"),
    "backoff is capped at backoff.maximum": After("starting backoff " * 4),
    "backoff at its defaults: 2 s doubling up to 120 s": After("starting backoff " * 8),
    "the port is in use: retried a few times, then a configuration error":
        After("starting backoff starting backoff starting failed"),
    "the port is in use: 3 retries at the default, the 4th time a configuration error":
        After("starting backoff starting backoff starting backoff starting failed"),
    "a configuration vLLM refuses: exit 78 at once": After("starting failed"),
    "OOM while serving: the last good flags with half the sequences, at once (it had served)": After(
        "starting healthy restarting", {"--max-num-seqs": ("32", "64", "heal", "CUDA ran out of memory while serving; "
                                                        "fewer concurrent sequences need less activation memory")}),
    "a restart request: the current flags again, no backoff": After("starting restarting"),
    "a restart request after a heal keeps the healed flags": After("starting restarting starting restarting",
                                                                   {"--max-model-len": KV_NOTE}),
    "a reset request: back to the flags the user asked for": After("starting restarting starting restarting"),
    "asked to stop: nothing more": After("starting"),
}


def where(session: Session, states: list[State]) -> After:
    return After(" ".join(s.value for s in states),
                 {k: (n.value, n.was, n.source, n.why) for k, n in session.notes.items()}, session.flags_source)


def named(name: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name)


def play(s: Scenario) -> tuple[Session, list[Go | Quit | str], list[State]]:
    states: list[State] = []
    session = Session(s.cfg, s.facts, rng=random.Random(0), on_state=lambda st, why: states.append(st))
    said = [decision(session.first_launch())]
    for n, outcome in enumerate(s.outcomes, 1):
        session.launching()
        if s.healthy_after is not None and n >= s.healthy_after and outcome.was_healthy:
            session.healthy({}, 10.0)
        said.append(decision(session.ended(outcome)))
    return session, said, states


@pytest.mark.parametrize("s", SCENARIOS, ids=lambda s: s.name)
def test_scenario(s: Scenario) -> None:
    """Every step of the scenario, whole: the flags, why, the delay, the reason, the remedy step; then
    the notes /status shows, where the flags came from and the states passed through."""
    session, said, states = play(s)
    assert said == [s.first, *s.steps]
    want = AFTER[s.name]
    assert where(session, states) == replace(want, states=" ".join(want.states.split()))


def test_every_scenario_says_where_it_leaves_the_session():
    assert set(AFTER) == {s.name for s in SCENARIOS}


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
    taken = {(a, b) for path in paths for a, b in zip([State.PLANNING] + path, path, strict=False) if a is not b}
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
    session, _, _ = play(named("a KV cache too small: the length vLLM says fits, in one relaunch"))
    note = session.notes["--max-model-len"]
    assert (note.value, note.was, note.source) == ("30368", None, "heal") and "30368" in note.why
    learned, _, _ = play(named("learned flags are used first"))
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
    assert note.text.startswith("131072 tokens do not fit")
    assert note.text.endswith("chose 29936 tokens for the KV cache")
    assert h.learn == {"--max-model-len": "auto"}              # what the guard changed, not a command line


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
    assert h.learn == {"--max-model-len": str(kept)}
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
    measured = first.healthy({"model_loading_gib": 61.03, "kv_available_gib": 4.45}, 60.0).measured
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
    measured = s.healthy({"model_loading_gib": 61.03, "kv_available_gib": 4.45}, 60.0).measured
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
    assert g.healthy({"kv_available_gib": 4.45}, 20.0).measured is None     # no "Model loading took"


# -- what each decision says, and what the session keeps (each value written out) -------------------
def test_each_state_change_says_why() -> None:
    """systemd's STATUS= line and the log show the state with its reason: each one, exactly."""
    seen: list[tuple[str, str]] = []
    s = Session(config(**{"remedies.port_retries": 0}), Facts(), rng=random.Random(0),
                on_state=lambda st, why: seen.append((st.value, why)))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368))
    s.launching()
    s.healthy({}, 5.0)
    s.unhealthy("HTTP 500 from /v1/chat/completions")
    s.recovered()
    s.ended(died(Kind.ENGINE_DEAD, 30.0))          # the first death after serving: at once (issue 21 item 6)
    s.launching()
    s.healthy({}, 5.0)
    s.ended(died(Kind.ENGINE_DEAD, 30.0))          # a second one soon after: a crash loop, backoff
    s.restart(reset=False)
    s.launching()
    s.ended(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"))
    s.stopping("gave up")
    s.stopped("gave up")                   # already stopping: only the move to stopped is told
    assert seen == [
        ("starting", "launch 1"),
        ("restarting", "kv_cache_insufficient; relaunching with new flags"),
        ("starting", "launch 2"),
        ("healthy", "launch 2 serves"),
        ("unhealthy", "HTTP 500 from /v1/chat/completions"),
        ("healthy", "probes pass again"),
        ("restarting", "engine_dead after serving; relaunching at once"),
        ("starting", "launch 3"),
        ("healthy", "launch 3 serves"),
        ("backoff", "engine_dead; retrying in 2.0 s"),
        ("restarting", "restart requested"),
        ("starting", "launch 4"),
        ("failed", "vLLM refused its configuration: OSError: [Errno 98] Address already in use"),
        ("stopping", "gave up"),
        ("stopped", "gave up"),
    ]
    assert (s.launches, s.restarts, s.state) == (4, 1, State.STOPPED)


def test_learned_flags_that_fail_say_so_in_the_state_and_count_the_failure() -> None:
    seen: list[tuple[str, str]] = []
    s = Session(config("--max-model-len 32768", max_launches=2), Facts(learned=Learned({"--max-model-len": "30368"})),
                rng=random.Random(0), on_state=lambda st, why: seen.append((st.value, why)))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.ENGINE_DEAD, "EngineDeadError"))
    assert seen[-1] == ("restarting", "learned flags failed; re-planning")
    assert (s.flags_source, s.notes, s.current.argv()) == ("user", {}, ["--max-model-len", "32768"])
    s.launching()
    end = s.ended(fail(Kind.ENGINE_DEAD, "EngineDeadError"))  # the learned launch counted: 2 of 2
    assert isinstance(end, End) and end.exit_code == 75 and end.reason.startswith("2 launches in a row failed")


def test_a_stop_when_already_stopping_is_no_second_state_change() -> None:
    seen: list[str] = []
    s = Session(config(), Facts(), rng=random.Random(0), on_state=lambda st, why: seen.append(st.value))
    s.stopping("signal")
    s.stopping("signal again")
    s.stopped("signal")
    assert seen == ["stopping", "stopped"]


def test_the_last_failures_evidence_is_cut_at_200_characters() -> None:
    s = Session(config(max_launches=1), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    end = s.ended(fail(Kind.UNKNOWN_FAILURE, "E" * 250))
    assert isinstance(end, End)
    assert end.reason == f"1 launches in a row failed without becoming healthy (last: unknown_failure: {'E' * 200})"
    assert end.message == (f"giving up: {end.reason}. What could help: see the diagnosis above; raise "
                           "--max-launches to keep trying.")


def test_the_crash_loop_as_status_shows_it() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    assert s.crash_loop() == {"runtime_deaths": 0, "limit": 5}
    s.first_launch()
    s.launching()
    s.healthy({}, 5.0)
    s.ended(died(Kind.ENGINE_DEAD, 30.0))
    assert s.crash_loop() == {"runtime_deaths": 1, "limit": 5}


@pytest.mark.parametrize("attempt,base", [(1, 2.0), (2, 4.0), (3, 8.0), (7, 120.0), (30, 120.0)])
def test_backoff_is_tenacitys_exponential_capped_plus_jitter_from_the_random_source(attempt: int, base: float) -> None:
    """Defaults: 2 s x 2^(attempt-1), at most 120 s, plus up to 1 s of jitter drawn from the source given."""
    jitter = random.Random(7).uniform(0, 1.0)
    assert Session(config(**{"backoff.jitter": 1.0}), Facts(), rng=random.Random(7)).backoff_delay(attempt) == \
        base + jitter


def test_the_jitter_may_push_a_capped_delay_past_the_maximum_but_never_the_base() -> None:
    cfg = config(**{"backoff.jitter": 3.0, "backoff.maximum": 10.0})
    assert Session(cfg, Facts(), rng=random.Random(1)).backoff_delay(9) == 10.0 + random.Random(1).uniform(0, 3.0)


@pytest.mark.parametrize("code,text", [
    (None, "vLLM is still running"),
    (0, "vLLM exited with code 0"),
    (1, "vLLM exited with code 1"),
    (-9, "vLLM was killed by SIGKILL: a SIGKILL vllm-guard did not send: the kernel's OOM killer (host memory) is "
         "the likely cause; `journalctl -k | grep -i oom` or `dmesg` shows it"),
    (-11, "vLLM was killed by SIGSEGV: a crash in native code (a CUDA kernel, a driver or a library mismatch)"),
    (-15, "vLLM was killed by SIGTERM"),
])
def test_the_childs_exit_in_words(code: int | None, text: str) -> None:
    from supervisor.core.session import exit_detail
    assert exit_detail(Outcome(FAILED, exit_code=code)) == text


def test_measured_figures_round_trip_through_the_state_dir_shape() -> None:
    from supervisor.core.session import Measured
    m = Measured(6_200_000_000, 65_000_000_000, (("--enforce-eager", None), ("--max-num-seqs", "512")))
    d = m.to_dict()
    assert d == {"overhead_bytes": 6_200_000_000, "weights_bytes": 65_000_000_000,
                 "under": [["--enforce-eager", None], ["--max-num-seqs", "512"]]}
    assert Measured.from_dict(d) == m
    assert Measured.from_dict({"overhead_bytes": 0, "weights_bytes": 0, "under": [[7, 8]]}) == \
        Measured(0, 0, (("7", "8"),))


@pytest.mark.parametrize("bad", [
    None, 5, "x", [], {}, {"overhead_bytes": 1, "weights_bytes": 2},
    {"overhead_bytes": 1, "under": []}, {"weights_bytes": 2, "under": []},
    {"overhead_bytes": "1", "weights_bytes": 2, "under": []}, {"overhead_bytes": 1, "weights_bytes": 2.5, "under": []},
    {"overhead_bytes": True, "weights_bytes": 2, "under": []},
    {"overhead_bytes": 1, "weights_bytes": False, "under": []},
    {"overhead_bytes": -1, "weights_bytes": 2, "under": []}, {"overhead_bytes": 1, "weights_bytes": -2, "under": []},
    {"overhead_bytes": 1, "weights_bytes": 2, "under": 5}, {"overhead_bytes": 1, "weights_bytes": 2, "under": [[1]]},
    {"overhead_bytes": 1, "weights_bytes": 2, "under": [[1, 2, 3]]},
])
def test_measured_figures_of_any_other_shape_are_none(bad: Any) -> None:
    from supervisor.core.session import Measured
    assert Measured.from_dict(bad) is None


def test_zero_is_a_measured_figure_too() -> None:
    from supervisor.core.session import Measured
    assert Measured.from_dict({"overhead_bytes": 0, "weights_bytes": 0, "under": []}) == Measured(0, 0, ())


@pytest.mark.parametrize("flags,numbers,version,want", [
    # the flag is what is served; the user's flag what was asked; KV tokens less the null block from 0.29
    ("--max-model-len 8192", {"kv_cache_tokens": 41584}, "0.32.0", {"served": 8192, "requested": 8192, "fit": 41568}),
    ("--max-model-len 8192", {"kv_cache_tokens": 41584}, "0.28.0", {"served": 8192, "requested": 8192, "fit": 41584}),
    # no flag: vLLM's own choice (auto-fit), else the length it printed it serves
    ("", {"auto_fit_max_model_len": 29936, "served_max_model_len": 131072}, "0.32.0",
     {"served": 29936, "requested": 131072, "fit": None}),
    ("", {"served_max_model_len": 32768}, "0.10.2", {"served": 32768, "requested": 32768, "fit": None}),
    # V0 prints blocks, not tokens: 2599 blocks of 16
    ("", {"num_gpu_blocks": 2599, "served_max_model_len": 32768}, "0.6.3",
     {"served": 32768, "requested": 32768, "fit": 2599 * 16}),
    # tokens win over blocks when both are printed
    ("", {"kv_cache_tokens": 1000, "num_gpu_blocks": 2599}, "0.10.2", {"served": None, "requested": None, "fit": 1000}),
    # less than one block after the null block: nothing fits (not a negative length)
    ("", {"kv_cache_tokens": 10}, "0.32.0", {"served": None, "requested": None, "fit": 0}),
    ("", {"kv_cache_tokens": 0}, "0.32.0", {"served": None, "requested": None, "fit": None}),
])
def test_the_context_served_asked_and_that_fits(flags: str, numbers: dict[str, Any], version: str,
                                                want: dict[str, Any]) -> None:
    s = Session(config(flags), Facts(vllm_version=version), rng=random.Random(0))
    s.first_launch()
    assert s.context(numbers) == want


def test_the_context_on_the_cpu_build_counts_its_128_token_blocks() -> None:
    s = Session(config(), Facts(platform="cpu", vllm_version="0.32.0"), rng=random.Random(0))
    s.first_launch()
    assert s.block_size == 128
    assert s.context({"num_gpu_blocks": 512}) == {"served": None, "requested": None, "fit": 512 * 128 - 128}


def test_the_requested_length_falls_back_to_the_models_own_context() -> None:
    s = Session(config(), on_gpus(l4(), model="Llama-3.1-8B-Instruct"), rng=random.Random(0))
    assert s.derived_max_model_len == 131072        # config.json's max_position_embeddings
    assert s.context({"served_max_model_len": 4096})["requested"] == 131072


def test_what_a_launch_prints_about_itself_is_kept_only_where_nothing_better_is_known() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    s.observed({"vllm_version": "0.10.2", "block_size": 32, "served_max_model_len": 32768})
    assert (s.vllm_version, s.block_size, s.derived_max_model_len) == ("0.10.2", 32, 32768)
    s.observed({"served_max_model_len": 8192})              # known now: kept
    s.observed({})                                           # nothing printed: nothing forgotten
    assert (s.vllm_version, s.block_size, s.derived_max_model_len) == ("0.10.2", 32, 32768)
    asked = Session(config("--max-model-len 4096"), Facts(), rng=random.Random(0))
    asked.first_launch()
    asked.observed({"served_max_model_len": 4096})          # the length asked is no fact about the model
    assert asked.derived_max_model_len is None


def test_a_dropped_flag_is_said_and_noted_and_each_launch_counted() -> None:
    s = Session(config("--swap-space 4 --max-model-len 8192"), Facts(vllm_version="0.20.0"), rng=random.Random(0))
    s.first_launch()
    assert s.launches == 0
    flags, dropped = s.launching()
    why = "--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)"
    assert (flags.argv(), dropped, s.launches) == (["--max-model-len", "8192"],
                                                   [f"dropping --swap-space from the vLLM arguments: {why}"], 1)
    note = s.notes["--swap-space"]
    assert (note.value, note.was, note.why, note.source) == (None, "4", why, "version")
    assert s.launching() == (flags, []) and s.launches == 2


def test_a_healed_flag_notes_what_the_user_had_asked() -> None:
    s = Session(config("--max-num-seqs 64"), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.healthy({}, 5.0)
    s.ended(died(Kind.OOM_RUNTIME, 30.0))
    note = s.notes["--max-num-seqs"]
    assert (note.value, note.was, note.source) == ("32", "64", "heal")


def test_an_oom_while_serving_halves_the_last_good_flags_not_a_later_failed_change() -> None:
    """After a heal that served, a runtime OOM starts from the flags that served (the last good ones)."""
    s = Session(config("--max-num-seqs 64"), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30368))
    s.launching()
    s.healthy({}, 5.0)
    step = s.ended(died(Kind.OOM_RUNTIME, 30.0))
    assert isinstance(step, Launch)
    assert step.flags.argv() == ["--max-num-seqs", "32", "--max-model-len", "30368"]


def test_after_a_healthy_run_the_next_start_ups_failures_are_counted_afresh() -> None:
    s = Session(config(max_launches=2, **{"remedies.port_retries": 1}), Facts(), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"))    # one port retry used
    s.launching()
    s.healthy({}, 5.0)
    s.ended(died(Kind.ENGINE_DEAD, 3600.0))                                         # served, then died
    s.launching()
    step = s.ended(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use"))
    assert isinstance(step, Launch) and step.step == "port_retry"                   # the retry is there again
    s.launching()
    end = s.ended(fail(Kind.ENGINE_DEAD, "x"))
    assert isinstance(end, End) and end.reason.startswith("2 launches in a row failed")


def test_a_healthy_launch_learns_its_flags_only_when_learning_is_on() -> None:
    on = Session(config("--max-model-len 8192"), Facts(), rng=random.Random(0))
    on.first_launch()
    on.launching()
    assert on.healthy({}, 5.0) == Healthy({}, {}, None)     # the flags as asked served: nothing the guard changed
    off = Session(config("--max-model-len 8192", **{"plan.learn": False}), Facts(), rng=random.Random(0))
    off.first_launch()
    off.launching()
    assert off.healthy({}, 5.0).learn is None


def test_auto_fit_asked_by_the_user_is_noted_as_theirs_with_vllms_choice() -> None:
    s = Session(config("--max-model-len auto"), Facts(vllm_version="0.32.0"), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.healthy({"auto_fit_max_model_len": 40960}, 5.0)
    note = s.notes["--max-model-len"]
    assert (note.value, note.was, note.why, note.source, note.measured) == (
        "auto (40960)", "auto", "--max-model-len auto as asked", "user",
        "vLLM's auto-fit chose 40960 tokens for the KV cache")
    assert note.text == "--max-model-len auto as asked; vLLM's auto-fit chose 40960 tokens for the KV cache"


def test_without_auto_fits_choice_nothing_is_noted() -> None:
    s = Session(config("--max-model-len auto"), Facts(vllm_version="0.32.0"), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.healthy({}, 5.0)
    assert s.notes == {}
    n = Session(config("--max-model-len 4096"), Facts(vllm_version="0.32.0"), rng=random.Random(0))
    n.first_launch()
    n.launching()
    n.healthy({"auto_fit_max_model_len": 40960}, 5.0)
    assert n.notes == {}


def test_a_healed_length_that_served_everything_vllm_measured_is_kept_as_it_is() -> None:
    """Raised for the next start only when vLLM measured more than was served, and up to the ask."""
    s = Session(config("--max-model-len 40000"), Facts(vllm_version="0.13.0"), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=40000, fit_max_model_len=30000))
    s.launching()
    exact = s.healthy({"kv_cache_tokens": 30000, "block_size": 16}, 30.0)     # served what fit: nothing to raise
    assert exact.learn == {"--max-model-len": "30000"}
    assert exact.reasons["--max-model-len"] == s.notes["--max-model-len"].text
    more = s.healthy({"kv_cache_tokens": 52000, "block_size": 16}, 30.0)      # room beyond the ask: the ask
    # The next start gets the length asked, 40000: the user's own flag, so nothing the guard changed is left
    # to learn (learned.json holds only the guard's changes, applied over the user's flags).
    assert (more.learn, more.reasons) == ({}, {})
    assert s.notes["--max-model-len"].value == "30000"                        # this launch still serves 30000
    odd = s.healthy({"kv_cache_tokens": 30031, "block_size": 16}, 30.0)       # 31 tokens more: not a block more
    assert odd.learn == {"--max-model-len": "30016"} or odd.learn == {"--max-model-len": "30000"}


def test_a_measured_figure_from_a_healthy_launch_is_what_vllm_printed(
        ) -> None:
    """Record 8 (benchmarks/calibration): Qwen3-32B on an H100 at vLLM 0.11, --gpu-memory-utilization 0.9
    by default: the overhead is the share less the weights and the KV cache vLLM printed, in bytes."""
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    total = int(79.18 * GiB)
    h100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", total, 0, total, (9, 0), ())
    facts = Facts(devices=(h100,), total_gib=79.18, free_gib=79.18, vllm_version="0.11.0", model=info)
    s = Session(config("--max-num-seqs 512 --enforce-eager"), facts, rng=random.Random(0))
    s.first_launch()
    s.launching()
    m = s.healthy({"model_loading_gib": 61.03, "kv_available_gib": 4.45}, 60.0).measured
    assert m is not None
    assert m.overhead_bytes == math.ceil(total * 0.90) - int(61.03 * GiB) - int(4.45 * GiB)
    assert m.weights_bytes == int(61.03 * GiB)
    assert m.under == (("--enforce-eager", ""), ("--max-num-seqs", "512"), ("--max-num-batched-tokens", None),
                       ("--enable-chunked-prefill", None), ("--tensor-parallel-size", None),
                       ("--pipeline-parallel-size", None), ("--cpu-offload-gb", None))
    # the KV cache as tokens instead (V1's "GPU KV cache size: N tokens"): 256 KiB a token (64 layers x 8
    # KV heads x 128 x 2 x 2 bytes), 18224 tokens in 16-token blocks
    t = Session(config("--max-num-seqs 512"), facts, rng=random.Random(0))
    t.first_launch()
    t.launching()
    mt = t.healthy({"model_loading_gib": 61.03, "kv_cache_tokens": 18224}, 60.0).measured
    assert mt is not None and mt.overhead_bytes == math.ceil(total * 0.90) - int(61.03 * GiB) - 18224 * 262144
    # at 0.20+ the default share is 0.92
    facts20 = replace(facts, vllm_version="0.20.0")
    u = Session(config(), facts20, rng=random.Random(0))
    u.first_launch()
    u.launching()
    mu = u.healthy({"model_loading_gib": 61.03, "kv_available_gib": 4.45}, 60.0).measured
    assert mu is not None and mu.overhead_bytes == math.ceil(total * 0.92) - int(61.03 * GiB) - int(4.45 * GiB)


def test_a_measured_figure_follows_the_launchs_own_share_parallelism_and_kv_dtype() -> None:
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    total = int(79.18 * GiB)
    gpus = tuple(GpuDevice(i, "NVIDIA H100 80GB HBM3", total, 0, total, (9, 0), ()) for i in range(2))
    facts = Facts(devices=gpus, total_gib=79.18, free_gib=79.18, vllm_version="0.11.0", model=info)
    s = Session(config("--gpu-memory-utilization 0.8 -tp 2 --kv-cache-dtype fp8"), facts, rng=random.Random(0))
    s.first_launch()
    s.launching()
    m = s.healthy({"model_loading_gib": 30.59, "kv_cache_tokens": 100000}, 60.0).measured
    # per rank: 64 layers x (8 / 2) KV heads x 128 x 2 (K and V) x 1 byte (fp8) = 64 KiB a token
    assert m is not None
    assert m.overhead_bytes == math.ceil(total * 0.8) - int(30.59 * GiB) - 100000 // 16 * 16 * 65536


def test_no_measured_figure_without_the_gpus_total_the_weights_or_a_kv_figure() -> None:
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    base = Facts(total_gib=79.18, vllm_version="0.11.0", model=info)
    for facts, numbers in [(replace(base, total_gib=None), {"model_loading_gib": 61.03, "kv_available_gib": 4.45}),
                           (replace(base, model=None), {"model_loading_gib": 61.03, "kv_available_gib": 4.45}),
                           (base, {"model_loading_gib": 61.03}),
                           (base, {"model_loading_gib": 79.0, "kv_available_gib": 4.45})]:   # more than the share
        s = Session(config(), facts, rng=random.Random(0))
        s.first_launch()
        s.launching()
        assert s.healthy(numbers, 5.0).measured is None, (facts, numbers)


def test_the_plan_sizes_with_the_facts_the_session_was_given() -> None:
    from supervisor.core.plan import Sizing
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
    gpus = (l4(1.0, 0), l4(0.0, 1))
    facts = Facts(devices=gpus, free_gib=21.06, total_gib=22.06, vllm_version="0.32.0", model=info,
                  cpu_kv_space_gib=None)
    cfg = config("-tp 2", **{"plan.margin": 0.07, "remedies.min_model_len": 4096,
                             "remedies.utilization_margin": 0.01})
    s = Session(cfg, facts, rng=random.Random(0))
    assert s.sizing == Sizing(info, gpus=2, vllm_version="0.32.0", margin=0.07, min_model_len=4096, platform="cuda",
                              cpu_kv_space_gib=None, compute_capability=(8, 9), device_name="NVIDIA L4",
                              utilization_margin=0.01)
    cpu = Session(config(), Facts(platform="cpu", cpu_kv_space_gib=4.0, model=info), rng=random.Random(0))
    assert cpu.sizing == Sizing(info, gpus=1, vllm_version=None, margin=0.03, min_model_len=2048, platform="cpu",
                                cpu_kv_space_gib=4.0, compute_capability=None, device_name="",
                                utilization_margin=0.005)
    assert Session(config("-tp 4"), Facts(model=info), rng=random.Random(0)).sizing.gpus == 4


@pytest.mark.parametrize("cc,supported", [((8, 9), True), ((8, 6), False)])
def test_fp8_kv_is_known_supported_only_from_the_gpus_themselves(cc: tuple[int, int], supported: bool) -> None:
    """vLLM 0.11+ takes an fp8 KV cache from compute capability 8.9 (Ada) on; without GPUs: unknown."""
    dev = GpuDevice(0, "GPU", int(24 * GiB), 0, int(24 * GiB), cc, ())
    assert Session(config(), Facts(devices=(dev,), vllm_version="0.32.0"), rng=random.Random(0)).fp8_supported \
        is supported
    mixed = (dev, GpuDevice(1, "GPU", int(24 * GiB), 0, int(24 * GiB), (8, 6), ()))
    assert Session(config(), Facts(devices=mixed, vllm_version="0.32.0"), rng=random.Random(0)).fp8_supported \
        is False
    assert Session(config(), Facts(), rng=random.Random(0)).fp8_supported is None


def test_the_remedy_is_told_the_facts_and_this_runs_history() -> None:
    """What the policy decides from (remedy.Context): the facts as gathered and what happened so far."""
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
    facts = Facts(devices=(l4(),), free_gib=20.0, total_gib=22.06, vllm_version="0.10.2", model=info,
                  cpu_kv_space_gib=None)
    s = Session(config("--max-model-len 8192 --max-num-seqs 64"), facts, rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use", block_size=32))
    ctx = s._context()
    assert (ctx.gpu_free_gib, ctx.gpu_total_gib, ctx.vllm_version, ctx.block_size, ctx.derived_max_model_len,
            ctx.fp8_supported, ctx.cpu_kv_space_gib, ctx.last_good, ctx.tried, ctx.port_failures) == (
        20.0, 22.06, "0.10.2", 32, 131072, True, None, None, ("port_retry",), 1)
    assert ctx.sizing is s.sizing and ctx.rules == s.cfg.remedies and ctx.requested == s.requested
    assert [d.kind for d in ctx.previous] == [Kind.CONFIG_ERROR]
    served, _ = s.launching()
    s.healthy({}, 5.0)
    s.ended(died(Kind.ENGINE_DEAD, 30.0))
    ctx = s._context()
    assert ctx.last_good == served and ctx.last_good.get("--max-num-seqs") == "64"
    assert (ctx.tried, ctx.port_failures) == (("restart",), 0)
    assert [d.kind for d in ctx.previous] == [Kind.ENGINE_DEAD]
    cpu = Session(config(), Facts(platform="cpu", cpu_kv_space_gib=3.5), rng=random.Random(0))
    assert cpu._context().cpu_kv_space_gib == 3.5


def test_auto_fit_is_checked_against_the_phase_it_was_printed_in() -> None:
    s = Session(config("--max-model-len auto", **{"remedies.min_model_len": 4096}), Facts(vllm_version="0.32.0"),
                rng=random.Random(0))
    s.first_launch()
    low = s.check_auto_fit({"auto_fit_max_model_len": 2000}, "kv_cache")
    assert low is not None and low.kind is Kind.KV_CACHE_INSUFFICIENT and low.phase == "kv_cache"


# -- each fact reaches the decision it belongs to (written to kill the mutants scripts/mutation found) --
def test_the_models_own_context_follows_the_vllm_version_and_the_sliding_window_flag(tmp_path: Path) -> None:
    """vLLM's _get_and_verify_max_len: YaRN scales max_position_embeddings by its factor before 0.30 and
    not from 0.30; --disable-sliding-window caps the length at the window (gpt-oss-20b: 128 tokens)."""
    import json
    cfg = json.loads((MODELS / "Qwen2.5-7B-Instruct" / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    yarn = load_model_info(str(tmp_path))
    assert Session(config(), Facts(model=yarn, vllm_version="0.29.0"), rng=random.Random(0)).derived_max_model_len \
        == 32768 * 4
    assert Session(config(), Facts(model=yarn, vllm_version="0.30.0"), rng=random.Random(0)).derived_max_model_len \
        == 32768
    oss = load_model_info(str(MODELS / "gpt-oss-20b"))
    assert Session(config(), Facts(model=oss), rng=random.Random(0)).derived_max_model_len == 131072
    assert Session(config("--disable-sliding-window"), Facts(model=oss),
                   rng=random.Random(0)).derived_max_model_len == 128


@pytest.mark.parametrize("cc,version,mla,supported", [
    ((8, 6), "0.10.2", False, True),      # V0 (and V1 before 0.11 falling back to it) converts in software
    ((8, 6), "0.11.0", False, False),     # from 0.11 native e4m3 is needed: Ada (8.9) and newer
    ((8, 9), None, False, True),          # an unknown vLLM: only where every path works
    ((8, 6), None, False, False),
    ((8, 9), "0.32.0", True, False),      # fp8 MLA needs Hopper
    ((9, 0), "0.32.0", True, True),
])
def test_fp8_kv_support_is_judged_for_the_vllm_and_the_models_attention(cc: tuple[int, int], version: str | None,
                                                                         mla: bool, supported: bool) -> None:
    model = load_model_info(str(MODELS / ("DeepSeek-V2-Lite" if mla else "Llama-3.1-8B-Instruct")))
    assert model is not None and model.mla is mla
    dev = GpuDevice(0, "GPU", int(24 * GiB), 0, int(24 * GiB), cc, ())
    s = Session(config(), Facts(devices=(dev,), vllm_version=version, model=model), rng=random.Random(0))
    assert s.fp8_supported is supported


def test_learned_flags_keep_what_vllms_own_config_file_sets() -> None:
    """Flags from vLLM's --config YAML stay under the learned ones: the launch still answers for them."""
    s = Session(config("--max-model-len 32768"), Facts(learned=Learned({"--max-model-len": "30368"})),
                rng=random.Random(0))
    s.requested = Flags.parse("--max-model-len 32768", base=Flags.parse("--max-num-seqs 64"))
    launch = s._choose(use_learned=True)
    assert launch.flags.get("--max-model-len") == "30368" and launch.flags.get("--max-num-seqs") == "64"


def test_stopped_without_stopping_first_says_why_for_both() -> None:
    seen: list[tuple[str, str]] = []
    s = Session(config(), Facts(), rng=random.Random(0), on_state=lambda st, why: seen.append((st.value, why)))
    s.stopped("gave up")
    assert seen == [("stopping", "gave up"), ("stopped", "gave up")]


def test_learning_off_ignores_learned_flags() -> None:
    s = Session(config("--max-model-len 32768", **{"plan.learn": False}),
                Facts(learned=Learned({"--max-model-len": "30368"})), rng=random.Random(0))
    assert decision(s.first_launch()) == Go(("--max-model-len", "32768"), AS_GIVEN)
    assert s.flags_source == "user" and s.notes == {}


def test_a_learned_flag_without_a_stored_reason_says_where_it_came_from() -> None:
    s = Session(config("--max-model-len 32768"), Facts(learned=Learned({"--max-model-len": "30368"})),
                rng=random.Random(0))
    s.first_launch()
    note = s.notes["--max-model-len"]
    assert (note.value, note.was, note.why, note.source) == ("30368", "32768", "learned from an earlier healthy launch",
                                                             "store")


def test_a_planned_cut_of_a_length_the_user_set_notes_what_they_asked() -> None:
    s = Session(config("--max-model-len 131072"), on_gpus(l4(), model="Llama-3.1-8B-Instruct", version="0.10.2"),
                rng=random.Random(0))
    step = s.first_launch()
    assert [(c.flag, c.old, c.new) for c in step.changes] == [("--max-model-len", "131072", CUT_0_10_L4)]
    assert s.notes["--max-model-len"].was == "131072"


def test_a_plan_with_two_changes_says_both_and_an_on_flag_as_on() -> None:
    """V0 (0.6.x) profiles a cut length whole: the plan turns chunked prefill on with it (README)."""
    s = Session(config(), on_gpus(l4(), model="Llama-3.1-8B-Instruct", version="0.6.6"), rng=random.Random(0))
    step = s.first_launch()
    assert [c.flag for c in step.changes] == ["--enable-chunked-prefill", "--max-model-len"]
    chunked, length = step.changes
    assert step.why == (f"planned first launch: --enable-chunked-prefill (on) ({chunked.why}); "
                        f"--max-model-len {length.new} ({length.why})")


def test_a_plan_without_the_gpus_size_says_it_cannot_plan() -> None:
    s = Session(config(), Facts(model=load_model_info(str(MODELS / "Llama-3.1-8B-Instruct")), vllm_version="0.32.0"),
                rng=random.Random(0))
    assert decision(s.first_launch()) == Go((), "not enough facts to plan the first launch (no GPU size known); "
                                                "vllm-guard will size from vLLM's own messages")


def test_flags_that_fit_are_said_to_fit() -> None:
    s = Session(config("--max-model-len 8192"), on_gpus(l4(), model="Llama-3.1-8B-Instruct"), rng=random.Random(0))
    assert decision(s.first_launch()) == Go(("--max-model-len", "8192"), "the plan says the flags as given fit")


def test_the_failure_that_made_learned_flags_forgotten_is_remembered_for_the_remedy() -> None:
    s = Session(config("--max-model-len 32768"), Facts(learned=Learned({"--max-model-len": "30368"})),
                rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, "the KV failure", max_model_len=30368, fit_max_model_len=20000))
    assert [(d.kind, d.evidence) for d in s._context().previous] == [(Kind.KV_CACHE_INSUFFICIENT, "the KV failure")]


def test_a_measured_figure_from_v0_blocks_and_an_observed_block_size() -> None:
    """V0 prints "# GPU blocks: N"; V1 the tokens, counted in whole blocks of the block size it printed."""
    info = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    total = int(79.18 * GiB)
    facts = Facts(total_gib=79.18, free_gib=79.18, vllm_version="0.11.0", model=info)
    v0 = Session(config(), replace(facts, vllm_version="0.6.6"), rng=random.Random(0))
    v0.first_launch()
    v0.launching()
    m = v0.healthy({"model_loading_gib": 61.03, "num_gpu_blocks": 1139}, 60.0).measured
    # 1139 blocks x 16 tokens x 256 KiB a token
    assert m is not None and m.overhead_bytes == math.ceil(total * 0.90) - int(61.03 * GiB) - 1139 * 16 * 262144
    b32 = Session(config(), facts, rng=random.Random(0))
    b32.first_launch()
    b32.launching()
    m32 = b32.healthy({"model_loading_gib": 61.03, "kv_cache_tokens": 18232, "block_size": 32}, 60.0).measured
    assert m32 is not None
    assert m32.overhead_bytes == math.ceil(total * 0.90) - int(61.03 * GiB) - 18232 // 32 * 32 * 262144


def test_a_measured_overhead_of_zero_is_a_figure_but_a_negative_one_is_not() -> None:
    """10 GiB at 0.90 is 9 GiB (rounded up to the byte): 5 GiB of weights and 4 GiB of KV leave nothing."""
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
    facts = Facts(total_gib=10.0, free_gib=10.0, vllm_version="0.11.0", model=info)
    s = Session(config(**{"plan.enabled": False}), facts, rng=random.Random(0))     # the default share, 0.90
    s.first_launch()
    s.launching()
    assert math.ceil(10 * GiB * 0.9) - 5 * GiB - 4 * GiB == 0
    m = s.healthy({"model_loading_gib": 5.0, "kv_available_gib": 4.0}, 5.0).measured
    assert m is not None and m.overhead_bytes == 0
    assert s.sizing is not None and (s.sizing.measured_overhead_bytes, s.sizing.measured_weights_bytes) == (0, 5 * GiB)
    assert s.healthy({"model_loading_gib": 5.0, "kv_available_gib": 4.01}, 5.0).measured is None


def test_no_measured_figure_on_the_cpu_build_even_with_its_memory_known() -> None:
    info = load_model_info(str(MODELS / "tiny-llama-cpu"))
    s = Session(config(), Facts(platform="cpu", total_gib=9.59, vllm_version="0.32.0", model=info),
                rng=random.Random(0))
    s.first_launch()
    s.launching()
    assert s.healthy({"model_loading_gib": 0.05, "kv_available_gib": 4.0}, 5.0).measured is None


def test_a_bad_state_change_names_the_states_and_the_reason() -> None:
    from supervisor.core.lifecycle import BadTransition
    s = Session(config(), Facts(), rng=random.Random(0))
    s.stopped("signal")
    with pytest.raises(BadTransition, match=r"^stopped -> starting \(launch 1\)$"):
        s.launching()


def test_backoff_grows_by_the_multiplier_given() -> None:
    cfg = config(**{"backoff.multiplier": 3.0, "backoff.maximum": 100.0})
    assert [Session(cfg, Facts(), rng=random.Random(0)).backoff_delay(n) for n in (1, 2, 3, 4, 5)] == \
        [2.0, 6.0, 18.0, 54.0, 100.0]


def test_restarts_are_counted() -> None:
    s = Session(config(), Facts(), rng=random.Random(0))
    s.first_launch()
    for _ in range(3):
        s.launching()
        s.restart(reset=False)
    assert s.restarts == 3


def test_a_planned_length_below_what_vllm_measured_is_raised_for_the_next_start() -> None:
    """The plan's cut (source "plan", before 0.14: a number) held an error band back; vLLM printed
    the KV cache it really has, so the next start gets what fits, in whole 16-token blocks."""
    s = Session(config(), on_gpus(l4(), model="Llama-3.1-8B-Instruct", version="0.10.2"), rng=random.Random(0))
    s.first_launch()
    s.launching()
    served = s.current.get_int("--max-model-len")
    assert served is not None and s.notes["--max-model-len"].source == "plan"
    h = s.healthy({"kv_cache_tokens": 29032}, 30.0)                 # no block size printed: 16 on a GPU
    assert h.learn == {"--max-model-len": "29024"}
    assert h.reasons["--max-model-len"] == (f"vLLM measured room for 29032 tokens where {served} were served (the "
                                            "estimate held back); 29024 is kept for the next start")


def test_room_for_less_than_a_block_more_changes_nothing_for_the_next_start() -> None:
    s = Session(config(), Facts(vllm_version="0.13.0"), rng=random.Random(0))
    s.first_launch()
    s.launching()
    s.ended(fail(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30000))
    s.launching()
    h = s.healthy({"kv_cache_tokens": 30010, "block_size": 16}, 30.0)   # 30010 // 16 * 16 = 30000: as served
    assert h.learn == {"--max-model-len": "30000"}
    assert h.reasons["--max-model-len"] == s.notes["--max-model-len"].text


def test_a_plan_that_foresees_no_kv_memory_keeps_its_own_changes_and_adds_the_remedys() -> None:
    """A busy 17 GiB GPU (16 GiB free) with vLLM 0.32: the plan lowers the share under what is free
    and, foreseeing no memory left for the KV cache, takes the remedy's step (eager mode) at once."""
    total, free = int(17 * GiB), int(16 * GiB)
    dev = GpuDevice(0, "NVIDIA L4", total, total - free, free, (8, 9), ())
    facts = Facts(devices=(dev,), free_gib=16.0, total_gib=17.0, vllm_version="0.32.0",
                  model=load_model_info(str(MODELS / "Llama-3.1-8B-Instruct")))
    step = Session(config(), facts, rng=random.Random(0)).first_launch()
    assert [(c.flag, c.old) for c in step.changes] == [("--gpu-memory-utilization", None), ("--enforce-eager", None)]
    assert step.changes[1].why.startswith("no_kv_cache_memory expected: ")
    assert not step.changes[0].why.startswith("no_kv_cache_memory expected")


def test_a_measured_figure_per_pipeline_stage_and_per_kv_manager_of_the_version() -> None:
    """Per rank: -pp 2 holds half of Qwen3-32B's 64 layers (128 KiB a token); vLLM before 0.8 has no
    hybrid KV manager, so a block of gpt-oss-20b spans all 24 layers (16 tokens x 8 KV heads x 64 x
    2 x 2 bytes = 32 KiB a layer)."""
    total = int(79.18 * GiB)
    qwen = load_model_info(str(CALIBRATION / "models" / "Qwen3-32B"))
    s = Session(config("-pp 2", **{"plan.enabled": False}),
                Facts(total_gib=79.18, free_gib=79.18, vllm_version="0.11.0", model=qwen), rng=random.Random(0))
    s.first_launch()
    s.launching()
    m = s.healthy({"model_loading_gib": 30.5, "kv_cache_tokens": 16000}, 60.0).measured
    assert m is not None and m.overhead_bytes == math.ceil(total * 0.9) - int(30.5 * GiB) - 16000 * 131072
    oss = load_model_info(str(CALIBRATION / "models" / "gpt-oss-20b"))
    o = Session(config(**{"plan.enabled": False}),
                Facts(total_gib=79.18, free_gib=79.18, vllm_version="0.7.2", model=oss), rng=random.Random(0))
    o.first_launch()
    o.launching()
    mo = o.healthy({"model_loading_gib": 13.47, "num_gpu_blocks": 50000}, 60.0).measured
    assert mo is not None and mo.overhead_bytes == math.ceil(total * 0.9) - int(13.47 * GiB) - 50000 * 32768 * 24
