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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.core import memory as M
from supervisor.core import remediable, vllm
from supervisor.core.flags import (
    BLOCK_SIZE,
    CHUNKED_PREFILL,
    CPU_OFFLOAD,
    ENFORCE_EAGER,
    KV_CACHE_BYTES,
    KV_CACHE_DTYPE,
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    UTILIZATION,
    Flags,
    format_value,
)
from supervisor.core.memory import activation_bytes, fit_max_model_len, kv_budget, kv_bytes_per_token
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.core.units import GiB


@dataclass(frozen=True)
class Fit:
    """The flags to change so that a launch fits (vs the flags given), why, and whether the inputs were complete.

    ``confident``: the plan had what it needs (the model, the GPU's size). ``certain``: the answer
    holds across the estimate's error band (False where the band crosses the line: the length asked,
    or the floor, fits by the central estimate but not by the safe one).
    """

    flags: dict[str, str | None] = field(default_factory=dict)     # None: a boolean flag, on
    reasons: dict[str, str] = field(default_factory=dict)
    confident: bool = False
    expect: str = ""     # a failure no length or KV dtype avoids ("no_kv_cache_memory"): the remedies' to pre-empt
    certain: bool = True


def utilization_under_free(free_bytes: float, total_bytes: float, *, context_bytes: float = vllm.CUDA_CONTEXT_BYTES,
                           margin: float = 0.005) -> float:
    """The highest --gpu-memory-utilization (0.01 steps) that vLLM's start-up free-memory check passes.

    ``free_bytes`` as NVML reports it before the launch (``context_bytes`` is then what vLLM's own
    CUDA context will take from it), or as vLLM printed it (pass ``context_bytes=0``); ``margin`` of
    the total is held back for other processes' memory moving meanwhile.
    """
    return math.floor(((free_bytes - context_bytes) / total_bytes - margin) * 100) / 100


