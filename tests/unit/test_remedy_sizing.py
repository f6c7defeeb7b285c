"""Remedies that use the model's facts (``Context.sizing``) to fix two things in one relaunch.

Each decision is checked twice: what the policy changes, and (where the emulator models that vLLM)
that the relaunch it asks for serves in the emulator — the second failure it pre-empts does not come.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchmarks import matrix, render
from supervisor.config import RemedyConfig
from supervisor.core import plan as P
from supervisor.core import remedy as R
from supervisor.core import vllm
from supervisor.core.classifier import Classifier
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.facts.model_files import load_model_info
from tests.fakes import emulator as emu

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30
L4_TOTAL = 22.06          # GiB, as torch reports an L4
CONTEXT = render.CONTEXT_GIB   # the emulator's CUDA context


def sizing(name: str, version: str, gpus: int = 1) -> P.Sizing:
    info = load_model_info(str(MODELS / name))
    assert info is not None
    return P.Sizing(info, gpus=gpus, vllm_version=version, compute_capability=(8, 9), device_name="NVIDIA L4")


def serves(name: str, version: str, flags: Flags, other_gib: float = 0.0, count: int = 1):
    """The emulator's verdict on one launch, set up as the benchmark sets it up."""
    model = matrix.Model(name, name, str(MODELS / name))
    gpu = emu.GpuSpec(total_gib=L4_TOTAL, other_used_gib=other_gib, cc=(8, 9), count=count)
    return render.simulate(matrix.model_spec(model, version), gpu, version, flags)


def ctx(version: str, sizing_: P.Sizing | None, *, free: float | None = None, total: float | None = L4_TOTAL,
        **kw) -> R.Context:
    return R.Context(vllm_version=version, sizing=sizing_, gpu_total_gib=total, gpu_free_gib=free, **kw)


# -- a busy GPU: free memory and length in one relaunch ----------------------------------------
@pytest.mark.parametrize("version", ["0.10.1.1", "0.32.0"])
def test_free_memory_failure_also_sizes_the_length(version):
    free_printed = round(L4_TOTAL - 3.0 - CONTEXT, 2)      # what vLLM printed: 18.66 of 22.06
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={
        "free_gib": free_printed, "total_gib": L4_TOTAL, "requested_utilization": vllm.default_utilization(version)})
    out = R.decide(d, Flags(), ctx(version, sizing("Llama-3.1-8B-Instruct", version), free=L4_TOTAL - 3.0))
    assert isinstance(out, R.Relaunch)
    util = out.flags.get_float("--gpu-memory-utilization")
    assert util is not None and util * L4_TOTAL <= free_printed          # passes vLLM's start-up check
    assert {c.flag for c in out.changes} == {"--gpu-memory-utilization", "--max-model-len"}
    # 0.14+ sizes the length to the KV cache it measures; before, the plan's estimate is the length
    assert (out.flags.get("--max-model-len") == "auto") == (version == "0.32.0")
    served = serves("Llama-3.1-8B-Instruct", version, out.flags, other_gib=3.0)
    assert served.ok and 8192 <= served.served_max_model_len < 131072


def test_free_memory_without_the_model_changes_only_utilization():
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": 18.66, "total_gib": 22.06,
                                                           "requested_utilization": 0.92})
    out = R.decide(d, Flags(), ctx("0.32.0", None))
    # the printed free memory already lacks vLLM's CUDA context: only the 0.005 margin is held back
    assert out.flags.get("--gpu-memory-utilization") == "0.84"
    assert not out.flags.has("--max-model-len")


def test_free_memory_before_0_20_leaves_room_for_cuda_graphs_without_the_model():
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": 18.66, "total_gib": 22.06,
                                                           "requested_utilization": 0.9})
    graphs = R.decide(d, Flags(), ctx("0.10.1.1", None))
    eager = R.decide(d, Flags.parse("--enforce-eager"), ctx("0.10.1.1", None))
    # (18.66 - 0.5 GiB for graphs) / 22.06 - 0.005 = 0.818 -> 0.81; eager needs no room
    assert graphs.flags.get("--gpu-memory-utilization") == "0.81"
    assert eager.flags.get("--gpu-memory-utilization") == "0.84"


# -- V0: chunked prefill frees the profile's activation memory ---------------------------------
def test_v0_unchunked_profile_gets_chunked_prefill_and_more_context():
    version = "0.6.6.post1"
    flags = Flags.parse("--max-model-len 32768")
    first = serves("Llama-3.1-8B-Instruct", version, flags)
    assert first.kind == "kv_cache_insufficient"
    measured = first.numbers["fit_max_model_len"]            # what V0 printed, profiled at 32768 tokens
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 32768, "fit_max_model_len": measured,
                                                         "vllm_version": version})
    out = R.decide(d, flags, ctx(version, sizing("Llama-3.1-8B-Instruct", version), free=L4_TOTAL,
                                 requested=flags))
    assert out.flags.enabled("--enable-chunked-prefill")
    length = out.flags.get_int("--max-model-len")
    assert measured < length <= 32768                         # more than V0 measured, never above the ask
    assert serves("Llama-3.1-8B-Instruct", version, out.flags).ok

    plain = R.decide(d, flags, ctx(version, None, requested=flags))   # without the model: vLLM's number
    assert plain.flags.get_int("--max-model-len") == measured // 16 * 16


