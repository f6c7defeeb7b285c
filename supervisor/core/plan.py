"""Predict before launching: vLLM's KV-cache arithmetic and the first launch's flags (pure).

Every formula follows the vLLM source as summarised in the research note
``vllm-memory-model.md`` (section numbers below refer to it). Exact parts: KV bytes per token,
page and block arithmetic, the fitting ``max_model_len`` for a given KV budget (the closed form of
vLLM's own binary search, minus the null block from 0.29). Estimated parts: the activation peak,
non-torch memory and the CUDA-graph reserve, which is why :func:`first_launch` holds back a margin,
or, from vLLM 0.14, leaves an estimated length to vLLM's own measurement (``--max-model-len auto``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from supervisor.core.flags import Flags
from supervisor.facts.nvml import GpuDevice, fp8_kv_supported
from supervisor.core.model import ModelInfo, derive_max_model_len, parse_version

GiB = 1 << 30
_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8")
_NEWEST = (0, 33, 0)            # the rules an unknown version is planned with


def _ver(vllm_version: str | None) -> tuple[int, int, int]:
    return parse_version(vllm_version) or _NEWEST


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def model_dtype_bytes(info: ModelInfo, dtype: str | None = None) -> int:
    """Bytes per element of the weights/activations vLLM runs (``--dtype``; auto downcasts float32 to 16-bit)."""
    d = (dtype or "auto").lower()
    if d in ("float32", "float"):
        return 4
    return 2


def kv_dtype_bytes(info: ModelInfo, kv_cache_dtype: str = "auto", dtype: str | None = None) -> int:
    """Bytes per KV element: the model dtype for auto, 1 for any fp8 variant (§4)."""
    d = (kv_cache_dtype or "auto").lower()
    if d == "auto":
        return model_dtype_bytes(info, dtype)
    if d.startswith(_FP8):
        return 1
    if d in ("float32", "float"):
        return 4
    if d in ("bfloat16", "float16", "half"):
        return 2
    raise ValueError(f"unsupported --kv-cache-dtype {kv_cache_dtype!r}")


def kv_heads_per_rank(info: ModelInfo, tp: int = 1) -> int:
    """KV heads one TP rank stores: MLA keeps one latent on every rank; GQA replicates when TP > heads (§2.4)."""
    if info.mla:
        return 1
    return max(1, info.num_kv_heads // max(1, tp))


def _head_size(info: ModelInfo) -> int:
    return info.kv_lora_rank + info.qk_rope_head_dim if info.mla else info.head_dim


def page_bytes(info: ModelInfo, *, block_size: int = 16, tp: int = 1, kv_cache_dtype: str = "auto",
               dtype: str | None = None) -> int:
    """Bytes of one KV block in one layer on one rank (§2.1; MLA stores K only)."""
    coef = 1 if info.mla else 2
    return (coef * block_size * kv_heads_per_rank(info, tp) * _head_size(info)
            * kv_dtype_bytes(info, kv_cache_dtype, dtype))


def kv_bytes_per_token(info: ModelInfo, *, tp: int = 1, kv_cache_dtype: str = "auto",
                       full_layers_only: bool = False, dtype: str | None = None) -> int:
    """KV bytes one token costs on one rank across all attention layers (tp=1: the whole model)."""
    layers = info.full_layers if full_layers_only else info.num_layers
    return page_bytes(info, block_size=1, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype) * layers


def _layers_on_rank(info: ModelInfo, pp: int) -> tuple[int, int]:
    """(full, sliding) layers on the busiest pipeline stage."""
    pp = max(1, pp)
    return _cdiv(info.full_layers, pp), _cdiv(info.sliding_layers, pp)


def kv_needed_bytes(info: ModelInfo, max_model_len: int, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 2048, hybrid: bool = True,
                    dtype: str | None = None) -> int:
    """KV bytes vLLM V1 demands for one request of max_model_len (``max_memory_usage_bytes`` summed over layers, §2.5/2.7)."""
    page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    full, sliding = _layers_on_rank(info, pp)
    if not hybrid or not info.sliding_window:
        full, sliding = full + sliding, 0
    need = full * _cdiv(max_model_len, block_size)
    if sliding:
        window_tokens = min(info.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        need += sliding * (_cdiv(window_tokens, block_size) + 1)
    return need * page


def _bytes_per_pool_block(info: ModelInfo, page: int, pp: int, hybrid: bool) -> int:
    full, sliding = _layers_on_rank(info, pp)
    if hybrid and info.sliding_window and full and sliding:
        return page * min(full, sliding)      # one block id spans one group (§2.5)
    return page * (full + sliding)


def usable_kv_bytes(kv_budget_bytes: int, info: ModelInfo, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", vllm_version: str | None = None, hybrid: bool | None = None,
                    dtype: str | None = None) -> int:
    """The budget vLLM checks a request against: from 0.29 one pool block (the null block) is held back."""
    ver = _ver(vllm_version)
    hybrid = ver >= (0, 8, 0) if hybrid is None else hybrid
    if ver >= (0, 29, 0):
        page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
        return kv_budget_bytes - _bytes_per_pool_block(info, page, pp, hybrid)
    return kv_budget_bytes


def fit_max_model_len(kv_budget_bytes: int, info: ModelInfo, *, tp: int = 1, kv_cache_dtype: str = "auto",
                      block_size: int = 16, vllm_version: str | None = None, pp: int = 1, upper: int | None = None,
                      max_num_batched_tokens: int = 2048, hybrid: bool | None = None, dtype: str | None = None) -> int:
    """The largest max_model_len vLLM accepts with this KV budget per rank (its "estimated maximum model length"); 0 if none."""
    ver = _ver(vllm_version)
    hybrid = ver >= (0, 8, 0) if hybrid is None else hybrid
    kw = dict(block_size=block_size, tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    avail = usable_kv_bytes(kv_budget_bytes, info, vllm_version=vllm_version, hybrid=hybrid, **kw)
    if avail <= 0:
        return 0
    if not (hybrid and info.sliding_window):
        full, sliding = _layers_on_rank(info, pp)
        per_block = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
        fit = avail // (per_block * (full + sliding)) * block_size
        return min(fit, upper) if upper else fit

    def fits(n: int) -> bool:
        return kv_needed_bytes(info, n, max_num_batched_tokens=max_num_batched_tokens, hybrid=True, **kw) <= avail

    hi = upper or 1 << 24
    if fits(hi):
        return hi
    lo, best = 1, 0
    while lo <= hi:                            # vLLM's own binary search (estimate_max_model_len)
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def max_concurrency(kv_budget_bytes: int, info: ModelInfo, context_len: int, *, block_size: int = 16, tp: int = 1,
                    pp: int = 1, kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 2048,
                    hybrid: bool | None = None, vllm_version: str | None = None, dtype: str | None = None) -> float:
    """Requests of context_len that fit at once, as vLLM logs it: pool blocks (null block included) / blocks per request."""
    hybrid = _ver(vllm_version) >= (0, 8, 0) if hybrid is None else hybrid
    kw = dict(block_size=block_size, tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    need = kv_needed_bytes(info, context_len, max_num_batched_tokens=max_num_batched_tokens, hybrid=hybrid, **kw)
    per_block = _bytes_per_pool_block(info, page_bytes(info, block_size=block_size, tp=tp,
                                                       kv_cache_dtype=kv_cache_dtype, dtype=dtype), pp, hybrid)
    if need <= 0 or kv_budget_bytes <= 0:
        return 0.0
    return round(kv_budget_bytes // per_block * per_block / need, 2)


# -- the budget ---------------------------------------------------------------------------------

def default_utilization(vllm_version: str | None) -> float:
    """vLLM's --gpu-memory-utilization default: 0.90, and 0.92 from 0.20.0."""
    return 0.92 if _ver(vllm_version) >= (0, 20, 0) else 0.90


