"""remedies.allowed holds for every change the guard makes to the user's flags.

The class: a change to the user's flags that the user's rules (``[remedies] allowed``) do not allow. It
can come from the first launch's plan, the plan's step ahead of a failure it foresees, flags learned
under earlier rules, or any relaunch rule (and a rule that takes part of the plan's answer). Whatever
the model, GPU, vLLM version, the user's flags, the rules and the failures, the flags vLLM is launched
with differ from the user's only in flags whose remedy is allowed. The table of which remedy covers
which flag is written out here from the README's list, not read from the code.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import matrix
from benchmarks import policies as bench
from supervisor import config
from supervisor.config import GuardConfig, PlanConfig, RemedyConfig
from supervisor.core import plan as P
from supervisor.core.classifier import Classifier
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice
from supervisor.core.session import DIED, FAILED, Facts, Launch, Learned, Outcome, Session
from supervisor.facts.model_files import load_model_info

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
GiB = 1 << 30

#: flag -> the remedy that must be allowed for the guard to change it (README, "[remedies] allowed"):
#: the length, fp8 KV, the memory share (and the CPU backend's KV size, its share there), eager mode,
#: the sequences, the batch (and chunked prefill, how prompts are batched), the CPU offload.
REMEDY_OF = {
    "--max-model-len": "max_model_len",
    "--kv-cache-dtype": "kv_cache_fp8",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "gpu_memory_utilization",
    "--enforce-eager": "enforce_eager",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--enable-chunked-prefill": "max_num_batched_tokens",
    "--cpu-offload-gb": "cpu_offload",
}
SWITCHES = {"--enforce-eager", "--enable-chunked-prefill"}
REMEDIES = tuple(dict.fromkeys(RemedyConfig().allowed + ("cpu_offload",)))

# GPUs as the tests and the matrix give them: (NVML name, total GiB as torch reports it, compute capability)
GPUS = (("Tesla T4", 14.75, (7, 5)), ("NVIDIA L4", 22.06, (8, 9)), ("NVIDIA A100-SXM4-40GB", 39.38, (8, 0)),
        ("NVIDIA L40S", 44.52, (8, 9)), ("NVIDIA H100 80GB HBM3", 79.19, (9, 0)))
VERSIONS = ("0.6.6.post1", "0.8.5", "0.10.1.1", "0.19.0", "0.20.0", "0.32.0")
MODEL_NAMES = ("Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct", "Mistral-7B-v0.3", "Qwen3-8B",
               "Qwen2.5-32B-Instruct-AWQ", "DeepSeek-V2-Lite", "gpt-oss-20b")


def info_of(name: str):
    info = load_model_info(str(MODELS / name))
    assert info is not None
    return info


def disallowed_changes(requested: Flags, launched: Flags, allowed: tuple[str, ...]) -> list[str]:
    """The flags in which ``launched`` differs from ``requested`` though their remedy is not allowed."""
    out = []
    for flag, remedy in REMEDY_OF.items():
        if remedy in allowed:
            continue
        differs = (launched.enabled(flag) != requested.enabled(flag) if flag in SWITCHES
                   else launched.get(flag) != requested.get(flag))
        if differs:
            out.append(flag)
    return out


def assert_within(requested: Flags, launch: Launch, launched: Flags, allowed: tuple[str, ...]) -> None:
    assert disallowed_changes(requested, launched, allowed) == [], (allowed, requested, launched, launch.why)
    for c in launch.changes:            # what a person reads names only changes that are made
        assert launch.flags.get(c.flag) == c.new, (c, launch.flags)
    kv = (launch.flags.get("--kv-cache-dtype") or "auto").lower()
    if not kv.startswith("fp8"):
        assert not any("fp8 KV" in c.why for c in launch.changes), launch.changes
    if not launch.flags.enabled("--enforce-eager"):
        assert not any("eager mode" in c.why for c in launch.changes), launch.changes


# -- the strategies -------------------------------------------------------------------------------------
allowed_sets = st.lists(st.sampled_from(REMEDIES), unique=True).map(tuple)


@st.composite
def user_flags(draw) -> Flags:
    flags = Flags()
    if draw(st.booleans()):
        flags = flags.set("--max-model-len", draw(st.sampled_from(("4096", "8192", "16384", "32768", "131072"))))
    if draw(st.booleans()):
        flags = flags.set("--gpu-memory-utilization", draw(st.sampled_from(("0.4", "0.6", "0.8", "0.9", "0.95"))))
    if draw(st.booleans()):
        flags = flags.set("--max-num-seqs", draw(st.sampled_from(("16", "32", "256"))))
    if draw(st.integers(0, 4)) == 0:
        flags = flags.set("--enforce-eager")
    if draw(st.integers(0, 4)) == 0:
        flags = flags.set("--kv-cache-dtype", draw(st.sampled_from(("auto", "fp8"))))
    return flags


learned_flags = st.dictionaries(
    st.sampled_from(("--max-model-len", "--gpu-memory-utilization", "--kv-cache-dtype", "--enforce-eager",
                     "--max-num-seqs", "--max-num-batched-tokens", "--enable-chunked-prefill", "--cpu-offload-gb")),
    st.just(None), max_size=4).map(lambda d: {k: {
        "--max-model-len": "8192", "--gpu-memory-utilization": "0.8", "--kv-cache-dtype": "fp8",
        "--enforce-eager": True, "--max-num-seqs": "64", "--max-num-batched-tokens": "2048",
        "--enable-chunked-prefill": True, "--cpu-offload-gb": "4"}[k] for k in d})


@st.composite
def diagnoses(draw, total: float) -> tuple[Diagnosis, bool]:
    """A failure as the classifier reports it, with numbers of the shape vLLM prints; and whether the
    launch had served first (a runtime OOM, an engine death)."""
    kind = draw(st.sampled_from((Kind.KV_CACHE_INSUFFICIENT, Kind.INSUFFICIENT_FREE_MEMORY, Kind.NO_KV_CACHE_MEMORY,
                                 Kind.OOM_CUDAGRAPH, Kind.OOM_PROFILE, Kind.OOM_WEIGHTS, Kind.OOM_RUNTIME,
                                 Kind.ENGINE_DEAD, Kind.MAX_LEN_EXCEEDS_MODEL, Kind.AUTO_FIT_ABOVE_REQUEST,
                                 Kind.CONFIG_ERROR)))
    numbers: dict = {}
    phase = ""
    evidence = "x"
    if kind is Kind.KV_CACHE_INSUFFICIENT:
        length = draw(st.sampled_from((8192, 32768, 131072)))
        numbers = {"max_model_len": length}
        if draw(st.booleans()):
            numbers["fit_max_model_len"] = draw(st.integers(256, length))
        else:
            numbers |= {"kv_needed_gib": 4.0, "kv_available_gib": draw(st.sampled_from((0.2, 1.0, 3.0)))}
    elif kind is Kind.INSUFFICIENT_FREE_MEMORY:
        numbers = {"free_gib": round(total * draw(st.floats(0.2, 0.95)), 2), "total_gib": total,
                   "requested_utilization": 0.9}
    elif kind is Kind.OOM_PROFILE:
        phase = draw(st.sampled_from(("kv_cache", "profile")))
    elif kind is Kind.MAX_LEN_EXCEEDS_MODEL:
        numbers = {"max_model_len": 262144, "derived_max_model_len": 32768}
    elif kind is Kind.AUTO_FIT_ABOVE_REQUEST:
        numbers = {"max_model_len": 8192, "fit_max_model_len": 20000}
    elif kind is Kind.CONFIG_ERROR:
        evidence = draw(st.sampled_from(("unrecognized arguments: --use-v2-block-manager",
                                         "ValueError: fp8 kv-cache is not supported on this GPU",
                                         "vLLM refused chunked prefill")))
    served = kind in (Kind.OOM_RUNTIME, Kind.ENGINE_DEAD) and draw(st.booleans())
    return Diagnosis(kind, evidence=evidence, numbers=numbers, phase=phase), served


@st.composite
def runs(draw):
    name = draw(st.sampled_from(MODEL_NAMES))
    device, total, cc = draw(st.sampled_from(GPUS))
    free = round(total * draw(st.sampled_from((1.0, 0.95, 0.8, 0.6, 0.45))), 2)
    version = draw(st.sampled_from(VERSIONS))
    allowed = draw(allowed_sets)
    rules = RemedyConfig(allowed=allowed, min_model_len=draw(st.sampled_from((2048, 4096))),
                         cpu_offload_gb=draw(st.sampled_from((0.0, 4.0))))
    cfg = GuardConfig(model=name, vllm_args=tuple(draw(user_flags()).argv()), remedies=rules,
                      plan=PlanConfig(auto_fit=draw(st.integers(0, 3)) == 0))
    learned = draw(learned_flags)
    dev = GpuDevice(0, device, int(total * GiB), int((total - free) * GiB), int(free * GiB), cc, ())
    facts = Facts(devices=(dev,), free_gib=free, total_gib=total, vllm_version=version, model=info_of(name),
                  learned=Learned(learned, "earlier") if learned else None)
    failures = draw(st.lists(diagnoses(total), max_size=5))
    return cfg, facts, failures


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_every_launch_differs_from_the_users_flags_only_where_the_rules_allow(run):
    cfg, facts, failures = run
    allowed = cfg.remedies.allowed
    s = Session(cfg, facts, rng=random.Random(0))
    requested = cfg.requested_flags()
    step = s.first_launch()
    for failure in [*failures, None]:
        if not isinstance(step, Launch):
            break
        launched, _ = s.launching()
        assert_within(requested, step, launched, allowed)
        if failure is None:
            break
        d, served = failure
        if served:
            s.healthy({}, 1.0)
        step = s.ended(Outcome(DIED if served else FAILED, d, was_healthy=served, healthy_for=1.0))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(MODEL_NAMES), gpu=st.sampled_from(GPUS), version=st.sampled_from(VERSIONS),
       free=st.sampled_from((1.0, 0.9, 0.7, 0.5)), flags=user_flags(), allowed=allowed_sets,
       floor=st.sampled_from((2048, 4096, 16384)))
def test_the_plan_proposes_only_flags_whose_remedy_is_allowed(name, gpu, version, free, flags, allowed, floor):
    device, total, cc = gpu
    sizing = P.Sizing(info_of(name), vllm_version=version, compute_capability=cc, device_name=device,
                      min_model_len=floor)
    fit = sizing.fit(flags, total_bytes=int(total * GiB), free_bytes=int(total * free * GiB), allowed=allowed)
    assert {REMEDY_OF[f] for f in fit.flags} <= set(allowed), (fit.flags, allowed)
    if "--kv-cache-dtype" not in fit.flags:
        assert not any("fp8" in why for why in fit.reasons.values()), fit.reasons
    if "--enforce-eager" not in fit.flags:
        assert not any("eager" in why for why in fit.reasons.values()), fit.reasons


# -- with the emulator as vLLM: the rules hold, and nothing that served stops serving ----------------------
def guard_run(case: matrix.Case, rules: RemedyConfig) -> tuple[bool, list[Flags]]:
    """The daemon's session on one matrix case under ``rules``, the emulator as vLLM (the benchmark's loop):
    whether it served, and each launch's flags."""
    cfg = GuardConfig(model=case.model.name, vllm_args=tuple(case.requested.argv()), remedies=rules,
                      plan=replace(PlanConfig(), learn=False))
    s = Session(cfg, bench.facts(case), rng=random.Random(0))
    step = s.first_launch()
    launched = []
    while isinstance(step, Launch):
        flags, _ = s.launching()
        assert_within(case.requested, step, flags, rules.allowed)
        launched.append(flags)
        _, r = bench._launch(case, flags)
        classifier = Classifier()
        for line in r.lines:
            classifier.feed(line)
        d = classifier.diagnose(r.exit_code)
        bounded = s.check_auto_fit(classifier.numbers, classifier.phase)
        if r.outcome.ok and bounded is None:
            return True, launched
        step = s.ended(Outcome(FAILED, bounded or d, exit_code=r.exit_code))
    return False, launched


