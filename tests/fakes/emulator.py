"""A pure model of vLLM's start-up memory arithmetic: what a launch would do on a given GPU.

The fake vLLM and the benchmark matrix use it as "the real vLLM": the derived max length, the V1
free-memory check, weights, the profile's activation peak, non-torch memory, the KV budget, the KV
fit check, V0's allocation of the cache in what other processes leave, and CUDA-graph capture,
each with the per-version rules of vLLM's source (``docs/memory-model.md``).

Its terms are written here on their own (not imported from the plan) and calibrated to the real
start-ups of ``benchmarks/calibration`` (``benchmarks/REPORT.md``, "Accuracy"):

* activation: the larger of the dummy forward's MLP peak and the dummy sampler's logits over
  ``min(max_num_seqs, max_num_batched_tokens)`` rows at the version's bytes per element (38 for a
  sort, 40 in V0 <= 0.6.2, 14 for the in-place/FlashInfer samplers from 0.17), plus 0.04 GiB --
  within 0.04 GiB of the printed figure on the start-ups that print it;
* non-torch: 0.13 GiB per rank, more under TP/PP (0.41 GiB on datacenter GPUs, 0.12 on consumer
  cards, NCCL's init buffers before 0.11); the global-cap versions (0.6.4, V1 0.8-0.9.0) also count
  the CUDA context (0.45 / 0.25 GiB) and other processes.

Not calibrated, stated as such: the CUDA-graph memory (``cudagraph_gib``, a flat 0.5 GiB by
default: no calibration start-up prints a usable figure), the CUDA context outside the global-cap
versions (``context_gib``, 0.4 GiB), and the weights, which the caller gives (the benchmark takes
the checkpoint's size from its index plus the rotary cache, as vLLM loads them).
No I/O; stdlib only, so the fake server can import it as a plain script neighbour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = 1 << 30
MIB = 1 << 20

FP8_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
KV_DTYPES_BY_VERSION = (  # (first version, choice) for --kv-cache-dtype
    ((0, 5, 0), "auto"), ((0, 5, 0), "fp8"), ((0, 5, 0), "fp8_e5m2"), ((0, 5, 0), "fp8_e4m3"),
    ((0, 10, 0), "fp8_inc"), ((0, 11, 0), "bfloat16"), ((0, 18, 0), "float16"),
)


@dataclass(frozen=True)
class ModelSpec:
    """What the memory model needs to know about a checkpoint."""

    name: str
    weights_gib: float
    kv_bytes_per_token: int          # whole model, model dtype, before TP
    num_kv_heads: int
    derived_max_model_len: int
    vocab: int = 152064
    hidden: int = 4096
    intermediate: int = 11008
    mla: bool = False
    num_layers: int = 32             # V0 allocates the KV cache one layer at a time
    experts_per_token: int = 0       # MoE: routed experts per token, and their intermediate size
    moe_intermediate: int = 0
    shared_intermediate: int = 0     # all shared experts together
    dense_layers: int = 0            # leading dense layers of a MoE


@dataclass(frozen=True)
class GpuSpec:
    """One node's GPUs (all alike)."""

    total_gib: float
    other_used_gib: float = 0.0
    cc: tuple[int, int] = (8, 9)
    count: int = 1
    datacenter: bool = True          # False: a consumer card (PCIe: smaller NCCL buffers, smaller context)


@dataclass(frozen=True)
class Outcome:
    """How a launch ends: ``kind`` is a ``supervisor.core.diagnosis.Kind`` value, or None when it serves."""

    ok: bool
    kind: str | None
    phase: str
    numbers: dict = field(default_factory=dict)
    served_max_model_len: int | None = None


def vtuple(version: str) -> tuple[int, int, int]:
    """``"0.10.1.1"`` / ``"0.6.3.post1"`` / ``"0.10.2rc3.dev1"`` -> ``(0, 10, 1)``."""
    nums = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple((nums + [0, 0, 0])[:3])  # type: ignore[return-value]


def default_utilization(version: str) -> float:
    return 0.92 if vtuple(version) >= (0, 20, 0) else 0.90


