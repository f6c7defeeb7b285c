"""Figures per policy from the matrix runs, the target checks, the markdown report and the plot."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks.costs import (
    BOOTSTRAP_S,
    CAPTURE_S,
    COMPILE_S,
    EXIT_AFTER_ERROR_S,
    GUARD_COLLECT_S,
    PROFILE_S,
    RESTART_SEC,
    SETTLE_S,
    WEIGHTS_GIB_PER_S,
    time_to_healthy,
)
from benchmarks.matrix import Case, Fit
from benchmarks.policies import POLICIES, Run

GUARD, PLAN = "vllm-guard", "vllm-guard + plan"
BASELINE_NAMES = tuple(p for p in POLICIES if not p.startswith("vllm-guard"))


@dataclass
class Result:
    """One case: the reference fit and every policy's run."""

    case: Case
    fit: Fit
    runs: dict[str, Run]

    @property
    def healable(self) -> bool:
        return self.fit.length > 0

    def kept(self, policy: str) -> float | None:
        run = self.runs[policy]
        if not self.healable or not run.healed:
            return None
        return run.served_len / self.fit.length


@dataclass
class Figures:
    """The figures of one policy over the matrix."""

    policy: str
    healed: int = 0
    healable: int = 0
    healed_unhealable: int = 0
    launches: list[int] = field(default_factory=list)        # per healed case
    seconds: list[float] = field(default_factory=list)       # per healed case
    kept: list[float] = field(default_factory=list)          # per healed healable case
    kept_all: list[float] = field(default_factory=list)      # per healable case, unhealed = 0
    wasted: list[int] = field(default_factory=list)          # launches spent on unhealable cases

    def row(self) -> dict[str, Any]:
        med = statistics.median
        return {
            "policy": self.policy,
            "healed": f"{self.healed}/{self.healable}",
            "launches median": f"{med(self.launches):g}" if self.launches else "-",
            "launches worst": max(self.launches) if self.launches else "-",
            "time median s": round(med(self.seconds)) if self.seconds else "-",
            "time worst s": round(max(self.seconds)) if self.seconds else "-",
            "context kept median": _pct(med(self.kept)) if self.kept else "-",
            "context kept worst": _pct(min(self.kept)) if self.kept else "-",
            "context kept mean (unhealed = 0)": _pct(statistics.fmean(self.kept_all)) if self.kept_all else "-",
            "launches on unhealable": (f"{statistics.median(self.wasted):g} / {max(self.wasted)}"
                                       if self.wasted else "-"),
        }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def figures(results: list[Result]) -> dict[str, Figures]:
    out = {p: Figures(p) for p in POLICIES}
    for res in results:
        for p, run in res.runs.items():
            f = out[p]
            if res.healable:
                f.healable += 1
                f.kept_all.append(min(res.kept(p) or 0.0, 1.0))
            else:
                f.wasted.append(len(run.launches))
            if run.healed:
                if res.healable:
                    f.healed += 1
                    f.kept.append(res.kept(p))
                else:
                    f.healed_unhealable += 1
                f.launches.append(len(run.launches))
                f.seconds.append(time_to_healthy(res.case, run))
    return out


# -- targets --------------------------------------------------------------------------------------
@dataclass
class Miss:
    target: str
    result: Result
    policy: str

    def text(self) -> str:
        run = self.result.runs[self.policy]
        steps = "; ".join(
            f"launch {i + 1} `{' '.join(x.flags.argv()) or '(no flags)'}` -> "
            + ("serves" if x.ok else f"{x.kind} [classifier: {(x.diagnosis or '')[:110]}] -> {x.decision}")
            for i, x in enumerate(run.launches))
        got = f"served {run.served_len}" if run.healed else f"not healed ({run.gave_up})"
        return (f"- **{self.target}** - {self.result.case.label} - {self.policy}: {got}; "
                f"reference {self.result.fit.length} (`{' '.join(self.result.fit.flags.argv())}`). {steps}")


