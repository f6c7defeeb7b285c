"""The remedy policy as a specification: (diagnosis, current flags, what the guard knows) -> the next flags.

Each row is one decision, read as "after <failure> with <flags>, relaunch with <flags> (the step
taken)" or "give up with <exit code>". The numbers are what vLLM printed, in the interface names
the classifier extracts. Ladders (several failures in a row) are the second table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import RemedyConfig
from supervisor.core import plan as P
from supervisor.core import remedy as R
from supervisor.core.classifier import check_auto_fit
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.core.plan import Sizing
from supervisor.errors import EX_CONFIG, EX_TEMPFAIL
from supervisor.facts.model_files import load_model_info

KV, FREE, NO_KV = Kind.KV_CACHE_INSUFFICIENT, Kind.INSUFFICIENT_FREE_MEMORY, Kind.NO_KV_CACHE_MEMORY
CONFIG = Kind.CONFIG_ERROR


def D(kind: Kind, evidence: str = "", **numbers: Any) -> Diagnosis:
    return Diagnosis(kind, evidence=evidence, numbers=numbers)


@dataclass(frozen=True)
class Row:
    name: str
    failure: Diagnosis
    flags: str = ""                        # the flags of the launch that failed
    asked: str | None = None               # the user's own flags (default: the same)
    knows: dict[str, Any] = field(default_factory=dict)   # Context fields besides `requested`
    then: str | None = None                # the relaunch's whole flags ...
    step: str = ""                         # ... and the remedy step that produced them
    backoff: bool = False
    gives_up: int | None = None            # ... or the exit code of giving up
    says: str = ""                         # a phrase the reason (or advice) contains


ROWS = [
    # -- kv_cache_insufficient: the length vLLM says fits, aligned down to the block ---------------
    Row("V1 estimate, already block-aligned", D(KV, max_model_len=131072, fit_max_model_len=41840),
        then="--max-model-len 41840", step="max_model_len"),
    Row("an estimate between blocks is aligned down", D(KV, max_model_len=32768, fit_max_model_len=20001),
        "--max-model-len 32768", then="--max-model-len 20000", step="max_model_len"),
    Row("V0's token capacity is the fit", D(KV, max_model_len=32768, fit_max_model_len=19200),
        "--max-model-len 32768", then="--max-model-len 19200", step="max_model_len"),
    Row("the CPU build's 128-token block, the user's flags kept",
        D(KV, max_model_len=131072, fit_max_model_len=65408, block_size=128), "--enforce-eager",
        then="--enforce-eager --max-model-len 65408", step="max_model_len"),
    Row("0.7-0.9.0 print only GiB: the ratio, 3% and a block held back",
        D(KV, max_model_len=131072, kv_needed_gib=16.0, kv_available_gib=5.23),
        then="--max-model-len 41536", step="max_model_len", says="ratio of available to needed"),
    Row("no number at all: halve", D(KV), "--max-model-len 32768", then="--max-model-len 16384",
        step="max_model_len", says="16384 is half of 32768"),
    Row("never above what the user asked", D(KV, max_model_len=131072, fit_max_model_len=60000),
        "--max-model-len 16384", then="--max-model-len 8192", step="max_model_len",
        says="16384"),
    Row("below the floor: fp8 KV doubles the capacity", D(KV, max_model_len=32768, fit_max_model_len=1500),
        then="--kv-cache-dtype fp8 --max-model-len 2992", step="kv_cache_fp8", says="floor of 2048"),
    Row("the floor is configurable", D(KV, max_model_len=32768, fit_max_model_len=1500),
        knows={"rules": RemedyConfig(min_model_len=1024)}, then="--max-model-len 1488", step="max_model_len"),
    Row("below the floor, fp8 known unsupported, nothing left to free",
        D(KV, max_model_len=32768, fit_max_model_len=1500), "--enforce-eager --max-num-batched-tokens 512",
        knows={"fp8_supported": False, "vllm_version": "0.32.0"}, gives_up=EX_TEMPFAIL, says="floor"),
    Row("a length-only fix is not allowed: fp8 instead", D(KV, max_model_len=32768, fit_max_model_len=16000),
        knows={"rules": RemedyConfig(allowed=("kv_cache_fp8",))}, then="--kv-cache-dtype fp8", step="kv_cache_fp8"),
    Row("V0 measured above 32768 (chunked by itself): chunked prefill stays on below it",
        D(KV, max_model_len=131072, fit_max_model_len=30864), knows={"vllm_version": "0.6.6"},
        then="--max-model-len 30864 --enable-chunked-prefill", step="max_model_len"),
    Row("V0 measured below 32768: the length alone",
        D(KV, max_model_len=32768, fit_max_model_len=19200), "--max-model-len 32768",
        knows={"vllm_version": "0.6.6"}, then="--max-model-len 19200", step="max_model_len"),
    Row("V1: the length alone", D(KV, max_model_len=131072, fit_max_model_len=30864),
        knows={"vllm_version": "0.10.2"}, then="--max-model-len 30864", step="max_model_len"),
    Row("an unknown version: the length alone", D(KV, max_model_len=131072, fit_max_model_len=30864),
        then="--max-model-len 30864", step="max_model_len"),
    # -- auto-fit held to the guard's bounds ------------------------------------------------------
    Row("auto-fit above the request pins the request",
        check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=8192),
        "--max-model-len auto --enforce-eager", asked="--max-model-len 8192",
        then="--max-model-len 8192 --enforce-eager", step="max_model_len_asked", says="room for 9000"),
    # -- the other kinds --------------------------------------------------------------------------
    Row("above the model's own maximum: the derived length",
        D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=65536, derived_max_model_len=32768),
        "--max-model-len 65536", then="--max-model-len 32768", step="max_model_len_derived"),
    Row("free memory: the share under what vLLM found free, the length untouched",
        D(FREE, free_gib=60.12, total_gib=79.19, requested_utilization=0.92),
        # 60.12 / 79.19 = 0.7592, less the 0.005 margin, floored to 0.01
        then="--gpu-memory-utilization 0.75", step="gpu_memory_utilization_free"),
    Row("free memory: nothing left to share", D(FREE, free_gib=0.5, total_gib=79.19, requested_utilization=0.9),
        gives_up=EX_TEMPFAIL, says="other processes hold the rest"),
    Row("CPU build: a share whose KV part lacks memory shrinks by what it lacked",
        D(FREE, free_gib=3.10, total_gib=9.59, requested_gib=4.52, cpu_kv_auto_gib=4.52, cpu_share_gib=8.63),
        "--gpu-memory-utilization 0.9",
        # (8.63 - (4.52 - 3.10)) / 9.59 - 0.005 = 0.746
        then="--gpu-memory-utilization 0.74", step="gpu_memory_utilization_free"),
    Row("CPU build: a share the worker's own memory fills grows by what is available",
        D(FREE, free_gib=3.10, total_gib=9.59, requested_gib=-0.5, cpu_kv_auto_gib=-0.5, cpu_share_gib=4.0),
        "--gpu-memory-utilization 0.42",
        # the worker holds 4.0 + 0.5 = 4.5 GiB; with the 3.10 available for KV: 7.6 / 9.59 - 0.005 = 0.787
        then="--gpu-memory-utilization 0.78", step="gpu_memory_utilization_free", says="gives it the 3.1 GiB"),
    Row("CPU build: a share the worker fills, with more than the node to give: nothing fits",
        D(FREE, free_gib=3.10, total_gib=9.59, requested_gib=-1.2, cpu_kv_auto_gib=-1.2, cpu_share_gib=8.63),
        # 8.63 + 1.2 + 3.10 = 12.93 GiB, more than the node's 9.59
        "--gpu-memory-utilization 0.9", gives_up=EX_TEMPFAIL, says="free CPU memory"),
    Row("CPU build: VLLM_CPU_KVCACHE_SPACE above free memory is for a person to change",
        D(FREE, free_gib=7.96, total_gib=9.59, requested_gib=64.0, cpu_kv_gib=64.0),
        knows={"cpu_kv_space_gib": 64.0}, gives_up=EX_CONFIG, says="at most 7 GiB"),
    Row("CPU build: the environment variable wins over the flag, still a person's change",
        D(FREE, free_gib=7.96, total_gib=9.59, requested_gib=64.0, cpu_kv_gib=64.0),
        "--kv-cache-memory-bytes 64G", knows={"cpu_kv_space_gib": 64.0}, gives_up=EX_CONFIG),
    Row("CPU build: --kv-cache-memory-bytes alone is lowered under 90% of free memory",
        D(FREE, free_gib=7.96, total_gib=9.59, requested_gib=64.0, cpu_kv_gib=64.0),
        "--kv-cache-memory-bytes 64G --max-model-len 65408",
        then=f"--kv-cache-memory-bytes {int(7.96 * 0.9 * 2**30) // 2**20 * 2**20} --max-model-len 65408",
        step="cpu_kv_space"),
    Row("CUDA-graph capture failed: eager mode, the length untouched", D(Kind.OOM_CUDAGRAPH),
        "--max-model-len 8192", then="--max-model-len 8192 --enforce-eager", step="enforce_eager"),
    Row("OOM while serving: the last good flags, half the sequences, after backoff", D(Kind.OOM_RUNTIME),
        "--max-model-len 8192 --max-num-seqs 64",
        knows={"last_good": Flags.parse("--max-model-len 8192 --max-num-seqs 64")},
        then="--max-model-len 8192 --max-num-seqs 32", step="oom_runtime", backoff=True),
    Row("OOM loading weights, no CPU offload allowed", D(Kind.OOM_WEIGHTS), gives_up=EX_TEMPFAIL, says="quantized"),
    Row("no KV memory with the share the user set: never above it (a shared GPU), eager mode first",
        D(NO_KV), "--gpu-memory-utilization 0.4", then="--gpu-memory-utilization 0.4 --enforce-eager",
        step="no_kv:enforce_eager"),
    Row("no KV memory, CPU offload allowed", D(NO_KV),
        knows={"rules": RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=8), "vllm_version": "0.10.2"},
        then="--cpu-offload-gb 8", step="no_kv:cpu_offload"),
    Row("the engine died: the last good flags unchanged, after backoff", D(Kind.ENGINE_DEAD),
        "--max-model-len 8192", knows={"last_good": Flags.parse("--max-model-len 8192")},
        then="--max-model-len 8192", step="restart", backoff=True),
    Row("an unknown failure is treated as the engine dying", D(Kind.UNKNOWN_FAILURE, "KeyError: 'foo'"),
        "--max-model-len 8192", then="--max-model-len 8192", step="restart", backoff=True),
    # -- configuration errors ---------------------------------------------------------------------
    Row("an argument vLLM never had", D(CONFIG, "vllm: error: unrecognized arguments: --foo"), "--foo 1",
        gives_up=EX_CONFIG),
    Row("a flag this vLLM removed is dropped with the reason",
        D(CONFIG, "vllm: error: unrecognized arguments: --swap-space 4", vllm_version="0.20.0"),
        "--swap-space 4 --max-model-len 8192", then="--max-model-len 8192", step="drop_removed_flags",
        says="removed in vLLM 0.18.0"),
    Row("... once only", D(CONFIG, "vllm: error: unrecognized arguments: --swap-space 4", vllm_version="0.20.0"),
        "--swap-space 4", knows={"tried": ("drop_removed_flags",)}, gives_up=EX_CONFIG),
    Row("the port is in use: retried after backoff", D(CONFIG, "OSError: [Errno 98] Address already in use"),
        then="", step="port_retry", backoff=True),
    Row("... until the retries are spent", D(CONFIG, "OSError: [Errno 98] Address already in use"),
        knows={"port_failures": 3}, gives_up=EX_CONFIG),
    Row("chunked prefill the guard added and vLLM refused is undone",
        D(CONFIG, "ValueError: Sliding window is not supported with chunked prefill"),
        "--max-model-len 30864 --enable-chunked-prefill", asked="", knows={"vllm_version": "0.6.6"},
        then="--max-model-len 30864", step="undo_chunked_prefill"),
    Row("... the user's own chunked prefill is theirs",
        D(CONFIG, "ValueError: Sliding window is not supported with chunked prefill"),
        "--max-model-len 30864 --enable-chunked-prefill", knows={"vllm_version": "0.6.6"}, gives_up=EX_CONFIG),
    Row("fp8 KV the guard added, refused: give up with the KV failure that led there",
        D(CONFIG, "ValueError: No valid attention backend found for cuda ... [kv_cache_dtype not supported]"),
        "--kv-cache-dtype fp8", asked="",
        knows={"tried": ("kv_cache_fp8",), "previous": (D(KV, "ValueError: To serve at least one request ...",
                                                           max_model_len=32768, fit_max_model_len=1500),)},
        gives_up=EX_TEMPFAIL, says="To serve at least one request"),
    # -- config errors: vLLM's own line, and what a person can do about it (lines as vLLM prints them)
    Row("a gated model: HF_TOKEN",
        D(CONFIG, "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)"),
        gives_up=EX_CONFIG, says="HF_TOKEN"),
    Row("a model that does not exist: check its name",
        D(CONFIG, "OSError: org/missing-model is not a local folder and is not a valid model identifier listed "
                  "on 'https://huggingface.co/models'"), gives_up=EX_CONFIG, says="check the model name"),
    Row("the cause is vLLM's own line",
        D(CONFIG, "ValueError: World size (2) is larger than the number of available GPUs (1) in this node."),
        gives_up=EX_CONFIG, says="World size (2) is larger than the number of available GPUs (1)"),
    Row("more GPUs than present: what to change",
        D(CONFIG, "ValueError: World size (2) is larger than the number of available GPUs (1) in this node."),
        gives_up=EX_CONFIG, says="--tensor-parallel-size"),
    Row("an unknown flag: vLLM's help of the installed version",
        D(CONFIG, "api_server.py: error: unrecognized arguments: --max-modle-len 4096"),
        gives_up=EX_CONFIG, says="vllm serve --help"),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_one_decision(row: Row) -> None:
    asked = Flags.parse(row.flags if row.asked is None else row.asked)
    out = R.decide(row.failure, Flags.parse(row.flags), R.Context(requested=asked, **row.knows))
    if row.gives_up is not None:
        assert isinstance(out, R.GiveUp), out
        assert out.exit_code == row.gives_up
        assert row.says in out.reason + " " + out.advice
        return
    assert isinstance(out, R.Relaunch), out
    assert out.flags.argv() == Flags.parse(row.then or "").argv()
    assert (out.step, out.backoff) == (row.step, row.backoff)
    assert row.says in out.why + " ".join(c.why for c in out.changes)
    assert all(c.why for c in out.changes)             # every changed flag says why


@dataclass(frozen=True)
class Ladder:
    name: str
    failure: Diagnosis
    flags: str
    steps: tuple[str, ...]               # the steps taken, one relaunch each, in order
    ends_with: str                       # the flags after the last step
    knows: dict[str, Any] = field(default_factory=dict)


LADDERS = [
    Ladder("no KV memory: share, eager mode, batch, sequences, then give up (offload is off by default)",
           D(NO_KV), "--max-model-len 8192",
           ("no_kv:gpu_memory_utilization", "no_kv:enforce_eager", "no_kv:max_num_batched_tokens",
            "no_kv:max_num_seqs"),
           # 78 of 79.19 GiB free: (78 - 0.4 CUDA context) / 79.19 - 0.005 = 0.9749 -> 0.97, above vLLM's 0.92
           # and an 80 GB card's defaults are 8192 batched tokens and 1024 sequences: halved
           "--max-model-len 8192 --gpu-memory-utilization 0.97 --enforce-eager --max-num-batched-tokens 4096 "
           "--max-num-seqs 512", {"gpu_free_gib": 78.0, "gpu_total_gib": 79.19, "vllm_version": "0.33.0"}),
    # 0.34's extensible KV cache already takes all that is free (its default share is 1.0): no share to raise,
    # and, sized after capture, eager mode gives it the graphs' memory
    Ladder("no KV memory, the extensible KV cache: eager mode, batch, sequences, then give up",
           D(NO_KV), "--max-model-len 8192",
           ("no_kv:enforce_eager", "no_kv:max_num_batched_tokens", "no_kv:max_num_seqs"),
           "--max-model-len 8192 --enforce-eager --max-num-batched-tokens 4096 --max-num-seqs 512",
           {"gpu_free_gib": 78.0, "gpu_total_gib": 79.19, "vllm_version": "0.34.0"}),
    Ladder("OOM while profiling: half the sequences vLLM warmed up, fewer batched tokens, a lower share",
           D(Kind.OOM_PROFILE, num_dummy_requests=1024), "",
           ("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens", "oom_profile:lower_utilization"),
           "--max-num-seqs 512 --max-num-batched-tokens 1024 --gpu-memory-utilization 0.87",
           {"vllm_version": "0.33.0"}),
    Ladder("OOM while profiling, the extensible KV cache: its share steps down from 1.0",
           D(Kind.OOM_PROFILE, num_dummy_requests=1024), "",
           ("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens", "oom_profile:lower_utilization"),
           "--max-num-seqs 512 --max-num-batched-tokens 1024 --gpu-memory-utilization 0.95",
           {"vllm_version": "0.34.0"}),
    Ladder("KV below the floor: fp8, then free memory without cutting the length further",
           D(KV, max_model_len=2992, fit_max_model_len=1000), "--kv-cache-dtype fp8 --max-model-len 2992",
           ("kv_small:enforce_eager", "kv_small:max_num_batched_tokens"),
           "--kv-cache-dtype fp8 --max-model-len 2992 --enforce-eager --max-num-batched-tokens 1024",
           {"tried": ("kv_cache_fp8",)}),
    Ladder("V0: a smaller batch means chunked prefill (V0 refuses fewer tokens than the length)",
           D(NO_KV), "--max-model-len 16384 --enforce-eager", ("no_kv:max_num_batched_tokens",),
           "--max-model-len 16384 --enforce-eager --enable-chunked-prefill",
           {"vllm_version": "0.6.3", "tried": ("no_kv:gpu_memory_utilization",)}),
]


@pytest.mark.parametrize("ladder", LADDERS, ids=lambda ld: ld.name)
def test_a_ladder_of_failures(ladder: Ladder) -> None:
    flags = Flags.parse(ladder.flags)
    knows = dict(ladder.knows)
    tried = tuple(knows.pop("tried", ()))
    taken = []
    for _ in ladder.steps:
        out = R.decide(ladder.failure, flags, R.Context(requested=Flags.parse(ladder.flags), tried=tried, **knows))
        assert isinstance(out, R.Relaunch), out
        taken.append(out.step)
        tried += (out.step,)
        flags = out.flags
    assert tuple(taken) == ladder.steps
    assert flags.argv() == Flags.parse(ladder.ends_with).argv()
    last = R.decide(ladder.failure, flags, R.Context(requested=Flags.parse(ladder.flags), tried=tried, **knows))
    if "then give up" in ladder.name:
        assert isinstance(last, R.GiveUp) and last.exit_code == EX_TEMPFAIL


def test_a_relaunch_that_changes_nothing_is_giving_up() -> None:
    out = R.decide(D(Kind.OOM_CUDAGRAPH), Flags.parse("--enforce-eager --max-num-seqs 1 --max-num-batched-tokens 512"),
                   R.Context(requested=Flags(), tried=("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens",
                                                       "oom_profile:lower_utilization")))
    assert isinstance(out, R.GiveUp) and out.exit_code == EX_TEMPFAIL


def test_auto_fit_bounds() -> None:
    assert check_auto_fit({}, "kv_cache", floor=2048, cap=8192) is None            # nothing chosen yet
    assert check_auto_fit({"auto_fit_max_model_len": 4096}, "kv_cache", floor=2048, cap=8192) is None
    assert check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=None) is None
    low = check_auto_fit({"auto_fit_max_model_len": 1000}, "kv_cache", floor=2048, cap=8192)
    assert low is not None and low.kind is KV and low.numbers["fit_max_model_len"] == 1000
    high = check_auto_fit({"auto_fit_max_model_len": 9000}, "kv_cache", floor=2048, cap=8192)
    assert high is not None and high.kind is Kind.AUTO_FIT_ABOVE_REQUEST
    assert "above the --max-model-len 8192" in high.evidence


#: Each decision in full, as the log, /status and the history show it: the relaunch's reason and every
#: changed flag (flag, was, now, why), or giving up's reason and advice. The numbers in them are the
#: rows' own (their comments give the arithmetic); the words are what a person reads.
WHOLE: dict[str, tuple[Any, ...]] = {
    'V1 estimate, already block-aligned': (
        "the KV cache holds about 41840 tokens (vLLM's estimate), not 131072; 41840 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '41840',
             "the KV cache holds about 41840 tokens (vLLM's estimate), not 131072; 41840 is that, aligned down to "
             'the 16-token block'),
        )),
    'an estimate between blocks is aligned down': (
        "the KV cache holds about 20001 tokens (vLLM's estimate), not 32768; 20000 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', '32768', '20000',
             "the KV cache holds about 20001 tokens (vLLM's estimate), not 32768; 20000 is that, aligned down to "
             'the 16-token block'),
        )),
    "V0's token capacity is the fit": (
        "the KV cache holds about 19200 tokens (vLLM's estimate), not 32768; 19200 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', '32768', '19200',
             "the KV cache holds about 19200 tokens (vLLM's estimate), not 32768; 19200 is that, aligned down to "
             'the 16-token block'),
        )),
    "the CPU build's 128-token block, the user's flags kept": (
        "the KV cache holds about 65408 tokens (vLLM's estimate), not 131072; 65408 is that, aligned down to the "
        '128-token block', (
            ('--max-model-len', None, '65408',
             "the KV cache holds about 65408 tokens (vLLM's estimate), not 131072; 65408 is that, aligned down to "
             'the 128-token block'),
        )),
    # vLLM's 60000 is above the 16384 asked for (and served): the cap is 16384, no shorter than what
    # failed, so the length is halved: 16384 // 2 = 8192
    'never above what the user asked': (
        "the KV cache cannot hold 16384 tokens, yet vLLM's estimate gives 60000, no fewer; 8192 is half of 16384, "
        'aligned down to the 16-token block', (
            ('--max-model-len', '16384', '8192',
             "the KV cache cannot hold 16384 tokens, yet vLLM's estimate gives 60000, no fewer; 8192 is half of "
             '16384, aligned down to the 16-token block'),
        )),
    '0.7-0.9.0 print only GiB: the ratio, 3% and a block held back': (
        'the KV cache holds about 41542 tokens (the ratio of available to needed KV memory), not 131072; 41536 is '
        'that, aligned down to the 16-token block', (
            ('--max-model-len', None, '41536',
             'the KV cache holds about 41542 tokens (the ratio of available to needed KV memory), not 131072; '
             '41536 is that, aligned down to the 16-token block'),
        )),
    # vLLM printed no size: nothing "holds about 16384 tokens"; the length is halved (32768 // 2)
    'no number at all: halve': (
        'the KV cache cannot hold 32768 tokens and vLLM printed no size for it; 16384 is half of 32768, aligned '
        'down to the 16-token block', (
            ('--max-model-len', '32768', '16384',
             'the KV cache cannot hold 32768 tokens and vLLM printed no size for it; 16384 is half of 32768, '
             'aligned down to the 16-token block'),
        )),
    'below the floor: fp8 KV doubles the capacity': (
        'only 1500 tokens fit, below the floor of 2048; fp8 KV doubles the capacity', (
            ('--kv-cache-dtype', None, 'fp8',
             'only 1500 tokens fit, below the floor of 2048; fp8 KV doubles the capacity'),
            ('--max-model-len', None, '2992',
             'about 2992 tokens fit with fp8 KV'),
        )),
    'the floor is configurable': (
        "the KV cache holds about 1500 tokens (vLLM's estimate), not 32768; 1488 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '1488',
             "the KV cache holds about 1500 tokens (vLLM's estimate), not 32768; 1488 is that, aligned down to the "
             '16-token block'),
        )),
    'below the floor, fp8 known unsupported, nothing left to free': (
        'the KV cache holds only about 1500 tokens, below the floor --min-model-len 2048',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    # 16000 tokens are above the 2048 floor: what stops a shorter length is the remedies allowed
    'a length-only fix is not allowed: fp8 instead': (
        'only 16000 of the 32768 tokens fit, and the remedies allowed do not include the length; fp8 KV doubles '
        'the capacity', (
            ('--kv-cache-dtype', None, 'fp8',
             'only 16000 of the 32768 tokens fit, and the remedies allowed do not include the length; fp8 KV '
             'doubles the capacity'),
        )),
    'V0 measured above 32768 (chunked by itself): chunked prefill stays on below it': (
        "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '30864',
             "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to "
             'the 16-token block'),
            ('--enable-chunked-prefill', None, '',
             'below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory '
             'profile, and so the KV cache, as measured'),
        )),
    'V0 measured below 32768: the length alone': (
        "the KV cache holds about 19200 tokens (vLLM's estimate), not 32768; 19200 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', '32768', '19200',
             "the KV cache holds about 19200 tokens (vLLM's estimate), not 32768; 19200 is that, aligned down to "
             'the 16-token block'),
        )),
    'V1: the length alone': (
        "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '30864',
             "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to "
             'the 16-token block'),
        )),
    'an unknown version: the length alone': (
        "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '30864',
             "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to "
             'the 16-token block'),
        )),
    'auto-fit above the request pins the request': (
        "vLLM's auto-fit found room for 9000 tokens, more than the 8192 asked for; 8192 fits", (
            ('--max-model-len', 'auto', '8192',
             "vLLM's auto-fit found room for 9000 tokens, more than the 8192 asked for; 8192 fits"),
        )),
    "above the model's own maximum: the derived length": (
        "the model's config allows at most 32768 tokens", (
            ('--max-model-len', '65536', '32768',
             "the model's config allows at most 32768 tokens"),
        )),
    'free memory: the share under what vLLM found free, the length untouched': (
        'only 60.12 of 79.19 GiB is free (other processes hold the rest); 0.75 stays under it', (
            ('--gpu-memory-utilization', None, '0.75',
             'only 60.12 of 79.19 GiB is free (other processes hold the rest); 0.75 stays under it'),
        )),
    'free memory: nothing left to share': (
        'only 0.5/79.19 GiB is free on the GPU; other processes hold the rest',
        'free the GPU (see the processes holding it)'),
    'CPU build: a share whose KV part lacks memory shrinks by what it lacked': (
        'the CPU memory share left the KV cache 1.42 GiB short of the 3.1 GiB available; 0.74 shrinks the share by '
        'that', (
            ('--gpu-memory-utilization', '0.9', '0.74',
             'the CPU memory share left the KV cache 1.42 GiB short of the 3.1 GiB available; 0.74 shrinks the '
             'share by that'),
        )),
    "CPU build: a share the worker's own memory fills grows by what is available": (
        "the CPU memory share (4.0 GiB) left the KV cache nothing after the worker's own 4.50 GiB; 0.78 gives it "
        'the 3.1 GiB available', (
            ('--gpu-memory-utilization', '0.42', '0.78',
             "the CPU memory share (4.0 GiB) left the KV cache nothing after the worker's own 4.50 GiB; 0.78 gives "
             'it the 3.1 GiB available'),
        )),
    'CPU build: a share the worker fills, with more than the node to give: nothing fits': (
        'only 3.1/9.59 GiB is free on CPU memory; other processes hold the rest',
        'free CPU memory (see the processes holding it)'),
    'CPU build: VLLM_CPU_KVCACHE_SPACE above free memory is for a person to change': (
        'the KV cache was set to 64.0 GiB, but only 7.96 of 9.59 GiB of CPU memory is available '
        '(VLLM_CPU_KVCACHE_SPACE decides it, and vllm-guard does not change your environment)',
        'set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most 7 GiB, or free memory on this machine'),
    "CPU build: the environment variable wins over the flag, still a person's change": (
        'the KV cache was set to 64.0 GiB, but only 7.96 of 9.59 GiB of CPU memory is available '
        '(VLLM_CPU_KVCACHE_SPACE decides it, and vllm-guard does not change your environment)',
        'set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most 7 GiB, or free memory on this machine'),
    'CPU build: --kv-cache-memory-bytes alone is lowered under 90% of free memory': (
        'only 7.96 of 9.59 GiB of CPU memory is available; 7.16 GiB stays under it', (
            ('--kv-cache-memory-bytes', '64G', '7691304960',
             'only 7.96 of 9.59 GiB of CPU memory is available; 7.16 GiB stays under it'),
        )),
    'CUDA-graph capture failed: eager mode, the length untouched': (
        'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture', (
            ('--enforce-eager', None, '',
             'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture'),
        )),
    'OOM while serving: the last good flags, half the sequences, after backoff': (
        'CUDA ran out of memory while serving', (
            ('--max-num-seqs', '64', '32',
             'CUDA ran out of memory while serving; fewer concurrent sequences need less activation memory'),
        )),
    'OOM loading weights, no CPU offload allowed': (
        "the model's weights do not fit in GPU memory",
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'no KV memory with the share the user set: never above it (a shared GPU), eager mode first': (
        'no memory was left for the KV cache; eager mode frees what CUDA graphs and compilation take', (
            ('--enforce-eager', None, '',
             'no memory was left for the KV cache; eager mode frees what CUDA graphs and compilation take'),
        )),
    'no KV memory, CPU offload allowed': (
        'offloading 8 GiB of weights to CPU leaves GPU memory for the KV cache (slow)', (
            ('--cpu-offload-gb', None, '8',
             'offloading 8 GiB of weights to CPU leaves GPU memory for the KV cache (slow)'),
        )),
    'the engine died: the last good flags unchanged, after backoff': (
        'the engine died (engine_dead); relaunching with the last good flags', (
        )),
    'an unknown failure is treated as the engine dying': (
        'the engine died (unknown_failure); relaunching with the last good flags', (
        )),
    'an argument vLLM never had': (
        'vLLM refused its configuration: vllm: error: unrecognized arguments: --foo',
        'remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version'),
    'a flag this vLLM removed is dropped with the reason': (
        '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)', (
            ('--swap-space', '4', None,
             '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)'),
        )),
    '... once only': (
        'vLLM refused its configuration: vllm: error: unrecognized arguments: --swap-space 4',
        'remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version'),
    'the port is in use: retried after backoff': (
        'the port is in use; the previous holder may be exiting', (
        )),
    '... until the retries are spent': (
        'vLLM refused its configuration: OSError: [Errno 98] Address already in use',
        'stop the process holding the port, or give vLLM another --port'),
    'chunked prefill the guard added and vLLM refused is undone': (
        'vLLM refused the chunked prefill the guard had added; relaunching without it', (
            ('--enable-chunked-prefill', '', None,
             'vLLM refused chunked prefill here; without it'),
        )),
    "... the user's own chunked prefill is theirs": (
        'vLLM refused its configuration: ValueError: Sliding window is not supported with chunked prefill',
        'this GPU or this vLLM does not support what was asked: choose a --dtype, --quantization or '
        '--kv-cache-dtype it supports, or another vLLM version'),
    'fp8 KV the guard added, refused: give up with the KV failure that led there': (
        'this GPU refuses fp8 KV cache, and without it the KV cache is below the floor (ValueError: To serve at '
        'least one request ...)',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'a gated model: HF_TOKEN': (
        'vLLM refused its configuration: huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: '
        'Root=1-abc)',
        'the model is gated: accept its licence on huggingface.co and give vLLM a token that may read it (HF_TOKEN '
        "in the guard's environment; /etc/vllm-guard/env under systemd)"),
    'a model that does not exist: check its name': (
        'vLLM refused its configuration: OSError: org/missing-model is not a local folder and is not a valid model '
        "identifier listed on 'https://huggingface.co/models'",
        'check the model name: a Hugging Face repo id (org/name) or a local directory with config.json; a private '
        'repo also needs HF_TOKEN'),
    "the cause is vLLM's own line": (
        'vLLM refused its configuration: ValueError: World size (2) is larger than the number of available GPUs '
        '(1) in this node',
        'make --tensor-parallel-size x --pipeline-parallel-size fit the GPUs this process sees '
        "(CUDA_VISIBLE_DEVICES) and divide the model's attention heads"),
    'more GPUs than present: what to change': (
        'vLLM refused its configuration: ValueError: World size (2) is larger than the number of available GPUs '
        '(1) in this node',
        'make --tensor-parallel-size x --pipeline-parallel-size fit the GPUs this process sees '
        "(CUDA_VISIBLE_DEVICES) and divide the model's attention heads"),
    "an unknown flag: vLLM's help of the installed version": (
        'vLLM refused its configuration: api_server.py: error: unrecognized arguments: --max-modle-len 4096',
        'remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version'),
}


# -- more decisions, each branch of the policy (what scripts/mutation showed no row reached) ---------------
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
LLAMA = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct"))
TINY_CPU = load_model_info(str(MODELS / "tiny-llama-cpu"))
QWEN7B = load_model_info(str(MODELS / "Qwen2.5-7B-Instruct"))


def sized(version: str | None, info: Any = LLAMA, **kw: Any) -> Sizing:
    """The plan's facts for the model, as the session builds them (an L4-class card unless given)."""
    return Sizing(info, gpus=1, vllm_version=version, **kw)