CASES = matrix.cases()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), allowed=allowed_sets)
def test_a_case_served_with_changes_the_rules_allow_is_served_under_those_rules(case, allowed):
    # Every change the guard makes under the rules is one they allow (checked launch by launch); and where
    # the guard with every remedy allowed served the case changing only flags these rules allow, it
    # serves it under these rules too: telling the plan what it may change loses no case it healed.
    every, launches = guard_run(case, RemedyConfig(allowed=REMEDIES))
    served, _ = guard_run(case, RemedyConfig(allowed=allowed))
    if every and all(not disallowed_changes(case.requested, f, allowed) for f in launches):
        assert served, (case.label, allowed, launches)


def test_with_every_remedy_allowed_the_guard_heals_the_matrix_as_its_report_records():
    # benchmarks/REPORT.md's matrix: the guard with the plan heals every case the emulator can serve at all
    # (129 of the 141 cells, the rest no launch of any flags serves: the weights do not fit).
    healed = sum(guard_run(case, RemedyConfig(allowed=REMEDIES))[0] for case in CASES)
    assert (healed, len(CASES)) == (129, 141)


# -- the cases of the issue, written out -------------------------------------------------------------------
def shared_gpu_session(total: float, allowed: tuple[str, ...] | None = None, learned: Learned | None = None
                       ) -> tuple[Session, Flags]:
    cfg = config.build(config.load_file(ROOT / "configs" / "shared-gpu.toml"))
    cfg = replace(cfg, model="meta-llama/Llama-3.1-8B-Instruct")
    if allowed is not None:
        cfg = replace(cfg, remedies=replace(cfg.remedies, allowed=allowed))
    dev = GpuDevice(0, "NVIDIA A100-PCIE-40GB", int(total * GiB), 0, int(total * GiB), (8, 0), ())
    facts = Facts(devices=(dev,), free_gib=total, total_gib=total, vllm_version="0.20.0",
                  model=info_of("Llama-3.1-8B-Instruct"), learned=learned)
    return Session(cfg, facts, rng=random.Random(0)), cfg.requested_flags()


