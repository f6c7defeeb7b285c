"""The plan's memory model against the real start-ups of both calibration sets: the accuracy goals.

Goals (issues 15 and 23): on llm-d-planner's vLLM 0.19 sweep the KV budget within 2% in the median,
8% at the 90th percentile and 2% in the mean, held in and leave-one-out; no start-up in either set
over-predicted by more than max(10%, 1 GiB) (a first launch that fails), neither by the estimate nor by
the safe end of its band; better than the peer planner on the runs where it states its own error.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from benchmarks import accuracy as A
from supervisor.core import memory as M
from supervisor.core.units import GiB

ROWS = A.evaluate()
SET = {name: [r for r in ROWS if r.set == name] for name in A.SETS}


def test_both_sets_are_complete():
    assert (len(SET["calibration"]), len(SET["llmd"])) == (15, 59)
    assert all(r.real["weights"] for r in ROWS)
    assert len(A.kv_rows(SET["calibration"])) == 13    # record 15 prints no KV figure, record 2's row does not add up
    assert len(A.kv_rows(SET["llmd"])) == 59


@pytest.mark.parametrize("which", ["now", "loo"])
def test_the_sweeps_kv_budget_meets_the_goals(which):
    s = A.kv_stats(A.kv_rows(SET["llmd"]), which)
    assert s.median <= 0.02 and s.p90 <= 0.08 and s.mean <= 0.02, s


@pytest.mark.parametrize("which", ["now", "loo", "safe"])
def test_no_first_launch_over_predicts_beyond_the_limit(which):
    for r in A.kv_rows(ROWS):
        pred = A._WHICH[which](r)
        assert not A.over_limit(pred, r.real["kv"]), (r.set, r.id, which)


def test_the_calibration_sets_median_within_5_percent_held_in_and_left_out():
    for which in ("now", "loo"):
        assert A.kv_stats(A.kv_rows(SET["calibration"]), which).median <= 0.05
    for family, rows in A.by_family(SET["calibration"]).items():
        assert A.kv_stats(rows).median <= 0.10, family


def test_better_than_the_peer_on_its_own_runs():
    n, ours, theirs, ours_med, theirs_med = A.peer_stats(A.kv_rows(SET["llmd"]))
    assert n >= 35
    assert ours < theirs / 2 and ours_med < theirs_med


def test_every_class_is_within_the_goal_on_the_sweep():
    for cls, members in A.by_class(SET["llmd"]).items():
        if members:
            assert A.kv_stats(members).mean <= 0.02, cls


def test_better_than_the_previous_formulas():
    rows = A.kv_rows(SET["calibration"])
    now, before = A.kv_stats(rows, "now"), A.kv_stats(rows, "before")
    assert now.median < before.median and now.p90 < before.p90


def test_the_constants_in_the_code_are_what_the_fit_returns():
    cal = A.fit(r.rec for r in ROWS)
    for f in dataclasses.fields(M.Calibration):
        assert getattr(M.CALIBRATION, f.name) == pytest.approx(getattr(cal, f.name), abs=0.006), f.name


def test_weights_where_the_checkpoint_size_is_known_or_its_scheme_is():
    # every record but the MXFP4 ones (backend unknown: Marlin's padding, the larger) within 0.25 GiB
    for r in ROWS:
        err = abs(r.now["weights"] - r.real["weights"]) / GiB
        assert err < (1.6 if "gpt-oss" in r.rec["model"] else 0.25), (r.set, r.id)


def test_kv_tokens_as_vllm_prints_them_for_every_attention_type():
    errs = {r.id: abs(A.rel(r.now["tokens"], r.real["tokens"])) for r in ROWS if r.real["tokens"]}
    assert len(errs) == 63
    assert statistics.median(errs.values()) < 0.01
    hybrid = [r for r in SET["llmd"] if "sliding" in r.classes or "MLA" in r.classes]
    assert len(hybrid) >= 12
    for r in hybrid:        # gemma 2/3, gpt-oss, Llama 4's chunked layers, MLA: within 2%
        assert errs[r.id] < 0.02, r.id


def test_the_section_renders():
    md = A.section(ROWS)
    assert md.count("\n| ") > 90 and "| llmd | held-in | 59 |" in md and "llm-d-planner" in md


@pytest.mark.parametrize("rid", ["5", "9", "11", "124", "127", "151", "152"])
def test_terms_of_well_printed_records(rid):
    r = next(x for x in ROWS if x.id == rid)
    for term in ("weights", "activation", "non_torch"):
        assert abs(r.now[term] - r.real[term]) < 0.08 * GiB, term
