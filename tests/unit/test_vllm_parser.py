"""A vLLM newer than the guard's table is asked for its own options: its interpreter builds its parser.

A stand-in ``vllm`` package (its CLI builds a ``vllm serve`` parser the way vLLM's does, and its API
server module parses at import) and a dist-info naming a version the table does not have, on
``PYTHONPATH``; the guard's parser script runs under that interpreter for real.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.config import GuardConfig
from supervisor.errors import ConfigError
from supervisor.facts import preflight, vllm_install

CLI = """
import argparse


def main():
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    serve = sub.add_parser("serve")
    serve.add_argument("model_tag", nargs="?")
    serve.add_argument("--max-model-len")
    serve.add_argument("--tensor-parallel-size", "-tp", type=int)
    serve.add_argument("--enable-new-thing", action=argparse.BooleanOptionalAction)
    serve.add_argument("--headless", action="store_true")
    parser.parse_args()
"""
API_SERVER = """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--max-model-len")
parser.add_argument("--api-server-only")
if __name__ == "__main__":
    parser.parse_args()
"""


def fake_vllm(root: Path, version: str) -> Path:
    for rel, text in {"vllm/__init__.py": "", "vllm/entrypoints/__init__.py": "",
                      "vllm/entrypoints/cli/__init__.py": "", "vllm/entrypoints/cli/main.py": CLI,
                      "vllm/entrypoints/openai/__init__.py": "", "vllm/entrypoints/openai/api_server.py": API_SERVER,
                      f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                      }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def cfg(*vllm_args: str) -> GuardConfig:
    return GuardConfig(model="org/model", vllm_command=f"{sys.executable} -m vllm.entrypoints.openai.api_server",
                       vllm_args=tuple(vllm_args))


def test_vllms_own_parser_is_read_under_its_interpreter(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake_vllm(tmp_path, "0.99.0"))}
    dump, why = vllm_install.parser_options([sys.executable, "-m", "vllm"], env)
    assert why == "" and dump is not None
    serve = {n for a in dump["serve"] for n in a["names"]}
    assert {"--max-model-len", "-tp", "--tensor-parallel-size", "--enable-new-thing", "--no-enable-new-thing",
            "--headless"} <= serve
    assert {n for a in dump["api_server"] for n in a["names"]} >= {"--api-server-only", "--model"}
    assert dump["serve_behaviour"]["allow_abbrev"] is True


def test_a_vllm_outside_the_table_refuses_a_flag_it_lacks_and_takes_its_own(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake_vllm(tmp_path, "0.99.0"))}
    notes = preflight.check(cfg("--enable-new-thing", "--no-enable-new-thing", "-tp", "2", "--api-server-only", "x"),
                            env)
    assert notes == ["vLLM 0.99.0 is not in vllm-guard's table of vLLM options: its options were read from it"]
    with pytest.raises(ConfigError) as e:
        preflight.check(cfg("--max-model-length", "4096"), env)
    assert str(e.value) == ("vLLM 0.99.0 has no option --max-model-length; did you mean --max-model-len? "
                            "(no launch was made)")


def test_a_vllm_whose_parser_cannot_be_read_refuses_nothing_and_says_so(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path, "0.99.0")
    (root / "vllm/entrypoints/cli/main.py").write_text("raise RuntimeError('broken install')\n")
    (root / "vllm/entrypoints/openai/api_server.py").write_text("raise RuntimeError('broken install')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    [note] = preflight.check(cfg("--max-model-length", "4096"), env)
    assert note.startswith("vLLM 0.99.0 is not in vllm-guard's table of vLLM options and vLLM's parser could not")
    assert note.endswith("its flags are not checked before the launch")


def test_a_missing_local_model_path_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "llama"
    with pytest.raises(ConfigError, match=f"model {missing} does not exist"):
        preflight.check(GuardConfig(model=str(missing), vllm_command="/nonexistent/vllm serve"), {"PATH": "/bin"})
    missing.mkdir(parents=True)
    assert preflight.check(GuardConfig(model=str(missing), vllm_command="/nonexistent/vllm serve"),
                           {"PATH": "/bin"}) == [
        "the installed vLLM's version could not be read, so its flags are not checked before the launch"]