def parse_human_int(text: str, version: str) -> int | None:
    """vLLM's ``human_readable_int`` (suffixes from 0.8.4); ``auto``/``-1`` -> None; raises ValueError."""
    text = text.strip()
    if text in ("auto", "-1"):
        if vtuple(version) < (0, 14, 0):
            raise ValueError(text)
        return None
    suffix = {"k": 1000, "m": 10**6, "g": 10**9, "K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in suffix and vtuple(version) >= (0, 8, 4):
        if text[-1].isupper():
            return int(text[:-1]) * suffix[text[-1]]
        return int(float(text[:-1]) * suffix[text[-1]])
    return int(text)


def engine_generation(version: str, flags: Mapping[str, str], gpu: GpuSpec,
                      env: Mapping[str, str] | None = None) -> str:
    """``"v1"`` or ``"v0"``: 0.8-0.10 silently fall back to V0 for fp8 KV off Hopper."""
    v = vtuple(version)
    env = env or {}
    if v < (0, 8, 0):
        return "v1" if env.get("VLLM_USE_V1") == "1" and v >= (0, 6, 4) else "v0"
    if v >= (0, 11, 0):
        return "v1"
    if env.get("VLLM_USE_V1") == "0":
        return "v0"
    fp8 = flags.get("--kv-cache-dtype", "auto") in FP8_DTYPES
    if fp8 and gpu.cc < (9, 0) and env.get("VLLM_USE_V1") != "1":
        return "v0"
    if "--preemption-mode" in flags:
        return "v0"
    return "v1"


#: Calibrated against the real start-ups (see the module docstring); GiB.
ACT_FIXED_GIB = 0.04
NON_TORCH_GIB = 0.13
NON_TORCH_TP_GIB = {True: 0.41, False: 0.12}          # datacenter / consumer, TP or PP > 1
NON_TORCH_PER_RANK_GIB = 0.05                          # each rank beyond 2
NCCL_INIT_GIB = 0.15                                   # V0 and V1 < 0.11, datacenter
COUNTED_CONTEXT_GIB = {True: 0.45, False: 0.25}        # the global-cap versions' CUDA context


def sampler_bytes_per_element(v: tuple[int, int, int], gen: str, rows: int) -> int:
    """Bytes per logits element at the dummy sampler's peak: a sort (38; 40 in V0 <= 0.6.2) or an
    in-place kernel (14: Triton for 8+ rows from 0.17, FlashInfer by default from 0.21)."""
    if gen == "v0":
        return 40 if v < (0, 6, 3) else 38
    if v >= (0, 21, 0) or (v >= (0, 17, 0) and rows >= 8):
        return 14
    return 38


def activation_peak_gib(model: ModelSpec, v: tuple[int, int, int], gen: str, mnbt: int, mns: int, tp: int) -> float:
    """The profile run's torch peak above the weights: max(dummy forward's MLP, dummy sampler) + fixed."""
    rows = max(1, min(mns, mnbt))
    per_token = 3 * (model.intermediate // tp) + 3 * model.hidden
    if model.experts_per_token:
        moe = model.experts_per_token * (3 * (model.moe_intermediate // tp) + model.hidden) + 3 * model.hidden \
            + 3 * (model.shared_intermediate // tp)
        per_token = max(moe, per_token if model.dense_layers else 0)
    forward = mnbt * per_token * 2
    hidden = 0 if gen == "v1" and v < (0, 9, 2) else mnbt * model.hidden * 2
    sampler = rows * model.vocab * sampler_bytes_per_element(v, gen, rows) + hidden + 4 * rows * model.hidden
    return max(forward, sampler) / GIB + ACT_FIXED_GIB


def non_torch_gib_for(v: tuple[int, int, int], gen: str, gpu: GpuSpec, world: int) -> float:
    """Memory outside torch that one rank adds while profiling (kernels, cuBLAS, NCCL under TP/PP)."""
    nt = NON_TORCH_GIB
    if world > 1:
        nt += NON_TORCH_TP_GIB[gpu.datacenter] + NON_TORCH_PER_RANK_GIB * (world - 2)
        if gpu.datacenter and (gen == "v0" or v < (0, 11, 0)):
            nt += NCCL_INIT_GIB
    return nt


def _fail(kind: str, phase: str, numbers: dict) -> Outcome:
    return Outcome(False, kind, phase, numbers, None)


def simulate(model: ModelSpec, gpu: GpuSpec, version: str, flags: Mapping[str, str], *,
             block_size: int = 16, activation_gib: float | None = None,
             cudagraph_gib: float = 0.5, context_gib: float = 0.4,
             non_torch_gib: float | None = None, env: Mapping[str, str] | None = None) -> Outcome:
    """Run the start-up arithmetic of ``version`` for ``flags`` (canonical names -> values, ``""``
    for booleans); ``env`` carries ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` / ``VLLM_USE_V1``."""
    env = dict(env or {})
    for key in ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_USE_V1"):  # accepted in flags too
        if key in flags:
            env.setdefault(key, flags[key])
    v = vtuple(version)
    gen = engine_generation(version, flags, gpu, env)
    n: dict = {"vllm_version": version, "engine": gen, "block_size": block_size,
               "total_gib": gpu.total_gib, "derived_max_model_len": model.derived_max_model_len}

    # -- 1. config (API server, before any engine exists) -----------------------------------
    try:
        util = float(flags.get("--gpu-memory-utilization") or default_utilization(version))
        tp = int(flags.get("--tensor-parallel-size") or 1)
        pp = int(flags.get("--pipeline-parallel-size") or 1)
        raw_len = flags.get("--max-model-len")
        user_len = parse_human_int(raw_len, version) if raw_len else None
        auto = raw_len is not None and user_len is None
        mnbt_raw = flags.get("--max-num-batched-tokens")
        user_mnbt = parse_human_int(mnbt_raw, version) if mnbt_raw else None
        mns_raw = flags.get("--max-num-seqs")
        user_mns = int(mns_raw) if mns_raw else None
        offload = float(flags.get("--cpu-offload-gb") or 0.0)
    except ValueError as exc:
        n["detail"] = f"invalid value: {exc}"
        return _fail("config_error", "config", n)
    if non_torch_gib is None:
        non_torch_gib = non_torch_gib_for(v, gen, gpu, tp * pp)
    n["requested_utilization"] = util
    if not 0.0 < util <= 1.0:
        n["detail"] = "gpu_memory_utilization out of range"
        return _fail("config_error", "config", n)
    kv_dtype = flags.get("--kv-cache-dtype") or "auto"
    if kv_dtype not in [d for first, d in KV_DTYPES_BY_VERSION if v >= first]:
        n["detail"] = f"invalid choice: {kv_dtype!r}"
        return _fail("config_error", "config", n)
    if tp * pp > gpu.count:
        n["detail"] = f"world size {tp * pp} > {gpu.count} GPUs"
        n["world_size"], n["gpu_count"] = tp * pp, gpu.count
        return _fail("config_error", "config", n)
    allow_long = env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true")
    max_len = model.derived_max_model_len if user_len is None else user_len
    n["max_model_len"] = max_len
    if user_len is not None and user_len > model.derived_max_model_len and not allow_long:
        return _fail("max_len_exceeds_model", "config", n)

    fp8 = kv_dtype in FP8_DTYPES
    if fp8 and gen == "v1" and v >= (0, 11, 0) and gpu.cc < (8, 9):
        n["detail"] = "fp8 kv cache not supported on this device"
        return _fail("config_error", "loading", n)
    if fp8 and gen == "v1" and v < (0, 11, 0) and gpu.cc < (9, 0):  # only with VLLM_USE_V1=1
        n["detail"] = "VLLM_USE_V1=1 is not supported with --kv-cache-dtype."
        return _fail("config_error", "config", n)

    # Scheduler defaults that size the profile run (EngineArgs / SchedulerConfig).
    big_gpu = gpu.total_gib >= 70 and gpu.cc != (8, 0)
    if gen == "v1":
        huge = v >= (0, 28, 0) and gpu.total_gib >= 160
        mnbt = user_mnbt or (16384 if huge else 8192 if big_gpu else 2048)
        mns = user_mns or (1024 if big_gpu else 256)
        if user_mnbt is None and v >= (0, 12, 0):
            mnbt = min(mnbt, mns * max_len)
    else:
        chunked = max_len > 32768 or "--enable-chunked-prefill" in flags
        default_mnbt = (2048 if v >= (0, 6, 5) else 512) if chunked else max(max_len, 2048)
        mnbt = user_mnbt or default_mnbt
        mns = user_mns or 256
        if not chunked and mnbt < max_len:
            n["detail"] = f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_len})"
            return _fail("config_error", "config", n)
    n["max_num_batched_tokens"], n["max_num_seqs"] = mnbt, mns
    n["num_dummy_requests"] = min(mns, mnbt)

    # -- 2. V1 >= 0.9.1 refuses to start below the requested free memory ------------------------
    free = gpu.total_gib - gpu.other_used_gib - context_gib
    requested = gpu.total_gib * util
    n["free_gib"], n["requested_gib"] = round(free, 2), round(requested, 2)
    if gen == "v1" and v >= (0, 9, 1) and free < requested:
        return _fail("insufficient_free_memory", "engine_init", n)

    # -- 3. weights (per rank) ------------------------------------------------------------------
    weights = max(0.0, model.weights_gib / (tp * pp) - offload)
    n["weights_gib"] = round(weights, 4)
    if weights + non_torch_gib > free:
        n["tried_to_allocate_mib"] = 500.0
        return _fail("oom_weights", "loading", n)

    # -- 4. profile run: activation peak --------------------------------------------------------
    mlp = mnbt * (3 * model.intermediate / tp + 3 * model.hidden) * 2
    rows = min(mns, mnbt)
    sampler = rows * model.vocab * sampler_bytes_per_element(v, gen, rows)
    if activation_gib is None:
        activation = activation_peak_gib(model, v, gen, mnbt, mns, tp)
    else:
        activation = activation_gib
    n["activation_gib"] = round(activation, 4)
    n["non_torch_gib"] = round(non_torch_gib, 4)
    n["sampler_peak"] = sampler >= mlp  # which allocation hits the OOM, for the fake's wording
    if weights + non_torch_gib + activation > free:
        n["tried_to_allocate_mib"] = round(max(mlp, sampler) / MIB, 2)
        n["free_gib"] = round(max(free - weights - non_torch_gib, 0.0), 2)
        return _fail("oom_profile", "profiling", n)

    # -- 5. KV budget ---------------------------------------------------------------------------
    eager = "--enforce-eager" in flags or flags.get("--optimization-level") == "0" \
        or flags.get("-O") == "0"
    cg_in_budget = v >= (0, 20, 0) and gen == "v1" and not eager
    budget = requested
    global_cap = (gen == "v1" and v < (0, 9, 1)) or (gen == "v0" and v[:3] == (0, 6, 4))
    non_kv = weights + activation + non_torch_gib
    if global_cap:  # other processes and the CUDA context count against the cap
        non_kv += gpu.other_used_gib + COUNTED_CONTEXT_GIB[gpu.datacenter]
    kv_gib = budget - non_kv - (cudagraph_gib if cg_in_budget else 0.0)
    if flags.get("--kv-cache-memory-bytes") and v >= (0, 10, 2):
        kv_gib = (parse_human_int(flags["--kv-cache-memory-bytes"], version) or 0) / GIB
    n["budget_gib"] = round(budget, 4)
    n["kv_available_gib"] = round(kv_gib, 2)
    n["cudagraph_gib"] = 0.0 if eager else cudagraph_gib
    if kv_gib <= 0:
        return _fail("no_kv_cache_memory", "profiling", n)

    # -- 6. blocks and the fit check -------------------------------------------------------------
    divisor = 1 if model.mla else min(tp, model.num_kv_heads)
    bpt = model.kv_bytes_per_token / divisor / pp * (0.5 if fp8 else 1.0)
    page = int(bpt * block_size)  # one block across this rank's layers
    kv_bytes = int(kv_gib * GIB)
    num_blocks = kv_bytes // page
    if flags.get("--num-gpu-blocks-override"):
        num_blocks = int(flags["--num-gpu-blocks-override"])
    capacity = num_blocks * block_size
    n["num_blocks"], n["kv_tokens"], n["kv_bytes_per_token"] = num_blocks, capacity, int(bpt)
    usable = kv_bytes - (page if v >= (0, 29, 0) else 0)   # 0.29+ holds back the null block
    estimate = max(0, usable // page * block_size)
    if auto:
        if estimate < 1:
            return _fail("no_kv_cache_memory", "profiling", n)
        n["auto_fit_max_model_len"] = max_len = min(max_len, estimate)
        n["max_model_len"] = max_len
    if gen == "v0":
        if max_len > capacity:
            n["fit_max_model_len"] = capacity
            return _fail("kv_cache_insufficient", "kv_cache", n)
        # V0 sizes the cache against its own budget only (0.6.5+); allocating it, layer by layer,
        # needs the memory other processes left (vllm/worker/cache_engine.py _allocate_kv_cache).
        left = gpu.total_gib - gpu.other_used_gib - context_gib - weights - non_torch_gib
        if not global_cap and kv_gib > left:
            layer = kv_gib / max(1, model.num_layers)
            n["tried_to_allocate_mib"] = round(layer * 1024, 2)
            n["free_gib"] = round(max(left - int(left / layer) * layer, 0.0), 4)
            return _fail("oom_profile", "kv_cache", n)
    else:
        needed = math.ceil(max_len / block_size) * page
        if needed > usable:
            n["kv_needed_gib"] = round(needed / GIB, 2)
            if v >= (0, 9, 1) and estimate > 0:  # 0.8.4-0.9.0 never print it
                n["fit_max_model_len"] = min(estimate, max_len)
            return _fail("kv_cache_insufficient", "profiling", n)
    n["max_concurrency"] = round(num_blocks / math.ceil(max_len / block_size), 2)

    # -- 7. CUDA graphs captured after KV sizing (< 0.20) must fit outside the budget --------------
    if not eager and not cg_in_budget:
        outside = gpu.total_gib - budget if global_cap else \
            gpu.total_gib - gpu.other_used_gib - context_gib - budget
        if outside < cudagraph_gib:
            n["tried_to_allocate_mib"] = 20.0
            n["free_gib"] = round(max(outside, 0.0), 2)
            return _fail("oom_cudagraph", "cudagraph", n)
    return Outcome(True, None, "serving", n, max_len)
