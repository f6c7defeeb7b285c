"""A config.json read as vLLM reads it: through the configuration class of its ``model_type``.

vLLM never reads config.json as written: ``transformers.AutoConfig`` builds the model type's
configuration class from it, and every key the file leaves out takes that class's default (Gemma
ties its embeddings, Gemma 3's text model has 262208 tokens and one global layer in six). So the
plan never reads a missing key as zero or false either. Two ways to the resolved config, the first
that works:

1. what transformers itself built in vLLM's own environment
   (:func:`supervisor.facts.vllm_install.resolved_config` prints it; :func:`from_transformers`
   takes it);
2. this module's fallback (:func:`with_defaults`): the defaults of the main families'
   configuration classes (:mod:`supervisor.core.config_defaults`, generated from transformers),
   the class's key aliases, nested configs resolved with their own class, and the classes'
   post-init rules (a derived ``layer_types``, Qwen's ``use_sliding_window``).

A model type neither knows is read as written (:attr:`Resolution.known` is False), and the plan's
band widens for it. Pure.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.config_defaults import DEFAULTS, TRANSFORMERS_VERSION

#: Nested configs a wrapper keeps its parts in (the language model, the vision tower).
SUB_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "vision_config", "audio_config")

#: Families whose sliding window transformers drops unless ``use_sliding_window`` is true.
_USE_SLIDING_WINDOW = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl_text", "qwen2_5_vl_text", "smollm3"}
#: ``layer_types`` when a config leaves it out: every n-th layer global, the rest sliding
#: (``(i + 1) % n`` slides), with n from ``sliding_window_pattern`` or the class's own default.
_ALTERNATING = {"gemma2": 2, "gpt_oss": 2, "gemma3_text": 6, "cohere2": 4}


@dataclass(frozen=True)
class Resolution:
    """A config as vLLM's transformers builds it, and where that came from."""

    config: dict[str, Any]
    source: str                      # said in the plan: "transformers 5.19.0 (vLLM's environment)", ...
    known: bool = True               # False: a model type neither transformers nor the table knew
    missing: tuple[str, ...] = field(default=())     # model types the fallback did not know (nested ones too)


def _fill(cfg: dict[str, Any], model_type: str, missing: list[str]) -> dict[str, Any]:
    """One (sub-)config with its class's aliases, defaults and post-init rules applied, in place."""
    entry = DEFAULTS.get(model_type)
    if entry is None:
        if model_type:
            missing.append(model_type)
        _derive(cfg, model_type)
        return cfg
    for alias, target in (entry.get("aliases") or {}).items():
        if alias in cfg and target not in cfg:
            cfg[target] = cfg[alias]
    for key, value in entry.items():
        if key in ("aliases", "sub_configs") or key in cfg:
            continue
        cfg[key] = copy.deepcopy(value)
    for key, sub_type in (entry.get("sub_configs") or {}).items():
        sub = cfg.get(key)
        if sub is None:
            sub = {}                 # the class builds a default part (e.g. a default vision tower)
        if isinstance(sub, dict):
            sub = dict(sub)
            cfg[key] = _fill(sub, str(sub.get("model_type") or sub_type), missing)
            cfg[key].setdefault("model_type", sub_type)
    _derive(cfg, model_type)
    return cfg


def _derive(cfg: dict[str, Any], model_type: str) -> None:
    """The post-init rules of the configuration classes (transformers' ``__post_init__``)."""
    heads = cfg.get("num_attention_heads")
    if cfg.get("num_key_value_heads") is None and isinstance(heads, int) and "num_hidden_layers" in cfg:
        cfg["num_key_value_heads"] = heads
    if cfg.get("head_dim") is None and isinstance(heads, int) and heads and isinstance(cfg.get("hidden_size"), int) \
            and model_type in DEFAULTS and "head_dim" in DEFAULTS[model_type]:
        cfg["head_dim"] = cfg["hidden_size"] // heads
    if model_type in ("deepseek_v2", "deepseek_v3") and isinstance(cfg.get("qk_rope_head_dim"), int):
        cfg["head_dim"] = cfg["qk_rope_head_dim"]      # DeepseekV2/V3Config: head_dim is the rope part
    layers = cfg.get("num_hidden_layers")
    if model_type in _USE_SLIDING_WINDOW and not cfg.get("use_sliding_window"):
        cfg["sliding_window"] = 0 if model_type == "qwen2_moe" else None
    if not isinstance(layers, int) or layers <= 0 or layers > 1 << 16 or cfg.get("layer_types") is not None:
        return
    if model_type in _ALTERNATING:
        n = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or _ALTERNATING[model_type]
        n = n if isinstance(n, int) and n > 0 else _ALTERNATING[model_type]
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]
    elif model_type == "llama4_text":
        interval = cfg.get("no_rope_layer_interval") or 4
        no_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        cfg["layer_types"] = ["chunked_attention" if r else "full_attention" for r in no_rope]


def with_defaults(raw: dict[str, Any]) -> Resolution:
    """The fallback: ``raw`` (a parsed config.json) with its family's transformers defaults."""
    cfg = copy.deepcopy(raw)
    missing: list[str] = []
    model_type = str(cfg.get("model_type") or "")
    _fill(cfg, model_type, missing)
    # A text-only config nested under another key than the class declares (llm_config, ...).
    for key in SUB_CONFIG_KEYS:
        sub = cfg.get(key)
        if isinstance(sub, dict) and not (DEFAULTS.get(model_type) or {}).get("sub_configs", {}).get(key) \
                and sub.get("model_type"):
            cfg[key] = _fill(dict(sub), str(sub["model_type"]), missing)
    known = model_type in DEFAULTS
    where = (f"the defaults of transformers {TRANSFORMERS_VERSION}'s {model_type} configuration (vLLM's "
             "environment was not asked)" if known else
             f"config.json as written (model type {model_type or 'not given'} is not in the plan's table)")
    return Resolution(cfg, where, known, tuple(missing))


def from_transformers(raw: dict[str, Any], resolved: dict[str, Any], version: str = "") -> Resolution:
    """What transformers built in vLLM's environment (``to_dict()`` of the config), with the parts of
    config.json it does not echo (a quantization block some versions keep aside) put back."""
    cfg = copy.deepcopy(resolved)
    for key in ("quantization_config", "compression_config", "torch_dtype", "dtype"):
        if key in raw and cfg.get(key) is None:
            cfg[key] = copy.deepcopy(raw[key])
    return Resolution(cfg, f"transformers {version or '(version unknown)'} in vLLM's environment", True)
