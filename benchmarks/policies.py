"""Relaunch policies run launch by launch against the emulator: vllm-guard and the baselines.

vllm-guard is not re-implemented: its row runs the daemon's own
:class:`~supervisor.core.session.Session` (first launch, every relaunch, giving up), fed the facts
the daemon's shell would gather for the case. Each launch is rendered as vLLM's real output
(:mod:`benchmarks.render`) and classified by :class:`supervisor.core.classifier.Classifier`.
"With plan" is the daemon's default; without it, planning is off (``--no-plan``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from benchmarks.matrix import Case, GiB, model_info, model_spec
from benchmarks.render import emu, render
from supervisor.config import GuardConfig
from supervisor.core import session as daemon
from supervisor.core.classifier import Classifier
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice

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


def facts(case: Case) -> daemon.Facts:
    """What the daemon's shell gathers for this case (NVML, the installed vLLM, config.json)."""
    total = int(case.gpu.total_gib * GiB)
    free = int(nvml_free_gib(case) * GiB)
    devices = tuple(GpuDevice(i, case.gpu.name, total, total - free, free, case.gpu.cc, ())
                    for i in range(case.gpu.count))
    return daemon.Facts(platform="cuda", devices=devices, free_gib=nvml_free_gib(case), total_gib=case.gpu.total_gib,
                 vllm_version=case.version, model=model_info(case.model.path))


def session(case: Case, plan: bool) -> daemon.Session:
    """The daemon's session for this case: its default config, the case's flags, planning on or off."""
    cfg = GuardConfig(model=case.model.name, vllm_args=tuple(case.requested.argv()))
    cfg = replace(cfg, plan=replace(cfg.plan, enabled=plan, learn=False))
    return daemon.Session(cfg, facts(case), rng=random.Random(0))


def run_guard(case: Case, plan: bool) -> Run:
    """vllm-guard on one case: the daemon's own session decides every launch; the emulator is vLLM."""
    run = Run("vllm-guard + plan" if plan else "vllm-guard")
    s = session(case, plan)
    step: daemon.Step | None = s.first_launch()
    while isinstance(step, daemon.Launch):
        flags, _ = s.launching()
        launch, r = _launch(case, flags)
        run.launches.append(launch)
        classifier = Classifier()
        for line in r.lines:
            classifier.feed(line)
        d = classifier.diagnose(r.exit_code)
        bounded = s.check_auto_fit(classifier.numbers, classifier.phase)
        if bounded is not None:          # the launch watcher stops a launch outside the guard's bounds
            d, launch.ok = bounded, False
        launch.diagnosis = f"{d.kind.value}: {d.evidence}"
        if launch.ok:            # the guard's probe would pass: a chat completion answers
            s.healthy(classifier.numbers, 0.0)
            run.served_len = r.outcome.served_max_model_len
            return run
        step = s.ended(daemon.Outcome(daemon.FAILED, d, exit_code=r.exit_code))
        if isinstance(step, daemon.Launch):
            launch.decision = (f"{step.step}: " + ", ".join(
                f"{c.flag} {c.old if c.old is not None else '(unset)'} -> {c.new or '(on)'}"
                for c in step.changes)) if step.changes else f"{step.step}: same flags"
    assert isinstance(step, daemon.End)
    run.gave_up = f"gave up: {step.reason}"
    run.launches[-1].decision = run.gave_up
    return run


POLICIES = ("vllm-guard + plan", "vllm-guard", "plain restart", "halving ladder", "Ollama ladder",
            "multiplicative")


def run_all(case: Case) -> dict[str, Run]:
    """Every policy on one case."""
    runs = {"vllm-guard + plan": run_guard(case, True), "vllm-guard": run_guard(case, False)}
    for name, (step, limit) in BASELINES.items():
        runs[name] = run_baseline(case, name, step, limit)
    return runs
