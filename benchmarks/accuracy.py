"""The plan's memory model against real vLLM start-ups: predicted vs printed, per record, per class, per set.

Two sets of real start-ups (each with its README): ``benchmarks/calibration`` (15 from public logs,
V0 0.6.4 to V1 0.11, several GPUs) and ``benchmarks/calibration-llmd`` (59 vLLM 0.19.0 start-ups on
H100 from llm-d-planner's published sweep, with that planner's own error per run). For every record
:func:`evaluate` runs :func:`supervisor.core.memory.kv_budget` -- the function the plan uses -- with
what the record says (version, GPU, flags, the model's config) and compares weights, activation,
non-torch memory, the KV budget and the KV tokens with the printed figures.

The model's few fitted constants (:class:`supervisor.core.memory.Calibration`) are refitted here from
the printed figures by one procedure (:func:`fit`): a median per term and regime, a least-squares line
for the fusion workspaces. Held-in figures use the constants fitted on both sets; leave-one-out refits
without the record it predicts; cross-set fits on one set and scores the other. :func:`section`
renders the table ``scripts/bench --accuracy-only`` puts in REPORT.md.

The formulas of the release before issue 15 are kept here, frozen (:func:`previous_budget`), only to
show the before/after on the same records.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.core import memory as M
from supervisor.core import vllm
from supervisor.core.model import ModelInfo, _text_config
from supervisor.core.units import GiB
from supervisor.facts.model_files import load_model_info

HERE = os.path.dirname(os.path.abspath(__file__))
CALIBRATION = os.path.join(HERE, "calibration")
#: The two sets: directory, and how the report names them.
SETS = {"calibration": (CALIBRATION, "public logs (V0 0.6.4 - V1 0.11)"),
        "llmd": (os.path.join(HERE, "calibration-llmd"), "llm-d-planner's vLLM 0.19.0 sweep on H100")}

#: Records whose printed parts do not add up at the stated utilization (excluded from the KV statistics).
INCONSISTENT = {"2": "its printed parts (64.38 + 7.38 + 0.13 + 3.33 GiB) exceed the budget at the stated "
                     "0.90 (71.26 GiB); they add up at 0.95"}
#: Records from a development build: their non-torch figure is left out of that term's statistics and fit.
DEV_BUILD = {"14", "15"}
#: Records whose printed split (activation, non-torch, KV GiB) is a V0 TP worker that does not sample;
#: their token count is the minimum over the ranks, i.e. the driver's.
NON_DRIVER_SPLIT = {"13"}
#: The record classes the report breaks the error down by.
CLASSES = ("TP>1", "PP>1", "fp8 KV", "MoE", "MLA", "sliding", "multimodal", "quantized")
#: An over-prediction a first launch would not survive (the goal of issue 23).
OVER_REL, OVER_ABS = 0.10, GiB


def _f(x: str | None) -> float | None:
    x = (x or "").strip()
    return float(x) if x else None


def _i(x: str | None) -> int | None:
    x = (x or "").strip()
    return int(float(x)) if x else None


def load_records(name: str = "calibration") -> list[dict[str, str]]:
    """The records of one set (``calibration`` or ``llmd``), each tagged with its set."""
    path = SETS[name][0] if name in SETS else name
    with open(os.path.join(path, "records.tsv") if os.path.isdir(path) else path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for r in rows:
        r["set"] = name if name in SETS else "calibration"
    return rows


def all_records() -> list[dict[str, str]]:
    return [r for name in SETS for r in load_records(name)]


_MODELS: dict[str, ModelInfo] = {}


def model_of(rec: dict[str, str]) -> ModelInfo:
    path = os.path.join(SETS[rec.get("set") or "calibration"][0], "models", rec["model_dir"])
    if path not in _MODELS:
        info = load_model_info(path)
        assert info is not None, rec["model_dir"]
        _MODELS[path] = info
    return _MODELS[path]


def budget_kwargs(rec: dict[str, str]) -> dict[str, Any]:
    """What the record says about its launch, as :func:`memory.kv_budget` keywords."""
    name = rec.get("device_name") or rec["gpu"]
    return dict(gpu_total_bytes=int(float(rec["gpu_total_gib"]) * GiB),
                utilization=float(rec["gpu_memory_utilization"]), tp=int(rec["tp"]), pp=int(rec["pp"]),
                vllm_version=rec["vllm_version"], device_name=name,
                compute_capability=M.gpu_compute_capability(name),
                enforce_eager=rec.get("enforce_eager") == "True", max_model_len=_i(rec.get("max_model_len")),
                max_num_batched_tokens=_i(rec.get("max_num_batched_tokens")),
                max_num_seqs=_i(rec.get("max_num_seqs")), chunked_prefill=rec.get("chunked_prefill") == "True",
                dtype=(rec.get("dtype") or None), quantization=(rec.get("quantization_flag") or None))


def kv_kwargs(rec: dict[str, str], info: ModelInfo) -> dict[str, Any]:
    """The KV cache's own flags: dtype, block size (vLLM's default for the model and GPU), TP, PP."""
    kw = budget_kwargs(rec)
    block = _i(rec.get("block_size")) or vllm.default_block_size(
        mla=info.mla, compute_capability=kw["compute_capability"], vllm_version=kw["vllm_version"])
    return dict(tp=kw["tp"], pp=kw["pp"], kv_cache_dtype=rec.get("kv_cache_dtype") or "auto", block_size=block,
                vllm_version=kw["vllm_version"], dtype=kw["dtype"])


def classes_of(rec: dict[str, str], info: ModelInfo) -> tuple[str, ...]:
    tags = {"TP>1": int(rec["tp"]) > 1, "PP>1": int(rec["pp"]) > 1,
            "fp8 KV": (rec.get("kv_cache_dtype") or "auto").startswith("fp8"), "MoE": info.num_experts > 0,
            "MLA": info.mla, "sliding": bool(info.sliding_window) or bool(info.chunked_layers),
            "multimodal": info.shape.multimodal,
            "quantized": bool(info.quantization or rec.get("quantization_flag"))}
    return tuple(k for k in CLASSES if tags[k])


@dataclass
class Row:
    """One record: the printed figures (``real``), this model's held-in (``now``), leave-one-out
    (``loo``) and cross-set (``cross``) KV, and the previous formulas' (``before``)."""

    rec: dict[str, str]
    family: str
    classes: tuple[str, ...]
    real: dict[str, float | None]
    now: dict[str, float | None]
    before: dict[str, float | None]
    safe_kv: float = 0.0
    loo_kv: float | None = None
    cross_kv: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.rec["id"]

    @property
    def set(self) -> str:
        return self.rec.get("set") or "calibration"

    @property
    def peer(self) -> float | None:
        """llm-d-planner's own KV error on this run (a fraction), where its report states one."""
        x = _f(self.rec.get("peer_kv_err_pct"))
        return None if x is None else x / 100


