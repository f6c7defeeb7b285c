"""vLLM's per-version rules, in one place: defaults, thresholds, flags added and removed.

Pure. Every other module asks here instead of comparing version tuples itself, so a new vLLM
release is a change to this file. Where each rule comes from in vLLM's source is written in
``docs/memory-model.md`` (memory and defaults) and ``docs/failure-catalogue.md`` (flags).

Two readings of a version, on purpose:

* :func:`rules` -- the rules to *predict* with: an unknown version is taken to be the newest
  known one (the plan must say something; vLLM's log corrects it after one launch).
* :func:`known_at_least` -- whether a *feature* can be relied on: false for an unknown version,
  so the guard never passes a flag or mode an older vLLM would refuse.
"""

from __future__ import annotations

from supervisor.core.flags import KV_CACHE_BYTES, UTILIZATION, Flags, canonical
from supervisor.core.units import GiB

Version = tuple[int, int, int]

#: The newest vLLM whose rules this table knows; an unknown version is planned with these.
NEWEST: Version = (0, 34, 0)

#: First version of the V1 engine as the default (``VLLM_USE_V1``); before it, V0's profiler.
V1_SINCE: Version = (0, 8, 0)
#: Refuses to start when free memory is below total x utilization (the start-up check).
FREE_MEMORY_CHECK_SINCE: Version = (0, 9, 1)
#: Estimates CUDA-graph memory before sizing the KV cache and counts it inside the budget.
GRAPHS_IN_BUDGET_SINCE: Version = (0, 20, 0)
#: ``--max-model-len auto``: vLLM sizes the length to the KV cache it measured.
AUTO_FIT_SINCE: Version = (0, 14, 0)
#: The hybrid KV-cache manager (sliding-window layers keep only their window).
HYBRID_KV_SINCE: Version = (0, 8, 0)
#: One pool block (the null block) is held back from the KV budget.
NULL_BLOCK_SINCE: Version = (0, 29, 0)
#: Default ``--gpu-memory-utilization`` raised from 0.90 to 0.92.
UTILIZATION_092_SINCE: Version = (0, 20, 0)
#: The extensible KV cache, the default on CUDA and ROCm: sized from the memory measured after warm-up and
#: CUDA-graph capture, ``--gpu-memory-utilization`` only a cap (default 1.0), no start-up free-memory check.
EXTENSIBLE_KV_SINCE: Version = (0, 34, 0)
#: What the extensible KV cache keeps free beyond the transient peak: the larger of 1 GiB and 0.75 x that peak
#: (``v1/worker/extensible_kv_cache.py``: KV_CACHE_MARGIN_FLOOR_BYTES, KV_CACHE_MARGIN_FRACTION).
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 * GiB
EXTENSIBLE_MARGIN_FRACTION = 0.75
#: A ``model_max_length`` in config.json replaces (not min-s) the derived length.
MODEL_MAX_LENGTH_REPLACES_SINCE: Version = (0, 9, 0)
#: YaRN's factor is no longer multiplied into the derived length.
YARN_UNSCALED_SINCE: Version = (0, 30, 0)

#: The CUDA context (and the allocator's first blocks) a vLLM rank creates before it measures
#: free memory: NVML's free figure, read before the launch, still includes it; vLLM's own does not.
CUDA_CONTEXT_BYTES = int(0.4 * GiB)

#: The CPU backend's KV block size (it never prints it); 16 for its MLA kernel.
CPU_BLOCK_SIZE = 128

#: V0 turns chunked prefill on by itself above this many tokens of context.
V0_AUTO_CHUNK_ABOVE = 32768
#: V0's chunked-prefill step grows from 512 to 2048 tokens (``SchedulerConfig.__post_init__``).
V0_CHUNK_2048_SINCE: Version = (0, 6, 5)
#: V0 0.6.4 caps the whole device (the global-cap family); 0.6.5 profiles this instance only.
V0_GLOBAL_CAP_SINCE: Version = (0, 6, 4)
V0_PROFILED_SINCE: Version = (0, 6, 5)
#: V1 takes its memory snapshot after NCCL init: the communicator buffers fall outside the budget.
NCCL_OUTSIDE_SNAPSHOT_SINCE: Version = (0, 11, 0)
#: The non-KV total comes from free memory (weights, buffers, allocator slack, transient peak).
FREE_BASED_NON_KV_SINCE: Version = (0, 27, 0)
#: Batch defaults of 16384 tokens on GPUs of 160 GiB or more (B200, B300, MI300X).
BATCH_16K_SINCE: Version = (0, 28, 0)