L4_FACTS = {"gpu_total_gib": 22.06, "gpu_free_gib": 22.06}
MORE = [
    # -- insufficient free memory ---------------------------------------------------------------
    Row("free memory: nothing printed and nothing known: give up", D(FREE), gives_up=EX_TEMPFAIL),
    Row("free memory: the share may not be changed: give up", D(FREE, free_gib=60.12, total_gib=79.19),
        knows={"rules": RemedyConfig(allowed=("max_model_len",))}, gives_up=EX_TEMPFAIL),
    Row("free memory from NVML (nothing printed): its CUDA context is taken off too",
        D(FREE), knows={"gpu_free_gib": 60.12, "gpu_total_gib": 79.19},
        # (60.12 - 0.4 context) / 79.19 = 0.7541, less the 0.005 margin -> 0.74
        then="--gpu-memory-utilization 0.74", step="gpu_memory_utilization_free"),
    Row("free memory: a share already under what is free cannot be lowered by this rule",
        D(FREE, free_gib=60.12, total_gib=79.19), "--gpu-memory-utilization 0.5", gives_up=EX_TEMPFAIL),
    Row("free memory: the share left cannot hold the weights",
        D(FREE, free_gib=12.0, total_gib=22.06), knows={"sizing": sized("0.32.0"), **L4_FACTS}, gives_up=EX_TEMPFAIL),
    Row("free memory with the model known, a length-only change not allowed: the share alone",
        D(FREE, free_gib=19.06, total_gib=22.06),
        knows={"sizing": sized("0.32.0"), "vllm_version": "0.32.0", **L4_FACTS,
               "rules": RemedyConfig(allowed=("gpu_memory_utilization",))},
        then="--gpu-memory-utilization 0.85", step="gpu_memory_utilization_free"),
    Row("CPU build: a node figure names CPU memory when nothing is left",
        D(FREE, free_gib=0.2, total_gib=9.59, requested_gib=8.63, cpu_node=True), gives_up=EX_TEMPFAIL),
    # -- the CPU build's KV space -----------------------------------------------------------------
    Row("CPU build: too little memory left for any KV cache", D(FREE, free_gib=0.2, total_gib=9.59, cpu_kv_gib=64.0),
        "--kv-cache-memory-bytes 64G", gives_up=EX_TEMPFAIL),
    Row("CPU build: under a GiB free, the variable (whole GiB) cannot say it: the flag's bytes",
        D(FREE, free_gib=0.8, total_gib=9.59, cpu_kv_gib=64.0), knows={"cpu_kv_space_gib": 64.0}, gives_up=EX_CONFIG,
        # 0.8 x 0.9 = 0.72 GiB = 773094113 bytes, down to whole MiB: 737 x 2**20 = 772800512
        says="at most 772800512 (0.72 GiB)"),
    Row("CPU build: the share may not be changed", D(FREE, free_gib=7.96, total_gib=9.59, cpu_kv_gib=64.0),
        "--kv-cache-memory-bytes 64G", knows={"rules": RemedyConfig(allowed=("max_model_len",))},
        gives_up=EX_TEMPFAIL),
    Row("CPU build: a smaller KV cache with the model known shortens the length too",
        D(FREE, free_gib=0.5, total_gib=9.59, cpu_kv_gib=64.0, max_model_len=131072),
        "--kv-cache-memory-bytes 64G --max-model-len 131072",
        knows={"sizing": sized("0.32.0", TINY_CPU, platform="cpu"), "vllm_version": "0.32.0", "block_size": 128},
        then="--kv-cache-memory-bytes 482344960 --max-model-len 29312", step="cpu_kv_space"),
    # -- OOM while serving, loading weights, the engine dying -----------------------------------------
    Row("OOM while serving, fewer sequences not allowed: the same flags after backoff", D(Kind.OOM_RUNTIME),
        "--max-num-seqs 64", knows={"rules": RemedyConfig(allowed=("restart",))},
        then="--max-num-seqs 64", step="restart", backoff=True),
    Row("OOM while serving at one sequence already: the same flags after backoff", D(Kind.OOM_RUNTIME),
        "--max-num-seqs 1", then="--max-num-seqs 1", step="restart", backoff=True),
    Row("OOM while serving with no last good flags: vLLM's default for an 80 GB card halved",
        D(Kind.OOM_RUNTIME), knows={"gpu_total_gib": 79.19, "vllm_version": "0.32.0"},
        then="--max-num-seqs 512", step="oom_runtime", backoff=True),
    Row("OOM while serving on a 24 GB card: 256 sequences halved", D(Kind.OOM_RUNTIME),
        knows={"gpu_total_gib": 22.06, "vllm_version": "0.32.0"}, then="--max-num-seqs 128", step="oom_runtime",
        backoff=True),
    Row("OOM loading weights, CPU offload allowed", D(Kind.OOM_WEIGHTS),
        knows={"rules": RemedyConfig(cpu_offload_gb=4), "vllm_version": "0.10.2"},
        then="--cpu-offload-gb 4", step="oom_weights:cpu_offload"),
    Row("the engine died saying why: the reason is vLLM's",
        Diagnosis(Kind.ENGINE_DEAD, evidence="x", detail="vLLM was killed by SIGKILL."),
        "--max-model-len 8192", then="--max-model-len 8192", step="restart", backoff=True),
    # -- the model's maximum, auto-fit ------------------------------------------------------------------
    Row("above the model's maximum, which the log does not say and the model is unknown",
        D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=65536), "--max-model-len 65536", gives_up=EX_CONFIG),
    Row("above the model's maximum: config.json's when the log does not say it",
        D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=200000), "--max-model-len 200000",
        knows={"derived_max_model_len": 131072}, then="--max-model-len 131072", step="max_model_len_derived"),
    Row("above the model's maximum, a length change not allowed",
        D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=65536, derived_max_model_len=32768), "--max-model-len 65536",
        knows={"rules": RemedyConfig(allowed=("restart",))}, gives_up=EX_CONFIG),
    Row("auto-fit above a request nobody can name", D(Kind.AUTO_FIT_ABOVE_REQUEST, fit_max_model_len=9000),
        "--max-model-len auto", asked="--max-model-len auto", gives_up=EX_CONFIG),
    Row("auto-fit above the length the log says was asked",
        D(Kind.AUTO_FIT_ABOVE_REQUEST, fit_max_model_len=9000, max_model_len=8192), "--max-model-len auto",
        asked="--max-model-len auto", then="--max-model-len 8192", step="max_model_len_asked"),
    # -- the KV cache, with the model known --------------------------------------------------------------
    Row("KV: neither a size nor a length: give up", D(KV), gives_up=EX_TEMPFAIL),
    Row("KV: the estimate no shorter than the length: halve instead",
        D(KV, max_model_len=16384, fit_max_model_len=20000), "--max-model-len 16384",
        then="--max-model-len 8192", step="max_model_len"),
    Row("KV on V0 0.6 with the model known: chunked prefill frees the whole-context profile",
        D(KV, max_model_len=32768, fit_max_model_len=20000), "--max-model-len 32768",
        knows={"sizing": sized("0.6.6"), "vllm_version": "0.6.6"},
        then="--max-model-len 32768 --enable-chunked-prefill", step="max_model_len"),
    Row("KV below the floor, fp8 known unsupported: eager mode first (0.20+ counts graphs in the budget)",
        D(KV, max_model_len=32768, fit_max_model_len=1500), knows={"fp8_supported": False, "vllm_version": "0.32.0"},
        then="--enforce-eager", step="kv_small:enforce_eager"),
    Row("KV below the floor before 0.20: eager mode frees nothing for it, a smaller batch does",
        D(KV, max_model_len=32768, fit_max_model_len=1500), knows={"fp8_supported": False, "vllm_version": "0.10.2",
                                                                   "gpu_total_gib": 22.06},
        then="--max-num-batched-tokens 1024", step="kv_small:max_num_batched_tokens"),
    Row("KV below the floor with fp8 already: give up, saying fp8 was tried",
        D(KV, max_model_len=2992, fit_max_model_len=1000), "--kv-cache-dtype fp8 --max-model-len 2992",
        knows={"tried": ("kv_cache_fp8", "kv_small:enforce_eager", "kv_small:max_num_batched_tokens")},
        gives_up=EX_TEMPFAIL),
    Row("KV far below the floor on V0 with the model known: chunked prefill alone lifts it over",
        D(KV, max_model_len=16384, fit_max_model_len=1200), "--max-model-len 16384",
        knows={"sizing": sized("0.6.6"), "vllm_version": "0.6.6"},
        then="--max-model-len 5216 --enable-chunked-prefill", step="max_model_len"),
    # -- OOM while profiling ---------------------------------------------------------------------------
    Row("OOM allocating V0's KV cache with the free memory known: a share under it",
        replace(D(Kind.OOM_PROFILE), phase="kv_cache"), "--gpu-memory-utilization 0.9",
        knows={"gpu_free_gib": 18.0, "gpu_total_gib": 22.06, "vllm_version": "0.6.6"},
        then="--gpu-memory-utilization 0.77", step="oom_kv_alloc"),
    Row("OOM allocating the KV cache, nothing known: a step down", replace(D(Kind.OOM_PROFILE), phase="kv_cache"),
        "--gpu-memory-utilization 0.9", then="--gpu-memory-utilization 0.85", step="oom_kv_alloc"),
    Row("OOM while profiling, everything tried: give up",
        D(Kind.OOM_PROFILE), "--max-num-seqs 1 --max-num-batched-tokens 512 --gpu-memory-utilization 0.5",
        knows={"tried": ("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens",
                         "oom_profile:lower_utilization")}, gives_up=EX_TEMPFAIL),
    Row("OOM while profiling with the sequences vLLM warmed up unknown: vLLM's default halved",
        D(Kind.OOM_PROFILE), knows={"gpu_total_gib": 22.06, "vllm_version": "0.32.0"},
        then="--max-num-seqs 128", step="oom_profile:max_num_seqs"),
    # -- configuration errors -----------------------------------------------------------------------------
    Row("two removed flags at once are both dropped",
        D(CONFIG, "vllm: error: unrecognized arguments: --swap-space 4 --disable-log-requests", vllm_version="0.20.0"),
        "--swap-space 4 --disable-log-requests --max-model-len 8192", then="--max-model-len 8192",
        step="drop_removed_flags"),
    Row("an unrecognized flag vLLM never removed is the user's to fix",
        D(CONFIG, "vllm: error: unrecognized arguments: --max-modle-len 4096", vllm_version="0.20.0"),
        "--max-modle-len 4096", gives_up=EX_CONFIG),
]

