"""Hypothesis profiles for the whole suite.

``scripts/test`` (and so CI) runs the ``repeatable`` profile: each property draws the same examples on
every run of the same code, so a verdict on a commit does not depend on luck, and a failure is one anyone
can rerun. Exploring for new counterexamples is a separate act: ``HYPOTHESIS_PROFILE=explore
scripts/test tests/unit`` draws fresh examples each run (what a failure found that way teaches becomes a
deterministic test of its class). Without the variable, pytest run by hand explores as hypothesis does by
default.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
