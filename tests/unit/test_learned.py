"""supervisor.shell.learned against real files: learned flags are data (what the guard changed, each value
in its type), a store that cannot be trusted is set aside, and whatever learned.json holds, the flags
that reach vLLM are the user's with at most a remediable value changed."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.config import GuardConfig
from supervisor.core.flags import Flags
from supervisor.core.gpus import GpuDevice
from supervisor.core.remediable import REMEDIABLE
from supervisor.core.session import Facts, Measured, Session
from supervisor.shell import learned as state
from supervisor.shell.learned import LearnedStore

ASKED = GuardConfig(model="m", vllm_args=("--max-model-len", "8192", "--dtype", "half"))


def _key(**over):
    args = dict(model="m", revision=None, gpus=[("H100", 80), ("H100", 80)], tp=2, vllm_version="0.32.0",
                user_args=["--max-model-len", "8192"])
    args.update(over)
    return state.learned_key(**args)


def _flags_key(tmp_path: Path, cfg: GuardConfig = ASKED) -> str:
    return state.learned_facts(cfg, Facts(), str(tmp_path))[1].flags


def test_learned_key_is_stable_and_sensitive_to_each_part():
    assert _key() == _key()
    assert _key(gpus=[("H100", 80), ("H100", 80)]) == _key(gpus=[("H100", 80), ("H100", 80)])
    variants = [_key(model="n"), _key(revision="abc"), _key(gpus=[("A100", 40)]), _key(tp=1),
                _key(vllm_version="0.31.0"), _key(user_args=[])]
    assert len({_key(), *variants}) == 1 + len(variants)
    assert _key().startswith("m@-#")


def test_the_store_keeps_only_what_the_guard_changed_and_reads_it_back(tmp_path):
    key = _flags_key(tmp_path)
    assert LearnedStore(str(tmp_path)).put(key, {"--max-model-len": "4096", "--enforce-eager": True},
                                           {"--max-model-len": "the KV cache holds 4096"}, {"model": "m"})
    stored = json.loads((tmp_path / "learned.json").read_text())[key]
    assert stored["flags"] == {"--max-model-len": {"value": "4096", "why": "the KV cache holds 4096"},
                               "--enforce-eager": {"value": True, "why": ""}}
    assert "argv" not in stored and stored["meta"] == {"model": "m"}
    found = state.learned_facts(ASKED, Facts(), str(tmp_path))[0].learned
    assert found is not None and found.flags == {"--max-model-len": "4096", "--enforce-eager": True}
    assert found.reasons["--max-model-len"] == "the KV cache holds 4096"
    assert LearnedStore(str(tmp_path)).drop(key)
    assert state.learned_facts(ASKED, Facts(), str(tmp_path))[0].learned is None


def test_a_flag_the_guard_does_not_change_cannot_even_be_stored(tmp_path):
    with pytest.raises(ValueError, match="--trust-remote-code"):
        LearnedStore(str(tmp_path)).put("k", {"--trust-remote-code": True}, {}, {})
    assert not (tmp_path / "learned.json").exists()


@pytest.mark.parametrize("content", ["{truncated", "[1, 2]"])
def test_a_corrupt_learned_store_is_set_aside_with_a_warning(tmp_path, content):
    (tmp_path / "learned.json").write_text(content)
    warnings: list[str] = []
    store = LearnedStore(str(tmp_path), warn=warnings.append)
    assert store.get("k") is None
    aside = list(tmp_path.glob("learned.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert len(warnings) == 1 and str(aside[0]) in warnings[0]
    store.put("k", {"--enforce-eager": True}, {}, {})
    assert store.get("k")["flags"] == {"--enforce-eager": {"value": True, "why": ""}}


@pytest.mark.parametrize("entry", [
    {"argv": "not a list"},
    {"flags": {"--max-model-len": "8192 --trust-remote-code"}},              # not {value, why}
    {"flags": {"--max-model-len": {"value": "8192 --trust-remote-code"}}},   # a value of the wrong shape
    {"flags": {"--trust-remote-code": {"value": True}}},                     # a flag the guard does not change
    {"flags": {"--gpu-memory-utilization": {"value": 1.5}}},                 # outside (0, 1]
    {"flags": {"--kv-cache-dtype": {"value": "fp9"}}},                       # not one of vLLM's
    "a string",
])
def test_an_entry_that_is_not_the_guards_is_ignored_with_a_warning(tmp_path, entry):
    key = _flags_key(tmp_path)
    (tmp_path / "learned.json").write_text(json.dumps({key: entry}))
    warnings: list[str] = []
    facts, _ = state.learned_facts(ASKED, Facts(), str(tmp_path), warn=warnings.append)
    assert facts.learned is None
    assert len(warnings) == 1 and ("malformed" in warnings[0] or "not the guard's" in warnings[0])


def test_an_older_guards_command_line_keeps_only_what_it_changed_among_the_remediable_flags(tmp_path):
    key = _flags_key(tmp_path)
    planted = ["--max-model-len", "4096", "--dtype", "half", "--trust-remote-code", "--tokenizer", "/tmp/evil",
               "--gpu-memory-utilization", "0.85", "--kv-cache-dtype", "fp8; rm -rf /"]
    (tmp_path / "learned.json").write_text(json.dumps({key: {"argv": planted, "saved_at": "2026-11-01",
                                                             "meta": {"reasons": {"--max-model-len": "cut"}}}}))
    found = state.learned_facts(ASKED, Facts(), str(tmp_path))[0].learned
    assert found is not None
    assert found.flags == {"--max-model-len": "4096", "--gpu-memory-utilization": "0.85"}
    assert found.reasons == {"--max-model-len": "cut", "--gpu-memory-utilization": ""}
    first = Session(ASKED, Facts(learned=found), rng=random.Random(0)).first_launch()
    assert first.flags.argv() == ["--max-model-len", "4096", "--dtype", "half", "--gpu-memory-utilization", "0.85"]


def test_measured_memory_is_kept_for_this_host_whatever_the_flags(tmp_path):
    h100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", 80 << 30, 0, 80 << 30, (9, 0), ())
    facts = Facts(devices=(h100,), vllm_version="0.11.0")
    measured = Measured(6 << 30, 61 << 30, (("--max-num-seqs", None),))
    asked = GuardConfig(model="m", vllm_args=("--max-model-len", "16000"))
    _, keys = state.learned_facts(asked, facts, str(tmp_path))
    LearnedStore(str(tmp_path)).put_measured(keys.measured, measured.to_dict(), {})
    other_flags = GuardConfig(model="m", vllm_args=("--max-model-len", "8192"))
    found, other = state.learned_facts(other_flags, facts, str(tmp_path))
    assert other.flags != keys.flags and other.measured == keys.measured
    assert found.measured == measured and found.learned is None
    other_gpu = Facts(devices=(GpuDevice(0, "NVIDIA L4", 22 << 30, 0, 22 << 30, (8, 9), ()),), vllm_version="0.11.0")
    assert state.learned_facts(other_flags, other_gpu, str(tmp_path))[0].measured is None


@pytest.mark.parametrize("garbage", [5, {"overhead_bytes": "6"},
                                     {"overhead_bytes": -1, "weights_bytes": 0, "under": []},
                                     {"overhead_bytes": 1, "weights_bytes": 1, "under": 7}])
def test_a_malformed_measurement_is_ignored(tmp_path, garbage):
    _, keys = state.learned_facts(GuardConfig(model="m"), Facts(), str(tmp_path))
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({keys.measured: {"meta": {"measured": garbage}}}))
    assert state.learned_facts(GuardConfig(model="m"), Facts(), str(tmp_path))[0].measured is None


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\xff\xfe not utf-8", b"[1, 2, 3]", b'{"k": 5}'])
def test_corrupt_learned_flags_are_set_aside_and_the_store_works_again(tmp_path, content):
    (tmp_path / "learned.json").write_bytes(content)
    warnings: list[str] = []
    store = LearnedStore(str(tmp_path), warn=warnings.append)
    assert store.get("k") is None
    store.put("k", {"--max-model-len": "8192"}, {}, {})
    entry = store.get("k")
    assert entry is not None and entry["flags"] == {"--max-model-len": {"value": "8192", "why": ""}}


def test_a_directory_where_a_state_file_should_be_is_set_aside(tmp_path):
    (tmp_path / "learned.json").mkdir()
    warnings: list[str] = []
    assert LearnedStore(str(tmp_path), warn=warnings.append).get("k") is None
    assert warnings and list(tmp_path.glob("learned.json.corrupt-*"))


def test_another_users_learned_flags_are_set_aside_not_used(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file owned by another user")
    key = _flags_key(tmp_path)
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({key: {"flags": {"--max-model-len": {"value": "4096"}}}}))
    os.chown(path, 65534, 65534)
    assert state.learned_facts(ASKED, Facts(), str(tmp_path))[0].learned is None
    assert list(tmp_path.glob("learned.json.corrupt-*")) and not path.exists()


# -- the class: whatever learned.json holds ------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                  max_size=4), max_leaves=12)
_names = st.sampled_from([*REMEDIABLE, "--trust-remote-code", "--tokenizer", "--model", "--api-key", "--port",
                          "--max-model-len --trust-remote-code", "-tp", "x"])
_values = st.one_of(_json, st.sampled_from(["8192", "0.9", "fp8", "auto", "1.5", "0", "-1", "4096 --trust-remote-code",
                                            "--trust-remote-code", "fp8_e5m2", "1e3", "  8192"]))
_entry = st.one_of(
    _json,
    st.fixed_dictionaries({"flags": st.dictionaries(_names, st.one_of(_json, st.fixed_dictionaries(
        {"value": _values, "why": st.one_of(st.text(max_size=40), _json)})), max_size=6)}),
    st.fixed_dictionaries({"argv": st.lists(st.one_of(_names, _values.filter(lambda v: isinstance(v, str))),
                                            max_size=12)}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=_entry)
def test_a_planted_store_can_at_most_pick_another_remedy_value(tmp_path, entry):
    key = _flags_key(tmp_path)
    (tmp_path / "learned.json").write_text(json.dumps({key: entry}, default=str))
    requested = ASKED.requested_flags()
    facts = state.learned_facts(ASKED, Facts(), str(tmp_path), warn=lambda _m: None)[0]
    flags = Session(ASKED, facts, rng=random.Random(0)).first_launch().flags
    user_tokens = Flags.parse(requested.argv())
    for name in flags.names():
        assert name in REMEDIABLE or name in user_tokens.names(), f"{name} was added to vLLM's command line"
    for name in user_tokens.names():
        if name not in REMEDIABLE:
            assert flags.get(name) == requested.get(name), f"{name} was changed"
    for name in REMEDIABLE:
        value = flags.get(name)
        if value not in (None, "") and value != requested.get(name):
            assert " " not in value and not value.startswith("-") or value == "-1", value
    assert flags.positionals() == requested.positionals()