def predict(rec: dict[str, str], cal: M.Calibration = M.CALIBRATION) -> tuple[M.Budget, M.Budget, dict[str, Any]]:
    """The budget the plan predicts for a record (and the split of the rank whose figures are printed)."""
    info = model_of(rec)
    kw = budget_kwargs(rec)
    b = M.kv_budget(info, cal=cal, **kw)
    split = M.kv_budget(info, driver=False, cal=cal, **kw) if rec["id"] in NON_DRIVER_SPLIT else b
    if int(rec["pp"]) > 1:          # the printed split is the first stage's; the KV the smallest stage's
        split = _stage_budget(info, kw, 0, cal)
    return b, split, kw


def _stage_budget(info: ModelInfo, kw: dict[str, Any], stage: int, cal: M.Calibration) -> M.Budget:
    b = M.kv_budget(info, cal=cal, **kw)
    tokens, seqs = b.max_num_batched_tokens, b.max_num_seqs
    act = M.activation_bytes(info, tokens=tokens, seqs=seqs, tp=kw["tp"], pp=kw["pp"], stage=stage,
                             dtype=kw["dtype"], vllm_version=kw["vllm_version"],
                             compute_capability=kw["compute_capability"], device_name=kw["device_name"], cal=cal)
    weights = M.weights_per_stage(info, tp=kw["tp"], pp=kw["pp"], quantization=kw["quantization"],
                                  compute_capability=kw["compute_capability"], vllm_version=kw["vllm_version"],
                                  dtype=kw["dtype"])[stage]
    return dataclasses.replace(b, activation_bytes=act, weights_bytes=weights)


