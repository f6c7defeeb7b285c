"""What a person reads about a relaunch says the numbers it acted on, and they agree with the change.

Every reason the policy writes is generated here over the remedy table (each kind of failure, with
the numbers vLLM prints in the ranges it prints them, the flags and what the guard knows), and read
the way a person reads it: each figure the text states is checked against the change it explains
-- the length that failed is the length in effect ('was'), the value it arrives at is the change's
new value ('now'), the estimate it quotes is the one vLLM printed, and the arithmetic it names
(aligned down to the block, half of the length, under the free memory) holds. A text that says
"holds about 16384 tokens, not 16384; 8192 is that" fails here whatever row produced it.

The second class: no message gives a zero, negative or absurd size as advice, and none prints a
figure it does not have (``None``); when nothing fits, the message says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.config import RemedyConfig
from supervisor.core import remedy as R
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.core.plan import Sizing
from supervisor.facts.model_files import load_model_info

GiB = 1 << 30
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
LLAMA = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
VERSIONS = [None, "0.6.6", "0.8.5", "0.10.2", "0.13.0", "0.32.0"]
#: vLLM's default --gpu-memory-utilization (0.9; 0.92 from 0.20), for a reason that quotes the share in effect
DEFAULT_UTIL = {None: 0.92, "0.6.6": 0.9, "0.8.5": 0.9, "0.10.2": 0.9, "0.13.0": 0.9, "0.32.0": 0.92}
FLOAT = r"(\d+(?:\.\d+)?)"
INT = r"(\d+)"


@dataclass
class Case:
    """One failure and what the policy is given with it."""

    d: Diagnosis
    flags: Flags
    ctx: R.Context
    notes: list[str] = field(default_factory=list)

    def length(self) -> int | None:
        """The length in effect when the launch failed: the flag, else what vLLM printed, else config.json's."""
        n = self.d.numbers
        return (self.flags.get_int("--max-model-len") or n.get("max_model_len") or n.get("served_max_model_len")
                or self.ctx.derived_max_model_len)

    def block(self) -> int:
        return self.flags.get_int("--block-size") or self.d.numbers.get("block_size") or self.ctx.block_size or 16

    def util(self) -> float:
        """The share in effect: the flag, else what vLLM printed it asked for, else vLLM's default."""
        return (self.flags.get_float("--gpu-memory-utilization") or self.d.numbers.get("requested_utilization")
                or DEFAULT_UTIL[self.ctx.vllm_version])


# -- the claims a reason makes, and what each must agree with ---------------------------------------
def _now(c: R.Change) -> int:
    assert c.new is not None and c.new.isdigit(), c
    return int(c.new)


