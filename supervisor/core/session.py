"""Every decision the guard makes, in one place: the first launch's flags and, after each launch, the next step.

Pure: no I/O, no clock, no randomness of its own (the random source for backoff jitter is passed
in). The shell gathers the facts (:class:`Facts`), runs each launch and reports how it ended
(:class:`Outcome`); the session answers with the next step: launch these flags, for these
reasons, after this delay (:class:`Launch`), or end with this exit code and this message
(:class:`End`). Crash-loop and port-retry counting, the launch budget, backoff, forgetting learned
flags that fail, the bounds held on ``--max-model-len auto`` and the flag notes shown in
``/status`` all live here, so ``vllm-guard start``, ``vllm-guard diagnose`` and the benchmark
make the same decisions by construction.

The order of a session::

    s = Session(cfg, facts, rng=random.Random())
    step = s.first_launch()           # PLANNING -> STARTING
    while isinstance(step, Launch):
        flags = s.launching()         # the flags to run now (after the version's removed flags)
        ...                            # the shell runs vLLM; s.healthy(...) when it serves
        step = s.ended(outcome)       # -> Launch(...) or End(...)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import tenacity

from supervisor.config import GuardConfig
from supervisor.core import exits, memory, remediable, remedy, vllm
from supervisor.core.classifier import check_auto_fit
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import (
    KV_CACHE_DTYPE,
    MAX_MODEL_LEN,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    Flags,
    diff,
)
from supervisor.core.gpus import GpuDevice
from supervisor.core.lifecycle import Lifecycle, State
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.core.plan import Sizing, overhead_conditions
from supervisor.core.units import GiB
from supervisor.errors import EX_TEMPFAIL

# How a launch ended (Outcome.end).
FAILED = "failed"          # never became healthy
DIED = "died"              # was healthy, then exited / lost its engine / hung
STOPPED = "stopped"        # the guard was asked to stop (signal, POST /stop)
RESTART = "restart"        # POST /restart: the same flags again
RESET = "reset"            # POST /restart?reset=1: back to the flags the user asked for


@dataclass(frozen=True)
class Measured:
    """What a healthy launch's own figures said about vLLM's memory on this host, per GPU: its
    overhead (activation, non-torch, CUDA graphs: the share less the weights and the KV cache) under
    the flags that shape it, and the weights. Later launches are sized with these, not the estimate."""

    overhead_bytes: int
    weights_bytes: int
    under: tuple[tuple[str, str | None], ...]        # plan.overhead_conditions() of that launch

    def to_dict(self) -> dict[str, Any]:
        return {"overhead_bytes": self.overhead_bytes, "weights_bytes": self.weights_bytes,
                "under": [list(pair) for pair in self.under]}

    @classmethod
    def from_dict(cls, d: Any) -> Measured | None:
        """From the state dir's JSON; None when it is not the shape :meth:`to_dict` writes."""
        try:
            under = tuple((str(k), None if v is None else str(v)) for k, v in d["under"])
            overhead, weights = d["overhead_bytes"], d["weights_bytes"]
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (overhead, weights)):
                return None
            return cls(overhead, weights, under)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Learned:
    """What the guard itself changed for an earlier healthy launch under the same conditions (from the
    state dir): flag -> value, applied over the user's own flags. Only flags the guard changes, each value
    in its type and range (:mod:`supervisor.core.remediable`), can be held: anything else is a ValueError
    here, so a planted store can never add a flag."""

    flags: Mapping[str, remediable.LearnedValue]
    saved_at: str = ""
    reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checked = {flag: remediable.accept(flag, value) for flag, value in self.flags.items()}
        object.__setattr__(self, "flags", checked)
        object.__setattr__(self, "reasons", {k: remediable.reason(v) for k, v in self.reasons.items() if k in checked})


