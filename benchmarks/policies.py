"""Relaunch policies run launch by launch against the emulator: vllm-guard and the baselines.

vllm-guard is not re-implemented: each failed launch is rendered as vLLM's real output
(:mod:`benchmarks.render`), classified by :func:`supervisor.core.classifier.Classifier`, and the next
flags come from :func:`supervisor.core.remedy.decide`, with the loop state of ``Guard._supervise``
(tried steps, previous diagnoses, at most ``max_launches`` launches). "With plan" takes the first
flags from :func:`supervisor.core.plan.first_launch` the way ``startup._choose_first_flags`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from supervisor.config import GuardConfig
from supervisor.core.classifier import Classifier, check_auto_fit
from supervisor.core.flags import Flags
from supervisor.facts.nvml import fp8_kv_supported
from supervisor.core.diagnosis import Diagnosis
from supervisor.core.model import derive_max_model_len
from supervisor.core.plan import Sizing
from supervisor.core.remedy import Context, GiveUp, decide, plan_ahead

from benchmarks.matrix import GiB, Case, model_info, model_spec
from benchmarks.render import emu, render

MAX_LAUNCHES = GuardConfig().max_launches     # 6, the guard's default; every policy gets as many
MML = "--max-model-len"
UTIL = "--gpu-memory-utilization"


@dataclass
class Launch:
    """One launch of a run: its flags, how it ended, and what the guard read from it."""

    flags: Flags
    ok: bool
    kind: str | None               # the emulator's truth (None: served)
    phase: str
    diagnosis: str | None = None   # what the classifier said (guard runs only)
    decision: str = ""             # what the policy did next


@dataclass
class Run:
    """A policy on one case, launch by launch."""

    policy: str
    launches: list[Launch] = field(default_factory=list)
    served_len: int | None = None
    gave_up: str = ""

    @property
    def healed(self) -> bool:
        return self.served_len is not None


Step = Callable[[Case, Flags, list[Launch]], "Flags | str"]   # next flags, or why it stops


def _launch(case: Case, flags: Flags) -> tuple[Launch, object]:
    r = render(model_spec(case.model, case.version), case.gpu.spec(), case.version, flags)
    return Launch(flags, r.outcome.ok, r.outcome.kind, r.outcome.phase), r


def run_baseline(case: Case, name: str, step: Step, limit: int = MAX_LAUNCHES) -> Run:
    """A policy that reads nothing from the log: it only sees that the launch failed."""
    run = Run(name)
    flags = case.requested
    while True:
        launch, r = _launch(case, flags)
        run.launches.append(launch)
        if launch.ok:
            run.served_len = r.outcome.served_max_model_len
            return run
        if len(run.launches) >= limit:
            run.gave_up = f"{limit} launches"
            return run
        nxt = step(case, flags, run.launches)
        if isinstance(nxt, str):
            run.gave_up = nxt
            return run
        launch.decision = " ".join(nxt.argv())
        flags = nxt


def _length(case: Case, flags: Flags) -> int:
    """The current length as a script would know it: the flag, else config.json's."""
    return flags.get_int(MML) or model_spec(case.model, case.version).derived_max_model_len


def plain_restart(case: Case, flags: Flags, launches: list[Launch]) -> Flags | str:
    """systemd ``Restart=always``: the same command again."""
    return flags


def halving(case: Case, flags: Flags, launches: list[Launch]) -> Flags | str:
    """Halve --max-model-len after every failure."""
    n = _length(case, flags) // 2
    return flags.set(MML, str(n)) if n >= 1 else "nothing left to halve"


def ollama(case: Case, flags: Flags, launches: list[Launch]) -> Flags | str:
    """Ollama's fixed ladder, one retry: > 32k -> 32768, else > 4k -> 4096."""
    if len(launches) > 1:
        return "one retry only"
    n = _length(case, flags)
    if n > 32768:
        return flags.set(MML, "32768")
    if n > 4096:
        return flags.set(MML, "4096")
    return "context already at 4096"


def multiplicative(case: Case, flags: Flags, launches: list[Launch]) -> Flags | str:
    """Shrink both: utilization x 0.85 and length x 0.75 per try."""
    util = flags.get_float(UTIL) or float(emu.default_utilization(case.version))
    return flags.set(UTIL, f"{util * 0.85:.4f}").set(MML, str(int(_length(case, flags) * 0.75)))


BASELINES: dict[str, tuple[Step, int]] = {
    "plain restart": (plain_restart, MAX_LAUNCHES),
    "halving ladder": (halving, MAX_LAUNCHES),
    "Ollama ladder": (ollama, 2),
    "multiplicative": (multiplicative, MAX_LAUNCHES),
}


