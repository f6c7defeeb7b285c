"""``vllm-guard diagnose [--json] [--flags ARGS] [--model M] [--gpu-total-gib G] FILE...``: name the
failure in saved vLLM logs.

The same :class:`~supervisor.core.classifier.Classifier` the daemon runs on live output reads each file
(``-`` is standard input) as bytes, in bounded chunks, so a bad encoding or a huge file never
stops it. Exit 0 when every file was read, whatever it holds; 2 when one could not be read (the
others are still diagnosed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import IO, Any, Iterator

from supervisor.core.classifier import Classifier
from supervisor.core.diagnosis import Diagnosis, Kind

EXIT_OK, EXIT_UNREADABLE = 0, 2
_CHUNK = 1 << 20        # read 1 MiB at a time
_MAX_LINE = 4 << 20     # a "line" with no newline in 4 MiB is handed over as it is


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
    status = EXIT_OK
    facts = _facts(args)
    for name in args.files:
        try:
            diagnosis = _diagnose_file(name, getattr(args, "exit_code", None))
        except OSError as e:
            print(f"vllm-guard diagnose: {name}: {e.strerror or e}", file=sys.stderr)
            status = EXIT_UNREADABLE
            continue
        remedy = _suggest(diagnosis, getattr(args, "flags", None), facts)
        if args.json:
            print(json.dumps(_as_json(name, diagnosis, remedy), ensure_ascii=False), flush=True)
        else:
            print(_as_text(name, diagnosis, remedy), flush=True)
    return status


def _diagnose_file(name: str, exit_code: int | None) -> Diagnosis:
    classifier = Classifier()
    if name == "-":
        for line in _lines(sys.stdin.buffer):
            classifier.feed(line)
    else:
        with open(name, "rb") as stream:
            for line in _lines(stream):
                classifier.feed(line)
    return classifier.diagnose(exit_code)


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines of a byte stream in bounded memory (``\\r`` stays in; the classifier splits on it)."""
    rest = b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            for start in range(0, max(len(line), 1), _MAX_LINE):
                yield line[start:start + _MAX_LINE]
        while len(rest) > _MAX_LINE:
            yield rest[:_MAX_LINE]
            rest = rest[_MAX_LINE:]
    if rest:
        yield rest


def _facts(args: argparse.Namespace) -> dict[str, Any]:
    """The model's facts and the GPU's memory the daemon would have had (``--model``, ``--gpu-*``)."""
    model = getattr(args, "model", None)
    facts: dict[str, Any] = {"gpu_total_gib": getattr(args, "gpu_total_gib", None),
                             "gpu_free_gib": getattr(args, "gpu_free_gib", None)}
    if not model:
        return facts
    from supervisor.core.flags import Flags
    from supervisor.core.model import load_model_info
    from supervisor.core.plan import Sizing

    try:
        info = load_model_info(model, online=False)
    except Exception as e:  # noqa: BLE001 - a broken config.json must not hide the diagnosis
        print(f"vllm-guard diagnose: {model}: {type(e).__name__}: {e}", file=sys.stderr)
        info = None
    if info is None:
        print(f"vllm-guard diagnose: no config.json found for {model}; sizing from the log alone",
              file=sys.stderr)
        return facts
    try:
        gpus = Flags.parse(getattr(args, "flags", None) or "").world_size()
    except ValueError:       # unparseable --flags: the remedy step reports it
        gpus = 1
    facts["sizing"] = Sizing(info, gpus=gpus)
    return facts


def _suggest(diagnosis: Diagnosis, flags: str | None, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        from supervisor.core.remedy import suggest
    except ImportError:   # the remedy module is optional for offline diagnosis
        suggest = None
    if suggest is not None:
        try:
            return suggest(diagnosis, flags, **(facts or {}))
        except Exception as e:  # noqa: BLE001 - a remedy bug must not hide the diagnosis
            print(f"vllm-guard diagnose: no remedy ({type(e).__name__}: {e})", file=sys.stderr)
    healable = diagnosis.kind not in (Kind.CONFIG_ERROR, Kind.HEALTHY)
    return {"healable": healable, "flags": {}, "why": ""}


def _as_json(name: str, d: Diagnosis, remedy: dict[str, Any]) -> dict[str, Any]:
    fix = {"flags": dict(remedy.get("flags") or {}), "why": remedy.get("why", "")}
    if remedy.get("advice"):
        fix["advice"] = remedy["advice"]
    return {"file": name, "kind": d.kind.value, "healable": bool(remedy.get("healable")),
            "evidence": d.evidence, "numbers": d.numbers, "phase": d.phase, "detail": d.detail,
            "remedy": fix}


def _as_text(name: str, d: Diagnosis, remedy: dict[str, Any]) -> str:
    verdict = "healthy" if d.kind is Kind.HEALTHY else (
        f"{d.kind.value} ({'healable' if remedy.get('healable') else 'not healable'}, during {d.phase})")
    out = [f"{name}: {verdict}", f"  {d.detail}"]
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