@dataclass(frozen=True)
class Facts:
    """What the shell gathered before the first launch: the GPUs, the vLLM, the model."""

    platform: str = "cuda"                     # "cuda" | "cpu" (the CPU build of vLLM)
    devices: tuple[GpuDevice, ...] = ()        # the GPUs the launch uses ([] without NVML)
    free_gib: float | None = None              # of the device that limits the launch
    total_gib: float | None = None
    vllm_version: str | None = None
    model: ModelInfo | None = None
    cpu_kv_space_gib: float | None = None      # VLLM_CPU_KVCACHE_SPACE
    learned: Learned | None = None
    measured: Measured | None = None           # what a healthy launch printed on this host (any flags)


@dataclass(frozen=True)
class Outcome:
    """How one launch ended, as the shell saw it."""

    end: str                                   # FAILED | DIED | STOPPED | RESTART | RESET
    diagnosis: Diagnosis = field(default_factory=lambda: Diagnosis(Kind.HEALTHY))
    was_healthy: bool = False
    healthy_for: float = 0.0                   # seconds it served before it ended
    exit_code: int | None = None               # the process's own status (-N: killed by signal N)
    stopped: bool = False                      # the guard stopped it (after its failure, a hang, a request)


@dataclass(frozen=True)
class FlagNote:
    """Why a flag differs from what the user asked, and who decided it."""

    value: str | None                          # None: the flag was removed
    was: str | None                            # what the user asked (None: unset)
    why: str
    source: str                                # "plan" | "store" | "heal" | "version"
    measured: str = ""                         # what vLLM then did with it (auto-fit's choice)

    @property
    def text(self) -> str:
        """The reason with what vLLM did, one sentence."""
        return f"{self.why}; {self.measured}" if self.measured else self.why


@dataclass(frozen=True)
class Launch:
    """Launch vLLM with ``flags`` after ``delay`` seconds; ``changes`` say what changed and why."""

    flags: Flags
    changes: tuple[remedy.Change, ...] = ()
    why: str = ""
    delay: float = 0.0
    reason: str = "first"                      # the diagnosis kind it answers, or request/reset/learned
    step: str = ""                             # the remedy step taken (remedy.Relaunch.step)
    forget_learned: bool = False               # the learned flags failed: drop them from the store


@dataclass(frozen=True)
class End:
    """Stop supervising with ``exit_code``: ``reason`` says why, ``advice`` what could help."""

    exit_code: int
    reason: str
    advice: str = ""
    kind: Kind | None = None

    @property
    def message(self) -> str:
        text = f"giving up: {self.reason.rstrip('. ')}"
        if self.advice:
            text += f". What could help: {self.advice.rstrip('. ')}"
        return text + "."


@dataclass(frozen=True)
class Healthy:
    """What a launch that just became healthy means: the flags to remember, and why each differs."""

    learn: Mapping[str, remediable.LearnedValue] | None   # what the guard changed, to store (None: do not store)
    reasons: Mapping[str, str]                 # why, for each flag of ``learn``
    measured: Measured | None = None           # vLLM's memory as it printed it, kept with the flags


Step = Launch | End


