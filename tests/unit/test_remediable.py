"""supervisor.core.remediable: the flags the guard changes, each value accepted only in vLLM's type and range.

The bounds are vLLM's (0.32's EngineArgs fields): gpu_memory_utilization Field(gt=0, le=1), max_num_seqs and
max_num_batched_tokens Field(ge=1), cpu_offload_gb Field(ge=0), max_model_len Field(ge=-1) with -1/auto for
vLLM's own sizing, and the names of CacheDType in vllm/config/cache.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core import flags as F
from supervisor.core.flags import Flags
from supervisor.core.remediable import REMEDIABLE, accept, apply, changes, reason

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag,value,token", [
    ("--gpu-memory-utilization", "0.9", "0.9"), ("--gpu-memory-utilization", 1, "1"),
    ("--gpu-memory-utilization", 0.85, "0.85"),
    ("--max-model-len", "8192", "8192"), ("--max-model-len", 30368, "30368"), ("--max-model-len", "auto", "auto"),
    ("--max-model-len", "-1", "-1"), ("--kv-cache-dtype", "fp8", "fp8"), ("--kv-cache-dtype", "fp8_e5m2", "fp8_e5m2"),
    ("--max-num-seqs", "1", "1"), ("--max-num-batched-tokens", 2048, "2048"), ("--cpu-offload-gb", "0", "0"),
    ("--cpu-offload-gb", "4.5", "4.5"), ("--kv-cache-memory-bytes", "8589934592", "8589934592"),
    ("--enforce-eager", True, True), ("--enable-chunked-prefill", True, True),
])
def test_values_in_vllms_type_and_range_are_accepted_as_one_token(flag, value, token):
    assert accept(flag, value) == token


@pytest.mark.parametrize("flag,value", [
    ("--gpu-memory-utilization", "0"), ("--gpu-memory-utilization", 0.0), ("--gpu-memory-utilization", "1.01"),
    ("--gpu-memory-utilization", "-0.5"), ("--gpu-memory-utilization", "nan"), ("--gpu-memory-utilization", "inf"),
    ("--gpu-memory-utilization", True), ("--max-model-len", "0"), ("--max-model-len", "-2"), ("--max-model-len", "32k"),
    ("--max-model-len", "8192 --trust-remote-code"), ("--max-model-len", " 8192"), ("--max-model-len", 81.5),
    ("--max-model-len", "99999999999"), ("--max-model-len", None), ("--max-model-len", ["8192"]),
    ("--kv-cache-dtype", "fp9"), ("--kv-cache-dtype", "FP8"), ("--kv-cache-dtype", 8), ("--max-num-seqs", "0"),
    ("--max-num-seqs", False), ("--cpu-offload-gb", "-1"), ("--enforce-eager", False), ("--enforce-eager", "true"),
    ("--enforce-eager", 1), ("--trust-remote-code", True), ("--tokenizer", "/tmp/evil"), ("--model", "other"),
    ("--api-key", "k"), (5, "8192"),
])
def test_anything_else_is_refused_naming_the_flag(flag, value):
    with pytest.raises(ValueError) as e:
        accept(flag, value)
    assert repr(flag) in str(e.value) or str(flag) in str(e.value)


def test_a_reason_is_printable_and_bounded():
    assert reason("cut to 8192\x1b[31m\n") == "cut to 8192 [31m "
    assert len(reason("x" * 10_000)) == 500 and reason(None) == "" and reason(5) == ""


@given(st.dictionaries(st.sampled_from(list(REMEDIABLE)), st.one_of(
    st.booleans(), st.integers(-5, 1 << 40), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["fp8", "auto", "0.9", "8192", "--enforce-eager"]))),
    st.lists(st.sampled_from(["--max-model-len", "8192", "--dtype", "half", "--enforce-eager", "--kv-cache-dtype",
                              "auto", "m", "--served-model-name", "x"]), max_size=8))
def test_applied_learned_values_change_only_remediable_flags_and_round_trip(learned, user):
    requested = Flags.parse(user)
    good = {}
    for flag, value in learned.items():
        try:
            good[flag] = accept(flag, value)
        except ValueError:
            continue
    flags = apply(requested, good)
    assert set(flags.names()) <= set(requested.names()) | set(REMEDIABLE)
    assert flags.positionals() == requested.positionals()
    for name in requested.names():
        if name not in REMEDIABLE:
            assert flags.get(name) == requested.get(name)
    assert changes(requested, flags) == {k: v for k, v in good.items()
                                         if (v is True and not requested.enabled(k)) or
                                         (v is not True and v != requested.get(k))}


def _set_flags(path: Path) -> set[str]:
    """The flag constants a module passes to Flags.set / remedy._set / Fit's ``out[...] =``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set" \
                and node.args and isinstance(node.args[0], ast.Name):
            names.add(node.args[0].id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_set" \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Name):
            names.add(node.args[1].id)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript) \
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "out" \
                and isinstance(node.targets[0].slice, ast.Name):
            names.add(node.targets[0].slice.id)
    return names


def test_every_flag_the_plan_remedies_and_session_change_is_remediable():
    from supervisor.core import plan, remedy, session

    for module in (remedy, plan, session):
        for name in _set_flags(Path(module.__file__)):
            value = getattr(module, name, None) or getattr(F, name, None)
            if not isinstance(value, str):
                continue                     # a variable holding a flag chosen from a list of these names
            assert value in REMEDIABLE, f"{module.__name__} changes {value} ({name}), which learned.json cannot hold"
