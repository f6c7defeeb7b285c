"""The GPUs as data: what NVML reports per device, which of them a launch sees, which one limits it.

Pure: :mod:`supervisor.facts.nvml` reads these from the driver; the plan and the session only
look at them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    name: str
    used_bytes: int


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reports it (index is NVML's, i.e. PCI bus order)."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]
    processes: tuple[GpuProcess, ...]
    uuid: str = ""


def visible(devices: Iterable[GpuDevice], cuda_visible_devices: str | None) -> list[GpuDevice]:
    """The devices a CUDA program sees, in its order (indices or GPU-UUID prefixes; stops at the
    first unknown entry, as CUDA does)."""
    devices = list(devices)
    if cuda_visible_devices is None:
        return devices
    out: list[GpuDevice] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        if not token:
            break
        match: GpuDevice | None = None
        if token.lstrip("-").isdigit():
            idx = int(token)
            match = next((d for d in devices if d.index == idx), None)
        elif token.upper().startswith("GPU-"):
            hits = [d for d in devices if d.uuid and d.uuid.lower().startswith(token.lower())]
            match = hits[0] if len(hits) == 1 else None   # an ambiguous prefix is invalid for CUDA
        if match is None or match in out:
            break
        out.append(match)
    return out


def sizing_device(devices: Sequence[GpuDevice], count: int) -> GpuDevice | None:
    """The device that limits a launch on the first ``count`` visible GPUs: the least free memory."""
    used = list(devices)[: max(1, count)]
    return min(used, key=lambda d: d.free_bytes) if used else None


def check_gpu_count(needed: int, have: int) -> str | None:
    """A message when tp x pp needs more GPUs than ``have`` are visible, else None."""
    if needed <= have:
        return None
    return (f"tensor_parallel_size x pipeline_parallel_size = {needed} needs {needed} GPUs, "
            f"but only {have} {'is' if have == 1 else 'are'} visible (check CUDA_VISIBLE_DEVICES)")