class Session:
    """The decisions of one guard run; the shell drives it (see the module docstring)."""

    def __init__(self, cfg: GuardConfig, facts: Facts, *, rng: random.Random,
                 on_state: Callable[[State, str], None] | None = None) -> None:
        self.cfg = cfg
        self.facts = facts
        self.requested = cfg.requested_flags()
        self.current = self.requested
        self.notes: dict[str, FlagNote] = {}
        self.flags_source = "user"             # user | plan | store
        self.vllm_version = facts.vllm_version
        self.block_size: int | None = vllm.CPU_BLOCK_SIZE if facts.platform == "cpu" else None
        self.free_gib = facts.free_gib
        self.launches = 0                      # launches issued so far
        self.restarts = 0                      # relaunches asked for (POST /restart)
        self.runtime_deaths = 0                # deaths in a row soon after becoming healthy
        self._rng = rng
        self._on_state = on_state
        self._lifecycle = Lifecycle()
        self._learned = facts.learned
        self._bounds_of: Flags | None = None
        self._bounds: tuple[int, int | None] | None = None
        self._fails_without_health = 0
        self._tried: list[str] = []
        self._previous: list[Diagnosis] = []
        self._port_failures = 0
        self._last_good: Flags | None = None
        self._backoffs = 0
        model = facts.model
        self.derived_max_model_len = None if model is None else derive_max_model_len(
            model, facts.vllm_version, disable_sliding_window=self.requested.enabled("--disable-sliding-window"))
        self.sizing = None if model is None else Sizing(
            model, gpus=len(facts.devices) or self.requested.world_size(), vllm_version=facts.vllm_version,
            margin=cfg.plan.margin, min_model_len=cfg.remedies.min_model_len, platform=facts.platform,
            cpu_kv_space_gib=facts.cpu_kv_space_gib,
            compute_capability=facts.devices[0].compute_capability if facts.devices else None,
            device_name=facts.devices[0].name if facts.devices else "",
            utilization_margin=cfg.remedies.utilization_margin)
        if facts.measured is not None:
            self._size_with(facts.measured)
        self.fp8_supported = None if not facts.devices else all(
            vllm.fp8_kv_supported(d.compute_capability, facts.vllm_version, bool(model and model.mla))
            for d in facts.devices)

    # -- state ------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._lifecycle.state

    def _to(self, state: State, why: str = "") -> None:
        if self._lifecycle.to(state, why) and self._on_state is not None:
            self._on_state(state, why)

    # -- the first launch -------------------------------------------------------------------
    def first_launch(self) -> Launch:
        """The first launch's flags: learned ones, else vLLM's auto-fit, else the plan's, else as asked."""
        launch = self._choose(use_learned=True)
        self.current = launch.flags
        return launch

    def _choose(self, *, use_learned: bool) -> Launch:
        cfg, requested, allowed = self.cfg, self.requested, self.cfg.remedies.allowed
        learned = self._learned if cfg.plan.learn and use_learned else None
        refused = () if learned is None else remediable.refused(
            requested, remediable.apply(requested, learned.flags), allowed)
        if refused:
            # Learned under rules that allowed more: the flags were sized together, so none is kept.
            self._learned = None
            launch = self._choose(use_learned=False)
            return replace(launch, why=(f"the learned flags change {', '.join(refused)}, which remedies.allowed "
                                        f"does not allow now; forgetting them: {launch.why}"), forget_learned=True)
        if learned is not None:
            flags = remediable.apply(requested, learned.flags)
            for name, (_was, now) in diff(requested, flags).items():
                self._note(name, now, learned.reasons.get(name, "learned from an earlier healthy launch"), "store")
            self.flags_source = "store"
            return Launch(flags, why=f"using the flags learned on {learned.saved_at or 'an earlier start'}",
                          reason="learned")
        if not cfg.plan.enabled:
            return Launch(requested, why="planning is off (--no-plan): the flags as given")
        if (cfg.plan.auto_fit and not requested.has(MAX_MODEL_LEN) and vllm.auto_fit_available(self.vllm_version)
                and not remediable.refused(requested, requested.set(MAX_MODEL_LEN, "auto"), allowed)):
            self._note(MAX_MODEL_LEN, "auto", "vLLM sizes the context to the KV cache itself (--max-model-len auto)",
                       "plan")
            self.flags_source = "plan"
            return Launch(requested.set(MAX_MODEL_LEN, "auto"), why="--max-model-len auto (plan.auto_fit)")
        if self.sizing is None:
            return Launch(requested, why="no config.json found for the model: the flags as given")
        total = self.facts.total_gib
        fit = self.sizing.fit(requested, total_bytes=int(total * GiB) if total else None,
                              free_bytes=int(self.free_gib * GiB) if self.free_gib else None, allowed=allowed)
        flags, changes = requested, []
        for name, value in fit.flags.items():
            flags = flags.set(name, value)
            changes.append(remedy.Change(name, requested.get(name), flags.get(name), fit.reasons.get(name, "planned")))
        if fit.expect:
            # The plan foresees a failure no length avoids: take the remedy's step now, not after it.
            ahead = remedy.plan_ahead(fit.expect, flags, self._context())
            if ahead is not None:
                flags = ahead.flags
                changes = list(remedy.combined(changes, [replace(c, why=f"{fit.expect} expected: {c.why}")
                                                         for c in ahead.changes]))
        # The one check every launch passes: a change the rules do not allow never reaches vLLM.
        flags = remediable.within(requested, flags, allowed)
        changes = [c for c in changes if flags.get(c.flag) == c.new]
        for c in changes:
            self._note(c.flag, c.new, c.why, "plan")
        if changes:
            self.flags_source = "plan"
            why = "planned first launch: " + "; ".join(
                f"{c.flag} {c.new or '(on)'} ({c.why})" for c in changes)
        elif not fit.confident:
            why = ("not enough facts to plan the first launch (no GPU size known); vllm-guard will size from "
                   "vLLM's own messages")
        else:
            why = "the plan says the flags as given fit"
        return Launch(flags, tuple(changes), why)

    def _note(self, flag: str, value: str | None, why: str, source: str) -> None:
        self.notes[flag] = FlagNote(value, self.requested.get(flag), why, source)

    # -- each launch ------------------------------------------------------------------------
    def launching(self) -> tuple[Flags, list[str]]:
        """The flags to launch now, and why any were dropped: flags this vLLM version removed go."""
        version = vllm.parse_version(self.vllm_version)
        dropped = []
        for name in self.current.names():
            why = vllm.removed_flag(name, version)
            if why and self.current.has(name):
                self._note(name, None, why, "version")
                self.current = self.current.remove(name)
                dropped.append(f"dropping {name} from the vLLM arguments: {why}")
        self.launches += 1
        self._to(State.STARTING, f"launch {self.launches}")
        return self.current, dropped

    def auto_fit_bounds(self) -> tuple[int, int | None] | None:
        """(floor, ceiling) held on vLLM's choice when the launch uses ``--max-model-len auto``."""
        current = self.current
        if self._bounds_of is not current:      # asked for every line vLLM prints: once per set of flags
            self._bounds_of = current
            self._bounds = (self.cfg.remedies.min_model_len, self.requested.get_int(MAX_MODEL_LEN)) \
                if current.auto_length() else None
        return self._bounds

    def check_auto_fit(self, numbers: Mapping[str, Any], phase: str) -> Diagnosis | None:
        """A failure of the guard's own bounds on ``--max-model-len auto`` (None: within them, or not auto)."""
        bounds = self.auto_fit_bounds()
        if bounds is None:
            return None
        return check_auto_fit(dict(numbers), phase, floor=bounds[0], cap=bounds[1])

    def observed(self, numbers: Mapping[str, Any]) -> None:
        """What a launch printed about itself: its vLLM version, KV block size, and (when no length
        was passed) the length vLLM derived from the model's config, if the guard could not read it."""
        self.vllm_version = numbers.get("vllm_version") or self.vllm_version
        self.block_size = numbers.get("block_size") or self.block_size
        served = numbers.get("served_max_model_len")
        if self.derived_max_model_len is None and served and not self.current.has(MAX_MODEL_LEN):
            self.derived_max_model_len = int(served)

    def gpu_observed(self, free_gib: float | None) -> None:
        """The GPU's free memory read again between launches."""
        if free_gib is not None:
            self.free_gib = free_gib

    def healthy(self, numbers: Mapping[str, Any], seconds: float) -> Healthy:
        """The launch serves: note vLLM's auto-fit choice and say what to remember.

        A length the plan or a heal cut to a number (before vLLM 0.14 there is no auto-fit) may be
        an estimate; vLLM has now printed the KV cache it really has, so the flags remembered for
        the next start carry the length that really fits (up to the one asked, less the block vLLM
        holds back from 0.29): nothing left on the table next time, and no extra launch now.
        """
        self.observed(numbers)
        chosen = numbers.get("auto_fit_max_model_len")
        if chosen and self.current.auto_length():
            before = self.notes.get(MAX_MODEL_LEN)
            self.notes[MAX_MODEL_LEN] = FlagNote(
                f"auto ({chosen})", self.requested.get(MAX_MODEL_LEN),
                before.why if before else "--max-model-len auto as asked",
                before.source if before else "user", f"vLLM's auto-fit chose {chosen} tokens for the KV cache")
        self._to(State.HEALTHY, f"launch {self.launches} serves")
        reasons = {k: v.text for k, v in self.notes.items()}
        learn = self.current
        context = self.context(numbers)
        note = self.notes.get(MAX_MODEL_LEN)
        if (note is not None and note.source in ("plan", "heal") and context["fit"] and context["served"]
                and context["fit"] > context["served"] and not self.current.auto_length()
                and not (self.sizing and self.sizing.info.sliding_window)):
            block = self.block_size or vllm.default_block_size(platform=self.facts.platform)
            longer = min(context["requested"] or context["fit"], context["fit"] // block * block)
            if longer > context["served"]:
                learn = learn.set(MAX_MODEL_LEN, longer)
                reasons[MAX_MODEL_LEN] = (f"vLLM measured room for {context['fit']} tokens where {context['served']} "
                                          f"were served (the estimate held back); {longer} is kept for the next start")
        measured = self._measured(numbers)
        if measured is not None:
            self._size_with(measured)          # later relaunches of this run size with it too
        if not self.cfg.plan.learn:
            return Healthy(None, {}, measured)
        changed = remediable.changes(self.requested, learn)
        return Healthy(changed, {k: v for k, v in reasons.items() if k in changed}, measured)

    def _size_with(self, measured: Measured) -> None:
        if self.sizing is not None:
            self.sizing = replace(self.sizing, measured_overhead_bytes=measured.overhead_bytes,
                                  measured_weights_bytes=measured.weights_bytes, measured_under=measured.under)

    def _measured(self, numbers: Mapping[str, Any]) -> Measured | None:
        """vLLM's memory on this GPU from what it printed while starting ("Model loading took", the KV
        cache's GiB, blocks or tokens); None on the CPU build, without NVML's total or the figures."""
        loaded = numbers.get("model_loading_gib")
        if self.sizing is None or self.facts.platform == "cpu" or not self.facts.total_gib or loaded is None:
            return None
        kv_gib = numbers.get("kv_available_gib")
        utilization = vllm.utilization(self.vllm_version, self.current, self.facts.platform)
        overhead = memory.measured_overhead_bytes(
            gpu_total_bytes=int(self.facts.total_gib * GiB), utilization=utilization,
            weights_bytes=int(float(loaded) * GiB), available_kv_bytes=None if kv_gib is None else int(kv_gib * GiB),
            kv_cache_tokens=numbers.get("kv_cache_tokens"), num_gpu_blocks=numbers.get("num_gpu_blocks"),
            info=self.sizing.info, tp=self.current.get_int(TENSOR_PARALLEL) or 1,
            pp=self.current.get_int(PIPELINE_PARALLEL) or 1,
            kv_cache_dtype=self.current.get(KV_CACHE_DTYPE) or "auto",
            block_size=self.block_size or vllm.default_block_size(platform=self.facts.platform),
            vllm_version=self.vllm_version)
        if overhead is None or overhead < 0:
            return None
        return Measured(overhead, int(float(loaded) * GiB), overhead_conditions(self.current))

    def context(self, numbers: Mapping[str, Any]) -> dict[str, int | None]:
        """The length served, the length asked for, and the longest one vLLM's KV cache holds: the
        tokens it printed ("GPU KV cache size: N tokens", V0's blocks), less the block it holds back
        from 0.29 (its null block: 65536 tokens hold a 65408-token request on the CPU build)."""
        served = (self.current.get_int(MAX_MODEL_LEN) or numbers.get("auto_fit_max_model_len")
                  or numbers.get("served_max_model_len"))
        requested = (self.requested.get_int(MAX_MODEL_LEN) or self.derived_max_model_len
                     or numbers.get("served_max_model_len"))
        block = self.block_size or vllm.default_block_size(platform=self.facts.platform)
        tokens = numbers.get("kv_cache_tokens")
        if tokens is None and numbers.get("num_gpu_blocks"):
            tokens = int(numbers["num_gpu_blocks"]) * block
        fit = None
        if tokens:
            fit = max(0, int(tokens) - (block if vllm.holds_null_block(self.vllm_version) else 0))
        return {"served": served, "requested": requested, "fit": fit}

    def unhealthy(self, why: str) -> None:
        """Probes fail while vLLM still runs."""
        self._to(State.UNHEALTHY, why)

    def recovered(self) -> None:
        """A probe passes again."""
        self._to(State.HEALTHY, "probes pass again")

    def restart(self, reset: bool) -> Launch:
        """A restart asked for (POST /restart): the current flags, or with ``reset`` the user's, and
        the learned flags dropped from the store (else the next start would go back to them)."""
        self.restarts += 1
        if reset:
            self.current, self.notes, self.flags_source, self._learned = self.requested, {}, "user", None
        self._to(State.RESTARTING, "restart requested")
        return Launch(self.current, why="restart requested: " + (
            "back to the flags you asked for" if reset else "relaunching with the current flags"),
            reason="reset" if reset else "request", forget_learned=reset)

    def stopping(self, why: str) -> None:
        self._to(State.STOPPING, why)

    def stopped(self, why: str) -> None:
        self._to(State.STOPPING, why)
        self._to(State.STOPPED, why)

    # -- after a launch ---------------------------------------------------------------------
    def ended(self, outcome: Outcome) -> Step | None:
        """The next step after a launch ended; None when it ended because the guard was asked to stop."""
        if outcome.end == STOPPED:
            return None
        if outcome.end in (RESTART, RESET):
            return self.restart(outcome.end == RESET)
        d = outcome.diagnosis
        self.observed(d.numbers)
        if outcome.was_healthy:
            self._last_good = self.current
            self._fails_without_health, self._tried, self._previous, self._port_failures = 0, [], [], 0
            if outcome.healthy_for < self.cfg.backoff.crash_loop_window:
                self.runtime_deaths += 1
            else:
                self.runtime_deaths, self._backoffs = 1, 0
        else:
            self._fails_without_health += 1
        if self.flags_source == "store" and not outcome.was_healthy:
            return self._forget_learned(d)
        decision = remedy.decide(d, self.current, self._context())
        end = self._end_for(decision, d, outcome)
        if end is not None:
            self._to(State.FAILED, end.reason)
            return end
        assert isinstance(decision, remedy.Relaunch)
        self._tried.append(decision.step)
        self._previous.append(d)
        if decision.step == "port_retry":
            self._port_failures += 1
        for c in decision.changes:
            self.notes[c.flag] = FlagNote(c.new, self.requested.get(c.flag), c.why, "heal")
        self.current = decision.flags
        delay = 0.0
        if decision.backoff and not self.relaunch_at_once(outcome):
            self._backoffs += 1
            delay = self.backoff_delay(self._backoffs)
            self._to(State.BACKOFF, f"{d.kind}; retrying in {delay:.1f} s")
        elif decision.backoff:
            self._to(State.RESTARTING, f"{d.kind} after serving; relaunching at once")
        else:
            self._to(State.RESTARTING, f"{d.kind}; relaunching with new flags")
        return Launch(decision.flags, decision.changes, decision.why, delay, reason=d.kind.value, step=decision.step)

    def _end_for(self, decision: remedy.Decision, d: Diagnosis, outcome: Outcome) -> End | None:
        """Give up when the policy does, the launch budget is spent, or vLLM keeps dying."""
        last = f"(last: {d.kind}: {d.evidence[:200]})"
        if isinstance(decision, remedy.GiveUp):
            return End(decision.exit_code, decision.reason, decision.advice, d.kind)
        if self._fails_without_health >= self.cfg.max_launches:
            return End(EX_TEMPFAIL, f"{self._fails_without_health} launches in a row failed without becoming "
                                    f"healthy {last}", "see the diagnosis above; raise --max-launches to keep trying",
                       d.kind)
        if outcome.was_healthy and self.runtime_deaths > self.cfg.backoff.crash_loop_limit:
            return End(EX_TEMPFAIL, f"vLLM died {self.runtime_deaths} times in a row soon after becoming healthy "
                                    f"{last}", "look at the vLLM output above; the engine keeps crashing", d.kind)
        return None

    def _forget_learned(self, d: Diagnosis) -> Launch:
        """Learned flags failed before serving: drop them and plan afresh (the launch counts)."""
        self._previous.append(d)
        self.current, self.notes, self.flags_source, self._learned = self.requested, {}, "user", None
        launch = self._choose(use_learned=False)
        self.current = launch.flags
        self._to(State.RESTARTING, "learned flags failed; re-planning")
        return replace(launch, why=f"the learned flags failed ({d.kind}); forgetting them: {launch.why}",
                       reason="learned_failed", forget_learned=True)

    def relaunch_at_once(self, outcome: Outcome) -> bool:
        """A launch that served died or hung, and it is not a crash loop: relaunch without a backoff.

        Backoff is for crash loops. The first death after serving (``runtime_deaths`` is 1: no
        other launch died within ``backoff.crash_loop_window`` of becoming healthy before it, or it
        served longer than that window) is relaunched at once, so serving again takes vLLM's own
        start-up; a second death soon after serving backs off as before, and grows.
        """
        return outcome.was_healthy and self.runtime_deaths == 1

    def backoff_delay(self, attempt: int) -> float:
        """Exponential backoff with jitter (tenacity's policy) before relaunch ``attempt`` (1-based)."""
        b = self.cfg.backoff
        wait = tenacity.wait_exponential(multiplier=b.initial, max=b.maximum, exp_base=b.multiplier)
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]  # only attempt_number is read
        state.attempt_number = attempt
        return min(b.maximum, wait(state)) + self._rng.uniform(0, b.jitter)

    def _context(self) -> remedy.Context:
        """What the remedy policy knows besides a diagnosis: the facts plus this run's history."""
        f = self.facts
        return remedy.Context(
            requested=self.requested, rules=self.cfg.remedies, gpu_free_gib=self.free_gib, gpu_total_gib=f.total_gib,
            vllm_version=self.vllm_version, block_size=self.block_size,
            derived_max_model_len=self.derived_max_model_len, fp8_supported=self.fp8_supported, sizing=self.sizing,
            cpu_kv_space_gib=f.cpu_kv_space_gib, last_good=self._last_good, tried=tuple(self._tried),
            previous=tuple(self._previous), port_failures=self._port_failures, platform=f.platform)

    # -- what the shell shows ---------------------------------------------------------------
    def crash_loop(self) -> dict[str, Any]:
        return {"runtime_deaths": self.runtime_deaths, "limit": self.cfg.backoff.crash_loop_limit}


def exit_detail(outcome: Outcome) -> str:
    """The child's exit status in words, with what it usually means ("" when it exited by itself with 0)."""
    text = exits.describe(outcome.exit_code)
    hint = exits.hint(outcome.exit_code)
    return f"{text}: {hint}" if hint else text
