"""``vllm-guard start`` and ``vllm-guard serve``: run the guard in the foreground.

``serve MODEL [vLLM's flags]`` is ``vllm serve``'s command line, unchanged: every argument goes to
vLLM but the guard's own options vLLM has none of (``--dry-run``, ``--state-dir`` ...), and the
guard's settings come from its config file and ``VLLM_GUARD_*`` variables too.
``start [guard options] --model MODEL [-- vLLM's flags]`` takes the guard's options on the
command line too. ``--dry-run`` prints what the first launch would be, and why, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import sys
from collections.abc import Sequence
from typing import Any, TextIO, cast

from supervisor import config
from supervisor.errors import EX_OK, EX_USAGE, GuardError
from supervisor.secrets import REGISTRY

SERVE_HELP = """usage: vllm-guard serve MODEL [vLLM's own flags...]

Run vLLM's OpenAI server under vllm-guard: `vllm serve`'s command line, unchanged. Every argument
goes to vLLM (vLLM's --config YAML included, which the guard reads to know its values), except the
guard's own options that vLLM has none of (--dry-run, --state-dir, --status-port, --notify-url, a
--config FILE.toml ...: see `vllm-guard start --help`), which the guard takes. Its settings also
come from its config file ($VLLM_GUARD_CONFIG, ~/.config/vllm-guard/config.toml or
/etc/vllm-guard/config.toml) and VLLM_GUARD_* variables, e.g.

  VLLM_GUARD_STATE_DIR=/var/lib/vllm-guard  VLLM_GUARD_STATUS_PORT=8077  VLLM_GUARD_VLLM_COMMAND="vllm serve"
  VLLM_GUARD_NOTIFY_URL=https://hooks.example/...  VLLM_GUARD_LOG_FORMAT=json  VLLM_GUARD_DRY_RUN=1

Example:  vllm-guard serve Qwen/Qwen2.5-7B-Instruct --port 8000 --max-model-len 32768
"""


def add_parser(sub: Any) -> None:
    """Register ``start`` and ``serve`` on an argparse subparsers object."""
    p = sub.add_parser(
        "start", help="launch vLLM and keep it healthy (guard options, then vLLM's after --)",
        description="Launch vLLM, name its failures, relaunch with the flags that fit, and keep probing it. "
                    "vLLM's own arguments go after `--` (or use `vllm-guard serve MODEL ...`).",
        usage="vllm-guard start [options] --model MODEL [-- VLLM_ARGS...]")
    config.add_start_arguments(p)
    p.add_argument("--dry-run", action="store_true", default=None,
                   help="print the command the first launch would run and why each flag changed, then exit")
    p.set_defaults(func=run)
    s = sub.add_parser("serve", help="`vllm serve MODEL [flags]`, unchanged, under the guard", add_help=False)
    s.set_defaults(func=lambda args: serve(getattr(args, "rest", [])))


def _guard_options_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    config.add_start_arguments(p)
    p.add_argument("--dry-run", action="store_true", default=None)
    return p


def serve(argv: Sequence[str]) -> int:
    """``vllm-guard serve MODEL [vLLM's flags]``: the guard's own options vLLM has none of are taken."""
    from supervisor.core import vllm_options

    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(SERVE_HELP, end="", file=sys.stdout if argv else sys.stderr)
        return EX_OK if argv else EX_USAGE
    known = vllm_options.all_options()
    guard, rest, notes = config.split_serve_args(argv, known.__contains__)
    for text in notes:
        print(f"vllm-guard serve: {text}", file=sys.stderr)
    args = _guard_options_parser("vllm-guard serve").parse_args(guard)    # a bad value: argparse's exit 2
    args.vllm_args = rest
    if not args.dry_run:
        args.dry_run = os.environ.get("VLLM_GUARD_DRY_RUN", "").lower() in ("1", "true", "yes", "on")
    return run(args)


def unrecognized_hint(extra: Sequence[str]) -> str:
    """The error for guard options argparse did not know: most often vLLM flags without ``--``."""
    shown = " ".join(REGISTRY.argv(extra))
    return (f"vllm-guard start: unrecognized arguments: {shown}\n"
            f"  vLLM's own flags go after `--`:  vllm-guard start --model MODEL -- {shown}\n"
            f"  or, as with `vllm serve`:        vllm-guard serve MODEL {shown}")


def run(args: argparse.Namespace) -> int:
    """Resolve the config, set up logging, run the guard until it stops; its exit code."""
    from supervisor.shell import logs
    from supervisor.shell.guard import Guard

    try:
        cfg = config.resolve(args, os.environ)
        cfg.endpoint()
    except config.ConfigError as e:
        print(REGISTRY.text(f"vllm-guard: configuration error: {e}"), file=sys.stderr)
        return e.exit_code
    REGISTRY.add_argv(cfg.vllm_args)
    REGISTRY.add_argv(cfg.vllm_file_args)     # vLLM's --config YAML, as the arguments vLLM makes of it
    if getattr(args, "dry_run", None):
        return dry_run(cfg)
    live = None
    as_json = {"json": True, "console": False}.get(cfg.log_format)
    if not cfg.quiet and sys.stderr.isatty() and as_json is not True:
        from supervisor.shell.live import attach

        live, stream = attach()
        logs.configure_logging(json=as_json, level=cfg.log_level, stream=cast(TextIO, stream))
    else:
        logs.configure_logging(json=as_json, level=cfg.log_level)
    guard = Guard(cfg, live=live)
    try:
        return asyncio.run(guard.run())
    except KeyboardInterrupt:      # a second Ctrl-C while stopping
        return 130
    finally:
        if live is not None:
            live.close()


def dry_run(cfg: config.GuardConfig) -> int:
    """The first launch the guard would make here and now, each changed flag with its reason."""
    from supervisor import facts
    from supervisor.core.session import Session
    from supervisor.facts import preflight
    from supervisor.facts.nvml import NvmlProvider
    from supervisor.shell import learned

    try:
        checked = preflight.check(cfg, os.environ)
        gathered = facts.gather(cfg, os.environ, NvmlProvider())
        state_dir = os.path.abspath(os.path.expanduser(cfg.state_dir or config.default_state_dir(os.environ)))
        found, _key = (learned.learned_facts(cfg, gathered.facts, state_dir) if cfg.plan.learn
                       else (gathered.facts, None))
    except GuardError as e:
        what = "configuration error: " if isinstance(e, config.ConfigError) else ""
        print(REGISTRY.text(f"vllm-guard: {what}{e}"), file=sys.stderr)
        return e.exit_code
    for text in [*checked, *gathered.notes, *gathered.warnings]:
        print(REGISTRY.text(f"# {text}"))
    session = Session(cfg, found, rng=random.Random(0))
    step = session.first_launch()
    flags, dropped = session.launching()
    print(shlex.join(REGISTRY.argv(cfg.launch_argv(flags))))
    for text in dropped:
        print(REGISTRY.text(f"# {text}"))
    if not session.notes:
        print(f"# the flags as given ({step.why})")
    for name, note in session.notes.items():
        shown = "(removed)" if note.value is None else (note.value or "(on)")
        print(REGISTRY.text(f"# {name} {note.was or '(unset)'} -> {shown}  [{note.source}] {note.text}"))
    return EX_OK
