"""One test (at least) per remedy rule: the numbers vLLM printed -> the next flags, or give up."""

from __future__ import annotations

import pytest

from supervisor.config import RemedyConfig
from supervisor.core.flags import Flags
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core import remedy as R


def D(kind: Kind, evidence: str = "", **numbers) -> Diagnosis:
    return Diagnosis(kind, evidence=evidence, numbers=numbers)


def ctx(args: str = "", **kw) -> R.Context:
    return R.Context(requested=Flags.parse(args), **kw)


# -- kv_cache_insufficient ------------------------------------------------------------------
def test_v1_estimate_aligned_down_to_block():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=41840,
          kv_needed_gib=16.0, kv_available_gib=5.23)
    out = R.decide(d, Flags.parse(""), ctx())
    assert isinstance(out, R.Relaunch)
    assert out.flags.get("--max-model-len") == "41840"          # already a multiple of 16
    assert [c.flag for c in out.changes] == ["--max-model-len"]


def test_cpu_block_128_from_log():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=65408, block_size=128)
    out = R.decide(d, Flags.parse("--enforce-eager"), ctx("--enforce-eager"))
    assert out.flags.get("--max-model-len") == "65408"
    assert out.flags.enabled("--enforce-eager")                 # the user's flags are kept


def test_estimate_not_block_aligned_is_aligned_down():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=20001)
    out = R.decide(d, Flags.parse("--max-model-len 32768"), ctx("--max-model-len 32768"))
    assert out.flags.get("--max-model-len") == "20000"


def test_v0_token_capacity_is_the_fit():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=19200)
    out = R.decide(d, Flags.parse("--max-model-len 32768"), ctx("--max-model-len 32768"))
    assert out.flags.get("--max-model-len") == "19200"


def test_gib_ratio_when_no_estimate_keeps_a_margin_of_at_least_a_block():
    # 0.8.4-0.9.0: "(16.00 GiB KV cache is needed ... available KV cache memory (5.23 GiB)"
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, kv_needed_gib=16.0, kv_available_gib=5.23)
    out = R.decide(d, Flags.parse(""), ctx())
    new = int(out.flags.get("--max-model-len"))
    exact = 131072 * 5.23 / 16.0                                # 42844
    assert new % 16 == 0
    assert exact * 0.95 <= new <= exact - 16                    # kept >= 95%, below by >= 1 block


def test_no_numbers_halves():
    d = D(Kind.KV_CACHE_INSUFFICIENT)
    out = R.decide(d, Flags.parse("--max-model-len 32768"), ctx("--max-model-len 32768"))
    assert out.flags.get("--max-model-len") == "16384"


def test_never_above_what_the_user_asked():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=60000)
    # the user asked 16384 but a previous heal raised nothing; estimate above the ask is capped
    out = R.decide(d, Flags.parse("--max-model-len 16384"), ctx("--max-model-len 16384"))
    assert int(out.flags.get("--max-model-len")) <= 16384


def test_below_floor_tries_fp8_then_gives_up():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=1500)
    out = R.decide(d, Flags.parse(""), ctx())
    assert isinstance(out, R.Relaunch) and out.step == "kv_cache_fp8"
    assert out.flags.get("--kv-cache-dtype") == "fp8"
    assert out.flags.get("--max-model-len") == "3000" or out.flags.get("--max-model-len") == "2992"
    # with fp8 in place, still below the floor: free memory (eager, smaller batch), then give up
    d2 = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=2992, fit_max_model_len=1000)
    tried = ["kv_cache_fp8"]
    flags = out.flags
    for expected in ("kv_small:enforce_eager", "kv_small:max_num_batched_tokens"):
        nxt = R.decide(d2, flags, ctx(tried=tuple(tried)))
        assert isinstance(nxt, R.Relaunch) and nxt.step == expected
        assert nxt.flags.get("--max-model-len") == "2992"      # the length is not cut below the floor
        tried.append(nxt.step)
        flags = nxt.flags
    out2 = R.decide(d2, flags, ctx(tried=tuple(tried)))
    assert isinstance(out2, R.GiveUp) and out2.exit_code == R.EX_TEMPFAIL
    assert "floor" in out2.reason


def test_fp8_refused_after_we_added_it_gives_up_with_kv_message():
    kv = D(Kind.KV_CACHE_INSUFFICIENT, "ValueError: To serve at least one request ...",
           max_model_len=32768, fit_max_model_len=1500)
    refused = D(Kind.CONFIG_ERROR, "ValueError: No valid attention backend found for cuda ... "
                "[kv_cache_dtype not supported]")
    out = R.decide(refused, Flags.parse("--kv-cache-dtype fp8"),
                   ctx(tried=("kv_cache_fp8",), previous=(kv,)))
    assert isinstance(out, R.GiveUp) and out.exit_code == R.EX_TEMPFAIL
    assert "refuses fp8" in out.reason and "To serve at least one request" in out.reason