def misses(results: list[Result]) -> list[Miss]:
    """Where vllm-guard misses the issue's targets (healable cases only)."""
    out: list[Miss] = []
    for res in results:
        if not res.healable:
            continue
        for policy, limit in ((GUARD, 2), (PLAN, 1)):
            run = res.runs[policy]
            if not run.healed:
                out.append(Miss("not healed", res, policy))
                continue
            if len(run.launches) > limit:
                out.append(Miss(f"more than {limit} launch{'es' if limit > 1 else ''}", res, policy))
            kept = res.kept(policy)
            if kept is not None and kept < 0.95:
                out.append(Miss(f"context kept {kept:.2%} < 95%", res, policy))
    return out


def _pairs(results: list[Result], a: str, b: str) -> list[Result]:
    return [r for r in results if r.healable and r.runs[a].healed and r.runs[b].healed]


def head_to_head(results: list[Result], guard: str) -> list[dict[str, Any]]:
    """``guard`` against each baseline: healed cases, and on the cases both healed, launches, time, context.

    Figures over each policy's own healed cases are not comparable (plain restart heals only the
    cases that never fail), so the comparison uses the cases both policies healed.
    """
    rows = []
    med = statistics.median
    for b in BASELINE_NAMES:
        common = _pairs(results, guard, b)
        healed_g = sum(r.healable and r.runs[guard].healed for r in results)
        healed_b = sum(r.healable and r.runs[b].healed for r in results)
        row: dict[str, Any] = {"baseline": b, "healed": _cmp(healed_g, healed_b, True),
                               "both healed": len(common)}
        if common:
            lg = [len(r.runs[guard].launches) for r in common]
            lb = [len(r.runs[b].launches) for r in common]
            tg = [time_to_healthy(r.case, r.runs[guard]) for r in common]
            tb = [time_to_healthy(r.case, r.runs[b]) for r in common]
            kg = [min(r.kept(guard), 1.0) for r in common]
            kb = [min(r.kept(b), 1.0) for r in common]
            row["launches median"] = _cmp(med(lg), med(lb), False)
            row["launches worst"] = _cmp(max(lg), max(lb), False)
            row["time median s"] = _cmp(round(med(tg)), round(med(tb)), False)
            row["time worst s"] = _cmp(round(max(tg)), round(max(tb)), False)
            row["context kept mean"] = _cmp(round(100 * statistics.fmean(kg), 1),
                                            round(100 * statistics.fmean(kb), 1), True, "%")
            row["context kept worst"] = _cmp(round(100 * min(kg), 1), round(100 * min(kb), 1), True, "%")
        rows.append(row)
    return rows


def _cmp(g: float, b: float, higher_better: bool, unit: str = "") -> str:
    ok = g >= b if higher_better else g <= b
    return f"{g:g}{unit} vs {b:g}{unit} {'ok' if ok else 'BEHIND'}"


def behind(rows: list[dict[str, Any]]) -> int:
    return sum(str(v).endswith("BEHIND") for row in rows for v in row.values())


# -- markdown -------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    heads = list(rows[0])
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r[h]) for h in heads) + " |")
    return "\n".join(lines)


def policy_table(figs: dict[str, Figures]) -> str:
    return table([figs[p].row() for p in POLICIES])


def case_rows(results: list[Result]) -> list[dict[str, Any]]:
    rows = []
    for res in results:
        row: dict[str, Any] = {"case": res.case.label, "fits": res.fit.length or "unhealable"}
        for p in POLICIES:
            run = res.runs[p]
            row[p] = f"{len(run.launches)}: {run.served_len}" if run.healed else f"{len(run.launches)}: -"
        rows.append(row)
    return rows


