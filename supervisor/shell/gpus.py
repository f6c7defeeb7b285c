"""The GPUs of one guard run, in time: the start-up turn it takes on them, and the wait for a dead
launch's memory to come back before the next launch.

The turn (an ``flock`` per GPU, :mod:`supervisor.shell.locks`) lets only one vLLM at a time
profile a GPU, so two guards starting together do not measure each other's memory. Both waits end
at once when the guard is asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import structlog

from supervisor.core.gpus import GpuDevice, visible
from supervisor.core.units import GiB
from supervisor.errors import EX_TEMPFAIL, Refused
from supervisor.facts import device_dict
from supervisor.shell import locks, procs

log = structlog.get_logger("vllm-guard")


class Gpus:
    """The devices a launch uses, as NVML reports them now, and the turn on them."""

    def __init__(self, provider: Any, environ: Mapping[str, str], state_dir: str, key: str,
                 devices: tuple[GpuDevice, ...], stop: asyncio.Event) -> None:
        self.provider, self.environ, self.state_dir, self.key = provider, environ, state_dir, key
        self.indexes = {d.index for d in devices}
        self.snapshot = [device_dict(d) for d in devices]
        self.stop = stop
        self._turn: locks.GpuTurn | None = None

    @contextlib.asynccontextmanager
    async def turn(self, timeout: float) -> AsyncIterator[bool]:
        """Hold the start-up turn while a launch starts; yields False when a stop came while waiting."""
        def waiting() -> None:
            log.info("another vLLM is starting on this GPU; waiting for its turn")

        try:
            async with locks.gpu_turn_async(self.key, timeout, on_wait=waiting, stop=self.stop) as turn:
                self._turn = turn
                try:
                    yield turn is not None
                finally:
                    self.release_turn()
        except locks.GpuTurnTimeout as e:
            raise Refused(f"timed out waiting for another guard's vLLM to finish starting: {e}", EX_TEMPFAIL) from None

    def release_turn(self) -> None:
        """Let the next vLLM on these GPUs start profiling (once this one serves)."""
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.close()

    async def released(self, timeout: float = 60.0) -> float | None:
        """Wait (bounded, polled) until no process of ours holds memory on these GPUs; the least free
        GiB then (None without NVML)."""
        if not self.indexes:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            devices = [d for d in visible(self.provider.snapshot(), self.environ.get("CUDA_VISIBLE_DEVICES"))
                       if d.index in self.indexes]
            marked = {p.pid for p in procs.marked_processes(self.state_dir)}
            ours = [p for d in devices for p in d.processes if p.pid in marked]
            if devices:
                self.snapshot = [device_dict(d) for d in devices]
            free = min(d.free_bytes for d in devices) / GiB if devices else None
            if not ours or self.stop.is_set():
                return free
            if loop.time() > deadline:
                log.warning(f"GPU memory of the last launch not released after {timeout:g} s: "
                            + ", ".join(f"pid {p.pid}" for p in ours))
                return free
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=0.5)

    def holders(self) -> str:
        """The processes holding memory on these GPUs, for a message."""
        return ", ".join(f"pid {p['pid']} {p['name']} ({p['gib']} GiB)"
                         for d in self.snapshot for p in d.get("processes", []))