def test_fp8_not_tried_when_known_unsupported():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=1500)
    out = R.decide(d, Flags.parse("--enforce-eager --max-num-batched-tokens 512"),
                   ctx(fp8_supported=False, vllm_version="0.32.0"))
    assert isinstance(out, R.GiveUp)


def test_floor_is_configurable():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=1500)
    out = R.decide(d, Flags.parse(""), ctx(rules=RemedyConfig(min_model_len=1024)))
    assert out.flags.get("--max-model-len") == "1488"


# -- --max-model-len auto, held to the guard's bounds -------------------------------------------
def test_auto_fit_bounds_name_the_launch():
    from supervisor.core.classifier import check_auto_fit

    assert check_auto_fit({}, "kv_cache", floor=2048, cap=8192) is None            # nothing chosen yet
    assert check_auto_fit({"auto_fit_max_model_len": 4096}, "kv_cache", floor=2048, cap=8192) is None
    assert check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=None) is None
    low = check_auto_fit({"auto_fit_max_model_len": 1000}, "kv_cache", floor=2048, cap=8192)
    assert low.kind is Kind.KV_CACHE_INSUFFICIENT and low.numbers["fit_max_model_len"] == 1000
    high = check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=8192)
    assert high.kind is Kind.AUTO_FIT_ABOVE_REQUEST and "above the --max-model-len 8192" in high.evidence


def test_auto_fit_above_the_request_pins_the_request():
    from supervisor.core.classifier import check_auto_fit

    d = check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=8192)
    out = R.decide(d, Flags.parse("--max-model-len auto --enforce-eager"), ctx("--max-model-len 8192"))
    assert out.flags.argv() == ["--max-model-len", "8192", "--enforce-eager"]
    assert out.step == "max_model_len_asked" and "room for 9000" in out.changes[0].why


# -- the other kinds --------------------------------------------------------------------------
def test_max_len_exceeds_model_uses_derived():
    d = D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=65536, derived_max_model_len=32768)
    out = R.decide(d, Flags.parse("--max-model-len 65536"), ctx("--max-model-len 65536"))
    assert out.flags.get("--max-model-len") == "32768"


def test_insufficient_free_memory_lowers_utilization_below_free_over_total():
    d = D(Kind.INSUFFICIENT_FREE_MEMORY, free_gib=60.12, total_gib=79.19, requested_utilization=0.92)
    out = R.decide(d, Flags.parse(""), ctx())
    # vLLM measured 60.12 free after its CUDA context: 60.12/79.19 = 0.7592 - 0.005 = 0.7542 -> 0.75
    assert out.flags.get("--gpu-memory-utilization") == "0.75"
    assert not out.flags.has("--max-model-len")                 # not about length


def test_insufficient_free_memory_nothing_free_gives_up():
    d = D(Kind.INSUFFICIENT_FREE_MEMORY, free_gib=0.5, total_gib=79.19, requested_utilization=0.9)
    assert isinstance(R.decide(d, Flags.parse(""), ctx()), R.GiveUp)


def test_no_kv_ladder_in_order():
    d = D(Kind.NO_KV_CACHE_MEMORY)
    flags = Flags.parse("--gpu-memory-utilization 0.7 --max-model-len 8192")
    c = ctx("--gpu-memory-utilization 0.7 --max-model-len 8192")
    steps = []
    for _ in range(4):
        out = R.decide(d, flags, c)
        assert isinstance(out, R.Relaunch)
        steps.append(out.step)
        flags = out.flags
        c = R.Context(requested=c.requested, tried=c.tried + (out.step,))
    assert steps == ["no_kv:gpu_memory_utilization", "no_kv:enforce_eager",
                     "no_kv:max_num_batched_tokens", "no_kv:max_num_seqs"]
    assert flags.get("--gpu-memory-utilization") == "0.90"
    assert flags.enabled("--enforce-eager")
    assert flags.get("--max-num-batched-tokens") == "1024"
    assert flags.get("--max-num-seqs") == "128"
    assert flags.get("--max-model-len") == "8192"               # length untouched
    out = R.decide(d, flags, c)
    assert isinstance(out, R.GiveUp)                            # cpu offload is off by default


def test_no_kv_cpu_offload_when_allowed():
    d = D(Kind.NO_KV_CACHE_MEMORY)
    rules = RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=8)
    out = R.decide(d, Flags.parse(""), ctx(rules=rules, vllm_version="0.10.2"))
    assert out.flags.get("--cpu-offload-gb") == "8"