def default_block_size(info: ModelInfo, *, platform: str = "cuda", compute_capability: tuple[int, int] | None = None,
                       vllm_version: str | None = None) -> int:
    """16 on CUDA (64 for FlashMLA on Hopper+), 128 on the CPU backend (16 for its MLA kernel) (§2.6)."""
    if platform == "cpu":
        return 16 if info.mla else 128
    if info.mla and compute_capability and compute_capability >= (9, 0) and _ver(vllm_version) >= (0, 8, 0):
        return 64
    return 16


def batch_defaults(gpu_total_bytes: int, *, vllm_version: str | None = None, platform: str = "cuda",
                   device_name: str = "", max_model_len: int | None = None, world_size: int = 1,
                   chunked_prefill: bool = False) -> tuple[int, int]:
    """(max_num_batched_tokens the profile run uses, max_num_seqs) for the OpenAI server (§1.8)."""
    ver = _ver(vllm_version)
    if platform == "cpu":
        return 2048 * world_size, 128 * world_size
    if ver < (0, 8, 0):                         # V0: whole context in one profile pass unless chunked
        chunk = 512 if ver < (0, 7, 0) else 2048
        length = max_model_len or 2048
        return (chunk if length > 32768 or chunked_prefill else max(length, 2048)), 256
    if gpu_total_bytes >= 160 * GiB and ver >= (0, 30, 0):
        return 16384, 1024
    if gpu_total_bytes >= 70 * GiB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


