"""The memory emulator ("the real vLLM" of the fake and the benchmark) against real start-ups.

The figures pinned here are what vLLM printed in the calibration set (``benchmarks/calibration``):
the emulator's terms are its own code, calibrated to them, not the plan's.
"""

from __future__ import annotations

import pytest

from supervisor.core.diagnosis import Kind
from tests.fakes.emulator import GpuSpec, ModelSpec, simulate, vtuple

# config.json shapes; weights are what vLLM printed ("Model loading took").
LLAMA_8B = ModelSpec("meta-llama/Llama-3.1-8B-Instruct", weights_gib=14.99, kv_bytes_per_token=131072,
                     num_kv_heads=8, derived_max_model_len=131072, vocab=128256, hidden=4096, intermediate=14336)
QWEN_7B = ModelSpec("Qwen/Qwen2.5-7B-Instruct", weights_gib=14.25, kv_bytes_per_token=57344, num_kv_heads=4,
                    derived_max_model_len=32768, vocab=152064, hidden=3584, intermediate=18944)
QWEN3_32B = ModelSpec("Qwen/Qwen3-32B", weights_gib=61.03, kv_bytes_per_token=262144, num_kv_heads=8,
                      derived_max_model_len=40960, vocab=151936, hidden=5120, intermediate=25600, num_layers=64)
QWEN3_06B = ModelSpec("Qwen/Qwen3-0.6B", weights_gib=1.12, kv_bytes_per_token=114688, num_kv_heads=8,
                      derived_max_model_len=40960, vocab=151936, hidden=1024, intermediate=3072, num_layers=28)
R1_14B = ModelSpec("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", weights_gib=27.9, kv_bytes_per_token=196608,
                   num_kv_heads=8, derived_max_model_len=131072, vocab=152064, hidden=5120, intermediate=13824,
                   num_layers=48)
CARD_24 = GpuSpec(total_gib=23.55)
H100 = GpuSpec(total_gib=79.18, cc=(9, 0))


def test_version_strings_parse_like_pep440_releases():
    assert vtuple("0.6.3.post1") == (0, 6, 3)
    assert vtuple("0.10.1.1") == (0, 10, 1)
    assert vtuple("0.10.2rc3.dev253+ga684c0124") == (0, 10, 2)
    assert vtuple("0.32.0") == (0, 32, 0)


# -- the calibration start-ups (id = the row of benchmarks/calibration/records.tsv) --------------

@pytest.mark.parametrize("rid, model, activation, kv", [
    (5, LLAMA_8B, 4.76, 51.38),
    (6, QWEN3_06B, 5.56, 64.45),
    (8, QWEN3_32B, 5.64, 4.45),
])
def test_h100_0_11_start_ups(rid, model, activation, kv):
    out = simulate(model, H100, "0.11.0", {"--max-model-len": "16000", "--gpu-memory-utilization": "0.9"},
                   block_size=128)
    assert out.numbers["max_num_batched_tokens"] == 8192 and out.numbers["max_num_seqs"] == 1024
    assert out.numbers["activation_gib"] == pytest.approx(activation, abs=0.04), rid
    assert out.numbers["non_torch_gib"] == pytest.approx(0.13, abs=0.01)
    assert out.numbers["kv_available_gib"] == pytest.approx(kv, abs=0.05), rid


def test_h100_0_11_tensor_parallel_start_up():
    # record 9: Qwen3-32B at TP 2 -- 30.59 GiB weights, 0.54 GiB non-torch, 34.49 GiB KV per rank
    out = simulate(QWEN3_32B, GpuSpec(79.18, cc=(9, 0), count=2), "0.11.0",
                   {"--max-model-len": "16000", "--tensor-parallel-size": "2"}, block_size=128)
    assert out.numbers["non_torch_gib"] == pytest.approx(0.54, abs=0.01)
    assert out.numbers["kv_available_gib"] == pytest.approx(34.49, abs=0.1)


