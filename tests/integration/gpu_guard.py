"""A real guard process on a scripted GPU: ``python gpu_guard.py CONFIG_JSON``.

The guard runs as ``vllm-guard start`` does (its logging, its signals, its status endpoint), but
reads its GPU from :class:`tests.fakes.gpu.FakeProvider` (an L4, 23.55 GiB) instead of NVML, so
that tests on a machine without a GPU see what a GPU host shows (the plan's memory picture, the
GPU's total). CONFIG_JSON holds the guard's settings (``GuardConfig`` keys, flattened).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.config import GuardConfig, build, flatten  # noqa: E402
from supervisor.core.gpus import GpuDevice  # noqa: E402
from supervisor.shell import logs  # noqa: E402
from supervisor.shell.guard import Guard  # noqa: E402
from tests.fakes.gpu import FakeProvider  # noqa: E402

GiB = 1 << 30
L4 = GpuDevice(0, "NVIDIA L4", int(23.55 * GiB), int(0.4 * GiB), int(23.15 * GiB), (8, 9), ())


def main(argv: list[str]) -> int:
    settings = json.loads(argv[1])
    settings["vllm_args"] = tuple(settings.get("vllm_args", ()))
    cfg = build({**flatten(GuardConfig()), **settings})
    logs.configure_logging(json=False, level="info")
    return asyncio.run(Guard(cfg, dict(os.environ), gpu_provider=FakeProvider([[L4]])).run())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