MORE += [
    # -- a relaunch that frees memory also gets the length the plan says fits then (_foresee) ----------
    Row("CUDA-graph OOM with the model known before 0.14: eager mode and the length that fits with it",
        D(Kind.OOM_CUDAGRAPH), knows={"sizing": sized("0.10.2"), "vllm_version": "0.10.2", **L4_FACTS},
        then="--enforce-eager --max-model-len 27424", step="enforce_eager"),
    Row("CUDA-graph OOM with the model known on V0: eager, the length, and chunked prefill it counts on",
        D(Kind.OOM_CUDAGRAPH), knows={"sizing": sized("0.6.6"), "vllm_version": "0.6.6", **L4_FACTS},
        then="--enforce-eager --max-model-len 27424 --enable-chunked-prefill", step="enforce_eager"),
    Row("CUDA-graph OOM with the model known, a length the plan says fits: eager mode alone",
        D(Kind.OOM_CUDAGRAPH), "--max-model-len 4096", knows={"sizing": sized("0.10.2"), "vllm_version": "0.10.2",
                                                              **L4_FACTS},
        then="--max-model-len 4096 --enforce-eager", step="enforce_eager"),
    Row("CUDA-graph OOM with eager mode on and every profiling remedy tried: give up",
        D(Kind.OOM_CUDAGRAPH), "--enforce-eager --max-num-seqs 1 --max-num-batched-tokens 512",
        knows={"tried": ("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens",
                         "oom_profile:lower_utilization")}, gives_up=EX_TEMPFAIL),
    # -- vLLM's batch defaults, by GPU and version (EngineArgs._set_default_args) --------------------
    Row("OOM while serving on an A100 80GB: 256 sequences (vLLM gives the A100 the small defaults)",
        D(Kind.OOM_RUNTIME),
        knows={"gpu_total_gib": 79.15, "vllm_version": "0.32.0",
               "sizing": sized("0.32.0", device_name="NVIDIA A100-SXM4-80GB")},
        then="--max-num-seqs 128", step="oom_runtime", backoff=True),
    Row("OOM while serving on the CPU build: 128 sequences a rank, halved", D(Kind.OOM_RUNTIME),
        knows={"vllm_version": "0.32.0", "sizing": sized("0.32.0", TINY_CPU, platform="cpu")},
        then="--max-num-seqs 64", step="oom_runtime", backoff=True),
    Row("no KV memory on V0 with a long context: chunked prefill's 2048-token chunks are the batch",
        D(NO_KV), "--max-model-len 65536 --enforce-eager",
        knows={"vllm_version": "0.6.6", "tried": ("no_kv:gpu_memory_utilization",)},
        then="--max-model-len 65536 --enforce-eager --max-num-batched-tokens 1024",
        step="no_kv:max_num_batched_tokens"),
    # -- configuration errors that say what to change --------------------------------------------------
    Row("too few GPUs: vLLM's numbers name what was asked and found",
        Diagnosis(CONFIG, evidence="ValueError: World size (4) is larger than the number of available GPUs (2)",
                  numbers={"required_gpus": 4, "available_gpus": 2},
                  detail="vLLM needs 4 GPUs, only 2 are available: lower --tensor-parallel-size"),
        gives_up=EX_CONFIG),
    Row("the classifier's own words for a refusal it explains",
        Diagnosis(CONFIG, evidence="ValueError: bad value", detail="ValueError: bad value: set --dtype half"),
        gives_up=EX_CONFIG),
    Row("a long refusal is cut at 300 characters", D(CONFIG, "ValueError: " + "y" * 400), gives_up=EX_CONFIG),
    Row("fp8 KV refused (kv_cache_dtype) after the guard set it, with no KV failure on record",
        D(CONFIG, "ValueError: kv_cache_dtype fp8 is not supported"), "--kv-cache-dtype fp8", asked="",
        knows={"tried": ("kv_cache_fp8",)}, gives_up=EX_TEMPFAIL),
    Row("fp8 KV refused (kv cache dtype), the KV failure's evidence cut at 200 characters",
        D(CONFIG, "NotImplementedError: kv cache dtype fp8 unsupported here"), "--kv-cache-dtype fp8", asked="",
        knows={"tried": ("kv_cache_fp8",), "previous": (D(KV, "ValueError: " + "z" * 300),)}, gives_up=EX_TEMPFAIL),
    Row("fp8 KV refused (--kv-cache-dtype) that the user asked: theirs to change",
        D(CONFIG, "error: argument --kv-cache-dtype: invalid choice: 'fp8'"), "--kv-cache-dtype fp8",
        gives_up=EX_CONFIG),
    Row("chunked prefill refused twice: the undo was tried, give up",
        D(CONFIG, "ValueError: Sliding window is not supported with chunked prefill"),
        "--max-model-len 30864 --enable-chunked-prefill", asked="",
        knows={"vllm_version": "0.6.6", "tried": ("undo_chunked_prefill",)}, gives_up=EX_CONFIG),
    Row("a removed flag given as --flag=value is dropped",
        D(CONFIG, "vllm: error: unrecognized arguments: --swap-space=4", vllm_version="0.20.0"),
        "--swap-space=4 --max-model-len 8192", then="--max-model-len 8192", step="drop_removed_flags"),
    Row("a flag vLLM calls unrecognized before the release the table says removed it: dropped, with why",
        D(CONFIG, "vllm: error: unrecognized arguments: --swap-space 4", vllm_version="0.17.0"),
        "--swap-space 4 --max-model-len 8192", then="--max-model-len 8192", step="drop_removed_flags"),
    Row("a length above the model's maximum that is the maximum: no remedy changes anything",
        D(Kind.MAX_LEN_EXCEEDS_MODEL, max_model_len=32768, derived_max_model_len=32768), "--max-model-len 32768",
        gives_up=EX_TEMPFAIL),
    Row("a removed flag, the version known from the start-up and not the log",
        D(CONFIG, "vllm: error: unrecognized arguments: --swap-space 4"), "--swap-space 4 --max-model-len 8192",
        knows={"vllm_version": "0.20.0"}, then="--max-model-len 8192", step="drop_removed_flags"),
]