@pytest.mark.parametrize("length, activation, kv, tokens", [(20000, 2.07, 3.81, 31232), (29000, 2.99, 2.89, 23648)])
def test_v0_0_6_4_profiles_the_whole_context(length, activation, kv, tokens):
    # records 11-12: an RTX 3090, V0 0.6.4 (the global cap: the CUDA context counts), 14.9888 GiB weights
    rtx3090 = GpuSpec(23.58, cc=(8, 6), datacenter=False)
    spec = ModelSpec(**{**LLAMA_8B.__dict__, "weights_gib": 14.9888})
    out = simulate(spec, rtx3090, "0.6.4", {"--max-model-len": str(length)})
    assert out.ok == (length <= tokens)        # 29000 did not fit: vLLM said so, with these figures
    assert out.numbers["activation_gib"] == pytest.approx(activation, abs=0.05)
    assert out.numbers["kv_available_gib"] == pytest.approx(kv, abs=0.08)
    assert out.numbers["kv_tokens"] == pytest.approx(tokens, rel=0.025)


def test_v0_tensor_parallel_on_consumer_cards():
    # record 13: RTX 4090 x2, 0.7.2, --gpu-memory-utilization 0.98: 81,536 tokens (the driver rank's)
    out = simulate(R1_14B, GpuSpec(23.55, cc=(8, 9), count=2, datacenter=False), "0.7.2",
                   {"--tensor-parallel-size": "2", "--gpu-memory-utilization": "0.98"})
    assert out.kind == Kind.KV_CACHE_INSUFFICIENT.value
    assert out.numbers["non_torch_gib"] == pytest.approx(0.25, abs=0.01)
    assert out.numbers["fit_max_model_len"] == pytest.approx(81_536, rel=0.03)


def test_the_sampler_follows_the_version():
    # the profile's sampler: a sort (38 B per logits element) up to 0.16, in place (14 B) from 0.17
    flags = {"--max-model-len": "8192"}
    sort = simulate(LLAMA_8B, H100, "0.16.0", flags).numbers["activation_gib"]
    in_place = simulate(LLAMA_8B, H100, "0.17.0", flags).numbers["activation_gib"]
    assert sort - in_place == pytest.approx(1024 * 128256 * 24 / 2**30, abs=0.01)


def test_estimate_is_exactly_the_block_arithmetic():
    out = simulate(LLAMA_8B, CARD_24, "0.10.2", {}, activation_gib=1.0)
    kv_bytes = int(out.numbers["budget_gib"] * 2**30 - (14.99 + 1.0 + 0.13) * 2**30)
    assert out.numbers["fit_max_model_len"] == kv_bytes // (131072 * 16) * 16


def test_graph_estimate_is_subtracted_from_0_20():
    out = simulate(LLAMA_8B, CARD_24, "0.20.0", {"--gpu-memory-utilization": "0.90"}, cudagraph_gib=0.4)
    without = simulate(LLAMA_8B, CARD_24, "0.19.0", {"--gpu-memory-utilization": "0.90"})
    assert out.numbers["kv_available_gib"] == pytest.approx(without.numbers["kv_available_gib"] - 0.4
                                                            - (out.numbers["activation_gib"]
                                                               - without.numbers["activation_gib"]), abs=0.011)
    eager = simulate(LLAMA_8B, CARD_24, "0.20.0", {"--gpu-memory-utilization": "0.90", "--enforce-eager": ""},
                     cudagraph_gib=0.4)
    assert eager.numbers["fit_max_model_len"] > out.numbers["fit_max_model_len"]


def test_default_utilization_is_0_92_from_0_20():
    assert simulate(LLAMA_8B, CARD_24, "0.19.0", {}).numbers["requested_utilization"] == 0.90
    assert simulate(LLAMA_8B, CARD_24, "0.20.0", {}).numbers["requested_utilization"] == 0.92


def test_fp8_kv_halves_bytes_per_token_and_doubles_the_estimate():
    bf16 = simulate(LLAMA_8B, CARD_24, "0.32.0", {"--gpu-memory-utilization": "0.90"})
    fp8 = simulate(LLAMA_8B, CARD_24, "0.32.0", {"--gpu-memory-utilization": "0.90", "--kv-cache-dtype": "fp8"})
    assert fp8.numbers["kv_needed_gib"] == 8.0
    assert fp8.numbers["fit_max_model_len"] == pytest.approx(2 * bf16.numbers["fit_max_model_len"], abs=32)


