"""`vllm-guard plan`: a real subprocess per run, JSON parsed from its stdout."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import plan as cli_plan
from supervisor.facts.nvml import NvmlProvider

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
FIXTURES = ["Qwen2.5-7B-Instruct", "Qwen2.5-32B-Instruct", "Qwen2.5-32B-Instruct-AWQ", "Llama-3.1-8B-Instruct",
            "Llama-3.3-70B-Instruct", "Llama-3.3-70B-Instruct-AWQ", "DeepSeek-V2-Lite", "Qwen3-8B",
            "Mistral-7B-v0.3", "gpt-oss-20b"]


def plan(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "supervisor.cli.plan", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("gib", [24, 80])
@pytest.mark.parametrize("name", FIXTURES)
def test_plan_json_for_real_configs(name, gib):
    tp = "2" if "70B" in name else "1"
    r = plan(str(MODELS / name), "--gpu-memory-gib", str(gib), "-tp", tp, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("weights_gib", "kv_bytes_per_token", "derived_max_model_len", "rows", "start_flags", "fp8_supported"):
        assert key in out
    assert out["rows"], "a plan has rows"
    utils = {row["gpu_memory_utilization"] for row in out["rows"]}
    assert {0.80, 0.85, 0.90, 0.95} <= utils
    for row in out["rows"]:
        assert {"gpu_memory_utilization", "kv_cache_dtype", "kv_budget_gib", "fit_max_model_len"} <= set(row)
        assert 0 <= row["fit_max_model_len"] <= out["derived_max_model_len"]
    assert "--max-model-len" in out["start_flags"]


def test_plan_numbers_for_llama_8b_on_24gb():
    r = plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "23.55", "--vllm-version", "0.9.2",
             "--compute-capability", "8.9", "--json")
    out = json.loads(r.stdout)
    assert out["kv_bytes_per_token"] == 131_072
    assert out["derived_max_model_len"] == 131_072
    assert out["weights_gib"] == pytest.approx(14.96, abs=0.01)
    assert out["fp8_supported"] is True
    row = next(x for x in out["rows"] if x["gpu_memory_utilization"] == 0.90 and x["kv_cache_dtype"] == "auto")
    assert row["fit_max_model_len"] == pytest.approx(41_600, rel=0.05)      # research §6.1
    fp8 = next(x for x in out["rows"] if x["gpu_memory_utilization"] == 0.90 and x["kv_cache_dtype"] == "fp8")
    assert fp8["fit_max_model_len"] == pytest.approx(2 * row["fit_max_model_len"], rel=0.01)
    # vLLM: pool blocks / blocks per request (0.9.2 has no null-block hold-back in the capacity)
    assert row["max_concurrency"]["4096"] == round(row["kv_capacity_tokens"] / 4096, 2)
    assert out["start_flags"]["--gpu-memory-utilization"] == "0.9"
    assert int(out["start_flags"]["--max-model-len"]) < 41_600


def test_plan_70b_tp2_reports_whole_and_per_gpu_kv():
    out = json.loads(plan(str(MODELS / "Llama-3.3-70B-Instruct"), "--gpu-memory-gib", "80", "-tp", "2",
                          "--json").stdout)
    assert out["kv_bytes_per_token"] == 327_680
    assert out["kv_bytes_per_token_per_gpu"] == 163_840


def test_plan_cpu_tiny_model_json_and_table():
    r = plan(str(MODELS / "tiny-llama-cpu"), "--cpu-kv-space-gib", "1", "--vllm-version", "0.32.0", "--json")
    out = json.loads(r.stdout)
    assert out["block_size"] == 128
    assert [row["fit_max_model_len"] for row in out["rows"]] == [65_408]
    # the real log: "Maximum concurrency for 65,408 tokens per request: 1.00x"; 512 blocks / 32 at 4096
    assert out["rows"][0]["max_concurrency"] == {"4096": 16.0, "8192": 8.0, "32768": 2.0, "65408": 1.0}
    assert out["start_flags"]["--max-model-len"] == "65408"
    text = plan(str(MODELS / "tiny-llama-cpu"), "--cpu-kv-space-gib", "1", "--vllm-version", "0.32.0").stdout
    assert "65,408" in text and "--max-model-len 65408" in text


def test_plan_human_table():
    r = plan(str(MODELS / "Qwen2.5-7B-Instruct"), "--gpu-memory-gib", "24")
    assert r.returncode == 0
    assert "57,344 B/token" in r.stdout and "vllm-guard would start with:" in r.stdout


def test_more_gpus_than_given_is_reported():
    r = plan(str(MODELS / "Llama-3.3-70B-Instruct-AWQ"), "--gpu-memory-gib", "24", "-tp", "2", "--gpus", "1")
    assert r.returncode == 2 and "needs 2 GPUs" in r.stderr


def test_unreadable_model_is_a_usage_error():
    r = plan("/nonexistent/model", "--gpu-memory-gib", "24")
    assert r.returncode == 2 and "cannot read config.json" in r.stderr and r.stdout == ""


@pytest.mark.skipif(bool(NvmlProvider().snapshot()), reason="this machine has a GPU")
def test_without_a_gpu_it_asks_for_the_size():
    r = plan(str(MODELS / "Qwen3-8B"), "--json")
    assert r.returncode == 2
    assert "--gpu-memory-gib" in r.stderr and r.stdout == ""


def test_add_parser_registers_plan():
    parser = argparse.ArgumentParser(prog="vllm-guard")
    cli_plan.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", str(MODELS / "Qwen3-8B"), "--gpu-memory-gib", "24", "-tp", "1"])
    assert args.func is cli_plan.run and args.gpu_memory_gib == 24.0
