"""The installed vLLM's options, and the flags it would refuse, checked against argparse itself.

The table (supervisor/core/vllm_flags_data.py) is vLLM's own parser per release (scripts/vllm-flags).
The oracle here is Python's argparse, given each release's options as the table lists them and the
release's ``allow_abbrev``: whatever argparse accepts must never be refused, and whatever it answers
with "unrecognized arguments" or "ambiguous option" must be, with the meant option suggested.
"""

from __future__ import annotations

import argparse
import functools
from collections import defaultdict

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from supervisor.core import vllm_flags_data as data
from supervisor.core.vllm_options import explain, for_version, suggest, unknown_options, version_key

RELEASES = list(data.RELEASES)


class Ambiguous(Exception):
    pass


class OtherError(Exception):
    """argparse refuses for a reason other than an unknown or ambiguous option ("ignored explicit argument")."""


class _Oracle(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D102 - argparse API
        if message.startswith("ambiguous option"):
            raise Ambiguous(message)
        raise OtherError(message)


def _spans_include(release: str, first: str, last: str) -> bool:
    return RELEASES.index(first) <= RELEASES.index(release) <= RELEASES.index(last)


def _behaviour(release: str, key: str):
    return next(v for a, b, v in data.BEHAVIOUR[key] if _spans_include(release, a, b))


@functools.cache
def oracle(release: str) -> _Oracle:
    """argparse with the release's options (an alias and its option share one action) and its abbreviation rule."""
    p = _Oracle(add_help=False, allow_abbrev=_behaviour(release, "allow_abbrev"))
    groups: dict[str, list[str]] = defaultdict(list)
    kinds: dict[str, str] = {}
    for name, spans in data.OPTIONS.items():
        for first, last, kind, primary in spans:
            if _spans_include(release, first, last):
                groups[primary or name].append(name)
                kinds[name] = kind
    for i, (main, names) in enumerate(groups.items()):
        kind = kinds.get(main, kinds[names[0]])
        kw: dict = {"action": "store_true"} if kind in ("0", "b") else (
            {"nargs": argparse.REMAINDER} if kind == "..." else {"nargs": None if kind == "1" else kind})
        p.add_argument(*sorted(set(names), key=lambda n: not n.startswith("--")), dest=f"d{i}", **kw)
    return p


def argparse_says(release: str, token: str) -> tuple[str, object]:
    """("accepted", dest) / ("unknown", None) / ("ambiguous", message) for one token followed by a value."""
    p = oracle(release)
    try:
        ns, extra = p.parse_known_args([token, "1"])
    except Ambiguous as e:
        return "ambiguous", str(e)
    except OtherError as e:
        return "other", str(e)
    if token in extra:
        return "unknown", None
    set_dests = [k for k, v in vars(ns).items() if v not in (None, False)]
    return "accepted", set_dests[0] if set_dests else None


def options_of(release: str) -> list[str]:
    return sorted(n for n, spans in data.OPTIONS.items() if any(_spans_include(release, a, b) for a, b, *_ in spans))


# -- the table itself ------------------------------------------------------------------------------------

def test_the_table_covers_every_release_the_guard_supports() -> None:
    assert RELEASES[0] == "0.5.0" and RELEASES == sorted(RELEASES, key=version_key)
    minors = {tuple(r.split(".")[:2]) for r in RELEASES}
    assert {("0", str(m)) for m in range(5, 35)} <= minors, "a minor release from 0.5 to 0.34 is missing"
    # facts from vLLM's source that any correct table holds
    for r in RELEASES:
        have = set(options_of(r))
        assert {"--max-model-len", "--tensor-parallel-size", "-tp", "--gpu-memory-utilization", "--port"} <= have, r
    assert "--swap-space" in options_of("0.17.1") and "--swap-space" not in options_of("0.18.0")
    assert "--kv-cache-memory-bytes" in options_of("0.10.2") and "--kv-cache-memory-bytes" not in options_of("0.10.1")


# -- every real spelling passes ---------------------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_every_option_of_a_release_is_accepted_as_written_and_with_a_value_after_an_equals(release: str) -> None:
    options = for_version(release)
    assert options is not None
    for name in options_of(release):
        assert unknown_options([name], options) == [], name
        if data.OPTIONS[name][0][2] not in ("0", "b"):
            assert unknown_options([f"{name}=1"], options) == [], name


@settings(max_examples=300, deadline=None)
@given(release=st.sampled_from(RELEASES), data_=st.data())
def test_vllms_own_conveniences_are_accepted(release: str, data_: st.DataObject) -> None:
    """Underscores (--max_model_len), a dotted JSON key (--compilation-config.level 3), a unique prefix
    (--max-model), where that release's parser takes them; never refused."""
    options = for_version(release)
    long_names = [n for n in options_of(release) if n.startswith("--") and len(n) > 3]
    name = data_.draw(st.sampled_from(long_names))
    if _behaviour(release, "underscores") and "-" in name[2:]:
        assert unknown_options([name[:2] + name[2:].replace("-", "_"), "1"], options) == [], name
    if _behaviour(release, "dotted"):
        assert unknown_options([f"{name}.some_key", "value"], options) == [], name
    cut = data_.draw(st.integers(3, len(name)))
    prefix = name[:cut]
    verdict, _ = argparse_says(release, prefix)
    if verdict == "accepted":
        assert unknown_options([prefix, "1"], options) == [], prefix


@pytest.mark.parametrize("release", [r for r in RELEASES if _behaviour(r, "dash_o") is not None])
def test_dash_o_with_its_level_attached_is_vllms_where_it_rewrites_it(release: str) -> None:
    options = for_version(release)
    assert unknown_options(["-O3"], options) == [] and unknown_options(["-O0"], options) == []


# -- single-edit typos are refused with the meant option --------------------------------------------------

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-"


def single_edit(name: str, op: str, at: int, ch: str) -> str:
    head, body = ("--", name[2:]) if name.startswith("--") else ("-", name[1:])
    at = at % (len(body) + 1)
    if op == "delete" and at < len(body):
        body = body[:at] + body[at + 1:]
    elif op == "insert":
        body = body[:at] + ch + body[at:]
    elif op == "substitute" and at < len(body):
        body = body[:at] + ch + body[at + 1:]
    elif op == "swap" and at + 1 < len(body):
        body = body[:at] + body[at + 1] + body[at] + body[at + 2:]
    return head + body


@settings(max_examples=400, deadline=None)
@given(release=st.sampled_from(RELEASES), data_=st.data(),
       op=st.sampled_from(["delete", "insert", "substitute", "swap"]), at=st.integers(0, 60),
       ch=st.sampled_from(ALPHABET))
def test_a_single_edit_typo_that_is_no_option_is_refused_with_the_meant_option(
        release: str, data_: st.DataObject, op: str, at: int, ch: str) -> None:
    options = for_version(release)
    name = data_.draw(st.sampled_from(options_of(release)))
    typo = single_edit(name, op, at, ch)
    assume(typo != name and len(typo) > 2 and not typo.startswith("---") and typo not in ("--",))
    assume(not (_behaviour(release, "dash_o") is not None and typo.startswith("-O")))
    assume(not typo[1:].lstrip("-")[:1].isdigit())        # "-1" is a negative number to argparse: a value
    verdict, detail = argparse_says(release, typo)
    assume(verdict != "other")              # vLLM refuses it for its value, not as an option: not this check
    found = unknown_options([typo, "1"], options)
    if verdict == "accepted":
        assert found == [], f"{typo} is vLLM's (argparse takes it) but was refused: {found}"
        return
    assert len(found) == 1 and found[0].token == typo, (typo, verdict, found)
    if verdict == "ambiguous":
        assert found[0].ambiguous and all(m in str(detail) for m in found[0].ambiguous), (typo, detail, found)
    else:
        assert name in suggest(typo, options, limit=50), (typo, name, suggest(typo, options, limit=50))
        assert found[0].suggestions and all(s in options for s in found[0].suggestions)


# -- what a person reads -----------------------------------------------------------------------------------

def test_the_issue_typo_gets_did_you_mean_max_model_len() -> None:
    options = for_version("0.32.0")
    [u] = unknown_options(["--max-model-length", "8192"], options)
    assert u.suggestions[0] == "--max-model-len"
    assert explain(u, options) == "vLLM 0.32.0 has no option --max-model-length; did you mean --max-model-len?"


def test_a_flag_of_another_release_says_where_it_exists() -> None:
    options = for_version("0.20.0")
    [u] = unknown_options(["--swap-space", "4"], options)
    text = explain(u, options)
    assert text.startswith("vLLM 0.20.0 has no option --swap-space (it exists in vLLM 0.5.0-0.17.1)"), text


def test_values_and_what_follows_a_double_dash_are_never_options() -> None:
    options = for_version("0.32.0")
    assert unknown_options(["--max-model-len", "-1", "--seed", "-5", "--chat-template", "{% if x -%}", "--",
                            "--whatever"], options) == []


@pytest.mark.parametrize("version, expect", [
    ("0.32.0", "0.32.0"), ("v0.32.0", "0.32.0"), ("0.32.0+cpu", "0.32.0"), ("0.6.4.post1", "0.6.4.post1"),
])
def test_a_release_is_found_by_its_name(version: str, expect: str) -> None:
    options = for_version(version)
    assert options is not None and set(options.kinds) == set(options_of(expect))


def test_a_build_between_two_releases_has_the_options_of_both_and_one_outside_the_table_none() -> None:
    between = for_version("0.17.1rc1.dev12+g1234")        # after 0.17.0, before 0.17.1
    assert between is not None and set(between.kinds) == set(options_of("0.17.0")) | set(options_of("0.17.1"))
    newest = RELEASES[-1].split(".")
    assert for_version(f"{newest[0]}.{int(newest[1]) + 1}.0") is None       # newer than the table: ask vLLM
    assert for_version("0.4.3") is None and for_version(None) is None and for_version("dev") is None