def test_fp8_refused_before_ada_from_0_11():
    out = simulate(LLAMA_8B, GpuSpec(23.55, cc=(8, 6)), "0.32.0", {"--kv-cache-dtype": "fp8"})
    assert out.kind == Kind.CONFIG_ERROR.value


def test_fp8_off_hopper_falls_back_to_v0_on_0_8_to_0_10():
    out = simulate(LLAMA_8B, GpuSpec(23.55, cc=(8, 9)), "0.10.2", {"--kv-cache-dtype": "fp8"})
    assert out.numbers["engine"] == "v0"
    assert out.kind == Kind.KV_CACHE_INSUFFICIENT.value and out.phase == "kv_cache"
    hopper = simulate(LLAMA_8B, GpuSpec(79.19, cc=(9, 0)), "0.10.2", {"--kv-cache-dtype": "fp8"})
    assert hopper.numbers["engine"] == "v1"


def test_estimate_absent_in_0_8_4_to_0_9_0():
    for version in ("0.8.4", "0.9.0"):
        out = simulate(LLAMA_8B, CARD_24, version, {})
        assert out.kind == Kind.KV_CACHE_INSUFFICIENT.value
        assert "fit_max_model_len" not in out.numbers and out.numbers["kv_available_gib"] > 0
    assert "fit_max_model_len" in simulate(LLAMA_8B, CARD_24, "0.9.1", {}).numbers


def test_v0_profile_pushes_the_whole_context_below_32k():
    # V0 profiles the whole context below 32768 tokens: a shorter one fits, 32768 does not, and
    # above it chunked prefill (on by itself) profiles one chunk.
    assert simulate(LLAMA_8B, CARD_24, "0.6.3", {"--max-model-len": "24000"}).ok
    at_32k = simulate(LLAMA_8B, CARD_24, "0.6.3", {"--max-model-len": "32768"})
    assert at_32k.kind == Kind.KV_CACHE_INSUFFICIENT.value
    assert 20_000 < at_32k.numbers["fit_max_model_len"] < 32_768
    assert simulate(LLAMA_8B, CARD_24, "0.7.3", {"--max-model-len": "36000"}).ok


def test_derived_max_len_and_the_override_env():
    out = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "65536"})
    assert out.kind == Kind.MAX_LEN_EXCEEDS_MODEL.value and out.phase == "config"
    assert out.numbers["derived_max_model_len"] == 32768
    allowed = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "65536"},
                       env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert allowed.kind != Kind.MAX_LEN_EXCEEDS_MODEL.value


def test_free_memory_check_only_from_0_9_1():
    busy = GpuSpec(23.55, other_used_gib=4.0)
    out = simulate(QWEN_7B, busy, "0.32.0", {"--max-model-len": "8192"})
    assert out.kind == Kind.INSUFFICIENT_FREE_MEMORY.value and out.phase == "engine_init"
    assert out.numbers["free_gib"] < out.numbers["requested_gib"]
    old = simulate(QWEN_7B, busy, "0.9.0", {"--max-model-len": "8192"})   # global cap: shrinks KV instead
    assert old.kind != Kind.INSUFFICIENT_FREE_MEMORY.value
    assert old.numbers["kv_available_gib"] < simulate(QWEN_7B, CARD_24, "0.9.0", {}).numbers["kv_available_gib"]


def test_weights_that_do_not_fit_the_card_oom_while_loading():
    big = ModelSpec("Qwen/Qwen2.5-32B-Instruct", 61.03, 262144, 8, 32768, hidden=5120, intermediate=27648)
    out = simulate(big, CARD_24, "0.32.0", {"--max-model-len": "4096"})
    assert out.kind == Kind.OOM_WEIGHTS.value and out.phase == "loading"
    two = simulate(big, GpuSpec(79.19, count=2), "0.32.0", {"--max-model-len": "4096", "--tensor-parallel-size": "2"})
    assert two.ok
    offload = simulate(big, CARD_24, "0.32.0", {"--max-model-len": "4096", "--cpu-offload-gb": "45"})
    assert offload.numbers["weights_gib"] == pytest.approx(16.03) and offload.kind != Kind.OOM_WEIGHTS.value


