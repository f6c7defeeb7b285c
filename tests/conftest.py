"""Hypothesis profiles for the whole suite.

``scripts/test`` (and so CI) runs the ``repeatable`` profile: each property draws the same examples on
every run of the same code, so a verdict on a commit does not depend on luck, and a failure is one anyone
can rerun. Exploring for new counterexamples is a separate act: ``HYPOTHESIS_PROFILE=explore
scripts/test tests/unit`` draws fresh examples each run (what a failure found that way teaches becomes a
deterministic test of its class). Without the variable, pytest run by hand explores as hypothesis does by
default.

And the fixtures the unit and the integration tests of the process chokepoint share: the two ways
``supervisor.shell.signalling`` sends a signal.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from supervisor.shell import signalling

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=["pidfd", "psutil"])
def way(request, monkeypatch):
    """Both ways of sending: through a pidfd, and psutil's check-then-kill (no pidfd: old kernels, seccomp)."""
    if request.param == "pidfd" and not signalling.pidfd_usable:
        pytest.skip("this kernel gives no pidfds")
    monkeypatch.setattr(signalling, "pidfd_usable", request.param == "pidfd")
    return request.param


@pytest.fixture
def pidfds(monkeypatch):
    """Signals go through pidfds (skipped where the kernel gives none)."""
    if not signalling.pidfd_usable:
        pytest.skip("this kernel gives no pidfds")
    monkeypatch.setattr(signalling, "pidfd_usable", True)
