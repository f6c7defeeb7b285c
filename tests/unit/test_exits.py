"""A child's exit status in words: signals named, a SIGKILL the guard did not send explained."""

from __future__ import annotations

import pytest

from supervisor.core import exits
from supervisor.core.classifier import classify
from supervisor.core.diagnosis import Kind


@pytest.mark.parametrize("code,text", [
    (0, "vLLM exited with code 0"), (1, "vLLM exited with code 1"), (-9, "vLLM was killed by SIGKILL"),
    (-11, "vLLM was killed by SIGSEGV"), (137, "vLLM was killed by SIGKILL (exit status 137, as a shell reports it)"),
    (-77, "vLLM was killed by signal 77"), (None, "vLLM is still running"),
])
def test_describe(code, text):
    assert exits.describe(code) == text


def test_a_sigkill_points_at_the_oom_killer_and_a_segfault_at_native_code():
    assert "OOM killer" in exits.hint(-9) and "OOM killer" in exits.hint(137)
    assert "native code" in exits.hint(-11)
    assert exits.hint(1) == "" and exits.hint(-15) == ""


def test_a_silent_death_by_signal_is_an_engine_death_with_the_reason():
    lines = ["INFO 07-23 10:00:01 [gpu_model_runner.py:1] Starting to load model x..."]
    d = classify(lines, -9)
    assert d.kind is Kind.ENGINE_DEAD and d.evidence == "vLLM was killed by SIGKILL"
    assert "OOM killer" in d.detail and d.phase == "loading"
    code = classify(lines, 3)
    assert code.kind is Kind.UNKNOWN_FAILURE and code.evidence == "vLLM exited with code 3"
