"""A launch's command line never carries a flag twice, and what it says about a launch names each flag once.

The class (a first launch at vLLM 0.10.2 on a busy 17 GiB GPU listed --gpu-memory-utilization twice,
0.86 then 0.91): whatever the user's flags (any spelling: ``--x_y``, ``--x=v``, ``--no-x``, given
twice), the flags learned from an earlier start, the plan's and the remedies' changes, the argv
holds each flag vLLM reads once at most once, at the value argparse would read from the user's
own argv, and a launch's changes name each flag once, at the value it is launched with.

The oracle for "what vLLM reads" is Python's argparse itself, configured as vLLM configures these
flags (``store`` for a value, ``store_true``, ``BooleanOptionalAction`` for ``--x/--no-x``), not the
code under test.
"""

from __future__ import annotations

import argparse
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.flags import Flags, canonical

#: flags as vLLM declares them: name -> argparse action (the ones the guard reads and sets, and others)
VALUED = ["--max-model-len", "--gpu-memory-utilization", "--kv-cache-dtype", "--max-num-seqs",
          "--max-num-batched-tokens", "--block-size", "--cpu-offload-gb", "--port", "--dtype", "--seed"]
#: a flag the guard neither sets nor reads: the user's argv for it passes as written (vLLM reads the last)
UNREAD = {"--seed", "--middleware"}
SWITCHES = ["--trust-remote-code", "--disable-log-stats"]            # store_true
OPTIONAL = ["--enforce-eager", "--enable-chunked-prefill"]          # BooleanOptionalAction (--x / --no-x)
VALUES = {"--max-model-len": ["4096", "8192", "32768"], "--gpu-memory-utilization": ["0.5", "0.88", "0.95"],
          "--kv-cache-dtype": ["auto", "fp8"], "--max-num-seqs": ["64", "256"], "--max-num-batched-tokens": ["2048"],
          "--block-size": ["16", "32"], "--cpu-offload-gb": ["2"], "--port": ["8000", "8001"], "--dtype": ["half"],
          "--seed": ["0", "1"]}


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for name in VALUED:
        p.add_argument(name)
    for name in SWITCHES:
        p.add_argument(name, action="store_true")
    for name in OPTIONAL:
        p.add_argument(name, action=argparse.BooleanOptionalAction)
    p.add_argument("--middleware", action="append")                   # the one kind that may repeat
    return p


def read(argv: list[str]) -> dict[str, object]:
    """What vLLM's argparse reads from ``argv`` (underscores first made dashes, as vLLM does)."""
    spelled = [canonical(t.partition("=")[0]) + t.partition("=")[1] + t.partition("=")[2] if t.startswith("--")
               else t for t in argv]
    return vars(vllm_parser().parse_args(spelled))


@st.composite
def user_args(draw: st.DrawFn) -> list[str]:
    """The user's vLLM args: any of these flags, in any spelling, any number of times."""
    out: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["valued", "switch", "optional", "append"]))
        if kind == "valued":
            name = draw(st.sampled_from(VALUED))
            spelled = draw(st.sampled_from([name, "--" + name[2:].replace("-", "_")]))
            value = draw(st.sampled_from(VALUES[name]))
            out += [f"{spelled}={value}"] if draw(st.booleans()) else [spelled, value]
        elif kind == "switch":
            out.append(draw(st.sampled_from(SWITCHES)))
        elif kind == "optional":
            name = draw(st.sampled_from(OPTIONAL))
            out.append(name if draw(st.booleans()) else "--no-" + name[2:])
        else:
            out += ["--middleware", draw(st.sampled_from(["a.b", "c.d"]))]
    return out


def once(argv: list[str]) -> None:
    """No flag vLLM reads once stands twice, in any spelling (the user's others stand as written)."""
    names = Counter(canonical(t.partition("=")[0]).replace("--no-", "--") for t in argv if t.startswith("--"))
    assert all(n == 1 for name, n in names.items() if name not in UNREAD), (argv, names)


# -- Flags itself --------------------------------------------------------------------------------------------
guard_changes = st.lists(st.tuples(st.sampled_from(["set", "remove"]),
                                   st.sampled_from(VALUED[:7] + OPTIONAL + ["--no-enforce-eager"]),
                                   st.sampled_from(["1024", "0.9", "fp8"])), max_size=6)


@settings(max_examples=500, deadline=None)
@given(user_args(), guard_changes)
def test_flags_hold_each_flag_once_at_the_value_vllm_reads(args, changes):
    flags = Flags.parse(args)
    once(flags.argv())
    assert read(flags.argv()) == read(args)            # parsing changed nothing vLLM reads
    want = read(args)
    for op, name, value in changes:
        dest = name.removeprefix("--").removeprefix("no-").replace("-", "_")
        if op == "remove":
            flags = flags.remove(name)
            want[dest] = None
        elif name in OPTIONAL or name.startswith("--no-"):
            flags = flags.set(name)
            want[dest] = not name.startswith("--no-")
        else:
            flags = flags.set(name, value)
            want[dest] = value
        once(flags.argv())
        assert read(flags.argv()) == want, (name, value, flags.argv())


def test_setting_a_flag_by_its_no_form_replaces_the_other():
    """``--enforce-eager`` then ``--no-enforce-eager`` set by the guard: one flag, the last word."""
    assert Flags.parse("--enforce-eager --port 1").set("--no-enforce-eager").argv() == ["--no-enforce-eager",
                                                                                          "--port", "1"]
    assert Flags.parse("--no-enforce-eager").remove("--enforce-eager").argv() == []
    assert Flags.parse("--enforce-eager").remove("--no-enforce-eager").argv() == []


def test_the_users_flag_given_twice_is_launched_once_at_the_last_value_where_the_first_stood():
    """argparse reads the last of several ``store`` occurrences: the launch says it once."""
    f = Flags.parse("--max_model_len 4096 --port 8000 --max-model-len=8192 --middleware a --middleware b")
    assert f.argv() == ["--max-model-len", "8192", "--port", "8000", "--middleware", "a", "--middleware", "b"]
