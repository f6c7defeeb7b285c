"""GPU facts from NVML: memory, compute capability and the processes holding memory, per device.

A machine without an NVIDIA driver is a normal case: :class:`NvmlProvider` then returns ``[]``
and says why once (its ``reason``). Anything with a ``snapshot()`` method stands in for it
(the tests script GPUs that way).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from supervisor.core.gpus import GpuDevice, GpuProcess

# stdlib logging, not print-to-stdout: `plan --json` owns stdout.
log = logging.getLogger(__name__)


class GpuProvider(Protocol):
    """Anything that can list the GPUs right now."""

    def snapshot(self) -> list[GpuDevice]:
        """All GPUs on the machine; ``[]`` when there are none or NVML is unavailable."""
        ...


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