def check_change(case: Case, c: R.Change) -> int:
    """Check every figure ``c.why`` states; returns how many claims were read."""
    text, n, read = c.why, case.d.numbers, 0
    length, block = case.length(), case.block()
    asked = case.ctx.requested.get_int("--max-model-len")

    def claim(pattern: str) -> re.Match[str] | None:
        nonlocal read
        m = re.search(pattern, text)
        read += m is not None
        return m

    if m := claim(rf"the KV cache holds about {INT} tokens \(([^)]*)\)(, not {INT})?"):
        held, source = int(m[1]), m[2]
        if m[3]:
            assert int(m[4]) == length, (text, length)            # 'was': the length that failed
            assert held < length, text                           # ... and the cache holds fewer
        if source == "vLLM's estimate":
            assert held == n["fit_max_model_len"], text          # the estimate as vLLM printed it
        if mm := claim(rf"; {INT} is that, aligned down to the {INT}-token block"):
            assert int(mm[1]) == _now(c) and int(mm[2]) == block, text
            assert _now(c) % block == 0 and _now(c) <= held < _now(c) + block, text
        if mm := claim(rf"; {INT} is the {INT} asked for, aligned down to the {INT}-token block"):
            assert int(mm[2]) == asked and asked < held and _now(c) == asked // block * block, text
    if m := claim(rf"with the changes below about {INT}(, held to the {INT} (asked for|launched))?, aligned down "
                  rf"to the {INT}-token block"):
        tokens = int(m[1]) if not m[2] else min(int(m[1]), int(m[3]))
        assert m[2] is None or int(m[3]) == (asked if m[4] == "asked for" else length), text
        assert _now(c) == tokens // block * block < length, text
    if m := claim(rf"the KV cache cannot hold {INT} tokens"):
        assert int(m[1]) == length, (text, length)
        if mm := claim(rf"yet vLLM's estimate gives {INT}, no fewer"):
            assert int(mm[1]) == n["fit_max_model_len"] >= length, text
        if "printed no size" in text:
            assert n.get("fit_max_model_len") is None and n.get("kv_needed_gib") is None, text
        if mm := claim(rf"; {INT} is half of {INT}(, aligned down to the | in whole ){INT}-token block"):
            half = int(mm[1])
            assert int(mm[2]) == length and int(mm[4]) == block and half == length // 2 // block * block, text
            assert "below the floor" in text or half == _now(c), text
        if mm := claim(rf"; {INT} is {INT}(, aligned down to the | in whole ){INT}-token block"):
            assert int(mm[2]) == length and int(mm[1]) == length // block * block, text
    if m := claim(rf"only {INT} tokens fit, below the floor of {INT}"):
        assert int(m[1]) < int(m[2]) == case.ctx.rules.min_model_len, text
    if m := claim(rf"only {INT} of the {INT} tokens fit"):
        assert int(m[1]) < int(m[2]) == length, text
    if m := claim(rf"about {INT} tokens fit with fp8 KV"):
        assert int(m[1]) == _now(c) and c.flag == "--max-model-len", text
    if m := claim(rf"the model's config allows at most {INT} tokens"):
        assert int(m[1]) == _now(c), text
    if m := claim(rf"auto-fit found room for {INT} tokens, more than the {INT} asked for; {INT} fits"):
        assert int(m[1]) > int(m[2]) == int(m[3]) == _now(c), text
    if m := claim(rf"about {INT} tokens fit in the smaller KV cache"):
        assert int(m[1]) == _now(c), text
    if m := claim(rf"; {FLOAT} stays under it"):
        assert float(m[1]) == float(c.new or "nan"), text
        if mm := claim(rf"only {FLOAT} of {FLOAT} GiB is free"):
            assert float(m[1]) * float(mm[2]) <= float(mm[1]), text       # under what is free
    if m := claim(rf"at {FLOAT}; {FLOAT} gives vLLM more"):
        was = float(c.old) if c.old else case.util()
        assert float(m[1]) == round(was, 2) and float(m[2]) == float(c.new or "nan") > was, text
    if m := claim(rf"; {FLOAT}(?:, 0\.05 below {FLOAT})? stays under what they leave"):
        assert float(m[1]) == float(c.new or "nan"), text
    if m := claim(rf"{FLOAT}, 0\.05 below {FLOAT}"):
        assert float(m[1]) == float(c.new or "nan") and math.isclose(float(m[2]) - float(m[1]), 0.05), text
    if m := claim(rf"; {FLOAT} leaves room for them \(about {INT} tokens fewer\)"):
        assert float(m[1]) == float(c.new or "nan") < case.util(), text
    if m := claim(rf"so {FLOAT} leaves {FLOAT} GiB for them"):
        assert float(m[1]) == float(c.new or "nan") and float(m[2]) > 0, text
    if m := claim(rf"left the KV cache {FLOAT} GiB short of the {FLOAT} GiB available; {FLOAT} shrinks the share"):
        assert float(m[1]) > 0 and float(m[3]) == float(c.new or "nan") < n["cpu_share_gib"] / n["total_gib"], text
    if m := claim(rf"left the KV cache nothing after the worker's own {FLOAT} GiB; {FLOAT} gives it the {FLOAT} GiB"):
        assert float(m[1]) > 0 and float(m[2]) == float(c.new or "nan") > n["cpu_share_gib"] / n["total_gib"], text
    if m := claim(rf"{INT} sequences need half the activation memory"):
        assert int(m[1]) == _now(c), text
    if m := claim(rf"offloading {FLOAT} GiB of weights"):
        assert float(m[1]) == float(c.new or "nan") > 0, text
    if m := claim(rf"; {FLOAT} GiB stays under it"):
        assert float(m[1]) == round(_now(c) / GiB, 2) > 0, text
        if mm := claim(rf"only {FLOAT} of {FLOAT} GiB of CPU memory is available"):
            assert _now(c) / GiB <= float(mm[1]), text
    # the plan's reasons (a length it sizes with the relaunch's flags)
    if m := claim(rf"{INT} tokens do not fit"):     # the plan's: the length in effect, else config.json's
        assert int(m[1]) in (length, asked, 131072), (text, length)      # Llama-3.1-8B: max_position_embeddings
    if m := claim(rf"{INT} with its error band held back|; {INT} do \(block-aligned\)|the floor {INT}$"):
        assert int(next(g for g in m.groups() if g)) == _now(c), text
    if "sizes the length to the KV cache it measures (auto)" in text:
        read += 1
        assert c.new == "auto", text
    return read