def test_shared_gpu_toml_never_gets_eager_mode_from_the_plan():
    # configs/shared-gpu.toml: --gpu-memory-utilization 0.40 --max-model-len 16384 --max-num-seqs 32, a 4096
    # floor, and allowed without enforce_eager. Llama-3.1-8B at 0.40 of a 40.14 GiB card without fp8 KV
    # (compute capability 8.0), vLLM 0.20 (CUDA graphs inside the budget): fewer than 4096 tokens fit with
    # graphs, so with every remedy allowed the plan turns eager mode on; under the file's rules it may not.
    everything, _ = shared_gpu_session(40.14, allowed=REMEDIES)
    assert everything.first_launch().flags.enabled("--enforce-eager")
    s, requested = shared_gpu_session(40.14)
    launch = s.first_launch()
    assert not launch.flags.enabled("--enforce-eager")
    assert disallowed_changes(requested, launch.flags, s.cfg.remedies.allowed) == []
    # its length was sized with eager mode: without it, it is not taken either
    assert launch.flags.get("--max-model-len") == "16384"


def test_learned_flags_the_rules_no_longer_allow_are_forgotten_not_applied():
    # learned under rules that allowed eager mode (the plan's answer above), then enforce_eager removed
    learned = Learned({"--enforce-eager": True, "--max-model-len": "auto"}, "earlier")
    s, requested = shared_gpu_session(40.14, learned=learned)
    launch = s.first_launch()
    assert launch.forget_learned and "enforce_eager" not in s.cfg.remedies.allowed
    assert not launch.flags.enabled("--enforce-eager") and "remedies.allowed" in launch.why
    # learned flags the rules allow are applied as before
    kept, _ = shared_gpu_session(40.14, learned=Learned({"--max-model-len": "8192"}, "earlier"))
    first = kept.first_launch()
    assert first.reason == "learned" and first.flags.get("--max-model-len") == "8192" and not first.forget_learned
