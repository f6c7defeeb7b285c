"""GPU facts from NVML: memory, compute capability and the processes holding memory, per device.

A machine without an NVIDIA driver is a normal case: :class:`NvmlProvider` then returns ``[]``
and says why once (its ``reason``). Tests use :class:`FakeProvider` behind the same interface.
:func:`visible` applies ``CUDA_VISIBLE_DEVICES``; :func:`fp8_kv_supported` is the pure table
of which GPUs and vLLM versions can hold an fp8 KV cache.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from supervisor.core.model import parse_version

# stdlib logging, not print-to-stdout: `plan --json` owns stdout.
log = logging.getLogger(__name__)


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


class GpuProvider(Protocol):
    """Anything that can list the GPUs right now."""

    def snapshot(self) -> list[GpuDevice]:
        """All GPUs on the machine; ``[]`` when there are none or NVML is unavailable."""
        ...


class FakeProvider:
    """Scripted snapshots for tests: each call returns the next list; the last one repeats."""

    def __init__(self, snapshots: Sequence[Sequence[GpuDevice]] = ((),), reason: str | None = None) -> None:
        self._snapshots = [list(s) for s in snapshots] or [[]]
        self._calls = 0
        self.reason = reason

    def snapshot(self) -> list[GpuDevice]:
        """The next scripted snapshot."""
        snap = self._snapshots[min(self._calls, len(self._snapshots) - 1)]
        self._calls += 1
        return list(snap)

    @property
    def calls(self) -> int:
        """How many snapshots were taken."""
        return self._calls


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # gone, or another user's process: the name is a nicety
        return ""


class NvmlProvider:
    """The real GPUs through ``pynvml`` (imported and initialised once, lazily)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._tried = False
        self._reason: str | None = None
        self._lock = threading.Lock()

    @property
    def reason(self) -> str | None:
        """Why NVML is unavailable (no driver, no library), or None when it works or was not tried."""
        return self._reason

    @property
    def available(self) -> bool:
        """True when NVML initialised."""
        return self._init() is not None

    def _init(self) -> Any:
        with self._lock:
            if self._tried:
                return self._nvml
            self._tried = True
            try:
                import pynvml
            except ImportError as exc:
                self._reason = f"nvidia-ml-py is not installed ({exc})"
            else:
                try:
                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    self._reason = f"NVML unavailable: {_text(exc) or type(exc).__name__}"
            if self._reason:
                log.info("GPU facts unavailable: %s", self._reason)
            return self._nvml

    def snapshot(self) -> list[GpuDevice]:
        """Every GPU NVML sees, in NVML order; ``[]`` without NVML."""
        nvml = self._init()
        if nvml is None:
            return []
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            log.warning("NVML device count failed: %s", _text(exc))
            return []
        devices = []
        for i in range(count):
            try:
                devices.append(self._device(nvml, i))
            except Exception as exc:  # one broken device (fallen off the bus) must not hide the rest
                log.warning("NVML device %d unreadable: %s", i, _text(exc))
        return devices

    @staticmethod
    def _device(nvml: Any, index: int) -> GpuDevice:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        try:
            cc = tuple(int(x) for x in nvml.nvmlDeviceGetCudaComputeCapability(h))
        except Exception:
            cc = (0, 0)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
        except Exception:
            uuid = ""
        procs: list[GpuProcess] = []
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for p in getattr(nvml, getter)(h):
                    used = getattr(p, "usedGpuMemory", None)
                    if any(q.pid == p.pid for q in procs):
                        continue
                    procs.append(GpuProcess(int(p.pid), _process_name(int(p.pid)),
                                            int(used) if isinstance(used, int) else 0))
            except Exception:  # not supported on this device/driver: no process list
                pass
        return GpuDevice(index=index, name=_text(nvml.nvmlDeviceGetName(h)), total_bytes=int(mem.total),
                         used_bytes=int(mem.used), free_bytes=int(mem.free),
                         compute_capability=(cc[0], cc[1]), processes=tuple(procs), uuid=uuid)


def visible(devices: Iterable[GpuDevice], cuda_visible_devices: str | None) -> list[GpuDevice]:
    """The devices a CUDA program sees, in its order (indices or GPU-UUID prefixes; stops at the first unknown entry, as CUDA does)."""
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


def fp8_kv_supported(cc: tuple[int, int], vllm_version: str | None, mla: bool = False) -> bool:
    """Whether vLLM can run ``--kv-cache-dtype fp8`` on a GPU of this compute capability (research §4)."""
    ver = parse_version(vllm_version)
    if cc < (7, 0):
        return False
    if mla:
        # fp8 MLA needs FlashMLA / CUTLASS MLA / FlashInfer MLA: Hopper or Blackwell, V1 0.11+.
        return cc >= (9, 0) and (ver is None or ver >= (0, 11, 0))
    if ver is None:
        return cc >= (8, 9)                  # unknown version: only where every backend path works
    if ver < (0, 11, 0):
        # V0 converts in software on any NVIDIA GPU; V1 0.8-0.10 falls back to V0 where it cannot.
        return True
    if ver < (0, 33, 0):
        return cc >= (8, 9)                  # Triton/FA3 need native e4m3 (issue #26431 on Ampere)
    return cc >= (8, 0)                      # 0.33: FlashInfer covers sm80+
