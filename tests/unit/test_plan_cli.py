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


def plan(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), pythonpath) if p))
    return subprocess.run([sys.executable, "-m", "supervisor.cli.plan", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("gib", [24, 80])
@pytest.mark.parametrize("name", FIXTURES)
def test_plan_json_for_real_configs(name, gib):
    tp = "2" if "70B" in name else "1"
    r = plan(str(MODELS / name), "--gpu-memory-gib", str(gib), "-tp", tp, "--json")
    assert r.returncode in (0, 3), r.stderr
    out = json.loads(r.stdout)
    for key in ("weights_gib", "kv_bytes_per_token", "derived_max_model_len", "rows", "start_flags", "fp8_supported",
                "fits", "options", "verdict", "rules"):
        assert key in out
    assert (r.returncode == 0) == out["fits"] and (out["fits"] or out["options"])
    assert out["rows"], "a plan has rows"
    utils = {row["gpu_memory_utilization"] for row in out["rows"]}
    assert {0.80, 0.85, 0.90, 0.95} <= utils
    for row in out["rows"]:
        assert {"gpu_memory_utilization", "kv_cache_dtype", "kv_budget_gib", "fit_max_model_len", "starts",
                "confident"} <= set(row)
        assert 0 <= row["fit_max_model_len"] <= out["derived_max_model_len"]
        if row["kv_budget_gib"] <= 0:
            assert row["starts"] is False
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
    # 23.55 x 0.90 - 14.99 weights - 1.22 activation (the sampler) - 0.13 non-torch = 4.86 GiB
    assert row["kv_budget_gib"] == pytest.approx(4.86, abs=0.02)
    assert row["fit_max_model_len"] == pytest.approx(39_800, rel=0.01)
    assert row["kv_safe_gib"] < row["kv_budget_gib"] and row["starts"] and row["confident"]
    assert out["fits"] and out["options"] == [] and out["rules"]["version"] == "0.9.2"
    fp8 = next(x for x in out["rows"] if x["gpu_memory_utilization"] == 0.90 and x["kv_cache_dtype"] == "fp8")
    assert fp8["fit_max_model_len"] == pytest.approx(2 * row["fit_max_model_len"], rel=0.01)
    # vLLM: pool blocks / blocks per request (0.9.2 has no null-block hold-back in the capacity)
    assert row["max_concurrency"]["4096"] == round(row["kv_capacity_tokens"] / 4096, 2)
    assert out["start_flags"]["--gpu-memory-utilization"] == "0.9"
    assert int(out["start_flags"]["--max-model-len"]) < row["fit_max_model_len"]     # the safe end of the band


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
    assert r.stdout.startswith("FITS: ")
    assert "57,344 B/token" in r.stdout and "vllm-guard would start with:" in r.stdout
    assert "x@4k, x@8k, x@32k, x@fit: how many requests of that many tokens" in r.stdout     # the legend


@pytest.mark.parametrize("args", [(), ("-tp", "2", "--gpus", "2")])
def test_a_model_that_cannot_fit_leads_with_the_verdict_and_what_would_work(args):
    """Qwen2.5-32B (61 GiB of weights) on 24 GiB GPUs: the verdict first, the options, exit 3."""
    r = plan(str(MODELS / "Qwen2.5-32B-Instruct"), "--gpu-memory-gib", "24", *args)
    assert r.returncode == 3, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("DOES NOT FIT: ") and "GiB of weights per GPU" in first
    assert "What would work" in r.stdout and "--tensor-parallel-size 4" in r.stdout
    assert "vllm-guard would start with" not in r.stdout
    out = json.loads(plan(str(MODELS / "Qwen2.5-32B-Instruct"), "--gpu-memory-gib", "24", *args, "--json").stdout)
    assert out["fits"] is False and out["verdict"].startswith("does not fit")
    assert all(row["starts"] is False for row in out["rows"])
    kinds = {o["kind"] for o in out["options"]}
    assert {"parallel", "cpu_offload", "quantized"} <= kinds
    tp4 = next(o for o in out["options"] if o["flags"].get("--tensor-parallel-size") == "4")
    assert tp4["gpus"] == 4 and not tp4["available"] and tp4["fit_max_model_len"] >= 2048
    awq = next(o for o in out["options"] if o.get("variant") == "AWQ 4-bit")
    assert awq["weights_gib"] == pytest.approx(18.0, abs=0.1) and awq["fits"]
    offload = next(o for o in out["options"] if o["kind"] == "cpu_offload")
    assert int(offload["flags"]["--cpu-offload-gb"]) > 0 and offload["cost_s_per_step"] > 0


def test_the_floor_not_fitting_is_a_verdict_too():
    # Llama-3.1-8B on a 16 GiB card: the weights load, but not even 2048 tokens (or fp8's 4096) fit
    r = plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "16.5", "--compute-capability", "8.9",
             "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 3 and out["fits"] is False and "the floor" in out["verdict"]
    assert any(o["kind"] == "parallel" and o["flags"]["--tensor-parallel-size"] == "2" for o in out["options"])


def test_flags_that_change_the_budget_are_taken():
    base = ["--gpu-memory-gib", "79.2", "--vllm-version", "0.11.0", "--json"]
    h100 = json.loads(plan(str(MODELS / "Qwen3-8B"), *base, "--gpu-name", "NVIDIA H100 80GB HBM3").stdout)
    a100 = json.loads(plan(str(MODELS / "Qwen3-8B"), *base, "--gpu-name", "NVIDIA A100-SXM4-80GB").stdout)
    assert (h100["max_num_batched_tokens"], h100["max_num_seqs"]) == (8192, 1024)
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)       # vLLM spares the A100
    assert a100["rows"][0]["kv_budget_gib"] > h100["rows"][0]["kv_budget_gib"]        # a smaller sampler peak
    assert h100["fp8_supported"] is True and a100["fp8_supported"] is False          # from the GPU's name
    few = json.loads(plan(str(MODELS / "Qwen3-8B"), *base, "--gpu-name", "NVIDIA H100 80GB HBM3",
                          "--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--block-size", "32").stdout)
    assert (few["max_num_batched_tokens"], few["max_num_seqs"], few["block_size"]) == (4096, 64, 32)
    assert few["rows"][0]["kv_budget_gib"] > h100["rows"][0]["kv_budget_gib"]
    assert few["start_flags"]["--max-num-seqs"] == "64"
    v0 = json.loads(plan(str(MODELS / "Qwen3-8B"), "--gpu-memory-gib", "24", "--vllm-version", "0.6.6",
                         "--max-model-len", "16384", "--json").stdout)
    chunked = json.loads(plan(str(MODELS / "Qwen3-8B"), "--gpu-memory-gib", "24", "--vllm-version", "0.6.6",
                              "--max-model-len", "16384", "--enable-chunked-prefill", "--json").stdout)
    assert (v0["max_num_batched_tokens"], chunked["max_num_batched_tokens"]) == (16384, 2048)


def test_the_rules_are_the_installed_vllms(tmp_path):
    """--vllm-version defaults to the version of the vLLM that --vllm-command runs."""
    site = tmp_path / "site"
    (site / "vllm-0.11.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0\n")
    script = tmp_path / "myvllm"
    script.write_text(f"#!{sys.executable}\n")
    script.chmod(0o755)
    r = plan(str(MODELS / "Qwen3-8B"), "--gpu-memory-gib", "24", "--vllm-command", f"{script} serve", "--json",
             pythonpath=str(site))
    out = json.loads(r.stdout)
    assert out["vllm_version"] == "0.11.0" and out["rules"]["family"] == "v1-0.11"
    assert "vllm 0.11.0" in out["rules"]["source"] and str(script) in out["rules"]["source"]
    text = plan(str(MODELS / "Qwen3-8B"), "--gpu-memory-gib", "24", "--vllm-command", f"{script} serve",
                pythonpath=str(site)).stdout
    assert "vLLM rules: 0.11.0 (v1-0.11; vllm 0.11.0" in text


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


def test_a_cut_context_is_named_a_cut_and_the_models_length_is_not_called_asked():
    r = plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "23.55", "--vllm-version", "0.9.2")
    first = r.stdout.splitlines()[0]
    assert r.returncode == 0 and first.startswith("FITS, CONTEXT CUT: about ")
    assert "of the model's 131,072-token context" in first and "asked" not in first
    pct = int(first.split("tokens, ", 1)[1].split("%", 1)[0])
    assert 25 <= pct <= 35                                   # ~39,800 of 131,072
    whole = plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "23.55", "--vllm-version", "0.9.2",
                 "--max-model-len", "8192").stdout.splitlines()[0]
    assert whole.startswith("FITS: the 8,192 tokens asked on one 23.55 GiB GPU")
    out = json.loads(plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "23.55", "--vllm-version",
                          "0.9.2", "--json").stdout)
    assert out["fits"] and out["cut"] and out["asked_max_model_len"] is None


