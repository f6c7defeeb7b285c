"""first_launch: the flags the guard changes before the very first start."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core import plan as P
from supervisor.core.flags import Flags
from supervisor.facts.model_files import load_model_info

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30
CARD_24 = int(23.55 * GiB)


def model(name: str):
    info = load_model_info(str(MODELS / name))
    assert info is not None
    return info


def launch(name: str, args: list[str] | str = (), *, total: int = CARD_24, free: int | None = None, gpus: int = 1,
           version: str | None = "0.9.2", **kw) -> P.Fit:
    return P.fit_launch(model(name), gpu_total_bytes=total, gpu_free_bytes=total if free is None else free,
                          gpus=gpus, flags=Flags.parse(list(args) if not isinstance(args, str) else args),
                          vllm_version=version, **kw)


def _estimate(fl: P.Fit) -> int:
    """The central estimate a reason states ("about N by the plan's estimate")."""
    return int(fl.reasons["--max-model-len"].split("about ", 1)[1].split(" ", 1)[0])


# The budgets below are written out from vLLM 0.9.2's arithmetic (docs/memory-model.md), not asked of
# the code: a 24 GB card (CUDA total 23.55 GiB) at the default 0.90, the profile of a < 70 GiB GPU
# (2048 tokens over 256 requests), the sort-based sampler (38 B per logits element), graphs outside.
REQUESTED_24 = -(-CARD_24 * 9 // 10)                       # ceil(total x 0.90)
LLAMA8B = dict(weights=16_060_522_496 + 131_072 * 128 * 2,  # the index + the rotary cache (131072 x 128, bf16)
               sampler=256 * 128_256 * 38 + 2048 * 4096 * 2 + 2 * 256 * 4096 * 2,
               forward=2048 * (3 * 14_336 + 3 * 4096) * 2, per_token=32 * 8 * 128 * 2 * 2)
QWEN32B_AWQ = dict(weights=19_328_804_864 + 32_768 * 128 * 2,
                   sampler=256 * 152_064 * 38 + 2048 * 5120 * 2 + 2 * 256 * 5120 * 2,
                   forward=2048 * (3 * 27_648 + 3 * 5120) * 2, per_token=64 * 8 * 128 * 2 * 2)
ACT_FIXED = int(0.04 * GiB)             # the fitted constant (benchmarks/accuracy.fit)
NON_TORCH_TP1_0_11 = int(0.13 * GiB)    # calibration records 5-8: 0.13-0.14 GiB printed


def written_budget(m: dict, requested: int = REQUESTED_24) -> tuple[int, int]:
    """(KV bytes, the band) at 0.9.2: requested - weights - activation - non-torch; the band is 10% of the
    overhead (at least 0.1 GiB) and 0.2% of weights whose size was read."""
    activation = max(m["sampler"], m["forward"]) + ACT_FIXED
    overhead = activation + NON_TORCH_TP1_0_11
    band = int(max(0.10 * overhead, 0.10 * GiB) + 0.002 * m["weights"])
    return requested - m["weights"] - overhead, band


def test_llama_8b_on_24gb_gets_a_fitting_context():
    fl = launch("Llama-3.1-8B-Instruct")
    assert fl.confident and fl.certain
    mml = int(fl.flags["--max-model-len"])
    kv, band = written_budget(LLAMA8B)
    # the safe KV (the estimate less its band, and at least 3% of it), block-aligned; the estimate is said
    per_block = 16 * LLAMA8B["per_token"]
    assert _estimate(fl) == pytest.approx(kv // per_block * 16, abs=16)
    assert mml == pytest.approx(min(kv - band, int(kv * 0.97)) // per_block * 16, abs=16)
    assert 36_000 < mml < _estimate(fl) < 40_000
    assert "error band held back" in fl.reasons["--max-model-len"]


def test_a_model_that_fits_changes_nothing():
    fl = launch("Qwen2.5-7B-Instruct")             # 32,768 derived, ~105K capacity
    assert fl.flags == {} and fl.confident


def test_never_above_what_the_user_asked():
    fl = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "8192"])
    assert fl.flags == {}
    fl = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "100k"])
    assert int(fl.flags["--max-model-len"]) < 100_000


def test_auto_fit_is_left_to_vllm():
    assert "--max-model-len" not in launch("Llama-3.1-8B-Instruct", ["--max-model-len", "auto"]).flags


@pytest.mark.parametrize("version", ["0.14.0", "0.32.0"])
def test_from_0_14_an_estimated_cut_is_left_to_vllms_measurement(version):
    fl = launch("Llama-3.1-8B-Instruct", version=version)
    assert fl.flags["--max-model-len"] == "auto"
    why = fl.reasons["--max-model-len"]
    assert why.startswith("131072 tokens do not fit") and "held between 2048 and 131072" in why
    # the estimate is still said: "about N by the plan's estimate" (0.17+ samples in place: more KV)
    assert 30_000 < _estimate(fl) < 50_000
    pinned = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "100k"], version=version)
    assert pinned.flags["--max-model-len"] == "auto" and "and 100000" in pinned.reasons["--max-model-len"]


@pytest.mark.parametrize("version", ["0.13.0", None])
def test_before_0_14_or_an_unknown_vllm_gets_the_estimate(version):
    fl = launch("Llama-3.1-8B-Instruct", version=version)
    assert fl.flags["--max-model-len"].isdigit()        # "auto" is refused before 0.14


def test_an_exact_budget_gets_a_number_even_from_0_14():
    # --kv-cache-memory-bytes fixes the KV cache: the plan's length is exact, vLLM has nothing to add
    fl = launch("Llama-3.1-8B-Instruct", ["--kv-cache-memory-bytes", str(4 * GiB)], version="0.32.0")
    length = fl.flags["--max-model-len"]
    assert length.isdigit() and 32768 - 16 <= int(length) <= 32768     # 4 GiB at 128 KiB a token
    assert "held back" not in fl.reasons["--max-model-len"]


def test_busy_gpu_lowers_utilization():
    fl = launch("Qwen2.5-7B-Instruct", total=CARD_24, free=CARD_24 - 4 * GiB, version="0.20.0")
    # (19.55 free - 0.4 CUDA context) / 23.55 = 0.813, less the 0.005 margin -> 0.80
    assert fl.flags["--gpu-memory-utilization"] == "0.8"
    assert "free" in fl.reasons["--gpu-memory-utilization"]


def test_busy_gpu_before_0_20_leaves_room_for_cuda_graphs():
    fl = launch("Qwen2.5-7B-Instruct", total=CARD_24, free=CARD_24 - 4 * GiB, version="0.9.2")
    # graphs before 0.11: [1, 2, 4] + 8..512 step 8 = 67 sizes, PIECEWISE only; the estimate fitted on the
    # 0.19 sweep's captures is 0.36 GiB + 0.161 MiB per graph and layer (28 layers), and 30% more is left
    graphs = 0.36 + 67 * 28 * 0.161 / 1024
    room = 1.3 * graphs
    assert room == pytest.approx(0.85, abs=0.01)
    # 19.55 GiB free - the graphs' room - 0.4 GiB of vLLM's CUDA context, over the 23.55 GiB total
    assert fl.flags["--gpu-memory-utilization"] == "0.77"                 # floor((19.55 - 0.85 - 0.4) / 23.55)
    assert "CUDA graphs" in fl.reasons["--gpu-memory-utilization"]
    eager = launch("Qwen2.5-7B-Instruct", ["--enforce-eager"], total=CARD_24,
                   free=CARD_24 - 4 * GiB, version="0.9.2")
    assert eager.flags["--gpu-memory-utilization"] == "0.8"                 # (19.55 - 0.4) / 23.55 - 0.005


def test_busy_gpu_on_a_global_cap_version_keeps_utilization():
    fl = launch("Qwen2.5-7B-Instruct", free=CARD_24 - 4 * GiB, version="0.9.0")
    assert "--gpu-memory-utilization" not in fl.flags


def test_busy_gpu_with_the_extensible_kv_cache_keeps_utilization():
    # 0.34's extensible KV cache has no start-up free-memory check: its share is a cap and what is free binds
    fl = launch("Qwen2.5-7B-Instruct", free=CARD_24 - 4 * GiB, version="0.34.0")
    assert "--gpu-memory-utilization" not in fl.flags
    off = launch("Qwen2.5-7B-Instruct", ["--no-enable-extensible-kv-cache"], free=CARD_24 - 4 * GiB, version="0.34.0")
    assert off.flags["--gpu-memory-utilization"] == "0.8"          # as from 0.20: (19.55 - 0.4) / 23.55 - 0.005


def test_user_utilization_is_respected_when_free():
    fl = launch("Llama-3.1-8B-Instruct", ["--gpu-memory-utilization", "0.95"])
    assert "--gpu-memory-utilization" not in fl.flags
    assert int(fl.flags["--max-model-len"]) > int(launch("Llama-3.1-8B-Instruct").flags["--max-model-len"])


def test_below_min_len_tries_fp8_where_supported():
    # Qwen2.5-32B-AWQ on 24 GB: ~6.6K fit in bf16, ~13.2K in fp8
    fl = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=12_000, compute_capability=(8, 9))
    assert fl.flags.get("--kv-cache-dtype") == "fp8"
    assert 12_000 <= int(fl.flags["--max-model-len"]) < 16_000
    # the safe end of the band is below the floor, the estimate above: the floor, and not certain
    assert int(fl.flags["--max-model-len"]) == 12_000 and not fl.certain


def test_fp8_is_not_added_where_the_band_says_the_floor_may_fit_without_it():
    kv, band = written_budget(QWEN32B_AWQ)
    per_token = QWEN32B_AWQ["per_token"]
    central, upper = kv // per_token, (kv + band) // per_token
    assert 5_500 < central < upper < 8_000
    floor = (central + upper) // 2                      # above the estimate, below its upper end
    fl = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=floor, compute_capability=(8, 9))
    assert "--kv-cache-dtype" not in fl.flags and not fl.certain
    sure = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=upper + 256, compute_capability=(8, 9))
    assert sure.flags.get("--kv-cache-dtype") == "fp8"


def test_eager_mode_only_where_graphs_are_in_the_budget_and_nothing_else_fits():
    # 0.32, fp8 not supported (Ampere): graphs inside the budget; eager gives their memory to the KV cache.
    # 0.32's graphs at 2048 tokens / 256 requests: 51 PIECEWISE sizes (1, 2, 4, 8..248 by 8, 256..512 by 16)
    # and 35 FULL ones (up to 256), 64 layers: 0.36 GiB + 86 x 64 x 0.161 MiB
    graphs = int((0.36 + 86 * 64 * 0.161 / 1024) * GiB)
    assert graphs / GiB == pytest.approx(1.23, abs=0.01)
    per_token = QWEN32B_AWQ["per_token"]
    fl_graphs = launch("Qwen2.5-32B-Instruct-AWQ", compute_capability=(8, 6), version="0.32.0")
    with_graphs = _estimate(fl_graphs)
    # 0.32's band: 25% of the overhead -- FlashInfer's sampler (256 x 152064 x 14 B and the forward's output),
    # 0.25 GiB non-torch, the graphs -- and 0.2% of the weights
    activation = 256 * 152_064 * 14 + 2048 * 5120 * 2 + 2 * 256 * 5120 * 2 + ACT_FIXED
    band = 0.25 * (activation + int(0.25 * GiB) + graphs) + 0.002 * QWEN32B_AWQ["weights"]
    # a floor above what fits with graphs even at the band's upper end, below what eager mode frees
    floor = with_graphs + 3_500
    assert with_graphs + band // per_token < floor < with_graphs + graphs // per_token
    fl = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=floor, compute_capability=(8, 6), version="0.32.0")
    assert "--enforce-eager" in fl.flags and "--kv-cache-dtype" not in fl.flags
    old = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=floor, compute_capability=(8, 6), version="0.19.0")
    assert "--enforce-eager" not in old.flags               # before 0.20 graphs are outside the budget


def test_below_min_len_without_fp8_leaves_flags_alone():
    fl = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=12_000, compute_capability=(8, 6), version="0.13.0")
    assert fl.flags == {} and fl.confident
    fl = launch("Qwen2.5-32B-Instruct-AWQ", min_model_len=12_000)          # capability unknown: no fp8
    assert fl.flags == {}


def test_tensor_parallel_70b_awq_on_two_cards():
    fl = launch("Llama-3.3-70B-Instruct-AWQ", ["-tp", "2"], gpus=2)
    mml = int(fl.flags["--max-model-len"])
    # ~0.7 GiB of KV per GPU, razor thin: the band (NCCL under TP, 0.1 GiB of TP extras) is a third of it
    assert 2048 <= mml < _estimate(fl) and _estimate(fl) == pytest.approx(4_700, rel=0.10)


def test_more_gpus_than_visible_is_not_confident():
    fl = launch("Llama-3.3-70B-Instruct-AWQ", ["-tp", "2"], gpus=1)
    assert fl == P.Fit(confident=False)


def test_missing_inputs_are_not_confident():
    assert not P.fit_launch(None, gpu_total_bytes=CARD_24, gpu_free_bytes=CARD_24, gpus=1,
                              flags=Flags.parse([]), vllm_version=None).confident
    assert not launch("Qwen3-8B", total=0).confident


def test_cpu_backend_with_explicit_kv_space_reproduces_65408():
    fl = launch("tiny-llama-cpu", total=16 * GiB, gpus=0, version="0.32.0", platform="cpu", cpu_kv_space_gib=1)
    # an explicit KV size is exact: no margin is held back
    assert fl.flags == {"--max-model-len": "65408"}
    assert fl.confident


def test_cpu_backend_needs_no_host_size_when_the_kv_space_is_set():
    fl = P.fit_launch(model("tiny-llama-cpu"), gpu_total_bytes=None, gpu_free_bytes=None, gpus=0,
                        flags=Flags.parse([]), vllm_version="0.32.0", platform="cpu", cpu_kv_space_gib=1.0)
    assert fl.flags == {"--max-model-len": "65408"} and fl.confident
    fl = P.fit_launch(model("tiny-llama-cpu"), gpu_total_bytes=None, gpu_free_bytes=None, gpus=0,
                        flags=Flags.parse([]), vllm_version="0.32.0", platform="cpu")
    assert not fl.confident and fl.flags == {}


def test_cpu_backend_fits_when_asked_less():
    fl = launch("tiny-llama-cpu", ["--max-model-len", "4096"], total=16 * GiB, gpus=0, version="0.32.0",
                platform="cpu", cpu_kv_space_gib=1)
    assert fl.flags == {}


def test_v0_profiles_the_context_so_shorter_frees_activation_memory():
    # V0 (24 GB, 0.90): Llama-3.1-8B fits ~26K below the 32K switch (profiled whole), ~39K above it
    # (chunked prefill on); Qwen2.5-32B-AWQ ~6.4K with chunks.
    # 0.6.3 profiles the whole context (26,100 tokens) in one pass: the MLP's 26,100 x (3 x 14336 + 3 x 4096)
    # x 2 B, counted as reserved memory (+5%), beside 0.13 GiB non-torch; what is left holds ~26,100 tokens
    activation = int((26_100 * (3 * 14_336 + 3 * 4096) * 2 + ACT_FIXED) * 1.05)
    kv = REQUESTED_24 - LLAMA8B["weights"] - activation - NON_TORCH_TP1_0_11
    assert kv // LLAMA8B["per_token"] == pytest.approx(26_100, rel=0.02)      # the fixed point
    # otherwise chunked prefill makes all 32768 fit (the ~39K of the chunked profile)
    chunked = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "32768"], version="0.6.3")
    assert chunked.flags == {"--enable-chunked-prefill": None}
    assert "profiles the whole context" in chunked.reasons["--enable-chunked-prefill"]
    above = launch("Llama-3.1-8B-Instruct", version="0.6.3")
    assert _estimate(above) == pytest.approx(39_400, rel=0.05)
    awq = launch("Qwen2.5-32B-Instruct-AWQ", version="0.6.3")
    assert "--enable-chunked-prefill" in awq.flags
    assert 5_000 < int(awq.flags["--max-model-len"]) < _estimate(awq) < 7_000


def test_margin_never_cuts_a_request_the_estimate_says_fits():
    """The margin shrinks a cut; it does not cut a request that fits by the estimate."""
    cut_somewhere = False
    for tenth, version in [(t, v) for t in range(200, 320, 2) for v in ("0.10.2", "0.6.6")]:
        total = int(tenth / 10 * GiB)             # 20.0 .. 31.8 GiB cards, V1 and V0 rules
        exact = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "32768"], total=total,
                       version=version, margin=0.0)
        held = launch("Llama-3.1-8B-Instruct", ["--max-model-len", "32768"], total=total,
                      version=version, margin=0.03)
        if "--max-model-len" not in exact.flags:
            assert "--max-model-len" not in held.flags, tenth
        else:
            cut_somewhere = True
            assert int(held.flags["--max-model-len"]) <= int(exact.flags["--max-model-len"])
    assert cut_somewhere


def test_runtime_fp8_and_float32_size_the_first_launch():
    l4 = int(22.06 * GiB)
    bf16 = launch("Llama-3.1-8B-Instruct", total=l4, version="0.13.0")
    fp8 = launch("Llama-3.1-8B-Instruct", ["--quantization", "fp8"], total=l4, version="0.13.0")
    # the weights vLLM loads (calibration set 2, records 124 and 119): 14.99 GiB in bf16, 8.49 with fp8 at
    # load; the 6.5 GiB go to the KV cache at 128 KiB a token
    gained = int((14.99 - 8.49) * GiB) // (32 * 8 * 128 * 2 * 2)
    assert _estimate(fp8) - _estimate(bf16) == pytest.approx(gained, rel=0.02)
    # float32 doubles the weights (29.98 GiB, record 121): nothing is left on a 22 GiB card
    fp32 = launch("Llama-3.1-8B-Instruct", ["--dtype", "float32"], total=l4, version="0.13.0")
    assert fp32.expect == "no_kv_cache_memory"