#: The unquantized fused MoE runs through the modular kernel, whose workspace manager keeps the
#: experts' intermediate buffers allocated across forwards (``v1/worker/workspace.py``): they are still
#: held while the profile's sampler runs.
MOE_PERSISTENT_WORKSPACE_SINCE: Version = (0, 14, 0)
#: The in-place Triton top-k/top-p kernel (8 rows or more), with its per-SM buffer of vocabulary rows
#: (``v1/sample/ops/topk_topp_triton.py``).
TRITON_SAMPLER_SINCE: Version = (0, 17, 0)
#: FlashInfer's sampler is the default on cc >= 7.5; the Triton kernel only without it.
FLASHINFER_SAMPLER_SINCE: Version = (0, 21, 0)
#: The -O2 default turns on the FlashInfer all-reduce + RMSNorm fusion for TP > 1 on Hopper and Blackwell
#: (``config/vllm.py:enable_allreduce_rms_fusion``), whose workspaces are created while compiling, after
#: the memory snapshot: non-torch memory. Up to 0.20 not with pipeline parallelism.
ALLREDUCE_FUSION_SINCE: Version = (0, 17, 0)
ALLREDUCE_FUSION_WITH_PP_SINCE: Version = (0, 21, 0)

#: Bytes per logits element at the sampler's peak: a sort-based top-k/top-p (bf16 logits 2, an fp32
#: copy 4, sorted values 4, int64 indices 8, the sort's own temporaries 20) ...
SAMPLER_SORT_BPE = 38
#: ... and FlashInfer's or the in-place Triton kernel's (logits 2, fp32 copy 4, probabilities 4, noise 4).
SAMPLER_INPLACE_BPE = 14


def parse_version(version: str | None) -> Version | None:
    """``0.10.2rc3.dev25+gabc`` -> (0, 10, 2); ``0.9`` -> (0, 9, 0); None for unknown or ``dev``."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.strip().lstrip("v").split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    if not parts:
        return None
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def rules(version: str | None) -> Version:
    """The version whose rules predict a launch: the newest known when ``version`` is unknown."""
    return parse_version(version) or NEWEST


def known_at_least(version: str | None, since: Version) -> bool:
    """True only when ``version`` is known and at least ``since`` (features the guard relies on)."""
    v = parse_version(version)
    return v is not None and v >= since


def known_v0(version: str | None) -> bool:
    """A V0 engine we know of (0.5-0.7): remedies that only V0 needs apply to it alone."""
    v = parse_version(version)
    return v is not None and (0, 5, 0) <= v < V1_SINCE


def is_v0(version: str | None) -> bool:
    """The V0 engine's rules apply (an unknown version is planned as the newest, V1)."""
    return rules(version) < V1_SINCE


def auto_fit_available(version: str | None) -> bool:
    """Whether ``--max-model-len auto`` exists (vLLM 0.14+, known)."""
    return known_at_least(version, AUTO_FIT_SINCE)


def extensible_kv_cache(version: str | None, flags: Flags | None = None, platform: str = "cuda") -> bool:
    """vLLM sizes the KV cache from the memory free after warm-up and capture (0.34+ on a GPU), unless the
    launch fixes its size (``--kv-cache-memory-bytes``, ``--num-gpu-blocks-override``) or turns it off
    (``--no-enable-extensible-kv-cache``, ``--disable-extensible-kv-cache``). Where the driver lacks VMM
    support vLLM falls back by itself; nothing before the launch tells that."""
    if rules(version) < EXTENSIBLE_KV_SINCE or platform == "cpu":
        return False
    if flags is None:
        return True
    if flags.get(KV_CACHE_BYTES) or flags.get("--num-gpu-blocks-override"):
        return False
    if flags.has("--disable-extensible-kv-cache") or flags.has("--no-enable-extensible-kv-cache"):
        return False
    return not flags.has("--enable-extensible-kv-cache") or flags.enabled("--enable-extensible-kv-cache")


