"""The scenario matrix: real model configs x GPUs x requested contexts x vLLM generations.

Each model's emulator spec is derived from the same config.json the guard's plan reads
(:func:`supervisor.core.model.load_model_info`), so the plan and the emulator agree on the model.
"The largest context that fits" is found by searching the emulator itself (:func:`reference_fit`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cache

from benchmarks.render import CONTEXT_GIB, emu, simulate
from supervisor.core.flags import Flags
from supervisor.core.memory import kv_bytes_per_token
from supervisor.core.model import ModelInfo, derive_max_model_len
from supervisor.core.vllm import fp8_kv_supported, parse_version
from supervisor.facts.model_files import load_model_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MIN_LEN = 2048     # the guard's floor (RemedyConfig.min_model_len); below it a case counts as unhealable


@dataclass(frozen=True)
class Model:
    """A checkpoint of the matrix: its config directory and the flags it is always launched with."""

    key: str                 # short label
    name: str                # the Hugging Face id (what --model says)
    path: str                # directory with config.json and model.safetensors.index.json
    base: tuple[str, ...] = ()    # e.g. ("--tensor-parallel-size", "2")
    gpus: int = 1
    v0: bool = True          # launchable on the V0 generation of the matrix


@dataclass(frozen=True)
class Gpu:
    """A GPU (or a node of identical GPUs) and the memory other processes hold on each."""

    key: str
    name: str
    total_gib: float         # as torch.cuda.mem_get_info reports it
    cc: tuple[int, int]
    other_gib: float = 0.0
    count: int = 1

    def spec(self) -> emu.GpuSpec:
        return emu.GpuSpec(total_gib=self.total_gib, other_used_gib=self.other_gib, cc=self.cc,
                           count=self.count)


@dataclass(frozen=True)
class Case:
    """One cell of the matrix."""

    model: Model
    gpu: Gpu
    context: str             # "default" | "32k" | "8k"
    version: str
    requested: Flags = field(default_factory=Flags)

    @property
    def label(self) -> str:
        return f"{self.model.key} | {self.gpu.key} | {self.context} | {self.version}"


def _fixture(name: str) -> str:
    return os.path.join(ROOT, "tests", "fixtures", "models", name)


MODELS = (
    Model("Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", _fixture("Llama-3.1-8B-Instruct")),
    Model("Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", _fixture("Qwen2.5-7B-Instruct")),
    Model("Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct",
          os.path.join(ROOT, "benchmarks", "models", "Qwen2.5-14B-Instruct")),
    Model("Qwen2.5-32B-AWQ", "Qwen/Qwen2.5-32B-Instruct-AWQ", _fixture("Qwen2.5-32B-Instruct-AWQ")),
    Model("Llama-3.3-70B-AWQ TP2", "casperhansen/llama-3.3-70b-instruct-awq",
          _fixture("Llama-3.3-70B-Instruct-AWQ"), ("--tensor-parallel-size", "2"), gpus=2),
    # MLA: V0 of the matrix's era (0.6.x) ran DeepSeek-V2 without MLA, so only the V1 versions.
    Model("DeepSeek-V2-Lite (MLA)", "deepseek-ai/DeepSeek-V2-Lite", _fixture("DeepSeek-V2-Lite"),
          ("--trust-remote-code",), v0=False),
)

# Totals as torch reports them: T4 14.75, L4 22.06, L40S 44.52, H100 79.19 GiB.
T4 = Gpu("T4 16GB", "Tesla T4", 14.75, (7, 5))
L4 = Gpu("L4 24GB", "NVIDIA L4", 22.06, (8, 9))
L4_BUSY = Gpu("L4 24GB, 3 GiB held", "NVIDIA L4", 22.06, (8, 9), other_gib=3.0)
L40S = Gpu("L40S 48GB", "NVIDIA L40S", 44.52, (8, 9))
H100 = Gpu("H100 80GB", "NVIDIA H100 80GB HBM3", 79.19, (9, 0))
H100_BUSY = Gpu("H100 80GB, 20 GiB held", "NVIDIA H100 80GB HBM3", 79.19, (9, 0), other_gib=20.0)


def _pair(g: Gpu) -> Gpu:
    return Gpu("2x " + g.key, g.name, g.total_gib, g.cc, g.other_gib, count=2)


GPUS_FOR = {
    "Llama-3.1-8B": (L4, L4_BUSY, L40S, H100),
    "Qwen2.5-7B": (T4, L4, L4_BUSY, L40S),
    "Qwen2.5-14B": (L40S, H100, H100_BUSY),
    "Qwen2.5-32B-AWQ": (L4, L4_BUSY, L40S),
    "Llama-3.3-70B-AWQ TP2": (_pair(L4), _pair(L40S), _pair(H100)),
    "DeepSeek-V2-Lite (MLA)": (L40S, H100, H100_BUSY),
}

#: One vLLM per generation: V0 (0.6.6), V1 that prints the estimate but sizes CUDA graphs outside
#: its budget (0.10.1.1, so graph capture can run out of memory), V1 that counts graphs (0.32.0).
VERSIONS = ("0.6.6.post1", "0.10.1.1", "0.32.0")
CONTEXTS = {"default": None, "32k": 32768, "8k": 8192}


@cache
def model_info(path: str) -> ModelInfo:
    info = load_model_info(path)
    assert info is not None, f"no config.json in {path}"
    return info


def model_spec(model: Model, version: str) -> emu.ModelSpec:
    """The emulator's view of ``model``, from the same config.json the plan reads.

    The weights are what vLLM loads: the checkpoint's size from its index and the rotary cos/sin
    cache vLLM adds (every position x the rotary dimension, 16-bit; fp32 for DeepSeek's MLA).
    """
    info = model_info(model.path)
    s = info.shape
    rope = s.max_positions * (s.qk_rope * 4 if s.mla else s.rotary_dim * 2)
    return emu.ModelSpec(
        name=model.name, weights_gib=((info.weights_bytes or 0) + rope) / GiB,
        kv_bytes_per_token=kv_bytes_per_token(info), num_kv_heads=info.num_kv_heads,
        derived_max_model_len=derive_max_model_len(info, version), vocab=info.vocab_size,
        hidden=info.hidden_size, intermediate=info.intermediate_size, mla=info.mla, num_layers=info.num_layers,
        experts_per_token=s.topk if s.experts else 0, moe_intermediate=s.moe_intermediate,
        shared_intermediate=s.shared_intermediate, dense_layers=s.dense_layers)


def cases() -> list[Case]:
    """The whole matrix (contexts equal to the model's own default are not repeated)."""
    out = []
    for model in MODELS:
        for gpu in GPUS_FOR[model.key]:
            for version in VERSIONS:
                if not model.v0 and emu.vtuple(version) < (0, 8, 0):
                    continue
                derived = derive_max_model_len(model_info(model.path), version)
                for context, length in CONTEXTS.items():
                    if length is not None and length >= derived:
                        continue      # the same launch as "default"
                    flags = Flags.parse(list(model.base))
                    if length is not None:
                        flags = flags.set("--max-model-len", str(length))
                    out.append(Case(model, gpu, context, version, flags))
    return out


# -- the largest context that fits ------------------------------------------------------------
def _largest(ok, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ok(n), for ok monotone (true then false); 0 if none."""
    if lo > hi or not ok(lo):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Fit:
    """The reference: the largest --max-model-len that serves, and the flags it needs."""

    length: int
    flags: Flags


def reference_fit(case: Case) -> Fit:
    """Search the emulator for the largest context (<= the request) a careful person could serve.

    Tiers, in the order the guard's policy degrades (``remedy._kv_cache``), each tried only when
    the one before cannot serve ``MIN_LEN`` tokens: CUDA graphs on, then fp8 KV (where the GPU
    and version take it), then --enforce-eager, then both. In every tier: any --max-model-len at
    the user's (default) utilization or, when other processes hold memory, at the highest 0.01
    step free memory allows; with CUDA graphs on also any lower step, because vLLM < 0.20 captures
    them outside its budget and needs room left for them. Not allowed: smaller batches or a
    utilization above the default (they trade safety for context). V0 profiles the whole context
    unchunked up to 32768, so the length is searched on each side of that switch, and also with
    --enable-chunked-prefill (no degradation: V1 always chunks, V0 itself does above 32768).
    """
    spec = model_spec(case.model, case.version)
    gpu = case.gpu.spec()
    cap = case.requested.get_int("--max-model-len") or spec.derived_max_model_len
    default = float(emu.default_utilization(case.version))
    util = case.requested.get_float("--gpu-memory-utilization") or default
    free_frac = (gpu.total_gib - gpu.other_used_gib - CONTEXT_GIB) / gpu.total_gib
    top = min(util, math.floor(free_frac * 100) / 100)
    tiers = [(False, False)]
    if fp8_kv_supported(case.gpu.cc, case.version, spec.mla):
        tiers += [(False, True), (True, False), (True, True)]
    else:
        tiers += [(True, False)]

    v0 = (parse_version(case.version) or (99,)) < (0, 8)

    def longest_as(flags: Flags) -> int:
        def ok(n: int) -> bool:
            return simulate(spec, gpu, case.version, flags.set("--max-model-len", str(n))).ok

        for lo, hi in ((32769, cap), (1, min(cap, 32768))):
            n = _largest(ok, lo, hi)
            if n:
                return n
        return 0

    def longest(flags: Flags) -> tuple[int, Flags]:
        n, best = longest_as(flags), flags
        if v0 and not flags.has("--enable-chunked-prefill"):
            chunked = flags.set("--enable-chunked-prefill")
            m = longest_as(chunked)
            if m > n:
                n, best = m, chunked
        return n, best

    for eager, fp8 in tiers:
        best = Fit(0, case.requested)
        u, steps = top, 0
        while u > 0.3 and steps < 40:
            flags = case.requested.set("--gpu-memory-utilization", f"{u:.2f}") if u != util \
                else case.requested
            if eager:
                flags = flags.set("--enforce-eager")
            if fp8:
                flags = flags.set("--kv-cache-dtype", "fp8")
            n, flags = longest(flags)
            if n > best.length:
                best = Fit(n, flags.set("--max-model-len", str(n)))
            elif best.length or eager:
                break        # past the best: less memory only shortens the context from here
            u, steps = round(u - 0.01, 2), steps + 1
        if best.length >= MIN_LEN:
            return best
    return Fit(0, case.requested)
