"""The GPUs as data: what NVML reports per device, which of them a launch sees, which one limits it.

Pure: :mod:`supervisor.facts.nvml` reads these from the driver; the plan and the session only
look at them.
"""

from __future__ import annotations

import re
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


# -- GPU models as CUDA and NVML report them ----------------------------------------------------

@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: what NVML reports as its memory, what CUDA (and so vLLM) reports, and the facts
    vLLM's memory use depends on (SMs for the sampler's per-SM buffer, the interconnect for its
    all-reduce buffers).

    ``cuda_gib`` is ``torch.cuda.mem_get_info()[1]``, the total vLLM multiplies by
    ``--gpu-memory-utilization``: NVML's total less what the driver reserves (nvidia-smi -q: "FB Memory
    Usage: Total / Reserved"). ``basis`` says where each figure comes from.
    """

    name: str                        # as NVML names it
    nvml_mib: int                    # nvidia-smi's memory.total
    cuda_gib: float                  # CUDA's total
    sms: int                         # streaming multiprocessors
    interconnect: str                # "nvswitch" (SXM, NVLink switch with multicast), "nvlink", "pcie"
    basis: str = ""


#: Match order matters: the longest fragment that is in the (lower-case) name wins.
GPU_SPECS: dict[str, GpuSpec] = {
    "h100 80gb hbm3": GpuSpec("NVIDIA H100 80GB HBM3", 81559, 79.18, 132, "nvswitch",
                              "nvidia-smi -q on an H100 SXM (driver 590): total 81559, reserved 479 MiB; vLLM 0.11 "
                              "and 0.19 logs print 79.18-79.19 GiB"),
    "h100 sxm": GpuSpec("NVIDIA H100 SXM", 81559, 79.18, 132, "nvswitch", "as the H100 80GB HBM3"),
    "h100 pcie": GpuSpec("NVIDIA H100 PCIe", 81559, 79.18, 114, "pcie", "the H100's memory; reserve as the SXM's"),
    "h100 nvl": GpuSpec("NVIDIA H100 NVL", 95830, 93.12, 132, "pcie", "nvidia-smi total; reserve as the H100's"),
    "h200": GpuSpec("NVIDIA H200", 143771, 139.80, 132, "nvswitch",
                    "nvidia-smi -q on an H200 (driver 590): total 143771, reserved 614 MiB"),
    "h200 nvl": GpuSpec("NVIDIA H200 NVL", 143771, 139.80, 132, "pcie", "as the H200"),
    "h800": GpuSpec("NVIDIA H800", 81559, 79.18, 132, "nvswitch", "as the H100 SXM"),
    "h20": GpuSpec("NVIDIA H20", 97871, 95.10, 78, "nvswitch", "nvidia-smi total; reserve as the H100's"),
    "gh200": GpuSpec("NVIDIA GH200 480GB", 97871, 95.10, 132, "nvswitch", "nvidia-smi total; reserve as the H100's"),
    "b200": GpuSpec("NVIDIA B200", 183359, 178.36, 148, "nvswitch", "nvidia-smi total; reserve as the H200's"),
    "a100-sxm4-80gb": GpuSpec("NVIDIA A100-SXM4-80GB", 81920, 79.15, 108, "nvlink",
                              "nvidia-smi total; PyTorch's OOM messages: 79.15 GiB total capacity"),
    "a100 80gb pcie": GpuSpec("NVIDIA A100 80GB PCIe", 81920, 79.15, 108, "pcie", "as the A100-SXM4-80GB"),
    "a100-sxm4-40gb": GpuSpec("NVIDIA A100-SXM4-40GB", 40960, 39.39, 108, "nvlink",
                              "nvidia-smi total; PyTorch's OOM messages: 39.39 GiB total capacity"),
    "a100-pcie-40gb": GpuSpec("NVIDIA A100-PCIE-40GB", 40960, 39.39, 108, "pcie", "as the A100-SXM4-40GB"),
    "a800": GpuSpec("NVIDIA A800-SXM4-80GB", 81920, 79.15, 108, "nvlink", "as the A100-SXM4-80GB"),
    "l40s": GpuSpec("NVIDIA L40S", 46068, 44.39, 142, "pcie",
                    "nvidia-smi -q on an L40S (driver 595): total 46068, reserved 609 MiB"),
    "l40": GpuSpec("NVIDIA L40", 46068, 44.39, 142, "pcie", "as the L40S"),
    "l4": GpuSpec("NVIDIA L4", 23034, 22.06, 58, "pcie", "nvidia-smi total; vLLM logs print about 22.06 GiB"),
    "a10g": GpuSpec("NVIDIA A10G", 23028, 22.06, 80, "pcie", "nvidia-smi total; vLLM logs print about 22.06 GiB"),
    "a10": GpuSpec("NVIDIA A10", 23028, 22.06, 72, "pcie", "as the A10G"),
    "a40": GpuSpec("NVIDIA A40", 46068, 44.39, 84, "pcie", "as the L40S (same memory)"),
    "rtx a6000": GpuSpec("NVIDIA RTX A6000", 49140, 47.54, 84, "pcie", "PyTorch's OOM messages: 47.54 GiB"),
    "rtx 6000 ada": GpuSpec("NVIDIA RTX 6000 Ada Generation", 49140, 47.50, 142, "pcie", "as the RTX A6000"),
    "t4": GpuSpec("Tesla T4", 15360, 14.75, 40, "pcie", "PyTorch's OOM messages: 14.75 GiB total capacity"),
    "v100-sxm2-16gb": GpuSpec("Tesla V100-SXM2-16GB", 16160, 15.77, 80, "nvlink", "PyTorch's OOM messages: 15.77 GiB"),
    "v100-sxm2-32gb": GpuSpec("Tesla V100-SXM2-32GB", 32510, 31.75, 80, "nvlink", "PyTorch's OOM messages: 31.75 GiB"),
    "rtx 3090": GpuSpec("NVIDIA GeForce RTX 3090", 24576, 23.69, 82, "pcie",
                        "PyTorch's OOM messages: 23.69 GiB total capacity (23.58 with a display attached)"),
    "rtx 4090": GpuSpec("NVIDIA GeForce RTX 4090", 24564, 23.65, 128, "pcie", "PyTorch's OOM messages: 23.65 GiB"),
    "rtx 4080 super": GpuSpec("NVIDIA GeForce RTX 4080 SUPER", 16376, 15.57, 80, "pcie",
                              "nvidia-smi -q (driver 595): total 16376, reserved 434 MiB"),
    "rtx 5090": GpuSpec("NVIDIA GeForce RTX 5090", 32607, 31.36, 170, "pcie", "nvidia-smi total; reserve as a 4090's"),
}


def gpu_spec(device_name: str) -> GpuSpec | None:
    """The table's entry for a GPU name (NVML's, or what a user types: "H100", "a100-sxm4-80gb")."""
    name = " ".join((device_name or "").lower().replace("_", " ").split())
    if not name:
        return None

    def has(fragment: str) -> bool:          # whole words: "a10" is not in "a100", "l4" not in "l40s"
        return re.search(rf"(?<![a-z0-9]){re.escape(fragment)}(?![a-z0-9])", name) is not None

    for key in sorted(GPU_SPECS, key=len, reverse=True):
        if has(key):
            return GPU_SPECS[key]
    forty = "40gb" in name.replace(" ", "")
    short = {"h100": "h100 80gb hbm3", "a100": "a100-sxm4-40gb" if forty else "a100-sxm4-80gb",
             "v100": "v100-sxm2-32gb" if "32gb" in name else "v100-sxm2-16gb", "4090": "rtx 4090",
             "3090": "rtx 3090", "5090": "rtx 5090", "a6000": "rtx a6000", "4080": "rtx 4080 super"}
    for key, full in short.items():
        if has(key):
            spec = GPU_SPECS[full]
            return spec if "pcie" not in name or spec.interconnect == "pcie" else \
                GpuSpec(spec.name, spec.nvml_mib, spec.cuda_gib, spec.sms, "pcie", spec.basis)
    return None


def cuda_total_bytes(device_name: str, nvml_total_bytes: int | None = None) -> int | None:
    """CUDA's total for a GPU: the table's figure where the name is known and NVML's total, if given, is
    that model's (within 2%); otherwise NVML's total as it is (a card the table does not know, or a
    partition such as a MIG slice); None when neither is known."""
    spec = gpu_spec(device_name)
    if spec is not None and (not nvml_total_bytes or abs(nvml_total_bytes / (spec.nvml_mib << 20) - 1) < 0.02):
        return int(spec.cuda_gib * (1 << 30))
    return int(nvml_total_bytes) if nvml_total_bytes else None


def interconnect(device_name: str) -> str:
    """"nvswitch", "nvlink" or "pcie" for a GPU name; a name the table does not know counts as "pcie"
    unless it says SXM (the smaller all-reduce buffers; the budget's band covers the rest)."""
    spec = gpu_spec(device_name)
    if spec is not None:
        return spec.interconnect
    return "nvlink" if "sxm" in (device_name or "").lower() else "pcie"


def sm_count(device_name: str) -> int | None:
    """Streaming multiprocessors of a GPU model, None when the name is not known."""
    spec = gpu_spec(device_name)
    return spec.sms if spec else None
