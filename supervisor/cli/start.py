"""``vllm-guard start [options] --model MODEL [-- VLLM_ARGS...]``: run the guard in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from supervisor import config
from supervisor.errors import EX_CONFIG


def add_parser(sub: Any) -> None:
    """Register ``start`` on an argparse subparsers object."""
    p = sub.add_parser(
        "start", help="launch vLLM and keep it healthy",
        description="Launch vLLM, name its failures, relaunch with the flags that fit, "
                    "and keep probing it. vLLM's own arguments go after `--`.",
        usage="vllm-guard start [options] --model MODEL [-- VLLM_ARGS...]")
    config.add_start_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the config, set up logging, run the guard until it stops; its exit code."""
    from supervisor.shell import logs
    from supervisor.shell.guard import Guard

    try:
        cfg = config.resolve(args, os.environ)
        cfg.endpoint()
    except config.ConfigError as e:
        print(f"vllm-guard: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    live = None
    if not cfg.quiet and sys.stderr.isatty():
        from supervisor.shell.live import LiveLine, proxy

        live = LiveLine(sys.stderr)
        logs.configure_logging(level="info", stream=proxy(live))
    else:
        logs.configure_logging(level="info")
    guard = Guard(cfg, live=live)
    try:
        return asyncio.run(guard.run())
    except KeyboardInterrupt:      # a second Ctrl-C while stopping
        return 130