def v0_chunked_gain_tokens(info: ModelInfo, *, from_tokens: int, to_tokens: int, tp: int = 1,
                           kv_cache_dtype: str = "auto", dtype: str | None = None, seqs: int = 256,
                           vllm_version: str | None = None) -> int:
    """KV tokens a V0 launch gains when its profile run shrinks from ``from_tokens`` to ``to_tokens``.

    V0 (0.5-0.7) profiles the whole context in one pass unless chunked prefill is on; the KV cache
    gets what the profile's activation peak leaves. Only the difference of two activation
    estimates is used, so it corrects a capacity vLLM measured rather than predicting one.
    """
    version = vllm_version if vllm.is_v0(vllm_version) else None
    kw: dict[str, Any] = dict(seqs=seqs, tp=tp, dtype=dtype, vllm_version=version, engine="v0")
    before = activation_bytes(info, tokens=from_tokens, **kw)
    after = activation_bytes(info, tokens=to_tokens, **kw)
    per_token = kv_bytes_per_token(info, tp=tp, kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    if per_token <= 0:
        return 0          # a model whose KV pages size to nothing (a config the plan cannot read): no claim
    return max(0, before - after) // per_token


def fit_launch(info: ModelInfo | None, *, gpu_total_bytes: int | None, gpu_free_bytes: int | None, gpus: int,
               flags: Flags, vllm_version: str | None, margin: float = 0.03, min_model_len: int = 2048,
               platform: str = "cuda", cpu_kv_space_gib: float | None = None,
               compute_capability: tuple[int, int] | None = None, device_name: str = "",
               context_bytes: int = vllm.CUDA_CONTEXT_BYTES, utilization_margin: float = 0.005,
               measured_overhead_bytes: int | None = None, measured_weights_bytes: int | None = None,
               allowed: Iterable[str] | None = None) -> Fit:
    """Flags that make the first launch fit: a lower --max-model-len, fp8 KV, or a lower utilization for busy GPUs.

    Lengths are sized on the safe KV (the estimate less its family's error band, and at least
    ``margin`` of it; ``docs/memory-model.md`` section 7), so a first launch before vLLM 0.14 does
    not fail on an estimate that was too high; from 0.14 an estimated length goes to vLLM's own
    measurement (``--max-model-len auto``). A request the central estimate says fits is never cut,
    and fp8 KV or eager mode is added only where even the band's upper end says the floor does not
    fit without it (``Fit.certain`` is False where the band crosses the line).
    ``gpu_free_bytes`` is NVML's figure before the launch; when it is vLLM's own (printed after its
    CUDA context exists), pass ``context_bytes=0``. ``measured_overhead_bytes`` (and
    ``measured_weights_bytes``): what a healthy launch on this host printed
    (:func:`supervisor.core.memory.measured_overhead_bytes`), replacing the estimated terms.
    ``allowed``: the remedies (``remedies.allowed``) the plan may use, None for all of them. Each flag it
    proposes is one whose remedy is allowed (:func:`supervisor.core.remediable.remedy_of`), and what it
    proposes is sized without the others: with the length fixed, only what makes the length asked fit;
    without fp8 KV or eager mode, no length that counts on them.
    """
    may = _permits(allowed)
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
    cc = compute_capability or M.gpu_compute_capability(device_name)
    dtype = flags.get("--dtype")
    batched, seqs_flag = flags.get_int(MAX_BATCHED_TOKENS), flags.get_int(MAX_NUM_SEQS)
    chunked = flags.enabled(CHUNKED_PREFILL)
    defaults = vllm.batch_defaults(total, vllm_version=vllm_version, platform=platform, device_name=device_name,
                                   max_model_len=flags.get_int(MAX_MODEL_LEN) or info.derived_max_model_len,
                                   chunked_prefill=chunked, compute_capability=cc, world_size=tp * pp)

    util = vllm.utilization(vllm_version, flags, platform)
    if (platform != "cpu" and may(UTILIZATION) and vllm.checks_free_memory(vllm_version, flags, platform)
            and free - context_bytes < total * util):
        lowered = utilization_under_free(free, total, context_bytes=context_bytes, margin=utilization_margin)
        if 0 < lowered < util:
            out[UTILIZATION] = format_value(lowered)
            why[UTILIZATION] = (
                f"only {free / GiB:.2f} of {total / GiB:.2f} GiB is free (other processes hold memory); vLLM "
                f"refuses to start when free memory is below {util:.2f} of the total")
            util = lowered

    # Before 0.20 CUDA graphs are captured after the KV cache is sized, outside the budget: what
    # other processes leave must hold the budget plus the graphs and the CUDA context.
    if (platform != "cpu" and may(UTILIZATION) and vllm.graphs_outside_budget(vllm_version)
            and not vllm.caps_device_globally(vllm_version) and not flags.enabled(ENFORCE_EAGER)):
        graphs = M.cudagraph_reserve_bytes(info, vllm_version=vllm_version, tokens=batched or defaults[0],
                                           seqs=seqs_flag or defaults[1], tp=tp, pp=pp, compute_capability=cc)
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
    kv_dtype = flags.get(KV_CACHE_DTYPE) or "auto"
    block = flags.get_int(BLOCK_SIZE) or vllm.default_block_size(
        mla=info.mla, platform=platform, compute_capability=cc, vllm_version=vllm_version)
    hybrid = None if not flags.enabled("--disable-hybrid-kv-cache-manager") else False
    common: dict[str, Any] = dict(gpu_total_bytes=total, utilization=util, tp=tp, pp=pp, vllm_version=vllm_version,
                  enforce_eager=flags.enabled(ENFORCE_EAGER), other_used_bytes=held,
                  platform=platform, cpu_kv_space_gib=cpu_kv_space_gib,
                  kv_cache_memory_bytes=flags.get_int(KV_CACHE_BYTES),
                  max_num_batched_tokens=batched, max_num_seqs=seqs_flag, device_name=device_name, dtype=dtype,
                  compute_capability=cc, quantization=flags.get("--quantization"),
                  cpu_offload_bytes=int((flags.get_float("--cpu-offload-gb") or 0) * GiB),
                  measured_overhead_bytes=measured_overhead_bytes, measured_weights_bytes=measured_weights_bytes,
                  extensible=vllm.extensible_kv_cache(vllm_version, flags, platform))
    tokens = batched or defaults[0]
    v0 = vllm.is_v0(vllm_version)

    def budget(length: int, eager: bool = False) -> M.Budget:
        kw: dict[str, Any] = dict(common, enforce_eager=True) if eager else common
        return kv_budget(info, max_model_len=length, chunked_prefill=chunked, **kw)

    def fit_at(length: int, kv_dtype_: str, end: str, eager: bool = False) -> int:
        """The length ``end`` of the band holds: "safe" (the estimate less its band and at least the
        margin), "central" (the estimate) or "upper" (the estimate plus its band)."""
        b = budget(length, eager)
        kv = b.kv_bytes
        if not b.exact:
            if end == "safe":
                kv = min(b.safe_kv_bytes, int(b.kv_bytes * (1 - margin)))
            elif end == "upper":
                kv = b.kv_bytes + b.band_bytes
        return fit_max_model_len(kv, info, tp=tp, pp=pp, kv_cache_dtype=kv_dtype_, block_size=block,
                                 vllm_version=vllm_version, upper=asked, max_num_batched_tokens=tokens,
                                 hybrid=hybrid, dtype=dtype)

    def fit_for(kv_dtype_: str, end: str = "safe", eager: bool = False) -> int:
        if not v0 or platform == "cpu" or chunked:
            return fit_at(asked, kv_dtype_, end, eager)   # the profile run does not depend on the length
        # V0 profiles up to the whole context at once (chunked only above 32768), so a shorter
        # context frees activation memory: the largest block-aligned L with L <= fit(budget(L)),
        # searched on each side of the 32K switch where that predicate is monotone.
        best = 0
        for lo, hi in ((32769, asked), (1, min(asked, 32768))):
            if lo > hi:
                continue
            if fit_at(hi, kv_dtype_, end, eager) >= hi:
                return max(best, hi)
            k_lo, k_hi = -(-lo // block), hi // block
            while k_lo <= k_hi:
                mid = (k_lo + k_hi) // 2
                if fit_at(mid * block, kv_dtype_, end, eager) >= mid * block:
                    best, k_lo = max(best, mid * block), mid + 1
                else:
                    k_hi = mid - 1
        return best

    try:
        fit = fit_for(kv_dtype)
    except ValueError:         # a KV dtype this model does not know: leave it to vLLM
        return Fit(out, why, False)
    if (platform != "cpu" and v0 and fit < asked and not chunked and may(CHUNKED_PREFILL)
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
    # The band is for shrinking safely, not for cutting a request the estimate says fits:
    # a borderline miss costs one reactive relaunch, a needless cut costs context for good.
    central = fit_for(kv_dtype, "central")
    if central >= asked:
        return Fit(out, why, True, certain=False)
    # vLLM 0.14+ can size the length to the KV cache it measures (--max-model-len auto). Where the
    # plan's length is an estimate, vLLM's exact figure replaces it; the guard holds vLLM's choice
    # between the floor and the length asked (diagnosis.check_auto_fit).
    measures = vllm.auto_fit_available(vllm_version)
    # the shortest length the plan may launch: the floor, or the length asked where it may not change it
    floor = min(min_model_len, asked) if may(MAX_MODEL_LEN) else asked
    short = (f"< {min_model_len}" if may(MAX_MODEL_LEN) else
             f"< the {asked} asked, and remedies.allowed keeps the length")

    def length(fit_: int, central_: int, exact: bool, said: str) -> str:
        if measures and not exact:
            why[MAX_MODEL_LEN] = (f"{said}; about {central_} by the plan's estimate, so vLLM sizes the length "
                                  f"to the KV cache it measures (auto), held between {min_model_len} "
                                  f"and {asked}")
            return "auto"
        if exact:
            why[MAX_MODEL_LEN] = f"{said}; {fit_} do (block-aligned)"
        elif fit_ < central_:
            why[MAX_MODEL_LEN] = (f"{said}; about {central_} by the plan's estimate, {fit_} with its error band "
                                  f"held back (block-aligned)")
        else:
            why[MAX_MODEL_LEN] = (f"{said}; about {central_} by the plan's estimate, which is uncertain here: "
                                  f"the floor {fit_}")
        return str(fit_)

    def sized(safe_: int, central_: int, said: str, eager: bool = False) -> Fit:
        use = max(safe_, floor)
        if use < asked:
            exact = budget(use, eager).exact
            out[MAX_MODEL_LEN] = length(use, central_, exact, said)
        return Fit(out, why, True, certain=safe_ >= floor)

    where = f" at utilization {util:.2f}"
    # Degrade (fp8 KV, eager mode) only where even the upper end of the band says the floor does
    # not fit without it: a needless fp8 or eager costs for good, a failed launch once.
    if central >= floor or fit_for(kv_dtype, "upper") >= floor:
        exact = budget(max(fit, floor)).exact
        return sized(fit, central, f"{asked} tokens do not fit in the KV cache"
                     + (" as configured" if exact else where))
    left = budget(floor if v0 else asked)      # V0 profiles the context: at the floor, the least
    if left.kv_bytes <= 0:
        # Nothing left for the KV cache at all: no length or KV dtype helps; the remedy for that
        # failure (more of the GPU, then less for graphs and the batch) is the one to take.
        return Fit(out, why, True, expect="no_kv_cache_memory", certain=left.kv_bytes + left.band_bytes <= 0)
    fp8_ok = (platform != "cpu" and may(KV_CACHE_DTYPE) and kv_dtype == "auto" and cc is not None
              and vllm.fp8_kv_supported(cc, vllm_version, info.mla))
    if fp8_ok:
        central8 = fit_for("fp8", "central")
        if central8 >= floor or fit_for("fp8", "upper") >= floor:
            out[KV_CACHE_DTYPE] = "fp8"
            why[KV_CACHE_DTYPE] = (f"at the model dtype only about {central} tokens fit ({short}); "
                                   f"fp8 halves the KV cache")
            return sized(fit_for("fp8"), central8, f"{asked} tokens do not fit even with fp8 KV")
    # From 0.20 CUDA graphs take memory inside the budget: eager mode gives it to the KV cache.
    can_eager = (platform != "cpu" and may(ENFORCE_EAGER) and not vllm.graphs_outside_budget(vllm_version)
                 and not flags.enabled(ENFORCE_EAGER))
    if can_eager:
        dt = "fp8" if fp8_ok else kv_dtype
        central_e = fit_for(dt, "central", eager=True)
        if central_e >= floor:
            if fp8_ok:
                out[KV_CACHE_DTYPE] = "fp8"
                why[KV_CACHE_DTYPE] = (f"at the model dtype only about {central} tokens fit ({short}); "
                                       f"fp8 halves the KV cache")
            out[ENFORCE_EAGER] = None
            fewer = f"fewer than {min_model_len}" if may(MAX_MODEL_LEN) else f"fewer than the {asked} asked"
            why[ENFORCE_EAGER] = (f"even {'with fp8 KV ' if fp8_ok else ''}{fewer} tokens fit "
                                  f"with CUDA graphs; eager mode gives their memory to the KV cache")
            return sized(fit_for(dt, eager=True), central_e, f"{asked} tokens do not fit"
                         + (" even with fp8 KV and CUDA graphs" if fp8_ok else " with CUDA graphs"), eager=True)
    return Fit(out, why, True)


def _permits(allowed: Iterable[str] | None) -> Callable[[str], bool]:
    """Whether the plan may change a flag: its remedy (:func:`remediable.remedy_of`) is in ``allowed``."""
    if allowed is None:
        return lambda flag: True
    names = frozenset(allowed)
    return lambda flag: remediable.remedy_of(flag) in names


#: The flags that shape vLLM's memory besides the weights and the KV cache: the profile's batch,
#: CUDA graphs, the parallel layout, the offload. A measured overhead holds while these are the same.
OVERHEAD_FLAGS = (ENFORCE_EAGER, MAX_NUM_SEQS, MAX_BATCHED_TOKENS, CHUNKED_PREFILL, TENSOR_PARALLEL,
                  PIPELINE_PARALLEL, CPU_OFFLOAD)


def overhead_conditions(flags: Flags) -> tuple[tuple[str, str | None], ...]:
    """The values of :data:`OVERHEAD_FLAGS` in ``flags`` (None: unset), as a measured overhead records them."""
    return tuple((name, flags.get(name)) for name in OVERHEAD_FLAGS)


@dataclass(frozen=True)
class Sizing:
    """What the plan knows besides the flags and the GPU's memory: the model, the GPUs, the platform.

    The session builds one from the facts gathered at start-up; the remedy policy asks it, with
    the memory figures vLLM printed, what a relaunch's other flags imply for the length, so that
    a predictable second failure is not waited for. ``measured_overhead_bytes``: what a healthy
    launch of this model on this host printed (activation + non-torch + graphs), used instead of
    the estimate.
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
    measured_overhead_bytes: int | None = None
    measured_weights_bytes: int | None = None
    measured_under: tuple[tuple[str, str | None], ...] = ()    # overhead_conditions() of that launch

    def fit(self, flags: Flags, *, total_bytes: int | None, free_bytes: int | None,
            vllm_version: str | None = None, context_bytes: int = vllm.CUDA_CONTEXT_BYTES,
            measured_overhead_bytes: int | None = None, measured_weights_bytes: int | None = None,
            allowed: Iterable[str] | None = None) -> Fit:
        """What to change in ``flags`` so that a launch fits a GPU of ``total_bytes`` with ``free_bytes`` free,
        changing only flags whose remedy is in ``allowed`` (``remedies.allowed``; None: any).

        The overhead a healthy launch measured replaces the estimate only for flags that shape it
        the same way (:func:`overhead_conditions`); the measured weights hold for any flags."""
        overhead = measured_overhead_bytes
        if overhead is None and overhead_conditions(flags) == self.measured_under:
            overhead = self.measured_overhead_bytes
        weights = self.measured_weights_bytes if measured_weights_bytes is None else measured_weights_bytes
        return fit_launch(self.info, gpu_total_bytes=total_bytes, gpu_free_bytes=free_bytes, gpus=self.gpus,
                          flags=flags, vllm_version=vllm_version or self.vllm_version, margin=self.margin,
                          min_model_len=self.min_model_len, platform=self.platform,
                          cpu_kv_space_gib=self.cpu_kv_space_gib, compute_capability=self.compute_capability,
                          device_name=self.device_name, context_bytes=context_bytes,
                          utilization_margin=self.utilization_margin, measured_overhead_bytes=overhead,
                          measured_weights_bytes=weights, allowed=allowed)