def test_v0_chunked_prefill_alone_when_the_whole_request_then_fits():
    version = "0.6.6.post1"
    first = serves("Qwen2.5-7B-Instruct", version, Flags())
    assert first.kind == "kv_cache_insufficient"             # 32768 profiled at once leaves ~30K
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 32768,
                                                         "fit_max_model_len": first.numbers["fit_max_model_len"],
                                                         "vllm_version": version})
    out = R.decide(d, Flags(), ctx(version, sizing("Qwen2.5-7B-Instruct", version), free=L4_TOTAL))
    assert out.flags.enabled("--enable-chunked-prefill") and not out.flags.has("--max-model-len")
    assert serves("Qwen2.5-7B-Instruct", version, out.flags).served_max_model_len == 32768


def test_v0_busy_gpu_kv_relaunch_leaves_room_for_cuda_graphs():
    version = "0.6.6.post1"
    first = serves("Qwen2.5-7B-Instruct", version, Flags(), other_gib=3.0)
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 32768,
                                                         "fit_max_model_len": first.numbers["fit_max_model_len"],
                                                         "vllm_version": version})
    out = R.decide(d, Flags(), ctx(version, sizing("Qwen2.5-7B-Instruct", version), free=L4_TOTAL - 3.0))
    assert out.flags.get_float("--gpu-memory-utilization") < 0.9
    assert serves("Qwen2.5-7B-Instruct", version, out.flags, other_gib=3.0).ok     # no CUDA-graph OOM next


# -- a remedy that frees memory also cuts the length the plan says cannot fit ----------------
def test_no_kv_memory_raises_utilization_and_sizes_the_length():
    version = "0.32.0"
    flags = Flags.parse("--tensor-parallel-size 2 --max-num-seqs 512")
    assert serves("Llama-3.3-70B-Instruct-AWQ", version, flags, count=2).kind == "no_kv_cache_memory"
    s = sizing("Llama-3.3-70B-Instruct-AWQ", version, gpus=2)
    out = R.decide(Diagnosis(Kind.NO_KV_CACHE_MEMORY), flags, ctx(version, s, free=L4_TOTAL, requested=flags))
    assert out.step == "no_kv:gpu_memory_utilization"
    assert out.flags.get_float("--gpu-memory-utilization") > 0.92
    assert out.flags.get("--max-model-len") == "auto"       # the plan foresaw a cut; vLLM measures it
    served = serves("Llama-3.3-70B-Instruct-AWQ", version, out.flags, count=2)
    assert served.ok and 2048 <= served.served_max_model_len < 131072


def test_the_plan_foresees_no_kv_memory_and_the_first_launch_takes_the_remedy():
    version = "0.32.0"
    flags = Flags.parse("--tensor-parallel-size 2 --max-num-seqs 512")
    s = sizing("Llama-3.3-70B-Instruct-AWQ", version, gpus=2)
    fl = s.fit(flags, total_bytes=int(L4_TOTAL * GiB), free_bytes=int(L4_TOTAL * GiB))
    assert fl.expect == "no_kv_cache_memory" and not fl.flags
    ahead = R.plan_ahead(fl.expect, flags, ctx(version, s, free=L4_TOTAL, requested=flags))
    assert ahead is not None
    assert serves("Llama-3.3-70B-Instruct-AWQ", version, ahead.flags, count=2).ok
    assert R.plan_ahead("not_a_kind", flags, ctx(version, s)) is None


def test_a_model_the_plan_cannot_size_falls_back_to_the_plain_rule():
    version = "0.6.6.post1"
    flags = Flags.parse("--max-model-len 32768 --kv-cache-dtype no_such_dtype")
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 32768, "fit_max_model_len": 13280,
                                                         "vllm_version": version})
    out = R.decide(d, flags, ctx(version, sizing("Llama-3.1-8B-Instruct", version), free=L4_TOTAL,
                                 requested=flags))
    assert out.flags.get("--max-model-len") == "13280"


def test_utilization_under_free_and_the_v0_gain():
    total = 22.06 * GiB
    assert P.utilization_under_free(19.06 * GiB, total) == 0.84                      # NVML: less the context
    assert P.utilization_under_free(18.66 * GiB, total, context_bytes=0) == 0.84    # vLLM's own figure
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
    gain = P.v0_chunked_gain_tokens(info, from_tokens=32768, to_tokens=512)
    # V0's profile at 32768 tokens peaks at the MLP: 32768 x (3 x 14336 + 3 x 4096) x 2 B; at 512 at the
    # sampler: 256 x 128256 logits x 38 B, the forward's 512 x 4096 output and 2 x 256 x 4096 rows (bf16)
    before = 32768 * (3 * 14_336 + 3 * 4096) * 2
    after = 256 * 128_256 * 38 + 512 * 4096 * 2 + 2 * 256 * 4096 * 2
    per_token = 32 * 8 * 128 * 2 * 2                  # K and V, 32 layers x 8 KV heads x 128, bf16
    assert gain == (before - after) // per_token == 18_065
    assert P.v0_chunked_gain_tokens(info, from_tokens=512, to_tokens=512) == 0