# -- vllm-guard ---------------------------------------------------------------------------------
def nvml_free_gib(case: Case) -> float:
    """What NVML says is free before the first launch: the total less the other processes."""
    return case.gpu.total_gib - case.gpu.other_gib


def sizing(case: Case) -> Sizing:
    """The model's and GPUs' facts as ``startup._sizing`` gathers them (config.json, NVML)."""
    cfg = GuardConfig()
    return Sizing(model_info(case.model.path), gpus=case.gpu.count, vllm_version=case.version,
                  margin=cfg.plan.margin, min_model_len=cfg.remedies.min_model_len, platform="cuda",
                  compute_capability=case.gpu.cc, device_name=case.gpu.name,
                  utilization_margin=cfg.remedies.utilization_margin)


def context(case: Case, version: str | None = None, block: int | None = None, **loop_state) -> Context:
    """What ``Guard.remedy_context`` hands the policy: start-up facts plus the loop's state."""
    cfg = GuardConfig()
    info = model_info(case.model.path)
    version = version or case.version
    return Context(requested=case.requested, rules=cfg.remedies, gpu_free_gib=nvml_free_gib(case),
                   gpu_total_gib=case.gpu.total_gib, vllm_version=version, block_size=block,
                   derived_max_model_len=derive_max_model_len(info, version),
                   fp8_supported=fp8_kv_supported(case.gpu.cc, version, info.mla), sizing=sizing(case),
                   **loop_state)


def planned_flags(case: Case) -> Flags:
    """The guard's first launch with its plan (``startup._choose_first_flags``)."""
    fl = sizing(case).first_launch(case.requested, total_bytes=int(case.gpu.total_gib * GiB),
                                   free_bytes=int(nvml_free_gib(case) * GiB))
    flags = case.requested
    for k, v in fl.flags.items():
        flags = flags.set(k, v)
    if fl.expect:
        ahead = plan_ahead(fl.expect, flags, context(case))
        if ahead is not None:
            flags = ahead.flags
    return flags


def run_guard(case: Case, plan: bool) -> Run:
    """vllm-guard's loop (``Guard._supervise``) on one case, the GPU known from NVML."""
    cfg = GuardConfig()
    run = Run("vllm-guard + plan" if plan else "vllm-guard")
    flags = planned_flags(case) if plan else case.requested
    tried: list[str] = []
    previous: list[Diagnosis] = []
    version: str | None = case.version       # startup.detect_version reads it from the package
    block: int | None = None
    port_failures = 0
    while True:
        launch, r = _launch(case, flags)
        run.launches.append(launch)
        classifier = Classifier()
        for line in r.lines:
            classifier.feed(line)
        d = classifier.diagnose(r.exit_code)
        numbers = classifier.numbers
        if flags.get(MML) in ("auto", "-1"):      # the launch watcher holds auto-fit to its bounds
            bounded = check_auto_fit(numbers, classifier.phase, floor=cfg.remedies.min_model_len,
                                     cap=case.requested.get_int(MML))
            if bounded is not None:
                d, launch.ok = bounded, False
        launch.diagnosis = f"{d.kind.value}: {d.evidence}"
        version = numbers.get("vllm_version") or version
        block = numbers.get("block_size") or block
        if launch.ok:            # the guard's probe would pass: a chat completion answers
            run.served_len = r.outcome.served_max_model_len
            return run
        ctx = context(case, version, block, tried=tuple(tried), previous=tuple(previous),
                      port_failures=port_failures)
        decision = decide(d, flags, ctx)
        if isinstance(decision, GiveUp):
            run.gave_up = f"gave up: {decision.reason}"
            launch.decision = run.gave_up
            return run
        if len(run.launches) >= cfg.max_launches:
            run.gave_up = f"{cfg.max_launches} launches in a row failed"
            launch.decision = f"(would relaunch: {' '.join(decision.flags.argv())})"
            return run
        tried.append(decision.step)
        previous.append(d)
        if decision.step == "port_retry":
            port_failures += 1
        launch.decision = (f"{decision.step}: " + ", ".join(
            f"{c.flag} {c.old if c.old is not None else '(unset)'} -> {c.new or '(on)'}"
            for c in decision.changes)) if decision.changes else f"{decision.step}: same flags"
        flags = decision.flags


POLICIES = ("vllm-guard + plan", "vllm-guard", "plain restart", "halving ladder", "Ollama ladder",
            "multiplicative")


def run_all(case: Case) -> dict[str, Run]:
    """Every policy on one case."""
    runs = {"vllm-guard + plan": run_guard(case, True), "vllm-guard": run_guard(case, False)}
    for name, (step, limit) in BASELINES.items():
        runs[name] = run_baseline(case, name, step, limit)
    return runs
