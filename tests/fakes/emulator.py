"""A pure model of vLLM's start-up memory arithmetic: what a launch would do on a given GPU.

The fake vLLM and the benchmark matrix use it as "the real vLLM": the derived max length, the V1
free-memory check, weights, the profile's activation peak, non-torch memory, the KV budget, the KV
fit check, V0's allocation of the cache in what other processes leave, and CUDA-graph capture,
each with the per-version rules of vLLM's source (``docs/memory-model.md``).

Its terms are written here on their own (not imported from the plan), and its calibrated figures
are read from the calibration records (``benchmarks/calibration/records.tsv``: what vLLM printed on
real start-ups), not copied from the plan's constants, so that an error in the plan's figures is an
error here only if vLLM printed it:

* activation: the larger of the dummy forward's MLP peak and the dummy sampler's logits over
  ``min(max_num_seqs, max_num_batched_tokens)`` rows at the version's bytes per element (38 for a
  sort, 40 in V0 <= 0.6.2, 14 for the in-place/FlashInfer samplers from 0.17), plus a fixed part:
  the median of what the dense V1 start-ups printed above that peak (records 3-9, 0.034-0.036 GiB);
* non-torch: the median printed at TP = PP = 1 (0.13 GiB); under TP the median of what the TP 2
  start-ups printed above it (H100: 0.41-0.42 GiB; an RTX 4090: 0.12 GiB); the global-cap versions
  (0.6.4, V1 0.8-0.9.0) also count the CUDA context: on a consumer card what the RTX 3090 start-ups
  printed above the base (0.22 GiB).

Not calibrated, stated as such (no record prints them): the CUDA-graph memory (``cudagraph_gib``, a
flat 0.5 GiB by default), the CUDA context outside the global-cap versions (``context_gib``, 0.4
GiB), a datacenter GPU's counted context (0.45 GiB), NCCL's init buffers under TP before 0.11 (0.15
GiB), 0.05 GiB more per rank beyond 2, and the weights, which the caller gives (the benchmark takes
the checkpoint's size from its index plus the rotary cache, as vLLM loads them; the fake's
Llama-3.1-8B takes what vLLM printed for it, :func:`printed`).
Stdlib only, so the fake server can import it as a plain script neighbour; the only file it reads
is the calibration records, once, at import.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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


# -- the calibration records: what vLLM printed on real start-ups ------------------------------------
CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration"


def _records() -> list[dict[str, str]]:
    with open(CALIBRATION / "records.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


RECORDS = _records()


def printed(model_dir: str, field: str, version_from: tuple[int, int, int] = (0, 0, 0)) -> float:
    """What vLLM printed for ``field`` (``obs_weights_gib``, ...) on the first record of that model."""
    for r in RECORDS:
        if r["model_dir"] == model_dir and r[field] and vtuple(r["vllm_version"]) >= version_from:
            return float(r[field])
    raise KeyError(f"no calibration record prints {field} for {model_dir}")


def _num(r: dict[str, str], key: str) -> float | None:
    return float(r[key]) if r.get(key) else None


def _shape(r: dict[str, str]) -> tuple[int, int, int]:
    """(vocab, hidden, intermediate) from the record's config.json (the text model's, for a VLM)."""
    cfg = json.loads((CALIBRATION / "models" / r["model_dir"] / "config.json").read_text(encoding="utf-8"))
    cfg = cfg.get("text_config", cfg)
    return int(cfg["vocab_size"]), int(cfg["hidden_size"]), int(cfg["intermediate_size"])


def _non_torch(tp: int, *, consumer: bool) -> list[float]:
    return [float(r["obs_non_torch_gib"]) for r in RECORDS
            if int(r["tp"]) == tp and r["pp"] == "1" and r["obs_non_torch_gib"]
            and ("RTX" in r["gpu"]) == consumer
            and vtuple(r["vllm_version"]) >= ((0, 7, 0) if consumer else (0, 11, 0))]


#: Non-torch memory one rank adds while profiling at TP = PP = 1 (median of the H100 0.11 records).
NON_TORCH_GIB = statistics.median(_non_torch(1, consumer=False))
#: ... more at TP 2: datacenter (H100 records) / consumer (the RTX 4090 record), above the base.
NON_TORCH_TP_GIB = {True: statistics.median(x - NON_TORCH_GIB for x in _non_torch(2, consumer=False)),
                    False: statistics.median(x - NON_TORCH_GIB for x in _non_torch(2, consumer=True))}
NON_TORCH_PER_RANK_GIB = 0.05                          # each rank beyond 2 (a prior: no record has TP > 2)
NCCL_INIT_GIB = 0.15                                   # V0 and V1 < 0.11, datacenter (a prior: no record)
#: The global-cap versions' CUDA context counted as non-torch memory: on a consumer card what the RTX
#: 3090 0.6.4 records printed above the base; on a datacenter GPU a prior (no record).
COUNTED_CONTEXT_GIB = {True: 0.45, False: statistics.median(
    float(r["obs_non_torch_gib"]) - NON_TORCH_GIB for r in RECORDS
    if r["vllm_version"] == "0.6.4" and "RTX" in r["gpu"] and r["tp"] == "1")}


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
    return _activation_peak_gib(model, v, gen, mnbt, mns, tp) + ACT_FIXED_GIB


def _activation_peak_gib(model: ModelSpec, v: tuple[int, int, int], gen: str, mnbt: int, mns: int, tp: int) -> float:
    """max(the dummy forward's MLP, the dummy sampler), GiB."""
    rows = max(1, min(mns, mnbt))
    per_token = 3 * (model.intermediate // tp) + 3 * model.hidden
    if model.experts_per_token:
        moe = model.experts_per_token * (3 * (model.moe_intermediate // tp) + model.hidden) + 3 * model.hidden \
            + 3 * (model.shared_intermediate // tp)
        per_token = max(moe, per_token if model.dense_layers else 0)
    forward = mnbt * per_token * 2
    hidden = 0 if gen == "v1" and v < (0, 9, 2) else mnbt * model.hidden * 2
    sampler = rows * model.vocab * sampler_bytes_per_element(v, gen, rows) + hidden + 4 * rows * model.hidden
    return max(forward, sampler) / GIB


def _activation_fixed_gib() -> float:
    """What the dense V1 0.11 start-ups printed as activation above the peak modelled here (the
    multimodal record profiles its vision encoder as well, and is left out)."""
    above = []
    for r in RECORDS:
        if not r["class"].startswith("dense") or "multimodal" in r["class"] or r["vllm_version"] != "0.11.0" \
                or not r["obs_activation_gib"]:
            continue
        vocab, hidden, inter = _shape(r)
        big = float(r["gpu_total_gib"]) >= 70           # vLLM's defaults for a large GPU: 8192 tokens, 1024 seqs
        mnbt = int(_num(r, "max_num_batched_tokens") or (8192 if big else 2048))
        mns = int(_num(r, "max_num_seqs") or (1024 if big else 256))
        spec = ModelSpec("record", 0.0, 0, 1, 1, vocab=vocab, hidden=hidden, intermediate=inter)
        peak = _activation_peak_gib(spec, vtuple(r["vllm_version"]), "v1", mnbt, mns, int(r["tp"]))
        above.append(float(r["obs_activation_gib"]) - peak)
    return statistics.median(above)


#: The profile run's torch allocations besides its forward and sampler tensors (GiB; see above).
ACT_FIXED_GIB = _activation_fixed_gib()


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