MORE += [
    Row("no KV memory, every step of the ladder tried: give up", D(NO_KV), "--enforce-eager",
        knows={"tried": ("no_kv:gpu_memory_utilization", "no_kv:enforce_eager", "no_kv:max_num_batched_tokens",
                         "no_kv:max_num_seqs", "no_kv:cpu_offload")}, gives_up=EX_TEMPFAIL),
    Row("V0 known from the log alone (the start-up found no version): chunked prefill stays on below 32768",
        D(KV, max_model_len=131072, fit_max_model_len=30864, vllm_version="0.6.6"),
        then="--max-model-len 30864 --enable-chunked-prefill", step="max_model_len"),
    Row("the length served, as vLLM printed it, when no flag set it", D(KV, served_max_model_len=32768,
                                                                         fit_max_model_len=20000),
        then="--max-model-len 20000", step="max_model_len"),
    Row("the length from config.json when neither the flag nor the log says it", D(KV, fit_max_model_len=20000),
        knows={"derived_max_model_len": 131072}, then="--max-model-len 20000", step="max_model_len"),
    Row("no KV memory on V0 at exactly 32768 tokens: vLLM chunks by itself only above, the guard asks",
        D(NO_KV), "--max-model-len 32768 --enforce-eager",
        knows={"vllm_version": "0.6.6", "tried": ("no_kv:gpu_memory_utilization",)},
        then="--max-model-len 32768 --enforce-eager --enable-chunked-prefill", step="no_kv:max_num_batched_tokens"),
    Row("OOM allocating the KV cache at a share of three decimals: 0.05 down, to two",
        replace(D(Kind.OOM_PROFILE), phase="kv_cache"), "--gpu-memory-utilization 0.925",
        then="--gpu-memory-utilization 0.88", step="oom_kv_alloc"),
    Row("OOM allocating the KV cache at 0.10: 0.05 is still a share", replace(D(Kind.OOM_PROFILE), phase="kv_cache"),
        "--gpu-memory-utilization 0.1", then="--gpu-memory-utilization 0.05", step="oom_kv_alloc"),
    Row("OOM allocating the KV cache, the free memory known but not the total: a step down",
        replace(D(Kind.OOM_PROFILE), phase="kv_cache"), "--gpu-memory-utilization 0.9",
        knows={"gpu_free_gib": 10.0}, then="--gpu-memory-utilization 0.85", step="oom_kv_alloc"),
    # 14.96 GiB of weights at TP 2 less 2 GiB offloaded: 5.48 GiB a rank; 5 of 22.06 GiB free gives
    # 5 / 22.06 - 0.005 = 0.22, 4.85 GiB: less than the weights
    Row("free memory: the share left cannot hold a rank's weights (TP 2, some offloaded)",
        D(FREE, free_gib=5.0, total_gib=22.06), "-tp 2 --cpu-offload-gb 2",
        knows={"sizing": Sizing(LLAMA, gpus=2, vllm_version="0.32.0"), **L4_FACTS}, gives_up=EX_TEMPFAIL),
    # the share the no-KV ladder raises to, all 22.06 GiB free: (22.06 - 0.4 context) / 22.06 - 0.005 = 0.9769
    # -> 0.97; before 0.20 with CUDA graphs (captured outside the share) the 0.5 GiB the plan leaves them at
    # least comes off too: (22.06 - 0.5 - 0.4) / 22.06 - 0.005 = 0.9542 -> 0.95
    Row("no KV memory before 0.20: the share raised leaves the CUDA graphs their room",
        D(NO_KV), "--gpu-memory-utilization 0.6", asked="", knows={"vllm_version": "0.10.2", **L4_FACTS},
        then="--gpu-memory-utilization 0.95", step="no_kv:gpu_memory_utilization"),
    Row("no KV memory before 0.20 in eager mode: no graphs, all the share free memory allows",
        D(NO_KV), "--gpu-memory-utilization 0.6 --enforce-eager", asked="",
        knows={"vllm_version": "0.10.2", **L4_FACTS},
        then="--gpu-memory-utilization 0.97 --enforce-eager", step="no_kv:gpu_memory_utilization"),
    Row("no KV memory from 0.20: graphs are in the share, all of it free memory allows",
        D(NO_KV), "--gpu-memory-utilization 0.6", asked="", knows={"vllm_version": "0.32.0", **L4_FACTS},
        then="--gpu-memory-utilization 0.97", step="no_kv:gpu_memory_utilization"),
    Row("CUDA-graph OOM with eager mode on already: the profiling ladder, half the sequences",
        D(Kind.OOM_CUDAGRAPH, num_dummy_requests=256), "--enforce-eager",
        then="--enforce-eager --max-num-seqs 128", step="oom_profile:max_num_seqs"),
]