def activation_bytes(info: ModelInfo, *, tokens: int, seqs: int, tp: int = 1, dtype: str | None = None) -> int:
    """Estimated profile-run peak: max of the MLP pass and the sampler's fp32 logits, plus 0.05 GiB (§1.8)."""
    act = model_dtype_bytes(info, dtype)
    mlp = tokens * (3 * info.intermediate_size / max(1, tp) + 2 * info.hidden_size) * act
    sampler = seqs * info.vocab_size * 32
    return int(max(mlp, sampler) + 0.05 * GiB)


def cudagraph_bytes(weights_per_rank: int) -> int:
    """Estimated CUDA-graph pool: 0.25 GiB plus 1.5% of the weights, at most 1.5 GiB (§5 observations)."""
    return int(min(1.5 * GiB, 0.25 * GiB + 0.015 * weights_per_rank))


@dataclass(frozen=True)
class Budget:
    """How one rank's memory splits at a utilization; kv_bytes is what the KV cache gets."""

    total_bytes: int
    utilization: float
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    other_processes_bytes: int
    kv_bytes: int
    exact: bool = False          # True when the KV size is given (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes)


def kv_budget(info: ModelInfo, *, gpu_total_bytes: int, utilization: float, tp: int = 1, pp: int = 1,
              vllm_version: str | None = None, enforce_eager: bool = False, max_model_len: int | None = None,
              max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
              other_used_bytes: int = 0, platform: str = "cuda", cpu_kv_space_gib: float | None = None,
              kv_cache_memory_bytes: int | None = None, device_name: str = "", dtype: str | None = None,
              chunked_prefill: bool = False) -> Budget:
    """The KV-cache bytes per rank vLLM will find at this utilization (§1, §8 steps 2-3)."""
    ver = _ver(vllm_version)
    total = int(gpu_total_bytes)
    requested = int(math.ceil(total * utilization))
    weights = int((info.weights_bytes or 0) / max(1, tp * pp))
    if kv_cache_memory_bytes or (platform == "cpu" and cpu_kv_space_gib is not None):
        kv = int(kv_cache_memory_bytes or cpu_kv_space_gib * GiB)
        return Budget(total, utilization, requested, weights, 0, 0, 0, 0, kv, exact=True)
    if platform == "cpu":
        # 0.32 CPU auto mode: ceil(total*util) minus the worker's RSS (weights + ~1 GiB of runtime).
        rss = weights + GiB
        return Budget(total, utilization, requested, weights, 0, rss - weights, 0, 0, requested - rss)
    tokens, seqs = batch_defaults(total, vllm_version=vllm_version, device_name=device_name,
                                  max_model_len=max_model_len, chunked_prefill=chunked_prefill)
    act = activation_bytes(info, tokens=max_num_batched_tokens or tokens, seqs=max_num_seqs or seqs, tp=tp, dtype=dtype)
    non_torch = int((0.25 if tp * pp > 1 else 0.10) * GiB)
    cg = cudagraph_bytes(weights) if ver >= (0, 20, 0) and not enforce_eager else 0
    # V0 0.6.4 and V1 0.7-0.9.0 cap the device globally: other processes' memory comes off the budget.
    global_cap = ver == (0, 6, 4) or (0, 8, 0) <= ver < (0, 9, 1)
    others = int(other_used_bytes) if global_cap else 0
    kv = requested - weights - act - non_torch - cg - others
    return Budget(total, utilization, requested, weights, act, non_torch, cg, others, kv)