def evaluate(records: list[dict[str, str]] | None = None, *, validate: bool = True) -> list[Row]:
    """Predicted vs real for every record (both sets by default); ``validate``: with the leave-one-out
    and cross-set KV figures (refits per record)."""
    records = records if records is not None else all_records()
    out = []
    for rec in records:
        info = model_of(rec)
        b, split, kw = predict(rec)
        g = lambda k, rec=rec: None if _f(rec.get(k)) is None else _f(rec[k]) * GiB  # noqa: E731
        kvk = kv_kwargs(rec, info)
        real = {"weights": g("obs_weights_gib"), "activation": g("obs_activation_gib"),
                "non_torch": g("obs_non_torch_gib"), "kv": g("obs_kv_gib"), "tokens": _i(rec.get("obs_kv_tokens")),
                "cudagraph": g("obs_cudagraph_gib") if _graph_inputs(rec) else None}
        now = {"weights": split.weights_bytes, "activation": split.activation_bytes,
               "non_torch": split.non_torch_bytes,
               "kv": split.kv_bytes if rec["id"] in NON_DRIVER_SPLIT else b.kv_bytes,
               "tokens": M.kv_cache_tokens(max(0, b.kv_bytes), info, **kvk),
               "cudagraph": M.cudagraph_estimate_bytes(info, vllm_version=kw["vllm_version"],
                                                       tokens=b.max_num_batched_tokens, seqs=b.max_num_seqs,
                                                       tp=kw["tp"], pp=kw["pp"],
                                                       compute_capability=kw["compute_capability"])}
        old = previous_budget(info, rec)
        row = Row(rec, b.family, classes_of(rec, info), real, now,
                  {**old, "tokens": M.kv_cache_tokens(max(0, int(old["kv"])), info, **kvk)},
                  safe_kv=split.safe_kv_bytes if rec["id"] in NON_DRIVER_SPLIT else b.safe_kv_bytes)
        if rec["id"] in INCONSISTENT and rec.get("set", "calibration") == "calibration":
            row.notes.append(INCONSISTENT[rec["id"]])
        if rec["id"] in NON_DRIVER_SPLIT:
            row.notes.append("split printed by a TP worker that does not sample; tokens are the driver's")
        if rec["id"] in DEV_BUILD:
            row.notes.append("a development build: non-torch memory no release reproduces")
        out.append(row)
    if validate:
        _validate(out)
    return out


# -- the fit: the procedure behind memory.Calibration ----------------------------------------------

def _regime(rec: dict[str, str]) -> str | None:
    """The non-torch regime of a record whose printed figure is the term alone (not the global-cap
    families, which print the CUDA context and other processes with it; not a development build)."""
    kw = budget_kwargs(rec)
    if rec["id"] in DEV_BUILD or vllm.caps_device_globally(kw["vllm_version"]):
        return None
    if _f(rec.get("obs_non_torch_gib")) is None:
        return None
    return M.non_torch_regime(kw["vllm_version"], tp=kw["tp"], pp=kw["pp"], device_name=kw["device_name"],
                              compute_capability=kw["compute_capability"])


def _activation_residual(rec: dict[str, str]) -> float | None:
    """Printed activation less the formula's without its fixed part (GiB)."""
    obs = _f(rec.get("obs_activation_gib"))
    if obs is None or rec["id"] in INCONSISTENT and rec.get("set") == "calibration":
        return None
    _, split, _ = predict(rec, dataclasses.replace(M.CALIBRATION, act_fixed=0.0))
    return obs - split.activation_bytes / GiB


#: What the model assumed before any start-up calibrated it (the previous release's figures): the prior
#: a fit falls back on where no record informs a constant nor its neighbour -- never the fitted values,
#: so that leave-one-out and cross-set see nothing of the records they predict.
UNCALIBRATED = M.Calibration(act_fixed=0.05, nt_single=0.10, nt_single_017=0.10, nt_multi_017=0.10, nt_parallel=0.25,
                             nt_parallel_per_rank=0.05, nt_parallel_pcie=0.25, nt_parallel_pcie_per_rank=0.02,
                             nt_fusion=0.25, nt_fusion_per_rank=0.05, graph_fixed=0.0625,
                             graph_per_graph_layer_mib=0.08, graph_moe_per_graph_layer_mib=0.0)


