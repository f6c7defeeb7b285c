"""``vllm-guard completion SHELL``: the script a shell loads completes the commands and options.

bash runs the generated script for real: the completion function ``complete -p vllm-guard`` names is
called with ``COMP_WORDS`` as bash's readline would set them, and ``COMPREPLY`` is what a person
would be offered on TAB. zsh and fish check their scripts' syntax when installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli.completion import SHELLS

BASH_OFFERS = r'''
source "$1"; shift
fn=$(complete -p vllm-guard | sed -E 's/.* -F ([^ ]+) .*/\1/')
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$fn" vllm-guard "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
'''


def completion(shell: str) -> str:
    out = subprocess.run([sys.executable, "-m", "supervisor", "completion", shell], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "vllm-guard.bash"
    path.write_text(completion("bash"))
    return path


def offered(script: Path, *words: str) -> list[str]:
    out = subprocess.run(["bash", "--norc", "-c", BASH_OFFERS, "bash", str(script), "vllm-guard", *words],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_a_subcommand(bash_script: Path) -> None:
    assert sorted(offered(bash_script, "st")) == ["start", "status", "stop"]
    assert "completion" in offered(bash_script, "")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_an_option_of_a_subcommand(bash_script: Path) -> None:
    assert sorted(offered(bash_script, "start", "--sta")) == [
        "--stall-timeout", "--startup-timeout", "--state-dir", "--status-host", "--status-port"]
    assert offered(bash_script, "completion", "fi") == ["fish"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_vllms_options_and_the_guards_after_serve(bash_script: Path) -> None:
    assert offered(bash_script, "serve", "Qwen/Qwen3-8B", "--max-model-l") == ["--max-model-len"]
    assert offered(bash_script, "serve", "Qwen/Qwen3-8B", "--dry") == ["--dry-run"]


@pytest.mark.parametrize("shell, check", [("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])])
def test_zsh_and_fish_scripts_parse(shell: str, check: list[str], tmp_path: Path) -> None:
    if shutil.which(check[0]) is None:
        pytest.skip(f"{check[0]} is not installed")
    path = tmp_path / f"vllm-guard.{shell}"
    path.write_text(completion(shell))
    out = subprocess.run([*check, str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_every_shell_gets_a_script_naming_the_commands() -> None:
    for shell in SHELLS:
        text = completion(shell)
        assert "vllm-guard" in text and "diagnose" in text and "history" in text, shell