def checks_free_memory(version: str | None, flags: Flags | None = None, platform: str = "cuda") -> bool:
    """vLLM refuses to start when less than total x utilization is free (0.9.1+; not with the extensible
    KV cache, whose budget is only a cap)."""
    return rules(version) >= FREE_MEMORY_CHECK_SINCE and not extensible_kv_cache(version, flags, platform)


def graphs_outside_budget(version: str | None) -> bool:
    """vLLM 0.9.1-0.19 captures CUDA graphs after sizing the KV cache, in memory outside its budget."""
    return rules(version) < GRAPHS_IN_BUDGET_SINCE


def caps_device_globally(version: str | None) -> bool:
    """V0 0.6.4 and V1 0.8-0.9.0 cap the whole device: other processes' memory comes off the budget."""
    return family(version) in ("v0-global", "v1-global")


def hybrid_kv(version: str | None) -> bool:
    """The hybrid KV-cache manager: sliding-window layers hold only their window."""
    return rules(version) >= HYBRID_KV_SINCE


def holds_null_block(version: str | None) -> bool:
    """One pool block is held back from the KV budget (0.29+)."""
    return rules(version) >= NULL_BLOCK_SINCE


def default_utilization(version: str | None, flags: Flags | None = None, platform: str = "cuda") -> float:
    """vLLM's ``--gpu-memory-utilization`` default: 0.90, 0.92 from 0.20, 1.0 with the extensible KV cache."""
    if extensible_kv_cache(version, flags, platform):
        return 1.0
    return 0.92 if rules(version) >= UTILIZATION_092_SINCE else 0.90


def utilization(version: str | None, flags: Flags, platform: str = "cuda") -> float:
    """The share of the GPU a launch with ``flags`` gives vLLM: the flag's, else vLLM's default."""
    return flags.get_float(UTILIZATION) or default_utilization(version, flags, platform)


def v0_chunk_size(version: str | None) -> int:
    """V0's chunk when chunked prefill is on: 512 up to 0.6.4, 2048 from 0.6.5 (``SchedulerConfig``)."""
    return 512 if rules(version) < V0_CHUNK_2048_SINCE else 2048


def engine(version: str | None) -> str:
    """``"v0"`` or ``"v1"``: the engine whose memory rules predict a launch (V1 is the default from 0.8)."""
    return "v0" if is_v0(version) else "v1"


def engine_of(version: str | None, logged: str | None = None) -> str:
    """The engine a launch ran: the one its log showed (``Initializing a V0 LLM engine``, V0's frames and
    wording: a 0.8-0.10 vLLM that fell back to V0, a wrapper that hides the version), else the version's."""
    return logged if logged in ("v0", "v1") else engine(version)


def family(version: str | None, *, extensible: bool | None = None, platform: str = "cuda") -> str:
    """The KV-budget formula a version uses; one of :data:`FAMILIES` (``docs/memory-model.md`` section 1).

    ``v0-free`` (V0 <= 0.6.3): the budget less what the process took from free memory;
    ``v0-global`` (0.6.4) and ``v1-global`` (0.8.0-0.9.0): the budget less everything on the device
    that is not this instance's torch memory (the CUDA context, other processes);
    ``v0-profiled`` (0.6.5-0.7): weights + activation peak + non-torch increase since a snapshot
    taken before NCCL starts; ``v1-0.9`` (0.9.1-0.10): the same in V1; ``v1-0.11`` (0.11-0.19): the
    snapshot after NCCL init, CUDA graphs captured outside the budget; ``v1-0.20`` (0.20-0.26):
    CUDA-graph memory estimated inside the budget; ``v1-0.27`` (0.27+): free-memory based
    non-KV total, graphs estimated inside; ``v1-0.34x`` (0.34+ on a GPU): the extensible KV cache, sized
    after warm-up and capture from the memory then free (``extensible``: None for vLLM's default).
    """
    if extensible is None:
        extensible = extensible_kv_cache(version, platform=platform)
    if extensible:
        return EXTENSIBLE_FAMILY
    v = rules(version)
    if v < V1_SINCE:
        if v < V0_GLOBAL_CAP_SINCE:
            return "v0-free"
        if v < V0_PROFILED_SINCE:
            return "v0-global"
        return "v0-profiled"
    if v < FREE_MEMORY_CHECK_SINCE:
        return "v1-global"
    if v < NCCL_OUTSIDE_SNAPSHOT_SINCE:
        return "v1-0.9"
    if v < GRAPHS_IN_BUDGET_SINCE:
        return "v1-0.11"
    if v < FREE_BASED_NON_KV_SINCE:
        return "v1-0.20"
    return "v1-0.27"


