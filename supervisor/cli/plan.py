"""``vllm-guard plan MODEL``: the sizing table operators search the web for, computed from config.json.

It leads with a verdict: does the model fit these GPUs, and if it does not, what would (a larger
tensor- or pipeline-parallel size, fp8 KV, ``--cpu-offload-gb``, a quantized variant), each
computed with the same memory model (``docs/memory-model.md``). :func:`build_plan` is pure (model
facts and GPU size in, a JSON-able dict out); :func:`run` reads the model, the installed vLLM's
version and, when no size is given, the GPUs through NVML. Exit status 3 (``EX_UNFIT``) when the
model does not fit, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from supervisor.core import memory as M
from supervisor.core import vllm
from supervisor.core.flags import Flags, parse_int
from supervisor.core.gpus import check_gpu_count, sizing_device, visible
from supervisor.core.model import VARIANTS, ModelInfo, checkpoint_bytes, derive_max_model_len, quant_scheme
from supervisor.core.plan import fit_launch
from supervisor.core.units import GiB
from supervisor.errors import EX_OK, EX_UNFIT, EX_USAGE
from supervisor.facts.model_files import load_model_info
from supervisor.facts.nvml import NvmlProvider
from supervisor.facts.vllm_install import installed

UTILIZATIONS = (0.80, 0.85, 0.90, 0.95)
CONTEXTS = (4096, 8192, 32768)
#: Host-to-GPU bandwidth assumed for the cost of --cpu-offload-gb (PCIe 4.0 x16 in practice), bytes/s.
OFFLOAD_BYTES_PER_S = 25e9
#: The largest world size the verdict's options consider.
MAX_WORLD = 16
LEGEND = ("x@4k, x@8k, x@32k, x@fit: how many requests of that many tokens the KV cache holds at once "
          "(vLLM's \"maximum concurrency\"); KV GiB: the estimate per GPU; safe GiB: less its error band")


def add_parser(subparsers: Any) -> None:
    """Register ``plan`` on an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="predict the memory plan for a model before launching vLLM",
                              description=__doc__.splitlines()[0])
    _arguments(p)
    p.set_defaults(func=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="local model dir, path to config.json, or a Hugging Face id")
    p.add_argument("--gpu-memory-gib", type=float, help="memory per GPU in GiB as CUDA reports it "
                   "(a '24 GB' card reports about 23.5); default: read the GPUs through NVML")
    p.add_argument("--gpus", type=int, help="GPUs available (default: tensor x pipeline parallel size)")
    p.add_argument("--gpu-name", help="e.g. 'NVIDIA A100-SXM4-80GB': vLLM's batch defaults and NCCL's memory "
                   "depend on it (default: read through NVML when the GPUs are)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, help="add this utilization to the table")
    p.add_argument("--max-model-len", help="the context you want (default: the model's derived maximum)")
    p.add_argument("--min-model-len", type=int, default=2048,
                   help="the shortest context worth serving (default 2048): the verdict's floor")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, help="vLLM's flag (default: vLLM's, by version and GPU)")
    p.add_argument("--max-num-batched-tokens", type=int, help="vLLM's flag (default: vLLM's, by version and GPU)")
    p.add_argument("--block-size", type=int, help="vLLM's flag (default: 16; 64 for MLA on Hopper)")
    p.add_argument("--enable-chunked-prefill", action="store_true", help="vLLM's flag (V0 profiles in chunks)")
    p.add_argument("--cpu-offload-gb", type=float, help="vLLM's flag: GiB of weights per GPU kept in CPU memory")
    p.add_argument("--vllm-version", help="plan with this vLLM version's rules (default: the version of the vLLM "
                   "that --vllm-command, else `vllm` on PATH, runs; else the newest known)")
    p.add_argument("--vllm-command", default="vllm serve", help="the command that runs vLLM (default 'vllm serve')")
    p.add_argument("--compute-capability", help="e.g. 8.9, to judge fp8 KV support without NVML")
    p.add_argument("--cpu-kv-space-gib", type=float, help="plan for the CPU backend with VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--revision", help="Hub revision when MODEL is an id")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cc(text: str | None) -> tuple[int, int] | None:
    try:
        major, _, minor = (text or "").partition(".")
        return (int(major), int(minor or 0)) if text else None
    except ValueError:
        return None