def check_words(text: str) -> None:
    """No figure the guard does not have, and no size given as advice that is none."""
    assert "None" not in text and "nan" not in text, text
    for m in re.finditer(rf"(?:at most|to) (-?{FLOAT}) GiB", text):
        assert float(m[1]) > 0, text
    for m in re.finditer(r"(-\d+(?:\.\d+)?) GiB", text):
        raise AssertionError(f"a negative size: {m[0]!r} in {text!r}")


def check(case: Case) -> R.Decision:
    out = R.decide(case.d, case.flags, case.ctx)
    if isinstance(out, R.GiveUp):
        check_words(out.reason)
        check_words(out.advice)
        return out
    assert out.why, out
    check_words(out.why)
    for c in out.changes:
        assert c.why, c
        check_words(c.why)
        check_change(case, c)
        assert c.new == out.flags.get(c.flag), (c, out.flags)        # 'now' is the flag relaunched with
        assert c.old == case.flags.get(c.flag), (c, case.flags)      # 'was' is the flag that failed
    assert len({c.flag for c in out.changes}) == len(out.changes), out.changes    # each flag once
    share = out.flags.get_float("--gpu-memory-utilization")
    assert share is None or 0 < share <= 1, out             # vLLM takes a fraction of the device, at most all
    return out


# -- the remedy table, generated ----------------------------------------------------------------------
lengths = st.sampled_from([2048, 3000, 4096, 8192, 16384, 20000, 32768, 40960, 65536, 131072])
blocks = st.sampled_from([None, 16, 128])


@st.composite
def contexts(draw: st.DrawFn, flags: Flags) -> R.Context:
    version = draw(st.sampled_from(VERSIONS))
    known = draw(st.booleans())
    total = draw(st.sampled_from([None, 17.0, 22.06, 79.19]))
    free = None if total is None else draw(st.sampled_from([None, total, total - 1.0, total - 3.5, total / 2, 0.3]))
    # what the user asked: the launch's own length, none, or more (the guard never launches above the ask)
    asked = draw(st.sampled_from(["same", "none", "longer"]))
    requested = flags
    if asked == "none":
        requested = flags.remove("--max-model-len")
    elif asked != "same" and flags.get_int("--max-model-len"):
        length = flags.get_int("--max-model-len") or 0
        requested = flags.set("--max-model-len", length * 2)
    allowed = draw(st.sampled_from([RemedyConfig().allowed, ("kv_cache_fp8",), ("gpu_memory_utilization",),
                                    ("max_model_len", "gpu_memory_utilization")]))
    rules = RemedyConfig(min_model_len=draw(st.sampled_from([1024, 2048, 2000])), allowed=allowed,
                         cpu_offload_gb=draw(st.sampled_from([0, 4])))
    tried = tuple(draw(st.lists(st.sampled_from(
        ["kv_cache_fp8", "kv_small:enforce_eager", "kv_small:max_num_batched_tokens", "oom_kv_alloc",
         "no_kv:gpu_memory_utilization", "no_kv:enforce_eager", "oom_profile:max_num_seqs"]), max_size=3)))
    return R.Context(requested=requested, rules=rules, vllm_version=version, gpu_total_gib=total, gpu_free_gib=free,
                     block_size=draw(blocks), derived_max_model_len=draw(st.sampled_from([None, 131072, 32768])),
                     fp8_supported=draw(st.sampled_from([None, True, False])), tried=tried,
                     sizing=Sizing(LLAMA, vllm_version=version) if known else None)