def test_oom_cudagraph_enforce_eager():
    d = D(Kind.OOM_CUDAGRAPH)
    out = R.decide(d, Flags.parse("--max-model-len 8192"), ctx("--max-model-len 8192"))
    assert out.flags.enabled("--enforce-eager")
    assert out.flags.get("--max-model-len") == "8192"


def test_oom_profile_halves_from_dummy_count():
    d = D(Kind.OOM_PROFILE, num_dummy_requests=1024)
    out = R.decide(d, Flags.parse(""), ctx())
    assert out.flags.get("--max-num-seqs") == "512"
    out2 = R.decide(d, out.flags, ctx(tried=(out.step,)))
    assert out2.flags.get("--max-num-batched-tokens") == "1024"
    out3 = R.decide(d, out2.flags, ctx(tried=(out.step, out2.step)))
    assert out3.flags.get("--gpu-memory-utilization") == "0.85"


def test_oom_runtime_halves_seqs_on_last_good():
    good = Flags.parse("--max-model-len 8192 --max-num-seqs 64")
    out = R.decide(D(Kind.OOM_RUNTIME), Flags.parse("--max-model-len 8192 --max-num-seqs 64"),
                   ctx(last_good=good))
    assert out.flags.get("--max-num-seqs") == "32" and out.backoff


def test_oom_weights_gives_up_without_offload():
    out = R.decide(D(Kind.OOM_WEIGHTS), Flags.parse(""), ctx())
    assert isinstance(out, R.GiveUp) and "quantized" in out.advice


def test_engine_dead_relaunches_last_good_unchanged_with_backoff():
    good = Flags.parse("--max-model-len 8192")
    out = R.decide(D(Kind.ENGINE_DEAD), Flags.parse("--max-model-len 8192"), ctx(last_good=good))
    assert out.flags == good and out.changes == () and out.backoff


def test_config_error_gives_up_78():
    out = R.decide(D(Kind.CONFIG_ERROR, "vllm: error: unrecognized arguments: --foo"),
                   Flags.parse("--foo 1"), ctx())
    assert isinstance(out, R.GiveUp) and out.exit_code == R.EX_CONFIG


def test_port_in_use_retried_then_config_error():
    d = D(Kind.CONFIG_ERROR, "OSError: [Errno 98] Address already in use")
    out = R.decide(d, Flags.parse(""), ctx())
    assert isinstance(out, R.Relaunch) and out.backoff
    out = R.decide(d, Flags.parse(""), ctx(port_failures=3))
    assert isinstance(out, R.GiveUp) and out.exit_code == R.EX_CONFIG


def test_remedy_disallowed_by_config():
    rules = RemedyConfig(allowed=("kv_cache_fp8",))
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=16000)
    out = R.decide(d, Flags.parse(""), ctx(rules=rules))
    assert out.flags.get("--kv-cache-dtype") == "fp8"           # length changes not allowed


@pytest.mark.parametrize("version,expected", [("0.10.2rc3.dev25+gabc", (0, 10, 2)), ("0.32.0", (0, 32, 0)),
                                              (None, None), ("dev", None)])
def test_version_tuple(version, expected):
    assert R.version_tuple(version) == expected


def test_suggest_shape():
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=65408)
    s = R.suggest(d)
    assert s["healable"] is True and s["flags"] == {"--max-model-len": "65408"} and s["why"]
    assert R.suggest(D(Kind.HEALTHY))["healable"] is False
    assert R.suggest(D(Kind.CONFIG_ERROR, "unrecognized arguments"))["healable"] is False


def test_v0_length_below_32k_from_a_longer_one_keeps_chunked_prefill():
    # V0 measured 30864 with chunked prefill on (automatic above 32768): keep it on below
    d = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=131072, fit_max_model_len=30864)
    out = R.decide(d, Flags.parse(""), ctx(vllm_version="0.6.6"))
    assert out.flags.get("--max-model-len") == "30864"
    assert out.flags.enabled("--enable-chunked-prefill")
    # measured below 32768 already (chunked off): the length alone
    d2 = D(Kind.KV_CACHE_INSUFFICIENT, max_model_len=32768, fit_max_model_len=19200)
    assert R.decide(d2, Flags.parse("--max-model-len 32768"),
                    ctx("--max-model-len 32768", vllm_version="0.6.6")).flags.argv() == [
        "--max-model-len", "19200"]
    # V1 or an unknown version: the length alone
    for version in ("0.10.2", None):
        assert R.decide(d, Flags.parse(""), ctx(vllm_version=version)).flags.argv() == [
            "--max-model-len", "30864"]


