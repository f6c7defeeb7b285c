"""The GPU memory of one rank as bars a person can look at: what the plan expected for the current
launch's flags, and what vLLM printed about it.

Pure. Each picture is a list of ``(part, GiB)`` segments that add up to the GPU's total, in the
order vLLM spends it: weights, activation, non-torch, CUDA graphs, other processes, KV cache,
then what the utilization share leaves unused. vLLM's own lines state the weights ("Model loading
took"), the KV cache ("Available KV cache memory") and, where the classifier reads it, the graphs;
the rest of the share is then the activation, non-torch and graph memory together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.core import memory as M
from supervisor.core import vllm
from supervisor.core.flags import (
    CHUNKED_PREFILL,
    CPU_OFFLOAD,
    ENFORCE_EAGER,
    KV_CACHE_BYTES,
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    Flags,
)
from supervisor.core.plan import Sizing
from supervisor.core.units import GiB

PARTS = ("weights", "activation", "non_torch", "cudagraph", "overhead", "runtime", "other_processes", "kv_cache",
         "unused")
LABELS = {"weights": "weights", "activation": "activation", "non_torch": "non-torch", "cudagraph": "CUDA graphs",
          "overhead": "activation + non-torch + graphs", "runtime": "activation + non-torch",
          "other_processes": "other processes",
          "kv_cache": "KV cache", "unused": "left unused"}


def _segments(total: float, parts: list[tuple[str, float]]) -> list[tuple[str, float]]:
    out = [(name, round(max(0.0, gib), 2)) for name, gib in parts if gib and gib > 0.005]
    return out + [("unused", round(max(0.0, total - sum(g for _, g in out)), 2))]


def planned(sizing: Sizing | None, flags: Flags, *, total_gib: float | None, free_gib: float | None,
            served_len: int | None = None) -> dict[str, Any] | None:
    """The plan's split of one rank's memory at ``flags`` (the same model of vLLM's memory the plan
    sizes launches with); None without a model or a GPU size."""
    if sizing is None or not total_gib:
        return None
    total = int(total_gib * GiB)
    version = sizing.vllm_version
    util = vllm.utilization(version, flags, sizing.platform)
    held = 0 if free_gib is None else max(0, int((total_gib - free_gib) * GiB))
    length = flags.get_int(MAX_MODEL_LEN) or served_len or sizing.info.derived_max_model_len
    try:
        b = M.kv_budget(sizing.info, gpu_total_bytes=total, utilization=util,
                        tp=flags.get_int(TENSOR_PARALLEL) or 1, pp=flags.get_int(PIPELINE_PARALLEL) or 1,
                        vllm_version=version, enforce_eager=flags.enabled(ENFORCE_EAGER), max_model_len=length,
                        max_num_batched_tokens=flags.get_int(MAX_BATCHED_TOKENS),
                        max_num_seqs=flags.get_int(MAX_NUM_SEQS), other_used_bytes=held, platform=sizing.platform,
                        cpu_kv_space_gib=sizing.cpu_kv_space_gib, kv_cache_memory_bytes=flags.get_int(KV_CACHE_BYTES),
                        device_name=sizing.device_name, dtype=flags.get("--dtype"),
                        chunked_prefill=flags.enabled(CHUNKED_PREFILL), compute_capability=sizing.compute_capability,
                        quantization=flags.get("--quantization"),
                        cpu_offload_bytes=int((flags.get_float(CPU_OFFLOAD) or 0) * GiB),
                        measured_overhead_bytes=sizing.measured_overhead_bytes,
                        measured_weights_bytes=sizing.measured_weights_bytes,
                        extensible=vllm.extensible_kv_cache(version, flags, sizing.platform))
    except (ValueError, ZeroDivisionError, TypeError):
        return None
    def g(n: int) -> float:
        return n / GiB

    parts = [("weights", g(b.weights_bytes)), ("activation", g(b.activation_bytes)),
             ("non_torch", g(b.non_torch_bytes)), ("cudagraph", g(b.cudagraph_bytes)),
             ("other_processes", g(b.other_processes_bytes)), ("kv_cache", g(max(0, b.kv_bytes)))]
    return {"source": "plan", "total_gib": round(total_gib, 2), "utilization": util,
            "segments": _segments(total_gib, parts), "measured": b.measured}


def printed(numbers: Mapping[str, Any], *, total_gib: float | None, utilization: float | None,
            other_gib: float = 0.0) -> dict[str, Any] | None:
    """The split vLLM's own lines state (weights, KV cache, graphs where read); None before it said both."""
    weights, kv = numbers.get("model_loading_gib"), numbers.get("kv_available_gib")
    total = numbers.get("total_gib") or total_gib
    if not isinstance(weights, (int, float)) or not isinstance(kv, (int, float)) or not total:
        return None
    share = float(total) * float(utilization or 0.9)
    graphs_printed = numbers.get("cudagraph_gib")
    graphs = float(graphs_printed) if isinstance(graphs_printed, (int, float)) else 0.0
    rest = share - float(weights) - float(kv) - float(graphs) - other_gib
    # with the graphs printed ("Graph capturing finished ..., took X GiB"), the rest is activation and
    # non-torch alone, and the graphs are their own segment
    rest_part = "runtime" if isinstance(graphs_printed, (int, float)) else "overhead"
    parts = [("weights", float(weights)), (rest_part, rest), ("cudagraph", float(graphs)),
             ("other_processes", other_gib), ("kv_cache", float(kv))]
    return {"source": "vllm", "total_gib": round(float(total), 2), "utilization": utilization,
            "segments": _segments(float(total), parts)}
