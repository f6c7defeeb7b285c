"""vLLM's ``--config`` YAML is a file a person names, and parsing it is bounded: whatever it holds (an
alias bomb, nesting thousands deep, junk bytes), the guard either knows its flags or refuses it with a
configuration error (exit 78) naming the file, at once and in little memory; never a RecursionError,
a MemoryError or a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import config
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

#: The classic "billion laughs": 1 KiB that a YAML loader without bounds expands to 10^9 strings.
ALIAS_BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]) + "\n"


def _resolve(path: Path) -> config.GuardConfig:
    args = argparse.Namespace(vllm_args=["--", "--config", str(path)], model="m")
    return config.resolve(args, {"HOME": str(path.parent)}, require_model=False)


def _bounded(path: Path) -> tuple[config.GuardConfig | None, ConfigError | None]:
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        return _resolve(path), None
    except ConfigError as e:
        return None, e
    finally:
        took = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert took < 3, f"parsing {path.name} took {took:.1f} s"
        assert peak < 64 << 20, f"parsing {path.name} took {peak >> 20} MiB"


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_refused_at_once_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 1024
    cfg, err = _bounded(path)
    assert cfg is None and err is not None
    assert str(path) in str(err) and "aliases" in str(err)


@pytest.mark.timeout(30)
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    cfg, err = _bounded(path)
    assert cfg is None and err is not None and str(path) in str(err) and "nested deeper" in str(err)


def test_a_plain_file_still_gives_its_flags(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("max-model-len: 8192\nenforce-eager: true\nserved-model-name: [a, b]\n"
                    "hf-overrides: {rope_scaling: {factor: 2}}\n")
    cfg, err = _bounded(path)
    assert err is None and cfg is not None
    assert cfg.vllm_file_args == ("--max-model-len", "8192", "--enforce-eager", "--served-model-name", "a", "b",
                                  "--hf-overrides", '{"rope_scaling": {"factor": 2}}')


def test_the_command_line_exits_78_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    out = subprocess.run([sys.executable, "-m", "supervisor", "start", "--dry-run", "--model", "m",
                          "--state-dir", str(tmp_path / "state"), "--", "--config", str(path)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 78, out.stderr
    assert str(path) in out.stderr and "Traceback" not in out.stderr


# -- the class -------------------------------------------------------------------------------------

_scalar = st.one_of(st.integers(), st.booleans(), st.sampled_from(["auto", "fp8", "x y", "'q'", "~", "1e5", "0x1f",
                                                                   "2020-01-01", "!!binary aGk=", "!!python/none"]))


@st.composite
def yaml_documents(draw) -> str:
    """YAML text: flags whose values nest to some depth, in block or flow style, some with anchors and
    aliases (up to a bomb), some with junk spliced in."""
    lines = []
    for i in range(draw(st.integers(0, 6))):
        depth = draw(st.sampled_from([0, 1, 3, 31, 32, 33, 60, 500, 5000]))
        leaf = str(draw(_scalar))
        flow = draw(st.booleans())
        if flow:
            value = leaf
            for level in range(depth):
                value = f"[{value}]" if level % 2 else f"{{k: {value}}}"
        else:                                   # block style: "- - - leaf", one level per dash
            value = ("\n  " + "- " * depth + leaf) if depth else leaf
        anchor = draw(st.sampled_from(["", f"&a{i} ", ""]))
        lines.append(f"flag-{i}: {anchor}{value}")
        if anchor and draw(st.booleans()):
            fan = draw(st.integers(1, 9))
            lines.append(f"again-{i}: [" + ",".join([f"*a{i}"] * fan) + "]")
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        junk = draw(st.binary(max_size=40)).decode("latin-1")
        at = draw(st.integers(0, len(text)))
        text = text[:at] + junk + text[at:]
    return text


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=yaml_documents(), encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_any_yaml_gives_flags_or_a_config_error_naming_the_file(tmp_path, text, encoding):
    path = tmp_path / "vllm.yaml"
    path.write_bytes(text.encode(encoding, "replace"))
    cfg, err = _bounded(path)
    if err is not None:
        assert str(path) in str(err)
        return
    assert cfg is not None and all(isinstance(t, str) and "\x00" not in t for t in cfg.vllm_file_args)
    assert not any(t.startswith("--again-") for t in cfg.vllm_file_args), "an alias was expanded"
