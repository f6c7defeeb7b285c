"""Predict before launching: the flags under which a launch fits the GPU (pure).

Given the model's facts (:class:`Sizing`), the GPU's memory and the flags of a launch,
:meth:`Sizing.fit` says what to change so that the launch fits: a lower ``--max-model-len``
(or ``auto`` from vLLM 0.14, where the length is only an estimate), fp8 KV, a lower
``--gpu-memory-utilization`` on a busy GPU, chunked prefill on V0; and whether a failure no
length avoids is to be expected (``Fit.expect``). The session asks it for the first launch; the
remedy policy asks it what a relaunch's other changes do to the length. The arithmetic is
:mod:`supervisor.core.memory`; the version rules are :mod:`supervisor.core.vllm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from supervisor.core import vllm
from supervisor.core.flags import (BLOCK_SIZE, CHUNKED_PREFILL, ENFORCE_EAGER, KV_CACHE_BYTES, KV_CACHE_DTYPE,
                                   MAX_BATCHED_TOKENS, MAX_MODEL_LEN, MAX_NUM_SEQS, PIPELINE_PARALLEL,
                                   TENSOR_PARALLEL, UTILIZATION, Flags, format_value)
from supervisor.core.memory import activation_bytes, cudagraph_bytes, fit_max_model_len, kv_budget, kv_bytes_per_token
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.core.units import GiB


@dataclass(frozen=True)
class Fit:
    """The flags to change so that a launch fits (vs the flags given), why, and whether the inputs were complete."""

    flags: dict[str, str | None] = field(default_factory=dict)     # None: a boolean flag, on
    reasons: dict[str, str] = field(default_factory=dict)
    confident: bool = False
    expect: str = ""     # a failure no length or KV dtype avoids ("no_kv_cache_memory"): the remedies' to pre-empt


def utilization_under_free(free_bytes: float, total_bytes: float, *, context_bytes: float = vllm.CUDA_CONTEXT_BYTES,
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


def fit_launch(info: ModelInfo | None, *, gpu_total_bytes: int | None, gpu_free_bytes: int | None, gpus: int,
               flags: Flags, vllm_version: str | None, margin: float = 0.03, min_model_len: int = 2048,
               platform: str = "cuda", cpu_kv_space_gib: float | None = None,
               compute_capability: tuple[int, int] | None = None, device_name: str = "",
               context_bytes: int = vllm.CUDA_CONTEXT_BYTES, utilization_margin: float = 0.005) -> Fit:
    """Flags that make the first launch fit: a lower --max-model-len, fp8 KV, or a lower utilization for busy GPUs.

    ``gpu_free_bytes`` is NVML's figure before the launch; when it is vLLM's own (printed after its
    CUDA context exists), pass ``context_bytes=0``.
    """
    tp = flags.get_int(TENSOR_PARALLEL) or 1
    pp = flags.get_int(PIPELINE_PARALLEL) or 1
    if info is None or (platform != "cpu" and not gpu_total_bytes) or (platform == "cpu" and not gpu_total_bytes
                                                                      and cpu_kv_space_gib is None):
        return Fit(confident=False)
    if platform != "cpu" and tp * pp > gpus:
        return Fit(confident=False)
    total = int(gpu_total_bytes or 0)
    free = total if gpu_free_bytes is None else int(gpu_free_bytes)
    # what other processes hold (vLLM's own free figure already lacks its CUDA context)
    held = 0 if gpu_free_bytes is None else max(0, total - free - (vllm.CUDA_CONTEXT_BYTES - context_bytes))
    out: dict[str, str | None] = {}
    why: dict[str, str] = {}

    util = flags.get_float(UTILIZATION) or vllm.default_utilization(vllm_version)
    if platform != "cpu" and vllm.checks_free_memory(vllm_version) and free - context_bytes < total * util:
        lowered = utilization_under_free(free, total, context_bytes=context_bytes, margin=utilization_margin)
        if 0 < lowered < util:
            out[UTILIZATION] = format_value(lowered)
            why[UTILIZATION] = (
                f"only {free / GiB:.2f} of {total / GiB:.2f} GiB is free (other processes hold memory); vLLM "
                f"refuses to start when free memory is below {util:.2f} of the total")
            util = lowered

    # Before 0.20 CUDA graphs are captured after the KV cache is sized, outside the budget: what
    # other processes leave must hold the budget plus the graphs and the CUDA context.
    if (platform != "cpu" and vllm.graphs_outside_budget(vllm_version) and not vllm.caps_device_globally(vllm_version)
            and not flags.enabled(ENFORCE_EAGER)):
        graphs = cudagraph_bytes(int((info.weights_bytes or 0) / tp))
        reserve = graphs + context_bytes
        room = utilization_under_free(free - graphs, total, context_bytes=context_bytes, margin=0.0)
        if 0 < room < util and held:
            out[UTILIZATION] = format_value(room)
            why[UTILIZATION] = (
                f"other processes hold {held / GiB:.2f} GiB; vLLM < 0.20 captures CUDA graphs "
                f"outside its budget, so {room:.2f} leaves {reserve / GiB:.2f} GiB for them and the CUDA context")
            util = room

    if flags.auto_length():
        return Fit(out, why, True)     # vLLM's own auto-fit does the sizing
    derived = derive_max_model_len(info, vllm_version, disable_sliding_window=flags.enabled("--disable-sliding-window"))
    asked = flags.get_int(MAX_MODEL_LEN) or derived
    dtype = flags.get("--dtype")
    kv_dtype = flags.get(KV_CACHE_DTYPE) or "auto"
    block = flags.get_int(BLOCK_SIZE) or vllm.default_block_size(
        mla=info.mla, platform=platform, compute_capability=compute_capability, vllm_version=vllm_version)
    hybrid = None if not flags.enabled("--disable-hybrid-kv-cache-manager") else False
    common = dict(gpu_total_bytes=total, utilization=util, tp=tp, pp=pp, vllm_version=vllm_version,
                  enforce_eager=flags.enabled(ENFORCE_EAGER), other_used_bytes=held,
                  platform=platform, cpu_kv_space_gib=cpu_kv_space_gib,
                  kv_cache_memory_bytes=flags.get_int(KV_CACHE_BYTES),
                  max_num_batched_tokens=flags.get_int(MAX_BATCHED_TOKENS),
                  max_num_seqs=flags.get_int(MAX_NUM_SEQS), device_name=device_name, dtype=dtype)

    tokens = common["max_num_batched_tokens"] or vllm.batch_defaults(total, vllm_version=vllm_version,
                                                                       platform=platform)[0]
    v0 = vllm.is_v0(vllm_version)
    chunked = flags.enabled(CHUNKED_PREFILL)

    def fit_at(length: int, kv_dtype_: str, margin: float = margin) -> int:
        b = kv_budget(info, max_model_len=length, chunked_prefill=chunked, **common)
        kv = b.kv_bytes if b.exact else int(b.kv_bytes * (1 - margin))
        return fit_max_model_len(kv, info, tp=tp, pp=pp, kv_cache_dtype=kv_dtype_, block_size=block,
                                 vllm_version=vllm_version, upper=asked, max_num_batched_tokens=tokens,
                                 hybrid=hybrid, dtype=dtype)

    def fit_for(kv_dtype_: str, margin: float = margin) -> int:
        if not v0 or platform == "cpu" or chunked:
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
            k_lo, k_hi = -(-lo // block), hi // block
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
        return Fit(out, why, False)
    if (platform != "cpu" and v0 and fit < asked and not chunked
            and not common["max_num_batched_tokens"]):
        # V0 profiles the whole context at once up to 32768 tokens: chunked prefill (what V1 always
        # does, and V0 itself above 32768) profiles one chunk and leaves the rest to the KV cache.
        chunked = True                          # fit_at and fit_for read it
        with_chunks = fit_for(kv_dtype)
        chunked = with_chunks > fit
        if chunked:
            fit = with_chunks
            out[CHUNKED_PREFILL] = None
            why[CHUNKED_PREFILL] = ("below 32768 tokens vLLM V0 profiles the whole context at once; in chunks the "
                            "profile takes less memory, and the KV cache more")
    if fit >= asked:
        return Fit(out, why, True)
    # The margin is for shrinking safely, not for cutting a request the estimate says fits:
    # a borderline miss costs one reactive relaunch, a needless cut costs context for good.
    if fit_for(kv_dtype, 0.0) >= asked:
        return Fit(out, why, True)
    # vLLM 0.14+ can size the length to the KV cache it measures (--max-model-len auto). Where the
    # plan's length is an estimate, vLLM's exact figure replaces it; the guard holds vLLM's choice
    # between the floor and the length asked (diagnosis.check_auto_fit).
    measures = vllm.auto_fit_available(vllm_version)

    def length(fit_: int, exact: bool, said: str) -> str:
        if measures and not exact:
            why[MAX_MODEL_LEN] = (f"{said}; about {fit_} by the plan's estimate, so vLLM sizes the length "
                                      f"to the KV cache it measures (auto), held between {min_model_len} "
                                      f"and {asked}")
            return "auto"
        why[MAX_MODEL_LEN] = f"{said}; {fit_} do (block-aligned" + (
            "" if exact else f", {margin:.0%} held back for estimate error") + ")"
        return str(fit_)

    if fit >= min_model_len:
        exact = kv_budget(info, max_model_len=fit, **common).exact
        out[MAX_MODEL_LEN] = length(fit, exact, f"{asked} tokens do not fit in the KV cache"
                                        + (" as configured" if exact else f" at utilization {util:.2f}"))
        return Fit(out, why, True)
    cc_ok = compute_capability is not None and vllm.fp8_kv_supported(compute_capability, vllm_version, info.mla)
    if platform != "cpu" and kv_dtype == "auto" and cc_ok:
        fit8 = fit_for("fp8")
        if fit8 >= min_model_len:
            out[KV_CACHE_DTYPE] = "fp8"
            why[KV_CACHE_DTYPE] = (f"at the model dtype only {fit} tokens fit (< {min_model_len}); "
                                       f"fp8 halves the KV cache")
            if fit8 < asked:
                exact = kv_budget(info, max_model_len=fit8, **common).exact
                out[MAX_MODEL_LEN] = length(fit8, exact, f"{asked} tokens do not fit even with fp8 KV")
            return Fit(out, why, True)
    left = kv_budget(info, max_model_len=asked, **common)
    return Fit(out, why, True, expect="no_kv_cache_memory" if left.kv_bytes <= 0 else "")


@dataclass(frozen=True)
class Sizing:
    """What the plan knows besides the flags and the GPU's memory: the model, the GPUs, the platform.

    The session builds one from the facts gathered at start-up; the remedy policy asks it, with
    the memory figures vLLM printed, what a relaunch's other flags imply for the length, so that
    a predictable second failure is not waited for.
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

    def fit(self, flags: Flags, *, total_bytes: int | None, free_bytes: int | None,
            vllm_version: str | None = None, context_bytes: int = vllm.CUDA_CONTEXT_BYTES) -> Fit:
        """What to change in ``flags`` so that a launch fits a GPU of ``total_bytes`` with ``free_bytes`` free."""
        return fit_launch(self.info, gpu_total_bytes=total_bytes, gpu_free_bytes=free_bytes, gpus=self.gpus,
                          flags=flags, vllm_version=vllm_version or self.vllm_version, margin=self.margin,
                          min_model_len=self.min_model_len, platform=self.platform,
                          cpu_kv_space_gib=self.cpu_kv_space_gib, compute_capability=self.compute_capability,
                          device_name=self.device_name, context_bytes=context_bytes,
                          utilization_margin=self.utilization_margin)