def _version_of(args: argparse.Namespace) -> tuple[str | None, str]:
    """The vLLM version whose rules to plan with, and where it came from."""
    if args.vllm_version:
        return args.vllm_version, "--vllm-version"
    tried = []
    for argv in (shlex.split(args.vllm_command or ""), ["vllm"]):
        if not argv or argv in tried:
            continue
        tried.append(argv)
        found = installed(argv)
        if found is not None:
            return found.version, f"{found.dist} {found.version}, the one `{' '.join(argv)}` runs"
    return None, f"no vLLM found behind `{args.vllm_command}` or `vllm` on PATH"


# -- the pure plan --------------------------------------------------------------------------------

class _Sizer:
    """One model on one kind of GPU: budgets and the lengths they hold, for any TP/PP, dtype, eager."""

    def __init__(self, info: ModelInfo, *, total: int, free: int, vllm_version: str | None, platform: str,
                 cpu_kv_space_gib: float | None, device_name: str, cc: tuple[int, int] | None, target: int,
                 block: int, max_num_seqs: int | None, max_num_batched_tokens: int | None, chunked: bool,
                 offload_bytes: int) -> None:
        self.info, self.total, self.free, self.version = info, total, free, vllm_version
        self.platform, self.cpu_kv_space_gib, self.device_name, self.cc = platform, cpu_kv_space_gib, device_name, cc
        self.target, self.block, self.seqs, self.batched, self.chunked = (target, block, max_num_seqs,
                                                                          max_num_batched_tokens, chunked)
        self.offload = offload_bytes

    def budget(self, util: float, *, tp: int, pp: int, eager: bool, info: ModelInfo | None = None,
               offload: int | None = None) -> M.Budget:
        return M.kv_budget(info or self.info, gpu_total_bytes=self.total, utilization=util, tp=tp, pp=pp,
                           vllm_version=self.version, enforce_eager=eager, max_model_len=self.target,
                           max_num_batched_tokens=self.batched, max_num_seqs=self.seqs,
                           other_used_bytes=max(0, self.total - self.free), platform=self.platform,
                           cpu_kv_space_gib=self.cpu_kv_space_gib, device_name=self.device_name,
                           chunked_prefill=self.chunked, compute_capability=self.cc,
                           cpu_offload_bytes=self.offload if offload is None else offload)

    def tokens(self, kv_bytes: int, *, tp: int, pp: int, kv_dtype: str, info: ModelInfo | None = None,
               upper: int | None = None) -> int:
        return M.fit_max_model_len(kv_bytes, info or self.info, tp=tp, pp=pp, kv_cache_dtype=kv_dtype,
                                   block_size=self.block, vllm_version=self.version, upper=upper,
                                   max_num_batched_tokens=self.batched or 2048)

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
               rules_source: str = "") -> dict[str, Any]:
    """The plan as one JSON-able dict: the verdict and its options, model facts, one row per
    (utilization, KV dtype), the flags vllm-guard would start with."""
    free = gpu_total_bytes if gpu_free_bytes is None else gpu_free_bytes
    cc = compute_capability or M.gpu_compute_capability(device_name)
    derived = derive_max_model_len(info, vllm_version)
    target = max_model_len or derived
    floor = min(min_model_len, target)
    default_u = vllm.default_utilization(vllm_version)
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
               offload_bytes=offload)
    checks = vllm.checks_free_memory(vllm_version) and platform != "cpu"
    rows = []
    for u in utils:
        b = s.budget(u, tp=tp, pp=pp, eager=enforce_eager)
        for d in dtypes:
            kw: dict[str, Any] = dict(tp=tp, pp=pp, kv_cache_dtype=d, block_size=block, vllm_version=vllm_version,
                      max_num_batched_tokens=b.max_num_batched_tokens or 2048)
            capacity = M.fit_max_model_len(b.kv_bytes, info, **kw)
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
        verdict_text = (f"fits: about {held:,} tokens" + (f" (the {target:,} asked)" if held >= target else
                                                          f" of the {target:,} asked") + f" on {where}{extra}")
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
        "rules": {"version": ".".join(map(str, rules)), "family": vllm.family(vllm_version),
                  "source": rules_source or ("given" if vllm_version else "the newest known rules")},
        "fits": fits,
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
        "min_model_len": min_model_len,
        "fp8_supported": fp8_ok,
        "rows": rows,
        "start_flags": start.as_dict(),
        "first_launch": {"flags": first.flags, "reasons": first.reasons,
                         "confident": first.confident and first.certain},
    }


