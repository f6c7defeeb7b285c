"""The plan's memory model against the real start-ups of benchmarks/calibration: the accuracy targets.

Targets (issue 15): the KV budget within 10% in the median; no start-up where the KV the plan sizes
a first launch on (the safe end of its band) is above the real one by more than max(25%, 1 GiB).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks import accuracy as A
from supervisor.core.units import GiB

ROWS = A.evaluate()


def test_the_calibration_set_is_complete():
    assert len(ROWS) == 15
    assert all(r.real["weights"] for r in ROWS)
    assert len(A.kv_rows(ROWS)) == 13          # record 15 prints no KV figure, record 2's row does not add up


def test_kv_budget_within_10_percent_in_the_median():
    stats = A.kv_stats(A.kv_rows(ROWS))
    assert stats.median <= 0.10
    assert stats.median <= 0.05                # the goal beyond the target
    for family, rows in A.by_family(ROWS).items():
        assert A.kv_stats(rows).median <= 0.10, family


def test_no_first_launch_over_predicts_beyond_the_limit():
    for r in A.kv_rows(ROWS):
        assert not A.over_limit(r.safe_kv, r.real["kv"]), r.id          # the KV the plan sizes lengths on
        assert not A.over_limit(r.now["kv"], r.real["kv"]), r.id        # and the estimate itself


def test_better_than_the_previous_formulas():
    now, before = A.kv_stats(A.kv_rows(ROWS), "now"), A.kv_stats(A.kv_rows(ROWS), "before")
    assert now.median < before.median and now.p90 < before.p90


def test_weights_where_the_checkpoint_size_is_known_or_its_scheme_is():
    # every record but the MXFP4 ones (backend unknown: Marlin's padding, the larger) within 0.2 GiB
    for r in ROWS:
        err = abs(r.now["weights"] - r.real["weights"]) / GiB
        assert err < (1.6 if "gpt-oss" in r.rec["model"] else 0.2), r.id


def test_kv_tokens_where_printed():
    errs = [abs(A.rel(r.now["tokens"], r.real["tokens"])) for r in ROWS if r.real["tokens"]]
    assert len(errs) == 4 and statistics.median(errs) < 0.05


def test_the_section_renders():
    md = A.section(ROWS)
    assert md.count("\n| ") > 20 and "| all | 13 |" in md


@pytest.mark.parametrize("rid", ["5", "9", "11"])
def test_terms_of_well_printed_records(rid):
    r = next(x for x in ROWS if x.id == rid)
    for term in ("weights", "activation", "non_torch"):
        assert abs(r.now[term] - r.real[term]) < 0.08 * GiB, term