#: Every budget family, oldest first.
#: The extensible KV cache's formula (0.34+ on a GPU, unless the launch turns it off: :func:`extensible_kv_cache`).
EXTENSIBLE_FAMILY = "v1-0.34x"
FAMILIES = ("v0-free", "v0-global", "v0-profiled", "v1-global", "v1-0.9", "v1-0.11", "v1-0.20", "v1-0.27",
            EXTENSIBLE_FAMILY)


def nccl_buffers_in_budget(version: str | None) -> bool:
    """NCCL's communicator buffers are created after the memory snapshot (V0, V1 <= 0.10), so they count."""
    return rules(version) < NCCL_OUTSIDE_SNAPSHOT_SINCE


def sampler_bytes_per_element(version: str | None, *, rows: int = 1024, flashinfer: bool | None = None,
                              compute_capability: tuple[int, int] | None = None) -> int:
    """Peak bytes per logits element of the profile's dummy sampler run (top-k/top-p over the vocabulary).

    A sort-based top-k/top-p (V0; V1 up to 0.16) peaks at 38 B (40 B in V0 <= 0.6.2, which re-sorts
    through an int64 inverse permutation); FlashInfer's sampler (V1 0.8-0.11.0 when it is installed,
    the default from 0.21 on cc >= 7.5) and the in-place Triton kernel (0.17+, 8 rows or more) at 14 B.
    ``flashinfer=None`` (unknown) takes the sort where FlashInfer is optional: the larger figure.
    """
    v = rules(version)
    if v < V1_SINCE:
        return SAMPLER_SORT_BPE + (2 if v < (0, 6, 3) else 0)
    if v < (0, 11, 1):
        return SAMPLER_INPLACE_BPE if flashinfer else SAMPLER_SORT_BPE
    if v >= (0, 21, 0) and (compute_capability is None or compute_capability >= (7, 5)) and flashinfer is not False:
        return SAMPLER_INPLACE_BPE
    if v >= (0, 17, 0) and rows >= 8:
        return SAMPLER_INPLACE_BPE
    return SAMPLER_SORT_BPE


def moe_workspace_persists(version: str | None) -> bool:
    """The fused-MoE intermediate buffers stay allocated between forwards (0.14+)."""
    return rules(version) >= MOE_PERSISTENT_WORKSPACE_SINCE


def triton_sampler_buffer(version: str | None, *, rows: int, flashinfer: bool | None = None,
                          compute_capability: tuple[int, int] | None = None) -> bool:
    """The profile's sampler runs the in-place Triton kernel, which keeps one vocabulary row per SM."""
    v = rules(version)
    if v < TRITON_SAMPLER_SINCE or rows < 8:
        return False
    if v >= FLASHINFER_SAMPLER_SINCE and (compute_capability is None or compute_capability >= (7, 5)) \
            and flashinfer is not False:
        return False
    return True


def allreduce_fusion(version: str | None, *, tp: int, pp: int = 1,
                     compute_capability: tuple[int, int] | None = None) -> bool:
    """vLLM's default compilation fuses all-reduce and RMSNorm with FlashInfer (a dependency of the CUDA
    wheels), creating its communication workspaces after the memory snapshot."""
    v = rules(version)
    if v < ALLREDUCE_FUSION_SINCE or tp <= 1 or compute_capability is None:
        return False
    if compute_capability != (9, 0) and compute_capability[0] != 10:
        return False
    return pp <= 1 or v >= ALLREDUCE_FUSION_WITH_PP_SINCE


