"""The plan as a table: does a model fit these GPUs, what would, and how much context at each utilization.

Pure (model facts and the GPU's size in, a JSON-able dict out): :func:`build_plan` is what
``vllm-guard plan`` prints (:mod:`supervisor.cli.plan` reads the facts and renders it). It leads
with a verdict -- the model fits, fits with a cut context, or does not fit -- and the options that
would make it fit (a larger tensor- or pipeline-parallel size, fp8 KV, ``--cpu-offload-gb``, a
quantized variant), each computed with the one memory model (:mod:`supervisor.core.memory`), and
the first launch the guard would make (:func:`supervisor.core.plan.fit_launch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from supervisor.core import memory as M
from supervisor.core import vllm
from supervisor.core.flags import Flags
from supervisor.core.model import VARIANTS, ModelInfo, checkpoint_bytes, derive_max_model_len, quant_scheme
from supervisor.core.plan import fit_launch
from supervisor.core.units import GiB

UTILIZATIONS = (0.80, 0.85, 0.90, 0.95)
CONTEXTS = (4096, 8192, 32768)
#: Host-to-GPU bandwidth assumed for the cost of --cpu-offload-gb (PCIe 4.0 x16 in practice), bytes/s.
OFFLOAD_BYTES_PER_S = 25e9
#: The largest world size the verdict's options consider.
MAX_WORLD = 16
LEGEND = ("x@4k, x@8k, x@32k, x@fit: how many requests of that many tokens the KV cache holds at once "
          "(vLLM's \"maximum concurrency\"); KV GiB: the estimate per GPU; safe GiB: less its error band; "
          "fit len: at most what vLLM will print as its KV cache size (a sliding-window model's single "
          "request may be longer: x@N >= 1)")


# -- the plan --------------------------------------------------------------------------------

class _Sizer:
    """One model on one kind of GPU: budgets and the lengths they hold, for any TP/PP, dtype, eager."""

    def __init__(self, info: ModelInfo, *, total: int, free: int, vllm_version: str | None, platform: str,
                 cpu_kv_space_gib: float | None, device_name: str, cc: tuple[int, int] | None, target: int,
                 block: int, max_num_seqs: int | None, max_num_batched_tokens: int | None, chunked: bool,
                 offload_bytes: int, dtype: str | None = None, quantization: str | None = None) -> None:
        self.info, self.total, self.free, self.version = info, total, free, vllm_version
        self.platform, self.cpu_kv_space_gib, self.device_name, self.cc = platform, cpu_kv_space_gib, device_name, cc
        self.target, self.block, self.seqs, self.batched, self.chunked = (target, block, max_num_seqs,
                                                                          max_num_batched_tokens, chunked)
        self.offload = offload_bytes
        self.dtype, self.quantization = dtype, quantization

    def budget(self, util: float, *, tp: int, pp: int, eager: bool, info: ModelInfo | None = None,
               offload: int | None = None) -> M.Budget:
        return M.kv_budget(info or self.info, gpu_total_bytes=self.total, utilization=util, tp=tp, pp=pp,
                           vllm_version=self.version, enforce_eager=eager, max_model_len=self.target,
                           max_num_batched_tokens=self.batched, max_num_seqs=self.seqs,
                           other_used_bytes=max(0, self.total - self.free), platform=self.platform,
                           cpu_kv_space_gib=self.cpu_kv_space_gib, device_name=self.device_name,
                           chunked_prefill=self.chunked, compute_capability=self.cc,
                           cpu_offload_bytes=self.offload if offload is None else offload, dtype=self.dtype,
                           quantization=self.quantization if info is None else None)

    def tokens(self, kv_bytes: int, *, tp: int, pp: int, kv_dtype: str, info: ModelInfo | None = None,
               upper: int | None = None) -> int:
        return M.fit_max_model_len(kv_bytes, info or self.info, tp=tp, pp=pp, kv_cache_dtype=kv_dtype,
                                   block_size=self.block, vllm_version=self.version, upper=upper,
                                   max_num_batched_tokens=self.batched or 2048, dtype=self.dtype)

    def holds(self, floor: int, util: float, *, tp: int, pp: int, kv_dtype: str, eager: bool,
              info: ModelInfo | None = None, offload: int | None = None) -> int:
        """The length the central estimate holds (capped at the target); 0 when not even ``floor``."""
        b = self.budget(util, tp=tp, pp=pp, eager=eager, info=info, offload=offload)
        if b.weights_bytes >= b.requested_bytes or b.kv_bytes <= 0:
            return 0
        n = self.tokens(b.kv_bytes, tp=tp, pp=pp, kv_dtype=kv_dtype, info=info, upper=self.target)
        return n if n >= floor else 0


def _world_sizes(info: ModelInfo) -> list[tuple[int, int]]:
    """(TP, PP) pairs by world size, TP first: TP divides the attention heads, PP at most the layers."""
    heads, layers = info.num_attention_heads or 1, info.num_layers or 1
    tps = [t for t in (1, 2, 4, 8, 16) if heads % t == 0]
    pairs = [(t, p) for t in tps for p in range(1, MAX_WORLD + 1) if t * p <= MAX_WORLD and p <= layers]
    return sorted(pairs, key=lambda x: (x[0] * x[1], x[1]))


def _options(s: _Sizer, *, util: float, tp: int, pp: int, gpus: int, floor: int, kv_dtype: str,
             fp8_ok: bool | None, eager_opts: list[bool]) -> list[dict[str, Any]]:
    """What would make the floor fit, each computed with the same model."""
    out: list[dict[str, Any]] = []
    dtypes = [kv_dtype] + (["fp8"] if kv_dtype == "auto" and fp8_ok is not False else [])

    def best(t: int, p: int, info: ModelInfo | None = None, offload: int | None = None) -> tuple[int, str, bool]:
        for e in eager_opts:              # the guard's order: fp8 KV before eager mode
            for d in dtypes:
                n = s.holds(floor, util, tp=t, pp=p, kv_dtype=d, eager=e, info=info, offload=offload)
                if n:
                    return n, d, e
        return 0, "", False

    def extra_flags(d: str, e: bool) -> dict[str, str | None]:
        f: dict[str, str | None] = {}
        if d == "fp8" and kv_dtype != "fp8":
            f["--kv-cache-dtype"] = "fp8"
        if e:
            f["--enforce-eager"] = None
        return f

    # 1. more GPUs: the smallest tensor-parallel size that fits, and a smaller pipeline split if one does
    pairs = [(t, p) for t, p in _world_sizes(s.info) if t * p > tp * pp]
    chosen: list[tuple[int, int, int, str, bool]] = []
    for want in (lambda t, p: p == pp, lambda t, p: True):
        for t, p in pairs:
            if not want(t, p):
                continue
            if chosen and t * p >= chosen[0][0] * chosen[0][1]:
                break
            n, d, e = best(t, p)
            if n:
                chosen.insert(0, (t, p, n, d, e))
                break
    for t, p, n, d, e in sorted(chosen, key=lambda c: c[0] * c[1]):
        flags: dict[str, str | None] = {"--tensor-parallel-size": str(t)}
        if p > 1:
            flags["--pipeline-parallel-size"] = str(p)
        flags.update(extra_flags(d, e))
        kind = "tensor-parallel" if p == 1 else "pipeline-parallel" if t == 1 else "tensor- and pipeline-parallel"
        out.append({"kind": "parallel", "flags": flags, "gpus": t * p, "available": t * p <= gpus,
                    "fit_max_model_len": n,
                    "what": f"{kind} over {t * p} GPUs" + ("" if t * p <= gpus else f" (needs {t * p}; {gpus} given)")})
    # 2. fp8 KV where the GPU's support is unknown or missing (with it, the verdict already tried it)
    if kv_dtype == "auto" and fp8_ok is not True:
        n = next((s.holds(floor, util, tp=tp, pp=pp, kv_dtype="fp8", eager=e) for e in eager_opts
                  if s.holds(floor, util, tp=tp, pp=pp, kv_dtype="fp8", eager=e)), 0)
        if n:
            out.append({"kind": "fp8_kv", "flags": {"--kv-cache-dtype": "fp8"}, "fit_max_model_len": n,
                        "what": "fp8 KV cache" + (" (this GPU does not support it)" if fp8_ok is False
                                                  else " (if the GPU supports it: give --compute-capability)")})
    # 3. weights in CPU memory: the least --cpu-offload-gb per GPU that leaves room for the floor
    if vllm.flag_supported("--cpu-offload-gb", s.version) or s.version is None:
        per_rank = s.budget(util, tp=tp, pp=pp, eager=False).weights_bytes + s.offload
        gib = next((g for g in range(1, int(per_rank / GiB) + 1)
                    if best(tp, pp, offload=s.offload + g * GiB)[0]), None)
        if gib:
            n, d, e = best(tp, pp, offload=s.offload + gib * GiB)
            step_s = gib * GiB / OFFLOAD_BYTES_PER_S
            flags = {"--cpu-offload-gb": str(gib), **extra_flags(d, e)}
            out.append({"kind": "cpu_offload", "flags": flags, "fit_max_model_len": n,
                        "cost_s_per_step": round(step_s, 3),
                        "what": (f"{gib} GiB of weights per GPU in CPU memory: every forward pass copies them "
                                 f"over PCIe, about {step_s:.2f} s a step at {OFFLOAD_BYTES_PER_S / 1e9:.0f} GB/s "
                                 f"(at most {1 / step_s:.1f} decode steps/s)")})
    # 4. a quantized variant of the same shapes
    for label, qc in VARIANTS.items():
        scheme = quant_scheme({"quantization_config": qc})
        if s.info.quantization == scheme.method:
            continue
        weights = checkpoint_bytes(s.info.shape, scheme)
        if weights >= (s.info.weights_bytes or 0):
            continue
        config = {**s.info.config, "quantization_config": qc}
        text = config.get("text_config")
        if isinstance(text, dict) and "quantization_config" in text:
            config["text_config"] = {k: v for k, v in text.items() if k != "quantization_config"}
        variant = replace(s.info, config=config, weights_bytes=weights, weights_source="estimate",
                          quantization=scheme.method)
        n, d, e = best(tp, pp, info=variant)
        opt: dict[str, Any] = {"kind": "quantized", "variant": label, "weights_gib": round(weights / GiB, 2),
                               "fits": bool(n), "fit_max_model_len": n, "flags": extra_flags(d, e) if n else {}}
        opt["what"] = (f"a quantized checkpoint of the same model ({label}): {weights / GiB:.1f} GiB of weights"
                       + (f", about {n:,} tokens fit" if n else ", still does not fit"))
        out.append(opt)
    return out


def build_plan(info: ModelInfo, *, gpu_total_bytes: int, gpu_free_bytes: int | None = None, gpus: int = 1,
               tp: int = 1, pp: int = 1, utilization: float | None = None, max_model_len: int | None = None,
               kv_cache_dtype: str = "auto", vllm_version: str | None = None,
               compute_capability: tuple[int, int] | None = None, platform: str = "cuda",
               cpu_kv_space_gib: float | None = None, enforce_eager: bool = False, device_name: str = "",
               contexts: Sequence[int] = CONTEXTS, max_num_seqs: int | None = None,
               max_num_batched_tokens: int | None = None, block_size: int | None = None,
               chunked_prefill: bool = False, min_model_len: int = 2048, cpu_offload_gb: float | None = None,
               rules_source: str = "", dtype: str | None = None, quantization: str | None = None) -> dict[str, Any]:
    """The plan as one JSON-able dict: the verdict and its options, model facts, one row per
    (utilization, KV dtype), the flags vllm-guard would start with. ``dtype`` and ``quantization``: vLLM's
    ``--dtype`` (float32 doubles the weights, activations and KV cache) and ``--quantization`` (fp8 of a
    16-bit checkpoint at load)."""
    free = gpu_total_bytes if gpu_free_bytes is None else gpu_free_bytes
    cc = compute_capability or M.gpu_compute_capability(device_name)
    derived = derive_max_model_len(info, vllm_version)
    target = max_model_len or derived
    floor = min(min_model_len, target)
    default_u = vllm.default_utilization(vllm_version, platform=platform)
    if platform == "cpu" and cpu_kv_space_gib is not None:
        utils = [utilization or default_u]      # the KV size is fixed; utilization does not move it
    else:
        utils = sorted({*UTILIZATIONS, utilization or default_u})
    fp8_ok = (vllm.fp8_kv_supported(cc, vllm_version, info.mla) if cc and platform != "cpu" else None)
    dtypes = [kv_cache_dtype] + (["fp8"] if kv_cache_dtype == "auto" and platform != "cpu" else [])
    block = block_size or vllm.default_block_size(mla=info.mla, platform=platform, compute_capability=cc,
                                                  vllm_version=vllm_version)
    offload = int((cpu_offload_gb or 0) * GiB)
    s = _Sizer(info, total=gpu_total_bytes, free=free, vllm_version=vllm_version, platform=platform,
               cpu_kv_space_gib=cpu_kv_space_gib, device_name=device_name, cc=cc, target=target, block=block,
               max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, chunked=chunked_prefill,
               offload_bytes=offload, dtype=dtype, quantization=quantization)
    checks = vllm.checks_free_memory(vllm_version, platform=platform) and platform != "cpu"
    rows = []
    for u in utils:
        b = s.budget(u, tp=tp, pp=pp, eager=enforce_eager)
        for d in dtypes:
            kw: dict[str, Any] = dict(tp=tp, pp=pp, kv_cache_dtype=d, block_size=block, vllm_version=vllm_version,
                      max_num_batched_tokens=b.max_num_batched_tokens or 2048, dtype=dtype)
            capacity = M.fit_max_model_len(b.kv_bytes, info, **kw)
            printed = M.kv_cache_tokens(max(b.kv_bytes, 0), info, tp=tp, pp=pp, kv_cache_dtype=d, block_size=block,
                                        vllm_version=vllm_version, dtype=dtype)
            safe = M.fit_max_model_len(b.safe_kv_bytes, info, **kw)
            upper = M.fit_max_model_len(b.kv_bytes + (0 if b.exact else b.band_bytes), info, **kw)
            fit = min(capacity, target)
            lengths = [*contexts, fit] if fit else list(contexts)
            free_ok = not checks or free >= b.requested_bytes
            weights_ok = b.exact or b.weights_bytes < b.requested_bytes

            def verdict(n: int, free_ok: bool = free_ok, weights_ok: bool = weights_ok) -> tuple[bool, bool]:
                return (free_ok and weights_ok and n >= floor), n >= target

            starts, fits_target = verdict(capacity)
            rows.append({
                "gpu_memory_utilization": u,
                "kv_cache_dtype": d,
                "kv_budget_gib": round(b.kv_bytes / GiB, 2),
                "kv_safe_gib": round(b.safe_kv_bytes / GiB, 2),
                "fit_max_model_len": fit,
                "safe_max_model_len": min(safe, target),
                "kv_capacity_tokens": capacity,
                "kv_cache_tokens": printed,       # what vLLM prints as "GPU KV cache size: N tokens"
                "fits_target": fits_target,
                # vLLM >= 0.9.1 refuses to start when free memory is below total x utilization; a
                # launch that holds less than the floor does not count as starting either
                "starts": starts,
                "confident": verdict(safe) == verdict(upper),
                "max_concurrency": {str(n): M.max_concurrency(max(b.kv_bytes, 0), info, n, **kw) for n in lengths},
                "budget_gib": {k: round(getattr(b, k + "_bytes") / GiB, 2) for k in
                               ("requested", "weights", "activation", "non_torch", "cudagraph", "other_processes",
                                "band")},
            })
    # -- the verdict: the floor at the default (or given) utilization, with fp8 KV and eager mode if need be
    util = utilization or default_u
    if checks and free - vllm.CUDA_CONTEXT_BYTES < gpu_total_bytes * util:
        util = max(0.01, math.floor(((free - vllm.CUDA_CONTEXT_BYTES) / gpu_total_bytes - 0.005) * 100) / 100)
    eager_opts = [enforce_eager] if enforce_eager or platform == "cpu" else [False, True]
    verdict_dtypes = [kv_cache_dtype] + (["fp8"] if kv_cache_dtype == "auto" and fp8_ok else [])
    gpus = max(gpus, 1)
    base = s.budget(util, tp=tp, pp=pp, eager=enforce_eager)
    held = 0
    how: tuple[str, bool] = ("", False)
    if tp * pp <= gpus or platform == "cpu":
        for d in verdict_dtypes:
            for e in eager_opts:
                held = s.holds(floor, util, tp=tp, pp=pp, kv_dtype=d, eager=e)
                if held:
                    how = (d, e)
                    break
            if held:
                break
    fits = bool(held)
    where = (f"{tp * pp} x {gpu_total_bytes / GiB:.2f} GiB" if tp * pp > 1 else f"one {gpu_total_bytes / GiB:.2f} GiB "
             + ("host" if platform == "cpu" else "GPU")) + f" at utilization {util:.2f}"
    if fits:
        extra = " with fp8 KV" * (how[0] == "fp8" and kv_cache_dtype != "fp8") + " in eager mode" * (
            how[1] and not enforce_eager)
        whose = f"the {target:,} tokens asked" if max_model_len else f"the model's {target:,}-token context"
        if held >= target:
            verdict_text = f"fits: {whose} on {where}{extra}"
        else:                 # a cut is a cut: how much of the context is left, not just "fits"
            verdict_text = (f"fits, context cut: about {held:,} tokens, {100 * held / target:.0f}% of "
                            f"{whose}, on {where}{extra}")
    elif tp * pp > gpus:
        verdict_text = f"does not fit: TP x PP = {tp * pp} needs {tp * pp} GPUs, {gpus} given"
    elif base.weights_bytes >= base.requested_bytes:
        verdict_text = (f"does not fit: {base.weights_bytes / GiB:.2f} GiB of weights per GPU, {where} gives "
                        f"{base.requested_bytes / GiB:.2f} GiB")
    else:
        verdict_text = (f"does not fit: {floor:,} tokens (the floor, --min-model-len) do not fit on {where}, "
                        "even with fp8 KV and eager mode" if fp8_ok else
                        f"does not fit: {floor:,} tokens (the floor, --min-model-len) do not fit on {where}"
                        + (" even in eager mode" if len(eager_opts) > 1 else ""))
    options = [] if fits else _options(s, util=util, tp=tp, pp=pp, gpus=gpus, floor=floor, kv_dtype=kv_cache_dtype,
                                       fp8_ok=fp8_ok, eager_opts=eager_opts)
    # -- the first launch vllm-guard would make
    flags = Flags.parse([])
    if tp > 1:
        flags = flags.set("--tensor-parallel-size", tp)
    if pp > 1:
        flags = flags.set("--pipeline-parallel-size", pp)
    if utilization:
        flags = flags.set("--gpu-memory-utilization", utilization)
    if max_model_len:
        flags = flags.set("--max-model-len", max_model_len)
    if kv_cache_dtype != "auto":
        flags = flags.set("--kv-cache-dtype", kv_cache_dtype)
    if enforce_eager:
        flags = flags.set("--enforce-eager")
    for name, value in (("--max-num-seqs", max_num_seqs), ("--max-num-batched-tokens", max_num_batched_tokens),
                        ("--block-size", block_size), ("--cpu-offload-gb", cpu_offload_gb)):
        if value:
            flags = flags.set(name, value)
    if chunked_prefill:
        flags = flags.set("--enable-chunked-prefill")
    if dtype:
        flags = flags.set("--dtype", dtype)
    if quantization:
        flags = flags.set("--quantization", quantization)
    first = fit_launch(info, gpu_total_bytes=gpu_total_bytes, gpu_free_bytes=free, gpus=gpus, flags=flags,
                       vllm_version=vllm_version, platform=platform, cpu_kv_space_gib=cpu_kv_space_gib,
                       compute_capability=cc, device_name=device_name, min_model_len=min_model_len)
    start = flags
    for name, planned in first.flags.items():
        start = start.set(name, planned)
    if not start.has("--gpu-memory-utilization") and platform != "cpu":
        start = start.set("--gpu-memory-utilization", default_u)
    if not start.has("--max-model-len"):
        start = start.set("--max-model-len", target)
    rules = vllm.rules(vllm_version)
    return {
        "model": info.name,
        "architectures": list(info.architectures),
        "platform": platform,
        "vllm_version": vllm_version,
        "rules": {"version": ".".join(map(str, rules)), "family": vllm.family(vllm_version, platform=platform),
                  "source": rules_source or ("given" if vllm_version else "the newest known rules")},
        "fits": fits,
        "cut": fits and held < target,
        "verdict": verdict_text,
        "options": options,
        "gpu_name": device_name,
        "gpu_total_gib": round(gpu_total_bytes / GiB, 2),
        "gpu_free_gib": round(free / GiB, 2),
        "gpus": gpus,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "weights_gib": round((info.weights_bytes or 0) / GiB, 2),
        "weights_per_gpu_gib": round(base.weights_bytes / GiB, 2),
        "weights_source": info.weights_source,
        "quantization": info.quantization,
        "kv_bytes_per_token": M.kv_bytes_per_token(info),
        "kv_bytes_per_token_per_gpu": M.kv_bytes_per_token(info, tp=tp),
        "kv_bytes_per_token_full_layers": M.kv_bytes_per_token(info, full_layers_only=True),
        "mla": info.mla,
        "block_size": block,
        "max_num_batched_tokens": base.max_num_batched_tokens,
        "max_num_seqs": base.max_num_seqs,
        "derived_max_model_len": derived,
        "target_max_model_len": target,
        "asked_max_model_len": max_model_len,
        "config_source": info.config_source or "config.json",
        "min_model_len": min_model_len,
        "fp8_supported": fp8_ok,
        "rows": rows,
        "start_flags": start.as_dict(),
        "first_launch": {"flags": first.flags, "reasons": first.reasons,
                         "confident": first.confident and first.certain},
    }