def test_refused_chunked_prefill_is_undone():
    flags = Flags.parse("--max-model-len 30864 --enable-chunked-prefill")
    d = D(Kind.CONFIG_ERROR, "ValueError: Sliding window is not supported with chunked prefill")
    out = R.decide(d, flags, ctx(vllm_version="0.6.6"))
    assert isinstance(out, R.Relaunch) and out.flags.argv() == ["--max-model-len", "30864"]
    again = R.decide(d, flags, ctx(vllm_version="0.6.6", tried=("undo_chunked_prefill",)))
    assert isinstance(again, R.GiveUp)
    # the user's own chunked prefill is theirs: a config error
    assert isinstance(R.decide(d, flags, ctx("--enable-chunked-prefill", vllm_version="0.6.6")),
                      R.GiveUp)


def test_v0_smaller_batch_means_chunked_prefill():
    d = D(Kind.NO_KV_CACHE_MEMORY)
    flags = Flags.parse("--max-model-len 16384 --enforce-eager")
    out = R.decide(d, flags, ctx("--max-model-len 16384 --enforce-eager", vllm_version="0.6.3",
                                 tried=("no_kv:gpu_memory_utilization",)))
    assert out.step == "no_kv:max_num_batched_tokens"
    assert out.flags.enabled("--enable-chunked-prefill") and not out.flags.has("--max-num-batched-tokens")
    # unknown version: the universal spelling, a smaller batch
    out = R.decide(d, flags, ctx("--max-model-len 16384 --enforce-eager",
                                 tried=("no_kv:gpu_memory_utilization",)))
    assert out.flags.get("--max-num-batched-tokens") == "1024"


def test_unrecognized_removed_flag_is_dropped_with_the_reason():
    d = D(Kind.CONFIG_ERROR, "vllm: error: unrecognized arguments: --swap-space 4", vllm_version="0.20.0")
    flags = Flags.parse("--swap-space 4 --max-model-len 8192")
    out = R.decide(d, flags, ctx("--swap-space 4 --max-model-len 8192"))
    assert isinstance(out, R.Relaunch) and out.flags.argv() == ["--max-model-len", "8192"]
    assert "removed in vLLM 0.18.0" in out.why
    # a flag vLLM never had stays a configuration error
    other = D(Kind.CONFIG_ERROR, "vllm: error: unrecognized arguments: --foo 1")
    assert isinstance(R.decide(other, Flags.parse("--foo 1"), ctx("--foo 1")), R.GiveUp)
    # once only
    again = R.decide(d, flags, ctx(tried=("drop_removed_flags",)))
    assert isinstance(again, R.GiveUp) and again.exit_code == R.EX_CONFIG


def test_cpu_kv_space_from_the_environment_gives_up_with_the_size_that_fits():
    d = D(Kind.INSUFFICIENT_FREE_MEMORY, free_gib=7.96, total_gib=9.59, requested_gib=64.0, cpu_kv_gib=64.0)
    out = R.decide(d, Flags.parse(""), ctx(cpu_kv_space_gib=64.0))
    assert isinstance(out, R.GiveUp) and out.exit_code == R.EX_CONFIG
    assert "at most 7 GiB" in out.advice
    # the flag alone does not help while the environment variable is set: vLLM applies it over the flag
    flagged = R.decide(d, Flags.parse("--kv-cache-memory-bytes 64G"), ctx(cpu_kv_space_gib=64.0))
    assert isinstance(flagged, R.GiveUp) and flagged.exit_code == R.EX_CONFIG


def test_cpu_kv_cache_memory_bytes_alone_is_lowered_under_free_memory():
    d = D(Kind.INSUFFICIENT_FREE_MEMORY, free_gib=7.96, total_gib=9.59, requested_gib=64.0, cpu_kv_gib=64.0)
    out = R.decide(d, Flags.parse("--kv-cache-memory-bytes 64G --max-model-len 65408"), ctx())
    assert out.step == "cpu_kv_space"
    new = int(out.flags.get("--kv-cache-memory-bytes"))
    assert new == int(7.96 * 0.9 * 2**30) // 2**20 * 2**20
    assert out.flags.get("--max-model-len") == "65408"        # without the model's facts vLLM says if it still fits
    assert not out.flags.has("--gpu-memory-utilization")      # the share does not size an explicit KV cache


def test_cpu_share_whose_kv_part_lacks_memory_shrinks_by_what_it_lacked():
    # the 0.9 share (8.63 GiB) holds the worker (4.11 GiB) and then 4.52 GiB of KV; 3.10 GiB is available
    d = D(Kind.INSUFFICIENT_FREE_MEMORY, free_gib=3.10, total_gib=9.59, requested_gib=4.52, cpu_kv_auto_gib=4.52,
          cpu_share_gib=8.63)
    out = R.decide(d, Flags.parse("--gpu-memory-utilization 0.9"), ctx())
    # (8.63 - (4.52 - 3.10)) / 9.59 - 0.005 = 0.746 -> 0.74
    assert out.flags.get("--gpu-memory-utilization") == "0.74"