# -- the KV cache's allocation runs out: a share under what other processes leave ------------
def _kv_alloc_failure(name: str, version: str, flags: Flags, held: float) -> Diagnosis:
    """The failure as the guard reads it: the fake vLLM's output for the emulator's verdict, classified."""
    model = matrix.Model(name, name, str(MODELS / name))
    gpu = emu.GpuSpec(total_gib=L4_TOTAL, other_used_gib=held, cc=(8, 9))
    r = render.render(matrix.model_spec(model, version), gpu, version, flags)
    assert (r.outcome.kind, r.outcome.phase) == ("oom_profile", "kv_cache")
    classifier = Classifier()
    for line in r.lines:
        classifier.feed(line)
    d = classifier.diagnose(r.exit_code)
    assert (d.kind, d.phase) == (Kind.OOM_PROFILE, "kv_cache")       # placed by the _allocate_kv_cache frame
    assert d.numbers["tried_to_allocate_mib"] == r.outcome.numbers["tried_to_allocate_mib"]
    return d


def test_kv_cache_allocation_oom_lowers_the_share_under_free_memory():
    version, name = "0.6.6.post1", "Llama-3.1-8B-Instruct"
    flags = Flags.parse("--max-model-len 8192 --enforce-eager")
    d = _kv_alloc_failure(name, version, flags, held=3.5)
    out = R.decide(d, flags, ctx(version, None, free=L4_TOTAL - 3.5, requested=flags))
    assert out.step == "oom_kv_alloc"
    # NVML's 18.56 free, less vLLM's CUDA context and the margin: (18.56 - 0.4) / 22.06 - 0.005 -> 0.81
    assert out.flags.get("--gpu-memory-utilization") == "0.81"
    assert serves(name, version, out.flags, other_gib=3.5).ok
    blind = R.decide(d, flags, ctx(version, None, free=None, total=None, requested=flags))
    assert blind.flags.get("--gpu-memory-utilization") == "0.85"      # nothing known: 0.05 down
    again = R.decide(d, out.flags, ctx(version, None, free=L4_TOTAL - 3.5, requested=flags, tried=("oom_kv_alloc",)))
    assert again.step.startswith("oom_profile:")                       # then the profile ladder


def test_kv_cache_allocation_oom_with_cuda_graphs_leaves_room_for_them():
    version, name = "0.6.6.post1", "Llama-3.1-8B-Instruct"
    flags = Flags.parse("--max-model-len 8192")
    d = _kv_alloc_failure(name, version, flags, held=3.5)
    out = R.decide(d, flags, ctx(version, sizing(name, version), free=L4_TOTAL - 3.5, requested=flags))
    assert out.flags.get_float("--gpu-memory-utilization") < 0.81     # graphs are captured outside it
    assert serves(name, version, out.flags, other_gib=3.5).ok


# -- below the floor on V0: the least degrading flags that reach it, in one relaunch ---------------
def test_v0_below_the_floor_takes_fp8_with_chunked_prefill_in_one_relaunch():
    version, name, asked = "0.6.6.post1", "Qwen2.5-32B-Instruct-AWQ", Flags.parse("--max-model-len 8192")
    first = serves(name, version, asked)
    fit = first.numbers["fit_max_model_len"]
    assert first.kind == "kv_cache_insufficient" and 2 * fit < 2048      # fp8 alone would not reach the floor
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 8192, "fit_max_model_len": fit,
                                                       "vllm_version": version})
    out = R.decide(d, asked, ctx(version, sizing(name, version), requested=asked))
    assert isinstance(out, R.Relaunch) and out.step == "kv_cache_fp8", out
    assert out.flags.get("--kv-cache-dtype") == "fp8" and out.flags.enabled("--enable-chunked-prefill")
    assert not out.flags.has("--enforce-eager")        # graphs are captured outside V0's budget: no gain
    kv, chunked, length = out.changes
    assert (kv.flag, kv.why) == ("--kv-cache-dtype", f"only {fit} tokens fit, below the floor of 2048; fp8 KV "
                                                    "doubles the capacity")
    assert chunked.flag == "--enable-chunked-prefill" and chunked.why.startswith(f"vLLM V0 measured {fit} tokens")
    doubled = 2 * (fit + int(_v0_gain(chunked) * 0.97)) // 16 * 16    # the gain less 3%, doubled, in whole blocks
    assert (length.flag, length.new, length.why) == ("--max-model-len", str(doubled),
                                                     f"about {doubled} tokens fit with fp8 KV")
    assert serves(name, version, out.flags).kind is None, serves(name, version, out.flags)


@pytest.mark.parametrize("version", ["0.6.6.post1", "0.10.1.1"])
def test_before_0_20_eager_mode_is_not_a_way_to_a_bigger_kv_cache(version):
    """vLLM sizes the KV cache before it captures CUDA graphs there: eager mode leaves it as it was."""
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 8192, "fit_max_model_len": 600,
                                                       "vllm_version": version})
    flags = Flags.parse("--max-model-len 8192 --kv-cache-dtype fp8")
    out = R.decide(d, flags, ctx(version, None, requested=flags))
    assert isinstance(out, R.Relaunch) and out.step == "kv_small:max_num_batched_tokens", out
    newer = R.decide(d, flags, ctx("0.32.0", None, requested=flags))
    assert isinstance(newer, R.Relaunch) and newer.step == "kv_small:enforce_eager", newer