@st.composite
def flag_sets(draw: st.DrawFn) -> Flags:
    f = Flags()
    if length := draw(st.sampled_from([None, 2048, 3000, 8192, 16384, 32768, 131072])):
        f = f.set("--max-model-len", length)
    if draw(st.booleans()):
        f = f.set("--gpu-memory-utilization", draw(st.sampled_from([0.1, 0.5, 0.85, 0.9, 0.925, 0.95])))
    if draw(st.booleans()):
        f = f.set("--kv-cache-dtype", "fp8")
    if draw(st.booleans()):
        f = f.set("--enforce-eager")
    if draw(st.booleans()):
        f = f.set("--max-num-seqs", draw(st.sampled_from([1, 64, 256])))
    return f


@st.composite
def kv_failures(draw: st.DrawFn) -> Diagnosis:
    n: dict[str, Any] = {}
    printed = draw(st.sampled_from([None, 1000, 2048, 4096, 131072]))
    if printed:
        n["max_model_len"] = printed
    form = draw(st.sampled_from(["estimate", "gib", "none"]))
    if form == "estimate":
        n["fit_max_model_len"] = draw(st.one_of(st.integers(0, 140000), st.sampled_from([1500, 20000, 30000])))
    elif form == "gib":
        n["kv_needed_gib"] = draw(st.sampled_from([16.0, 4.0]))      # more than is available: it failed
        n["kv_available_gib"] = draw(st.sampled_from([0.1, 1.2, 3.9]))
    if draw(st.booleans()):
        n["block_size"] = draw(st.sampled_from([16, 128]))
    return Diagnosis(Kind.KV_CACHE_INSUFFICIENT, numbers=n)


@st.composite
def other_failures(draw: st.DrawFn) -> Diagnosis:
    kind = draw(st.sampled_from([Kind.INSUFFICIENT_FREE_MEMORY, Kind.NO_KV_CACHE_MEMORY, Kind.OOM_PROFILE,
                                 Kind.OOM_CUDAGRAPH, Kind.OOM_RUNTIME, Kind.OOM_WEIGHTS, Kind.MAX_LEN_EXCEEDS_MODEL,
                                 Kind.AUTO_FIT_ABOVE_REQUEST]))
    n: dict[str, Any] = {}
    phase = None
    if kind is Kind.INSUFFICIENT_FREE_MEMORY:
        total = draw(st.sampled_from([9.59, 22.06, 79.19]))
        n["free_gib"] = draw(st.sampled_from([0.0, 0.2, 0.9, 3.1, total / 2, total - 1]))
        n["total_gib"] = total
        if draw(st.booleans()):
            n["requested_utilization"] = draw(st.sampled_from([0.9, 0.92]))
        cpu = draw(st.sampled_from(["gpu", "share", "kv_space"]))
        if cpu == "share":
            # the share's KV part: more than is free, or nothing (the worker's own memory filled the share)
            n["cpu_share_gib"] = 0.9 * total
            n["cpu_kv_auto_gib"] = draw(st.sampled_from([n["free_gib"] + 0.5, n["free_gib"] + 1.42, -1.2, 0.0]))
        elif cpu == "kv_space":
            n["cpu_kv_gib"] = draw(st.sampled_from([4.0, 64.0]))
    elif kind is Kind.OOM_PROFILE:
        phase = draw(st.sampled_from([None, "kv_cache", "profile"]))
        if draw(st.booleans()):
            n["num_dummy_requests"] = draw(st.sampled_from([256, 1024]))
    elif kind is Kind.MAX_LEN_EXCEEDS_MODEL:
        n["max_model_len"] = 200000
        if draw(st.booleans()):
            n["derived_max_model_len"] = draw(st.sampled_from([32768, 131072]))
    elif kind is Kind.AUTO_FIT_ABOVE_REQUEST:
        if draw(st.booleans()):
            n["fit_max_model_len"] = 9000
        if draw(st.booleans()):
            n["max_model_len"] = 8192
    return Diagnosis(kind, numbers=n, phase=phase)


