"""The benchmark's policy simulation on two cases of its matrix: it runs and produces the table (not timed)."""

from __future__ import annotations

from benchmarks import matrix, report
from benchmarks.policies import POLICIES
from benchmarks.run import run_matrix


def _case(label: str) -> matrix.Case:
    return next(c for c in matrix.cases() if c.label == label)


def test_two_cases_produce_the_policy_table():
    easy = _case("Qwen2.5-7B | L40S 48GB | 8k | 0.32.0")          # fits as asked
    hard = _case("Llama-3.1-8B | L4 24GB | default | 0.32.0")     # 131072 tokens do not fit on 24 GB
    results = run_matrix([easy, hard])

    easy_r, hard_r = results
    assert easy_r.fit.length == 8192
    assert all(easy_r.runs[p].served_len == 8192 and len(easy_r.runs[p].launches) == 1 for p in POLICIES)

    # The KV failure, classified from the rendered vLLM 0.32 output, names the estimate.
    assert 0 < hard_r.fit.length < 131072
    first = hard_r.runs["vllm-guard"].launches[0]
    assert first.kind == "kv_cache_insufficient"
    assert first.diagnosis.startswith("kv_cache_insufficient") and "estimated maximum model length" in first.diagnosis
    assert first.decision.startswith("max_model_len: --max-model-len (unset) -> ")
    assert hard_r.runs["vllm-guard"].healed
    assert not hard_r.runs["plain restart"].healed
    assert len(hard_r.runs["plain restart"].launches) == 6

    figs = report.figures(results)
    md = report.policy_table(figs)
    lines = md.splitlines()
    assert lines[0].startswith("| policy | healed | launches median")
    assert len(lines) == 2 + len(POLICIES)
    for p in POLICIES:
        assert any(line.startswith(f"| {p} |") for line in lines)
    assert "| plain restart | 1/2 |" in md
    rows = report.head_to_head(results, "vllm-guard")
    assert [r["baseline"] for r in rows] == list(report.BASELINE_NAMES)
