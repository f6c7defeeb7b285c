"""``vllm-guard``: start | diagnose | plan | status | restart | stop.

Errors become exit codes only here (the codes and their meaning: :mod:`supervisor.errors`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from supervisor import __version__
from supervisor.errors import EX_OK, EX_USAGE


def build_parser() -> argparse.ArgumentParser:
    from supervisor.cli import client, diagnose, plan, start

    parser = argparse.ArgumentParser(
        prog="vllm-guard",
        description="A self-healing supervisor for the vLLM OpenAI-compatible server.")
    parser.add_argument("--version", action="version", version=f"vllm-guard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start.add_parser(sub)
    diagnose.add_parser(sub)
    plan.add_parser(sub)
    helps = {"status": "show the running guard's state (--json for everything)",
             "restart": "relaunch vLLM now (--reset: with the flags you asked for)",
             "stop": "stop the guard and vLLM"}
    for command, text in helps.items():
        p = sub.add_parser(command, help=text, description=text)
        client.add_client_arguments(p, command)
        p.set_defaults(func=lambda args, c=command: client.run_client(c, args, os.environ))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EX_USAGE
    try:
        return int(func(args) or EX_OK)
    except BrokenPipeError:
        return EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
