"""What vLLM printed on this host sizes the next start: the guard in process (so the GPU it reads
can be given), the fake vLLM as its child. The fake's start-up follows the emulator: an L4-sized
card (23.55 GiB), Llama-3.1-8B (14.99 GiB of weights, what vLLM printed for it; 128 KiB of KV cache a
token), vLLM 0.11 (no auto-fit: a length the plan cuts is a number it must get right)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

from guardrun import FAKE, LLAMA8B, ROOT, argv_flag, free_port

from supervisor.config import GuardConfig, build, flatten
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice
from supervisor.core.lifecycle import State
from supervisor.core.session import Facts, Session
from supervisor.facts.model_files import load_model_info
from supervisor.shell.guard import Guard
from supervisor.shell.learned import MEASURED_PREFIX
from tests.fakes.gpu import FakeProvider

MODEL = ROOT / "tests" / "fixtures" / "models" / "Llama-3.1-8B-Instruct"
GiB = 1 << 30
# This host's vLLM needs less activation memory than the plan's estimate (0.2 GiB: a small batch).
SCENARIO = {"version": "0.11.0", "model": LLAMA8B, "activation_gib": 0.2}
L4 = GpuDevice(0, "NVIDIA L4", int(23.55 * GiB), int(0.4 * GiB), int(23.15 * GiB), (8, 9), ())


def serve_once(tmp: Path, port: int, vllm_args: str) -> dict:
    """One guard until vLLM serves, then a clean stop; its first launch's record."""
    cfg = build({**flatten(GuardConfig()), "model": str(MODEL), "vllm_command": f"{sys.executable} {FAKE} serve",
                 "vllm_args": tuple(Flags.parse(vllm_args).argv()), "port": port, "state_dir": str(tmp / "state"),
                 "status.port": 0, "health.interval": 0.3, "startup_timeout": 60.0, "stop_grace": 3.0})
    # vLLM's version is read from its package metadata, in vLLM's environment: a dist-info says 0.11.0
    site = tmp / "site" / "vllm-0.11.0.dist-info"
    site.mkdir(parents=True, exist_ok=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0\n")
    environ = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site.parent), "HF_HUB_OFFLINE": "1",
               "FAKE_VLLM_STATE": str(tmp / "fake"),
               "FAKE_VLLM_SCENARIO": json.dumps(SCENARIO)}
    (tmp / "fake").mkdir(exist_ok=True)
    guard = Guard(cfg, environ, gpu_provider=FakeProvider([[L4]]))

    async def main() -> int:
        run = asyncio.ensure_future(guard.run())
        while not run.done() and not (guard.session and guard.session.state is State.HEALTHY):
            await asyncio.wait({run}, timeout=0.1)
        guard.command("stop")
        return await run

    assert asyncio.run(asyncio.wait_for(main(), 120)) == 0, guard.exit_reason
    return guard.report.history.records[0]


def test_a_second_start_is_sized_by_what_the_first_printed(tmp_path):
    port = free_port()
    first = serve_once(tmp_path, port, "--max-model-len 8192")
    assert first["time_to_healthy_s"] is not None
    kv_gib, fits = first["measured"]["kv_available_gib"], first["measured"]["kv_cache_tokens"]
    learned = json.loads((tmp_path / "state" / "learned.json").read_text())
    (measured,) = [v["meta"]["measured"] for k, v in learned.items() if k.startswith(MEASURED_PREFIX)]
    assert abs(measured["overhead_bytes"] / GiB - (0.9 * 23.55 - LLAMA8B["weights_gib"] - kv_gib)) < 0.01

    # Other flags (the model's whole context): no learned flags apply, the measurement does.
    again = serve_once(tmp_path, port, "")
    length = int(argv_flag(again["argv"], "--max-model-len"))
    assert again["time_to_healthy_s"] is not None and again["n"] == 1
    assert 0.96 * fits <= length <= fits, (length, fits)      # less the plan's 3% margin

    # The estimate alone would have held back more of what this host has.
    facts = Facts(devices=(L4,), total_gib=23.55, free_gib=23.15, vllm_version="0.11.0",
                  model=load_model_info(str(MODEL)))
    estimate = Session(build(flatten(GuardConfig(model="m"))), facts, rng=random.Random(0)).first_launch()
    assert int(estimate.flags.get("--max-model-len")) < 0.93 * fits