# -- the KV relaunch before 0.20 on a shared GPU: the graph room, in tokens, written out -----------------
QWEN7B_KV_BF16 = 2 * 28 * 4 * 128 * 2     # K and V x 28 layers x 4 KV heads x 128 dims x 2 bytes (config.json)
UTIL, MML, CHUNKED = "--gpu-memory-utilization", "--max-model-len", "--enable-chunked-prefill"
ESTIMATE_WHY = "the KV cache holds about {fit} tokens (vLLM's estimate), not {length}; with the changes below about "
ROOM_WHY = ("other processes hold memory and this vLLM captures CUDA graphs outside its budget; {room} leaves room "
            "for them (about {lost} tokens fewer)")
V0_BELOW_32768 = ("below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory "
                  "profile, and so the KV cache, as measured")


def _kv_short(version: str, flags: str, numbers: dict, free: float | None, gpus: int = 1, requested: str = ""):
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers=numbers)
    return R.decide(d, Flags.parse(flags), ctx(version, sizing("Qwen2.5-7B-Instruct", version, gpus=gpus), free=free,
                                               requested=Flags.parse(requested)))


def _tokens_lost(util: float, room: str, per_token: int) -> int:
    """The KV tokens the lower share gives up: (util - room) x the GPU's total, in the model's bytes per token."""
    return int((util - float(room)) * L4_TOTAL * GiB) // per_token


