"""Fixtures for the real-vLLM tier: the CPU vLLM venv, the tiny model, and guards run as real processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from realguard import CACHE, ROOT, GuardProc, Real, Tracker, free_port


def _run_script(argv: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return 124, "", f"timed out after {timeout:.0f} s: {e}"
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="session")
def real() -> Real:
    """Set up the CPU vLLM venv and the tiny model (both idempotent); skip only if that fails
    outside CI (``VLLM_GUARD_REQUIRE_REAL`` set: fail)."""
    required = bool(os.environ.get("VLLM_GUARD_REQUIRE_REAL"))
    if not sys.platform.startswith("linux"):
        if required:
            pytest.fail("the real-vLLM tier needs Linux")
        pytest.skip("the real-vLLM tier needs Linux (CPU vLLM build, /proc)")
    rc, out, err = _run_script([str(ROOT / "scripts" / "setup-cpu-vllm")], timeout=1800)
    if rc != 0:
        msg = f"scripts/setup-cpu-vllm exited {rc}: {err.strip()[-1500:]}"
        if required:
            pytest.fail(msg)
        pytest.skip(f"real vLLM unavailable ({msg}); set VLLM_GUARD_REQUIRE_REAL=1 to fail instead")
    python = out.strip().splitlines()[-1]
    rc, out, err = _run_script([str(ROOT / "scripts" / "make-tiny-model")], timeout=600)
    if rc != 0:
        # The venv exists, so a model that cannot be made is a bug here, not a missing dependency.
        pytest.fail(f"scripts/make-tiny-model exited {rc}: {err.strip()[-1500:]}")
    return Real(python, out.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def one_real_vllm_at_a_time() -> Iterator[None]:
    """Serialize real-tier sessions on this machine (two CPU vLLMs would starve each other)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "realvllm-tier.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tracker(one_real_vllm_at_a_time: None) -> Iterator[Tracker]:
    t = Tracker()
    yield t
    left = t.kill_all()
    if left:
        print(f"\nrealvllm teardown: killed leftover processes {left}", file=sys.stderr)


@pytest.fixture(scope="session")
def start_guard(real: Real, tracker: Tracker, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Callable[..., GuardProc]]:
    """``start_guard(state_dir, vllm_args, extra=[], env={})`` -> a running GuardProc; all are closed at the end."""
    guards: list[GuardProc] = []
    logs = tmp_path_factory.mktemp("guard-logs")

    def start(state_dir: Path, vllm_args: list[str], extra: list[str] | None = None,
              port: int | None = None, env: dict[str, str | None] | None = None) -> GuardProc:
        g = GuardProc(real, tracker, state_dir, logs / f"guard-{len(guards) + 1}.log",
                      port or free_port(), free_port(), list(extra or []), list(vllm_args), env)
        guards.append(g)
        return g

    yield start
    for g in guards:
        g.close()
