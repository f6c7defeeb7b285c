"""Before the first launch: the facts the early refusals need (does the model path exist, which options
does the installed vLLM have), and the refusal itself (:func:`check`), shared by ``start``, ``serve``
and ``--dry-run``. The decisions are :mod:`supervisor.core.preflight`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from supervisor.config import GUARD_OPTION_VARS, GuardConfig
from supervisor.core import preflight, vllm_options
from supervisor.core.flags import Flags
from supervisor.errors import ConfigError
from supervisor.facts import vllm_install


def installed_options(cfg: GuardConfig, environ: Mapping[str, str]) -> tuple[vllm_options.Options | None, str]:
    """The options of the vLLM ``cfg`` runs: from the table, else asked of that vLLM; ``(None, why)``
    when neither can tell (then nothing is refused for a flag)."""
    found = vllm_install.installed(cfg.vllm_argv, environ)
    if found is None:
        return None, "the installed vLLM's version could not be read, so its flags are not checked before the launch"
    options = vllm_options.for_version(found.version)
    if options is not None:
        return options, ""
    dump, why = vllm_install.parser_options(cfg.vllm_argv, environ)
    options = vllm_options.from_dump(dump, found.version) if dump else None
    if options is None:
        return None, (f"vLLM {found.version} is not in vllm-guard's table of vLLM options and {why or 'it gave none'}"
                      "; its flags are not checked before the launch")
    return options, f"vLLM {found.version} is not in vllm-guard's table of vLLM options: its options were read from it"


def check(cfg: GuardConfig, environ: Mapping[str, str]) -> list[str]:
    """Refuse (:class:`ConfigError`, exit 78) what the installed vLLM would refuse after a whole start-up:
    a flag it does not have, a local model path that does not exist. Returns notes for the log."""
    problems = []
    for what, name in (("model", cfg.model), ("--tokenizer", Flags.parse(list(cfg.vllm_args)).get("--tokenizer"))):
        if name:
            missing = preflight.missing_local_path(name, os.path.exists(os.path.expanduser(name)))
            if missing:
                problems.append(f"{what} {missing}")
    options, note = installed_options(cfg, environ)
    if options is not None:
        problems += preflight.flag_problems(cfg.vllm_args, options, guard_options=GUARD_OPTION_VARS)
        if cfg.vllm_file_args:
            where = f"vLLM's --config file {Flags.parse(list(cfg.vllm_args)).get('--config')}"
            problems += preflight.flag_problems(cfg.vllm_file_args, options, where=where)
    if problems:
        raise ConfigError("; ".join(problems) + " (no launch was made)")
    return [note] if note else []