def sizing_device(devices: Sequence[GpuDevice], count: int) -> GpuDevice | None:
    """The device that limits a launch on the first ``count`` visible GPUs: the one with the least free memory."""
    used = list(devices)[: max(1, count)]
    return min(used, key=lambda d: d.free_bytes) if used else None


def check_gpu_count(needed: int, devices: Sequence[object]) -> str | None:
    """A message when tp*pp needs more GPUs than are visible (only len(devices) counts), else None."""
    have = len(devices)
    if needed <= have:
        return None
    return (f"tensor_parallel_size x pipeline_parallel_size = {needed} needs {needed} GPUs, "
            f"but only {have} {'is' if have == 1 else 'are'} visible (check CUDA_VISIBLE_DEVICES)")


# -- the first launch -----------------------------------------------------------------------------

@dataclass(frozen=True)
class FirstLaunch:
    """The flags to change before the first launch (vs the user's), why, and whether the inputs were complete."""

    flags: dict[str, str | None] = field(default_factory=dict)     # None: a boolean flag, on
    reasons: dict[str, str] = field(default_factory=dict)
    confident: bool = False
    expect: str = ""     # a failure no length or KV dtype avoids ("no_kv_cache_memory"): the remedies' to pre-empt


def _fmt_util(u: float) -> str:
    return f"{u:.2f}".rstrip("0").rstrip(".")


CHUNKED = "--enable-chunked-prefill"

#: First vLLM with ``--max-model-len auto``: it sizes the length to the KV cache it measured.
AUTO_FIT_SINCE = (0, 14, 0)


#: The CUDA context (and the allocator's first blocks) a vLLM rank creates before it measures free
#: memory: NVML's free figure, read before the launch, still includes it; vLLM's own does not.
CUDA_CONTEXT_BYTES = int(0.4 * GiB)


def utilization_under_free(free_bytes: float, total_bytes: float, *, context_bytes: float = CUDA_CONTEXT_BYTES,
                           margin: float = 0.005) -> float:
    """The highest --gpu-memory-utilization (0.01 steps) that vLLM's start-up free-memory check passes.

    ``free_bytes`` as NVML reports it before the launch (``context_bytes`` is then what vLLM's own
    CUDA context will take from it), or as vLLM printed it (pass ``context_bytes=0``); ``margin`` of
    the total is held back for other processes' memory moving meanwhile.
    """
    return math.floor(((free_bytes - context_bytes) / total_bytes - margin) * 100) / 100