def test_weights_over_budget_but_under_the_card_leave_no_kv():
    out = simulate(QWEN_7B, CARD_24, "0.32.0", {"--gpu-memory-utilization": "0.6"})
    assert out.kind == Kind.NO_KV_CACHE_MEMORY.value and out.numbers["kv_available_gib"] <= 0


def test_activation_peak_grows_with_max_num_seqs_until_the_profile_ooms():
    few = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "8192", "--max-num-seqs": "64"})
    many = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "8192", "--max-num-seqs": "2048",
                                                   "--max-num-batched-tokens": "4096"})
    assert few.numbers["activation_gib"] < many.numbers["activation_gib"]
    huge = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "8192", "--max-num-seqs": "8192",
                                                   "--max-num-batched-tokens": "8192"})
    assert huge.kind == Kind.OOM_PROFILE.value and huge.numbers["num_dummy_requests"] == 8192


def test_tp_divides_kv_heads_but_not_below_one_head():
    tp8 = simulate(QWEN_7B, GpuSpec(79.19, count=8), "0.32.0", {"--tensor-parallel-size": "8"})
    assert tp8.numbers["kv_bytes_per_token"] == 57344 // 4   # 4 KV heads: replicated beyond TP=4
    mla = ModelSpec("deepseek-ai/DeepSeek-V2-Lite", 29.26, 31104, 1, 163840, mla=True)
    assert simulate(mla, GpuSpec(79.19, count=2), "0.32.0",
                    {"--tensor-parallel-size": "2"}).numbers["kv_bytes_per_token"] == 31104


def test_cuda_graph_capture_oom_before_0_20_and_enforce_eager_heals_it():
    flags = {"--max-model-len": "8192", "--gpu-memory-utilization": "0.97"}
    out = simulate(QWEN_7B, CARD_24, "0.18.0", flags)
    assert out.kind == Kind.OOM_CUDAGRAPH.value and out.phase == "cudagraph"
    assert simulate(QWEN_7B, CARD_24, "0.18.0", {**flags, "--enforce-eager": ""}).ok
    assert simulate(QWEN_7B, CARD_24, "0.20.0", flags).ok   # 0.20+ budgets the graphs instead


def test_max_model_len_auto_fits_from_0_14():
    out = simulate(LLAMA_8B, CARD_24, "0.32.0", {"--max-model-len": "auto"})
    assert out.ok and out.numbers["auto_fit_max_model_len"] == out.served_max_model_len < 131072
    full = simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "auto"})
    assert full.ok and full.served_max_model_len == 32768
    old = simulate(LLAMA_8B, CARD_24, "0.13.0", {"--max-model-len": "auto"})
    assert old.kind == Kind.CONFIG_ERROR.value


def test_null_block_is_held_back_from_0_29():
    flags = {"--num-gpu-blocks-override": "100", "--max-model-len": "1600"}
    assert simulate(QWEN_7B, CARD_24, "0.28.0", flags, activation_gib=1.0).ok
    # 0.29+ compares against the KV memory minus one block: 1600 tokens = 100 blocks no longer fit
    # when the memory holds exactly 100 blocks.
    exact = 100 * 16 * 57344 / 2**30
    tight = simulate(QWEN_7B, GpuSpec(23.55), "0.29.0", {"--max-model-len": "1600", "--kv-cache-memory-bytes":
                                                          str(int(exact * 2**30))}, activation_gib=1.0)
    assert tight.kind == Kind.KV_CACHE_INSUFFICIENT.value and tight.numbers["fit_max_model_len"] == 1584


def test_config_errors():
    assert simulate(QWEN_7B, CARD_24, "0.32.0", {"--gpu-memory-utilization": "1.5"}).kind == "config_error"
    assert simulate(QWEN_7B, CARD_24, "0.32.0", {"--tensor-parallel-size": "2"}).kind == "config_error"
    assert simulate(QWEN_7B, CARD_24, "0.10.2", {"--kv-cache-dtype": "bfloat16"}).kind == "config_error"
    assert simulate(QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "abc"}).kind == "config_error"