@pytest.mark.parametrize(("flags", "numbers", "free", "gpus", "util", "per_token"), [
    ("", {}, 21.0, 1, 0.90, QWEN7B_KV_BF16),                                   # 0.10's default share
    ("--gpu-memory-utilization 0.9", {}, 21.0, 1, 0.90, QWEN7B_KV_BF16),      # the share as launched
    ("--gpu-memory-utilization 0.95", {}, 21.8, 1, 0.95, QWEN7B_KV_BF16),
    ("", {"requested_utilization": 0.95}, 21.5, 1, 0.95, QWEN7B_KV_BF16),       # the share as the log says it
    ("--kv-cache-dtype fp8", {}, 21.0, 1, 0.90, QWEN7B_KV_BF16 // 2),          # 1 byte a value
    ("--dtype float32", {}, 21.0, 1, 0.90, QWEN7B_KV_BF16 * 2),                # 4 bytes a value
    ("--tensor-parallel-size 2", {}, 21.0, 2, 0.90, QWEN7B_KV_BF16 // 2),      # 2 of the 4 KV heads a rank
])
def test_busy_gpu_kv_relaunch_before_0_20_gives_up_the_tokens_its_graph_room_costs(flags, numbers, free, gpus, util,
                                                                                    per_token):
    out = _kv_short("0.10.1.1", flags, {"max_model_len": 32768, "fit_max_model_len": 20000, **numbers}, free, gpus)
    assert isinstance(out, R.Relaunch) and out.step == "max_model_len"
    room = out.flags.get(UTIL)
    assert room is not None and float(room) < util
    lost = _tokens_lost(util, room, per_token)
    tokens = 20000 - lost
    new_len = tokens // 16 * 16
    assert out.changes == (
        R.Change(MML, None, str(new_len),
                 ESTIMATE_WHY.format(fit=20000, length=32768) + f"{tokens}, aligned down to the 16-token block"),
        R.Change(UTIL, Flags.parse(flags).get(UTIL), room, ROOM_WHY.format(room=room, lost=lost)))
    assert out.flags == Flags.parse(flags).set(UTIL, room).set(MML, str(new_len))
    assert out.why == out.changes[0].why


@pytest.mark.parametrize(("version", "flags", "free"), [
    ("0.32.0", "", 21.0),                              # 0.20+ captures its graphs inside the budget
    ("0.10.1.1", "", None),                            # the free memory unknown: no room to reckon
    ("0.10.1.1", "--gpu-memory-utilization 0.89", 21.0),   # the share already leaves the room
    ("0.10.1.1", "--enforce-eager", 21.0),             # no graphs to leave room for
    ("0.32.0", "", 15.0),                              # ... however little is free
    ("0.32.0", "", 20.2),                              # (a plan would lower 0.92 to 0.89 here)
    ("0.10.1.1", "--enforce-eager", 15.0),
    ("0.10.1.1", "--enforce-eager", 19.8),             # (a plan would lower 0.90 to 0.87 here)
])
def test_kv_relaunch_keeps_the_share_where_no_graph_room_is_needed(version, flags, free):
    out = _kv_short(version, flags, {"max_model_len": 32768, "fit_max_model_len": 20000}, free)
    assert out.changes == (R.Change(MML, None, "20000", "the KV cache holds about 20000 tokens (vLLM's estimate), "
                                    "not 32768; 20000 is that, aligned down to the 16-token block"),)
    assert out.flags == Flags.parse(flags).set(MML, "20000")


def _v0_gain(change: R.Change) -> int:
    """The tokens chunked prefill frees, as its reason states them ("... room for about N more")."""
    return int(change.why.split("room for about ")[1].split(" more")[0])


def test_v0_kv_relaunch_held_to_the_length_asked_for():
    out = _kv_short("0.6.6.post1", "--max-model-len 32768", {"max_model_len": 32768, "fit_max_model_len": 10000},
                    L4_TOTAL, requested="--max-model-len 20000")
    tokens = 10000 + int(_v0_gain(out.changes[1]) * 0.97)      # 3% held back
    assert tokens > 20000
    assert out.changes[0] == R.Change(MML, "32768", "20000", ESTIMATE_WHY.format(fit=10000, length=32768)
                                      + f"{tokens}, held to the 20000 asked for, aligned down to the 16-token block")
    assert out.flags == Flags.parse("--max-model-len 20000 --enable-chunked-prefill")


def test_v0_kv_relaunch_held_to_the_length_launched():
    # 20001 is no whole number of 16-token blocks: the length aligned down is below the one launched
    out = _kv_short("0.6.6.post1", "--max-model-len 20001", {"max_model_len": 20001, "fit_max_model_len": 10000},
                    L4_TOTAL)
    tokens = 10000 + int(_v0_gain(out.changes[1]) * 0.97)
    assert tokens > 20001
    assert out.changes[0] == R.Change(MML, "20001", "20000", ESTIMATE_WHY.format(fit=10000, length=20001)
                                      + f"{tokens}, held to the 20001 launched, aligned down to the 16-token block")
    assert out.flags == Flags.parse("--max-model-len 20000 --enable-chunked-prefill")


def test_v0_kv_relaunch_exactly_at_the_length_asked_for_names_no_hold():
    first = _kv_short("0.6.6.post1", "--max-model-len 4096", {"max_model_len": 4096, "fit_max_model_len": 3000},
                      L4_TOTAL, requested="--max-model-len 3000")
    estimate = 3000 - int(_v0_gain(first.changes[1]) * 0.97)       # with the gain, exactly the 3000 asked for
    out = _kv_short("0.6.6.post1", "--max-model-len 4096", {"max_model_len": 4096, "fit_max_model_len": estimate},
                    L4_TOTAL, requested="--max-model-len 3000")
    assert out.changes[0] == R.Change(MML, "4096", "2992", ESTIMATE_WHY.format(fit=estimate, length=4096)
                                      + "3000, aligned down to the 16-token block")


def test_v0_kv_relaunch_at_32768_launched_adds_no_chunked_prefill():
    """V0 at 32768 already profiled the whole context (its own chunking starts above): none to keep."""
    out = _kv_short("0.6.6.post1", "--max-model-len 32768 --max-num-batched-tokens 32768",
                    {"max_model_len": 32768, "fit_max_model_len": 30000}, 20.5)
    room = out.flags.get(UTIL)
    lost = _tokens_lost(0.90, room, QWEN7B_KV_BF16)
    new_len = (30000 - lost) // 16 * 16
    assert out.flags == Flags.parse(f"--max-model-len {new_len} --max-num-batched-tokens 32768 {UTIL} {room}")


@pytest.mark.parametrize("launched", [32769, 65536])
def test_v0_kv_relaunch_from_above_32768_to_32768_or_below_keeps_chunked_prefill(launched):
    """Above 32768 V0 chunked prefill by itself; a relaunch at 32768 or below must ask for it."""
    first = _kv_short("0.6.6.post1", f"--max-model-len {launched}",
                      {"max_model_len": launched, "fit_max_model_len": 30000}, 20.5)
    lost = _tokens_lost(0.90, first.flags.get(UTIL), QWEN7B_KV_BF16)
    fit = 32768 + lost if launched > 32768 + lost else 30000      # exactly 32768 tokens where the length allows
    out = _kv_short("0.6.6.post1", f"--max-model-len {launched}",
                    {"max_model_len": launched, "fit_max_model_len": fit}, 20.5)
    new_len = (fit - lost) // 16 * 16
    assert new_len <= 32768
    room = out.flags.get(UTIL)
    assert out.changes[-1] == R.Change(CHUNKED, None, "", V0_BELOW_32768)
    assert out.flags == Flags.parse(f"--max-model-len {new_len} {UTIL} {room} {CHUNKED}")


def test_busy_gpu_kv_relaunch_before_0_20_down_to_exactly_the_floor():
    first = _kv_short("0.10.1.1", "", {"max_model_len": 32768, "fit_max_model_len": 20000}, 21.0)
    room = first.flags.get(UTIL)
    lost = _tokens_lost(0.90, room, QWEN7B_KV_BF16)
    fit = 2048 + lost                      # with the graph room, exactly the floor --min-model-len 2048
    out = _kv_short("0.10.1.1", "", {"max_model_len": 32768, "fit_max_model_len": fit}, 21.0)
    assert out.flags == Flags.parse(f"{UTIL} {room} {MML} 2048")
    assert out.changes[0].why == ESTIMATE_WHY.format(fit=fit, length=32768) + "2048, aligned down to the 16-token block"


# -- issue 24: what the mutation run showed no test held (each test kills a surviving mutant) ------------------
def _unsizable(tmp_path_factory) -> P.Sizing:
    """A model the plan cannot size: Llama-3.1-8B's config.json with a hidden size (16) below its 32 heads, so
    each head has 16 // 32 = 0 dimensions and a KV page 0 bytes (the plan divides by it)."""
    config = json.loads((MODELS / "Llama-3.1-8B-Instruct" / "config.json").read_text())
    config["hidden_size"] = 16
    d = tmp_path_factory.mktemp("unsizable")
    (d / "config.json").write_text(json.dumps(config))
    info = load_model_info(str(d))
    assert info is not None and info.head_dim == 0
    return P.Sizing(info, compute_capability=(8, 9), device_name="NVIDIA L4")


@pytest.fixture(scope="module")
def unsizable(tmp_path_factory) -> P.Sizing:
    s = _unsizable(tmp_path_factory)
    with pytest.raises(ZeroDivisionError):          # the plan itself raises: the remedy must not
        s.fit(Flags(), total_bytes=int(L4_TOTAL * GiB), free_bytes=int(18 * GiB), vllm_version="0.10.1.1")
    return s


def _with(s: P.Sizing, version: str) -> P.Sizing:
    return dataclasses.replace(s, vllm_version=version)


def test_a_kv_cache_too_small_for_a_model_the_plan_cannot_size_is_cut_to_vllms_own_figure(unsizable):
    # vLLM 0.10 on a GPU others share: the rule asks the plan for the room CUDA graphs need, and the plan raises.
    # The relaunch is the plain rule's: vLLM's 19200 tokens, a whole number of 16-token blocks (1200 x 16).
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 131072, "fit_max_model_len": 19200})
    out = R.decide(d, Flags(), ctx("0.10.1.1", _with(unsizable, "0.10.1.1"), free=18.0))
    assert out == R.Relaunch(Flags.parse("--max-model-len 19200"), (R.Change(
        MML, None, "19200", "the KV cache holds about 19200 tokens (vLLM's estimate), not 131072; 19200 is that, "
                            "aligned down to the 16-token block"),),
        "the KV cache holds about 19200 tokens (vLLM's estimate), not 131072; 19200 is that, aligned down to the "
        "16-token block", step="max_model_len")


