"""Find a model's config.json and weight files: a local directory, the Hugging Face cache, or the Hub.

The shell around :mod:`supervisor.core.model`: config.json from a local path or the HF cache
(never downloading weights), else, when online, from the Hub with a short timeout; the weights'
size from the safetensors index, else the files. Given vLLM's interpreter, the config is resolved
by that environment's transformers, as vLLM will resolve it
(:func:`supervisor.facts.vllm_install.resolved_config`); otherwise, or where it cannot, by the
plan's table of the configuration classes' defaults. Nothing here raises for missing data:
unknown is ``None``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping
from typing import Any, cast

import structlog

from supervisor.core.model import ModelInfo, model_info_from_config
from supervisor.core.model_config import Resolution, from_transformers
from supervisor.errors import ConfigError
from supervisor.facts import vllm_install
from supervisor.named_files import read_named_optional

log = structlog.get_logger("vllm-guard")

#: A model's JSON files are read through the door for files a person names (a FIFO planted as config.json
#: is refused at once, never waited on) and never past these bounds: config.json is a few KiB; the
#: safetensors index of the largest checkpoints (one line per tensor, ~100k tensors) a few MiB.
MAX_CONFIG_JSON = 16 << 20
MAX_INDEX_JSON = 64 << 20


def _read_model_file(path: str, what: str, limit: int) -> bytes | None:
    """The bytes of a model's file, None when absent or not one to read (said once in the log, naming it)."""
    try:
        return read_named_optional(path, what, limit, f"{limit >> 20} MiB")
    except ConfigError as e:
        log.warning(f"{e}; the model's facts go without it")
        return None


def hf_hub_cache() -> str:
    """The Hugging Face hub cache directory, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.path.join(home, "hub")


def _snapshot_dir(model_id: str, revision: str | None) -> str | None:
    repo = os.path.join(hf_hub_cache(), "models--" + model_id.replace("/", "--"))
    if not os.path.isdir(repo):
        return None
    ref = os.path.join(repo, "refs", revision or "main")
    raw = _read_model_file(ref, "the Hugging Face cache's ref", 4096) if os.path.isfile(ref) else None
    if raw is not None:
        commit = raw.decode("utf-8", errors="replace").strip()
        candidate = os.path.join(repo, "snapshots", commit)
        if os.path.isfile(os.path.join(candidate, "config.json")):
            return candidate
    if revision and os.path.isfile(os.path.join(repo, "snapshots", revision, "config.json")):
        return os.path.join(repo, "snapshots", revision)
    found = glob.glob(os.path.join(repo, "snapshots", "*", "config.json"))
    if not found:
        return None
    return os.path.dirname(max(found, key=os.path.getmtime))


def weights_bytes_in(directory: str) -> tuple[int | None, str]:
    """Checkpoint bytes from the safetensors index, else the *.safetensors (or *.bin) file sizes."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        p = os.path.join(directory, index)
        raw = _read_model_file(p, "the model's weight index", MAX_INDEX_JSON)
        if raw is None:
            continue
        try:
            total = json.loads(raw.decode("utf-8")).get("metadata", {}).get("total_size")
            if isinstance(total, (int, float)) and total > 0:
                return int(total), "index"
        except (ValueError, AttributeError, RecursionError):
            continue
    for pattern in ("*.safetensors", "*.bin"):
        files = glob.glob(os.path.join(directory, pattern))
        sizes = []
        for p in files:
            try:
                sizes.append(os.stat(p).st_size)   # follows the hub cache's blob symlinks
            except OSError:
                pass
        if sizes and sum(sizes) > 0:
            return sum(sizes), "files"
    return None, ""


def _offline() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def fetch_config(model_id: str, revision: str | None = None, timeout: float = 3.0) -> dict[str, Any] | None:
    """config.json from the Hugging Face Hub, or None at the first sign of trouble (no network, 401, 404)."""
    try:
        import httpx
    except ImportError:
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{model_id}/resolve/{revision or 'main'}/config.json"
    headers = {}
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        r = httpx.get(url, headers=headers, timeout=timeout, follow_redirects=True)
        if r.status_code != 200:
            return None
        data = r.json()
        return data if isinstance(data, dict) else None
    except Exception:   # any network or decode failure means "not available", never an error
        return None


def _read_json(path: str) -> dict[str, Any] | None:
    raw = _read_model_file(path, "the model's config", MAX_CONFIG_JSON)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):      # UnicodeDecodeError is a ValueError too
        log.warning(f"the model's config {path} is not valid JSON; the model's facts go without it")
        return None
    return data if isinstance(data, dict) else None


#: Quantization settings some checkpoints keep beside config.json, and the method each file implies.
_QUANT_FILES = (("quantize_config.json", "gptq"), ("quant_config.json", "awq"))


def _with_quantization_file(config: dict[str, Any], directory: str) -> dict[str, Any]:
    """config.json with the quantization settings of a side file (older GPTQ/AWQ checkpoints), as vLLM reads them."""
    if isinstance(config.get("quantization_config"), dict):
        return config
    for name, method in _QUANT_FILES:
        side = _read_json(os.path.join(directory, name))
        if side:
            return {**config, "quantization_config": {"quant_method": method, **side}}
    return config


def _resolution(config: dict[str, Any], directory: str, python: str | None,
                environ: Mapping[str, str] | None) -> Resolution | None:
    """The config as vLLM's transformers builds it, when its interpreter is given and can say."""
    if not python:
        return None
    found = vllm_install.resolved_config(python, directory, environ)
    if found is None:
        return None
    return from_transformers(config, found.config, found.transformers_version)


def load_model_info(model: str, *, revision: str | None = None, online: bool | None = None,
                    python: str | None = None, environ: Mapping[str, str] | None = None) -> ModelInfo | None:
    """ModelInfo for a local dir, a config.json path, or a Hub id (cache first, then the Hub if online); None
    if unreadable. ``python``: vLLM's interpreter (``vllm_install.installed(...).python``), whose transformers
    resolves the config (in ``environ``, vLLM's environment); without it the plan's table does."""
    if not model:
        return None
    path = os.path.expanduser(model)
    if os.path.isfile(path) and os.path.basename(path).endswith(".json"):
        directory: str | None = os.path.dirname(os.path.abspath(path))
        config = _read_json(path)
    elif os.path.isdir(path):
        directory = os.path.abspath(path)
        config = _read_json(os.path.join(directory, "config.json"))
    else:
        directory = _snapshot_dir(model, revision) if model.count("/") == 1 else None
        config = _read_json(os.path.join(directory, "config.json")) if directory else None
        if config is None:
            if online is None:
                online = not _offline()
            if not online or _offline() or model.count("/") != 1:
                return None
            config = fetch_config(model, revision)
            if config is None:
                return None
            return model_info_from_config(config, name=model, path=None)
    if config is None:
        return None
    directory = cast(str, directory)      # None only where config is None too
    config = _with_quantization_file(config, directory)
    weights, source = weights_bytes_in(directory)
    # A config file given under another name is not what transformers would load from its directory.
    named = os.path.isfile(path) and os.path.basename(path) != "config.json"
    res = None if named else _resolution(config, directory, python, environ)
    return model_info_from_config(config, name=model, path=directory, weights_bytes=weights, weights_source=source,
                                  resolution=res)