#: The rows above in full (how WHOLE writes them).
MORE_WHOLE: dict[str, tuple[Any, ...]] = {
    'free memory: nothing printed and nothing known: give up': (
        'other processes hold the GPU memory vLLM asked for',
        'free the GPU, or lower --gpu-memory-utilization'),
    'free memory: the share may not be changed: give up': (
        'other processes hold the GPU memory vLLM asked for',
        'free the GPU, or lower --gpu-memory-utilization'),
    'free memory from NVML (nothing printed): its CUDA context is taken off too': (
        'only 60.12 of 79.19 GiB is free (other processes hold the rest); 0.74 stays under it', (
            ('--gpu-memory-utilization', None, '0.74',
             'only 60.12 of 79.19 GiB is free (other processes hold the rest); 0.74 stays under it'),
        )),
    'free memory: a share already under what is free cannot be lowered by this rule': (
        'only 60.12/79.19 GiB is free on the GPU; other processes hold the rest',
        'free the GPU (see the processes holding it)'),
    'free memory: the share left cannot hold the weights': (
        "only 12.0 of 22.06 GiB is free on the GPU: at 0.53 vLLM could use 11.69 GiB, less than the model's "
        'weights (14.96 GiB per rank)',
        'free the GPU (see the processes holding it)'),
    'free memory with the model known, a length-only change not allowed: the share alone': (
        'only 19.06 of 22.06 GiB is free (other processes hold the rest); 0.85 stays under it', (
            ('--gpu-memory-utilization', None, '0.85',
             'only 19.06 of 22.06 GiB is free (other processes hold the rest); 0.85 stays under it'),
        )),
    'CPU build: a node figure names CPU memory when nothing is left': (
        'only 0.2/9.59 GiB is free on CPU memory; other processes hold the rest',
        'free CPU memory (see the processes holding it)'),
    # 0.2 x 0.9 = 0.18 GiB, under the 0.25 GiB least KV cache: no size to advise ("at most 0 GiB" was one,
    # and VLLM_CPU_KVCACHE_SPACE=0 is a KV cache of nothing)
    'CPU build: too little memory left for any KV cache': (
        'only 0.2 of 9.59 GiB of CPU memory is available for the KV cache',
        'no KV cache fits in the 0.2 GiB of CPU memory available: free memory on this machine'),
    "CPU build: under a GiB free, the variable (whole GiB) cannot say it: the flag's bytes": (
        'the KV cache was set to 64.0 GiB, but only 0.8 of 9.59 GiB of CPU memory is available '
        '(VLLM_CPU_KVCACHE_SPACE decides it, and vllm-guard does not change your environment)',
        'unset VLLM_CPU_KVCACHE_SPACE (it counts whole GiB, and less than 1 GiB is available) and set '
        '--kv-cache-memory-bytes to at most 772800512 (0.72 GiB), or free memory on this machine'),
    'CPU build: the share may not be changed': (
        'only 7.96 of 9.59 GiB of CPU memory is available for the KV cache',
        'set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most 7 GiB, or free memory on this machine'),
    'CPU build: a smaller KV cache with the model known shortens the length too': (
        'only 0.5 of 9.59 GiB of CPU memory is available; 0.45 GiB stays under it', (
            ('--kv-cache-memory-bytes', '64G', '482344960',
             'only 0.5 of 9.59 GiB of CPU memory is available; 0.45 GiB stays under it'),
            ('--max-model-len', '131072', '29312',
             'about 29312 tokens fit in the smaller KV cache'),
        )),
    'OOM while serving, fewer sequences not allowed: the same flags after backoff': (
        'CUDA ran out of memory while serving; restarting', (
        )),
    'OOM while serving at one sequence already: the same flags after backoff': (
        'CUDA ran out of memory while serving; restarting', (
        )),
    "OOM while serving with no last good flags: vLLM's default for an 80 GB card halved": (
        'CUDA ran out of memory while serving', (
            ('--max-num-seqs', None, '512',
             'CUDA ran out of memory while serving; fewer concurrent sequences need less activation memory'),
        )),
    'OOM while serving on a 24 GB card: 256 sequences halved': (
        'CUDA ran out of memory while serving', (
            ('--max-num-seqs', None, '128',
             'CUDA ran out of memory while serving; fewer concurrent sequences need less activation memory'),
        )),
    'OOM loading weights, CPU offload allowed': (
        'offloading 4 GiB of weights to CPU leaves GPU memory for the KV cache (slow)', (
            ('--cpu-offload-gb', None, '4',
             'offloading 4 GiB of weights to CPU leaves GPU memory for the KV cache (slow)'),
        )),
    "the engine died saying why: the reason is vLLM's": (
        'vLLM was killed by SIGKILL; relaunching with the last good flags', (
        )),
    "above the model's maximum, which the log does not say and the model is unknown": (
        "--max-model-len is above the model's maximum, and the log does not say the maximum",
        "set --max-model-len to the model's context length"),
    "above the model's maximum: config.json's when the log does not say it": (
        "the model's config allows at most 131072 tokens", (
            ('--max-model-len', '200000', '131072',
             "the model's config allows at most 131072 tokens"),
        )),
    "above the model's maximum, a length change not allowed": (
        "--max-model-len is above the model's maximum, and the log does not say the maximum",
        "set --max-model-len to the model's context length"),
    'auto-fit above a request nobody can name': (
        "vLLM's auto-fit chose a length above the request, but the request is unknown",
        'set --max-model-len'),
    'auto-fit above the length the log says was asked': (
        "vLLM's auto-fit found room for 9000 tokens, more than the 8192 asked for; 8192 fits", (
            ('--max-model-len', 'auto', '8192',
             "vLLM's auto-fit found room for 9000 tokens, more than the 8192 asked for; 8192 fits"),
        )),
    'KV: neither a size nor a length: give up': (
        'the KV cache is too small, and neither the log nor the flags say the current length',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    # vLLM's 20000 is no fewer than the 16384 that failed: half of 16384 is 8192
    'KV: the estimate no shorter than the length: halve instead': (
        "the KV cache cannot hold 16384 tokens, yet vLLM's estimate gives 20000, no fewer; 8192 is half of 16384, "
        'aligned down to the 16-token block', (
            ('--max-model-len', '16384', '8192',
             "the KV cache cannot hold 16384 tokens, yet vLLM's estimate gives 20000, no fewer; 8192 is half of "
             '16384, aligned down to the 16-token block'),
        )),
    'KV on V0 0.6 with the model known: chunked prefill frees the whole-context profile': (
        'vLLM V0 measured 20000 tokens while profiling all 32768 at once; in chunks of 2048 the profile frees room '
        'for about 17969 more (estimated, 3% held back)', (
            ('--enable-chunked-prefill', None, '',
             'vLLM V0 measured 20000 tokens while profiling all 32768 at once; in chunks of 2048 the profile frees '
             'room for about 17969 more (estimated, 3% held back)'),
        )),
    'KV below the floor, fp8 known unsupported: eager mode first (0.20+ counts graphs in the budget)': (
        'only 1500 tokens fit, below the floor of 2048; no memory was left for the KV cache; eager mode frees what '
        'CUDA graphs and compilation take', (
            ('--enforce-eager', None, '',
             'no memory was left for the KV cache; eager mode frees what CUDA graphs and compilation take'),
        )),
    'KV below the floor before 0.20: eager mode frees nothing for it, a smaller batch does': (
        'only 1500 tokens fit, below the floor of 2048; a smaller batch lowers the activation peak that left no '
        'room for KV', (
            ('--max-num-batched-tokens', None, '1024',
             'a smaller batch lowers the activation peak that left no room for KV'),
        )),
    'KV below the floor with fp8 already: give up, saying fp8 was tried': (
        'the KV cache holds only about 1000 tokens, below the floor --min-model-len 2048 even with fp8 KV',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'KV far below the floor on V0 with the model known: chunked prefill alone lifts it over': (
        "the KV cache holds about 1200 tokens (vLLM's estimate), not 16384; with the changes below about 5220, "
        'aligned down to the 16-token block', (
            ('--max-model-len', '16384', '5216',
             "the KV cache holds about 1200 tokens (vLLM's estimate), not 16384; with the changes below about "
             '5220, aligned down to the 16-token block'),
            ('--enable-chunked-prefill', None, '',
             'vLLM V0 measured 1200 tokens while profiling all 16384 at once; in chunks of 2048 the profile frees '
             'room for about 4145 more (estimated, 3% held back)'),
        )),
    "OOM allocating V0's KV cache with the free memory known: a share under it": (
        "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
        '0.77 stays under what they leave', (
            ('--gpu-memory-utilization', '0.9', '0.77',
             "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted "
             'on; 0.77 stays under what they leave'),
        )),
    'OOM allocating the KV cache, nothing known: a step down': (
        "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
        '0.85 stays under what they leave', (
            ('--gpu-memory-utilization', '0.9', '0.85',
             "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted "
             'on; 0.85 stays under what they leave'),
        )),
    'OOM while profiling, everything tried: give up': (
        'CUDA ran out of memory while profiling, and every allowed remedy has been tried',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    "OOM while profiling with the sequences vLLM warmed up unknown: vLLM's default halved": (
        'CUDA ran out of memory warming up the dummy requests; 128 sequences need half the activation memory', (
            ('--max-num-seqs', None, '128',
             'CUDA ran out of memory warming up the dummy requests; 128 sequences need half the activation memory'),
        )),
    'two removed flags at once are both dropped': (
        '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed); '
        '--disable-log-requests was removed in vLLM 0.17.0 (request logging is off by default '
        '(--enable-log-requests))', (
            ('--swap-space', '4', None,
             '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)'),
            ('--disable-log-requests', '', None,
             '--disable-log-requests was removed in vLLM 0.17.0 (request logging is off by default '
             '(--enable-log-requests))'),
        )),
    "an unrecognized flag vLLM never removed is the user's to fix": (
        'vLLM refused its configuration: vllm: error: unrecognized arguments: --max-modle-len 4096',
        'remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version'),
    'CUDA-graph OOM with the model known before 0.14: eager mode and the length that fits with it': (
        'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture', (
            ('--enforce-eager', None, '',
             'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture'),
            ('--max-model-len', None, '27424',
             "with the relaunch's other flags, 131072 tokens do not fit in the KV cache at utilization 0.90; about "
             "28784 by the plan's estimate, 27424 with its error band held back (block-aligned)"),
        )),
    'CUDA-graph OOM with the model known on V0: eager, the length, and chunked prefill it counts on': (
        'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture', (
            ('--enforce-eager', None, '',
             'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture'),
            ('--max-model-len', None, '27424',
             "with the relaunch's other flags, 131072 tokens do not fit in the KV cache at utilization 0.90; about "
             "28784 by the plan's estimate, 27424 with its error band held back (block-aligned)"),
            ('--enable-chunked-prefill', None, '',
             'below 32768 tokens vLLM V0 profiles the whole context at once; in chunks the profile takes less '
             'memory, and the KV cache more'),
        )),
    'CUDA-graph OOM with the model known, a length the plan says fits: eager mode alone': (
        'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture', (
            ('--enforce-eager', None, '',
             'capturing CUDA graphs failed or ran out of memory; eager mode skips the capture'),
        )),
    'CUDA-graph OOM with eager mode on and every profiling remedy tried: give up': (
        'CUDA ran out of memory while profiling, and every allowed remedy has been tried',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'OOM while serving on an A100 80GB: 256 sequences (vLLM gives the A100 the small defaults)': (
        'CUDA ran out of memory while serving', (
            ('--max-num-seqs', None, '128',
             'CUDA ran out of memory while serving; fewer concurrent sequences need less activation memory'),
        )),
    'OOM while serving on the CPU build: 128 sequences a rank, halved': (
        'CUDA ran out of memory while serving', (
            ('--max-num-seqs', None, '64',
             'CUDA ran out of memory while serving; fewer concurrent sequences need less activation memory'),
        )),
    "no KV memory on V0 with a long context: chunked prefill's 2048-token chunks are the batch": (
        'a smaller batch lowers the activation peak that left no room for KV', (
            ('--max-num-batched-tokens', None, '1024',
             'a smaller batch lowers the activation peak that left no room for KV'),
        )),
    "too few GPUs: vLLM's numbers name what was asked and found": (
        'vLLM needs 4 GPUs, only 2 are available: lower --tensor-parallel-size',
        ''),
    "the classifier's own words for a refusal it explains": (
        'ValueError: bad value: set --dtype half',
        ''),
    'a long refusal is cut at 300 characters': (
        'vLLM refused its configuration: ValueError: '
        'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy',
        "fix the model name, the arguments or the environment named in vLLM's line, then start again"),
    'fp8 KV refused (kv_cache_dtype) after the guard set it, with no KV failure on record': (
        'this GPU refuses fp8 KV cache, and without it the KV cache is below the floor',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    "fp8 KV refused (kv cache dtype), the KV failure's evidence cut at 200 characters": (
        'this GPU refuses fp8 KV cache, and without it the KV cache is below the floor (ValueError: '
        'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz)',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'fp8 KV refused (--kv-cache-dtype) that the user asked: theirs to change': (
        "vLLM refused its configuration: error: argument --kv-cache-dtype: invalid choice: 'fp8'",
        'remove or correct the flag vLLM names; check it against `vllm serve --help` of the installed version'),
    'chunked prefill refused twice: the undo was tried, give up': (
        'vLLM refused its configuration: ValueError: Sliding window is not supported with chunked prefill',
        'this GPU or this vLLM does not support what was asked: choose a --dtype, --quantization or '
        '--kv-cache-dtype it supports, or another vLLM version'),
    'a removed flag given as --flag=value is dropped': (
        '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)', (
            ('--swap-space', '4', None,
             '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)'),
        )),
    'a flag vLLM calls unrecognized before the release the table says removed it: dropped, with why': (
        '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)', (
            ('--swap-space', '4', None,
             '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)'),
        )),
    "a length above the model's maximum that is the maximum: no remedy changes anything": (
        'max_len_exceeds_model: no remedy changes anything',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'a removed flag, the version known from the start-up and not the log': (
        '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)', (
            ('--swap-space', '4', None,
             '--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)'),
        )),
    'no KV memory, every step of the ladder tried: give up': (
        'the weights and activations leave no memory for the KV cache, and every allowed remedy has been tried',
        'more GPUs (--tensor-parallel-size), a quantized model (AWQ/GPTQ/FP8), or freeing the GPU from other '
        'processes'),
    'V0 known from the log alone (the start-up found no version): chunked prefill stays on below 32768': (
        "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '30864',
             "the KV cache holds about 30864 tokens (vLLM's estimate), not 131072; 30864 is that, aligned down to "
             'the 16-token block'),
            ('--enable-chunked-prefill', None, '',
             'below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory '
             'profile, and so the KV cache, as measured'),
        )),
    'the length served, as vLLM printed it, when no flag set it': (
        "the KV cache holds about 20000 tokens (vLLM's estimate), not 32768; 20000 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '20000',
             "the KV cache holds about 20000 tokens (vLLM's estimate), not 32768; 20000 is that, aligned down to "
             'the 16-token block'),
        )),
    'the length from config.json when neither the flag nor the log says it': (
        "the KV cache holds about 20000 tokens (vLLM's estimate), not 131072; 20000 is that, aligned down to the "
        '16-token block', (
            ('--max-model-len', None, '20000',
             "the KV cache holds about 20000 tokens (vLLM's estimate), not 131072; 20000 is that, aligned down to "
             'the 16-token block'),
        )),
    'no KV memory on V0 at exactly 32768 tokens: vLLM chunks by itself only above, the guard asks': (
        'below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory profile, '
        'and so the KV cache, as measured', (
            ('--enable-chunked-prefill', None, '',
             'below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory '
             'profile, and so the KV cache, as measured'),
        )),
    'OOM allocating the KV cache at a share of three decimals: 0.05 down, to two': (
        "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
        '0.88 stays under what they leave', (
            ('--gpu-memory-utilization', '0.925', '0.88',
             "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted "
             'on; 0.88 stays under what they leave'),
        )),
    'OOM allocating the KV cache at 0.10: 0.05 is still a share': (
        "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
        '0.05 stays under what they leave', (
            ('--gpu-memory-utilization', '0.1', '0.05',
             "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted "
             'on; 0.05 stays under what they leave'),
        )),
    'OOM allocating the KV cache, the free memory known but not the total: a step down': (
        "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
        '0.85 stays under what they leave', (
            ('--gpu-memory-utilization', '0.9', '0.85',
             "CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted "
             'on; 0.85 stays under what they leave'),
        )),
    "free memory: the share left cannot hold a rank's weights (TP 2, some offloaded)": (
        "only 5.0 of 22.06 GiB is free on the GPU: at 0.22 vLLM could use 4.85 GiB, less than the model's weights "
        '(5.48 GiB per rank)',
        'free the GPU (see the processes holding it)'),
    'no KV memory before 0.20: the share raised leaves the CUDA graphs their room': (
        'no memory was left for the KV cache at 0.60; 0.95 gives vLLM more', (
            ('--gpu-memory-utilization', '0.6', '0.95',
             'no memory was left for the KV cache at 0.60; 0.95 gives vLLM more'),
        )),
    'no KV memory before 0.20 in eager mode: no graphs, all the share free memory allows': (
        'no memory was left for the KV cache at 0.60; 0.97 gives vLLM more', (
            ('--gpu-memory-utilization', '0.6', '0.97',
             'no memory was left for the KV cache at 0.60; 0.97 gives vLLM more'),
        )),
    'no KV memory from 0.20: graphs are in the share, all of it free memory allows': (
        'no memory was left for the KV cache at 0.60; 0.97 gives vLLM more', (
            ('--gpu-memory-utilization', '0.6', '0.97',
             'no memory was left for the KV cache at 0.60; 0.97 gives vLLM more'),
        )),
    'CUDA-graph OOM with eager mode on already: the profiling ladder, half the sequences': (
        'CUDA ran out of memory warming up 256 dummy requests; 128 sequences need half the activation memory', (
            ('--max-num-seqs', None, '128',
             'CUDA ran out of memory warming up 256 dummy requests; 128 sequences need half the activation memory'),
        )),
}


def test_every_row_is_written_out_in_full():
    assert set(WHOLE) == {r.name for r in ROWS}


@pytest.mark.parametrize("row", [r for r in ROWS if r.name in WHOLE], ids=lambda r: r.name)
def test_one_decision_in_full(row: Row) -> None:
    asked = Flags.parse(row.flags if row.asked is None else row.asked)
    out = R.decide(row.failure, Flags.parse(row.flags), R.Context(requested=asked, **row.knows))
    if isinstance(out, R.GiveUp):
        assert (out.reason, out.advice) == WHOLE[row.name]
    else:
        assert (out.why, tuple((c.flag, c.old, c.new, c.why) for c in out.changes)) == WHOLE[row.name]


@pytest.mark.parametrize("row", MORE, ids=lambda r: r.name)
def test_one_more_decision(row: Row) -> None:
    test_one_decision(row)
    asked = Flags.parse(row.flags if row.asked is None else row.asked)
    out = R.decide(row.failure, Flags.parse(row.flags), R.Context(requested=asked, **row.knows))
    if isinstance(out, R.GiveUp):
        assert (out.reason, out.advice) == MORE_WHOLE[row.name]
    else:
        assert (out.why, tuple((c.flag, c.old, c.new, c.why) for c in out.changes)) == MORE_WHOLE[row.name]


def test_the_plan_ahead_takes_only_a_remedy_that_relaunches_at_once():
    """The first launch takes the remedy for a failure the plan foresees only when the policy would
    relaunch at once with other flags: not a kind it does not know, not giving up, not a backoff."""
    ctx = R.Context(requested=Flags())
    assert R.plan_ahead("no_such_kind", Flags(), ctx) is None
    assert R.plan_ahead("engine_dead", Flags(), ctx) is None                  # the same flags after a backoff
    assert R.plan_ahead("oom_weights", Flags(), ctx) is None                  # giving up
    eager = R.plan_ahead("oom_cudagraph", Flags(), ctx)
    assert eager is not None and eager.flags.argv() == ["--enforce-eager"] and not eager.backoff


# The plan sizes these (its memory model is docs/memory-model.md's, tested in test_plan*.py): the
# relaunch's own arithmetic is written out, the plan's numbers are held to their shape.
PLANNED = [
    # 19.06 of 22.06 GiB free: 19.06 / 22.06 = 0.864, less the 0.005 margin -> 0.85 (0.32 counts CUDA
    # graphs in its budget, so no room is left for them); from 0.14 the length is vLLM's auto-fit
    (D(FREE, free_gib=19.06, total_gib=22.06), "", {"sizing": sized("0.32.0"), "vllm_version": "0.32.0", **L4_FACTS},
     r"--gpu-memory-utilization 0\.85 --max-model-len auto", "gpu_memory_utilization_free",
     [r"only 19\.06 of 22\.06 GiB is free \(other processes hold the rest\); 0\.85 stays under it",
      r"131072 tokens do not fit in the KV cache at utilization 0\.85; about \d+ by the plan's estimate, so vLLM "
      r"sizes the length to the KV cache it measures \(auto\), held between 2048 and 131072"]),
    # before 0.20 the graphs are captured outside the budget: the plan leaves them room, so the share is
    # below 0.85; before 0.14 the length is a number, block-aligned
    (D(FREE, free_gib=19.06, total_gib=22.06), "", {"sizing": sized("0.10.2"), "vllm_version": "0.10.2", **L4_FACTS},
     r"--gpu-memory-utilization 0\.(8[0-4]|[5-7]\d) --max-model-len \d+", "gpu_memory_utilization_free",
     [r"only 19\.06 of 22\.06 GiB is free \(other processes hold the rest\); 0\.\d\d stays under it",
      r"131072 tokens do not fit in the KV cache at utilization 0\.\d\d; about \d+ by the plan's estimate, \d+ "
      r"with its error band held back \(block-aligned\)"]),
    # vLLM measured 30000 tokens at 0.90 on a shared GPU before 0.20: the share leaves the graphs room,
    # and the length is what then fits (fewer tokens, said with how many)
    (D(KV, max_model_len=131072, fit_max_model_len=30000), "",
     {"sizing": sized("0.10.2"), "vllm_version": "0.10.2", "gpu_total_gib": 22.06, "gpu_free_gib": 19.06},
     r"--gpu-memory-utilization 0\.(8\d?|[5-7]\d?) --max-model-len \d+", "max_model_len",
     [r"the KV cache holds about 30000 tokens \(vLLM's estimate\), not 131072; with the changes below about \d+, "
      r"aligned down to the 16-token block",
      r"other processes hold memory and this vLLM captures CUDA graphs outside its budget; 0\.\d+ leaves room for "
      r"them \(about \d+ tokens fewer\)"]),
]


@pytest.mark.parametrize("failure,flags,knows,then,step,whys", PLANNED, ids=["free-0.32", "free-0.10", "kv-0.10"])
def test_a_decision_the_plan_sizes(failure, flags, knows, then, step, whys):
    out = R.decide(failure, Flags.parse(flags), R.Context(requested=Flags.parse(flags), **knows))
    assert isinstance(out, R.Relaunch) and out.step == step and not out.backoff
    assert re.fullmatch(then, " ".join(out.flags.argv())), out.flags.argv()
    assert len(out.changes) == len(whys)
    assert all(re.fullmatch(w, c.why) for w, c in zip(whys, out.changes, strict=True)), [c.why for c in out.changes]
    length = out.flags.get("--max-model-len")
    assert length == "auto" or (int(length) % 16 == 0 and int(length) < 131072)
    assert out.why == out.changes[0].why or out.why.startswith("only 19.06 of 22.06 GiB is free")


def test_steps_combined_name_each_flag_once_from_its_first_value_to_its_last():
    """The plan then a remedy change the share twice: one change, from the user's value to the last, both
    reasons in order; a flag a later step puts back where it began is no change at all."""
    plan = (R.Change("--gpu-memory-utilization", None, "0.85", "the plan"),
            R.Change("--enforce-eager", None, "", "the plan's eager mode"))
    remedy = (R.Change("--gpu-memory-utilization", "0.85", "0.8", "the remedy"),
              R.Change("--max-model-len", "8192", "4096", "the length"),
              R.Change("--enforce-eager", "", None, "graphs back"))
    assert R.combined(plan, remedy) == (
        R.Change("--gpu-memory-utilization", None, "0.8", "the plan; then the remedy"),
        R.Change("--max-model-len", "8192", "4096", "the length"))


def test_auto_fit_above_the_request_without_vllms_length_says_a_length():
    """vLLM's auto-fit line without the length it chose: the reason cannot name a number it was not given."""
    out = R.decide(D(Kind.AUTO_FIT_ABOVE_REQUEST), Flags.parse("--max-model-len auto"),
                   R.Context(requested=Flags.parse("--max-model-len 8192")))
    assert isinstance(out, R.Relaunch) and out.flags == Flags.parse("--max-model-len 8192")
    assert out.why == "vLLM's auto-fit found a length, more than the 8192 asked for; 8192 fits"


def test_a_decision_without_a_context_takes_the_current_flags_as_the_users_own():
    """decide(d, flags) alone: what the user asked is the flags that failed (here the 8192 auto-fit went past)."""
    out = R.decide(D(Kind.AUTO_FIT_ABOVE_REQUEST, fit_max_model_len=9000), Flags.parse("--max-model-len 8192"))
    assert isinstance(out, R.GiveUp)       # pinning 8192 again changes nothing
    assert out.reason == "auto_fit_above_request: no remedy changes anything"


# After fp8 KV was tried, vLLM refusing it in any of the words it uses (the Triton kernel's 'fp8e4nv',
# the flag '--kv-cache-dtype', the config field 'kv_cache_dtype', the prose 'KV cache dtype') is the end:
# without fp8 the KV cache stays below the floor. Each phrase is tried on its own.
@pytest.mark.parametrize("refusal", [
    "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')",
    "error: argument --kv-cache-dtype: invalid choice: 'e4m3' (choose from 'auto', 'bfloat16')",
    "ValueError: kv_cache_dtype=e4m3 is not supported by this attention backend",
    "NotImplementedError: the KV cache dtype is not supported by this attention backend",
])
def test_a_refused_fp8_kv_cache_after_fp8_was_tried_gives_up(refusal: str) -> None:
    out = R.decide(D(CONFIG, refusal), Flags.parse("--kv-cache-dtype fp8"),
                   R.Context(requested=Flags(), tried=("kv_cache_fp8",)))
    assert out == R.GiveUp("this GPU refuses fp8 KV cache, and without it the KV cache is below the floor",
                           EX_TEMPFAIL, R.ADVICE)


def test_another_refusal_after_fp8_was_tried_is_vllms_own_reason() -> None:
    evidence = "ValueError: --max-num-seqs must be at least 1"
    out = R.decide(D(CONFIG, evidence), Flags.parse("--kv-cache-dtype fp8 --max-num-seqs 0"),
                   R.Context(requested=Flags(), tried=("kv_cache_fp8",)))
    assert out == R.GiveUp("vLLM refused its configuration: ValueError: --max-num-seqs must be at least 1",
                           EX_CONFIG, "correct the value vLLM names in the flags or in vLLM's --config file")


# vLLM's refusal in the guard's own words (the detail) is the reason when the classifier read a number
# that names the cause (GPUs, placement groups, a variable) or the detail quotes the whole line.
@pytest.mark.parametrize("number", ["required_gpus", "required_placement_groups", "env_var"])
def test_a_refusal_whose_number_names_the_cause_gives_the_detail(number: str) -> None:
    d = Diagnosis(CONFIG, evidence="ValueError: the line", detail="vLLM needs 2 GPUs and sees 1", numbers={number: 2})
    assert R.decide(d, Flags(), R.Context(requested=Flags())) == R.GiveUp("vLLM needs 2 GPUs and sees 1", EX_CONFIG)


def test_a_detail_that_neither_names_the_cause_nor_quotes_the_line_is_not_the_reason() -> None:
    d = Diagnosis(CONFIG, evidence="ValueError: the line", detail="something else", numbers={"other": 1})
    assert R.decide(d, Flags(), R.Context(requested=Flags())).reason == \
        "vLLM refused its configuration: ValueError: the line"


def test_a_cause_without_a_detail_is_vllms_line() -> None:
    d = Diagnosis(CONFIG, evidence="ValueError: the line", numbers={"required_gpus": 2})
    assert R.decide(d, Flags(), R.Context(requested=Flags())).reason == \
        "vLLM refused its configuration: ValueError: the line"


def test_the_step_down_of_a_share_rounds_once_to_two_decimals() -> None:
    """0.8751 - 0.05 = 0.8251, which is 0.83 to two decimals (rounding to three first would give 0.825,
    written 0.82)."""
    out = R.decide(replace(D(Kind.OOM_PROFILE), phase="kv_cache"), Flags.parse("--gpu-memory-utilization 0.8751"),
                   R.Context(requested=Flags()))
    assert isinstance(out, R.Relaunch) and out.step == "oom_kv_alloc"
    assert out.flags == Flags.parse("--gpu-memory-utilization 0.83")


CPU_FREE = {"free_gib": 3.10, "total_gib": 9.59}


def test_a_cpu_share_that_leaves_the_kv_cache_exactly_nothing_grows():
    """vLLM's CPU backend refuses a share whose KV part is 0 GiB (the worker's 4.0 GiB fill the 4.0 GiB
    share): it grows by the 3.10 GiB available, (4.0 - (0 - 3.10)) / 9.59 - 0.005 = 0.735, so 0.73."""
    d = D(FREE, requested_gib=0.0, cpu_kv_auto_gib=0.0, cpu_share_gib=4.0, **CPU_FREE)
    out = R.decide(d, Flags.parse("--gpu-memory-utilization 0.42"), R.Context(requested=Flags()))
    assert isinstance(out, R.Relaunch) and out.flags == Flags.parse("--gpu-memory-utilization 0.73")
    assert out.why == ("the CPU memory share (4.0 GiB) left the KV cache nothing after the worker's own 4.00 GiB; "
                       "0.73 gives it the 3.1 GiB available")


@pytest.mark.parametrize("kv_auto", [0.5, 3.10])
def test_a_cpu_share_whose_kv_part_fits_what_is_available_is_not_resized_by_it(kv_auto: float):
    """A KV part above 0 and no more than the 3.10 GiB available is not what vLLM refused the share for:
    the share is the one free memory allows, not one moved by the KV part: vLLM printed the free memory
    (no CUDA context to take from it), 3.10 / 9.59 - 0.005 = 0.318, so 0.31."""
    d = D(FREE, requested_gib=kv_auto, cpu_kv_auto_gib=kv_auto, cpu_share_gib=4.0, **CPU_FREE)
    out = R.decide(d, Flags.parse("--gpu-memory-utilization 0.9"), R.Context(requested=Flags()))
    assert isinstance(out, R.Relaunch) and out.flags == Flags.parse("--gpu-memory-utilization 0.31")
    assert out.why == "only 3.1 of 9.59 GiB is free (other processes hold the rest); 0.31 stays under it"


@pytest.mark.parametrize("numbers", [{"cpu_node": 1}, {"cpu_kv_auto_gib": 2.0, "cpu_share_gib": 4.0}])
def test_free_memory_unknown_on_the_cpu_build_names_cpu_memory(numbers):
    out = R.decide(D(FREE, **numbers), Flags(), R.Context(requested=Flags()))
    assert out == R.GiveUp("other processes hold the CPU memory vLLM asked for", EX_TEMPFAIL,
                           "free CPU memory, or lower --gpu-memory-utilization")


def test_free_memory_unknown_on_a_gpu_names_the_gpu():
    out = R.decide(D(FREE), Flags(), R.Context(requested=Flags()))
    assert out == R.GiveUp("other processes hold the GPU memory vLLM asked for", EX_TEMPFAIL,
                           "free the GPU, or lower --gpu-memory-utilization")


def test_a_cpu_kv_space_between_one_and_two_gib_is_advised_in_whole_gib():
    """1.5 GiB free: 1.5 x 0.9 = 1.35 GiB fit, so VLLM_CPU_KVCACHE_SPACE (whole GiB) can say 1."""
    out = R.decide(D(FREE, free_gib=1.5, total_gib=9.59, cpu_kv_gib=64.0), Flags(),
                   R.Context(requested=Flags(), cpu_kv_space_gib=64.0))
    assert out == R.GiveUp(
        "the KV cache was set to 64.0 GiB, but only 1.5 of 9.59 GiB of CPU memory is available "
        "(VLLM_CPU_KVCACHE_SPACE decides it, and vllm-guard does not change your environment)", EX_CONFIG,
        "set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most 1 GiB, or free memory on this machine")


def test_a_cpu_kv_space_refusal_without_the_free_or_total_figures_says_only_what_vllm_printed():
    """vLLM's line without the node's total: no 'of ...'; without the free figure: nothing is known to fit."""
    out = R.decide(D(FREE, free_gib=2.0, cpu_kv_gib=64.0), Flags(), R.Context(requested=Flags(), cpu_kv_space_gib=64.0))
    assert isinstance(out, R.GiveUp) and out.reason.startswith(
        "the KV cache was set to 64.0 GiB, but only 2.0 GiB of CPU memory is available (")
    out = R.decide(D(FREE, cpu_kv_gib=64.0), Flags(), R.Context(requested=Flags(), cpu_kv_space_gib=64.0))
    assert isinstance(out, R.GiveUp)
    assert out.advice == "no KV cache fits in the 0.0 GiB of CPU memory available: free memory on this machine"


PROFILED = ("oom_profile:max_num_seqs", "oom_profile:max_num_batched_tokens")   # the steps before the share


@pytest.mark.parametrize(("flags", "version", "then"), [
    ("", "0.10.2", "0.85"),       # vLLM's default before 0.20 is 0.90: 0.90 - 0.05
    ("", "0.32.0", "0.87"),       # 0.92 from 0.20: 0.92 - 0.05
    ("--gpu-memory-utilization 0.8751", None, "0.83"),   # 0.8251 to two decimals, once
    ("--gpu-memory-utilization 0.55", None, "0.5"),      # 0.50 is still a share the step takes
])
def test_oom_while_profiling_lowers_the_share_by_005(flags: str, version: str | None, then: str):
    out = R.decide(D(Kind.OOM_PROFILE), Flags.parse(flags),
                   R.Context(requested=Flags(), tried=PROFILED, vllm_version=version))
    assert out == R.Relaunch(
        Flags.parse(f"--gpu-memory-utilization {then}"),
        (R.Change("--gpu-memory-utilization", Flags.parse(flags).get("--gpu-memory-utilization"), then,
                  "profiling ran out of memory; a lower utilization leaves more headroom outside vLLM's budget"),),
        "profiling ran out of memory; a lower utilization leaves more headroom outside vLLM's budget",
        step="oom_profile:lower_utilization")


def test_oom_while_profiling_below_a_half_share_gives_up():
    out = R.decide(D(Kind.OOM_PROFILE), Flags.parse("--gpu-memory-utilization 0.54"),
                   R.Context(requested=Flags(), tried=PROFILED))
    assert out == R.GiveUp("CUDA ran out of memory while profiling, and every allowed remedy has been tried",
                           EX_TEMPFAIL, R.ADVICE)


# -- the KV rule's length, and the reason it gives when the length cannot do it, word for word --------
MML_, KVD, CHUNKED_ = "--max-model-len", "--kv-cache-dtype", "--enable-chunked-prefill"
ONLY_LENGTH = RemedyConfig(allowed=("max_model_len",))         # no fp8, no freed memory: the rule's own reason
NO_LENGTH = RemedyConfig(allowed=("restart",))                 # the length may not change
V0_CHUNK_WHY = ("below 32768 tokens vLLM V0 profiles the whole context at once; chunked prefill keeps the memory "
                "profile, and so the KV cache, as measured")


def _kv(failure: Diagnosis, flags: str = "", asked: str | None = None, **knows: Any) -> R.Decision:
    return R.decide(failure, Flags.parse(flags), R.Context(requested=Flags.parse(flags if asked is None else asked),
                                                           **knows))


@pytest.mark.parametrize(("failure", "flags", "asked", "knows", "changes"), [
    # the length asked for is below vLLM's estimate and the length launched: the length asked for
    (D(KV, max_model_len=16384, fit_max_model_len=12000), "--max-model-len 16384", "--max-model-len 8192", {},
     ((MML_, "16384", "8192", "the KV cache holds about 12000 tokens (vLLM's estimate), not 16384; 8192 is the 8192 "
       "asked for, aligned down to the 16-token block"),)),
    # exactly the floor (--min-model-len 2048) is still a length
    (D(KV, max_model_len=4096, fit_max_model_len=2048), "", None, {},
     ((MML_, None, "2048", "the KV cache holds about 2048 tokens (vLLM's estimate), not 4096; 2048 is that, "
       "aligned down to the 16-token block"),)),
    # V0 chunked prefill by itself above 32768 tokens: a relaunch at 32768 or below asks for it
    (D(KV, max_model_len=32769, fit_max_model_len=30000), "--max-model-len 32769", None, {"vllm_version": "0.6.6"},
     ((MML_, "32769", "30000", "the KV cache holds about 30000 tokens (vLLM's estimate), not 32769; 30000 is that, "
       "aligned down to the 16-token block"), (CHUNKED_, None, "", V0_CHUNK_WHY))),
    (D(KV, max_model_len=40960, fit_max_model_len=32768), "--max-model-len 40960", None, {"vllm_version": "0.6.6"},
     ((MML_, "40960", "32768", "the KV cache holds about 32768 tokens (vLLM's estimate), not 40960; 32768 is that, "
       "aligned down to the 16-token block"), (CHUNKED_, None, "", V0_CHUNK_WHY))),
    # fp8 doubles 1024 tokens to exactly the floor
    (D(KV, max_model_len=4096, fit_max_model_len=1024), "", None, {},
     ((KVD, None, "fp8", "only 1024 tokens fit, below the floor of 2048; fp8 KV doubles the capacity"),
      (MML_, None, "2048", "about 2048 tokens fit with fp8 KV"))),
    # the model's dtype asked for by name ("auto") is what fp8 replaces
    (D(KV, max_model_len=4096, fit_max_model_len=1024), "--kv-cache-dtype auto", None, {},
     ((KVD, "auto", "fp8", "only 1024 tokens fit, below the floor of 2048; fp8 KV doubles the capacity"),
      (MML_, None, "2048", "about 2048 tokens fit with fp8 KV"))),
    # fp8 doubles 1500 tokens past the 2560 launched: the length stays as it is
    (D(KV, max_model_len=2560, fit_max_model_len=1500), "--max-model-len 2560", None, {},
     ((KVD, None, "fp8", "only 1500 tokens fit, below the floor of 2048; fp8 KV doubles the capacity"),)),
    # 0.7's GiB ratio, not vLLM's own estimate: V0's chunked-prefill gain is not added to it
    (D(KV, max_model_len=4096, kv_needed_gib=2.0, kv_available_gib=1.0), "", None,
     {"vllm_version": "0.7.3", "sizing": sized("0.7.3")},
     # 4096 x 1.0/2.0 x 0.97 - 16 = 1970 tokens; fp8 doubles them to 3940, 3936 in whole blocks
     ((KVD, None, "fp8", "only 1970 tokens fit, below the floor of 2048; fp8 KV doubles the capacity"),
      (MML_, None, "3936", "about 3936 tokens fit with fp8 KV"))),
], ids=["the length asked for", "exactly the floor", "from 32769 on V0", "to exactly 32768 on V0",
        "fp8 to exactly the floor", "fp8 in place of auto", "fp8 past the length launched", "a GiB ratio on V0"])
def test_the_kv_rule_changes_in_full(failure, flags, asked, knows, changes):
    out = _kv(failure, flags, asked, **knows)
    assert isinstance(out, R.Relaunch), out
    assert tuple((c.flag, c.old, c.new, c.why) for c in out.changes) == changes
    want = Flags.parse(flags)
    for flag, _old, new, _why in changes:
        want = want.set(flag, new) if new else want.set(flag)
    assert out.flags == want


@pytest.mark.parametrize(("failure", "flags", "knows", "reason"), [
    (D(KV, max_model_len=4096, fit_max_model_len=1000), "", {"rules": ONLY_LENGTH},
     "the KV cache holds only about 1000 tokens, below the floor --min-model-len 2048"),
    # 2005 tokens are above a floor of 2001, but 2000 in whole blocks are not
    (D(KV, max_model_len=4096, fit_max_model_len=2005), "", {"rules": RemedyConfig(allowed=("max_model_len",),
                                                                                     min_model_len=2001)},
     "only 2000 tokens fit in whole 16-token blocks, below the floor of 2001"),
    (D(KV, max_model_len=4096, fit_max_model_len=2001), "", {"rules": RemedyConfig(allowed=("max_model_len",),
                                                                                     min_model_len=2001)},
     "only 2000 tokens fit in whole 16-token blocks, below the floor of 2001"),
    (D(KV, max_model_len=4096, fit_max_model_len=2048), "", {"rules": NO_LENGTH},
     "only 2048 of the 4096 tokens fit, and the remedies allowed do not include the length"),
    (D(KV, fit_max_model_len=3000), "", {"rules": NO_LENGTH},
     "only 3000 tokens fit, and the remedies allowed do not include the length"),
    (D(KV, max_model_len=3000), "", {"rules": ONLY_LENGTH},
     "the KV cache cannot hold 3000 tokens and vLLM printed no size for it; 1488 is half of 3000 in whole "
     "16-token blocks, below the floor of 2048"),
    (D(KV, max_model_len=8192), "", {"rules": NO_LENGTH},
     "the KV cache cannot hold 8192 tokens and vLLM printed no size for it; the remedies allowed do not include "
     "the length"),
    (D(KV, max_model_len=4096), "", {"rules": NO_LENGTH},      # half of it is exactly the floor
     "the KV cache cannot hold 4096 tokens and vLLM printed no size for it; the remedies allowed do not include "
     "the length"),
    (D(KV, max_model_len=4096, fit_max_model_len=1000), "--kv-cache-dtype fp8", {"rules": ONLY_LENGTH},
     "the KV cache holds only about 1000 tokens, below the floor --min-model-len 2048 even with fp8 KV"),
    (D(KV, max_model_len=4096, fit_max_model_len=1000), "",
     {"tried": ("kv_cache_fp8", "kv_small:enforce_eager", "kv_small:max_num_batched_tokens")},
     "the KV cache holds only about 1000 tokens, below the floor --min-model-len 2048 even with fp8 KV"),
], ids=["below the floor", "below it in whole blocks", "at it, below in whole blocks", "no length change allowed",
        "no length known", "half of no size, below the floor", "no size, no length change",
        "half is the floor, no length change", "already fp8", "fp8 tried"])
def test_the_kv_rule_gives_up_saying_what_holds_the_length(failure, flags, knows, reason):
    assert _kv(failure, flags, **knows) == R.GiveUp(reason, EX_TEMPFAIL, R.ADVICE)


def test_the_kv_rule_does_not_take_fp8_twice():
    # 1100 tokens: fp8 would double them to 2200, above the floor, were it not tried already
    out = _kv(D(KV, max_model_len=4096, fit_max_model_len=1100), "", tried=("kv_cache_fp8",), vllm_version="0.32.0")
    assert isinstance(out, R.Relaunch) and out.step == "kv_small:enforce_eager", out
    assert not out.flags.has(KVD)


# -- free memory: the share under what other processes leave, at its edges --------------------------
UTIL_ = "--gpu-memory-utilization"


def _share(why: str, util: str, flags: str = "") -> R.Relaunch:
    return R.Relaunch(Flags.parse(flags).set(UTIL_, util), (R.Change(UTIL_, Flags.parse(flags).get(UTIL_), util, why),),
                      why, step="gpu_memory_utilization_free")


@pytest.mark.parametrize(("failure", "flags", "knows", "then"), [
    # vLLM's own free figure (its CUDA context already made): 12.88 / 16 - 0.005 = 0.80 exactly
    (D(FREE, free_gib=12.88, total_gib=16.0, requested_utilization=0.9), "", {},
     _share("only 12.88 of 16.0 GiB is free (other processes hold the rest); 0.80 stays under it", "0.8")),
    # the total not printed: the free figure is not vLLM's, its 0.4 GiB CUDA context comes off it:
    # (18.66 - 0.4) / 22.06 - 0.005 = 0.822 -> 0.82
    (D(FREE, free_gib=18.66, requested_utilization=0.9), "", {"gpu_total_gib": 22.06},
     _share("only 18.66 of 22.06 GiB is free (other processes hold the rest); 0.82 stays under it", "0.82")),
    # the CPU share left the KV cache 0.5 - 0.3 = 0.2 GiB short: (8.0 - 0.2) / 16 - 0.005 = 0.4825 -> 0.48
    (D(FREE, free_gib=0.3, total_gib=16.0, cpu_kv_auto_gib=0.5, cpu_share_gib=8.0), "", {},
     _share("the CPU memory share left the KV cache 0.20 GiB short of the 0.3 GiB available; 0.48 shrinks the "
            "share by that", "0.48")),
    # ... with a margin of 0.05: (8.0 - 0.2) / 16 - 0.05 = 0.4375 -> 0.43
    (D(FREE, free_gib=0.3, total_gib=16.0, cpu_kv_auto_gib=0.5, cpu_share_gib=8.0), "",
     {"rules": RemedyConfig(utilization_margin=0.05)},
     _share("the CPU memory share left the KV cache 0.20 GiB short of the 0.3 GiB available; 0.43 shrinks the "
            "share by that", "0.43")),
    # the worker's memory filled the share: it grows by the 8.1 GiB available, (8 + 8.1) / 16 - 0.005 -> 1.00
    (D(FREE, free_gib=8.1, total_gib=16.0, cpu_kv_auto_gib=0.0, cpu_share_gib=8.0), "", {},
     _share("the CPU memory share (8.0 GiB) left the KV cache nothing after the worker's own 8.00 GiB; 1.00 gives "
            "it the 8.1 GiB available", "1")),
], ids=["vLLM's figure, exactly 0.80", "no total printed: NVML's figure", "a CPU share too big",
        "a CPU share too big, a wider margin", "a CPU share grown to all of it"])
def test_free_memory_share_in_full(failure, flags, knows, then):
    assert _kv(failure, flags, **knows) == then


GPU_HELD = "free the GPU (see the processes holding it)"


@pytest.mark.parametrize(("failure", "flags", "reason", "advice"), [
    # the share vLLM ran with (as the log says) is already under what is free: nothing to lower
    (D(FREE, free_gib=20.0, total_gib=22.06, requested_utilization=0.5), "",
     "only 20.0/22.06 GiB is free on the GPU; other processes hold the rest", GPU_HELD),
    # no share known: vLLM's whole-GPU reading; all of it free leaves 1.00, no lower
    (D(FREE, free_gib=22.2, total_gib=22.06), "",
     "only 22.2/22.06 GiB is free on the GPU; other processes hold the rest", GPU_HELD),
    # exactly the share launched: 12.88 / 16 - 0.005 = 0.80
    (D(FREE, free_gib=12.88, total_gib=16.0), "--gpu-memory-utilization 0.8",
     "only 12.88/16.0 GiB is free on the GPU; other processes hold the rest", GPU_HELD),
    # 0.88 / 16 - 0.005 = 0.05: no share worth launching
    (D(FREE, free_gib=0.88, total_gib=16.0, requested_utilization=0.9), "",
     "only 0.88/16.0 GiB is free on the GPU; other processes hold the rest", GPU_HELD),
    # the CPU share would "grow" to what it is: (8 + 0.08) / 16 - 0.005 = 0.50 = 8 / 16
    (D(FREE, free_gib=0.08, total_gib=16.0, cpu_kv_auto_gib=0.0, cpu_share_gib=8.0), "",
     "only 0.08/16.0 GiB is free on CPU memory; other processes hold the rest",
     "free CPU memory (see the processes holding it)"),
], ids=["under the share logged", "all of it free", "exactly the share launched", "0.05 of the GPU",
        "a CPU share that cannot grow"])
def test_free_memory_gives_up_where_no_lower_share_helps(failure, flags, reason, advice):
    assert _kv(failure, flags) == R.GiveUp(reason, EX_TEMPFAIL, advice)


CPU_SHARE_SHORT = D(FREE, free_gib=4.0, total_gib=64.0, requested_gib=10.0, cpu_kv_auto_gib=10.0, cpu_share_gib=30.0,
                    max_model_len=131072)
# (30 - (10 - 4)) / 64 - 0.005 = 0.37
CPU_SHARE_WHY = ("the CPU memory share left the KV cache 6.00 GiB short of the 4.0 GiB available; 0.37 shrinks the "
                 "share by that")


def test_a_cpu_share_shrunk_under_free_memory_with_the_model_known_lets_vllm_size_the_length():
    """Llama-3.1-8B's 15 GiB of weights in 0.37 x 64 GiB leave no room for 131072 tokens of KV cache."""
    flags = Flags.parse("--max-model-len 131072")
    out = R.decide(CPU_SHARE_SHORT, flags, R.Context(requested=flags, vllm_version="0.32.0", block_size=128,
                                                     sizing=sized("0.32.0", LLAMA, platform="cpu")))
    assert isinstance(out, R.Relaunch) and out.step == "gpu_memory_utilization_free"
    share, length = out.changes
    assert share == R.Change(UTIL_, None, "0.37", CPU_SHARE_WHY)
    assert (length.flag, length.old, length.new) == (MML_, "131072", "auto")
    assert length.why.startswith("131072 tokens do not fit in the KV cache at utilization 0.37; ")
    assert out.flags == Flags.parse("--max-model-len auto --gpu-memory-utilization 0.37")


def test_a_cpu_share_shrunk_keeps_the_length_where_the_rules_do_not_allow_changing_it():
    flags = Flags.parse("--max-model-len 131072")
    out = R.decide(CPU_SHARE_SHORT, flags, R.Context(
        requested=flags, vllm_version="0.32.0", block_size=128, sizing=sized("0.32.0", LLAMA, platform="cpu"),
        rules=RemedyConfig(allowed=("gpu_memory_utilization", "kv_cache_fp8"))))
    assert out == _share(CPU_SHARE_WHY, "0.37", "--max-model-len 131072")


# -- the no-KV ladder, step by step, each reason word for word ------------------------------------
NO_KV_GAVE_UP = R.GiveUp("the weights and activations leave no memory for the KV cache, and every allowed remedy has "
                         "been tried", EX_TEMPFAIL, R.ADVICE)
EAGER_WHY = "no memory was left for the KV cache; eager mode frees what CUDA graphs and compilation take"


@pytest.mark.parametrize(("flags", "knows", "then"), [
    # 0.10's default share is 0.90 (0.92 only from 0.20): with nothing known about free memory, no higher
    ("", {"vllm_version": "0.10.2"},
     R.Relaunch(Flags.parse("--enforce-eager"), (R.Change("--enforce-eager", None, "", EAGER_WHY),), EAGER_WHY,
                step="no_kv:enforce_eager")),
    ("", {"vllm_version": "0.10.2", "gpu_total_gib": 40.0},
     R.Relaunch(Flags.parse("--enforce-eager"), (R.Change("--enforce-eager", None, "", EAGER_WHY),), EAGER_WHY,
                step="no_kv:enforce_eager")),
    # 37.52 GiB free of 40, less 0.5 GiB for the graphs 0.10 captures outside its share and its 0.4 GiB CUDA
    # context: (37.52 - 0.5 - 0.4) / 40 - 0.005 = 0.9105 -> 0.91, above the 0.90 it ran with
    ("", {"vllm_version": "0.10.2", "gpu_total_gib": 40.0, "gpu_free_gib": 37.52},
     R.Relaunch(Flags.parse("--gpu-memory-utilization 0.91"),
                (R.Change(UTIL_, None, "0.91", "no memory was left for the KV cache at 0.90; 0.91 gives vLLM more"),),
                "no memory was left for the KV cache at 0.90; 0.91 gives vLLM more",
                step="no_kv:gpu_memory_utilization")),
    # a margin of 0.05: (37.52 - 0.9) / 40 - 0.05 = 0.8655 -> 0.86, no more than 0.90
    ("", {"vllm_version": "0.10.2", "gpu_total_gib": 40.0, "gpu_free_gib": 37.52,
          "rules": RemedyConfig(utilization_margin=0.05)},
     R.Relaunch(Flags.parse("--enforce-eager"), (R.Change("--enforce-eager", None, "", EAGER_WHY),), EAGER_WHY,
                step="no_kv:enforce_eager")),
    ("--max-num-seqs 256", {"rules": RemedyConfig(no_kv_order=("max_num_seqs",))},
     R.Relaunch(Flags.parse("--max-num-seqs 128"),
                (R.Change("--max-num-seqs", "256", "128", "fewer concurrent sequences lower the activation peak"),),
                "fewer concurrent sequences lower the activation peak", step="no_kv:max_num_seqs")),
    ("", {"vllm_version": "0.10.2", "rules": RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=1)},
     R.Relaunch(Flags.parse("--cpu-offload-gb 1"),
                (R.Change("--cpu-offload-gb", None, "1", "offloading 1 GiB of weights to CPU leaves GPU memory for "
                          "the KV cache (slow)"),),
                "offloading 1 GiB of weights to CPU leaves GPU memory for the KV cache (slow)",
                step="no_kv:cpu_offload")),
    # --cpu-offload-gb arrived in vLLM 0.5.5: not for an older one, nor one whose version is unknown
    ("", {"vllm_version": "0.5.4", "rules": RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=1)},
     NO_KV_GAVE_UP),
    ("", {"rules": RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=1)}, NO_KV_GAVE_UP),
    # offloading is off at 0 GiB (the default)
    ("", {"vllm_version": "0.10.2", "rules": RemedyConfig(no_kv_order=("cpu_offload",), cpu_offload_gb=0)},
     NO_KV_GAVE_UP),
], ids=["0.10: the default share, nothing known", "0.10: only the total known", "0.10: room for 0.91",
        "0.10: a wider margin leaves no room", "fewer sequences", "offload 1 GiB", "offload before 0.5.5",
        "offload, the version unknown", "offload off"])
