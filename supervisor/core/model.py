"""What vLLM will see of a model: its config.json shape, context rules and weight size.

Pure: a parsed config.json in, :class:`ModelInfo` out (:func:`model_info_from_config`), and the
context length vLLM derives from it (:func:`derive_max_model_len`). Finding config.json and the
weight files is :mod:`supervisor.facts.model_files`. Nothing here raises for missing data:
unknown is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.core import vllm

#: config.json dtype names -> bytes per element.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8,
               "fp8": 1, "float8_e4m3fn": 1, "int8": 1}

#: The keys vLLM scans for the context length, smallest wins (``derive_max_model_len_and_key``).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")

#: RoPE types whose factor vLLM never multiplies into the derived length.
_ROPE_NO_SCALE = {"su", "longrope", "llama3"}
#: YaRN variants: scaled (original x factor) up to 0.29, left alone from 0.30 (PR #56446).
_ROPE_YARN = {"yarn", "deepseek_yarn", "deepseek_llama_scaling"}


@dataclass(frozen=True)
class ModelInfo:
    """The facts about one model that size its memory under vLLM."""

    name: str
    path: str | None
    architectures: tuple[str, ...]
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int                       # the checkpoint's torch_dtype (AWQ/GPTQ: the fp16 activations)
    torch_dtype: str
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None      # only when vLLM would use it (Qwen2 use_sliding_window=false -> None)
    layer_types: tuple[str, ...] = ()      # "full_attention" / "sliding_attention" per layer, when known
    max_len_keys: dict[str, int] = field(default_factory=dict)
    rope_scaling: dict[str, Any] | None = None
    derived_max_model_len: int = 2048      # with the newest vLLM rules; see derive_max_model_len for others
    weights_bytes: int | None = None       # whole checkpoint, all ranks together
    weights_source: str = ""               # "index", "files", "estimate" or ""
    quantization: str | None = None        # "awq", "gptq", "fp8", "compressed-tensors", "mxfp4", ...
    num_experts: int = 0

    @property
    def sliding_layers(self) -> int:
        """How many layers keep only a sliding window of KV (under vLLM's hybrid manager)."""
        if self.layer_types:
            return sum(1 for t in self.layer_types if "sliding" in t)
        return self.num_layers if self.sliding_window else 0

    @property
    def full_layers(self) -> int:
        """How many layers keep KV for every token."""
        return self.num_layers - self.sliding_layers


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model under text_config (or llm_config)."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub.get("num_hidden_layers"):
            merged = dict(sub)
            # Fields the wrapper holds but the text part omits (dtype, quantization).
            for k in ("torch_dtype", "dtype", "quantization_config"):
                if k not in merged and k in config:
                    merged[k] = config[k]
            return merged
    return config


def _rope(cfg: dict[str, Any]) -> dict[str, Any] | None:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return None
    rope = dict(rope)
    rope.setdefault("rope_type", rope.get("type", "default"))
    return rope


def derive_max_model_len(info: ModelInfo, vllm_version: str | None = None, *,
                         disable_sliding_window: bool = False) -> int:
    """The max_model_len vLLM derives from config.json (``_get_and_verify_max_len``); newest rules
    when the version is unknown. ``disable_sliding_window``: vLLM's flag of that name, which caps
    the length at the window."""
    ver = vllm.rules(vllm_version)
    keys = info.max_len_keys
    derived: float = min(keys.values()) if keys else float("inf")
    if "model_max_length" in keys and ver >= vllm.MODEL_MAX_LENGTH_REPLACES_SINCE:
        derived = keys["model_max_length"]          # Command-R style: replaces, not min
    if disable_sliding_window and info.sliding_window and info.sliding_window < derived:
        derived = info.sliding_window
    if derived == float("inf"):
        derived = 2048
    rope = info.rope_scaling
    if rope and "gemma3" not in info.model_type:
        rtype = rope.get("rope_type") or "default"
        factor = rope.get("factor") or 1.0
        if rtype in _ROPE_YARN:
            if ver < vllm.YARN_UNSCALED_SINCE:
                derived = rope.get("original_max_position_embeddings", derived) * factor
        elif rtype not in _ROPE_NO_SCALE and rtype not in ("default", "mrope"):
            derived *= factor
    return int(derived)


def _quantization(cfg: dict[str, Any]) -> tuple[str | None, float | None]:
    """(method, bytes per quantized weight) from quantization_config; (None, None) when unquantized."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, dict):
        return None, None
    method = str(qc.get("quant_method") or qc.get("format") or "unknown").lower()
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        group = group if group > 0 else 4096
        # packed weight + int32-packed zeros + fp16 scales per group
        return method.replace("_marlin", ""), bits / 8 + bits / 8 / group + 2 / group
    if method == "fp8":
        return "fp8", 1.0
    if method == "mxfp4":
        return "mxfp4", 4.25 / 8           # 4-bit values + one e8m0 scale per 32
    if method == "compressed-tensors":
        bits = 8
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {} if isinstance(group, dict) else {}
            bits = int(weights.get("num_bits") or bits)
        return "compressed-tensors", bits / 8 + (2 / 128 if bits < 8 else 0)
    if method in ("bitsandbytes", "bnb"):
        return "bitsandbytes", 0.5 if qc.get("load_in_4bit") else 1.0
    return method, None


def estimate_params(info: ModelInfo, cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters in quantizable linear layers, other parameters) from the shapes; an estimate."""
    h, L, v = info.hidden_size, info.num_layers, info.vocab_size
    heads = info.num_attention_heads or 1
    if info.mla:
        nope = int(cfg.get("qk_nope_head_dim") or 128)
        v_dim = int(cfg.get("v_head_dim") or 128)
        q_lora = cfg.get("q_lora_rank")
        q = (h * q_lora + q_lora * heads * (nope + info.qk_rope_head_dim)) if q_lora else h * heads * (nope + info.qk_rope_head_dim)
        attn = (q + h * (info.kv_lora_rank + info.qk_rope_head_dim)
                + info.kv_lora_rank * heads * (nope + v_dim) + heads * v_dim * h)
    else:
        attn = 2 * h * heads * info.head_dim + 2 * h * info.num_kv_heads * info.head_dim
    experts = info.num_experts
    if experts:
        moe_i = int(cfg.get("moe_intermediate_size") or info.intermediate_size)
        shared = int(cfg.get("n_shared_experts") or 0)
        dense_first = int(cfg.get("first_k_dense_replace") or 0)
        moe = (experts + shared) * 3 * h * moe_i
        mlp_total = dense_first * 3 * h * info.intermediate_size + (L - dense_first) * moe
    else:
        mlp_total = L * 3 * h * info.intermediate_size
    linear = L * attn + mlp_total
    embeddings = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return linear, embeddings + L * 2 * h + h


def model_info_from_config(config: dict[str, Any], *, name: str = "", path: str | None = None,
                           weights_bytes: int | None = None, weights_source: str = "") -> ModelInfo | None:
    """Build a ModelInfo from a parsed config.json (pure); None when it has no transformer shape."""
    cfg = _text_config(config)
    try:
        layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers") or 0)
        hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model") or 0)
        heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 0)
    except (TypeError, ValueError):
        return None
    if not layers or not hidden or not heads:
        return None
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.get("multi_query_group_num") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    torch_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    mla = bool(cfg.get("kv_lora_rank")) and cfg.get("qk_rope_head_dim") is not None
    sliding = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not isinstance(sliding, int):
        sliding = None
    layer_types = tuple(str(t) for t in (cfg.get("layer_types") or ()))
    pattern = cfg.get("sliding_window_pattern") or (2 if cfg.get("model_type") == "gemma2" else 0)
    if not layer_types and sliding and isinstance(pattern, int) and pattern > 1:
        # Gemma 2/3 interleave: every pattern-th layer is global, the rest slide.
        layer_types = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                            for i in range(layers))
    if layer_types and not any("sliding" in t for t in layer_types):
        layer_types = ()
    if layer_types and sliding is None:
        layer_types = ()                    # a pattern without a window: every layer is full
    keys = {k: int(cfg[k]) for k in MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float))}
    method, _ = _quantization(cfg)
    info = ModelInfo(
        name=name or str(config.get("_name_or_path") or ""),
        path=path,
        architectures=tuple(config.get("architectures") or cfg.get("architectures") or ()),
        model_type=str(config.get("model_type") or cfg.get("model_type") or ""),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden),
        vocab_size=int(cfg.get("vocab_size") or 32000),
        dtype_bytes=DTYPE_BYTES.get(torch_dtype, 2),
        torch_dtype=torch_dtype,
        mla=mla,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        sliding_window=sliding,
        layer_types=layer_types,
        max_len_keys=keys,
        rope_scaling=_rope(cfg),
        weights_bytes=weights_bytes,
        weights_source=weights_source,
        quantization=method,
        num_experts=int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0),
    )
    info = replace(info, derived_max_model_len=derive_max_model_len(info))
    if info.weights_bytes is None:
        linear, other = estimate_params(info, cfg)
        _, qbytes = _quantization(cfg)
        per_linear = qbytes if qbytes is not None else info.dtype_bytes
        info = replace(info, weights_bytes=int(linear * per_linear + other * min(info.dtype_bytes, 2)),
                        weights_source="estimate")
    return info
