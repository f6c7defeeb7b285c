"""``vllm-guard``: start | diagnose | plan | status | restart | stop.

Errors become exit codes only here: 0 ok, 1 client error, 2 usage, 75 remedies or budget
exhausted (EX_TEMPFAIL), 78 configuration vLLM refuses (EX_CONFIG).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Sequence

from supervisor import __version__


def _add_start(sub: argparse._SubParsersAction) -> None:
    from supervisor import config

    p = sub.add_parser(
        "start", help="launch vLLM and keep it healthy",
        description="Launch vLLM, name its failures, relaunch with the flags that fit, "
                    "and keep probing it. vLLM's own arguments go after `--`.",
        usage="vllm-guard start [options] --model MODEL [-- VLLM_ARGS...]")
    config.add_start_arguments(p)
    p.set_defaults(func=_run_start)


def _run_start(args: argparse.Namespace) -> int:
    from supervisor import config
    from supervisor.shell import logs
    from supervisor.shell.guard import Guard, vllm_endpoint

    try:
        cfg = config.resolve(args, os.environ)
        vllm_endpoint(cfg)
    except config.ConfigError as e:
        print(f"vllm-guard: configuration error: {e}", file=sys.stderr)
        return 78
    live = None
    if not cfg.quiet and sys.stderr.isatty():
        from supervisor.shell.live import LiveLine, proxy

        live = LiveLine(sys.stderr)
        logs.configure_logging(level=getattr(args, "log_level", None) or "info", stream=proxy(live))
    else:
        logs.configure_logging(level=getattr(args, "log_level", None) or "info")
    guard = Guard(cfg, live=live)
    try:
        return asyncio.run(guard.run())
    except KeyboardInterrupt:      # a second Ctrl-C while stopping
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-guard",
        description="A self-healing supervisor for the vLLM OpenAI-compatible server.")
    parser.add_argument("--version", action="version", version=f"vllm-guard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_start(sub)
    from supervisor.cli import diagnose as cli_diagnose
    from supervisor.cli import plan as cli_plan

    cli_diagnose.add_parser(sub)
    cli_plan.add_parser(sub)
    _add_clients(sub)
    return parser


def _add_clients(sub: argparse._SubParsersAction) -> None:
    from supervisor.cli import client as cli_client

    helps = {"status": "show the running guard's state (--json for everything)",
             "restart": "relaunch vLLM now (--reset: with the flags you asked for)",
             "stop": "stop the guard and vLLM"}
    for command, text in helps.items():
        p = sub.add_parser(command, help=text, description=text)
        cli_client.add_client_arguments(p, command)
        p.set_defaults(func=lambda args, c=command: cli_client.run_client(c, args, os.environ))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
