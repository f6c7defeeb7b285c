"""``vllm-guard plan MODEL``: the sizing table operators search the web for, computed from config.json.

:func:`build_plan` is pure (model facts and GPU size in, a JSON-able dict out); :func:`run` reads the
model and, when no size is given, the GPUs through NVML.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from supervisor.core import memory as M
from supervisor.core import vllm
from supervisor.core.flags import Flags, parse_int
from supervisor.core.gpus import check_gpu_count, sizing_device, visible
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.core.plan import fit_launch
from supervisor.core.units import GiB
from supervisor.errors import EX_OK, EX_USAGE
from supervisor.facts.model_files import load_model_info
from supervisor.facts.nvml import NvmlProvider
UTILIZATIONS = (0.80, 0.85, 0.90, 0.95)
CONTEXTS = (4096, 8192, 32768)


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
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, help="add this utilization to the table")
    p.add_argument("--max-model-len", help="the context you want (default: the model's derived maximum)")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--vllm-version", help="plan with this vLLM version's rules (default: the newest known)")
    p.add_argument("--compute-capability", help="e.g. 8.9, to judge fp8 KV support without NVML")
    p.add_argument("--cpu-kv-space-gib", type=float, help="plan for the CPU backend with VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA-graph reserve")
    p.add_argument("--revision", help="Hub revision when MODEL is an id")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cc(text: str | None) -> tuple[int, int] | None:
    try:
        major, _, minor = (text or "").partition(".")
        return (int(major), int(minor or 0)) if text else None
    except ValueError:
        return None


def build_plan(info: ModelInfo, *, gpu_total_bytes: int, gpu_free_bytes: int | None = None, gpus: int = 1,
               tp: int = 1, pp: int = 1, utilization: float | None = None, max_model_len: int | None = None,
               kv_cache_dtype: str = "auto", vllm_version: str | None = None,
               compute_capability: tuple[int, int] | None = None, platform: str = "cuda",
               cpu_kv_space_gib: float | None = None, enforce_eager: bool = False, device_name: str = "",
               contexts: Sequence[int] = CONTEXTS) -> dict[str, Any]:
    """The plan as one JSON-able dict: model facts, one row per (utilization, KV dtype), start flags."""
    free = gpu_total_bytes if gpu_free_bytes is None else gpu_free_bytes
    derived = derive_max_model_len(info, vllm_version)
    target = max_model_len or derived
    default_u = vllm.default_utilization(vllm_version)
    if platform == "cpu" and cpu_kv_space_gib is not None:
        utils = [utilization or default_u]      # the KV size is fixed; utilization does not move it
    else:
        utils = sorted({*UTILIZATIONS, utilization or default_u})
    fp8_ok = (vllm.fp8_kv_supported(compute_capability, vllm_version, info.mla)
              if compute_capability and platform != "cpu" else None)
    dtypes = [kv_cache_dtype] + (["fp8"] if kv_cache_dtype == "auto" and platform != "cpu" else [])
    block = vllm.default_block_size(mla=info.mla, platform=platform, compute_capability=compute_capability,
                                 vllm_version=vllm_version)
    tokens = vllm.batch_defaults(gpu_total_bytes, vllm_version=vllm_version, platform=platform,
                              device_name=device_name, max_model_len=target)[0]
    rows = []
    for u in utils:
        b = M.kv_budget(info, gpu_total_bytes=gpu_total_bytes, utilization=u, tp=tp, pp=pp,
                        vllm_version=vllm_version, enforce_eager=enforce_eager, max_model_len=target,
                        other_used_bytes=max(0, gpu_total_bytes - free), platform=platform,
                        cpu_kv_space_gib=cpu_kv_space_gib, device_name=device_name)
        for d in dtypes:
            kw = dict(tp=tp, pp=pp, kv_cache_dtype=d, block_size=block, vllm_version=vllm_version,
                      max_num_batched_tokens=tokens)
            capacity = M.fit_max_model_len(b.kv_bytes, info, **kw)
            fit = min(capacity, target)
            lengths = [*contexts, fit] if fit else list(contexts)
            rows.append({
                "gpu_memory_utilization": u,
                "kv_cache_dtype": d,
                "kv_budget_gib": round(b.kv_bytes / GiB, 2),
                "fit_max_model_len": fit,
                "kv_capacity_tokens": capacity,
                "fits_target": fit >= target,
                # V1 >= 0.9.1 refuses to start when free memory is below total x utilization
                "starts": platform == "cpu" or free >= b.requested_bytes
                or not vllm.checks_free_memory(vllm_version),
                "max_concurrency": {str(n): M.max_concurrency(max(b.kv_bytes, 0), info, n, **kw) for n in lengths},
                "budget_gib": {k: round(getattr(b, k + "_bytes") / GiB, 2) for k in
                               ("requested", "weights", "activation", "non_torch", "cudagraph", "other_processes")},
            })
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
    first = fit_launch(info, gpu_total_bytes=gpu_total_bytes, gpu_free_bytes=free, gpus=gpus, flags=flags,
                           vllm_version=vllm_version, platform=platform, cpu_kv_space_gib=cpu_kv_space_gib,
                           compute_capability=compute_capability, device_name=device_name)
    start = flags
    for name, value in first.flags.items():
        start = start.set(name, value)
    if not start.has("--gpu-memory-utilization") and platform != "cpu":
        start = start.set("--gpu-memory-utilization", default_u)
    if not start.has("--max-model-len"):
        start = start.set("--max-model-len", target)
    return {
        "model": info.name,
        "architectures": list(info.architectures),
        "platform": platform,
        "vllm_version": vllm_version,
        "gpu_total_gib": round(gpu_total_bytes / GiB, 2),
        "gpu_free_gib": round(free / GiB, 2),
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "weights_gib": round((info.weights_bytes or 0) / GiB, 2),
        "weights_per_gpu_gib": round((info.weights_bytes or 0) / max(1, tp * pp) / GiB, 2),
        "weights_source": info.weights_source,
        "quantization": info.quantization,
        "kv_bytes_per_token": M.kv_bytes_per_token(info),
        "kv_bytes_per_token_per_gpu": M.kv_bytes_per_token(info, tp=tp),
        "kv_bytes_per_token_full_layers": M.kv_bytes_per_token(info, full_layers_only=True),
        "mla": info.mla,
        "block_size": block,
        "derived_max_model_len": derived,
        "target_max_model_len": target,
        "fp8_supported": fp8_ok,
        "rows": rows,
        "start_flags": start.as_dict(),
        "first_launch": {"flags": first.flags, "reasons": first.reasons, "confident": first.confident},
    }


def _fp8_text(plan: dict[str, Any]) -> str:
    if plan["platform"] == "cpu":
        return "n/a on CPU"
    return {True: "yes", False: "no", None: "unknown (give --compute-capability)"}[plan["fp8_supported"]]


def render(plan: dict[str, Any]) -> str:
    """The plan as a plain-text table."""
    lines = [
        f"{plan['model']}  ({', '.join(plan['architectures']) or 'unknown architecture'})",
        f"  weights {plan['weights_gib']:.2f} GiB ({plan['weights_source'] or 'unknown'}"
        f"{', ' + plan['quantization'] if plan['quantization'] else ''}), "
        f"{plan['weights_per_gpu_gib']:.2f} GiB per GPU at TP={plan['tensor_parallel_size']}",
        f"  KV {plan['kv_bytes_per_token']:,} B/token (model dtype{', MLA latent' if plan['mla'] else ''}); "
        f"{plan['kv_bytes_per_token_per_gpu']:,} B/token per GPU; block {plan['block_size']}",
        f"  derived max_model_len {plan['derived_max_model_len']:,}; target {plan['target_max_model_len']:,}",
        f"  {plan['platform']}: {plan['gpu_total_gib']:.2f} GiB total, {plan['gpu_free_gib']:.2f} GiB free"
        f"; vLLM rules {plan['vllm_version'] or 'newest'}; fp8 KV supported: "
        f"{_fp8_text(plan)}",
        "",
    ]
    ctx = [k for k in plan["rows"][0]["max_concurrency"]][: len(CONTEXTS)] if plan["rows"] else []
    head = f"{'util':>5} {'kv dtype':>8} {'KV GiB':>7} {'fit len':>9} " + " ".join(
        f"{'x@' + (str(int(c) // 1024) + 'k'):>7}" for c in ctx) + f" {'x@fit':>7}  note"
    lines.append(head)
    for r in plan["rows"]:
        conc = r["max_concurrency"]
        fit_conc = conc.get(str(r["fit_max_model_len"]), 0.0) if r["fit_max_model_len"] else 0.0
        note = "" if r["starts"] else "refused: not enough free memory"
        if not r["fit_max_model_len"]:
            note = note or "does not fit"
        lines.append(f"{r['gpu_memory_utilization']:>5.2f} {r['kv_cache_dtype']:>8} {r['kv_budget_gib']:>7.2f} "
                     f"{r['fit_max_model_len']:>9,} " + " ".join(f"{conc[c]:>7.2f}" for c in ctx)
                     + f" {fit_conc:>7.2f}  {note}".rstrip())
    lines.append("")
    start = " ".join(k if v == "" else f"{k} {v}" for k, v in plan["start_flags"].items())
    lines.append(f"vllm-guard would start with: {start}")
    for flag, why in plan["first_launch"]["reasons"].items():
        lines.append(f"  {flag}: {why}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 on success, 2 when the model or the GPU size cannot be found."""
    info = load_model_info(args.model, revision=args.revision)
    if info is None:
        print(f"vllm-guard plan: cannot read config.json for {args.model!r} "
              "(a local dir, a path to config.json, or a Hugging Face id in the cache)", file=sys.stderr)
        return EX_USAGE
    tp, pp = max(1, args.tensor_parallel_size), max(1, args.pipeline_parallel_size)
    platform = "cpu" if args.cpu_kv_space_gib is not None else "cuda"
    cc, name = _cc(args.compute_capability), ""
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
        total, free, gpus, name = dev.total_bytes, dev.free_bytes, len(devices), dev.name
        cc = cc or dev.compute_capability
    plan = build_plan(info, gpu_total_bytes=total, gpu_free_bytes=free, gpus=gpus, tp=tp, pp=pp,
                      utilization=args.gpu_memory_utilization, max_model_len=parse_int(args.max_model_len),
                      kv_cache_dtype=args.kv_cache_dtype, vllm_version=args.vllm_version,
                      compute_capability=cc, platform=platform, cpu_kv_space_gib=args.cpu_kv_space_gib,
                      enforce_eager=args.enforce_eager, device_name=name)
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return EX_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m supervisor.cli.plan MODEL ...``."""
    parser = argparse.ArgumentParser(prog="vllm-guard plan", description=__doc__.splitlines()[0])
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
