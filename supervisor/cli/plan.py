"""``vllm-guard plan MODEL``: the sizing table operators search the web for, computed from config.json.

It leads with a verdict: does the model fit these GPUs (all of its context, or a cut one), and if it
does not, what would (a larger tensor- or pipeline-parallel size, fp8 KV, ``--cpu-offload-gb``, a
quantized variant), each computed with the same memory model (``docs/memory-model.md``). The plan
itself is pure (:func:`supervisor.core.plan_table.build_plan`); :func:`run` reads the model (its
config resolved by the installed vLLM's own transformers where it can), that vLLM's version and,
when no size is given, the GPUs through NVML (their CUDA totals). Exit status 3 (``EX_UNFIT``) when
the model does not fit, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from supervisor.core.flags import parse_int
from supervisor.core.gpus import check_gpu_count, cuda_total_bytes, gpu_spec, sizing_device, visible
from supervisor.core.plan_table import CONTEXTS, LEGEND, build_plan
from supervisor.core.units import GiB
from supervisor.errors import EX_OK, EX_UNFIT, EX_USAGE
from supervisor.facts.model_files import load_model_info
from supervisor.facts.nvml import NvmlProvider
from supervisor.facts.vllm_install import Installed, installed

__all__ = ["add_parser", "build_plan", "main", "render", "run"]


def add_parser(subparsers: Any) -> None:
    """Register ``plan`` on an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="predict the memory plan for a model before launching vLLM",
                              description=__doc__.splitlines()[0])
    _arguments(p)
    p.set_defaults(func=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="local model dir, path to config.json, or a Hugging Face id")
    p.add_argument("--gpu-memory-gib", type=float, help="memory per GPU in GiB as CUDA reports it "
                   "(an '80 GB' H100 reports 79.18); default: --gpu-name's, else read the GPUs through NVML")
    p.add_argument("--gpus", type=int, help="GPUs available (default: tensor x pipeline parallel size)")
    p.add_argument("--gpu-name", help="e.g. 'NVIDIA A100-SXM4-80GB' or 'H100': its CUDA total, vLLM's batch "
                   "defaults and the all-reduce buffers depend on it (default: read through NVML)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, help="add this utilization to the table")
    p.add_argument("--max-model-len", help="the context you want (default: the model's derived maximum)")
    p.add_argument("--min-model-len", type=int, default=2048,
                   help="the shortest context worth serving (default 2048): the verdict's floor")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "half", "float32", "float"),
                   help="vLLM's flag: the weights' and activations' dtype (float32 doubles both)")
    p.add_argument("--quantization", "-q", help="vLLM's flag, e.g. fp8: quantize a 16-bit checkpoint at load")
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


def _vllm_of(args: argparse.Namespace) -> tuple[Installed | None, str]:
    """The vLLM the plan is for (from --vllm-command, else `vllm` on PATH), and where it came from."""
    tried = []
    for argv in (shlex.split(args.vllm_command or ""), ["vllm"]):
        if not argv or argv in tried:
            continue
        tried.append(argv)
        found = installed(argv)
        if found is not None:
            return found, f"{found.dist} {found.version}, the one `{' '.join(argv)}` runs"
    return None, f"no vLLM found behind `{args.vllm_command}` or `vllm` on PATH"


def _fp8_text(plan: dict[str, Any]) -> str:
    if plan["platform"] == "cpu":
        return "n/a on CPU"
    return {True: "yes", False: "no", None: "unknown (give --compute-capability or --gpu-name)"}[plan["fp8_supported"]]


def _flags_text(flags: dict[str, Any]) -> str:
    return " ".join(k if v in (None, "") else f"{k} {v}" for k, v in flags.items())


def render(plan: dict[str, Any]) -> str:
    """The plan as text: the verdict first, then the table."""
    head = "DOES NOT FIT" if not plan["fits"] else "FITS, CONTEXT CUT" if plan["cut"] else "FITS"
    lines = [head + ": " + plan["verdict"].split(": ", 1)[1]]
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
        f"  config: {plan['config_source']}",
        f"  derived max_model_len {plan['derived_max_model_len']:,}; target {plan['target_max_model_len']:,}"
        f" ({'asked' if plan['asked_max_model_len'] else 'the model default'}); floor {plan['min_model_len']:,}",
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
    found, source = _vllm_of(args)
    version = args.vllm_version or (found.version if found else None)
    if args.vllm_version:
        source = "--vllm-version"
    info = load_model_info(args.model, revision=args.revision, python=found.python if found else None)
    if info is None:
        print(f"vllm-guard plan: cannot read config.json for {args.model!r} "
              "(a local dir, a path to config.json, or a Hugging Face id in the cache)", file=sys.stderr)
        return EX_USAGE
    tp, pp = max(1, args.tensor_parallel_size), max(1, args.pipeline_parallel_size)
    platform = "cpu" if args.cpu_kv_space_gib is not None else "cuda"
    cc, name = _cc(args.compute_capability), args.gpu_name or ""
    named_total = cuda_total_bytes(name) if name and platform != "cpu" else None
    if args.gpu_memory_gib or named_total:
        total = free = int(args.gpu_memory_gib * GiB) if args.gpu_memory_gib else int(named_total or 0)
        gpus = args.gpus or tp * pp
        problem = check_gpu_count(tp * pp, gpus)
        if problem:
            print(f"vllm-guard plan: {problem}", file=sys.stderr)
            return EX_USAGE
        spec = gpu_spec(name)
        if spec is not None and not args.gpu_memory_gib:
            name = spec.name                 # "H100" is planned as the model NVML would name
    elif platform == "cpu":
        import psutil

        total, free, gpus = psutil.virtual_memory().total, psutil.virtual_memory().available, 1
    else:
        provider = NvmlProvider()
        devices = visible(provider.snapshot(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not devices:
            print(f"vllm-guard plan: no GPU found ({provider.reason or 'none visible'}); "
                  "pass --gpu-memory-gib or --gpu-name", file=sys.stderr)
            return EX_USAGE
        problem = check_gpu_count(tp * pp, len(devices))
        if problem:
            print(f"vllm-guard plan: {problem}", file=sys.stderr)
            return EX_USAGE
        dev = sizing_device(devices, tp * pp)
        assert dev is not None
        # vLLM's total is CUDA's (NVML's less the driver's reserve); free memory is NVML's either way
        total = cuda_total_bytes(dev.name, dev.total_bytes) or dev.total_bytes
        free, gpus = min(dev.free_bytes, total), args.gpus or len(devices)
        name = name or dev.name
        cc = cc or dev.compute_capability
    plan = build_plan(info, gpu_total_bytes=total, gpu_free_bytes=free, gpus=gpus, tp=tp, pp=pp,
                      utilization=args.gpu_memory_utilization, max_model_len=parse_int(args.max_model_len),
                      kv_cache_dtype=args.kv_cache_dtype, vllm_version=version,
                      compute_capability=cc, platform=platform, cpu_kv_space_gib=args.cpu_kv_space_gib,
                      enforce_eager=args.enforce_eager, device_name=name, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                      chunked_prefill=args.enable_chunked_prefill, min_model_len=args.min_model_len,
                      cpu_offload_gb=args.cpu_offload_gb, rules_source=source,
                      dtype=None if args.dtype == "auto" else args.dtype, quantization=args.quantization)
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return EX_OK if plan["fits"] else EX_UNFIT


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m supervisor.cli.plan MODEL ...``."""
    parser = argparse.ArgumentParser(prog="vllm-guard plan", description=__doc__.splitlines()[0])
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