def v0_chunked_gain_tokens(info: ModelInfo, *, from_tokens: int, to_tokens: int, tp: int = 1,
                           kv_cache_dtype: str = "auto", dtype: str | None = None, seqs: int = 256) -> int:
    """KV tokens a V0 launch gains when its profile run shrinks from ``from_tokens`` to ``to_tokens``.

    V0 (0.5-0.7) profiles the whole context in one pass unless chunked prefill is on; the KV cache
    gets what the profile's activation peak leaves. Only the difference of two activation
    estimates is used, so it corrects a capacity vLLM measured rather than predicting one.
    """
    before = activation_bytes(info, tokens=from_tokens, seqs=seqs, tp=tp, dtype=dtype)
    after = activation_bytes(info, tokens=to_tokens, seqs=seqs, tp=tp, dtype=dtype)
    per_token = kv_bytes_per_token(info, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    return max(0, before - after) // max(1, per_token)


def first_launch(info: ModelInfo | None, *, gpu_total_bytes: int | None, gpu_free_bytes: int | None, gpus: int,
                 flags: Flags, vllm_version: str | None, margin: float = 0.03, min_model_len: int = 2048,
                 platform: str = "cuda", cpu_kv_space_gib: float | None = None,
                 compute_capability: tuple[int, int] | None = None, device_name: str = "",
                 context_bytes: int = CUDA_CONTEXT_BYTES, utilization_margin: float = 0.005) -> FirstLaunch:
    """Flags that make the first launch fit: a lower --max-model-len, fp8 KV, or a lower utilization for busy GPUs.

    ``gpu_free_bytes`` is NVML's figure before the launch; when it is vLLM's own (printed after its
    CUDA context exists), pass ``context_bytes=0``.
    """
    tp = flags.get_int("--tensor-parallel-size") or 1
    pp = flags.get_int("--pipeline-parallel-size") or 1
    if info is None or (platform != "cpu" and not gpu_total_bytes) or (platform == "cpu" and not gpu_total_bytes
                                                                      and cpu_kv_space_gib is None):
        return FirstLaunch(confident=False)
    if platform != "cpu" and tp * pp > gpus:
        return FirstLaunch(confident=False)
    total = int(gpu_total_bytes or 0)
    free = total if gpu_free_bytes is None else int(gpu_free_bytes)
    # what other processes hold (vLLM's own free figure already lacks its CUDA context)
    held = 0 if gpu_free_bytes is None else max(0, total - free - (CUDA_CONTEXT_BYTES - context_bytes))
    ver = _ver(vllm_version)
    out: dict[str, str | None] = {}
    why: dict[str, str] = {}

    util = flags.get_float("--gpu-memory-utilization") or default_utilization(vllm_version)
    if platform != "cpu" and ver >= (0, 9, 1) and free - context_bytes < total * util:
        lowered = utilization_under_free(free, total, context_bytes=context_bytes, margin=utilization_margin)
        if 0 < lowered < util:
            out["--gpu-memory-utilization"] = _fmt_util(lowered)
            why["--gpu-memory-utilization"] = (
                f"only {free / GiB:.2f} of {total / GiB:.2f} GiB is free (other processes hold memory); vLLM "
                f"refuses to start when free memory is below {util:.2f} of the total")
            util = lowered

    # Before 0.20 CUDA graphs are captured after the KV cache is sized, outside the budget: what
    # other processes leave must hold the budget plus the graphs and the CUDA context.
    global_cap = (0, 8, 0) <= ver < (0, 9, 1) or ver[:2] == (0, 6) and ver[2] == 4
    if platform != "cpu" and ver < (0, 20, 0) and not global_cap and not flags.enabled("--enforce-eager"):
        tp_ = max(1, flags.get_int("--tensor-parallel-size") or 1)
        graphs = cudagraph_bytes(int((info.weights_bytes or 0) / tp_))
        reserve = graphs + context_bytes
        room = utilization_under_free(free - graphs, total, context_bytes=context_bytes, margin=0.0)
        if 0 < room < util and held:
            out["--gpu-memory-utilization"] = _fmt_util(room)
            why["--gpu-memory-utilization"] = (
                f"other processes hold {held / GiB:.2f} GiB; vLLM < 0.20 captures CUDA graphs "
                f"outside its budget, so {room:.2f} leaves {reserve / GiB:.2f} GiB for them and the CUDA context")
            util = room

    if flags.get("--max-model-len") in ("auto", "-1"):
        return FirstLaunch(out, why, True)     # vLLM's own auto-fit does the sizing
    derived = derive_max_model_len(info, vllm_version, disable_sliding_window=flags.enabled("--disable-sliding-window"))
    asked = flags.get_int("--max-model-len") or derived
    dtype = flags.get("--dtype")
    kv_dtype = flags.get("--kv-cache-dtype") or "auto"
    block = flags.get_int("--block-size") or default_block_size(
        info, platform=platform, compute_capability=compute_capability, vllm_version=vllm_version)
    hybrid = None if not flags.enabled("--disable-hybrid-kv-cache-manager") else False
    common = dict(gpu_total_bytes=total, utilization=util, tp=tp, pp=pp, vllm_version=vllm_version,
                  enforce_eager=flags.enabled("--enforce-eager"), other_used_bytes=held,
                  platform=platform, cpu_kv_space_gib=cpu_kv_space_gib,
                  kv_cache_memory_bytes=flags.get_int("--kv-cache-memory-bytes"),
                  max_num_batched_tokens=flags.get_int("--max-num-batched-tokens"),
                  max_num_seqs=flags.get_int("--max-num-seqs"), device_name=device_name, dtype=dtype)

    tokens = common["max_num_batched_tokens"] or batch_defaults(total, vllm_version=vllm_version,
                                                                  platform=platform)[0]

    chunked = flags.enabled(CHUNKED)

    def fit_at(length: int, kv_dtype_: str, margin: float = margin) -> int:
        b = kv_budget(info, max_model_len=length, chunked_prefill=chunked, **common)
        kv = b.kv_bytes if b.exact else int(b.kv_bytes * (1 - margin))
        return fit_max_model_len(kv, info, tp=tp, pp=pp, kv_cache_dtype=kv_dtype_, block_size=block,
                                 vllm_version=vllm_version, upper=asked, max_num_batched_tokens=tokens,
                                 hybrid=hybrid, dtype=dtype)

    def fit_for(kv_dtype_: str, margin: float = margin) -> int:
        if ver >= (0, 8, 0) or platform == "cpu" or chunked:
            return fit_at(asked, kv_dtype_, margin)   # the profile run does not depend on the length
        # V0 profiles up to the whole context at once (chunked only above 32768), so a shorter
        # context frees activation memory: the largest block-aligned L with L <= fit(budget(L)),
        # searched on each side of the 32K switch where that predicate is monotone.
        best = 0
        for lo, hi in ((32769, asked), (1, min(asked, 32768))):
            if lo > hi:
                continue
            if fit_at(hi, kv_dtype_, margin) >= hi:
                return max(best, hi)
            k_lo, k_hi = _cdiv(lo, block), hi // block
            while k_lo <= k_hi:
                mid = (k_lo + k_hi) // 2
                if fit_at(mid * block, kv_dtype_, margin) >= mid * block:
                    best, k_lo = max(best, mid * block), mid + 1
                else:
                    k_hi = mid - 1
        return best

    try:
        fit = fit_for(kv_dtype)
    except ValueError:         # a KV dtype this model does not know: leave it to vLLM
        return FirstLaunch(out, why, False)
    if (platform != "cpu" and ver < (0, 8, 0) and fit < asked and not chunked
            and not common["max_num_batched_tokens"]):
        # V0 profiles the whole context at once up to 32768 tokens: chunked prefill (what V1 always
        # does, and V0 itself above 32768) profiles one chunk and leaves the rest to the KV cache.
        chunked = True                          # fit_at and fit_for read it
        with_chunks = fit_for(kv_dtype)
        chunked = with_chunks > fit
        if chunked:
            fit = with_chunks
            out[CHUNKED] = None
            why[CHUNKED] = ("below 32768 tokens vLLM V0 profiles the whole context at once; in chunks the "
                            "profile takes less memory, and the KV cache more")
    if fit >= asked:
        return FirstLaunch(out, why, True)
    # The margin is for shrinking safely, not for cutting a request the estimate says fits:
    # a borderline miss costs one reactive relaunch, a needless cut costs context for good.
    if fit_for(kv_dtype, 0.0) >= asked:
        return FirstLaunch(out, why, True)
    # vLLM 0.14+ can size the length to the KV cache it measures (--max-model-len auto). Where the
    # plan's length is an estimate, vLLM's exact figure replaces it; the guard holds vLLM's choice
    # between the floor and the length asked (diagnosis.check_auto_fit).
    measures = parse_version(vllm_version) is not None and ver >= AUTO_FIT_SINCE

    def length(fit_: int, exact: bool, said: str) -> str:
        if measures and not exact:
            why["--max-model-len"] = (f"{said}; about {fit_} by the plan's estimate, so vLLM sizes the length "
                                      f"to the KV cache it measures (auto), held between {min_model_len} "
                                      f"and {asked}")
            return "auto"
        why["--max-model-len"] = f"{said}; {fit_} do (block-aligned" + (
            "" if exact else f", {margin:.0%} held back for estimate error") + ")"
        return str(fit_)

    if fit >= min_model_len:
        exact = kv_budget(info, max_model_len=fit, **common).exact
        out["--max-model-len"] = length(fit, exact, f"{asked} tokens do not fit in the KV cache"
                                        + (" as configured" if exact else f" at utilization {util:.2f}"))
        return FirstLaunch(out, why, True)
    cc_ok = compute_capability is not None and fp8_kv_supported(compute_capability, vllm_version, info.mla)
    if platform != "cpu" and kv_dtype == "auto" and cc_ok:
        fit8 = fit_for("fp8")
        if fit8 >= min_model_len:
            out["--kv-cache-dtype"] = "fp8"
            why["--kv-cache-dtype"] = (f"at the model dtype only {fit} tokens fit (< {min_model_len}); "
                                       f"fp8 halves the KV cache")
            if fit8 < asked:
                exact = kv_budget(info, max_model_len=fit8, **common).exact
                out["--max-model-len"] = length(fit8, exact, f"{asked} tokens do not fit even with fp8 KV")
            return FirstLaunch(out, why, True)
    left = kv_budget(info, max_model_len=asked, **common)
    return FirstLaunch(out, why, True, expect="no_kv_cache_memory" if left.kv_bytes <= 0 else "")


@dataclass(frozen=True)
class Sizing:
    """What the plan knows besides the flags and the GPU's memory: the model, the GPUs, the platform.

    The shell builds one at start-up; the remedy policy asks it, with the memory figures vLLM
    printed, what a relaunch's other flags imply for the length, so that a predictable second
    failure is not waited for.
    """

    info: ModelInfo
    gpus: int = 1
    vllm_version: str | None = None
    margin: float = 0.03
    min_model_len: int = 2048
    platform: str = "cuda"
    cpu_kv_space_gib: float | None = None
    compute_capability: tuple[int, int] | None = None
    device_name: str = ""
    utilization_margin: float = 0.005

    def first_launch(self, flags: Flags, *, total_bytes: int | None, free_bytes: int | None,
                     vllm_version: str | None = None, context_bytes: int = CUDA_CONTEXT_BYTES) -> FirstLaunch:
        return first_launch(self.info, gpu_total_bytes=total_bytes, gpu_free_bytes=free_bytes, gpus=self.gpus,
                            flags=flags, vllm_version=vllm_version or self.vllm_version, margin=self.margin,
                            min_model_len=self.min_model_len, platform=self.platform,
                            cpu_kv_space_gib=self.cpu_kv_space_gib, compute_capability=self.compute_capability,
                            device_name=self.device_name, context_bytes=context_bytes,
                            utilization_margin=self.utilization_margin)
