"""``vllm-guard serve``: vLLM's command line, but the guard's own options vLLM has none of are the guard's.

The split is checked against the guard's option list and every vLLM option of the table (a property
over interleavings), and the command is run as a person runs it: ``--dry-run`` given to ``serve``
prints the first launch and never reaches vLLM's command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config import GUARD_OPTIONS, split_serve_args
from supervisor.core import vllm_options

VLLM = vllm_options.all_options()
ROOT = Path(__file__).resolve().parents[2]


def split(*argv: str) -> tuple[list[str], list[str], list[str]]:
    return split_serve_args(list(argv), VLLM.__contains__)


def test_the_guards_own_options_are_taken_and_vllms_stay_in_order() -> None:
    guard, rest, notes = split("Qwen/Qwen3-8B", "--dry-run", "--max-model-len", "8192", "--state-dir", "/x",
                               "--enforce-eager", "--status-port=9000", "-tp", "2", "--notify-url", "https://h/x")
    assert guard == ["--dry-run", "--state-dir", "/x", "--status-port=9000", "--notify-url", "https://h/x"]
    assert rest == ["Qwen/Qwen3-8B", "--max-model-len", "8192", "--enforce-eager", "-tp", "2"]
    assert notes == []


def test_a_switch_of_vllms_before_a_guard_option_does_not_swallow_it() -> None:
    guard, rest, _ = split("m", "--enforce-eager", "--dry-run", "--trust-remote-code", "--quiet")
    assert guard == ["--dry-run", "--quiet"] and rest == ["m", "--enforce-eager", "--trust-remote-code"]


def test_options_vllm_has_too_stay_vllms_and_the_guards_variable_is_named() -> None:
    guard, rest, notes = split("m", "--port", "8001", "--host", "0.0.0.0", "--log-level", "debug",
                               "--config", "vllm.yaml")
    assert guard == [] and rest == ["m", "--port", "8001", "--host", "0.0.0.0", "--log-level", "debug",
                                    "--config", "vllm.yaml"]
    assert notes == ["--log-level is vLLM's option too, so it goes to vLLM; the guard's own is VLLM_GUARD_LOG_LEVEL"]


def test_a_toml_config_is_the_guards_vllm_reads_only_yaml() -> None:
    guard, rest, _ = split("m", "--config", "guard.toml", "--max-num-seqs", "4")
    assert guard == ["--config", "guard.toml"] and rest == ["m", "--max-num-seqs", "4"]


def test_everything_after_a_double_dash_is_vllms() -> None:
    guard, rest, _ = split("m", "--", "--dry-run")
    assert guard == [] and rest == ["m", "--", "--dry-run"]


GUARD_ONLY = sorted(o for o in GUARD_OPTIONS if o not in VLLM)
SWITCHES = {"--dry-run", "--no-plan", "--no-learn", "--auto-fit", "--quiet"}
VLLM_OPTS = sorted(o for o in VLLM if o.startswith("--") and o not in GUARD_OPTIONS)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("guard"), st.sampled_from(GUARD_ONLY)),
                          st.tuples(st.just("vllm"), st.sampled_from(VLLM_OPTS))), max_size=12))
def test_any_mix_splits_back_into_the_guards_and_vllms(items: list[tuple[str, str]]) -> None:
    argv, want_guard, want_rest = ["org/model"], [], ["org/model"]
    for n, (whose, name) in enumerate(items):
        if whose == "guard":
            words = [name] if name in SWITCHES else [name, f"v{n}"]
        else:                                   # a vLLM switch, or one with its value
            words = [name] if n % 2 else [name, f"v{n}"]
        argv += words
        (want_guard if whose == "guard" else want_rest).extend(words)
    guard, rest, _ = split_serve_args(argv, VLLM.__contains__)
    assert guard == want_guard and rest == want_rest


def run_guard(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "supervisor", *argv], capture_output=True, text=True, timeout=60,
                          env=full, cwd=str(ROOT))


def test_serve_dry_run_prints_the_launch_without_passing_dry_run_to_vllm(tmp_path: Path) -> None:
    out = run_guard("serve", "org/model", "--max-model-len", "8192", "--dry-run", "--state-dir", str(tmp_path / "s"),
                    env={"VLLM_GUARD_VLLM_COMMAND": f"{sys.executable} -m vllm.entrypoints.openai.api_server",
                         "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    command = next(line for line in out.stdout.splitlines() if not line.startswith("#"))
    assert "--max-model-len 8192" in command and "--dry-run" not in command and "--state-dir" not in command
