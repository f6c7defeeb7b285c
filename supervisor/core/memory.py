"""vLLM's memory arithmetic: what one token of KV cache costs, how long a context a KV budget holds,
and how one rank's memory splits between weights, activations, CUDA graphs and the KV cache.

Pure. Two kinds of figures, kept apart on purpose (``docs/memory-model.md`` explains each term,
the vLLM versions it holds for and where in vLLM's source it comes from):

* exact -- KV bytes per token, page and block arithmetic, and the longest ``max_model_len`` a
  given budget holds (the closed form of vLLM's own search, minus the null block from 0.29);
* estimated -- the weights without an index, the profile's activation peak, non-torch memory and
  CUDA-graph memory that vLLM measures at start-up (:func:`kv_budget`), calibrated on real
  start-ups (``benchmarks/calibration``), each budget with its error band (:func:`band_bytes`).
  What a healthy launch printed replaces the estimate (:func:`measured_overhead_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, cast

from supervisor.core import vllm
from supervisor.core.gpus import sm_count
from supervisor.core.model import ModelInfo, QuantScheme, Shape, checkpoint_bytes, quant_scheme, weight_parts
from supervisor.core.units import GiB, MiB

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
    """(full, windowed) layers on the busiest pipeline stage (windowed: sliding or chunked)."""
    pp = max(1, pp)
    return _cdiv(info.full_layers, pp), _cdiv(info.sliding_layers + info.chunked_layers, pp)


@dataclass(frozen=True)
class KvGroups:
    """How vLLM V1 groups a model's attention layers into KV-cache groups (``get_kv_cache_groups``).

    One group when every layer has the same spec (all full, or all sliding with one window): its block
    holds one page per layer of the stage. A hybrid model (full + sliding or chunked layers) is split into
    groups of ``size`` layers of one kind each (``_get_kv_cache_groups_uniform_page_size``: the smallest
    kind's count, or the largest where that is under 1.5x the smallest; the last group of a kind padded),
    and one block id spans a group: its memory is ``size`` pages.
    """

    size: int                     # layers per group on the busiest stage (pages per block id)
    kinds: tuple[str, ...]        # one entry per group: "full", "sliding" or "chunked"

    @property
    def uniform(self) -> bool:
        return len(self.kinds) == 1


def kv_groups(info: ModelInfo, *, pp: int = 1, hybrid: bool = True) -> KvGroups:
    """The KV-cache groups of ``info`` on the busiest pipeline stage (``hybrid=False``: vLLM's
    ``--disable-hybrid-kv-cache-manager`` or an engine without the manager: every layer full)."""
    pp = max(1, pp)
    counts = {"full": info.full_layers, "sliding": info.sliding_layers, "chunked": info.chunked_layers}
    if not hybrid:
        counts = {"full": info.num_layers, "sliding": 0, "chunked": 0}
    present = {k: n for k, n in counts.items() if n > 0}
    if len(present) <= 1:
        kind = next(iter(present), "full")
        return KvGroups(max(stage_layers(info.num_layers, pp)), (kind,))
    lo, hi = min(present.values()), max(present.values())
    size = hi if hi < lo * 1.5 else lo
    kinds = tuple(k for k, n in present.items() for _ in range(_cdiv(n, size)))
    # PP: each stage holds its share of every group (layers[i::num_groups]), so a block id spans fewer pages.
    return KvGroups(_cdiv(size, pp), kinds)


def _blocks_for(kind: str, length: int, info: ModelInfo, block_size: int, max_num_batched_tokens: int) -> int:
    """Blocks one request of ``length`` tokens needs in one layer of ``kind`` (``max_memory_usage_bytes``
    of FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec in ``v1/kv_cache_interface.py``)."""
    if kind == "sliding" and info.sliding_window:
        return _cdiv(min(info.sliding_window - 1 + max_num_batched_tokens, length), block_size) + 1
    if kind == "chunked" and info.attention_chunk_size:
        return _cdiv(min(info.attention_chunk_size + max_num_batched_tokens, length), block_size)
    return _cdiv(length, block_size)


def kv_needed_bytes(info: ModelInfo, max_model_len: int, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 2048, hybrid: bool = True,
                    dtype: str | None = None) -> int:
    """KV bytes vLLM V1 demands for one request of max_model_len on the busiest stage
    (``_max_memory_usage_bytes_from_groups``: pages per block id x the blocks every group needs)."""
    page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    g = kv_groups(info, pp=pp, hybrid=hybrid)
    return g.size * page * sum(_blocks_for(k, max_model_len, info, block_size, max_num_batched_tokens)
                               for k in g.kinds)


def _bytes_per_pool_block(info: ModelInfo, page: int, pp: int, hybrid: bool) -> int:
    """One block id's memory: a page in every layer of its group."""
    return page * kv_groups(info, pp=pp, hybrid=hybrid).size


def kv_cache_blocks(kv_budget_bytes: int, info: ModelInfo, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", hybrid: bool | None = None, vllm_version: str | None = None,
                    dtype: str | None = None) -> int:
    """The block pool vLLM allocates from a KV budget per rank (``get_num_blocks``: budget // page // layers per
    block id), the null block included."""
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    return max(0, int(kv_budget_bytes) // _bytes_per_pool_block(info, page, pp, hybrid))


def kv_cache_tokens(kv_budget_bytes: int, info: ModelInfo, *, block_size: int = 16, tp: int = 1, pp: int = 1,
                    kv_cache_dtype: str = "auto", hybrid: bool | None = None, vllm_version: str | None = None,
                    dtype: str | None = None) -> int:
    """What vLLM prints as "GPU KV cache size: N tokens" (``_report_kv_cache_config``): the pool's blocks
    shared out over the groups, times the block size. For a hybrid model this is the tokens every layer
    could hold at once, less than the longest single request vLLM accepts (:func:`fit_max_model_len`)."""
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    blocks = kv_cache_blocks(kv_budget_bytes, info, block_size=block_size, tp=tp, pp=pp,
                             kv_cache_dtype=kv_cache_dtype, hybrid=hybrid, dtype=dtype)
    return blocks // len(kv_groups(info, pp=pp, hybrid=hybrid).kinds) * block_size


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
                      max_num_batched_tokens: int = 2048, hybrid: bool | None = None, dtype: str | None = None,
                      within_kv_cache: bool = True) -> int:
    """The largest max_model_len the plan offers for a KV budget per rank; 0 if none.

    vLLM accepts a length whose one request fits the budget (``_check_enough_kv_cache_memory``, its
    binary search ``_estimate_max_model_len_from_groups``, the null block held back from 0.29). For a
    hybrid model that request can be several times what vLLM then prints as its KV cache size, so with
    ``within_kv_cache`` (the plan's rule) the length is also held to "GPU KV cache size: N tokens"
    (:func:`kv_cache_tokens`): a length the cache holds in every layer at once.
    """
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    kw: dict[str, Any] = dict(block_size=block_size, tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    avail = usable_kv_bytes(kv_budget_bytes, info, vllm_version=vllm_version, hybrid=hybrid, **kw)
    if avail <= 0:
        return 0
    g = kv_groups(info, pp=pp, hybrid=hybrid)
    page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    if g.uniform and g.kinds[0] == "full":
        fit = avail // (page * g.size) * block_size
    else:
        def fits(n: int) -> bool:
            return kv_needed_bytes(info, n, max_num_batched_tokens=max_num_batched_tokens, hybrid=hybrid,
                                   **kw) <= avail

        hi = upper or 1 << 24
        if fits(hi):
            fit = hi
        else:
            lo, fit = 1, 0
            while lo <= hi:                            # vLLM's own binary search
                mid = (lo + hi) // 2
                if fits(mid):
                    fit, lo = mid, mid + 1
                else:
                    hi = mid - 1
    if within_kv_cache:
        fit = min(fit, kv_cache_tokens(kv_budget_bytes, info, hybrid=hybrid, **kw))
    return min(fit, upper) if upper else fit


def max_concurrency(kv_budget_bytes: int, info: ModelInfo, context_len: int, *, block_size: int = 16, tp: int = 1,
                    pp: int = 1, kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 2048,
                    hybrid: bool | None = None, vllm_version: str | None = None, dtype: str | None = None) -> float:
    """Requests of context_len that fit at once, as vLLM logs it (``get_max_concurrency_for_kv_cache_config``):
    pool blocks (null block included) / the blocks one request needs across the groups."""
    hybrid = vllm.hybrid_kv(vllm_version) if hybrid is None else hybrid
    if context_len <= 0 or kv_budget_bytes <= 0:
        return 0.0
    g = kv_groups(info, pp=pp, hybrid=hybrid)
    blocks = kv_cache_blocks(kv_budget_bytes, info, block_size=block_size, tp=tp, pp=pp,
                             kv_cache_dtype=kv_cache_dtype, hybrid=hybrid, dtype=dtype)
    need = sum(_blocks_for(k, context_len, info, block_size, max_num_batched_tokens) for k in g.kinds)
    return round(blocks / need, 2) if need else 0.0



# -- GPUs ----------------------------------------------------------------------------------------

#: Name fragments of consumer cards: no NVLink, NCCL goes through host memory (smaller buffers).
_CONSUMER = ("geforce", "rtx 20", "rtx 30", "rtx 40", "rtx 50", "titan")

#: Compute capability by a name fragment, for a GPU named without NVML (``plan --gpu-name``).
GPU_COMPUTE_CAPABILITY = {
    "b300": (10, 3), "b200": (10, 0), "gb200": (10, 0), "h200": (9, 0), "h100": (9, 0), "h800": (9, 0),
    "h20": (9, 0), "gh200": (9, 0), "l40s": (8, 9), "l40": (8, 9), "l4": (8, 9), "4090": (8, 9),
    "4080": (8, 9), "rtx 6000 ada": (8, 9), "5090": (12, 0), "a100": (8, 0), "a800": (8, 0), "a30": (8, 0),
    "a6000": (8, 6), "a40": (8, 6), "a10g": (8, 6), "a10": (8, 6), "3090": (8, 6), "3080": (8, 6),
    "t4": (7, 5), "v100": (7, 0),
}


def datacenter_gpu(device_name: str) -> bool:
    """False for consumer cards (GeForce); True otherwise, and for an unknown name (the larger NCCL figure)."""
    name = (device_name or "").lower()
    return not any(k in name for k in _CONSUMER) and not any(k in name for k in ("3090", "4090", "5090", "3080",
                                                                               "4080"))


def gpu_compute_capability(device_name: str) -> tuple[int, int] | None:
    """The compute capability a GPU's name implies, None when the name is not known."""
    name = (device_name or "").lower()
    for key in sorted(GPU_COMPUTE_CAPABILITY, key=len, reverse=True):
        if key in name:
            return GPU_COMPUTE_CAPABILITY[key]
    return None


# -- the budget's estimated terms (docs/memory-model.md sections 2-5) ---------------------------

#: The few constants the model fits on the calibration start-ups (``benchmarks/calibration`` and
#: ``benchmarks/calibration-llmd``), one per term and regime, never one per start-up. ``benchmarks/accuracy.py``
#: refits them from the printed figures (:func:`benchmarks.accuracy.fit`) -- leave-one-out and across the
#: two sets -- and a test holds these values to what the fit returns. GiB.
@dataclass(frozen=True)
class Calibration:
    #: Torch allocations of the profile run besides its forward and sampler tensors (cuBLAS/cuBLASLt and
    #: attention workspaces, persistent input buffers): the median residual of the printed activation.
    act_fixed: float = 0.04
    #: Non-torch memory one rank adds while profiling at TP = PP = 1 (kernel images, cuBLAS handles):
    #: before vLLM 0.17 (the 0.11 start-ups) and from it (the 0.19 sweep).
    nt_single: float = 0.13
    nt_single_017: float = 0.25
    #: From 0.17 with TP or PP > 1 and no all-reduce fusion: what is left after the distributed start-up
    #: (which allocates most of it before the snapshot).
    nt_multi_017: float = 0.07
    #: NCCL's buffers and the custom all-reduce at TP or PP = 2 on an NVLink/NVSwitch datacenter GPU, and
    #: the growth per rank beyond 2 (a prior), before 0.17 or without the fusion.
    nt_parallel: float = 0.41
    nt_parallel_per_rank: float = 0.05
    #: ... over PCIe (NCCL through host memory), per rank beyond 2 a prior.
    nt_parallel_pcie: float = 0.12
    nt_parallel_pcie_per_rank: float = 0.02
    #: The FlashInfer all-reduce fusion's workspaces (0.17+, TP > 1 on Hopper/Blackwell) with NCCL's
    #: buffers: at TP 2, and per rank beyond 2 (a least-squares line over the TP 2 and TP 4 start-ups).
    nt_fusion: float = 2.01
    nt_fusion_per_rank: float = 0.045
    #: CUDA graphs (fitted on the 0.19 sweep's measured capture memory): a fixed part (GiB), MiB per
    #: captured graph and decoder layer on the rank (least squares over the dense models), and more per
    #: routed MoE layer (the median excess of the MoE models).
    graph_fixed: float = 0.36
    graph_per_graph_layer_mib: float = 0.161
    graph_moe_per_graph_layer_mib: float = 0.33


#: The constants in use (fitted on both calibration sets).
CALIBRATION = Calibration()

#: Torch allocations of the profile run besides its forward and sampler tensors (the fitted constant).
ACT_FIXED_BYTES = int(CALIBRATION.act_fixed * GiB)
#: Non-torch memory at TP = PP = 1 before vLLM 0.17 (the fitted constant; see :class:`Calibration`).
NON_TORCH_BASE_BYTES = int(CALIBRATION.nt_single * GiB)
#: More with TP or PP > 1 on an NVLink datacenter GPU before 0.17, and per rank beyond 2.
NON_TORCH_PARALLEL_BYTES = int(CALIBRATION.nt_parallel * GiB)
NON_TORCH_PER_EXTRA_RANK_BYTES = int(CALIBRATION.nt_parallel_per_rank * GiB)
#: ... and over PCIe: an RTX 4090 TP2 start-up, +0.12 GiB.
NON_TORCH_PARALLEL_CONSUMER_BYTES = int(CALIBRATION.nt_parallel_pcie * GiB)
#: NCCL communicator buffers created after the snapshot in V0 and V1 <= 0.10 (a prior).
NCCL_INIT_BYTES = int(0.15 * GiB)
#: The CUDA context the global-cap families count as non-torch memory (an RTX 3090 start-up: 0.35 GiB
#: with the base; datacenter GPUs load a larger context, a prior).
CUDA_CONTEXT_CONSUMER_BYTES = int(0.25 * GiB)
CUDA_CONTEXT_DATACENTER_BYTES = int(0.45 * GiB)
#: Before vLLM 0.20 graphs are captured outside the budget; the room left for them is the estimate's
#: upper end (x2), and at least this.
GRAPH_OUTSIDE_FLOOR_BYTES = int(0.5 * GiB)
#: ... the estimate times this (the spread of the sweep's measured captures around it).
GRAPH_RESERVE_FACTOR = 1.3
#: SMs assumed for the Triton sampler's per-SM buffer when the GPU is not known (an H100's).
DEFAULT_SMS = 132


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def stage_layers(layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline stage (``distributed/utils.py:get_pp_indices``: the remainder goes
    to the stages before the last)."""
    pp = max(1, pp)
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def _expert_bytes(shape: Shape, q: QuantScheme, tp: int) -> float:
    """One layer's routed experts on one TP rank (expert parallelism off: the intermediate dim is sharded)."""
    if not shape.experts:
        return 0.0
    i_pad = _round_up(shape.moe_intermediate // tp, q.expert_pad[0])
    h_pad = _round_up(shape.hidden, q.expert_pad[1])
    elems = 2 * i_pad * _round_up(h_pad, q.expert_k_pad) + h_pad * _round_up(i_pad, q.expert_k_pad)
    bias = (2 * i_pad + h_pad) * q.expert_bias_bytes if shape.router_bias else 0
    return shape.experts * (elems * q.expert_bpw + bias)


def rope_cache_bytes(shape: Shape, dtype_bytes: float = 2) -> int:
    """vLLM precomputes cos/sin for every position, one cache per distinct RoPE for all layers, in the
    model dtype (``rotary_embedding/base.py``; linear scaling: max x factor positions); DeepSeek's
    YaRN (MLA) in fp32."""
    if shape.mla:
        return shape.max_positions * shape.qk_rope * 4
    return int(sum(shape.rope_caches or (shape.max_positions,)) * shape.rotary_dim * dtype_bytes)


def weights_per_stage(info: ModelInfo, *, tp: int = 1, pp: int = 1, quantization: str | None = None,
                      compute_capability: tuple[int, int] | None = None, vllm_version: str | None = None,
                      mxfp4_backend: str | None = None, dtype: str | None = None) -> list[int]:
    """What "Model loading took X GiB" prints on one rank of each pipeline stage.

    The checkpoint's tensors as the quantization method holds them (``--quantization fp8`` quantizes a
    16-bit checkpoint's linear layers at load; ``--dtype float32`` widens what stays unquantized), padded
    by the MoE kernels, sharded by TP (vocab-parallel embeddings, column/row-parallel linears, the
    vision towers; norms and routers replicated) and split by PP, plus the rotary cos/sin cache. With an
    index (or the files) the checkpoint part is scaled to the exact size read -- the size of the
    checkpoint as stored, before any load-time conversion; otherwise it is the shape-based estimate.
    """
    tp, pp = max(1, tp), max(1, pp)
    shape = info.shape
    if not shape.layers or not shape.hidden:
        return [int((info.weights_bytes or 0) / (tp * pp))] * pp
    q = quant_scheme(info.config, quantization=quantization, compute_capability=compute_capability,
                     mxfp4_backend=mxfp4_backend, vllm_version=vllm_version, dtype=dtype)
    stored = quant_scheme(info.config)
    p = weight_parts(shape)
    ckpt = checkpoint_bytes(shape, stored)
    scale = (info.weights_bytes / ckpt) if info.weights_bytes and ckpt and info.weights_exact else 1.0
    b16 = q.unquantized_bpw
    out, start = [], 0
    stages = stage_layers(shape.layers, pp)
    for i, layers in enumerate(stages):
        frac = layers / shape.layers
        moe_here = max(0, layers - max(0, shape.dense_layers - start)) if shape.experts else 0
        start += layers
        b = 0.0
        if i == 0:
            b += p.embed * b16 / tp + p.vision * b16 / tp
        if i == len(stages) - 1:
            b += p.lm_head * q.lm_head_bpw / tp + shape.hidden * b16
            if shape.tied and pp > 1:
                b += p.embed * b16 / tp
        b += frac * (p.attn * q.linear_bpw / tp + p.mlp * q.mlp_bpw / tp + (p.router + p.norms - shape.hidden) * b16)
        b += moe_here * _expert_bytes(shape, q, tp)
        out.append(int(b * scale + rope_cache_bytes(shape, b16)))
    return out


def moe_workspace_bytes(info: ModelInfo, tokens: int, *, tp: int = 1, dtype: str | None = None,
                        quantization: str | None = None) -> int:
    """The fused-MoE buffers one rank keeps for ``tokens`` tokens (``TritonExperts.workspace_shapes``:
    ``M x top_k x max(I, H)`` and ``M x top_k x max(2I, H)``; the gpt-oss Triton kernels keep
    ``M x top_k x I`` and the output ``M x H``), I the experts' width on the rank."""
    s = info.shape
    if not s.experts or not s.topk:
        return 0
    act = model_dtype_bytes(info, dtype)
    i = s.moe_intermediate // max(1, tp)
    if info.quantization == "mxfp4":
        return int(tokens * (s.topk * i + s.hidden) * act)
    return int(tokens * s.topk * (max(i, s.hidden) + max(2 * i, s.hidden)) * act)


def forward_peak_bytes(info: ModelInfo, tokens: int, *, tp: int = 1, dtype: str | None = None,
                       persistent_moe: bool = False) -> int:
    """Peak of one decoder layer's MLP in the profile's dummy forward of ``tokens`` tokens on one rank.

    Live at the down projection: the layer input and residual (2 x H), the gate_up output (2 x I/tp),
    the activation's output (I/tp) and the down projection's output (H). A MoE layer holds the fused-MoE
    caches per routed token (top-k x (3 x I_moe/tp + H)) and 3 x H; with ``persistent_moe`` (0.14+) the
    caches are the workspace counted apart (:func:`moe_workspace_bytes`), and only the layer's own
    tensors (3 x H, the shared expert's MLP) are added here.
    """
    s = info.shape
    H = s.hidden
    dense = 3 * ((s.dense_intermediate or s.intermediate) // max(1, tp)) + 3 * H
    per_token = dense
    if s.experts:
        shared = 3 * (s.shared_intermediate // max(1, tp)) if s.shared_intermediate else 0
        moe = 3 * H + shared + (0 if persistent_moe else s.topk * (3 * (s.moe_intermediate // max(1, tp)) + H))
        per_token = max(moe, dense if s.dense_layers else 0)
    return int(tokens * per_token * model_dtype_bytes(info, dtype))


def activation_bytes(info: ModelInfo, *, tokens: int, seqs: int, tp: int = 1, dtype: str | None = None,
                     vllm_version: str | None = None, pp: int = 1, stage: int | None = None,
                     driver: bool = True, flashinfer: bool | None = None,
                     compute_capability: tuple[int, int] | None = None, engine: str | None = None,
                     device_name: str = "", cal: Calibration = CALIBRATION) -> int:
    """The profile run's torch peak above the weights ("PyTorch activation peak memory") on one rank.

    The profile runs a dummy forward of ``tokens`` tokens over ``rows = min(tokens, seqs)`` requests,
    then a dummy sampler run over ``rows`` x vocabulary logits (V0: the driver rank only; V1: every TP
    rank of the last stage); the peak is the larger, the forward's output still alive while sampling,
    plus what stays allocated through both (the persistent fused-MoE workspace from 0.14, the Triton
    sampler's per-SM rows from 0.17) and :attr:`Calibration.act_fixed`. ``engine`` overrides the
    version's engine ("v0" for V0's rules).
    """
    s = info.shape
    eng = engine or vllm.engine(vllm_version)
    act = model_dtype_bytes(info, dtype)
    rows = max(1, min(tokens, seqs))
    last = stage is None or stage == max(1, pp) - 1
    persistent = eng == "v1" and vllm.moe_workspace_persists(vllm_version)
    held = moe_workspace_bytes(info, tokens, tp=tp, dtype=dtype) if persistent else 0
    fwd = forward_peak_bytes(info, tokens, tp=tp, dtype=dtype, persistent_moe=persistent)
    hidden = tokens * s.hidden * act
    if pp > 1 and stage not in (None, 0):
        fwd += 2 * hidden                    # later stages receive hidden states + residual
    if eng == "v1" and vllm.rules(vllm_version) < (0, 9, 2) and not vllm.is_v0(vllm_version):
        hidden = 0                           # 0.8-0.9.1 keep only the sampled rows of the output
    if last and (eng == "v1" or driver):
        if eng == "v0" and not vllm.is_v0(vllm_version):
            bpe = vllm.SAMPLER_SORT_BPE
        else:
            bpe = vllm.sampler_bytes_per_element(vllm_version, rows=rows, flashinfer=flashinfer,
                                                 compute_capability=compute_capability)
        bpe += act - 2                       # the logits themselves are in the model dtype
        sampler = rows * s.vocab * bpe + hidden + 2 * rows * s.hidden * act
        if eng == "v1" and vllm.triton_sampler_buffer(vllm_version, rows=rows, flashinfer=flashinfer,
                                                      compute_capability=compute_capability):
            sms = sm_count(device_name) or DEFAULT_SMS
            sampler += min(1 << (min(sms, rows) - 1).bit_length(), sms) * s.vocab * 4
    elif last:
        sampler = hidden + rows * (_round_up(s.vocab, 64) // max(1, tp)) * act    # a lm_head shard only
    else:
        sampler = 0
    return int(held + max(fwd, sampler) + cal.act_fixed * GiB)


#: The non-torch regimes (:func:`non_torch_regime`), each with its own fitted figure.
NON_TORCH_REGIMES = ("single", "single_017", "pipeline_017", "fusion", "parallel", "parallel_pcie")


def non_torch_regime(vllm_version: str | None, *, tp: int = 1, pp: int = 1, device_name: str = "",
                     compute_capability: tuple[int, int] | None = None) -> str:
    """Which mechanism sets a rank's non-torch memory (``docs/memory-model.md`` section 4):

    ``single`` / ``single_017``: TP = PP = 1, before / from vLLM 0.17; ``pipeline_017``: pipeline stages
    only from 0.17 (send/recv, no collective buffers after the snapshot); ``fusion``: TP > 1 on Hopper or
    Blackwell from 0.17, where the FlashInfer all-reduce fusion's workspaces are created after the
    snapshot; ``parallel`` / ``parallel_pcie``: NCCL's and the custom all-reduce's buffers otherwise, on
    a datacenter GPU / a consumer card over PCIe.
    """
    tp, pp = max(1, tp), max(1, pp)
    new = vllm.rules(vllm_version) >= vllm.ALLREDUCE_FUSION_SINCE and not vllm.is_v0(vllm_version)
    if tp * pp == 1:
        return "single_017" if new else "single"
    cc = compute_capability or gpu_compute_capability(device_name)
    if new and vllm.allreduce_fusion(vllm_version, tp=tp, pp=pp, compute_capability=cc):
        return "fusion"
    if new and tp == 1:
        return "pipeline_017"
    # Consumer cards (no NVLink, no P2P: NCCL through host memory) are the one PCIe class a start-up
    # calibrates; a datacenter PCIe card (L4, L40S) takes the NVLink figure, the larger, until one does.
    return "parallel_pcie" if not datacenter_gpu(device_name) else "parallel"


def non_torch_bytes(vllm_version: str | None, *, tp: int = 1, pp: int = 1, device_name: str = "",
                    compute_capability: tuple[int, int] | None = None, cal: Calibration = CALIBRATION) -> int:
    """Memory outside torch's allocator that one rank adds while vLLM profiles (kernel images, cuBLAS
    handles, NCCL and all-reduce buffers under TP/PP), by vLLM version, parallel layout and the GPU's
    interconnect (:func:`non_torch_regime`); the global-cap families' CUDA context is not included."""
    tp, pp = max(1, tp), max(1, pp)
    world = tp * pp
    regime = non_torch_regime(vllm_version, tp=tp, pp=pp, device_name=device_name,
                              compute_capability=compute_capability)
    base = cal.nt_single_017 if vllm.rules(vllm_version) >= vllm.ALLREDUCE_FUSION_SINCE \
        and not vllm.is_v0(vllm_version) else cal.nt_single
    if regime in ("single", "single_017"):
        nt = base
    elif regime == "pipeline_017":
        nt = cal.nt_multi_017
    elif regime == "fusion":
        nt = cal.nt_multi_017 + cal.nt_fusion + cal.nt_fusion_per_rank * (tp - 2)
    elif regime == "parallel_pcie":
        nt = base + cal.nt_parallel_pcie + cal.nt_parallel_pcie_per_rank * (world - 2)
    else:
        nt = base + cal.nt_parallel + cal.nt_parallel_per_rank * (world - 2)
    if regime.startswith("parallel") and datacenter_gpu(device_name) and vllm.nccl_buffers_in_budget(vllm_version):
        nt += NCCL_INIT_BYTES / GiB
    return int(nt * GiB)


def cuda_context_bytes(device_name: str = "") -> int:
    """The CUDA context the global-cap families count against the budget."""
    return CUDA_CONTEXT_DATACENTER_BYTES if datacenter_gpu(device_name) else CUDA_CONTEXT_CONSUMER_BYTES


def cudagraph_estimate_bytes(info: ModelInfo, *, vllm_version: str | None, tokens: int, seqs: int, tp: int = 1,
                             pp: int = 1, compute_capability: tuple[int, int] | None = None,
                             cal: Calibration = CALIBRATION) -> int:
    """CUDA-graph memory of one rank: a fixed part and every captured graph x decoder layer on the rank,
    more for a MoE's routed layers (``docs/memory-model.md`` section 5), fitted on what the 0.19 sweep's
    captures took ("Actual usage ... GiB for CUDAGraph memory": the same capture sizes and modes as
    0.20+, whose own estimate vLLM subtracts inside the budget)."""
    sizes = vllm.capture_sizes(vllm_version, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                               compute_capability=compute_capability)
    graphs = len(sizes) + (len([x for x in sizes if x <= seqs]) if vllm.full_graphs_too(vllm_version) else 0)
    layers = max(stage_layers(info.shape.layers or info.num_layers, pp))
    routed = layers * info.shape.moe_layers / max(1, info.shape.layers) if info.shape.experts else 0
    per = cal.graph_per_graph_layer_mib * layers + cal.graph_moe_per_graph_layer_mib * routed
    return int(cal.graph_fixed * GiB + graphs * per * MiB) if graphs else 0


def cudagraph_reserve_bytes(info: ModelInfo, *, vllm_version: str | None, tokens: int, seqs: int, tp: int = 1,
                            pp: int = 1, compute_capability: tuple[int, int] | None = None) -> int:
    """Room to leave outside the budget for CUDA graphs where vLLM < 0.20 captures them after sizing the
    KV cache: the estimate and its spread over the sweep's measured captures (+30%: a dense model's
    largest miss, 0.24 of 0.9 GiB), at least 0.5 GiB."""
    est = cudagraph_estimate_bytes(info, vllm_version=vllm_version, tokens=tokens, seqs=seqs, tp=tp, pp=pp,
                                   compute_capability=compute_capability)
    return max(int(est * GRAPH_RESERVE_FACTOR), GRAPH_OUTSIDE_FLOOR_BYTES)


# -- the error bands ---------------------------------------------------------------------------

#: Per family: (share of the estimated overhead -- activation + non-torch + graphs -- and a floor in GiB)
#: that the plan's safe KV holds back. Tight where the family has calibration start-ups and vLLM's code
#: is read term by term (V0 0.6.4-0.7, V1 0.11); wider where a term is a prior (the graph estimate and
#: the 14-byte sampler from 0.20, the CUDA context of the global-cap families).
BANDS: dict[str, tuple[float, float]] = {
    "v0-free": (0.15, 0.15),        # reserved (not allocated) activation memory, no start-up
    "v0-global": (0.10, 0.10),      # two start-ups; other processes are read at launch time
    "v0-profiled": (0.10, 0.10),    # one start-up (and a dev build with unexplained non-torch memory)
    "v1-global": (0.15, 0.15),      # the CUDA context is a prior
    "v1-0.9": (0.10, 0.10),         # the 0.11 code but for NCCL's init buffers (in the TP term below)
    "v1-0.11": (0.10, 0.10),        # ten start-ups
    "v1-0.20": (0.25, 0.25),        # the graph estimate and the 14-byte sampler have no start-up
    "v1-0.27": (0.25, 0.25),
    "v1-0.34x": (0.25, 0.25),       # the extensible KV cache: vLLM's formula read, no start-up yet
}
#: The band when the overhead was measured on this host (what vLLM printed): run-to-run noise.
MEASURED_BAND = (0.02, 0.05)
#: Unexplained extra weights under TP (+0.07 and +0.16 GiB in two start-ups) and NCCL's spread.
PARALLEL_BAND_BYTES = int(0.1 * GiB)
#: Weights: of the estimate, when the checkpoint's size was read / estimated with a known method / other.
WEIGHTS_BAND = {"exact": 0.002, "known": 0.01, "other": 0.03}
_KNOWN_METHODS = (None, "awq", "gptq", "fp8", "compressed-tensors", "mxfp4", "bitsandbytes")


@dataclass(frozen=True)
class Budget:
    """How one rank's memory splits at a utilization; kv_bytes is what the KV cache gets (the central
    estimate), ``band_bytes`` its error band, ``safe_kv_bytes`` the two together."""

    total_bytes: int
    utilization: float
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int               # the global-cap families: with the CUDA context
    cudagraph_bytes: int               # inside the budget (0.20+); see cudagraph_outside_bytes
    other_processes_bytes: int
    kv_bytes: int
    exact: bool = False                # the KV size is given (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes)
    family: str = ""
    band_bytes: int = 0
    cudagraph_outside_bytes: int = 0   # room graphs need outside the budget (before 0.20)
    max_num_batched_tokens: int = 0    # the profile's sizes
    max_num_seqs: int = 0
    measured: bool = False             # the overhead is what vLLM printed on this host, not an estimate

    @property
    def overhead_bytes(self) -> int:
        """Everything but the weights and the KV cache: activation + non-torch + graphs inside."""
        return self.activation_bytes + self.non_torch_bytes + self.cudagraph_bytes

    @property
    def safe_kv_bytes(self) -> int:
        """The KV bytes a launch may count on: the estimate less its band (exact sizes: themselves)."""
        return self.kv_bytes if self.exact else self.kv_bytes - self.band_bytes


def band_bytes(info: ModelInfo, family: str, *, overhead_bytes: int, weights_bytes: int, world_size: int = 1,
               measured: bool = False) -> int:
    """The error band of a KV estimate (``docs/memory-model.md`` section 7)::

        max(rel x overhead, floor)          per family (BANDS), or MEASURED_BAND
      + 0.2% of the weights (size read) | 1% (estimated, known quantization) | 3% (other, or a model
        type whose configuration class the plan could not resolve)
      + 0.1 GiB under TP/PP
      + 0.5 GiB + 3% of the weights for a multimodal model without a vision_config
    """
    rel, floor = MEASURED_BAND if measured else BANDS.get(family, (0.25, 0.25))
    band = max(rel * overhead_bytes, floor * GiB)
    if measured:
        return int(band)
    if info.weights_exact:
        band += WEIGHTS_BAND["exact"] * weights_bytes
    elif info.quantization in _KNOWN_METHODS and info.config_known:
        band += WEIGHTS_BAND["known"] * weights_bytes
    else:
        band += WEIGHTS_BAND["other"] * weights_bytes
    if world_size > 1:
        band += PARALLEL_BAND_BYTES
    if info.shape.multimodal and not info.shape.vision and not info.weights_exact:
        band += 0.5 * GiB + 0.03 * weights_bytes
    return int(band)


def kv_budget(info: ModelInfo, *, gpu_total_bytes: int, utilization: float, tp: int = 1, pp: int = 1,
              vllm_version: str | None = None, enforce_eager: bool = False, max_model_len: int | None = None,
              max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
              other_used_bytes: int = 0, platform: str = "cuda", cpu_kv_space_gib: float | None = None,
              kv_cache_memory_bytes: int | None = None, device_name: str = "", dtype: str | None = None,
              chunked_prefill: bool = False, compute_capability: tuple[int, int] | None = None,
              quantization: str | None = None, mxfp4_backend: str | None = None, flashinfer: bool | None = None,
              cpu_offload_bytes: int = 0, measured_overhead_bytes: int | None = None,
              measured_weights_bytes: int | None = None, driver: bool = True, extensible: bool | None = None,
              cal: Calibration = CALIBRATION) -> Budget:
    """The KV-cache bytes per rank vLLM will find at this utilization, with every term that made it.

    ``kv = total x utilization - weights - activation - non_torch - graphs inside (- other processes
    for the global-cap families)``, per pipeline stage; the stage with the fewest KV tokens is the
    one returned (vLLM gives every rank the smallest rank's blocks). ``measured_overhead_bytes``
    (what :func:`measured_overhead_bytes` read from a healthy launch) replaces the estimated
    activation, non-torch and graph terms; ``measured_weights_bytes`` the weights. ``driver=False``:
    a V0 TP worker other than the driver, which does not sample (the driver sets the KV size).

    With the extensible KV cache (0.34+, ``extensible``: by default from the version and platform) vLLM
    sizes the cache after warm-up and capture from the memory it measures: the budget is capped by what
    was free at start-up less a margin (:func:`extensible_margin_bytes`),
    ``kv = min(total x utilization, free at start - margin) - weights - activation - non_torch - graphs``;
    what the cap takes off the budget is ``other_processes_bytes``.
    """
    total = int(gpu_total_bytes)
    requested = int(math.ceil(total * utilization))
    tp, pp = max(1, tp), max(1, pp)
    if kv_cache_memory_bytes:
        extensible = False              # a size fixed in advance turns the extensible KV cache off
    fam = vllm.family(vllm_version, extensible=extensible, platform=platform)
    extensible = fam == vllm.EXTENSIBLE_FAMILY
    cc = compute_capability or gpu_compute_capability(device_name)
    if kv_cache_memory_bytes or (platform == "cpu" and cpu_kv_space_gib is not None):
        weights = int((info.weights_bytes or 0) / (tp * pp))
        kv = int(kv_cache_memory_bytes or cast(float, cpu_kv_space_gib) * GiB)
        return Budget(total, utilization, requested, weights, 0, 0, 0, 0, kv, exact=True, family=fam)
    if platform == "cpu":
        # 0.32 CPU auto mode: ceil(total*util) minus the worker's RSS (weights + ~1 GiB of runtime).
        weights = int((info.weights_bytes or 0) / (tp * pp))
        rss = weights + GiB
        return Budget(total, utilization, requested, weights, 0, rss - weights, 0, 0, requested - rss,
                      family="cpu", band_bytes=int(0.25 * GiB))
    s = info.shape
    tokens, seqs = vllm.batch_defaults(total, vllm_version=vllm_version, device_name=device_name,
                                       max_model_len=max_model_len or info.derived_max_model_len,
                                       chunked_prefill=chunked_prefill, compute_capability=cc,
                                       multimodal=s.multimodal, sliding_window=bool(info.sliding_window))
    tokens, seqs = max_num_batched_tokens or tokens, max_num_seqs or seqs
    per_stage = weights_per_stage(info, tp=tp, pp=pp, quantization=quantization, compute_capability=cc,
                                  vllm_version=vllm_version, mxfp4_backend=mxfp4_backend, dtype=dtype)
    nt = non_torch_bytes(vllm_version, tp=tp, pp=pp, device_name=device_name, compute_capability=cc, cal=cal)
    others = 0
    if vllm.caps_device_globally(vllm_version):
        nt += cuda_context_bytes(device_name)
        others = int(other_used_bytes)
    layers = stage_layers(s.layers or info.num_layers, pp)
    best: Budget | None = None
    best_tokens = 0.0
    for i, stage_layer_count in enumerate(layers):
        weights = measured_weights_bytes if measured_weights_bytes is not None else per_stage[i]
        weights = max(0, int(weights - cpu_offload_bytes))
        act = activation_bytes(info, tokens=tokens, seqs=seqs, tp=tp, pp=pp, stage=i, dtype=dtype,
                               vllm_version=vllm_version, flashinfer=flashinfer, compute_capability=cc,
                               driver=driver, device_name=device_name, cal=cal)
        if fam == "v0-free":
            act = int(act * 1.05)          # counted as reserved memory: the allocator's rounding
        graphs = cudagraph_estimate_bytes(info, vllm_version=vllm_version, tokens=tokens, seqs=seqs, tp=tp,
                                          pp=pp, compute_capability=cc, cal=cal) if not enforce_eager else 0
        inside = 0 if vllm.graphs_outside_budget(vllm_version) else graphs
        outside = graphs if vllm.graphs_outside_budget(vllm_version) else 0
        if measured_overhead_bytes is not None:
            kv = requested - weights - int(measured_overhead_bytes)
            b = Budget(total, utilization, requested, weights, int(measured_overhead_bytes), 0, 0, 0, kv,
                       family=fam, cudagraph_outside_bytes=outside, max_num_batched_tokens=tokens,
                       max_num_seqs=seqs, measured=True)
        else:
            if extensible:
                # the budget is only a cap: what was free at start-up (less this rank's CUDA context) binds
                free_cap = total - int(other_used_bytes) - vllm.CUDA_CONTEXT_BYTES - extensible_margin_bytes(act)
                others = max(0, requested - free_cap)
            kv = requested - weights - act - nt - inside - others
            b = Budget(total, utilization, requested, weights, act, nt, inside, others, kv, family=fam,
                       cudagraph_outside_bytes=outside, max_num_batched_tokens=tokens, max_num_seqs=seqs)
        b = replace(b, band_bytes=band_bytes(info, fam, overhead_bytes=b.overhead_bytes, weights_bytes=weights,
                                             world_size=tp * pp, measured=b.measured))
        per_token = kv / max(1, stage_layer_count)
        if best is None or per_token < best_tokens:
            best, best_tokens = b, per_token
    assert best is not None
    return best


def extensible_margin_bytes(transient_peak_bytes: int) -> int:
    """What the extensible KV cache keeps free beyond the transient peak: the larger of 1 GiB and 0.75 x
    that peak (the first real prefills need more than the profiled peak before the allocator serves them)."""
    return max(vllm.EXTENSIBLE_MARGIN_FLOOR_BYTES, int(transient_peak_bytes * vllm.EXTENSIBLE_MARGIN_FRACTION))


def measured_overhead_bytes(*, gpu_total_bytes: int, utilization: float, weights_bytes: int,
                            available_kv_bytes: int | None = None, kv_cache_tokens: int | None = None,
                            num_gpu_blocks: int | None = None, info: ModelInfo | None = None, tp: int = 1,
                            pp: int = 1, kv_cache_dtype: str = "auto", block_size: int = 16,
                            dtype: str | None = None, vllm_version: str | None = None) -> int | None:
    """What a healthy launch's own figures say its overhead was: requested - weights - KV, bytes per rank.

    ``weights_bytes`` is "Model loading took X GiB"; the KV cache is "Available KV cache memory" (V1
    0.9.1+), else the blocks it holds ("# GPU blocks: N" in V0, "GPU KV cache size: N tokens" in V1)
    times the block's bytes (needs ``info``). The result replaces the estimated activation, non-torch
    and graph terms in a later plan for the same host, model, vLLM and batch flags
    (``kv_budget(measured_overhead_bytes=...)``, ``Sizing.fit(measured_overhead_bytes=...)``). For the
    global-cap families (V0 0.6.4, V1 0.8-0.9.0) it also holds what other processes used then. None
    when the figures do not say.
    """
    requested = int(math.ceil(int(gpu_total_bytes) * utilization))
    kv = available_kv_bytes
    if kv is None and info is not None and (num_gpu_blocks or kv_cache_tokens):
        hybrid = vllm.hybrid_kv(vllm_version)
        page = page_bytes(info, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
        per_block = _bytes_per_pool_block(info, page, pp, hybrid)
        if num_gpu_blocks:
            kv = int(num_gpu_blocks) * per_block
        else:
            groups = len(kv_groups(info, pp=pp, hybrid=hybrid).kinds)
            kv = int(cast(int, kv_cache_tokens)) // block_size * groups * per_block
    if kv is None:
        return None
    return int(requested - int(weights_bytes) - int(kv))