def capture_sizes(version: str | None, *, max_num_seqs: int, max_num_batched_tokens: int,
                  compute_capability: tuple[int, int] | None = None) -> list[int]:
    """The batch sizes vLLM captures CUDA graphs for by default (``_set_cudagraph_sizes``)."""
    v = rules(version)
    if v < V1_SINCE:      # V0: [1, 2, 4] + 8i up to the first size >= max_num_seqs
        out = [1, 2, 4] + [8 * i for i in range(1, 1025)]
        cut = next((x for x in out if x >= max_num_seqs), out[-1])
        return [x for x in out if x <= cut]
    if v < (0, 11, 0):
        sizes = [1, 2, 4] + list(range(8, 513, 8))
    elif v < (0, 13, 0):
        sizes = [1, 2, 4] + list(range(8, min(2 * max_num_seqs, 512) + 1, 8))
    else:
        big = 1024 if (v >= (0, 33, 0) and compute_capability and compute_capability[0] == 10) else 512
        top = min(2 * max_num_seqs, big)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return [x for x in sizes if x <= max_num_batched_tokens]


def full_graphs_too(version: str | None) -> bool:
    """V1 0.11+ captures FULL decode graphs besides the PIECEWISE ones (``FULL_AND_PIECEWISE``)."""
    return rules(version) >= (0, 11, 0)


def batch_defaults(gpu_total_bytes: int, *, vllm_version: str | None = None, platform: str = "cuda",
                   device_name: str = "", max_model_len: int | None = None, world_size: int = 1,
                   chunked_prefill: bool = False, compute_capability: tuple[int, int] | None = None,
                   multimodal: bool = False, sliding_window: bool = False) -> tuple[int, int]:
    """(``--max-num-batched-tokens`` the profile run uses, ``--max-num-seqs``) for the OpenAI server.

    V0 profiles the whole context at once unless chunked prefill is on (by itself above 32768
    tokens, not for sliding-window or multimodal models); V1 picks its defaults by the GPU
    (``EngineArgs._set_default_args``): by name in 0.8.0-0.8.4 (H100/H200), by memory from 0.8.5
    (70 GiB, the A100 excepted from 0.9), 160 GiB and more from 0.28; the CPU backend per rank.
    """
    ver = rules(vllm_version)
    if platform == "cpu":
        return 2048 * world_size, 128 * world_size
    if ver < V1_SINCE:
        length = max_model_len or 2048
        chunked = chunked_prefill or (length > V0_AUTO_CHUNK_ABOVE and not multimodal and not sliding_window)
        if chunked:
            return v0_chunk_size(vllm_version), 256
        return max(length, 5120 if multimodal else 2048), 256
    name = device_name.lower()
    gib = gpu_total_bytes / GiB
    if ver < (0, 8, 5):
        big = "h100" in name or "h200" in name
        tokens, seqs = (8192 if big else 2048), (1024 if big or ver < (0, 8, 4) else 256)
    elif ver >= BATCH_16K_SINCE and gib >= 160:
        tokens, seqs = 16384, 1024
    elif gib >= 70 and (ver < (0, 9, 0) or "a100" not in name) and not (
            ver >= (0, 33, 0) and compute_capability == (12, 1)):
        tokens, seqs = 8192, 1024
    else:
        tokens, seqs = 2048, 256
    if ver >= (0, 12, 0) and max_model_len:
        tokens = min(tokens, seqs * max_model_len)
    return tokens, seqs


#: vLLM sizes the KV block by the attention backend's kernel sizes (``update_block_size_for_backend``):
#: MLA on Hopper runs FlashAttention-MLA (any multiple of 16: the default 16), on Blackwell
#: FlashInfer-MLA (32 or 64: the smaller). Before, the platform forced FlashMLA's 64 on Hopper and
#: CUTLASS-MLA's 128 on Blackwell (``CudaPlatform.check_and_update_config``).
MLA_BLOCK_BY_BACKEND_SINCE: Version = (0, 18, 0)


