"""Which vLLM flags take a value, as vLLM's own parsers say (the flag table), read by Flags.parse.

A switch vLLM never gives a value in any release must not swallow the token after it: in
``--enable-log-outputs Qwen/Qwen3-8B`` the model stays the model. argparse, given the switch as
vLLM declares it, is the expectation.
"""

from __future__ import annotations

import argparse

import pytest

from supervisor.core import vllm_flags_data
from supervisor.core.flags import Flags

SWITCHES = sorted(n for n, spans in vllm_flags_data.OPTIONS.items()
                  if n.startswith("--") and all(kind in ("0", "b") for _a, _b, kind, _m in spans))


def test_the_table_knows_hundreds_of_switches() -> None:
    assert len(SWITCHES) > 200 and "--enforce-eager" in SWITCHES and "--no-enable-prefix-caching" in SWITCHES


@pytest.mark.parametrize("switch", SWITCHES)
def test_a_switch_leaves_the_next_token_positional_as_argparse_does(switch: str) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("model", nargs="?")
    parser.add_argument(switch, action="store_true")
    assert parser.parse_args([switch, "org/model"]).model == "org/model"
    flags = Flags.parse([switch, "org/model"])
    assert flags.positionals() == ["org/model"] and flags.get(switch) == ""
