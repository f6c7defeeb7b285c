"""The relaunch policy: a diagnosis + the current flags -> the next flags, or give up, with the reason.

Pure: no I/O, no clock. One rule per failure kind, using the numbers vLLM printed; each rule
changes only the flags its failure is about, so a fix for a failure that is not about length
never touches ``--max-model-len``. The rules' knobs (which remedies are allowed, floors, order,
margins) are data: :class:`supervisor.config.RemedyConfig`. Where the model's facts are known
(``Context.sizing``), the plan says what a relaunch's other changes do to the length, so a
predictable second failure is not waited for. The loop around it -- launch budget, crash loops,
backoff -- is :mod:`supervisor.core.session`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from supervisor.config import RemedyConfig
from supervisor.core import remediable, vllm
from supervisor.core.diagnosis import UNKNOWN_PHASE, Diagnosis, Kind
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
    TENSOR_PARALLEL,
    UTILIZATION,
    Flags,
    canonical,
)
from supervisor.core.memory import GRAPH_OUTSIDE_FLOOR_BYTES, kv_bytes_per_token
from supervisor.core.plan import Fit, Sizing, utilization_under_free, v0_chunked_gain_tokens
from supervisor.core.units import GiB
from supervisor.errors import EX_CONFIG, EX_TEMPFAIL

MML, KV_DTYPE, UTIL, EAGER = MAX_MODEL_LEN, KV_CACHE_DTYPE, UTILIZATION, ENFORCE_EAGER
SEQS, BATCHED, OFFLOAD, BLOCK, CHUNKED, KV_BYTES = (MAX_NUM_SEQS, MAX_BATCHED_TOKENS, CPU_OFFLOAD, BLOCK_SIZE,
                                                    CHUNKED_PREFILL, KV_CACHE_BYTES)

ADVICE = (
    "more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), "
    "or freeing the GPU from other processes"
)


@dataclass(frozen=True)
class Change:
    """One flag the guard changed, and why (one sentence)."""

    flag: str
    old: str | None
    new: str | None
    why: str


def combined(*steps: Iterable[Change]) -> tuple[Change, ...]:
    """The changes of steps taken one after another (the plan's, then a remedy's), one per flag: its
    first 'was', its last 'now', the reasons in order; a flag that ends where it began is no change.
    What a person reads about a launch then names each flag once, at the value it is launched with."""
    out: dict[str, Change] = {}
    for c in (c for step in steps for c in step):
        before = out.get(c.flag)
        out[c.flag] = c if before is None else Change(c.flag, before.old, c.new, f"{before.why}; then {c.why}")
    return tuple(c for c in out.values() if c.old != c.new)


@dataclass(frozen=True)
class Relaunch:
    """Launch again with ``flags``; ``backoff`` asks the shell to wait first (same flags again)."""

    flags: Flags
    changes: tuple[Change, ...] = ()
    why: str = ""
    backoff: bool = False
    step: str = ""          # the remedy step taken, recorded in Context.tried


@dataclass(frozen=True)
class GiveUp:
    """Stop supervising: nothing more the guard can change would help."""

    reason: str
    exit_code: int = EX_TEMPFAIL
    advice: str = ""


Decision = Relaunch | GiveUp


@dataclass(frozen=True)
class Context:
    """What the policy knows besides the diagnosis and the current flags."""

    requested: Flags = field(default_factory=Flags)     # the user's own vLLM args
    last_good: Flags | None = None                      # flags of the last healthy launch
    rules: RemedyConfig = field(default_factory=RemedyConfig)
    gpu_free_gib: float | None = None
    gpu_total_gib: float | None = None
    vllm_version: str | None = None
    block_size: int | None = None                       # from the log / platform (CPU: 128)
    derived_max_model_len: int | None = None            # from config.json, when known
    tried: tuple[str, ...] = ()                         # remedy steps already taken this start-up
    previous: tuple[Diagnosis, ...] = ()                # earlier failures of this start-up
    port_failures: int = 0
    fp8_supported: bool | None = None
    sizing: Sizing | None = None                        # the model's facts for the plan, when known
    cpu_kv_space_gib: float | None = None               # VLLM_CPU_KVCACHE_SPACE (wins over --kv-cache-memory-bytes)
    platform: str = "cuda"                              # "cuda" | "cpu" (the CPU build of vLLM)


# -- helpers ----------------------------------------------------------------------------------
def _version(d: Diagnosis, ctx: Context) -> str | None:
    """The vLLM version: the one detected at start-up, else the one this launch printed."""
    return ctx.vllm_version or d.numbers.get("vllm_version")


def _utilization(current: Flags, ctx: Context) -> float:
    """The share of the GPU the current flags give vLLM (its default where they set none)."""
    return vllm.utilization(ctx.vllm_version, current, ctx.platform)


def _v0(d: Diagnosis, ctx: Context) -> bool:
    """The V0 engine ran: as its log shows it (``numbers["engine"]``: a wrapper that hides the version, a
    0.8-0.10 vLLM that fell back to V0), else a V0 version we know of."""
    logged = d.numbers.get("engine")
    return logged == "v0" if logged in ("v0", "v1") else vllm.known_v0(_version(d, ctx))


def _defaults(current: Flags, ctx: Context) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) for this launch when the flags leave them unset."""
    sizing = ctx.sizing
    return vllm.batch_defaults(int((ctx.gpu_total_gib or 0) * GiB), vllm_version=ctx.vllm_version,
                               platform=sizing.platform if sizing else "cuda",
                               device_name=sizing.device_name if sizing else "",
                               max_model_len=current.get_int(MML), world_size=current.world_size(),
                               chunked_prefill=current.enabled(CHUNKED))


def _length(current: Flags, d: Diagnosis, ctx: Context) -> int | None:
    """The length this launch ran with: the flag, else what vLLM printed, else config.json's."""
    return (current.get_int(MML) or _num(d, "max_model_len") or _num(d, "served_max_model_len")
            or ctx.derived_max_model_len)