def test_no_kv_memory_for_a_model_the_plan_cannot_size_takes_the_next_step_without_a_length(unsizable):
    # The ladder's first step, a larger share, gives nothing on a GPU with 18 of 22.06 GiB free: under free memory,
    # less 0.5 GiB for CUDA graphs (0.10), 0.4 GiB of CUDA context and the 0.005 margin, vLLM can take
    # floor(((18 - 0.5 - 0.4) / 22.06 - 0.005) x 100) / 100 = 0.77, below the 0.90 it ran at. Eager mode is next;
    # the plan asked what that does to the length raises, so the length is left to vLLM.
    out = R.decide(Diagnosis(Kind.NO_KV_CACHE_MEMORY), Flags(), ctx("0.10.1.1", _with(unsizable, "0.10.1.1"),
                                                                     free=18.0))
    assert isinstance(out, R.Relaunch) and out.flags == Flags.parse("--enforce-eager")
    assert out.step == "no_kv:enforce_eager" and [c.flag for c in out.changes] == ["--enforce-eager"]


_FAILURES = [
    Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 131072, "fit_max_model_len": 19200}),
    Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 8192, "fit_max_model_len": 1000}),
    Diagnosis(Kind.NO_KV_CACHE_MEMORY), Diagnosis(Kind.OOM_PROFILE), Diagnosis(Kind.OOM_CUDAGRAPH),
    Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": 18.66, "total_gib": 22.06,
                                                       "requested_utilization": 0.9}),
    Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY),           # "Error in memory profiling": no figures
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(failure=st.sampled_from(_FAILURES),
       version=st.sampled_from(["0.8.5", "0.9.2", "0.10.1.1", "0.13.0", "0.19.0", "0.32.0"]),
       flags=st.sampled_from(["", "--max-model-len 8192", "--gpu-memory-utilization 0.95", "--enforce-eager"]),
       total=st.sampled_from([22.06, 44.4, 79.19, 139.8]),
       free_share=st.one_of(st.none(), st.integers(30, 100)))
def test_a_model_the_plan_cannot_size_leaves_every_rule_as_it_decides_without_the_model(
        unsizable, failure, version, flags, total, free_share):
    # "An estimate only ever refines a rule, it never breaks one": where the plan raises, each rule that asks it
    # decides what it decides knowing nothing of the model (V1 engines; V0: see the test below).
    free = None if free_share is None else round(total * free_share / 100, 2)
    current = Flags.parse(flags)
    known = R.decide(failure, current, ctx(version, _with(unsizable, version), free=free, total=total))
    unknown = R.decide(failure, current, ctx(version, None, free=free, total=total))
    assert known == unknown