COSTS_TEXT = f"""Time to healthy adds, per launch, the phases it reached (published figures, docs/benchmarks.md):
bootstrap {BOOTSTRAP_S:g} s (vllm#44881), weights at {WEIGHTS_GIB_PER_S:.2f} GiB/s per rank (21.8 GiB in 18 s,
vllm#44881), torch.compile {COMPILE_S:.1f} s on V1 without --enforce-eager (dynamo 4.6 + compile 14.8 s,
vllm PR #11005), profiling {PROFILE_S:g} s (vllm-profile-cache), CUDA-graph capture {CAPTURE_S:g} s without
--enforce-eager (PR #11005). After a failure: the guard stops vLLM after its {GUARD_COLLECT_S:g} s collection
window, a script waits for vLLM to exit (~{EXIT_AFTER_ERROR_S:g} s after the error, real vLLM 0.32 capture),
then GPU memory settles ({SETTLE_S:g} s, Ollama's 0.5-1.5 s); plain restart also waits RestartSec={RESTART_SEC:g} s.
Estimates, not measurements: they rank policies by the work each relaunch repeats."""


def hard(results: list[Result]) -> list[Result]:
    """Healable cases where the flags as asked fail: the ones where a policy has work to do."""
    return [r for r in results if r.healable and not r.runs["plain restart"].launches[0].ok]


def plot(results: list[Result], figs: dict[str, Figures], path: str) -> None:
    """Four panels comparing the policies; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(POLICIES)
    colors = ["#1b7837" if n.startswith("vllm-guard") else "#999999" for n in names]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    med = statistics.median
    xs = list(range(len(names)))
    hard_cases = hard(results)

    def labels(ax, title, unit):
        ax.set_xticks(xs, names, rotation=25, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)

    f = [figs[n] for n in names]
    ax = axes[0][0]
    ax.bar(xs, [100 * x.healed / max(1, x.healable) for x in f], color=colors)
    labels(ax, f"Healable cases healed (of {f[0].healable})", "%")

    ax = axes[0][1]        # the same hard cases for every policy: how many launches each needed
    buckets = (("1", "#1b7837"), ("2", "#7fbf7b"), ("3", "#d9f0d3"), ("4-6", "#fdb863"), ("not healed", "#b2182b"))
    bottom = [0] * len(names)
    for label, color in buckets:
        counts = []
        for n in names:
            k = 0
            for r in hard_cases:
                run = r.runs[n]
                got = len(run.launches) if run.healed else None
                k += (label == "not healed" and got is None) or (got is not None and (
                    str(got) == label or (label == "4-6" and got >= 4)))
            counts.append(k)
        ax.bar(xs, counts, bottom=bottom, color=color, label=label)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.legend(title="launches", fontsize=7, title_fontsize=7, loc="upper right")
    labels(ax, f"Launches to healthy on the {len(hard_cases)} cases whose asked-for flags fail", "cases")

    ax = axes[1][0]
    times = [[time_to_healthy(r.case, r.runs[n]) for r in hard_cases if r.runs[n].healed] for n in names]
    ax.bar(xs, [med(t) if t else 0 for t in times], color=colors)
    healed = [(x, max(t)) for x, t in zip(xs, times, strict=True) if t]      # none healed: no worst to mark
    ax.scatter([x for x, _ in healed], [w for _, w in healed], color="#b2182b", marker="_", s=400, zorder=3,
               label="worst")
    for x, t in zip(xs, times, strict=True):
        ax.annotate(f"n={len(t)}", (x, 0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7,
                    color="white" if t else "black")
    ax.legend(loc="upper left", fontsize=8)
    labels(ax, "Time to healthy on those cases, estimated (median, worst; n = healed)", "s")

    ax = axes[1][1]
    ax.bar(xs, [100 * statistics.fmean(x.kept_all) if x.kept_all else 0 for x in f], color=colors)
    ax.scatter(xs, [100 * min(x.kept) if x.kept else 0 for x in f], color="#b2182b", marker="_", s=400,
               zorder=3, label="worst healed case")
    ax.legend(loc="lower right", fontsize=8)
    labels(ax, "Context kept vs the largest that fits (mean, unhealed = 0)", "%")
    fig.suptitle("vllm-guard vs baselines on the emulated vLLM matrix (benchmarks/REPORT.md)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