def fit(records: Iterable[dict[str, str]], prior: M.Calibration = UNCALIBRATED) -> M.Calibration:
    """The constants of :class:`memory.Calibration` from the printed figures of ``records``: the median
    activation residual; per non-torch regime the median printed figure (less the base it adds to); the
    fusion's TP 2 figure and per-rank growth by least squares; the graph term (:func:`_fit_graphs`). A
    constant no record informs takes its neighbour's (the same term in another release or interconnect),
    else ``prior``'s."""
    recs = list(records)
    act = [x for x in (_activation_residual(r) for r in recs) if x is not None]
    nt: dict[str, list[tuple[dict[str, str], float]]] = {k: [] for k in M.NON_TORCH_REGIMES}
    for r in recs:
        reg = _regime(r)
        if reg is not None:
            nt[reg].append((r, float(r["obs_non_torch_gib"])))

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 3) if xs else None

    def first(*xs: float | None) -> float:
        return next(x for x in xs if x is not None)

    single_old, single_new = med([x for _, x in nt["single"]]), med([x for _, x in nt["single_017"]])
    single = first(single_old, single_new, prior.nt_single)
    single_017 = first(single_new, single_old, prior.nt_single_017)
    multi = first(med([x for _, x in nt["pipeline_017"]]), prior.nt_multi_017)

    def world(r: dict[str, str]) -> int:
        return int(r["tp"]) * int(r["pp"])

    parallel = med([x - single - prior.nt_parallel_per_rank * (world(r) - 2) for r, x in nt["parallel"]])
    pcie = med([x - single - prior.nt_parallel_pcie_per_rank * (world(r) - 2) for r, x in nt["parallel_pcie"]])
    parallel, pcie = first(parallel, pcie, prior.nt_parallel), first(pcie, parallel, prior.nt_parallel_pcie)
    pts = [(int(r["tp"]) - 2, x - multi) for r, x in nt["fusion"]]
    if len({p for p, _ in pts}) >= 2:
        mx, my = statistics.fmean(p for p, _ in pts), statistics.fmean(y for _, y in pts)
        slope = sum((p - mx) * (y - my) for p, y in pts) / sum((p - mx) ** 2 for p, _ in pts)
        fusion, per_rank = round(my - slope * mx, 3), round(slope, 3)
    elif pts:
        per_rank = prior.nt_fusion_per_rank
        fusion = round(statistics.median(y - per_rank * p for p, y in pts), 3)
    else:
        fusion, per_rank = parallel, prior.nt_fusion_per_rank
    graph_fixed, graph_per, graph_moe = _fit_graphs(recs, prior)
    return dataclasses.replace(prior, act_fixed=first(med(act), prior.act_fixed), nt_single=single,
                               nt_single_017=single_017, nt_multi_017=multi, nt_parallel=parallel,
                               nt_parallel_pcie=pcie, nt_fusion=fusion, nt_fusion_per_rank=per_rank,
                               graph_fixed=graph_fixed, graph_per_graph_layer_mib=graph_per,
                               graph_moe_per_graph_layer_mib=graph_moe)


def _graph_inputs(rec: dict[str, str]) -> tuple[float, float, float] | None:
    """(graphs x layers on the rank, graphs x routed layers, measured GiB) of a record whose printed
    CUDA-graph memory is a measurement of the capture (vLLM 0.19+'s "Actual usage"; older releases print
    a free-memory difference taken after clean-ups, often negative), None otherwise."""
    y = _f(rec.get("obs_cudagraph_gib"))
    kw = budget_kwargs(rec)
    if y is None or vllm.rules(kw["vllm_version"]) < (0, 19, 0) or kw["enforce_eager"]:
        return None
    info = model_of(rec)
    b = M.kv_budget(info, **kw)
    one = M.Calibration(graph_fixed=0.0, graph_per_graph_layer_mib=1.0, graph_moe_per_graph_layer_mib=0.0)
    moe = M.Calibration(graph_fixed=0.0, graph_per_graph_layer_mib=0.0, graph_moe_per_graph_layer_mib=1.0)
    args = dict(vllm_version=kw["vllm_version"], tokens=b.max_num_batched_tokens, seqs=b.max_num_seqs, tp=kw["tp"],
                pp=kw["pp"], compute_capability=kw["compute_capability"])
    x = M.cudagraph_estimate_bytes(info, cal=one, **args) / M.MiB
    xm = M.cudagraph_estimate_bytes(info, cal=moe, **args) / M.MiB
    return x, xm, y


