"""Facts read from the machine before the first launch: the GPUs (NVML), the model (config.json), the vLLM.

This package is the I/O that feeds the pure core: :func:`gather` reads everything once and hands
the session a :class:`~supervisor.core.session.Facts`. Nothing here decides anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.config import GuardConfig
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice, check_gpu_count, cuda_total_bytes, sizing_device, visible
from supervisor.core.session import Facts
from supervisor.core.units import GiB
from supervisor.errors import Refused
from supervisor.facts import model_files, vllm_install


@dataclass(frozen=True)
class Gathered:
    """The facts, and what the shell keeps about the GPUs besides them."""

    facts: Facts
    gpu_key: str                      # the start-up turn's lock key: GPU uuids, "cpu" or "nogpu"
    notes: list[str] = field(default_factory=list)        # for the log at info level
    warnings: list[str] = field(default_factory=list)     # and at warning level


def cpu_kv_space_gib(environ: Mapping[str, str]) -> float | None:
    """``VLLM_CPU_KVCACHE_SPACE`` in GiB; None when unset or not a number (vLLM will say so itself)."""
    try:
        value = float(environ.get("VLLM_CPU_KVCACHE_SPACE") or "")
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def device_dict(d: GpuDevice) -> dict[str, Any]:
    """One GPU as ``/status`` shows it."""
    return {"index": d.index, "name": d.name, "total_gib": round(d.total_bytes / GiB, 2),
            "free_gib": round(d.free_bytes / GiB, 2), "used_gib": round(d.used_bytes / GiB, 2),
            "compute_capability": list(d.compute_capability),
            "processes": [{"pid": p.pid, "name": p.name, "gib": round(p.used_bytes / GiB, 2)}
                          for p in d.processes]}


def gpus_for(requested: Flags, provider: Any, environ: Mapping[str, str]) -> list[GpuDevice]:
    """The GPUs a launch of ``requested`` uses, as NVML sees them now ([] without NVML)."""
    devices = visible(provider.snapshot(), environ.get("CUDA_VISIBLE_DEVICES"))
    multi_node = requested.get("--distributed-executor-backend") == "ray" or (requested.get_int("--nnodes") or 1) > 1
    problem = None if multi_node or not devices else check_gpu_count(requested.world_size(), len(devices))
    if problem:
        raise Refused(problem)
    return devices[:requested.world_size()] if devices else []


def gather(cfg: GuardConfig, environ: Mapping[str, str], provider: Any,
           read_model: Callable[[str], Any] | None = None) -> Gathered:
    """Read the GPUs, the installed vLLM and the model's config.json once; raise Refused for too few GPUs.
    The config is resolved by vLLM's own transformers where its interpreter is known."""
    requested = cfg.requested_flags()
    notes: list[str] = []
    warnings: list[str] = []
    installed = vllm_install.installed(cfg.vllm_argv, environ)
    if read_model is None:
        def read_model(name: str) -> Any:
            return model_files.load_model_info(name, python=installed.python if installed else None,
                                               environ=environ)
    devices = gpus_for(requested, provider, environ)
    if devices:
        platform = "cuda"
        dev = sizing_device(devices, len(devices)) or devices[0]
        # vLLM's total is CUDA's: NVML's less what the driver reserves (an H100's 81559 MiB is 79.18 GiB)
        free, total = dev.free_bytes / GiB, (cuda_total_bytes(dev.name, dev.total_bytes) or dev.total_bytes) / GiB
        key = ",".join(d.uuid or f"gpu{d.index}" for d in devices)
        ours = {os.getpid()}
        for d in devices:
            others = [p for p in d.processes if p.pid not in ours]
            if others:
                warnings.append(f"GPU {d.index} ({d.name}): memory held by other processes: " + ", ".join(
                    f"pid {p.pid} {p.name} {p.used_bytes / GiB:.1f} GiB" for p in others))
    else:
        cpu = "VLLM_CPU_KVCACHE_SPACE" in environ or (installed is not None and installed.dist == "vllm-cpu")
        platform, free, total = ("cpu" if cpu else "cuda"), None, None
        key = "cpu" if cpu else "nogpu"
        reason = getattr(provider, "reason", None) or "no GPU visible"
        notes.append(f"no NVIDIA GPU seen ({reason}); sizing from vLLM's own messages")
    try:
        model = read_model(cfg.model)
    except Exception as e:  # noqa: BLE001 - a broken config.json must not stop the guard
        warnings.append(f"could not read the model's config: {type(e).__name__}: {e}")
        model = None
    if model is None:
        notes.append("no config.json found for the model; vllm-guard sizes from vLLM's own messages")
    facts = Facts(platform=platform, devices=tuple(devices), free_gib=free, total_gib=total,
                  vllm_version=installed.version if installed else None, model=model,
                  cpu_kv_space_gib=cpu_kv_space_gib(environ))
    if installed is not None:
        notes.append(f"vLLM {installed.version} ({installed.dist}, {cfg.vllm_command})")
    return Gathered(facts, key, notes, warnings)
