"""A scripted GPU provider for tests: each ``snapshot()`` returns the next list; the last repeats."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.gpus import GpuDevice


class FakeProvider:
    """Stands in for :class:`supervisor.facts.nvml.NvmlProvider`."""

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