def _fit_graphs(recs: list[dict[str, str]], prior: M.Calibration) -> tuple[float, float, float]:
    """The graph term: a least-squares line over the dense models, the MoE models' median excess per
    routed graph-layer."""
    pts = [p for p in (_graph_inputs(r) for r in recs) if p is not None]
    dense = [(x, y) for x, xm, y in pts if not xm]
    if len(dense) < 3:
        return prior.graph_fixed, prior.graph_per_graph_layer_mib, prior.graph_moe_per_graph_layer_mib
    mx, my = statistics.fmean(x for x, _ in dense), statistics.fmean(y for _, y in dense)
    slope = sum((x - mx) * (y - my) for x, y in dense) / sum((x - mx) ** 2 for x, _ in dense)
    fixed = my - slope * mx
    moe = [(y - fixed - slope * x / 1024) * 1024 / xm for x, xm, y in pts if xm]
    return (round(fixed, 2), round(slope * 1024, 3),
            round(statistics.median(moe), 2) if moe else prior.graph_moe_per_graph_layer_mib)


def _validate(rows: list[Row]) -> None:
    """Leave-one-out and cross-set KV for every row (in place)."""
    recs = [r.rec for r in rows]
    cross_cal = {name: fit([r for r in recs if r.get("set") != name]) for name in SETS}
    for row in rows:
        others = [r for r in recs if r is not row.rec]
        b, split, _ = predict(row.rec, fit(others))
        row.loo_kv = split.kv_bytes if row.id in NON_DRIVER_SPLIT else b.kv_bytes
        b, split, _ = predict(row.rec, cross_cal[row.set])
        row.cross_kv = split.kv_bytes if row.id in NON_DRIVER_SPLIT else b.kv_bytes


# -- statistics ---------------------------------------------------------------------------------

def rel(pred: float | None, real: float | None) -> float | None:
    """(predicted - real) / |real|: positive is an over-prediction (optimistic: a launch may fail)."""
    if pred is None or real is None or abs(real) < 1e-9:
        return None
    return (pred - real) / abs(real)


def pctile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def kv_rows(rows: list[Row]) -> list[Row]:
    """The records whose KV figure counts: printed, and consistent."""
    return [r for r in rows if r.real["kv"] is not None and not (r.id in INCONSISTENT and r.set == "calibration")]


def over_limit(pred: float, real: float, rel_limit: float = OVER_REL, abs_limit: float = OVER_ABS) -> bool:
    """An over-prediction a first launch would not survive: more than max(10%, 1 GiB) above the real KV."""
    return pred - real > max(rel_limit * abs(real), abs_limit)


@dataclass
class Stats:
    n: int
    median: float
    p90: float
    mean: float
    bias: float
    over: int                       # records over max(10%, 1 GiB)
    worst_over: float               # the largest (pred - real) / real (negative: none over-predicted)
    worst_over_gib: float


_WHICH: dict[str, Callable[[Row], float | None]] = {
    "now": lambda r: r.now["kv"], "before": lambda r: r.before["kv"], "loo": lambda r: r.loo_kv,
    "cross": lambda r: r.cross_kv, "safe": lambda r: r.safe_kv}


def kv_stats(rows: list[Row], which: str = "now") -> Stats:
    get = _WHICH[which]
    pairs = [(get(r), r.real["kv"]) for r in rows if get(r) is not None and r.real["kv"] is not None]
    errs = [rel(p, q) for p, q in pairs]
    errs = [e for e in errs if e is not None]
    if not errs:
        return Stats(0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0)
    worst = max(pairs, key=lambda pq: (pq[0] - pq[1]) / abs(pq[1]))
    return Stats(len(errs), statistics.median(map(abs, errs)), pctile([abs(e) for e in errs], 0.9),
                 statistics.fmean(map(abs, errs)), statistics.median(errs),
                 sum(over_limit(p, q) for p, q in pairs), max(errs), (worst[0] - worst[1]) / GiB)


def peer_stats(rows: list[Row]) -> tuple[int, float, float, float, float]:
    """(n, our mean |error|, the peer's, our median |error|, the peer's) on the runs the peer reports."""
    both = [(abs(rel(r.now["kv"], r.real["kv"]) or 0.0), abs(r.peer)) for r in rows if r.peer is not None]
    if not both:
        return 0, 0.0, 0.0, 0.0, 0.0
    ours, theirs = [a for a, _ in both], [b for _, b in both]
    return len(both), statistics.fmean(ours), statistics.fmean(theirs), statistics.median(ours), \
        statistics.median(theirs)