def test_a_v0_relaunch_for_a_model_the_plan_cannot_size_claims_no_gain_from_chunked_prefill(unsizable):
    d = Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers={"max_model_len": 8192, "fit_max_model_len": 19200})
    current = Flags.parse("--max-model-len 8192")
    known = R.decide(d, current, ctx("0.6.3", _with(unsizable, "0.6.3"), free=18.0))
    assert known == R.decide(d, current, ctx("0.6.3", None, free=18.0))


def _under_free(free: float, total: float, margin: float) -> float:
    """The highest share (0.01 steps) vLLM's start-up check passes with ``free`` GiB free (NVML's figure, so
    vLLM's 0.4 GiB CUDA context comes off it) and ``margin`` of the total held back."""
    return math.floor(((free - 0.4) / total - margin) * 100) / 100


_GPUS = [(22.06, (8, 9), "NVIDIA L4"), (79.19, (9, 0), "NVIDIA H100 80GB HBM3"), (139.8, (9, 0), "NVIDIA H200")]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["Llama-3.1-8B-Instruct", "DeepSeek-V2-Lite", "Qwen2.5-7B-Instruct", "Qwen3-8B"]),
       version=st.sampled_from(["0.10.1.1", "0.19.0", "0.32.0"]), gpu=st.sampled_from(_GPUS),
       margin=st.sampled_from([0.005, 0.02, 0.05]), launched=st.sampled_from([None, "0.5"]),
       free_share=st.integers(100, 200))
@example(name="DeepSeek-V2-Lite", version="0.10.1.1", gpu=_GPUS[0], margin=0.005, launched="0.5",
         free_share=198)                              # 21.84 of 22.06 GiB free: the plan's room for graphs is 0.90
@example(name="DeepSeek-V2-Lite", version="0.10.1.1", gpu=_GPUS[1], margin=0.05, launched=None,
         free_share=187)                              # 74.04 of 79.19 free, a 0.05 margin: no share above 0.87
def test_the_no_kv_ladders_share_keeps_the_margin_and_the_room_the_plan_leaves_for_cuda_graphs(
        name, version, gpu, margin, launched, free_share):
    # The share the ladder raises to passes vLLM's start-up check with the configured margin held back, and before
    # 0.20 (graphs captured outside the budget) it is no higher than the share the plan leaves the model's graphs
    # room at: the step must not take back the room the plan keeps.
    total, cc, device = gpu
    free = round(total * free_share / 200, 2)
    info = load_model_info(str(MODELS / name))
    assert info is not None
    s = P.Sizing(info, vllm_version=version, compute_capability=cc, device_name=device, utilization_margin=margin)
    current = Flags() if launched is None else Flags.parse(f"{UTIL} {launched}")
    out = R.decide(Diagnosis(Kind.NO_KV_CACHE_MEMORY), current,
                   ctx(version, s, free=free, total=total, rules=RemedyConfig(utilization_margin=margin)))
    if not isinstance(out, R.Relaunch) or out.step != "no_kv:gpu_memory_utilization":
        return
    share = float(out.flags.get(UTIL) or 0)
    most = _under_free(free, total, margin)
    assert share <= most
    planned = s.fit(Flags.parse(f"{UTIL} {most}"), total_bytes=int(total * GiB), free_bytes=int(free * GiB))
    room = planned.flags.get(UTIL)      # the plan's share for the model's graphs (0.10-0.19), if it needs a lower one
    assert room is None or share <= float(room)


def test_before_0_20_the_no_kv_share_keeps_the_least_graph_reserve_besides_the_margin():
    # Llama-3.1-8B on an H200 (139.8 GiB) with 130.01 GiB free, vLLM 0.10: the plan needs no lower share for the
    # model's graphs at what free memory allows, and the share keeps the least room for graphs captured outside
    # the budget (0.5 GiB), vLLM's CUDA context (0.4 GiB) and the 0.005 margin:
    # floor(((130.01 - 0.5 - 0.4) / 139.8 - 0.005) x 100) / 100 = floor(91.85) / 100 = 0.91.
    version = "0.10.1.1"
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
    assert info is not None
    s = P.Sizing(info, vllm_version=version, compute_capability=(9, 0), device_name="NVIDIA H200")
    out = R.decide(Diagnosis(Kind.NO_KV_CACHE_MEMORY), Flags(), ctx(version, s, free=130.01, total=139.8))
    assert isinstance(out, R.Relaunch) and out.step == "no_kv:gpu_memory_utilization"
    assert out.flags == Flags.parse(f"{UTIL} 0.91")