@pytest.mark.parametrize("flags, record, printed_kv_gib", [
    # calibration set 2: Llama-3.1-8B on an H100 at 0.95, vLLM 0.19.0
    (("--dtype", "float32"), 121, 42.80),
    (("--quantization", "fp8"), 119, 64.61),
    ((), 124, 58.11),
])
def test_dtype_and_runtime_quantization_are_planned_as_vllm_runs_them(flags, record, printed_kv_gib):
    out = json.loads(plan(str(MODELS / "Llama-3.1-8B-Instruct"), "--gpu-name", "NVIDIA H100 80GB HBM3",
                          "--vllm-version", "0.19.0", "--gpu-memory-utilization", "0.95", "--max-model-len", "8192",
                          *flags, "--json").stdout)
    row = next(x for x in out["rows"] if x["gpu_memory_utilization"] == 0.95 and x["kv_cache_dtype"] == "auto")
    assert row["kv_budget_gib"] == pytest.approx(printed_kv_gib, rel=0.01), record
    for flag, value in zip(flags[::2], flags[1::2], strict=False):
        assert out["start_flags"][flag] == value


def test_a_gpu_name_alone_gives_its_cuda_total():
    out = json.loads(plan(str(MODELS / "Qwen3-8B"), "--gpu-name", "H100", "--vllm-version", "0.19.0",
                          "--json").stdout)
    assert out["gpu_total_gib"] == 79.18 and out["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert (out["max_num_batched_tokens"], out["max_num_seqs"]) == (8192, 1024)
    assert "transformers" in out["config_source"] or "config.json" in out["config_source"]