def test_the_no_kv_ladder_in_full(flags, knows, then):
    assert _kv(D(NO_KV), flags, **knows) == then


# -- the plan foresees the length a relaunch's other flags leave room for ----------------------------
def _no_kv_foreseen(numbers: dict, **knows: Any) -> R.Decision:
    """No KV memory on 0.10.1 at a share of 0.8 the user set (a ceiling): eager mode is the next step,
    and the plan says how much of Llama-3.1-8B's 131072 tokens then fit on an L4."""
    flags = Flags.parse("--gpu-memory-utilization 0.8")
    ctx = {"requested": flags, "vllm_version": "0.10.1.1", "sizing": sized("0.10.1.1", compute_capability=(8, 9)),
           "gpu_total_gib": 22.06, **knows}
    return R.decide(D(NO_KV, **numbers), flags, R.Context(**ctx))


EAGER_STEP = R.Change("--enforce-eager", None, "", EAGER_WHY)


def test_the_plan_cuts_the_length_the_relaunch_leaves_no_room_for():
    out = _no_kv_foreseen({})
    assert isinstance(out, R.Relaunch) and out.step == "no_kv:enforce_eager"
    eager, length = out.changes
    assert eager == EAGER_STEP
    assert (length.flag, length.old) == (MML_, None) and int(length.new) < 131072
    assert length.why.startswith("with the relaunch's other flags, 131072 tokens do not fit in the KV cache at "
                                 "utilization 0.80; ")
    assert out.flags == Flags.parse(f"--gpu-memory-utilization 0.8 --enforce-eager --max-model-len {length.new}")
    busy = _no_kv_foreseen({}, gpu_free_gib=18.0)       # other processes hold 4 GiB: less room still
    assert int(busy.flags.get_int(MML_)) < int(length.new)