@pytest.mark.parametrize(("name", "total", "free"), [
    ("Llama-3.1-8B-Instruct", L4_TOTAL, 20.74),        # others hold 1.32 GiB
    ("Llama-3.1-8B-Instruct", 79.19, 52.27),           # others hold 26.92 GiB
])
def test_a_free_memory_relaunch_on_vllm_0_8_leaves_the_length_room_for_what_other_processes_hold(name, total, free):
    # vLLM 0.8 (V1 before 0.9.1) counts every byte on the device that is not its own torch memory against its
    # cap: the length the relaunch sets must fit after what other processes hold. "Error in memory profiling"
    # prints no figures: the free memory is NVML's.
    version = "0.8.5"
    info = load_model_info(str(MODELS / name))
    assert info is not None
    s = P.Sizing(info, vllm_version=version, compute_capability=(8, 9), device_name="NVIDIA L4")
    out = R.decide(Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY), Flags(), ctx(version, s, free=free, total=total))
    assert isinstance(out, R.Relaunch) and out.flags.has(MML)
    model = matrix.Model(name, name, str(MODELS / name))
    gpu = emu.GpuSpec(total_gib=total, other_used_gib=round(total - free, 2), cc=(8, 9))
    served = render.simulate(matrix.model_spec(model, version), gpu, version, out.flags)
    assert served.ok, served


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-32B-Instruct-AWQ"]),
       version=st.sampled_from(["0.10.1.1", "0.13.0", "0.19.0", "0.32.0"]), total=st.sampled_from([22.06, 44.4, 79.19]),
       util=st.sampled_from([0.9, 0.92, 0.95]), below=st.integers(-1, 300))
@example(name="Llama-3.1-8B-Instruct", version="0.32.0", total=22.06, util=0.9, below=-1)
def test_a_free_memory_relaunch_names_the_share_it_launches_with_wherever_its_reasons_name_one(
        name, version, total, util, below):
    # vLLM prints free and total memory rounded to 2 decimals: free may print 0.01 above total x share and still
    # be below it ("Free memory on device (19.86/22.06 GiB) ... (0.9, 19.86 GiB)"). Every reason of the relaunch
    # that names a share ("... at utilization 0.89") names the one it launches with.
    free = round(round(total * util, 2) - below / 100, 2)
    info = load_model_info(str(MODELS / name))
    assert info is not None
    s = P.Sizing(info, vllm_version=version, compute_capability=(8, 9), device_name="NVIDIA L4")
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": free, "total_gib": total,
                                                           "requested_utilization": util})
    current = Flags() if util == vllm.default_utilization(version) else Flags.parse(f"{UTIL} {util}")
    out = R.decide(d, current, ctx(version, s, free=free + 0.4, total=total))
    if not isinstance(out, R.Relaunch):
        return
    named = {float(x) for c in out.changes for x in re.findall(r"at utilization (\d\.\d\d)", c.why)}
    assert named <= {float(out.flags.get(UTIL) or "nan")}, out


def test_the_plans_fp8_kv_and_its_length_are_taken_only_where_the_rules_allow_each():
    # Mistral-7B on an L4 others share, vLLM 0.19: "Free memory on device (15.22/22.06 GiB) ... (0.9, 19.85 GiB)".
    # Under the share that fits, at the model dtype fewer than the 2048-token floor fit, so the plan turns on fp8
    # KV and sizes the length. The relaunch takes fp8 only where remedies.allowed has kv_cache_fp8, and the
    # length only where it has max_model_len; the share is the same either way.
    version = "0.19.0"
    info = load_model_info(str(MODELS / "Mistral-7B-v0.3"))
    assert info is not None
    s = P.Sizing(info, vllm_version=version, compute_capability=(8, 9), device_name="NVIDIA L4")
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": 15.22, "total_gib": 22.06,
                                                           "requested_utilization": 0.9})
    planned = s.fit(Flags.parse(f"{UTIL} 0.9"), total_bytes=int(22.06 * GiB), free_bytes=int(15.22 * GiB),
                    context_bytes=0)
    assert planned.flags.get("--kv-cache-dtype") == "fp8" and planned.flags.get(MML) == "auto"
    every = RemedyConfig().allowed

    def relaunch(*without: str) -> R.Relaunch:
        rules = RemedyConfig(allowed=tuple(a for a in every if a not in without))
        out = R.decide(d, Flags(), ctx(version, s, free=15.62, rules=rules))
        assert isinstance(out, R.Relaunch)
        return out

    share = planned.flags[UTIL]
    assert relaunch().flags == Flags.parse(f"{UTIL} {share} --kv-cache-dtype fp8 {MML} auto")
    model = matrix.Model("Mistral-7B-v0.3", "Mistral-7B-v0.3", str(MODELS / "Mistral-7B-v0.3"))
    gpu = emu.GpuSpec(total_gib=22.06, other_used_gib=round(22.06 - 15.22 - CONTEXT, 2), cc=(8, 9))
    spec = matrix.model_spec(model, version)
    assert render.simulate(spec, gpu, version, relaunch().flags).ok
    # The plan's length (auto) was sized with fp8 KV, and its fp8 to go with a shorter length: without
    # one the other is no answer. Without kv_cache_fp8 the length auto would count on fp8 that is not
    # applied; without max_model_len, fp8 alone leaves the model's 32768 tokens far from fitting (the
    # emulator refuses it): a needless degradation. Either way the share alone, and no reason names fp8.
    assert not render.simulate(spec, gpu, version, Flags.parse(f"{UTIL} {share} --kv-cache-dtype fp8")).ok
    for without in ("max_model_len", "kv_cache_fp8"):
        out = relaunch(without)
        assert out.flags == Flags.parse(f"{UTIL} {share}"), without
        assert not any("fp8" in c.why for c in out.changes) and "fp8" not in out.why, out