def _with_chunked_prefill(flags: Flags, d: Diagnosis, ctx: Context, new_len: int | None
                          ) -> tuple[Flags, list[Change]]:
    """V0 (0.5-0.7) turns chunked prefill on by itself only above 32768 tokens; below, it profiles
    the whole context at once (so the KV cache shrinks as the length does) and refuses
    ``--max-num-batched-tokens`` below ``max_model_len``. Chunked prefill keeps the profile a chunk.
    Only for a V0 we know of (its version, or its log): an unknown vLLM gets no extra flag."""
    if not _v0(d, ctx) or flags.has(CHUNKED) or not _allowed(ctx, _remedy(CHUNKED)) or (
            new_len is not None and new_len > vllm.V0_AUTO_CHUNK_ABOVE):
        return flags, []      # only for a V0 we know of: an unknown vLLM gets no extra flag
    why = ("below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps "
           "the memory profile, and so the KV cache, as measured")
    return flags.set(CHUNKED), [Change(CHUNKED, None, "", why)]


def _num(d: Diagnosis, key: str) -> Any:
    return d.numbers.get(key)


def _block(current: Flags, d: Diagnosis, ctx: Context) -> int:
    return current.get_int(BLOCK) or _num(d, "block_size") or ctx.block_size or 16


def _align(n: int, block: int) -> int:
    return (n // block) * block


def _allowed(ctx: Context, name: str) -> bool:
    return name in ctx.rules.allowed


def _remedy(flag: str) -> str:
    """The remedy that lets the guard change ``flag`` (:data:`supervisor.core.remediable.REMEDIABLE`)."""
    return remediable.remedy_of(flag) or flag


def _set(current: Flags, flag: str, value: str | float | None, why: str, step: str,
         summary: str | None = None) -> Relaunch:
    new_flags = current.set(flag, value)
    return Relaunch(new_flags, (Change(flag, current.get(flag), new_flags.get(flag), why),), summary or why,
                    step=step)


# -- the rules --------------------------------------------------------------------------------
_NO_SIZE = "no size printed"      # the KV rule's source when vLLM said how many tokens fit in no form


def _kv_cache(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    rules = ctx.rules
    block = _block(current, d, ctx)
    length = _length(current, d, ctx)
    cap = ctx.requested.get_int(MML) or length          # never above what the user asked
    fit = _num(d, "fit_max_model_len")
    source = "vLLM's estimate"
    if fit is None and _num(d, "kv_needed_gib") and _num(d, "kv_available_gib") and length:
        # 0.7-0.9.0 print only GiB (rounded to 2 decimals): scale by their ratio, less a margin
        # of at least one block.
        ratio = float(_num(d, "kv_available_gib")) / float(_num(d, "kv_needed_gib"))
        fit = int(length * ratio * (1.0 - rules.kv_margin)) - block
        source = "the ratio of available to needed KV memory"
    if fit is None and length:
        fit = length // 2
        source = _NO_SIZE
    if fit is None:
        return GiveUp("the KV cache is too small, and neither the log nor the flags say the "
                      "current length", EX_TEMPFAIL, ADVICE)
    fit = estimate = int(fit)         # estimate: what vLLM printed (or the ratio gave), before the cap
    if cap:
        fit = min(fit, cap)
    floor = rules.min_model_len
    kv_dtype = (current.get(KV_DTYPE) or "auto").lower()
    if source == "vLLM's estimate" and _allowed(ctx, "max_model_len"):
        try:
            sized = _kv_resized(fit, length, cap, block, d, current, ctx, estimate=estimate)
        except (ArithmeticError, ValueError, TypeError):
            sized = None       # the model's facts cannot size this (an unknown KV dtype ...)
        if sized is not None:
            return sized
    new_len = _align(fit, block)
    halved = bool(length and new_len >= length)       # no progress from the estimate: halve
    if halved:
        assert length is not None
        new_len = _align(length // 2, block)
    head, how = _length_why(estimate, source, length, cap, new_len, halved=halved)
    if new_len >= floor and _allowed(ctx, "max_model_len"):
        out = _set(current, MML, str(new_len), f"{head}; {how}, aligned down to the {block}-token block",
                   "max_model_len")
        if length and length > 32768 >= new_len:
            # V0 measured this capacity with chunked prefill on (automatic above 32768); at the
            # new length it would profile the whole context and the KV cache would shrink.
            flags, extra = _with_chunked_prefill(out.flags, d, ctx, None)
            if extra:
                return Relaunch(flags, out.changes + tuple(extra), out.why, step="max_model_len")
        return out
    # what keeps the length where it is, in the numbers the rule has: too few tokens for the floor,
    # or a length change not allowed
    if head.startswith("the KV cache holds"):
        short = (f"only {fit} tokens fit, below the floor of {floor}" if new_len < floor and fit < floor
                 else f"only {new_len} tokens fit in whole {block}-token blocks, below the floor of {floor}"
                 if new_len < floor
                 else f"only {fit}" + (f" of the {length}" if length else "")
                 + " tokens fit, and the remedies allowed do not include the length")
    else:       # vLLM's figure is no help: the length it did not hold, and what the rule would make of it
        short = f"{head}; " + (f"{how} in whole {block}-token blocks, below the floor of {floor}" if new_len < floor
                               else "the remedies allowed do not include the length")
    if (kv_dtype == "auto" and _allowed(ctx, "kv_cache_fp8") and ctx.fp8_supported is not False
            and "kv_cache_fp8" not in ctx.tried):
        # fp8 halves bytes per token, so the same memory holds twice the tokens; on V0 chunked
        # prefill (no degradation) frees the whole-context profile's activation memory as well.
        chunked = _v0_chunked(fit, length, d, current, ctx) if source == "vLLM's estimate" else None
        tokens = chunked[0] if chunked is not None else fit
        doubled = _align(min(2 * tokens, cap or 2 * tokens), block)
        if doubled >= floor:
            flags = current.set(KV_DTYPE, "fp8")
            changes = [Change(KV_DTYPE, current.get(KV_DTYPE), "fp8", f"{short}; fp8 KV doubles the capacity")]
            if chunked is not None:
                flags = flags.set(CHUNKED)
                changes.append(chunked[1])
            if (not length or doubled < length) and _allowed(ctx, "max_model_len"):
                flags = flags.set(MML, str(doubled))
                changes.append(Change(MML, current.get(MML), str(doubled),
                                      f"about {doubled} tokens fit with fp8 KV"))
            return Relaunch(flags, tuple(changes), changes[0].why, step="kv_cache_fp8")
    # Still below the floor: free memory for the KV cache (eager mode, a smaller batch) first.
    # Eager mode frees nothing for it where vLLM captures CUDA graphs after sizing it (before 0.20).
    steps = ("max_num_batched_tokens",) if _graphs_outside_budget(current, ctx) else (
        "enforce_eager", "max_num_batched_tokens")
    for step in steps:
        if f"kv_small:{step}" in ctx.tried:
            continue
        freed = _no_kv_step(step, d, current, ctx)
        if freed is not None:
            return Relaunch(freed.flags, freed.changes, f"{short}; " + freed.why, step=f"kv_small:{step}")
    below = (f"the KV cache holds only about {fit} tokens, below the floor --min-model-len {floor}"
             if short.startswith(f"only {fit} tokens fit, below") else short)
    return GiveUp(below + (" even with fp8 KV" if kv_dtype != "auto" or "kv_cache_fp8" in ctx.tried else ""),
                  EX_TEMPFAIL, ADVICE)


def _length_why(estimate: int, source: str, length: int | None, cap: int | None, new_len: int, *,
                halved: bool) -> tuple[str, str]:
    """Why ``--max-model-len`` becomes ``new_len``, in the numbers the rule acted on: what the KV cache
    holds (and where that figure came from) against the length that did not fit, and how ``new_len``
    follows from them (before its alignment to the block)."""
    if length and source == _NO_SIZE:
        head = f"the KV cache cannot hold {length} tokens and vLLM printed no size for it"
    elif length and estimate >= length:
        head = f"the KV cache cannot hold {length} tokens, yet {source} gives {estimate}, no fewer"
    else:
        head = f"the KV cache holds about {estimate} tokens ({source})" + (f", not {length}" if length else "")
    if halved or source == _NO_SIZE:
        how = f"{new_len} is half of {length}"
    elif cap and cap < estimate and (not length or cap < length):
        how = f"{new_len} is the {cap} asked for"
    elif length and estimate >= length:
        how = f"{new_len} is {length}"
    else:
        how = f"{new_len} is that"
    return head, how


def _v0_chunked(fit: int, length: int | None, d: Diagnosis, current: Flags, ctx: Context) -> tuple[int, Change] | None:
    """V0 profiled the whole context at once (up to 32768 tokens): with chunked prefill the profile
    frees activation memory for the KV cache. The tokens the KV cache then holds (estimated, the
    margin held back) and the change; None where it does not apply or the model is unknown."""
    version = _version(d, ctx)
    if (ctx.sizing is None or not length or not vllm.known_v0(version) or length > vllm.V0_AUTO_CHUNK_ABOVE
            or current.has(CHUNKED) or current.has(BATCHED) or not _allowed(ctx, _remedy(CHUNKED))):
        return None
    chunk = vllm.v0_chunk_size(version)
    gain = v0_chunked_gain_tokens(ctx.sizing.info, from_tokens=max(length, 2048), to_tokens=chunk,
                                  tp=current.get_int(TENSOR_PARALLEL) or 1,
                                  kv_cache_dtype=current.get(KV_DTYPE) or "auto", dtype=current.get("--dtype"),
                                  seqs=current.get_int(SEQS) or _defaults(current, ctx)[1])
    if gain <= 0:
        return None
    return fit + int(gain * (1.0 - ctx.rules.kv_margin)), Change(CHUNKED, None, "", (
        f"vLLM V0 measured {fit} tokens while profiling all {length} at once; in chunks of {chunk} "
        f"the profile frees room for about {gain} more (estimated, {ctx.rules.kv_margin:.0%} held back)"))


def _kv_resized(fit: int, length: int | None, cap: int | None, block: int, d: Diagnosis, current: Flags,
               ctx: Context, *, estimate: int) -> Relaunch | None:
    """The length vLLM measured, corrected for what the relaunch's other changes do to the KV cache.

    With the model known (``ctx.sizing``), two changes are predictable from vLLM's own figure:
    V0 profiled the whole context at once (up to 32768 tokens), so chunked prefill frees that
    activation memory for the KV cache; and vLLM < 0.20 on a GPU other processes share captures
    CUDA graphs outside its budget, so the budget must leave room for them (else the next launch
    fails at capture). None: no correction applies, the plain rule decides. ``fit`` is vLLM's
    ``estimate`` held to the length asked for (``cap``).
    """
    if ctx.sizing is None or not length:
        return None
    info = ctx.sizing.info
    tp = current.get_int(TENSOR_PARALLEL) or 1
    kv_dtype, dtype = current.get(KV_DTYPE) or "auto", current.get("--dtype")
    flags, changes, tokens = current, [], fit
    chunked = _v0_chunked(fit, length, d, current, ctx)
    if chunked is not None:
        tokens, change = chunked
        flags = flags.set(CHUNKED)
        changes.append(change)
    util = current.get_float(UTIL) or _num(d, "requested_utilization") or _utilization(current, ctx)
    if (_graphs_outside_budget(current, ctx) and ctx.gpu_free_gib and ctx.gpu_total_gib
            and _allowed(ctx, "gpu_memory_utilization")):
        planned = _plan(ctx, flags.set(UTIL, f"{util:g}"), total_gib=ctx.gpu_total_gib, free_gib=ctx.gpu_free_gib)
        room = planned.flags.get(UTIL) if planned is not None else None
        if room is not None and float(room) < util:
            per_token = kv_bytes_per_token(info, tp=tp, kv_cache_dtype=kv_dtype, dtype=dtype)
            lost = int((util - float(room)) * ctx.gpu_total_gib * GiB) // max(1, per_token)
            tokens -= lost
            flags = flags.set(UTIL, room)
            changes.append(Change(UTIL, current.get(UTIL), room, (
                f"other processes hold memory and this vLLM captures CUDA graphs outside its budget; "
                f"{room} leaves room for them (about {lost} tokens fewer)")))
    if not changes:
        return None
    new_len = _align(min(tokens, cap or tokens), block)
    if new_len < ctx.rules.min_model_len:
        return None
    if new_len < length:
        capped = "" if not cap or cap >= tokens else (
            f", held to the {cap} asked for" if ctx.requested.get_int(MML) else f", held to the {cap} launched")
        head, _ = _length_why(estimate, "vLLM's estimate", length, cap, new_len, halved=False)
        changes.insert(0, Change(MML, current.get(MML), str(new_len), (
            f"{head}; with the changes below about {tokens}{capped}, aligned down to the {block}-token block")))
        flags = flags.set(MML, str(new_len))
        if length > 32768 >= new_len:
            flags, extra = _with_chunked_prefill(flags, d, ctx, None)
            changes += extra
    return Relaunch(flags, tuple(changes), changes[0].why, step="max_model_len")


def _auto_fit_above(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    """vLLM's auto-fit found room for more than the user asked: what they asked fits, so pin it."""
    asked = ctx.requested.get_int(MML) or _num(d, "max_model_len")
    chosen = _num(d, "fit_max_model_len")
    if not asked:
        return GiveUp("vLLM's auto-fit chose a length above the request, but the request is unknown",
                      EX_CONFIG, "set --max-model-len")
    room = f"room for {chosen} tokens" if chosen else "a length"
    why = f"vLLM's auto-fit found {room}, more than the {asked} asked for; {asked} fits"
    return _set(current, MML, str(asked), why, "max_model_len_asked")


def _max_len_exceeds(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    derived = _num(d, "derived_max_model_len") or ctx.derived_max_model_len
    if not derived or not _allowed(ctx, "max_model_len"):
        return GiveUp("--max-model-len is above the model's maximum, and the log does not say "
                      "the maximum", EX_CONFIG, "set --max-model-len to the model's context length")
    derived = int(derived)
    why = f"the model's config allows at most {derived} tokens"
    return _set(current, MML, str(derived), why, "max_model_len_derived")


def _plan(ctx: Context, flags: Flags, *, total_gib: float, free_gib: float | None,
          context_bytes: int = vllm.CUDA_CONTEXT_BYTES, only: Iterable[str] | None = None) -> Fit | None:
    """The plan's flags for ``flags`` on this GPU, or None without the model's facts (or when the
    plan cannot size this model): an estimate only ever refines a rule, it never breaks one. The plan
    uses only the remedies ``remedies.allowed`` lists (and of those, with ``only``, only these), so
    every flag it proposes may be taken, and what it proposes counts on nothing it does not."""
    if ctx.sizing is None:
        return None
    allowed = frozenset(ctx.rules.allowed)
    if only is not None:
        allowed &= frozenset(only)
    try:
        return ctx.sizing.fit(flags, total_bytes=int(total_gib * GiB),
                                       free_bytes=None if free_gib is None else int(free_gib * GiB),
                                       vllm_version=ctx.vllm_version, context_bytes=context_bytes,
                                       allowed=allowed)
    except (ArithmeticError, ValueError, TypeError):
        return None


def _weights_per_rank_gib(current: Flags, ctx: Context) -> float | None:
    if ctx.sizing is None or not ctx.sizing.info.weights_bytes:
        return None
    offload = current.get_float(OFFLOAD) or 0.0
    return ctx.sizing.info.weights_bytes / GiB / max(1, current.world_size()) - offload


def _graphs_outside_budget(current: Flags, ctx: Context) -> bool:
    """vLLM 0.9.1-0.19 captures CUDA graphs after sizing the KV cache, in memory outside its budget."""
    return vllm.graphs_outside_budget(ctx.vllm_version) and not current.enabled(EAGER)


def _share_under_free(current: Flags, ctx: Context, util: float, *, free_gib: float, total_gib: float,
                      context_bytes: int = vllm.CUDA_CONTEXT_BYTES) -> tuple[float, Fit | None]:
    """The share (``--gpu-memory-utilization``) vLLM can take from ``free_gib`` instead of ``util``,
    and the plan it came from (None when the plan had no share to give): the plan's, which leaves
    room for the model's CUDA graphs before 0.20, else free/total less the margin and, before 0.20,
    a graph reserve for an unknown model."""
    planned = _plan(ctx, current.set(UTIL, f"{util:g}"), total_gib=total_gib, free_gib=free_gib,
                    context_bytes=context_bytes)
    if planned is not None and UTIL in planned.flags:
        return float(cast(str, planned.flags[UTIL])), planned
    # the model unknown: the least room the plan ever leaves for graphs captured outside the budget
    reserve = GRAPH_OUTSIDE_FLOOR_BYTES / GiB if _graphs_outside_budget(current, ctx) else 0.0
    return utilization_under_free((free_gib - reserve) * GiB, total_gib * GiB, context_bytes=context_bytes,
                                  margin=ctx.rules.utilization_margin), None


#: The least KV cache (GiB) the guard gives the CPU backend: less holds no useful context.
CPU_KV_LEAST_GIB = 0.25


def _cpu_kv_space(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    """The CPU backend was given a KV cache size larger than its NUMA node has available. vLLM
    applies VLLM_CPU_KVCACHE_SPACE over ``--kv-cache-memory-bytes``, so only a size given by the
    flag alone can be lowered; an environment variable is for a person to change."""
    free, total, asked = float(_num(d, "free_gib") or 0), _num(d, "total_gib"), _num(d, "cpu_kv_gib")
    fits = max(0.0, free * 0.9)               # other processes' memory moves; keep a tenth back
    new_bytes = int(fits * GiB) // (1 << 20) * (1 << 20)
    available = f"only {free}" + (f" of {total}" if total else "") + " GiB of CPU memory is available"
    # The advice is a size vLLM can be given: VLLM_CPU_KVCACHE_SPACE counts whole GiB (vLLM reads it
    # with int(), and 0 is a KV cache of nothing); below a GiB only the flag can say it, and it wins
    # only with the variable unset; below the least KV cache worth a launch, nothing fits.
    if fits < CPU_KV_LEAST_GIB:
        advice = f"no KV cache fits in the {free} GiB of CPU memory available: free memory on this machine"
    elif fits < 1:
        advice = (f"unset VLLM_CPU_KVCACHE_SPACE (it counts whole GiB, and less than 1 GiB is available) and set "
                  f"--kv-cache-memory-bytes to at most {new_bytes} ({new_bytes / GiB:.2f} GiB), or free memory "
                  "on this machine")
    else:
        advice = (f"set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most {math.floor(fits)} GiB, "
                  "or free memory on this machine")
    if ctx.cpu_kv_space_gib is not None or not current.has(KV_BYTES):
        return GiveUp(f"the KV cache was set to {asked} GiB, but {available} (VLLM_CPU_KVCACHE_SPACE decides it, "
                      "and vllm-guard does not change your environment)", EX_CONFIG, advice)
    if fits < CPU_KV_LEAST_GIB or not _allowed(ctx, "gpu_memory_utilization"):    # the memory-share remedy
        return GiveUp(f"{available} for the KV cache", EX_TEMPFAIL, advice)
    flags = current.set(KV_BYTES, str(new_bytes))
    changes = [Change(KV_BYTES, current.get(KV_BYTES), str(new_bytes),
                      f"{available}; {new_bytes / GiB:.2f} GiB stays under it")]
    length = _length(current, d, ctx)
    # the model's KV bytes per token say whether the length still fits (without them, vLLM will say)
    planned = _plan(ctx, flags, total_gib=float(total or 0), free_gib=None) if total else None
    new_len = planned.flags.get(MML) if planned is not None else None
    if new_len is not None and new_len.isdigit() and length and int(new_len) < length:
        flags = flags.set(MML, new_len)
        changes.append(Change(MML, current.get(MML), new_len, f"about {new_len} tokens fit in the smaller KV cache"))
    return Relaunch(flags, tuple(changes), changes[0].why, step="cpu_kv_space")


def _free_memory(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    if _num(d, "cpu_kv_gib") is not None:
        return _cpu_kv_space(d, current, ctx)
    printed = bool(_num(d, "free_gib") and _num(d, "total_gib"))
    free, total = _num(d, "free_gib") or ctx.gpu_free_gib, _num(d, "total_gib") or ctx.gpu_total_gib
    share, kv_auto = _num(d, "cpu_share_gib"), _num(d, "cpu_kv_auto_gib")
    cpu = kv_auto is not None or bool(_num(d, "cpu_node"))
    device = "CPU memory" if cpu else "the GPU"
    if not free or not total or not _allowed(ctx, "gpu_memory_utilization"):
        return GiveUp(f"other processes hold the {'CPU' if cpu else 'GPU'} memory vLLM asked for", EX_TEMPFAIL,
                      f"free {device}, or lower --gpu-memory-utilization")
    free, total = float(free), float(total)
    # vLLM measures free memory after creating its CUDA context; NVML's figure still includes it.
    context = 0 if printed else vllm.CUDA_CONTEXT_BYTES
    current_util = current.get_float(UTIL) or _num(d, "requested_utilization") or 1.0
    planned = None
    # The CPU backend's share holds the worker's memory and then the KV cache. vLLM refuses it when the
    # KV cache's part is more than is available (the share shrinks by what it lacked) or is nothing
    # (kv_auto <= 0: the worker's own memory fills the share, which grows by what is available).
    moved = bool(share and kv_auto is not None and (kv_auto <= 0 or kv_auto > free))
    grows = moved and kv_auto <= 0
    if moved:
        current_util = float(share) / total         # the share as vLLM printed it
        util = utilization_under_free(float(share) - (float(kv_auto) - free), total, context_bytes=0,
                                      margin=ctx.rules.utilization_margin)
    else:
        util, planned = _share_under_free(current, ctx, current_util, free_gib=free, total_gib=total,
                                          context_bytes=context)
    if util <= 0.05 or util > 1 or (util <= current_util if grows else util >= current_util):
        return GiveUp(f"only {free}/{total} GiB is free on {device}; other processes hold the rest",
                      EX_TEMPFAIL, f"free {device} (see the processes holding it)")
    weights = _weights_per_rank_gib(current, ctx)
    if weights is not None and weights >= util * total:
        return GiveUp(f"only {free} of {total} GiB is free on {device}: at {util:.2f} vLLM could use "
                      f"{util * total:.2f} GiB, less than the model's weights ({weights:.2f} GiB per rank)",
                      EX_TEMPFAIL, f"free {device} (see the processes holding it)")
    why = (f"only {free} of {total} GiB is free (other processes hold the rest); "
           f"{util:.2f} stays under it")
    if moved and not grows:
        why = (f"the CPU memory share left the KV cache {float(kv_auto) - free:.2f} GiB short of the {free} GiB "
               f"available; {util:.2f} shrinks the share by that")
    elif grows:
        why = (f"the CPU memory share ({share} GiB) left the KV cache nothing after the worker's own "
               f"{float(share) - float(kv_auto):.2f} GiB; {util:.2f} gives it the {free} GiB available")
    out = _set(current, UTIL, util, why, "gpu_memory_utilization_free")
    if planned is None:     # the plan's length at the share chosen here
        planned = _plan(ctx, out.flags, total_gib=total, free_gib=free, context_bytes=context)
    if planned is None:
        return out
    # The smaller budget decides the length too: cut it now rather than after the next failure. The
    # plan's flags go together (its length counts on its fp8 KV, eager mode, chunked prefill) and it
    # proposes only what the rules allow; the share is the one chosen here.
    flags, changes = _with_plan(out.flags, list(out.changes), planned, exclude=(UTIL,))
    return Relaunch(flags, tuple(changes), why, step="gpu_memory_utilization_free")


def _with_plan(flags: Flags, changes: list[Change], planned: Fit, *, exclude: tuple[str, ...] = (),
               length_lead: str = "") -> tuple[Flags, list[Change]]:
    """``flags`` with every flag of ``planned`` (but ``exclude``) set, and the changes that makes: the
    plan's flags are one answer, none of them taken without the others (``length_lead`` goes before
    the length's reason)."""
    for flag, value in sorted(planned.flags.items(), key=lambda item: item[0] != MML if length_lead else 0):
        if flag in exclude:
            continue
        before = flags.get(flag)
        flags = flags.set(flag, value)
        if flags.get(flag) != before:
            lead = length_lead if flag == MML else ""
            changes.append(Change(flag, before, flags.get(flag), lead + planned.reasons.get(flag, "the plan says so")))
    return flags, changes


def _halve(current: Flags, flag: str, default: int, floor: int, first: int | None = None) -> int | None:
    now = current.get_int(flag) or first or default
    new = max(floor, now // 2)
    return new if new < now else None


def _no_kv_step(step: str, d: Diagnosis, current: Flags, ctx: Context) -> Relaunch | None:
    """One step of the no-KV-memory ladder, or None when it does not apply."""
    rules = ctx.rules
    if step == "gpu_memory_utilization" and _allowed(ctx, step):
        now = _utilization(current, ctx)
        target = vllm.default_utilization(ctx.vllm_version, current, ctx.platform)
        if ctx.gpu_free_gib and ctx.gpu_total_gib:
            # the most vLLM can take from what is free, and before 0.20 less the room for the CUDA graphs
            # it captures outside its share (the plan's room, which this step must not take back)
            most = utilization_under_free(ctx.gpu_free_gib * GiB, ctx.gpu_total_gib * GiB,
                                          margin=rules.utilization_margin)
            target, _ = _share_under_free(current, ctx, most, free_gib=ctx.gpu_free_gib, total_gib=ctx.gpu_total_gib)
        asked = ctx.requested.get_float(UTIL)
        if asked is not None:
            target = min(target, asked)     # a share the user set is a ceiling (a shared GPU's neighbours)
        if target > now:
            return _set(current, UTIL, target,
                        f"no memory was left for the KV cache at {now:.2f}; "
                        f"{target:.2f} gives vLLM more", step)
    elif step == "enforce_eager" and _allowed(ctx, step) and not current.enabled(EAGER) and not _v0(d, ctx):
        # (V0 sizes the KV cache before it captures CUDA graphs: eager mode frees nothing for it)
        return _set(current, EAGER, None,
                    "no memory was left for the KV cache; eager mode frees what CUDA graphs and "
                    "compilation take", step)
    elif step == "max_num_batched_tokens" and _allowed(ctx, step):
        flags, changes = _with_chunked_prefill(current, d, ctx, current.get_int(MML))
        if changes:     # V0 refuses fewer batched tokens than max_model_len without it
            return Relaunch(flags, tuple(changes), changes[0].why, step=step)
        new = _halve(current, BATCHED, _defaults(current, ctx)[0],
                     rules.min_max_num_batched_tokens)
        if new:
            return _set(current, BATCHED, str(new),
                        "a smaller batch lowers the activation peak that left no room for KV", step)
    elif step == "max_num_seqs" and _allowed(ctx, step):
        new = _halve(current, SEQS, _defaults(current, ctx)[1], rules.min_max_num_seqs)
        if new:
            return _set(current, SEQS, str(new),
                        "fewer concurrent sequences lower the activation peak", step)
    elif step == "cpu_offload" and _allowed(ctx, step) and rules.cpu_offload_gb > 0 and not current.has(OFFLOAD) \
            and vllm.flag_supported(OFFLOAD, ctx.vllm_version):
        return _set(current, OFFLOAD, f"{rules.cpu_offload_gb:g}",
                    f"offloading {rules.cpu_offload_gb:g} GiB of weights to CPU leaves GPU memory "
                    "for the KV cache (slow)", step)
    return None


def _ladder(steps: tuple[str, ...], prefix: str, d: Diagnosis, current: Flags, ctx: Context,
            what: str) -> Decision:
    for step in steps:
        if f"{prefix}:{step}" in ctx.tried:
            continue
        decision = _no_kv_step(step, d, current, ctx)
        if decision is not None:
            return Relaunch(decision.flags, decision.changes, decision.why, step=f"{prefix}:{step}")
    return GiveUp(f"{what}, and every allowed remedy has been tried", EX_TEMPFAIL, ADVICE)


def _no_kv(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    return _ladder(ctx.rules.no_kv_order, "no_kv", d, current, ctx,
                   "the weights and activations leave no memory for the KV cache")


def _oom_kv_alloc(d: Diagnosis, current: Flags, ctx: Context) -> Relaunch | None:
    """CUDA ran out of memory allocating the KV cache vLLM had sized: its budget counts on memory
    other processes hold (V0 sizes against its own share only; any vLLM when a neighbour grew after
    profiling). A share under what they leave fits it, with room for CUDA graphs before 0.20."""
    if "oom_kv_alloc" in ctx.tried or not _allowed(ctx, "gpu_memory_utilization"):
        return None
    now = _utilization(current, ctx)
    target = None
    if ctx.gpu_free_gib and ctx.gpu_total_gib:
        target, _ = _share_under_free(current, ctx, now, free_gib=ctx.gpu_free_gib, total_gib=ctx.gpu_total_gib)
    if target is None or target >= now:
        target = round(now - 0.05, 2)       # nothing known about the other processes: a step down
    if target < 0.05:
        return None
    return _set(current, UTIL, target,
                "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's "
                f"budget counted on; {target:.2f} stays under what they leave", "oom_kv_alloc")


def _oom_profile(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    if d.phase == "kv_cache":
        alloc = _oom_kv_alloc(d, current, ctx)
        if alloc is not None:
            return alloc
    dummy = _num(d, "num_dummy_requests")
    if "oom_profile:max_num_seqs" not in ctx.tried and _allowed(ctx, "max_num_seqs"):
        new = _halve(current, SEQS, _defaults(current, ctx)[1],
                     ctx.rules.min_max_num_seqs, first=current.get_int(SEQS) or dummy)
        if new:
            return _set(current, SEQS, str(new),
                        f"CUDA ran out of memory warming up {dummy or 'the'} dummy requests; "
                        f"{new} sequences need half the activation memory", "oom_profile:max_num_seqs")
    if "oom_profile:max_num_batched_tokens" not in ctx.tried:
        step = _no_kv_step("max_num_batched_tokens", d, current, ctx)
        if step:
            return Relaunch(step.flags, step.changes, step.why, step="oom_profile:max_num_batched_tokens")
    if "oom_profile:lower_utilization" not in ctx.tried and _allowed(ctx, "gpu_memory_utilization"):
        now = _utilization(current, ctx)
        share = round(now - 0.05, 2)
        if share >= 0.5:
            return _set(current, UTIL, share,
                        "profiling ran out of memory; a lower utilization leaves more headroom "
                        "outside vLLM's budget", "oom_profile:lower_utilization")
    return GiveUp("CUDA ran out of memory while profiling, and every allowed remedy has been "
                  "tried", EX_TEMPFAIL, ADVICE)


def _oom_cudagraph(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    if not current.enabled(EAGER) and _allowed(ctx, "enforce_eager"):
        return _set(current, EAGER, None,
                    "capturing CUDA graphs failed or ran out of memory; eager mode skips the capture",
                    "enforce_eager")
    return _oom_profile(d, current, ctx)


def _oom_runtime(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    base = ctx.last_good or current
    if not _allowed(ctx, "max_num_seqs"):
        return Relaunch(base, (), "CUDA ran out of memory while serving; restarting", backoff=True,
                        step="restart")
    new = _halve(base, SEQS, _defaults(base, ctx)[1], ctx.rules.min_max_num_seqs)
    if new is None:
        return Relaunch(base, (), "CUDA ran out of memory while serving; restarting", backoff=True,
                        step="restart")
    return Relaunch(base.set(SEQS, str(new)),
                    (Change(SEQS, base.get(SEQS), str(new),
                            "CUDA ran out of memory while serving; fewer concurrent sequences "
                            "need less activation memory"),),
                    "CUDA ran out of memory while serving", backoff=True, step="oom_runtime")


def _oom_weights(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    step = _no_kv_step("cpu_offload", d, current, ctx)
    if step is not None:
        return Relaunch(step.flags, step.changes, step.why, step="oom_weights:cpu_offload")
    if d.phase == UNKNOWN_PHASE:     # nothing placed the OOM: say so, not that the weights were the cause
        return GiveUp("CUDA ran out of memory and nothing in the log says where; read as the start-up's first "
                      "phase, the model's weights may not fit in GPU memory", EX_TEMPFAIL, ADVICE)
    return GiveUp("the model's weights do not fit in GPU memory", EX_TEMPFAIL, ADVICE)


def _restart(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    base = ctx.last_good or current
    what = (d.detail or f"the engine died ({d.kind})").rstrip(". ")
    return Relaunch(base, (), f"{what}; relaunching with the last good flags", backoff=True,
                    step="restart")


def _removed_in_evidence(d: Diagnosis, current: Flags, ctx: Context) -> dict[str, str]:
    """Flags vLLM calls unrecognized that it removed in an earlier release: name -> why."""
    text = d.evidence
    if "unrecognized arguments:" not in text or "drop_removed_flags" in ctx.tried:
        return {}
    out: dict[str, str] = {}
    for token in text.split("unrecognized arguments:", 1)[1].split():
        name = canonical(token.split("=", 1)[0])
        if name in vllm.REMOVED_FLAGS and current.has(name):
            # vLLM itself calls it unrecognized: gone from this vLLM whatever its version says, and the
            # reason is the release that removed it (an older version's would be empty)
            out[name] = vllm.removed_flag(name, vllm.REMOVED_FLAGS[name][0]) or ""
    return out


def _config_error(d: Diagnosis, current: Flags, ctx: Context) -> Decision:
    text = d.evidence.lower()
    if "address already in use" in text and ctx.port_failures < ctx.rules.port_retries:
        return Relaunch(current, (), "the port is in use; the previous holder may be exiting",
                        backoff=True, step="port_retry")
    if "chunked" in text and current.has(CHUNKED) and not ctx.requested.has(CHUNKED) \
            and "undo_chunked_prefill" not in ctx.tried:
        return Relaunch(current.remove(CHUNKED),
                        (Change(CHUNKED, "", None, "vLLM refused chunked prefill here; without it"),),
                        "vLLM refused the chunked prefill the guard had added; relaunching without it",
                        step="undo_chunked_prefill")
    dropped = _removed_in_evidence(d, current, ctx)
    if dropped:
        flags = current
        for name in dropped:
            flags = flags.remove(name)
        changes = tuple(Change(n, current.get(n), None, dropped[n]) for n in dropped)
        return Relaunch(flags, changes, "; ".join(dropped.values()), step="drop_removed_flags")
    fp8_refused = any(s in text for s in ("fp8", "kv-cache", "kv_cache_dtype", "kv cache dtype"))
    if fp8_refused and "kv_cache_fp8" in ctx.tried:
        kv = next((p for p in reversed(ctx.previous) if p.kind is Kind.KV_CACHE_INSUFFICIENT), None)
        reason = "this GPU refuses fp8 KV cache, and without it the KV cache is below the floor"
        if kv is not None:
            reason += f" ({kv.evidence[:200]})"
        return GiveUp(reason, EX_TEMPFAIL, ADVICE)
    specific = {"required_gpus", "required_placement_groups", "env_var"} & d.numbers.keys()
    if d.detail and (specific or (d.evidence and d.evidence in d.detail)):
        return GiveUp(d.detail, EX_CONFIG, "")       # it names the cause and what to change
    return GiveUp(f"vLLM refused its configuration: {d.evidence[:300].rstrip('. ')}", EX_CONFIG,
                  config_advice(d.evidence))


#: What a person can do about a configuration vLLM refused, by what vLLM's line says (first match).
_CONFIG_ADVICE = (
    (("gatedrepoerror", "gated repo", "access to model", "is restricted"),
     "the model is gated: accept its licence on huggingface.co and give vLLM a token that may read it "
     "(HF_TOKEN in the guard's environment; /etc/vllm-guard/env under systemd)"),
    (("repositorynotfound", "repository not found", "is not a local folder", "not a valid model identifier",
      "does not appear to have a file named", "no such file or directory", "404 client error"),
     "check the model name: a Hugging Face repo id (org/name) or a local directory with config.json; a "
     "private repo also needs HF_TOKEN"),
    (("401 client error", "403 client error", "invalid user token", "invalid credentials"),
     "Hugging Face refused the token: set HF_TOKEN to a valid token with access to the model"),
    (("trust_remote_code", "trust-remote-code"),
     "the model ships its own code: add --trust-remote-code if you trust it"),
    (("world size", "tensor_parallel_size", "tensor parallel size", "pipeline parallel", "number of gpus",
      "gpus available", "cuda_visible_devices", "not divisible"),
     "make --tensor-parallel-size x --pipeline-parallel-size fit the GPUs this process sees "
     "(CUDA_VISIBLE_DEVICES) and divide the model's attention heads"),
    (("unrecognized arguments", "unrecognized argument", "no such option", "invalid choice"),
     "remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version"),
    (("address already in use",),
     "stop the process holding the port, or give vLLM another --port"),
    (("not supported", "unsupported", "does not support", "requires compute capability", "compute capability"),
     "this GPU or this vLLM does not support what was asked: choose a --dtype, --quantization or "
     "--kv-cache-dtype it supports, or another vLLM version"),
    (("out of range", "must be", "invalid", "validationerror", "validation error"),
     "correct the value vLLM names in the flags or in vLLM's --config file"),
)


def config_advice(evidence: str) -> str:
    """What could help with a configuration vLLM refused, from its own line."""
    text = evidence.lower()
    for needles, advice in _CONFIG_ADVICE:
        if any(n in text for n in needles):
            return advice
    return "fix the model name, the arguments or the environment named in vLLM's line, then start again"


_RULES = {
    Kind.KV_CACHE_INSUFFICIENT: _kv_cache,
    Kind.AUTO_FIT_ABOVE_REQUEST: _auto_fit_above,
    Kind.MAX_LEN_EXCEEDS_MODEL: _max_len_exceeds,
    Kind.INSUFFICIENT_FREE_MEMORY: _free_memory,
    Kind.NO_KV_CACHE_MEMORY: _no_kv,
    Kind.OOM_CUDAGRAPH: _oom_cudagraph,
    Kind.OOM_PROFILE: _oom_profile,
    Kind.OOM_RUNTIME: _oom_runtime,
    Kind.OOM_WEIGHTS: _oom_weights,
    Kind.ENGINE_DEAD: _restart,
    Kind.UNKNOWN_FAILURE: _restart,  # treated as the engine dying: the same flags after backoff
    Kind.HEALTHY: _restart,          # an unexplained exit or a hang
    Kind.NO_VLLM_OUTPUT: _restart,
    Kind.INCOMPLETE: _restart,
    Kind.CONFIG_ERROR: _config_error,
}


#: Failures whose remedies free memory without touching the length.
_FORESEEN = (Kind.NO_KV_CACHE_MEMORY, Kind.OOM_PROFILE, Kind.OOM_CUDAGRAPH)


def _foresee(decision: Relaunch, d: Diagnosis, ctx: Context) -> Relaunch:
    """When the plan says the length will not fit under the relaunch's flags, cut it in the same
    relaunch instead of waiting for vLLM to say so (needs the model and the GPU's size)."""
    if ctx.sizing is None or not ctx.gpu_total_gib or decision.backoff or not _allowed(ctx, "max_model_len") \
            or any(c.flag == MML for c in decision.changes):
        return decision
    # The length with what it counts on (V0's chunked prefill, a share under what other processes
    # leave), taken together; not fp8 KV or eager mode: degradations beyond the relaunch's own step.
    planned = _plan(ctx, decision.flags, total_gib=ctx.gpu_total_gib, free_gib=ctx.gpu_free_gib,
                    only=("max_model_len", "max_num_batched_tokens", "gpu_memory_utilization"))
    new = planned.flags.get(MML) if planned is not None else None   # a number, or "auto" (0.14+)
    length = _length(decision.flags, d, ctx)
    if new is None or (new != "auto" and (not new.isdigit() or (length and int(new) >= length))):
        return decision
    assert planned is not None           # new came from it
    flags, changes = _with_plan(decision.flags, [], planned, length_lead="with the relaunch's other flags, ")
    return Relaunch(flags, decision.changes + tuple(changes), decision.why, step=decision.step)


def decide(d: Diagnosis, current: Flags, ctx: Context | None = None) -> Decision:
    """The next launch after failure ``d`` with ``current`` flags, or why to give up."""
    ctx = ctx or Context(requested=current)
    decision = _RULES[d.kind](d, current, ctx)
    if isinstance(decision, Relaunch) and d.kind in _FORESEEN:
        decision = _foresee(decision, d, ctx)
    if isinstance(decision, Relaunch):
        decision = within_rules(decision, ctx)
    if isinstance(decision, Relaunch) and not decision.backoff and decision.flags == current:
        return GiveUp(f"{d.kind}: no remedy changes anything", EX_TEMPFAIL, ADVICE)
    return decision


def within_rules(decision: Relaunch, ctx: Context) -> Relaunch:
    """``decision`` with every change to the user's flags that ``remedies.allowed`` does not allow put
    back (:func:`supervisor.core.remediable.within`), and its changes only those still made: the check
    each relaunch passes, whatever rule made it."""
    flags = remediable.within(ctx.requested, decision.flags, ctx.rules.allowed)
    if flags == decision.flags:
        return decision
    changes = tuple(c for c in decision.changes if flags.get(c.flag) == c.new)
    return replace(decision, flags=flags, changes=changes, why=changes[0].why if changes else decision.why)


def plan_ahead(expected: str, current: Flags, ctx: Context) -> Relaunch | None:
    """The relaunch the policy would make after a failure the plan predicts for ``current``, so the
    first launch can skip it; None when the policy would give up or the kind is not known."""
    try:
        kind = Kind(expected)
    except ValueError:
        return None
    d = Diagnosis(kind, evidence="predicted by the plan (config.json and GPU memory)", phase="planned")
    decision = decide(d, current, ctx)
    return decision if isinstance(decision, Relaunch) and not decision.backoff else None