def test_the_plan_never_raises_the_length_vllm_ran_with():
    foreseen = _no_kv_foreseen({}).flags.get_int(MML_)
    for ran in (4096, foreseen):          # below the plan's length, and exactly it
        out = _no_kv_foreseen({"max_model_len": ran})
        assert out == R.Relaunch(Flags.parse("--gpu-memory-utilization 0.8 --enforce-eager"), (EAGER_STEP,),
                                 EAGER_WHY, step="no_kv:enforce_eager")


def test_the_plan_leaves_the_length_alone_where_the_rules_do_not_allow_changing_it():
    out = _no_kv_foreseen({}, rules=RemedyConfig(allowed=("gpu_memory_utilization", "enforce_eager")))
    assert out == R.Relaunch(Flags.parse("--gpu-memory-utilization 0.8 --enforce-eager"), (EAGER_STEP,),
                             EAGER_WHY, step="no_kv:enforce_eager")


# -- V0's chunked-prefill gain: the launch's own flags size it ---------------------------------------
def _v0_fp8(flags: str, length: int, version: str = "0.6.6", info: Any = LLAMA) -> R.Decision:
    """1100 tokens fit on V0, below the floor: fp8 (2200 tokens), and chunked prefill where its profile frees memory."""
    return _kv(D(KV, max_model_len=length, fit_max_model_len=1100), flags, vllm_version=version,
               sizing=sized(version, info))