def test_every_kind_is_a_supervisor_kind():
    names = {k.value for k in Kind}
    cases = [simulate(m, g, v, f) for m, g, v, f in [
        (LLAMA_8B, CARD_24, "0.32.0", {}),
        (QWEN_7B, CARD_24, "0.32.0", {"--max-model-len": "8192"}),
        (QWEN_7B, GpuSpec(23.55, other_used_gib=4), "0.32.0", {}),
    ]]
    assert all(c.kind is None or c.kind in names for c in cases)
    assert cases[1].ok and cases[1].kind is None and cases[1].phase == "serving"


def test_v0_kv_cache_allocation_runs_out_where_other_processes_hold_memory():
    busy = GpuSpec(total_gib=23.55, other_used_gib=3.5)
    flags = {"--max-model-len": "8192", "--enforce-eager": ""}
    out = simulate(LLAMA_8B, busy, "0.6.6.post1", flags)
    # 0.9 x 23.55 = 21.2 GiB budget, but only 23.55 - 3.5 - 0.4 = 19.65 GiB is there: the cache,
    # sized against the budget, does not fit in what the weights leave
    assert out.kind == Kind.OOM_PROFILE.value and out.phase == "kv_cache"
    assert 0 < out.numbers["tried_to_allocate_mib"] < out.numbers["kv_available_gib"] * 1024
    assert simulate(LLAMA_8B, busy, "0.6.6.post1", {**flags, "--gpu-memory-utilization": "0.85"}).ok
    assert simulate(LLAMA_8B, GpuSpec(total_gib=23.55), "0.6.6.post1", flags).ok      # nobody else: fits
    # 0.6.4 caps the device globally: the budget already lacks the others' memory (and so holds less)
    capped = simulate(LLAMA_8B, busy, "0.6.4", flags)
    assert capped.kind == Kind.KV_CACHE_INSUFFICIENT.value and capped.phase == "kv_cache"
    assert simulate(LLAMA_8B, busy, "0.6.4", {**flags, "--max-model-len": "4096"}).ok


# -- its figures are what vLLM printed, not the plan's -------------------------------------------------
def test_the_emulators_figures_come_from_the_calibration_records_not_the_plan():
    """The fake vLLM (and the benchmark) must be an independent "real vLLM": its calibrated terms are
    read from benchmarks/calibration/records.tsv, and it never imports the plan's memory model."""
    import ast
    from pathlib import Path

    from tests.fakes import emulator

    tree = ast.parse(Path(emulator.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "supervisor" not in imported and "benchmarks" not in imported
    # records 1, 2, 4-8, 10: 0.13-0.14 GiB at TP 1 on an H100, vLLM 0.11 -> the median 0.13
    assert emulator.NON_TORCH_GIB == pytest.approx(0.13)
    # records 3 and 9 (TP 2 on H100s): 0.55 and 0.54 -> 0.42 and 0.41 above the base
    assert emulator.NON_TORCH_TP_GIB[True] == pytest.approx(0.415)
    # record 13 (2 x RTX 4090, 0.7.2): 0.25 -> 0.12 above the base
    assert emulator.NON_TORCH_TP_GIB[False] == pytest.approx(0.12)
    # records 11-12 (RTX 3090, 0.6.4: the global cap counts the CUDA context): 0.35 -> 0.22
    assert emulator.COUNTED_CONTEXT_GIB[False] == pytest.approx(0.22)
    # the dense 0.11 start-ups printed 0.034-0.036 GiB of activation above the forward/sampler peak
    assert 0.03 < emulator.ACT_FIXED_GIB < 0.04
    # "Model loading took 14.99 GiB" for Llama-3.1-8B-Instruct (record 5)
    assert emulator.printed("Llama-3.1-8B-Instruct", "obs_weights_gib") == 14.99


def test_the_fakes_llama_is_what_vllm_printed_for_it():
    from tests.integration.guardrun import LLAMA8B

    assert LLAMA8B["weights_gib"] == 14.99
