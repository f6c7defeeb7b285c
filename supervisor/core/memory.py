"""vLLM's memory arithmetic: what one token of KV cache costs, how long a context a KV budget holds,
and how one rank's memory splits between weights, activations, CUDA graphs and the KV cache.

Pure. Two kinds of figures, kept apart on purpose (``docs/memory-model.md`` explains each term
and where in vLLM's source it comes from):

* exact -- KV bytes per token, page and block arithmetic, and the longest ``max_model_len`` a
  given budget holds (the closed form of vLLM's own search, minus the null block from 0.29);
* estimated -- the activation peak, non-torch memory and CUDA-graph memory that vLLM measures
  at start-up; the plan holds back a margin for their error (or, from vLLM 0.14, leaves the
  length to vLLM's own measurement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from supervisor.core import vllm
from supervisor.core.model import ModelInfo
from supervisor.core.units import GiB

_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def model_dtype_bytes(info: ModelInfo, dtype: str | None = None) -> int:
    """Bytes per element of the weights/activations vLLM runs (``--dtype``; auto downcasts float32 to 16-bit)."""
    d = (dtype or "auto").lower()
    if d in ("float32", "float"):
        return 4
    return 2


def kv_dtype_bytes(info: ModelInfo, kv_cache_dtype: str = "auto", dtype: str | None = None) -> int:
    """Bytes per KV element: the model dtype for auto, 1 for any fp8 variant ."""
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
    """KV heads one TP rank stores: MLA keeps one latent on every rank; GQA replicates when TP > heads."""
    if info.mla:
        return 1
    return max(1, info.num_kv_heads // max(1, tp))


def _head_size(info: ModelInfo) -> int:
    return info.kv_lora_rank + info.qk_rope_head_dim if info.mla else info.head_dim


def page_bytes(info: ModelInfo, *, block_size: int = 16, tp: int = 1, kv_cache_dtype: str = "auto",
               dtype: str | None = None) -> int:
    """Bytes of one KV block in one layer on one rank (MLA stores K only)."""
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
    """KV bytes vLLM V1 demands for one request of max_model_len (``max_memory_usage_bytes`` summed over layers)."""
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
        return page * min(full, sliding)      # one block id spans one group
    return page * (full + sliding)


def usable_kv_bytes(kv_budget_bytes: int, info: ModelInfo, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", vllm_version: str | None = None, hybrid: bool | None = None,
                    dtype: str | None = None) -> int:
    """The budget vLLM checks a request against: from 0.29 one pool block (the null block) is held back."""
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    if vllm.holds_null_block(vllm_version):
        page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
        return kv_budget_bytes - _bytes_per_pool_block(info, page, pp, hybrid)
    return kv_budget_bytes


def fit_max_model_len(kv_budget_bytes: int, info: ModelInfo, *, tp: int = 1, kv_cache_dtype: str = "auto",
                      block_size: int = 16, vllm_version: str | None = None, pp: int = 1, upper: int | None = None,
                      max_num_batched_tokens: int = 2048, hybrid: bool | None = None, dtype: str | None = None) -> int:
    """The largest max_model_len vLLM accepts with this KV budget per rank (its "estimated maximum model length"); 0 if none."""
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
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
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    kw = dict(block_size=block_size, tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    need = kv_needed_bytes(info, context_len, max_num_batched_tokens=max_num_batched_tokens, hybrid=hybrid, **kw)
    per_block = _bytes_per_pool_block(info, page_bytes(info, block_size=block_size, tp=tp,
                                                       kv_cache_dtype=kv_cache_dtype, dtype=dtype), pp, hybrid)
    if need <= 0 or kv_budget_bytes <= 0:
        return 0.0
    return round(kv_budget_bytes // per_block * per_block / need, 2)



# -- the budget (estimated terms) ---------------------------------------------------------------

def activation_bytes(info: ModelInfo, *, tokens: int, seqs: int, tp: int = 1, dtype: str | None = None) -> int:
    """Estimated profile-run peak: max of the MLP pass and the sampler's fp32 logits, plus 0.05 GiB."""
    act = model_dtype_bytes(info, dtype)
    mlp = tokens * (3 * info.intermediate_size / max(1, tp) + 2 * info.hidden_size) * act
    sampler = seqs * info.vocab_size * 32
    return int(max(mlp, sampler) + 0.05 * GiB)


def cudagraph_bytes(weights_per_rank: int) -> int:
    """Estimated CUDA-graph pool: 0.25 GiB plus 1.5% of the weights, at most 1.5 GiB."""
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
    """The KV-cache bytes per rank vLLM will find at this utilization."""
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
    tokens, seqs = vllm.batch_defaults(total, vllm_version=vllm_version, device_name=device_name,
                                  max_model_len=max_model_len, chunked_prefill=chunked_prefill)
    act = activation_bytes(info, tokens=max_num_batched_tokens or tokens, seqs=max_num_seqs or seqs, tp=tp, dtype=dtype)
    non_torch = int((0.25 if tp * pp > 1 else 0.10) * GiB)
    cg = cudagraph_bytes(weights) if not vllm.graphs_outside_budget(vllm_version) and not enforce_eager else 0
    others = int(other_used_bytes) if vllm.caps_device_globally(vllm_version) else 0
    kv = requested - weights - act - non_torch - cg - others
    return Budget(total, utilization, requested, weights, act, non_torch, cg, others, kv)