def _gain_said(out: R.Relaunch) -> int | None:
    said = [c.why for c in out.changes if c.flag == CHUNKED_]
    return int(said[0].split("room for about ")[1].split(" more")[0]) if said else None


@pytest.mark.parametrize(("flags", "gain_args"), [
    ("", {}),
    ("--dtype float32", {"dtype": "float32"}),
    ("--tensor-parallel-size 2", {"tp": 2}),
    ("--max-num-seqs 64", {"seqs": 64}),
])
def test_v0_chunked_prefill_gain_is_sized_for_the_launchs_flags(flags, gain_args):
    """The gain is the plan's (``v0_chunked_gain_tokens``, its arithmetic pinned in test_remedy_sizing)
    for this launch's dtype, tensor parallelism and sequences, from 8192 tokens to V0's 2048-token chunk."""
    out = _v0_fp8(f"--max-model-len 8192 {flags}", 8192)
    assert isinstance(out, R.Relaunch) and out.flags.enabled(CHUNKED_)
    gain = P.v0_chunked_gain_tokens(LLAMA, from_tokens=8192, to_tokens=2048, **gain_args)
    assert _gain_said(out) == gain
    if gain_args:
        assert gain != P.v0_chunked_gain_tokens(LLAMA, from_tokens=8192, to_tokens=2048)   # the flag tells


def test_v0_before_0_6_5_chunks_prefill_in_512_tokens():
    out = _v0_fp8("--max-model-len 8192", 8192, version="0.6.3")
    assert any("in chunks of 512 the profile frees room for about " in c.why for c in out.changes)
    assert _gain_said(out) == P.v0_chunked_gain_tokens(LLAMA, from_tokens=8192, to_tokens=512)


def test_v0_chunked_prefill_is_added_only_where_it_frees_a_token():
    # Llama-3.1-8B with one sequence: 2050 tokens profiled at once take one token's KV more than a chunk
    one = _v0_fp8("--max-model-len 2050 --max-num-seqs 1", 2050)
    assert P.v0_chunked_gain_tokens(LLAMA, from_tokens=2050, to_tokens=2048, seqs=1) == 1 == _gain_said(one)
    # Qwen2.5-7B: 2048 tokens are one chunk, nothing to gain (from 2049 it would be 2 tokens)
    none = _v0_fp8("--max-model-len 2048 --max-num-seqs 1", 2048, info=QWEN7B)
    assert P.v0_chunked_gain_tokens(QWEN7B, from_tokens=2049, to_tokens=2048, seqs=1) == 2
    assert none.flags == Flags.parse("--max-model-len 2048 --max-num-seqs 1 --kv-cache-dtype fp8")


def test_chunked_prefill_gain_is_for_v0_only():
    out = _v0_fp8("--max-model-len 8192", 8192, version="0.10.2")
    # V1 prefills in chunks anyway: fp8 alone, 2 x 1100 = 2200 tokens, 2192 in whole blocks
    assert out.flags == Flags.parse("--max-model-len 2192 --kv-cache-dtype fp8")


# -- why the length becomes what it does, at the edges of the rule ------------------------------------
@pytest.mark.parametrize(("failure", "flags", "asked", "why"), [
    (D(KV, fit_max_model_len=3000), "", None,
     "the KV cache holds about 3000 tokens (vLLM's estimate); 2992 is that, aligned down to the 16-token block"),
    # the length asked for is exactly vLLM's estimate: the estimate is the reason
    (D(KV, max_model_len=16384, fit_max_model_len=8192), "--max-model-len 16384", "--max-model-len 8192",
     "the KV cache holds about 8192 tokens (vLLM's estimate), not 16384; 8192 is that, aligned down to the "
     "16-token block"),
    # a length between blocks: vLLM's estimate (above it or exactly it) is no help, the whole blocks are
    (D(KV, max_model_len=16390, fit_max_model_len=20000), "--max-model-len 16390", None,
     "the KV cache cannot hold 16390 tokens, yet vLLM's estimate gives 20000, no fewer; 16384 is 16390, aligned "
     "down to the 16-token block"),
    (D(KV, max_model_len=16390, fit_max_model_len=16390), "--max-model-len 16390", None,
     "the KV cache cannot hold 16390 tokens, yet vLLM's estimate gives 16390, no fewer; 16384 is 16390, aligned "
     "down to the 16-token block"),
], ids=["no length known", "the length asked for is the estimate", "between blocks, estimate above",
        "between blocks, estimate equal"])
def test_the_length_reason_at_the_edges(failure, flags, asked, why):
    out = _kv(failure, flags, asked)
    assert isinstance(out, R.Relaunch) and out.why == why and out.changes[0].why == why


# -- flags vLLM removed, named where vLLM says it refused them -------------------------------------
SWAP_GONE = "--swap-space was removed in vLLM 0.18.0 (V1 never swaps to CPU; the flag is a no-op and was removed)"
V2_GONE = "--use-v2-block-manager was removed in vLLM 0.10.0 (the v2 block manager is the only one)"


@pytest.mark.parametrize(("evidence", "flags", "changes"), [
    # vLLM said it twice: every flag after the first "unrecognized arguments:" is one it refused
    ("vllm: error: unrecognized arguments: --swap-space 4\nvllm: error: unrecognized arguments: "
     "--use-v2-block-manager", "--swap-space 4 --use-v2-block-manager",
     (("--swap-space", "4", None, SWAP_GONE), ("--use-v2-block-manager", "", None, V2_GONE))),
    # a flag named before it is not one vLLM refused
    ("WARNING --swap-space 4 is ignored\nvllm: error: unrecognized arguments: --use-v2-block-manager",
     "--swap-space 4 --use-v2-block-manager", (("--use-v2-block-manager", "", None, V2_GONE),)),
    # the name is what comes before the first "="
    ("vllm: error: unrecognized arguments: --task=embed=1", "--task=embed=1",
     (("--task", "embed=1", None, "--task was removed in vLLM 0.13.0 (use --runner / --convert)"),)),
], ids=["said twice", "named before", "a value with '='"])
def test_the_flags_vllm_refused_as_removed_are_dropped(evidence, flags, changes):
    out = _kv(D(CONFIG, evidence), flags)
    assert isinstance(out, R.Relaunch) and out.step == "drop_removed_flags"
    assert tuple((c.flag, c.old, c.new, c.why) for c in out.changes) == changes
    assert out.why == "; ".join(c[3] for c in changes)


def test_a_refusal_ending_in_a_capital_x_is_quoted_whole():
    evidence = "ValueError: Unsupported platform: Intel Data Center GPU MAX."
    out = _kv(D(CONFIG, evidence))
    assert isinstance(out, R.GiveUp)
    assert out.reason == "vLLM refused its configuration: ValueError: Unsupported platform: Intel Data Center GPU MAX"


def test_a_restart_names_the_engines_death_as_the_log_says_it():
    d = Diagnosis(Kind.ENGINE_DEAD, detail="the engine core died on the Intel GPU MAX.")
    out = _kv(d, "--max-num-seqs 64")
    assert out == R.Relaunch(Flags.parse("--max-num-seqs 64"), (),
                             "the engine core died on the Intel GPU MAX; relaunching with the last good flags",
                             backoff=True, step="restart")


def test_combined_steps_keep_a_flags_first_value():
    first = (R.Change("--max-model-len", "8192", "4096", "the plan cut it"),)
    then = (R.Change("--max-model-len", "4096", "2048", "vLLM measured less"),)
    assert R.combined(first, then) == (
        R.Change("--max-model-len", "8192", "2048", "the plan cut it; then vLLM measured less"),)


def test_a_free_memory_share_with_a_wider_margin():
    # 12.88 / 16 - 0.05 = 0.755 -> 0.75
    out = _kv(D(FREE, free_gib=12.88, total_gib=16.0, requested_utilization=0.9),
              rules=RemedyConfig(utilization_margin=0.05))
    assert out == _share("only 12.88 of 16.0 GiB is free (other processes hold the rest); 0.75 stays under it", "0.75")


def test_a_cpu_kv_size_lowered_without_the_total_leaves_the_length_to_vllm():
    flags = "--kv-cache-memory-bytes 64G --max-model-len 131072"
    out = _kv(D(FREE, free_gib=0.5, cpu_kv_gib=64.0, max_model_len=131072), flags,
              sizing=sized("0.32.0", TINY_CPU, platform="cpu"), vllm_version="0.32.0", block_size=128)
    # 0.5 x 0.9 = 0.45 GiB = 483183820 bytes, down to whole MiB: 460 x 2**20 = 482344960
    assert out == R.Relaunch(Flags.parse("--kv-cache-memory-bytes 482344960 --max-model-len 131072"),
                             (R.Change("--kv-cache-memory-bytes", "64G", "482344960",
                                       "only 0.5 GiB of CPU memory is available; 0.45 GiB stays under it"),),
                             "only 0.5 GiB of CPU memory is available; 0.45 GiB stays under it", step="cpu_kv_space")


def test_a_kv_allocation_oom_at_the_share_free_memory_allows_steps_down_005():
    # (18.56 - 0.4 GiB of CUDA context) / 22.06 - 0.005 = 0.818 -> 0.81: the share it ran with, so 0.81 - 0.05
    flags = "--enforce-eager --gpu-memory-utilization 0.81"
    out = _kv(Diagnosis(Kind.OOM_PROFILE, phase="kv_cache"), flags, gpu_free_gib=18.56, gpu_total_gib=22.06)
    why = ("CUDA ran out of memory allocating the KV cache: other processes hold memory vLLM's budget counted on; "
           "0.76 stays under what they leave")
    assert out == R.Relaunch(Flags.parse("--enforce-eager --gpu-memory-utilization 0.76"),
                             (R.Change(UTIL_, "0.81", "0.76", why),), why, step="oom_kv_alloc")


def test_an_oom_nothing_placed_gives_up_saying_so():
    out = _kv(Diagnosis(Kind.OOM_WEIGHTS, phase="unknown"))
    assert out == R.GiveUp("CUDA ran out of memory and nothing in the log says where; read as the start-up's first "
                           "phase, the model's weights may not fit in GPU memory", EX_TEMPFAIL, R.ADVICE)
    assert _kv(Diagnosis(Kind.OOM_WEIGHTS, phase="weights")) == R.GiveUp(
        "the model's weights do not fit in GPU memory", EX_TEMPFAIL, R.ADVICE)


# -- the engine generation as the log shows it decides the V0-only flags ----------------------------
@pytest.mark.parametrize(("engine", "version", "chunked"), [
    ("v0", None, True),            # a wrapper that hides the version: the log says V0
    ("v0", "0.10.2", True),        # a 0.8-0.10 vLLM that fell back to V0
    ("v1", "0.6.6", False),        # the log's V1 wins over a version read elsewhere
    (None, "0.6.6", True),         # nothing logged: the version decides
    ("v2", "0.6.6", True),         # an engine the guard does not know: the version decides
    (None, None, False),
])
def test_v0_only_chunked_prefill_follows_the_engine_the_log_shows(engine, version, chunked):
    numbers = {"max_model_len": 40960, "fit_max_model_len": 32768} | ({"engine": engine} if engine else {})
    out = _kv(Diagnosis(KV, numbers=numbers), "--max-model-len 40960", vllm_version=version)
    assert out.flags == Flags.parse("--max-model-len 32768" + (" --enable-chunked-prefill" if chunked else ""))


# -- vLLM's batch defaults, as the launch's flags and version make them ------------------------------
@pytest.mark.parametrize(("flags", "knows", "then"), [
    # V0 (0.6.6) runs 256 sequences whatever the GPU: on an 80 GB card half of it is 128 (V1 0.32 would run 1024)
    ("", {"vllm_version": "0.6.6", "gpu_total_gib": 79.19}, "--max-num-seqs 128"),
    # the CPU build runs 128 sequences a rank: two ranks, 256, halved
    ("--tensor-parallel-size 2", {"vllm_version": "0.32.0", "sizing": sized("0.32.0", TINY_CPU, platform="cpu")},
     "--tensor-parallel-size 2 --max-num-seqs 128"),
], ids=["V0 on 80 GB", "CPU, two ranks"])
def test_oom_while_serving_halves_vllms_default_sequences(flags, knows, then):
    out = _kv(D(Kind.OOM_RUNTIME), flags, **knows)
    assert isinstance(out, R.Relaunch) and out.step == "oom_runtime" and out.flags == Flags.parse(then)


@pytest.mark.parametrize(("flags", "version", "then"), [
    # V0 with chunked prefill on: its 2048-token chunk is the batch, halved
    ("--max-model-len 8192 --enable-chunked-prefill", "0.6.6", "--max-num-batched-tokens 1024"),
    # 0.12+ holds the default batch to max_num_seqs x max_model_len: 256 x 7 = 1792, halved
    ("--max-model-len 7", "0.32.0", "--max-num-batched-tokens 896"),
], ids=["V0 chunked", "0.12+: a batch no bigger than the sequences' lengths"])
def test_no_kv_memory_halves_vllms_default_batch(flags, version, then):
    out = _kv(D(NO_KV), flags, vllm_version=version, rules=RemedyConfig(no_kv_order=("max_num_batched_tokens",)))
    assert isinstance(out, R.Relaunch) and out.flags == Flags.parse(f"{flags} {then}")


def test_the_plan_sizes_for_the_vllm_version_detected_at_start_up():
    """The plan's facts built before the version was known: the version detected decides (0.10's numeric
    length, not the latest vLLM's auto)."""
    known = _no_kv_foreseen({})
    late = _no_kv_foreseen({}, sizing=sized(None, compute_capability=(8, 9)))
    assert late == known and late.flags.get_int(MML_) is not None


def test_free_memory_gives_up_where_the_share_holds_exactly_the_weights():
    """At 0.49 of 16 GiB vLLM could use 7.84 GiB: weights of exactly that leave nothing for the KV cache."""
    weights_gib = LLAMA.weights_bytes / 2**30
    offload = weights_gib - 0.49 * 16.0          # what stays on the GPU is exactly 0.49 x 16 GiB
    out = _kv(D(FREE, free_gib=8.08, total_gib=16.0, requested_utilization=0.9), f"--cpu-offload-gb {offload!r}",
              sizing=sized("0.32.0"), vllm_version="0.32.0")
    assert out == R.GiveUp("only 8.08 of 16.0 GiB is free on the GPU: at 0.49 vLLM could use 7.84 GiB, less than "
                           "the model's weights (7.84 GiB per rank)", EX_TEMPFAIL, GPU_HELD)


def test_a_cpu_kv_size_lowered_to_what_holds_the_length_leaves_the_length():
    knows = {"sizing": sized("0.32.0", TINY_CPU, platform="cpu"), "vllm_version": "0.32.0", "block_size": 128}
    cut = _kv(D(FREE, free_gib=0.5, total_gib=9.59, cpu_kv_gib=64.0, max_model_len=131072),
              "--kv-cache-memory-bytes 64G --max-model-len 131072", **knows)
    held = cut.flags.get_int(MML_)        # the length 0.45 GiB of KV cache holds, by the plan
    assert held is not None and held < 131072
    out = _kv(D(FREE, free_gib=0.5, total_gib=9.59, cpu_kv_gib=64.0, max_model_len=held), "--kv-cache-memory-bytes 64G",
              **knows)
    assert out.flags == Flags.parse("--kv-cache-memory-bytes 482344960") and len(out.changes) == 1