def default_block_size(*, mla: bool = False, platform: str = "cuda",
                       compute_capability: tuple[int, int] | None = None, vllm_version: str | None = None) -> int:
    """16 on CUDA; MLA: 64 (Hopper) / 128 (Blackwell) up to 0.17, 16 / 32 from 0.18; 128 on the CPU
    backend (16 for its MLA kernel)."""
    if platform == "cpu":
        return 16 if mla else CPU_BLOCK_SIZE
    v = rules(vllm_version)
    if mla and compute_capability and compute_capability >= (9, 0) and v >= V1_SINCE:
        blackwell = compute_capability[0] == 10
        if v >= MLA_BLOCK_BY_BACKEND_SINCE:
            return 32 if blackwell else 16
        return 128 if blackwell and v >= (0, 10, 0) else 64
    return 16


def fp8_kv_supported(cc: tuple[int, int], vllm_version: str | None, mla: bool = False) -> bool:
    """Whether vLLM can run ``--kv-cache-dtype fp8`` on a GPU of compute capability ``cc``."""
    ver = parse_version(vllm_version)
    if cc < (7, 0):
        return False
    if mla:
        # fp8 MLA needs FlashMLA / CUTLASS MLA / FlashInfer MLA: Hopper or Blackwell, V1 0.11+.
        return cc >= (9, 0) and (ver is None or ver >= (0, 11, 0))
    if ver is None:
        return cc >= (8, 9)                  # unknown version: only where every backend path works
    if ver < (0, 11, 0):
        # V0 converts in software on any NVIDIA GPU; V1 0.8-0.10 falls back to V0 where it cannot.
        return True
    if ver < (0, 33, 0):
        return cc >= (8, 9)                  # Triton/FA3 need native e4m3 (Ampere fails)
    return cc >= (8, 0)                      # 0.33+: FlashInfer covers sm80+


# -- flags added and removed ------------------------------------------------------------------

#: First version that accepts a flag the guard may add (every other flag it adds exists in 0.5+).
FLAG_SINCE: dict[str, Version] = {"--cpu-offload-gb": (0, 5, 5)}

#: Flags vLLM removed: name -> (first version without it, what to use instead).
REMOVED_FLAGS: dict[str, tuple[Version, str]] = {
    "--swap-space": ((0, 18, 0), "V1 never swaps to CPU; the flag is a no-op and was removed"),
    "--max-seq-len-to-capture": ((0, 11, 0), "use --max-cudagraph-capture-size"),
    "--cuda-graph-sizes": ((0, 13, 0), "use --max-cudagraph-capture-size"),
    "--disable-log-requests": ((0, 17, 0), "request logging is off by default (--enable-log-requests)"),
    "--use-v2-block-manager": ((0, 10, 0), "the v2 block manager is the only one"),
    "--preemption-mode": ((0, 11, 0), "V0-only; V1 always recomputes"),
    "--num-scheduler-steps": ((0, 10, 2), "V0-only multi-step scheduling was removed"),
    "--disable-frontend-multiprocessing": ((0, 19, 0), "ignored by V1, then removed"),
    "--calculate-kv-scales": ((0, 28, 0), "removed"),
    "--guided-decoding-backend": ((0, 12, 0), "use --structured-outputs-config"),
    "--task": ((0, 13, 0), "use --runner / --convert"),
    "--worker-use-ray": ((0, 7, 0), "use --distributed-executor-backend ray"),
    "--engine-use-ray": ((0, 6, 3), "removed"),
    "--speculative-model": ((0, 8, 3), "use --speculative-config"),
    "--num-speculative-tokens": ((0, 8, 3), "use --speculative-config"),
}


def flag_supported(flag: str, version: str | None) -> bool:
    """Whether the vLLM in use accepts ``flag`` (an unknown version: only universal spellings)."""
    since = FLAG_SINCE.get(flag)
    return since is None or known_at_least(version, since)


def removed_flag(name: str, version: Version | str | None) -> str | None:
    """Why the canonical flag ``name`` is not accepted by vLLM ``version`` (None: it is, or unknown)."""
    v = parse_version(version) if isinstance(version, str) or version is None else version
    name = canonical(name)
    entry = REMOVED_FLAGS.get(name)
    if entry is None or v is None or v < entry[0]:
        return None
    since, instead = entry
    return f"{name} was removed in vLLM {'.'.join(map(str, since))} ({instead})"
