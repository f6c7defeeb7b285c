"""The first launch's flags as the daemon chooses them: GPU facts (a scripted NVML snapshot), the
model's config.json, the plan, and a remedy taken ahead of a failure the plan foresees.

Each planned launch is then run through the emulator the benchmark uses: it must serve at once.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from benchmarks import matrix, render
from supervisor import facts
from supervisor.config import GuardConfig
from supervisor.core.gpus import GpuDevice
from supervisor.core.session import Session
from tests.fakes import emulator as emu
from tests.fakes.gpu import FakeProvider

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30
L4 = 22.06


def l4(index: int, held_gib: float = 0.0) -> GpuDevice:
    total = int(L4 * GiB)
    used = int(held_gib * GiB)
    return GpuDevice(index, "NVIDIA L4", total, used, total - used, (8, 9), (), uuid=f"GPU-{index}")


def planned(name: str, args: list[str], devices: list[GpuDevice], version: str | None) -> Session:
    """The daemon's own path to the first launch: the facts it gathers, then its session."""
    cfg = GuardConfig(model=str(MODELS / name), vllm_args=tuple(args))
    gathered = facts.gather(cfg, {}, FakeProvider([devices]))
    g = Session(cfg, replace(gathered.facts, vllm_version=version), rng=random.Random(0))
    g.first_launch()
    return g


def serves(name: str, version: str, g: Session, held_gib: float = 0.0, count: int = 1):
    model = matrix.Model(name, name, str(MODELS / name))
    gpu = emu.GpuSpec(total_gib=L4, other_used_gib=held_gib, cc=(8, 9), count=count)
    return render.simulate(matrix.model_spec(model, version), gpu, version, g.current)


def test_foreseen_no_kv_memory_takes_the_remedy_before_the_first_launch():
    name, version = "Llama-3.3-70B-Instruct-AWQ", "0.32.0"
    g = planned(name, ["--tensor-parallel-size", "2", "--max-num-seqs", "512"], [l4(0), l4(1)], version)
    assert g.sizing is not None and g.sizing.gpus == 2
    util = g.current.get_float("--gpu-memory-utilization")
    assert util is not None and util > 0.92                    # the no-KV ladder's first step
    assert g.current.has("--max-model-len")                    # and the length that fits there
    note = g.notes["--gpu-memory-utilization"]
    assert note.source == "plan" and note.why.startswith("no_kv_cache_memory expected")
    assert g.flags_source == "plan"
    assert serves(name, version, g, count=2).ok


def test_busy_gpu_gets_a_share_under_free_memory_and_the_length_that_fits():
    name, version = "Llama-3.1-8B-Instruct", "0.32.0"
    g = planned(name, [], [l4(0, held_gib=3.0)], version)
    util = g.current.get_float("--gpu-memory-utilization")
    assert util is not None and util * L4 <= L4 - 3.0 - render.CONTEXT_GIB     # vLLM's start-up check
    assert g.current.get("--max-model-len") == "auto"       # 0.14+: vLLM sizes it to what it measures
    assert g.notes["--max-model-len"].why.startswith("131072 tokens do not fit")
    out = serves(name, version, g, held_gib=3.0)
    assert out.ok and 8192 <= out.served_max_model_len < 131072


def test_a_model_without_a_config_plans_nothing_and_the_remedies_get_no_sizing(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")        # the Hub is not asked
    g = planned("no-such-org/no-such-model", [], [l4(0)], "0.32.0")
    assert g.sizing is None and g.current == g.requested and not g.notes
