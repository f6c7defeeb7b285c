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


def test_the_plan_keeps_the_context_where_its_estimate_alone_fell_short():
    # 0.32: the plan's length is an estimate (3% margin on a 0.5 GiB fp8 KV cache cost 7%); it now
    # leaves the length to vLLM's auto-fit. V0: the reference and the plan both use chunked prefill.
    awq = _case("Qwen2.5-32B-AWQ | L4 24GB | 8k | 0.32.0")
    v0 = _case("Llama-3.1-8B | L4 24GB | default | 0.6.6.post1")
    awq_r, v0_r = run_matrix([awq, v0])
    assert v0_r.fit.flags.has("--enable-chunked-prefill")
    for r in (awq_r, v0_r):
        run = r.runs["vllm-guard + plan"]
        assert len(run.launches) == 1 and run.healed, run.launches
        assert r.kept("vllm-guard + plan") >= 0.95, (run.served_len, r.fit.length)
    assert awq_r.runs["vllm-guard + plan"].launches[0].flags.get("--max-model-len") == "auto"
    assert v0_r.runs["vllm-guard + plan"].launches[0].flags.has("--enable-chunked-prefill")
