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

from supervisor.core.flags import canonical
from supervisor.core.units import GiB

Version = tuple[int, int, int]

#: The newest vLLM whose rules this table knows; an unknown version is planned with these.
NEWEST: Version = (0, 33, 0)

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


def checks_free_memory(version: str | None) -> bool:
    """vLLM refuses to start when less than total x utilization is free (0.9.1+)."""
    return rules(version) >= FREE_MEMORY_CHECK_SINCE


def graphs_outside_budget(version: str | None) -> bool:
    """vLLM 0.9.1-0.19 captures CUDA graphs after sizing the KV cache, in memory outside its budget."""
    return rules(version) < GRAPHS_IN_BUDGET_SINCE


def caps_device_globally(version: str | None) -> bool:
    """V0 0.6.4 and V1 0.8-0.9.0 cap the whole device: other processes' memory comes off the budget."""
    v = rules(version)
    return v[:2] == (0, 6) and v[2] == 4 or V1_SINCE <= v < FREE_MEMORY_CHECK_SINCE


def hybrid_kv(version: str | None) -> bool:
    """The hybrid KV-cache manager: sliding-window layers hold only their window."""
    return rules(version) >= HYBRID_KV_SINCE


def holds_null_block(version: str | None) -> bool:
    """One pool block is held back from the KV budget (0.29+)."""
    return rules(version) >= NULL_BLOCK_SINCE


def default_utilization(version: str | None) -> float:
    """vLLM's ``--gpu-memory-utilization`` default: 0.90, and 0.92 from 0.20."""
    return 0.92 if rules(version) >= UTILIZATION_092_SINCE else 0.90


def v0_chunk_size(version: str | None) -> int:
    """V0's chunk when chunked prefill is on: 512 before 0.7, 2048 after."""
    return 512 if rules(version) < (0, 7, 0) else 2048


def batch_defaults(gpu_total_bytes: int, *, vllm_version: str | None = None, platform: str = "cuda",
                   device_name: str = "", max_model_len: int | None = None, world_size: int = 1,
                   chunked_prefill: bool = False) -> tuple[int, int]:
    """(``--max-num-batched-tokens`` the profile run uses, ``--max-num-seqs``) for the OpenAI server.

    V0 profiles the whole context at once unless chunked prefill is on (itself above 32768); V1
    picks its defaults by the GPU's memory (and not for the A100), and the CPU backend per rank.
    """
    ver = rules(vllm_version)
    if platform == "cpu":
        return 2048 * world_size, 128 * world_size
    if ver < V1_SINCE:
        length = max_model_len or 2048
        chunked = chunked_prefill or length > V0_AUTO_CHUNK_ABOVE
        return (v0_chunk_size(vllm_version) if chunked else max(length, 2048)), 256
    if gpu_total_bytes >= 160 * GiB and ver >= (0, 30, 0):
        return 16384, 1024
    if gpu_total_bytes >= 70 * GiB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


def default_block_size(*, mla: bool = False, platform: str = "cuda",
                       compute_capability: tuple[int, int] | None = None, vllm_version: str | None = None) -> int:
    """16 on CUDA (64 for FlashMLA on Hopper+), 128 on the CPU backend (16 for its MLA kernel)."""
    if platform == "cpu":
        return 16 if mla else CPU_BLOCK_SIZE
    if mla and compute_capability and compute_capability >= (9, 0) and rules(vllm_version) >= V1_SINCE:
        return 64
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
    return cc >= (8, 0)                      # 0.33: FlashInfer covers sm80+


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