@st.composite
def cases(draw: st.DrawFn, failures: st.SearchStrategy[Diagnosis]) -> Case:
    flags = draw(flag_sets())
    d = draw(failures)
    ctx = draw(contexts(flags))
    if d.kind is Kind.AUTO_FIT_ABOVE_REQUEST:      # vLLM chose more than asked (the classifier's check)
        flags = flags.set("--max-model-len", "auto")
        asked = ctx.requested.get_int("--max-model-len") or d.numbers.get("max_model_len") or 8192
        if "fit_max_model_len" in d.numbers:
            d = replace(d, numbers={**d.numbers, "fit_max_model_len": asked + 808})
    if d.kind is Kind.INSUFFICIENT_FREE_MEMORY and "cpu_kv_gib" in d.numbers and draw(st.booleans()):
        flags = flags.set("--kv-cache-memory-bytes", "64G")
        ctx = replace(ctx, cpu_kv_space_gib=None)
    elif "cpu_kv_gib" in d.numbers and draw(st.booleans()):
        ctx = replace(ctx, cpu_kv_space_gib=d.numbers["cpu_kv_gib"])
    return Case(d, flags, ctx)


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases(kv_failures()))
def test_every_kv_reason_says_the_numbers_it_acted_on(case: Case) -> None:
    check(case)


@SETTINGS
@given(cases(other_failures()))
def test_every_other_reason_says_the_numbers_it_acted_on(case: Case) -> None:
    check(case)


@settings(max_examples=300, deadline=None)
@given(free=st.floats(0.0, 64.0, allow_nan=False).map(lambda f: round(f, 2)),
       env=st.booleans(), flag=st.booleans(), total=st.sampled_from([9.59, 62.8]))
def test_the_cpu_kv_space_advice_is_a_size_vllm_can_be_given_or_says_nothing_fits(free, env, flag, total):
    """VLLM_CPU_KVCACHE_SPACE is whole GiB (vLLM reads it with int(); 0 is a KV cache of nothing), the
    flag any number of bytes; a tenth of what is free is held back (other processes' memory moves),
    and a KV cache under 0.25 GiB is none worth a launch."""
    d = Diagnosis(Kind.INSUFFICIENT_FREE_MEMORY, numbers={"free_gib": free, "total_gib": total, "cpu_kv_gib": 64.0})
    flags = Flags.parse("--kv-cache-memory-bytes 64G" if flag else "")
    out = check(Case(d, flags, R.Context(requested=flags, cpu_kv_space_gib=64.0 if env else None)))
    room = free * 0.9
    if isinstance(out, R.Relaunch):
        size = int(out.flags.get("--kv-cache-memory-bytes") or 0)
        assert 0.25 * GiB <= size <= room * GiB
        return
    if whole := re.search(r"VLLM_CPU_KVCACHE_SPACE \(or --kv-cache-memory-bytes\) to at most (\d+) GiB", out.advice):
        assert 1 <= int(whole[1]) <= room < int(whole[1]) + 1
    elif part := re.search(r"--kv-cache-memory-bytes to at most (\d+) \(", out.advice):
        assert 0.25 <= room < 1 and 0.25 * GiB <= int(part[1]) <= room * GiB
        assert "unset VLLM_CPU_KVCACHE_SPACE" in out.advice       # it wins over the flag
    else:
        assert room < 0.25 and out.advice.startswith(f"no KV cache fits in the {free} GiB"), out.advice