def by_family(rows: list[Row]) -> dict[str, list[Row]]:
    fams: dict[str, list[Row]] = {}
    for r in kv_rows(rows):
        fams.setdefault(r.family, []).append(r)
    fams["all"] = kv_rows(rows)
    return fams


def by_class(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {c: [r for r in kv_rows(rows) if c in r.classes] for c in CLASSES}
    out["none of these"] = [r for r in kv_rows(rows) if not r.classes]
    return out


# -- the previous release's formulas, frozen for the comparison --------------------------------

def _previous_weights(info: ModelInfo) -> float:
    """The previous estimate without an index: 4.25-bit MXFP4 on every linear layer, no padding, no rope cache."""
    if info.weights_exact:
        return float(info.weights_bytes or 0)
    cfg = _text_config(info.config)
    qc = cfg.get("quantization_config") or {}
    method = str(qc.get("quant_method") or "").lower() if isinstance(qc, dict) else ""
    per = {"": 2.0, "fp8": 1.0, "mxfp4": 4.25 / 8, "awq": 0.5 + 0.5 / 128 + 2 / 128,
           "gptq": 0.5 + 0.5 / 128 + 2 / 128}.get(method)
    if method == "compressed-tensors":
        bits = 8
        for grp in (qc.get("config_groups") or {}).values():
            bits = int(((grp or {}).get("weights") or {}).get("num_bits") or bits)
        per = bits / 8 + (2 / 128 if bits < 8 else 0)
    h, L, v = info.hidden_size, info.num_layers, info.vocab_size
    attn = 2 * h * info.num_attention_heads * info.head_dim + 2 * h * info.num_kv_heads * info.head_dim
    if info.num_experts:
        moe_i = int(cfg.get("moe_intermediate_size") or info.intermediate_size)
        mlp = L * info.num_experts * 3 * h * moe_i
    else:
        mlp = L * 3 * h * info.intermediate_size
    other = v * h * (1 if cfg.get("tie_word_embeddings") else 2) + L * 2 * h + h
    return (L * attn + mlp) * (per if per is not None else 2.0) + other * 2


def previous_budget(info: ModelInfo, rec: dict[str, str]) -> dict[str, float]:
    """The KV budget by the previous release's formulas (sampler 32 B per logits element for every
    version, non-torch 0.10/0.25 GiB, graphs 0.25 GiB + 1.5% of the weights from 0.20)."""
    kw = budget_kwargs(rec)
    tp, pp = kw["tp"], kw["pp"]
    total = kw["gpu_total_bytes"]
    requested = total * kw["utilization"]
    weights = _previous_weights(info) / (tp * pp)
    tokens, seqs = vllm.batch_defaults(total, vllm_version=kw["vllm_version"], device_name=kw["device_name"],
                                       max_model_len=kw["max_model_len"] or 2048)
    tokens, seqs = kw["max_num_batched_tokens"] or tokens, kw["max_num_seqs"] or seqs
    mlp = tokens * (3 * info.intermediate_size / tp + 2 * info.hidden_size) * 2
    act = max(mlp, seqs * info.vocab_size * 32) + 0.05 * GiB
    nt = (0.25 if tp * pp > 1 else 0.10) * GiB
    graphs = 0.0 if vllm.graphs_outside_budget(kw["vllm_version"]) or kw["enforce_eager"] else \
        min(1.5 * GiB, 0.25 * GiB + 0.015 * weights)
    return {"weights": weights, "activation": act, "non_torch": nt, "kv": requested - weights - act - nt - graphs}


# -- markdown -----------------------------------------------------------------------------------

def _g(x: float | None) -> str:
    return "" if x is None else f"{x / GiB:.2f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.1f}%"


def _abs_pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _stats_cells(s: Stats) -> str:
    return (f"{s.n} | {_abs_pct(s.median)} | {_abs_pct(s.p90)} | {_abs_pct(s.mean)} | {_pct(s.bias)} "
            f"| {_pct(s.worst_over)} ({s.worst_over_gib:+.2f} GiB) | {s.over}")


_STATS_HEAD = ("| n | median abs | p90 abs | mean abs | median bias | worst over-prediction "
               "| over max(10%, 1 GiB) |")


def section(rows: list[Row] | None = None) -> str:
    """The accuracy section of REPORT.md."""
    rows = rows if rows is not None else evaluate()
    sets = {name: [r for r in rows if r.set == name] for name in SETS}
    cal = fit(r.rec for r in rows)
    out = [f"{len(rows)} real start-ups of vLLM on real GPUs in two sets: `benchmarks/calibration` "
           f"({len(sets['calibration'])}, {SETS['calibration'][1]}) and `benchmarks/calibration-llmd` "
           f"({len(sets['llmd'])}, {SETS['llmd'][1]}; each set's README says where the figures come from). "
           "Each start-up is predicted from what its record says (version, GPU, flags, the model's config "
           "resolved as transformers resolves it, the index where one exists) by "
           "`supervisor.core.memory.kv_budget`, the function the plan uses, and compared with what vLLM "
           "printed. GiB per rank; KV error = (predicted - real) / |real|, positive = over-predicted "
           "(optimistic: a first launch that fails). The model's few constants (`memory.Calibration`: one per "
           "term and regime, none per record) are fitted on the printed figures by `accuracy.fit`; **held-in** "
           "uses the constants fitted on both sets, **leave-one-out** refits without the record it predicts, "
           "**cross-set** fits on the other set only (a regime the other set lacks -- vLLM 0.19's TP "
           "workspaces are only in the sweep -- then takes its older neighbour's figure).", ""]
    out.append("### The KV budget, both sets")
    out.append("")
    out.append("| set | fit | " + _STATS_HEAD[2:])
    out.append("|---|---|---|---|---|---|---|---|---|")
    for name, items in (*sets.items(), ("both", rows)):
        for which, label in (("now", "held-in"), ("loo", "leave-one-out"), ("cross", "cross-set"),
                             ("safe", "the safe KV (less the band)")):
            if which == "cross" and name == "both":
                continue
            out.append(f"| {name} | {label} | {_stats_cells(kv_stats(kv_rows(items), which))} |")
        if name == "calibration":
            out.append(f"| {name} | previous formulas | {_stats_cells(kv_stats(kv_rows(items), 'before'))} |")
    out.append("")
    n, ours, theirs, ours_med, theirs_med = peer_stats(kv_rows(sets["llmd"]))
    out.append(f"Against llm-d-planner on the {n} runs of its sweep where its report states its own KV error: "
               f"mean |error| **{_abs_pct(ours)} here, {_abs_pct(theirs)} for the peer** (median "
               f"{_abs_pct(ours_med)} vs {_abs_pct(theirs_med)}). The peer's report gives 6.70% over 50 runs of "
               "the sweep.")
    out.append("")
    out.append("### Per class (a record counts in every class it belongs to)")
    out.append("")
    out.append("| class | set | n | median abs | p90 abs | mean abs | worst over | over max(10%, 1 GiB) "
               "| leave-one-out mean abs | peer: n, mean abs, ours on those |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, items in sets.items():
        for cls, members in by_class(items).items():
            if not members:
                continue
            s, lo = kv_stats(members, "now"), kv_stats(members, "loo")
            pn, po, pt, _, _ = peer_stats(members)
            peer = f"{pn}, {_abs_pct(pt)}, {_abs_pct(po)}" if pn else ""
            out.append(f"| {cls} | {name} | {s.n} | {_abs_pct(s.median)} | {_abs_pct(s.p90)} | {_abs_pct(s.mean)} "
                       f"| {_pct(s.worst_over)} | {s.over} | {_abs_pct(lo.mean)} | {peer} |")
    out.append("")
    out.append("### The fitted constants (GiB; the graph terms in MiB per captured graph and layer)")
    out.append("")
    out.append("| constant | fitted on both sets | in the code | fitted on the first set only | on the sweep only "
               "| the prior (uncalibrated) |")
    out.append("|---|---|---|---|---|---|")
    only = {name: fit(r.rec for r in items) for name, items in sets.items()}
    for f in dataclasses.fields(M.Calibration):
        out.append(f"| `{f.name}` | {getattr(cal, f.name)} | {getattr(M.CALIBRATION, f.name)} "
                   f"| {getattr(only['calibration'], f.name)} | {getattr(only['llmd'], f.name)} "
                   f"| {getattr(UNCALIBRATED, f.name)} |")
    for name, items in sets.items():
        out += ["", f"### Per record: {name} ({SETS[name][1]})", ""]
        out.append("| id | vLLM | model | GPU | TP/PP | classes | weights real / now | activation real / now "
                   "| non-torch real / now | KV GiB real / now | KV error held-in / LOO / cross | peer "
                   "| safe KV | tokens real / now |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in items:
            o, m = r.real, r.now
            tok = f"{o['tokens']:,} / {m['tokens']:,}" if o["tokens"] else ""
            mark = "" if not r.notes else " *"
            out.append(
                f"| {r.id}{mark} | {r.rec['vllm_version']} | {r.rec['model'].split('/')[-1]} | {r.rec['gpu']} "
                f"| {r.rec['tp']}/{r.rec['pp']} | {', '.join(r.classes)} "
                f"| {_g(o['weights'])} / {_g(m['weights'])} | {_g(o['activation'])} / {_g(m['activation'])} "
                f"| {_g(o['non_torch'])} / {_g(m['non_torch'])} | {_g(o['kv'])} / {_g(m['kv'])} "
                f"| {_pct(rel(m['kv'], o['kv']))} / {_pct(rel(r.loo_kv, o['kv']))} / {_pct(rel(r.cross_kv, o['kv']))} "
                f"| {_pct(r.peer)} | {_g(r.safe_kv)} | {tok} |")
        notes = [f"{r.id}: {'; '.join(r.notes)}" for r in items if r.notes]
        if notes:
            out += ["", "\\* " + "; ".join(notes) + "."]
    out += ["", "### Per term (GiB, predicted - real, over the records that print it)", ""]
    out.append("| term | set | n | median abs | max abs | median bias |")
    out.append("|---|---|---|---|---|---|")
    for k in ("weights", "activation", "non_torch", "cudagraph", "kv"):
        for name, items in sets.items():
            pairs = [r for r in items if r.real.get(k) is not None and r.now.get(k) is not None
                     and not (k in ("activation", "kv") and r.id in INCONSISTENT and r.set == "calibration")
                     and not (k == "non_torch" and r.id in DEV_BUILD and r.set == "calibration")]
            if not pairs:
                continue
            dn = [(r.now[k] - r.real[k]) / GiB for r in pairs]
            out.append(f"| {k.replace('_', '-')} | {name} | {len(pairs)} | {statistics.median(map(abs, dn)):.2f} "
                       f"| {max(map(abs, dn)):.2f} | {statistics.median(dn):+.2f} |")
    tok = [abs(rel(r.now["tokens"], r.real["tokens"]) or 0) for r in rows if r.real["tokens"]]
    out += ["", f"KV tokens (\"GPU KV cache size\", {len(tok)} records that print it, sliding-window and hybrid "
                f"models counted as vLLM groups their layers): median abs error {_abs_pct(statistics.median(tok))}, "
                f"max {_abs_pct(max(tok))}.", ""]
    out += sensitivity(rows)
    return "\n".join(out)


def sensitivity(rows: list[Row]) -> list[str]:
    """What the facts the plan cannot see before a launch do to three records."""
    by_id = {(r.set, r.id): r for r in rows}
    out = ["Facts a plan cannot see before the launch, and what they do (the plan takes the larger figure):", ""]
    out.append("| record | assumption | weights | activation | KV GiB | KV error |")
    out.append("|---|---|---|---|---|---|")

    def line(rid: str, label: str, **kw: Any) -> None:
        r = by_id.get(("calibration", rid))
        if r is None:
            return
        b = M.kv_budget(model_of(r.rec), **{**budget_kwargs(r.rec), **kw})
        out.append(f"| {rid} | {label} | {_g(b.weights_bytes)} | {_g(b.activation_bytes)} | {_g(b.kv_bytes)} "
                   f"| {_pct(rel(b.kv_bytes, r.real['kv']))} |")

    for rid in ("1", "2"):
        line(rid, "MXFP4 MoE backend unknown: Marlin's padding (the plan's default)")
        line(rid, "the Triton MoE backend (what its printed weights match)", mxfp4_backend="triton")
    line("2", "utilization 0.95 (where its printed parts add up), Triton", mxfp4_backend="triton", utilization=0.95)
    line("10", "FlashInfer unknown: the sort's 38 B per logits element (the plan's default)")
    line("10", "FlashInfer's sampler (14 B per element; the printed activation matches it)", flashinfer=True)
    return out


def main() -> int:
    print(section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
