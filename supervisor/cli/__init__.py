"""``vllm-guard``: serve | start | diagnose | plan | status | restart | stop | history | logs | ps | completion.

Errors become exit codes only here (the codes and their meaning: :mod:`supervisor.errors`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from supervisor import __version__
from supervisor.errors import EX_OK, EX_USAGE


def build_parser() -> argparse.ArgumentParser:
    from supervisor.cli import client, completion, diagnose, plan, start

    parser = argparse.ArgumentParser(
        prog="vllm-guard",
        description="A self-healing supervisor for the vLLM OpenAI-compatible server.",
        epilog="Exit codes: 0 stopped on request; 1 a client command failed; 2 usage; 3 `plan`: does not fit; "
               "70 a bug in vllm-guard; 75 gave up (remedies or launch budget spent; may work later); "
               "78 a configuration a person must change.")
    parser.add_argument("--version", action="version", version=f"vllm-guard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start.add_parser(sub)
    diagnose.add_parser(sub)
    plan.add_parser(sub)
    client.add_parsers(sub)
    completion.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from supervisor.cli import start
    from supervisor.secrets import REGISTRY

    # Once, at the entry: whatever this process prints, logs, keeps or sends from now on has the
    # secrets of its environment and of its command line (vLLM's flags after `--` included) masked.
    REGISTRY.add_environ(os.environ)
    REGISTRY.add_argv(argv)

    try:
        if argv and argv[0] == "serve":           # vLLM's command line, unchanged: no parsing here
            return start.serve(argv[1:])
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            if getattr(args, "command", None) == "start":      # vLLM's flags without `--`, most likely
                print(start.unrecognized_hint(argv[argv.index(extra[0]):]), file=sys.stderr)
                return EX_USAGE
            parser.parse_args(argv)               # argparse's own error for the other commands
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return EX_USAGE
        return int(func(args) or EX_OK)
    except BrokenPipeError:                       # `vllm-guard logs | head`
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
