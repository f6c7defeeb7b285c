"""``vllm-guard diagnose [--json] [--flags ARGS] [--model M] [--gpu-total-gib G] FILE...``: name the
failure in saved vLLM logs.

The same :class:`~supervisor.core.classifier.Classifier` the daemon runs on live output reads each file
(``-`` is standard input: ``journalctl -u vllm-guard | vllm-guard diagnose -``) as bytes, through the
daemon's own line splitter (``vllm_text.LineSplitter``: the same bounded lines its pipes give), so a
bad encoding or a huge file never stops it; its normalisation takes off whatever carried the log
(journald, docker, Kubernetes, a console, a paste's wrap, quotes and order), and the report says
which. The same :class:`~supervisor.core.session.Session` the daemon asks says what it would do
next, as if the log were its first launch with ``--flags``. Exit 0 when every file was read,
whatever it holds; 2 when one could not be read (the others are still diagnosed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
from typing import IO, Any

from supervisor.config import GuardConfig, PlanConfig
from supervisor.core.classifier import Classifier
from supervisor.core.diagnosis import Diagnosis
from supervisor.core.flags import MAX_MODEL_LEN, Flags
from supervisor.core.model import ModelInfo
from supervisor.core.session import FAILED, End, Facts, Launch, Outcome, Session
from supervisor.core.vllm_text import CARRIERS, LEARNT, LineSplitter
from supervisor.errors import EX_OK, EX_USAGE
from supervisor.facts.model_files import load_model_info
from supervisor.secrets import REGISTRY

_CHUNK = 1 << 20        # read 1 MiB at a time
CARRIER_WHAT = {c.name: c.what for c in (*CARRIERS, LEARNT)}


def add_parser(subparsers: Any) -> None:
    """Register ``diagnose`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "diagnose", help="name the failure in saved vLLM logs and the flags that fix it",
        description="Classify saved vLLM output the way the guard classifies it live, and print "
                    "the flags a relaunch would use.")
    p.add_argument("files", nargs="+", metavar="FILE", help="vLLM log files; - reads standard input")
    p.add_argument("--json", action="store_true", help="one JSON object per file, one per line")
    p.add_argument("--flags", metavar="ARGS", help="the vLLM arguments the log was produced with, "
                   "e.g. \"--max-model-len 32768 --gpu-memory-utilization 0.9\"")
    p.add_argument("--exit-code", type=int, metavar="N",
                   help="vLLM's exit status, when known (a non-zero exit with no message is engine_dead)")
    p.add_argument("--model", metavar="MODEL", help="the model (directory, config.json, or a Hub id in the "
                   "local cache): with --gpu-total-gib, the remedy sizes as the daemon does")
    p.add_argument("--gpu-total-gib", type=_gib, metavar="GIB", help="the GPU's memory, as NVML reports it")
    p.add_argument("--gpu-free-gib", type=_gib, metavar="GIB", help="the GPU's free memory before the launch")
    p.set_defaults(func=run)


def _gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of GiB")
    return value


def run(args: argparse.Namespace) -> int:
    """Diagnose every file; print one report (or JSON line) each."""
    status = EX_OK
    model = _model(getattr(args, "model", None))
    for name in args.files:
        try:
            diagnosis, classifier = _diagnose_file(name, getattr(args, "exit_code", None))
        except OSError as e:
            print(f"vllm-guard diagnose: {name}: {e.strerror or e}", file=sys.stderr)
            status = EX_USAGE
            continue
        diagnosis = _held_to_bounds(diagnosis, args, model)
        remedy = _next_step(diagnosis, args, model)
        read = _read_as(classifier)
        if args.json:
            shown = REGISTRY.obj({**_as_json(name, diagnosis, remedy), **read})
            print(json.dumps(shown, ensure_ascii=False), flush=True)
        else:
            print(REGISTRY.text(_as_text(name, diagnosis, remedy, read)), flush=True)
    return status


def _diagnose_file(name: str, exit_code: int | None) -> tuple[Diagnosis, Classifier]:
    classifier = Classifier()
    if name == "-":
        _read(sys.stdin.buffer, classifier)
    else:
        with open(name, "rb") as stream:
            _read(stream, classifier)
    return classifier.diagnose(exit_code), classifier


def _read(stream: IO[bytes], classifier: Classifier) -> None:
    """Feed a byte stream to the classifier as the daemon feeds a pipe: the same splitter, the same
    bounded lines (a line is cut at ``vllm_text.MAX_LINE`` and the rest of it dropped)."""
    splitter = LineSplitter()
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        for line in splitter.feed(chunk):
            classifier.feed(line)
    for line in splitter.close():
        classifier.feed(line)


def _read_as(classifier: Classifier) -> dict[str, Any]:
    """How the log reached the classifier: the carrier whose prefixes were taken off, a terminal's wrap,
    a console's newest-first order, the guard's own lines skipped (``vllm_text.Normalizer``)."""
    text = classifier.text
    carrier = text.carrier
    return {"carrier": carrier, "carrier_what": CARRIER_WHAT.get(carrier or "", ""), "wrapped_at": text.wrap_width,
            "newest_first": text.newest_first, "guard_lines": text.guard_lines}


def _read_line(read: dict[str, Any]) -> str:
    parts = []
    if read["carrier"]:
        parts.append(f"{read['carrier']} ({read['carrier_what']}) lines, their prefixes removed")
    if read["wrapped_at"]:
        parts.append(f"wrapped at {read['wrapped_at']} columns, re-joined")
    if read["newest_first"]:
        parts.append("listed newest first, read oldest first")
    if read["guard_lines"]:
        parts.append(f"{read['guard_lines']} of vllm-guard's own lines skipped")
    return "; ".join(parts)


def _model(name: str | None) -> ModelInfo | None:
    """The model's facts for ``--model`` (local or cached only), or None with a note why."""
    if not name:
        return None
    try:
        info = load_model_info(name, online=False)
    except Exception as e:  # noqa: BLE001 - a broken config.json must not hide the diagnosis
        print(f"vllm-guard diagnose: {name}: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    if info is None:
        print(f"vllm-guard diagnose: no config.json found for {name}; sizing from the log alone", file=sys.stderr)
    return info


def _session(flags: Flags, args: argparse.Namespace, model: ModelInfo | None, d: Diagnosis) -> Session:
    """The daemon's session, the log's launch its first, made with ``flags``."""
    cfg = GuardConfig(model=getattr(args, "model", None) or "model", vllm_args=tuple(flags.argv()),
                      plan=PlanConfig(enabled=False, learn=False))
    facts = Facts(model=model, total_gib=getattr(args, "gpu_total_gib", None),
                  free_gib=getattr(args, "gpu_free_gib", None), vllm_version=d.numbers.get("vllm_version"))
    session = Session(cfg, facts, rng=random.Random(0))
    session.first_launch()
    session.launching()
    return session


def _held_to_bounds(d: Diagnosis, args: argparse.Namespace, model: ModelInfo | None) -> Diagnosis:
    """A launch whose log shows vLLM's auto-fit choice ran with ``--max-model-len auto`` (vLLM prints it for
    nothing else): the daemon holds that choice to its floor (``--min-model-len``) and to the length asked,
    and so does diagnose, with the session's own check."""
    if "auto_fit_max_model_len" not in d.numbers:
        return d
    try:
        flags = Flags.parse(getattr(args, "flags", None) or "")
    except ValueError:
        return d                                  # (said by the remedy's step)
    if flags.get(MAX_MODEL_LEN) is None:
        flags = flags.set(MAX_MODEL_LEN, "auto")
    # (checked where the daemon checks it: as vLLM prints its choice, sizing the KV cache)
    held = _session(flags, args, model, d).check_auto_fit(d.numbers, "kv_cache")
    return d if held is None else dataclasses.replace(held, numbers={**d.numbers, **held.numbers})


def _next_step(d: Diagnosis, args: argparse.Namespace, model: ModelInfo | None) -> dict[str, Any]:
    """What the daemon would do after this failure: the session itself, fed the log's launch as its first."""
    if not d.names_a_failure:
        return {"healable": False, "flags": {}, "why": "no failure found"}
    try:
        flags = Flags.parse(getattr(args, "flags", None) or "")
    except ValueError as e:
        return {"healable": False, "flags": {}, "why": f"--flags cannot be parsed: {e}"}
    session = _session(flags, args, model, d)
    step = session.ended(Outcome(FAILED, d, exit_code=getattr(args, "exit_code", None)))
    if isinstance(step, End):
        return {"healable": False, "flags": {}, "why": step.reason, "advice": step.advice,
                "exit_code": step.exit_code}
    assert isinstance(step, Launch)
    return {"healable": True, "flags": {c.flag: c.new for c in step.changes}, "why": step.why,
            **({"delay_s": round(step.delay, 1)} if step.delay else {})}


def _as_json(name: str, d: Diagnosis, remedy: dict[str, Any]) -> dict[str, Any]:
    fix = {"flags": dict(remedy.get("flags") or {}), "why": remedy.get("why", "")}
    if remedy.get("advice"):
        fix["advice"] = remedy["advice"]
    return {"file": name, "kind": d.kind.value, "healable": bool(remedy.get("healable")),
            "evidence": d.evidence, "numbers": d.numbers, "phase": d.phase, "detail": d.detail,
            "remedy": fix}


def _as_text(name: str, d: Diagnosis, remedy: dict[str, Any], read: dict[str, Any] | None = None) -> str:
    verdict = d.kind.value if not d.names_a_failure else (
        f"{d.kind.value} ({'healable' if remedy.get('healable') else 'not healable'}, during {d.phase})")
    out = [f"{name}: {verdict}", f"  {d.detail}"]
    how = _read_line(read) if read else ""
    if how:
        out.append(f"  read as:  {how}")
    if d.evidence:
        out.append(f"  evidence: {d.evidence}")
    if d.numbers:
        out.append("  numbers:  " + ", ".join(f"{k}={v}" for k, v in d.numbers.items()))
    flags = remedy.get("flags") or {}
    if flags:
        out.append("  relaunch: " + " ".join(f"{k} {v}" if v not in (None, True, "") else k for k, v in flags.items()))
    if remedy.get("why"):
        out.append(f"  why:      {remedy['why']}")
    if remedy.get("advice"):
        out.append(f"  advice:   {remedy['advice']}")
    return "\n".join(out)


if __name__ == "__main__":   # handy while developing: python -m supervisor.cli.diagnose FILE
    parser = argparse.ArgumentParser(prog="vllm-guard")
    add_parser(parser.add_subparsers())
    ns = parser.parse_args(["diagnose", *sys.argv[1:]])
    raise SystemExit(ns.func(ns))
