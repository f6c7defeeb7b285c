"""Remedies that use the model's facts (``Context.sizing``) to fix two things in one relaunch.

Each decision is checked twice: what the policy changes, and (where the emulator models that vLLM)
that the relaunch it asks for serves in the emulator — the second failure it pre-empts does not come.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import matrix, render
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
