"""The memory math against hand-computed values for real model configs (docs/memory-model.md)."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest

from supervisor.core import gpus as G
from supervisor.core import memory as M
from supervisor.core import vllm as V
from supervisor.core.flags import Flags
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.facts.model_files import load_model_info
from supervisor.facts.nvml import GpuDevice

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30
CARD_24 = int(23.55 * GiB)      # what a "24 GB" RTX 3090/4090 reports


def model(name: str) -> ModelInfo:
    info = load_model_info(str(MODELS / name))
    assert info is not None, name
    return info


# -- KV bytes per token: 2 (K,V) x layers x kv_heads x head_dim x 2 bytes, by hand -------------

@pytest.mark.parametrize("name, expected", [
    ("Qwen2.5-7B-Instruct", 2 * 28 * 4 * 128 * 2),          # 57,344
    ("Qwen2.5-32B-Instruct", 2 * 64 * 8 * 128 * 2),         # 262,144
    ("Qwen2.5-32B-Instruct-AWQ", 262_144),                  # AWQ keeps fp16 KV
    ("Llama-3.1-8B-Instruct", 2 * 32 * 8 * 128 * 2),        # 131,072
    ("Llama-3.3-70B-Instruct", 2 * 80 * 8 * 128 * 2),       # 327,680
    ("Qwen3-8B", 2 * 36 * 8 * 128 * 2),                     # 147,456
    ("Mistral-7B-v0.3", 131_072),
    ("DeepSeek-V2-Lite", 27 * (512 + 64) * 2),              # MLA latent: 31,104
    ("gpt-oss-20b", 2 * 24 * 8 * 64 * 2),                   # all 24 layers: 49,152
])
def test_kv_bytes_per_token_matches_hand_values(name, expected):
    assert M.kv_bytes_per_token(model(name)) == expected


def test_the_numbers_the_issue_names():
    assert M.kv_bytes_per_token(model("Qwen2.5-7B-Instruct")) == 57_344
    assert M.kv_bytes_per_token(model("Qwen2.5-32B-Instruct")) == 262_144
    assert M.kv_bytes_per_token(model("Llama-3.1-8B-Instruct")) == 131_072
    assert M.kv_bytes_per_token(model("Llama-3.3-70B-Instruct")) == 327_680
    assert M.kv_bytes_per_token(model("Llama-3.3-70B-Instruct"), tp=2) == 163_840
    assert M.kv_bytes_per_token(model("DeepSeek-V2-Lite")) == 31_104


def test_fp8_halves_the_kv_cache():
    assert M.kv_bytes_per_token(model("Llama-3.1-8B-Instruct"), kv_cache_dtype="fp8") == 65_536
    assert M.kv_bytes_per_token(model("DeepSeek-V2-Lite"), kv_cache_dtype="fp8_e4m3") == 15_552


def test_mla_latent_is_replicated_on_every_tp_rank():
    assert M.kv_bytes_per_token(model("DeepSeek-V2-Lite"), tp=2) == 31_104


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    # Qwen2.5-7B has 4 KV heads: TP=8 stores one head per rank, so per-rank KV is /4, not /8.
    assert M.kv_bytes_per_token(model("Qwen2.5-7B-Instruct"), tp=8) == 2 * 28 * 1 * 128 * 2


def test_hybrid_model_counts_full_layers_separately():
    assert M.kv_bytes_per_token(model("gpt-oss-20b"), full_layers_only=True) == 24_576


def test_float32_runs_as_16_bit_unless_asked():
    tiny = model("tiny-llama-cpu")            # config says float32; vLLM downcasts on auto
    assert M.kv_bytes_per_token(tiny) == 2 * 8 * 8 * 64 * 2
    assert M.kv_bytes_per_token(tiny, dtype="float32") == 2 * 8 * 8 * 64 * 4


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(ValueError):
        M.kv_bytes_per_token(model("Qwen3-8B"), kv_cache_dtype="nvfp4")


# -- fitting max_model_len: vLLM's closed form floor(kv / (block * page * layers)) * block ---------

def test_fit_closed_form_before_and_after_the_null_block():
    llama = model("Llama-3.1-8B-Instruct")
    # 5 GiB / (16 tokens * 131,072 B) = 2,560 blocks -> 40,960 tokens (0.28);
    # 0.29+ holds back one block of all layers (2 MiB) first -> 2,559 blocks.
    assert M.fit_max_model_len(5 * GiB, llama, vllm_version="0.28.0") == 40_960
    assert M.fit_max_model_len(5 * GiB, llama, vllm_version="0.29.0") == 40_944


def test_fit_is_block_aligned_and_capped_at_upper():
    qwen = model("Qwen2.5-7B-Instruct")
    fit = M.fit_max_model_len(3 * GiB + 12345, qwen, vllm_version="0.9.2")
    assert fit % 16 == 0
    assert fit == (3 * GiB + 12345) // (16 * 57_344) * 16
    assert M.fit_max_model_len(3 * GiB, qwen, vllm_version="0.9.2", upper=32_768) == 32_768


def test_fit_with_tensor_parallel_uses_per_rank_bytes():
    llama70 = model("Llama-3.3-70B-Instruct")
    # per GPU 163,840 B/token: 2 GiB / (16 * 163,840) = 819.2 -> 819 blocks
    assert M.fit_max_model_len(2 * GiB, llama70, tp=2, vllm_version="0.9.2") == 819 * 16


def test_fit_for_mla():
    ds = model("DeepSeek-V2-Lite")
    # page per layer = 16 * 576 * 2 = 18,432 B; 27 layers -> 497,664 B per block
    assert M.fit_max_model_len(GiB, ds, vllm_version="0.9.2") == GiB // 497_664 * 16
    assert M.fit_max_model_len(GiB, ds, vllm_version="0.9.2", block_size=64) == GiB // (497_664 * 4) * 64


def test_fit_is_zero_when_nothing_fits():
    assert M.fit_max_model_len(0, model("Qwen3-8B")) == 0
    assert M.fit_max_model_len(-5 * GiB, model("Qwen3-8B")) == 0


def test_cpu_tiny_model_reproduces_vllm_0_32_estimate():
    """vLLM CPU 0.32, VLLM_CPU_KVCACHE_SPACE=1, block 128, bf16: 'estimated maximum model length is 65408'."""
    tiny = model("tiny-llama-cpu")
    # page = 2 * 128 * 8 * 64 * 2 = 262,144 B/layer; 8 layers = 2 MiB/block; 1 GiB = 512 blocks, minus the null block
    assert M.fit_max_model_len(GiB, tiny, block_size=128, vllm_version="0.32.0") == 511 * 128 == 65_408
    assert M.fit_max_model_len(GiB, tiny, block_size=128, vllm_version="0.28.0") == 65_536
    assert V.default_block_size(mla=tiny.mla, platform="cpu") == 128


def test_sliding_window_need_matches_the_hand_computed_gpt_oss_figure():
    oss = model("gpt-oss-20b")
    # 12 full layers * cdiv(131072,16) + 12 sliding * (cdiv(min(127+2048, L),16) + 1) blocks, 32 KiB each
    blocks = 12 * 8192 + 12 * (-(-2175 // 16) + 1)
    assert M.kv_needed_bytes(oss, 131_072, max_num_batched_tokens=2048) == blocks * 2 * 16 * 8 * 64 * 2
    assert round(blocks * 32768 / GiB, 2) == 3.05


def test_hybrid_fit_is_vllms_binary_search_bound():
    oss = model("gpt-oss-20b")
    need = M.kv_needed_bytes(oss, 65_536, max_num_batched_tokens=2048)
    null_block = 12 * 32_768        # one block id spans a group of 12 layers
    kw = dict(vllm_version="0.32.0", within_kv_cache=False)
    assert M.fit_max_model_len(need + null_block, oss, **kw) == 65_536
    assert M.fit_max_model_len(need + null_block - 1, oss, **kw) < 65_536


def test_the_plans_length_never_exceeds_the_kv_cache_size_vllm_prints():
    """vLLM accepts one 65,536-token request on this budget, but prints its KV cache as 33,872 tokens
    (``_report_kv_cache_config``: blocks // groups x block size), and the plan offers no more than that."""
    oss = model("gpt-oss-20b")
    budget = M.kv_needed_bytes(oss, 65_536, max_num_batched_tokens=2048) + 12 * 32_768
    # 24 layers: 12 full + 12 sliding -> 2 groups of 12; a block id spans 12 pages of 2*16*8*64*2 = 32,768 B
    blocks = budget // (12 * 32_768)
    printed = blocks // 2 * 16
    assert printed == 33_872
    assert M.kv_cache_tokens(budget, oss, vllm_version="0.32.0") == printed
    assert M.fit_max_model_len(budget, oss, vllm_version="0.32.0") == printed
    # with the hybrid manager off (V0 or the flag) every layer holds every token
    assert M.fit_max_model_len(4 * GiB, oss, hybrid=False, vllm_version="0.28.0") == 4 * GiB // (16 * 49_152) * 16


# -- derived max_model_len -----------------------------------------------------------------------

def _with(info: ModelInfo, **kw) -> ModelInfo:
    return dataclasses.replace(info, **kw)


def test_derived_lengths_of_the_fixtures():
    assert model("Qwen2.5-7B-Instruct").derived_max_model_len == 32_768
    assert model("Llama-3.1-8B-Instruct").derived_max_model_len == 131_072    # llama3 rope: no change
    assert model("Qwen3-8B").derived_max_model_len == 40_960
    assert model("DeepSeek-V2-Lite").derived_max_model_len == 163_840


def test_yarn_rule_depends_on_the_vllm_version():
    qwen = _with(model("Qwen2.5-7B-Instruct"),
                 rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert derive_max_model_len(qwen, "0.29.0") == 131_072      # original x factor
    assert derive_max_model_len(qwen, "0.30.0") == 32_768       # YaRN leaves max_position_embeddings alone
    assert derive_max_model_len(qwen, None) == 32_768           # unknown: the newest rule
    ds = model("DeepSeek-V2-Lite")                              # yarn 40 x 4096 = 163840 either way
    assert derive_max_model_len(ds, "0.9.2") == derive_max_model_len(ds, "0.33.0") == 163_840


def test_other_rope_types_multiply_and_gemma3_is_excluded():
    base = model("Mistral-7B-v0.3")
    assert derive_max_model_len(_with(base, rope_scaling={"rope_type": "linear", "factor": 2.0})) == 65_536
    assert derive_max_model_len(_with(base, rope_scaling={"rope_type": "dynamic", "factor": 4})) == 131_072
    assert derive_max_model_len(_with(base, rope_scaling={"rope_type": "longrope", "factor": 4})) == 32_768
    assert derive_max_model_len(_with(base, model_type="gemma3_text",
                                      rope_scaling={"rope_type": "linear", "factor": 8})) == 32_768


def test_smallest_key_wins_and_model_max_length_replaces():
    base = model("Mistral-7B-v0.3")
    assert derive_max_model_len(_with(base, max_len_keys={"max_position_embeddings": 8192, "seq_length": 4096})) == 4096
    assert derive_max_model_len(_with(base, max_len_keys={"max_position_embeddings": 8192,
                                                          "model_max_length": 131072})) == 131_072
    assert derive_max_model_len(_with(base, max_len_keys={})) == 2048


def test_disable_sliding_window_caps_at_the_window():
    base = _with(model("Mistral-7B-v0.3"), sliding_window=4096)
    assert derive_max_model_len(base, disable_sliding_window=True) == 4096


# -- budgets: every term by hand (24 GB card, V1 0.9.2, util 0.90; docs/memory-model.md) ----------

def test_budget_terms_by_hand_for_llama_8b():
    info = model("Llama-3.1-8B-Instruct")
    b = M.kv_budget(info, gpu_total_bytes=CARD_24, utilization=0.90, vllm_version="0.9.2")
    assert (b.max_num_batched_tokens, b.max_num_seqs, b.family) == (2048, 256, "v1-0.9")
    # the index's bytes + the rotary cache (131072 positions x 128 dims x 2 B)
    assert b.weights_bytes == pytest.approx(16_060_522_496 + 131072 * 128 * 2, abs=2)
    # the sampler over min(2048, 256) rows: 38 B per logits element, the forward's output, two row buffers
    sampler = 256 * 128256 * 38 + 2048 * 4096 * 2 + 2 * 256 * 4096 * 2
    assert b.activation_bytes == sampler + M.ACT_FIXED_BYTES
    assert b.non_torch_bytes == M.NON_TORCH_BASE_BYTES and b.cudagraph_bytes == 0
    assert b.kv_bytes == math.ceil(CARD_24 * 0.9) - b.weights_bytes - b.activation_bytes - b.non_torch_bytes
    assert b.kv_bytes / GiB == pytest.approx(4.86, abs=0.01)
    # the band: max(10% of the overhead, 0.1 GiB) + 0.2% of the weights (the index is exact)
    assert b.band_bytes == int(max(0.10 * (b.activation_bytes + b.non_torch_bytes), 0.1 * GiB)
                               + 0.002 * b.weights_bytes)
    assert b.safe_kv_bytes == b.kv_bytes - b.band_bytes


def test_v0_forward_pass_dominates_a_long_unchunked_profile():
    info = model("Llama-3.1-8B-Instruct")
    b = M.kv_budget(info, gpu_total_bytes=CARD_24, utilization=0.90, vllm_version="0.6.6", max_model_len=20000)
    assert b.max_num_batched_tokens == 20000
    # one layer's MLP at the down projection: 3 x I + 3 x H per token, 16-bit
    assert b.activation_bytes == 20000 * (3 * 14336 + 3 * 4096) * 2 + M.ACT_FIXED_BYTES


def test_the_sampler_shrinks_from_0_17():
    info = model("Qwen2.5-7B-Instruct")
    kw = dict(gpu_total_bytes=80 * GiB, utilization=0.90)
    old, new = (M.kv_budget(info, vllm_version=v, **kw) for v in ("0.16.0", "0.17.0"))
    # 1024 rows x 152,064 logits: the sort's 38 B per element -> the in-place Triton kernel's 14 B, which keeps
    # one fp32 vocabulary row per SM (min(next power of 2 of min(132 SMs, 1024 rows), 132) = 132 rows)
    assert old.activation_bytes - new.activation_bytes == 1024 * 152064 * (38 - 14) - 132 * 152064 * 4


@pytest.mark.parametrize("version, device, tp, pp, printed_gib", [
    ("0.11.0", "NVIDIA H100 80GB HBM3", 2, 1, 0.54),   # calibration records 3 and 9: 0.55, 0.54
    ("0.10.1", "NVIDIA H100 80GB HBM3", 2, 1, 0.69),   # + NCCL's init buffers inside the budget (a prior 0.15)
    ("0.7.2", "NVIDIA GeForce RTX 4090", 2, 1, 0.25),  # record 13: 0.25 over PCIe
    ("0.19.0", "NVIDIA H100 80GB HBM3", 1, 1, 0.25),   # the 0.19 sweep at TP 1: 0.24-0.27
    ("0.19.0", "NVIDIA H100 80GB HBM3", 2, 1, 2.08),   # TP 2: 2.06-2.11 (the all-reduce fusion's workspaces)
    ("0.19.0", "NVIDIA H100 80GB HBM3", 4, 1, 2.17),   # TP 4: 2.13-2.21
    ("0.19.0", "NVIDIA H100 80GB HBM3", 1, 2, 0.07),   # PP 2 and 4: 0.07
    ("0.19.0", "NVIDIA H100 80GB HBM3", 1, 4, 0.07),
])
def test_non_torch_memory_per_layout_gpu_and_version_matches_the_printed_figures(version, device, tp, pp,
                                                                               printed_gib):
    info = model("Qwen2.5-7B-Instruct")
    b = M.kv_budget(info, gpu_total_bytes=80 * GiB, utilization=0.90, tp=tp, pp=pp, vllm_version=version,
                    device_name=device)
    assert b.non_torch_bytes / GiB == pytest.approx(printed_gib, abs=0.03)


def test_estimated_weights_per_quantization_and_kernel_padding():
    oss = model("gpt-oss-20b")
    # MXFP4 experts padded by the MoE backend: Marlin (unknown backend) more than Triton on Hopper
    marlin = M.weights_per_stage(oss, compute_capability=(9, 0))[0]
    triton = M.weights_per_stage(oss, compute_capability=(9, 0), mxfp4_backend="triton", vllm_version="0.11.0")[0]
    assert marlin > triton > oss.weights_bytes
    assert triton / GiB == pytest.approx(13.47, abs=0.03)        # what vLLM 0.11 printed on an H100


def test_pipeline_stages_split_the_layers_and_the_least_kv_stage_sets_the_budget():
    assert M.stage_layers(80, 3) == [27, 27, 26]
    assert M.stage_layers(32, 2) == [16, 16]
    info = model("Llama-3.3-70B-Instruct")
    b = M.kv_budget(info, gpu_total_bytes=80 * GiB, utilization=0.9, pp=2, vllm_version="0.11.0")
    stages = M.weights_per_stage(info, pp=2)
    assert b.weights_bytes in stages and abs(stages[0] - stages[1]) < 3 * GiB


def test_a_measured_overhead_replaces_the_estimate():
    info = model("Llama-3.1-8B-Instruct")
    kw = dict(gpu_total_bytes=CARD_24, utilization=0.90, vllm_version="0.9.2")
    est = M.kv_budget(info, **kw)
    # a healthy launch printed 14.99 GiB of weights and 4.50 GiB of KV cache
    overhead = M.measured_overhead_bytes(gpu_total_bytes=CARD_24, utilization=0.90, weights_bytes=int(14.99 * GiB),
                                         available_kv_bytes=int(4.50 * GiB))
    assert overhead == math.ceil(CARD_24 * 0.9) - int(14.99 * GiB) - int(4.50 * GiB)
    got = M.kv_budget(info, measured_overhead_bytes=overhead, measured_weights_bytes=int(14.99 * GiB), **kw)
    assert got.measured and got.kv_bytes == int(4.50 * GiB)
    assert got.band_bytes < est.band_bytes
    # the same from the blocks V0 prints ("# GPU blocks: N") or the tokens V1 prints
    blocks = int(4.50 * GiB) // (16 * 131072)
    by_blocks = M.measured_overhead_bytes(gpu_total_bytes=CARD_24, utilization=0.90, weights_bytes=int(14.99 * GiB),
                                          num_gpu_blocks=blocks, info=info)
    by_tokens = M.measured_overhead_bytes(gpu_total_bytes=CARD_24, utilization=0.90, weights_bytes=int(14.99 * GiB),
                                          kv_cache_tokens=blocks * 16, info=info)
    assert by_blocks == by_tokens and 0 <= by_blocks - overhead < 16 * 131072
    assert M.measured_overhead_bytes(gpu_total_bytes=CARD_24, utilization=0.9, weights_bytes=1) is None


def test_cudagraph_reserve_from_0_20_unless_eager():
    info = model("Llama-3.1-8B-Instruct")
    kw = dict(gpu_total_bytes=CARD_24, utilization=0.90)
    old = M.kv_budget(info, vllm_version="0.19.0", **kw)
    assert old.cudagraph_bytes == 0 and old.cudagraph_outside_bytes > 0       # captured after, outside
    new = M.kv_budget(info, vllm_version="0.20.0", **kw)
    assert new.cudagraph_bytes > 0
    assert M.kv_budget(info, vllm_version="0.20.0", enforce_eager=True, **kw).cudagraph_bytes == 0
    # on an H100 (8192 tokens, 1024 requests: the same 102 graphs as 0.19) the estimate is what the 0.19
    # sweep's Llama-3.1-8B captures took: "Actual usage ... 0.91 GiB for CUDAGraph memory" (record 124)
    h100 = M.kv_budget(info, gpu_total_bytes=int(79.19 * GiB), utilization=0.95, vllm_version="0.20.0",
                       device_name="NVIDIA H100 80GB HBM3")
    assert h100.cudagraph_bytes / GiB == pytest.approx(0.91, abs=0.06)


def test_global_cap_versions_subtract_other_processes():
    info = model("Qwen2.5-7B-Instruct")
    kw = dict(gpu_total_bytes=CARD_24, utilization=0.90, other_used_bytes=2 * GiB)
    assert M.kv_budget(info, vllm_version="0.9.0", **kw).other_processes_bytes == 2 * GiB
    assert M.kv_budget(info, vllm_version="0.9.1", **kw).other_processes_bytes == 0


def test_batch_defaults_follow_the_device_size():
    assert V.batch_defaults(int(23.5 * GiB), vllm_version="0.9.2") == (2048, 256)
    assert V.batch_defaults(80 * GiB, vllm_version="0.9.2") == (8192, 1024)
    assert V.batch_defaults(80 * GiB, vllm_version="0.9.2", device_name="NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert V.batch_defaults(80 * GiB, vllm_version="0.8.5", device_name="NVIDIA A100-SXM4-80GB") == (8192, 1024)
    assert V.batch_defaults(80 * GiB, vllm_version="0.8.3", device_name="NVIDIA H100 80GB HBM3") == (8192, 1024)
    assert V.batch_defaults(80 * GiB, vllm_version="0.8.3", device_name="NVIDIA L40S") == (2048, 1024)
    assert V.batch_defaults(180 * GiB, vllm_version="0.32.0") == (16384, 1024)
    assert V.batch_defaults(180 * GiB, vllm_version="0.28.0") == (16384, 1024)
    assert V.batch_defaults(180 * GiB, vllm_version="0.27.1") == (8192, 1024)
    assert V.batch_defaults(80 * GiB, vllm_version="0.32.0", max_model_len=4) == (4096, 1024)   # seqs x length
    assert V.batch_defaults(24 * GiB, vllm_version="0.6.3", max_model_len=16384) == (16384, 256)   # V0 profiles L
    assert V.batch_defaults(24 * GiB, vllm_version="0.6.3", max_model_len=65536) == (512, 256)     # chunked
    assert V.batch_defaults(24 * GiB, vllm_version="0.6.5", max_model_len=65536) == (2048, 256)
    assert V.batch_defaults(0, platform="cpu") == (2048, 128)


def test_version_families():
    assert [V.family(v) for v in ("0.5.5", "0.6.4.post1", "0.6.5", "0.7.3", "0.8.4", "0.9.1", "0.10.2", "0.11.0",
                                  "0.19.1", "0.20.0", "0.26.0", "0.27.0", "0.33.0", "0.34.0", None)] == [
        "v0-free", "v0-global", "v0-profiled", "v0-profiled", "v1-global", "v1-0.9", "v1-0.9", "v1-0.11",
        "v1-0.11", "v1-0.20", "v1-0.20", "v1-0.27", "v1-0.27", "v1-0.34x", "v1-0.34x"]
    # 0.34 without the extensible KV cache (turned off, or the CPU backend) sizes it as 0.27-0.33 did
    assert V.family("0.34.0", extensible=False) == V.family("0.34.0", platform="cpu") == "v1-0.27"
    assert V.sampler_bytes_per_element("0.6.2") == 40 and V.sampler_bytes_per_element("0.11.0") == 38
    assert V.sampler_bytes_per_element("0.10.1", flashinfer=True) == 14
    assert V.sampler_bytes_per_element("0.17.0", rows=4) == 38 and V.sampler_bytes_per_element("0.21.0") == 14


def test_default_utilization_by_version():
    assert V.default_utilization("0.9.2") == 0.90
    assert V.default_utilization("0.20.0") == 0.92 and V.default_utilization("0.33.0") == 0.92
    # 0.34 (CacheConfig.resolved_gpu_memory_utilization): 1.0 with the extensible KV cache, its default on a GPU;
    # an unknown version is planned as the newest
    assert V.default_utilization("0.34.0") == 1.0 and V.default_utilization(None) == 1.0
    for off in ("--kv-cache-memory-bytes 8589934592", "--num-gpu-blocks-override 1000",
                "--no-enable-extensible-kv-cache", "--disable-extensible-kv-cache",
                "--enable-extensible-kv-cache --no-enable-extensible-kv-cache"):
        assert V.default_utilization("0.34.0", Flags.parse(off)) == 0.92, off
    assert V.default_utilization("0.34.0", Flags.parse("--enable-extensible-kv-cache")) == 1.0
    assert V.default_utilization("0.34.0", platform="cpu") == 0.92          # CUDA and ROCm only
    assert V.utilization("0.34.0", Flags.parse("--gpu-memory-utilization 0.8")) == 0.8
    assert V.checks_free_memory("0.33.0") and not V.checks_free_memory("0.34.0")
    assert V.checks_free_memory("0.34.0", Flags.parse("--no-enable-extensible-kv-cache"))


def test_the_extensible_kv_cache_is_capped_by_what_was_free_at_start_up():
    """0.34 sizes the cache after warm-up and capture (extensible_kv_cache.py: measure_kv_cache_bytes):
    min(total x utilization, free at start-up - margin) less all vLLM holds but the cache, less the transient
    peak; the margin is max(1 GiB, 0.75 x that peak), and vLLM's free figure lacks its own CUDA context."""
    llama = model("Llama-3.1-8B-Instruct")
    total = int(79.19 * GiB)

    def kv(util: float, others: int = 0, **kw) -> M.Budget:
        return M.kv_budget(llama, gpu_total_bytes=total, utilization=util, vllm_version="0.34.0",
                           other_used_bytes=others, **kw)

    b = kv(1.0)
    assert b.family == "v1-0.34x"
    margin = max(GiB, int(0.75 * b.activation_bytes))
    assert kv(1.0, extensible=False).kv_bytes - b.kv_bytes == int(0.4 * GiB) + margin
    assert kv(1.0, others=10 * GiB).kv_bytes == b.kv_bytes - 10 * GiB      # every byte others hold
    assert kv(0.5).kv_bytes == kv(0.5, extensible=False).kv_bytes          # a low cap binds first
    assert b.cudagraph_bytes > 0
    assert kv(1.0, enforce_eager=True).kv_bytes - b.kv_bytes == b.cudagraph_bytes
    # the parts still add up to the budget: what the cap withholds is counted with other processes
    assert (b.weights_bytes + b.overhead_bytes + b.other_processes_bytes + b.kv_bytes) == b.requested_bytes


def test_max_concurrency_is_tokens_over_context():
    llama = model("Llama-3.1-8B-Instruct")
    # 4 GiB at 0.28: 2048 blocks = 32,768 tokens -> 8 requests of 4096, 1 of 32768
    assert M.max_concurrency(4 * GiB, llama, 4096, vllm_version="0.28.0") == 8.0
    assert M.max_concurrency(4 * GiB, llama, 32768, vllm_version="0.28.0") == 1.0


# -- GPUs ---------------------------------------------------------------------------------------

def _dev(i: int, free_gib: float, total_gib: float = 24.0) -> GpuDevice:
    total = int(total_gib * GiB)
    free = int(free_gib * GiB)
    return GpuDevice(i, "NVIDIA GeForce RTX 4090", total, total - free, free, (8, 9), ())


def test_check_gpu_count():
    assert G.check_gpu_count(1, 1) is None
    msg = G.check_gpu_count(2, 1)
    assert msg is not None and "2" in msg and "1 is visible" in msg
    assert G.check_gpu_count(4, 0) is not None


def test_sizing_device_is_the_least_free_of_the_first_n():
    devs = [_dev(0, 20), _dev(1, 12), _dev(2, 2)]
    assert G.sizing_device(devs, 2).index == 1       # device 2 is not used at TP=2
    assert G.sizing_device(devs, 3).index == 2
    assert G.sizing_device([], 1) is None


REAL_TINY = Path(os.environ.get("VLLM_GUARD_TINY_MODEL", "~/.cache/vllm-guard/tiny-llama")).expanduser()


@pytest.mark.skipif(not (REAL_TINY / "config.json").exists(), reason="scripts/make-tiny-model has not run here")
def test_the_real_tiny_model_plans_what_vllm_cpu_0_32_logged():
    """tests/fixtures/logs/real-0.32: 'the estimated maximum model length is 65408' with VLLM_CPU_KVCACHE_SPACE=1."""
    tiny = load_model_info(str(REAL_TINY))
    assert tiny is not None and tiny.derived_max_model_len == 131_072
    assert M.fit_max_model_len(GiB, tiny, block_size=128, vllm_version="0.32.0") == 65_408
    # "Maximum concurrency for 65,408 tokens per request: 1.00x"
    assert M.max_concurrency(GiB, tiny, 65_408, block_size=128, vllm_version="0.32.0") == 1.0


# -- bitsandbytes: the skip list is per module ------------------------------------------------------

QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def _bnb(skip: list[str]) -> dict:
    return {**QWEN_05B, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                                "llm_int8_skip_modules": skip}}


def test_bitsandbytes_skips_only_the_modules_it_names():
    from supervisor.core.model import model_info_from_config

    # parameters of one layer: attention q/o 896x896 each, k/v 896x128 each, q/k/v biases; MLP 3 x 896 x 4864
    attn = 2 * 896 * 896 + 2 * 896 * 128 + (896 + 2 * 128)
    mlp = 3 * 896 * 4864
    embed = 151_936 * 896                              # tied: one 16-bit matrix
    norms = 24 * 2 * 896 + 896
    nf4 = 0.5 + 4 / 64                                 # 4-bit weights, fp32 absmax per 64 (dequantized at load)

    def expected(attn16: int, mlp16: int) -> float:
        return (embed * 2 + norms * 2 + attn16 * attn * 2 + (24 - attn16) * attn * nf4
                + mlp16 * mlp * 2 + (24 - mlp16) * mlp * nf4)

    # unsloth's dynamic 4-bit checkpoints list single layers; each applies to that layer alone
    few = model_info_from_config(_bnb(["lm_head", "model.layers.0.mlp", "model.layers.3.mlp",
                                       "model.layers.1.self_attn"]))
    assert few.weights_bytes == pytest.approx(expected(1, 2), rel=0.002)
    # a module kind without a layer applies to every layer
    every_mlp = model_info_from_config(_bnb(["mlp"]))
    assert every_mlp.weights_bytes == pytest.approx(expected(0, 24), rel=0.002)
    none = model_info_from_config(_bnb([]))
    assert none.weights_bytes == pytest.approx(expected(0, 0), rel=0.002)


# -- the plan's length is one vLLM accepts and no more than it prints -----------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LAYOUTS = ["gpt-oss-20b", "Llama-3.1-8B-Instruct", "DeepSeek-V2-Lite", "Qwen3-8B", "Mistral-7B-v0.3"]
_CAL = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration-llmd" / "models"


def _any_model(name: str) -> ModelInfo:
    path = MODELS / name if (MODELS / name).exists() else _CAL / name
    info = load_model_info(str(path))
    assert info is not None
    return info


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(_LAYOUTS + ["gemma-3-4b-it", "gemma-2-9b-it", "Llama-4-Scout-17B-16E-Instruct"]),
       budget_mib=st.integers(min_value=1, max_value=80_000), tp=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2]), batched=st.sampled_from([2048, 8192]),
       version=st.sampled_from(["0.11.0", "0.19.0", "0.32.0"]), kv=st.sampled_from(["auto", "fp8"]))
def test_the_planned_length_is_accepted_by_vllm_and_within_the_kv_cache_it_prints(name, budget_mib, tp, pp, batched,
                                                                                 version, kv):
    info = _any_model(name)
    budget = budget_mib << 20
    kw = dict(tp=tp, pp=pp, kv_cache_dtype=kv, vllm_version=version)
    n = M.fit_max_model_len(budget, info, max_num_batched_tokens=batched, **kw)
    printed = M.kv_cache_tokens(budget, info, **kw)
    assert 0 <= n <= printed
    if n:
        need = M.kv_needed_bytes(info, n, max_num_batched_tokens=batched, tp=tp, pp=pp, kv_cache_dtype=kv)
        assert need <= M.usable_kv_bytes(budget, info, **kw)          # vLLM's own check passes