def _fp8_text(plan: dict[str, Any]) -> str:
    if plan["platform"] == "cpu":
        return "n/a on CPU"
    return {True: "yes", False: "no", None: "unknown (give --compute-capability or --gpu-name)"}[plan["fp8_supported"]]


def _flags_text(flags: dict[str, Any]) -> str:
    return " ".join(k if v in (None, "") else f"{k} {v}" for k, v in flags.items())


def render(plan: dict[str, Any]) -> str:
    """The plan as text: the verdict first, then the table."""
    lines = [("FITS" if plan["fits"] else "DOES NOT FIT") + ": " + plan["verdict"].split(": ", 1)[1]]
    if plan["options"]:
        lines.append("What would work (computed with the same memory model):")
        for o in plan["options"]:
            flags = _flags_text(o.get("flags") or {})
            lines.append(f"  - {o['what']}" + (f": {flags}" if flags else "")
                         + (f"; about {o['fit_max_model_len']:,} tokens fit" if o["kind"] != "quantized"
                            and o.get("fit_max_model_len") else ""))
    rules = plan["rules"]
    lines += [
        "",
        f"{plan['model']}  ({', '.join(plan['architectures']) or 'unknown architecture'})",
        f"  weights {plan['weights_gib']:.2f} GiB ({plan['weights_source'] or 'unknown'}"
        f"{', ' + plan['quantization'] if plan['quantization'] else ''}), "
        f"{plan['weights_per_gpu_gib']:.2f} GiB loaded per GPU at TP={plan['tensor_parallel_size']}"
        + (f" PP={plan['pipeline_parallel_size']}" if plan["pipeline_parallel_size"] > 1 else ""),
        f"  KV {plan['kv_bytes_per_token']:,} B/token (model dtype{', MLA latent' if plan['mla'] else ''}); "
        f"{plan['kv_bytes_per_token_per_gpu']:,} B/token per GPU; block {plan['block_size']}",
        f"  derived max_model_len {plan['derived_max_model_len']:,}; target {plan['target_max_model_len']:,}; "
        f"floor {plan['min_model_len']:,}",
        f"  {plan['platform']}: {plan['gpu_name'] + ', ' if plan['gpu_name'] else ''}{plan['gpu_total_gib']:.2f} GiB "
        f"total, {plan['gpu_free_gib']:.2f} GiB free; profile batch {plan['max_num_batched_tokens']:,} tokens, "
        f"{plan['max_num_seqs']} sequences; fp8 KV supported: {_fp8_text(plan)}",
        f"  vLLM rules: {rules['version']} ({rules['family']}; {rules['source']})",
        "",
    ]
    ctx = [k for k in plan["rows"][0]["max_concurrency"]][: len(CONTEXTS)] if plan["rows"] else []
    head = f"{'util':>5} {'kv dtype':>8} {'KV GiB':>7} {'safe GiB':>8} {'fit len':>9} " + " ".join(
        f"{'x@' + (str(int(c) // 1024) + 'k'):>7}" for c in ctx) + f" {'x@fit':>7}  note"
    lines.append(head)
    for r in plan["rows"]:
        conc = r["max_concurrency"]
        fit_conc = conc.get(str(r["fit_max_model_len"]), 0.0) if r["fit_max_model_len"] else 0.0
        notes = []
        if not r["starts"]:
            notes.append("does not start" if r["fit_max_model_len"] < plan["min_model_len"] or r["kv_budget_gib"] <= 0
                         else "refused: not enough free memory")
        if not r["confident"]:
            notes.append("uncertain: the error band crosses the line")
        lines.append(f"{r['gpu_memory_utilization']:>5.2f} {r['kv_cache_dtype']:>8} {r['kv_budget_gib']:>7.2f} "
                     f"{r['kv_safe_gib']:>8.2f} {r['fit_max_model_len']:>9,} "
                     + " ".join(f"{conc[c]:>7.2f}" for c in ctx) + f" {fit_conc:>7.2f}  {'; '.join(notes)}".rstrip())
    lines.append(LEGEND)
    lines.append("")
    if plan["fits"]:
        lines.append(f"vllm-guard would start with: {_flags_text(plan['start_flags'])}")
        for flag, why in plan["first_launch"]["reasons"].items():
            lines.append(f"  {flag}: {why}")
    else:
        lines.append("vllm-guard would not start it as asked: no flag it may change makes it fit.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 when it fits, 3 when it does not, 2 when the model or the GPU size cannot be found."""
    info = load_model_info(args.model, revision=args.revision)
    if info is None:
        print(f"vllm-guard plan: cannot read config.json for {args.model!r} "
              "(a local dir, a path to config.json, or a Hugging Face id in the cache)", file=sys.stderr)
        return EX_USAGE
    tp, pp = max(1, args.tensor_parallel_size), max(1, args.pipeline_parallel_size)
    platform = "cpu" if args.cpu_kv_space_gib is not None else "cuda"
    cc, name = _cc(args.compute_capability), args.gpu_name or ""
    if args.gpu_memory_gib:
        total = free = int(args.gpu_memory_gib * GiB)
        gpus = args.gpus or tp * pp
        problem = check_gpu_count(tp * pp, gpus)
        if problem:
            print(f"vllm-guard plan: {problem}", file=sys.stderr)
            return EX_USAGE
    elif platform == "cpu":
        import psutil

        total, free, gpus = psutil.virtual_memory().total, psutil.virtual_memory().available, 1
    else:
        provider = NvmlProvider()
        devices = visible(provider.snapshot(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not devices:
            print(f"vllm-guard plan: no GPU found ({provider.reason or 'none visible'}); "
                  "pass --gpu-memory-gib", file=sys.stderr)
            return EX_USAGE
        problem = check_gpu_count(tp * pp, len(devices))
        if problem:
            print(f"vllm-guard plan: {problem}", file=sys.stderr)
            return EX_USAGE
        dev = sizing_device(devices, tp * pp)
        assert dev is not None
        total, free, gpus = dev.total_bytes, dev.free_bytes, args.gpus or len(devices)
        name = name or dev.name
        cc = cc or dev.compute_capability
    version, source = _version_of(args)
    plan = build_plan(info, gpu_total_bytes=total, gpu_free_bytes=free, gpus=gpus, tp=tp, pp=pp,
                      utilization=args.gpu_memory_utilization, max_model_len=parse_int(args.max_model_len),
                      kv_cache_dtype=args.kv_cache_dtype, vllm_version=version,
                      compute_capability=cc, platform=platform, cpu_kv_space_gib=args.cpu_kv_space_gib,
                      enforce_eager=args.enforce_eager, device_name=name, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                      chunked_prefill=args.enable_chunked_prefill, min_model_len=args.min_model_len,
                      cpu_offload_gb=args.cpu_offload_gb, rules_source=source)
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return EX_OK if plan["fits"] else EX_UNFIT


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m supervisor.cli.plan MODEL ...``."""
    parser = argparse.ArgumentParser(prog="vllm-guard plan", description=__doc__.splitlines()[0])
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
