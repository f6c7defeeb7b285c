"""What vLLM will see of a model: its config's shape, context rules and weight size.

Pure: a parsed config.json in -- resolved as vLLM's transformers resolves it
(:mod:`supervisor.core.model_config`: a missing key is the configuration class's default, never
zero or false) -- :class:`ModelInfo` out (:func:`model_info_from_config`), and the context length
vLLM derives from it (:func:`derive_max_model_len`). Finding config.json and the weight files is
:mod:`supervisor.facts.model_files`. Nothing here raises for missing data: unknown is ``None``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.core import vllm
from supervisor.core.model_config import Resolution, with_defaults

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
    sliding_window: int | None = None      # only when vLLM uses it (Qwen2 use_sliding_window=false -> None)
    layer_types: tuple[str, ...] = ()      # per layer, where vLLM mixes attention types (interleaved)
    max_len_keys: dict[str, int] = field(default_factory=dict)
    rope_scaling: dict[str, Any] | None = None
    derived_max_model_len: int = 2048      # with the newest vLLM rules; see derive_max_model_len for others
    weights_bytes: int | None = None       # whole checkpoint, all ranks together
    weights_source: str = ""               # "index", "files", "estimate" or ""
    quantization: str | None = None        # "awq", "gptq", "fp8", "compressed-tensors", "mxfp4", ...
    num_experts: int = 0
    attention_chunk_size: int | None = None    # Llama 4's chunked local attention layers
    config_source: str = ""                # how the config was resolved (Resolution.source)
    config_known: bool = True              # False: a model type neither transformers nor the table knew
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)   # the resolved config

    @functools.cached_property
    def shape(self) -> Shape:
        """The shape the weight and activation formulas read (from the config, else these fields)."""
        if self.config:
            return shape_from_config(self.config)
        return Shape(model_type=self.model_type, layers=self.num_layers, hidden=self.hidden_size,
                     heads=self.num_attention_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                     intermediate=self.intermediate_size, vocab=self.vocab_size, mla=self.mla,
                     kv_lora_rank=self.kv_lora_rank, qk_rope=self.qk_rope_head_dim, experts=self.num_experts,
                     rotary_dim=self.head_dim)

    @property
    def weights_exact(self) -> bool:
        """The checkpoint's size was read (index or files), not estimated from the shapes."""
        return self.weights_source in ("index", "files")

    @property
    def sliding_layers(self) -> int:
        """How many layers keep only a sliding window of KV (under vLLM's hybrid manager)."""
        if self.layer_types:
            return sum(1 for t in self.layer_types if "sliding" in t)
        return self.num_layers if self.sliding_window else 0

    @property
    def chunked_layers(self) -> int:
        """How many layers keep only their attention chunk (Llama 4's local layers)."""
        return sum(1 for t in self.layer_types if "chunked" in t)

    @property
    def full_layers(self) -> int:
        """How many layers keep KV for every token."""
        return self.num_layers - self.sliding_layers - self.chunked_layers


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a (resolved) config: ``text_config`` (or ``llm_config``,
    ``language_config``) of a multimodal wrapper, else the config itself; the wrapper's dtype and
    quantization block added where the part leaves them out (vLLM reads them from the wrapper)."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub.get("num_hidden_layers"):
            merged = dict(sub)
            for k in ("torch_dtype", "dtype", "quantization_config", "compression_config"):
                if merged.get(k) is None and config.get(k) is not None:
                    merged[k] = config[k]
            if "tie_word_embeddings" not in merged and "tie_word_embeddings" in config:
                merged["tie_word_embeddings"] = config["tie_word_embeddings"]   # an unresolved part only
            return merged
    return config


def _rope(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The RoPE scaling vLLM applies to the full-attention layers (transformers 5's per-layer-type
    ``rope_parameters``: the ``full_attention`` entry)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
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


def _quantization(cfg: dict[str, Any]) -> str | None:
    """The quantization method config.json names (``quant_method``), or None when unquantized."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or qc.get("format") or "unknown").lower()
    return method.replace("_marlin", "") if method in ("awq_marlin", "gptq_marlin") else (
        "bitsandbytes" if method == "bnb" else method)


def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    """The first of ``keys`` that holds a number (a resolved config spells some fields two ways)."""
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v == v:
            return int(v)
    return default


def attention_layout(cfg: dict[str, Any]) -> tuple[tuple[str, ...], int | None, int | None]:
    """(layer types where they differ, sliding window, attention chunk) as vLLM builds the KV specs.

    vLLM gives each layer its own window only where the text config's ``layer_types`` mixes types
    (``transformers_utils.config.is_interleaved``: Gemma 2/3, gpt-oss, Llama 4's chunked layers);
    otherwise the config's ``sliding_window`` is the model-wide window of every layer
    (``EngineArgs.create_engine_config`` sets ``CacheConfig.sliding_window``), and 0 means none
    (``ModelConfig.__post_init__``).
    """
    window = cfg.get("sliding_window")
    window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
    chunk = cfg.get("attention_chunk_size")
    chunk = chunk if isinstance(chunk, int) and chunk > 0 else None
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    types = cfg.get("layer_types")
    if isinstance(types, (list, tuple)) and len(set(map(str, types))) > 1 and len(types) == layers:
        out = []
        for t in map(str, types):
            if "sliding" in t and window:
                out.append("sliding_attention")
            elif "chunked" in t and chunk:
                out.append("chunked_attention")
            else:
                out.append("full_attention")
        if len(set(out)) > 1:
            return tuple(out), window, chunk
        return (), window if out[0] == "sliding_attention" else None, None
    return (), window, None


# -- the shape the weight and activation formulas read -----------------------------------------

#: Architectures whose MLP is not gated (two matrices, not three).
_NON_GATED = {"gpt2", "gpt_bigcode", "opt", "phi", "falcon", "gpt_neox", "starcoder2", "bloom", "gptj", "mpt"}
#: Architectures with q/k/v biases but none on the output projection.
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"}


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only transformer that size its weights and activations."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    gated: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_positions: int = 2048          # the rotary cache's length (YaRN: original x factor)
    rotary_dim: int = 0
    experts: int = 0                   # routed experts
    topk: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0       # all shared experts together
    dense_layers: int = 0              # layers without routed experts (DeepSeek's first_k_dense_replace, Llama 4's)
    router_bias: bool = False
    mla: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head_dim: int = 0
    multimodal: bool = False
    vision: dict[str, Any] = field(default_factory=dict, compare=False)
    towers: int = 0                    # parameters of the vision and audio towers and their projectors
    dense_intermediate: int = 0        # the dense layers' MLP of a MoE (Llama 4's intermediate_size_mlp)
    rope_caches: tuple[int, ...] = ()  # positions of each rotary cos/sin cache vLLM precomputes

    @property
    def moe_layers(self) -> int:
        return (self.layers - self.dense_layers) if self.experts else 0


def shape_from_config(config: dict[str, Any]) -> Shape:
    """The :class:`Shape` of a resolved config (the text model of a multimodal one)."""
    cfg = _text_config(config)
    mt = str(cfg.get("model_type") or config.get("model_type") or "")
    L = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    H = _int(cfg, "hidden_size", "n_embd", "d_model")
    nh = _int(cfg, "num_attention_heads", "n_head", default=1) or 1
    nkv = _int(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num") or (
        1 if cfg.get("multi_query") and mt in ("gpt_bigcode", "falcon") else nh)
    hd = _int(cfg, "head_dim") or H // max(1, nh)
    inter = _int(cfg, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size") or 4 * H
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
    max_pos = min([int(cfg[k]) for k in keys if isinstance(cfg.get(k), (int, float)) and cfg[k]] or [2048])
    rope = _rope(cfg) or {}
    rtype, factor = str(rope.get("rope_type") or "default"), float(rope.get("factor") or 1)
    original = int(rope.get("original_max_position_embeddings") or max_pos)
    if rtype in ("yarn", "deepseek_yarn"):
        max_pos = int(original * factor)
    # vLLM's rotary cos/sin caches (rotary_embedding/*.py), one per distinct RoPE: linear and dynamic
    # NTK scaling precompute max x factor positions, LongRoPE a short and a long cache; Gemma 3's
    # local layers have their own unscaled one.
    if rtype in ("linear", "dynamic"):
        caches = [int(max_pos * factor)]
    elif rtype in ("longrope", "su"):
        caches = [original, max_pos]
    else:
        caches = [max_pos]
    if mt == "gemma3_text" and len(set(map(str, cfg.get("layer_types") or ()))) > 1:
        caches.append(_int(cfg, "max_position_embeddings", default=max_pos))
    experts = _int(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    moe_i = _int(cfg, "moe_intermediate_size") or (inter if experts else 0)
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * moe_i
    elif cfg.get("shared_expert_intermediate_size"):
        shared = int(cfg["shared_expert_intermediate_size"])
    dense = _int(cfg, "first_k_dense_replace")
    dense_i = inter
    if experts and cfg.get("mlp_only_layers"):
        dense = len(cfg["mlp_only_layers"])
    if experts and mt == "llama4_text":
        # Llama 4: every interleave_moe_layer_step-th layer routes (16 experts of intermediate_size plus
        # one shared expert of it), the rest are dense MLPs of intermediate_size_mlp.
        step = _int(cfg, "interleave_moe_layer_step", default=1) or 1
        moe_count = len(cfg["moe_layers"]) if isinstance(cfg.get("moe_layers"), list) and cfg["moe_layers"] \
            else L // step
        dense, shared, dense_i = L - moe_count, moe_i, _int(cfg, "intermediate_size_mlp") or inter
    vision_config = config.get("vision_config")
    vision: dict[str, Any] = vision_config if isinstance(vision_config, dict) else {}
    archs = " ".join(str(a) for a in (config.get("architectures") or ()))
    partial = cfg.get("partial_rotary_factor")
    if not isinstance(partial, (int, float)) and isinstance(cfg.get("rope_parameters"), dict):
        partial = cfg["rope_parameters"].get("partial_rotary_factor")
    rotary = _int(cfg, "rotary_dim") or int(hd * float(partial or 1.0))
    bias = cfg.get("attention_bias")
    bias = bool(bias if bias is not None else cfg.get("bias") or cfg.get("use_bias"))
    return Shape(
        model_type=mt, layers=L, hidden=H, heads=nh, kv_heads=nkv, head_dim=hd, intermediate=inter,
        vocab=_int(cfg, "vocab_size", "padded_vocab_size", default=32000),
        tied=_tied(cfg, config),
        gated=mt not in _NON_GATED,
        qkv_bias=bias or mt in _QKV_BIAS or bool(cfg.get("qkv_bias")),
        o_bias=bias and mt not in _QKV_BIAS,
        qk_norm=mt.startswith("qwen3"), max_positions=max_pos, rotary_dim=rotary, rope_caches=tuple(caches),
        experts=experts, topk=_int(cfg, "num_experts_per_tok", "experts_per_token", "moe_k"),
        moe_intermediate=moe_i, shared_intermediate=shared, dense_layers=dense, router_bias=mt == "gpt_oss",
        mla=bool(cfg.get("kv_lora_rank")) and cfg.get("qk_rope_head_dim") is not None,
        kv_lora_rank=_int(cfg, "kv_lora_rank"), q_lora_rank=_int(cfg, "q_lora_rank"),
        qk_nope=_int(cfg, "qk_nope_head_dim"), qk_rope=_int(cfg, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, "v_head_dim"),
        multimodal=bool(vision) or any(k in archs for k in ("ConditionalGeneration", "VL", "Vision")),
        vision=vision, towers=tower_params(config, H), dense_intermediate=dense_i,
    )


def _tied(text: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether the output projection is the embedding. A resolved config always says (the class's
    default); only a model type nothing knows can leave it out, and then the untied reading is the
    one that cannot over-promise KV cache (more weights)."""
    v = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    return bool(v) if v is not None else False


# -- the vision and audio towers (vLLM loads them with the language model) ---------------------

def _vit(h: int, i: int, layers: int, *, gated: bool, bias: bool = True) -> int:
    """A ViT encoder's blocks: q/k/v/o, the MLP (gated: three matrices), two norms."""
    attn = 4 * h * h + (4 * h if bias else 0)
    mlp = (3 * h * i if gated else 2 * h * i) + ((i + h) if bias and not gated else 0)
    return layers * (attn + mlp + 4 * h)


def tower_params(config: dict[str, Any], text_hidden: int) -> int:
    """Parameters of the vision and audio encoders and the projectors into the language model,
    as the families lay them out (transformers' modelling files), from the resolved config."""
    total = 0
    vision = config.get("vision_config")
    mt = str(config.get("model_type") or "")
    if isinstance(vision, dict):
        total += _vision_tower(vision, text_hidden, mt, config)
    audio = config.get("audio_config")
    if isinstance(audio, dict):
        d = _int(audio, "d_model", "hidden_size")
        layers = _int(audio, "encoder_layers", "num_hidden_layers")
        ffn = _int(audio, "encoder_ffn_dim", "intermediate_size") or 4 * d
        mels = _int(audio, "num_mel_bins", default=128)
        if d and layers:
            total += _vit(d, ffn, layers, gated=False) + 3 * mels * d + 3 * d * d + d * text_hidden
    return total


def _vision_tower(v: dict[str, Any], text_h: int, wrapper: str, config: dict[str, Any]) -> int:
    vt = str(v.get("model_type") or "")
    h = _int(v, "hidden_size", "embed_dim")
    layers = _int(v, "num_hidden_layers", "depth")
    if not h or not layers:
        return 0
    patch = v.get("patch_size") or 14
    patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
    ch = _int(v, "num_channels", "in_channels", default=3)
    image = v.get("image_size") or 224
    image = int(image[0] if isinstance(image, (list, tuple)) else image)
    act = str(v.get("hidden_act") or "")
    if vt.startswith(("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")):
        # Qwen-VL: blocks of embed_dim (Qwen2-VL) or hidden_size, a 3-D patch embedding, and a merger of
        # spatial_merge_size^2 patches into the language model's width (Qwen3-VL: one more per deepstack layer).
        e = _int(v, "embed_dim") if vt.startswith("qwen2_vl") else h
        out = _int(v, "out_hidden_size") or (h if vt.startswith("qwen2_vl") else text_h)
        i = _int(v, "intermediate_size") or int(e * float(v.get("mlp_ratio") or 4))
        m = _int(v, "spatial_merge_size", default=2) ** 2
        t = _int(v, "temporal_patch_size", default=2)
        blocks = _vit(e, i, layers, gated=vt.startswith(("qwen2_5_vl", "glm4v")))
        merger = (e * m) * (e * m) + (e * m) * out + 2 * e * m
        mergers = 1 + len(v.get("deepstack_visual_indexes") or ())
        pos = _int(v, "num_position_embeddings") * e
        return blocks + ch * t * patch * patch * e + pos + mergers * merger
    i = _int(v, "intermediate_size") or 4 * h
    gated = vt == "pixtral" or ("silu" in act and vt not in ("siglip_vision_model", "clip_vision_model"))
    blocks = _vit(h, i, layers, gated=gated, bias=vt != "pixtral")
    embed = ch * patch * patch * h + ((image // patch) ** 2 + 1) * h * (vt != "pixtral")
    if wrapper == "gemma3":
        proj = h * text_h + h                      # mm_input_projection + mm_soft_emb_norm
    elif wrapper in ("mistral3", "") and vt == "pixtral":
        merge = _int(config, "spatial_merge_size", default=2) ** 2
        proj = h * merge * h + h + h * text_h + text_h * text_h     # patch merger, norm, two linears
    elif wrapper == "llama4":
        shuffle = float(v.get("pixel_shuffle_ratio") or 0.5)
        inner = int(_int(v, "projector_input_dim", default=4096) / (shuffle * shuffle))
        proj = inner * i + i * _int(v, "projector_output_dim", default=4096) \
            + _int(v, "vision_output_dim", default=4096) * text_h
    elif wrapper == "kimi_vl":
        merge = 1
        for k in v.get("merge_kernel_size") or (2, 2):
            merge *= int(k)
        proj = (h * merge) ** 2 + h * merge * text_h + 2 * h
    elif wrapper == "internvl":
        scale = int(round(1 / float(config.get("downsample_ratio") or 0.5))) ** 2
        proj = 2 * h * scale + h * scale * text_h + text_h * text_h
    elif wrapper == "idefics3":
        proj = h * _int(config, "scale_factor", default=2) ** 2 * text_h
    else:                                          # LLaVA-style: two linears (several feature layers concatenated)
        feats = config.get("vision_feature_layer")
        n = len(feats) if isinstance(feats, (list, tuple)) else 1
        proj = h * n * text_h + text_h * text_h + 2 * text_h + (text_h if wrapper == "llava_next" else 0)
    return blocks + embed + proj


# -- weights: bytes per parameter by quantization ----------------------------------------------

@dataclass
class QuantScheme:
    """Bytes per parameter of each kind of tensor, as vLLM holds them on the GPU after loading."""

    method: str | None
    linear_bpw: float                       # attention projections
    mlp_bpw: float                          # dense MLPs and shared experts
    expert_bpw: float                       # routed experts
    lm_head_bpw: float = 2.0                # the output projection (embeddings always stay 16-bit)
    note: str = ""
    expert_pad: tuple[int, int] = (1, 1)    # MoE kernels round (intermediate, hidden) up to these
    expert_k_pad: int = 1                   # ... and each expert matrix's reduction dimension to this
    expert_bias_bytes: int = 2
    unquantized_bpw: float = 2.0            # what stays unquantized: the model dtype (--dtype float32: 4)


def _matches(name: str, patterns: Any) -> bool:
    for p in patterns or ():
        p = str(p)
        if p.startswith("re:"):
            if re.search(p[3:], name):
                return True
        elif p == name or p in name or re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), name):
            return True
    return False


#: Module names per kind of weight, as vLLM's models name them (``model.layers.N.<part>``).
_PARTS = {"attn": ("self_attn.qkv_proj", "self_attn.q_proj", "self_attn.o_proj", "self_attn.k_proj",
                   "self_attn.v_proj"),
          "mlp": ("mlp.gate_up_proj", "mlp.gate_proj", "mlp.down_proj", "mlp.up_proj"),
          "experts": ("mlp.experts.0.gate_proj", "mlp.experts.0.down_proj", "mlp.experts.w13_weight")}


def _skipped_share(skip: Any, kind: str, layers: int) -> float:
    """The share of the layers whose ``kind`` modules a checkpoint leaves unquantized.

    Each entry is a module name or pattern, matched per module as vLLM does (``is_layer_skipped``:
    a name contained in the module's prefix, ``re:`` a regular expression): ``self_attn`` skips every
    layer's attention, ``model.layers.3.mlp`` only layer 3's MLP (unsloth's dynamic 4-bit checkpoints
    list single layers; applying them to every layer counted the whole model as 16-bit).
    """
    if not skip:
        return 0.0
    layers = max(1, layers)
    hit = 0
    for i in range(layers):
        for part in _PARTS[kind]:
            if _matches(f"model.layers.{i}.{part}", skip) or _matches(f"model.language_model.layers.{i}.{part}", skip):
                hit += 1
                break
    return hit / layers


def _apply_skips(s: QuantScheme, skip: Any, layers: int) -> QuantScheme:
    """Modules a checkpoint leaves unquantized (modules_to_not_convert, ignore, llm_int8_skip_modules)."""
    b16 = s.unquantized_bpw
    for kind, attr in (("attn", "linear_bpw"), ("mlp", "mlp_bpw"), ("experts", "expert_bpw")):
        share = _skipped_share(skip, kind, layers)
        if share:
            setattr(s, attr, share * b16 + (1 - share) * getattr(s, attr))
    return s


#: The MXFP4 MoE backends' padding of the expert matrices, on Hopper unless said otherwise
#: (``quantization/mxfp4.py``: ``get_mxfp4_backend``, ``Mxfp4MoEMethod.create_weights``, 0.10.1+).
MXFP4_BACKENDS = ("marlin", "triton", "flashinfer")
#: ``--quantization`` values that quantize a 16-bit checkpoint's linear layers to 8 bits at load.
ONLINE_FP8 = ("fp8", "ptpc_fp8", "fbgemm_fp8", "modelopt")


def dtype_bpw(dtype: str | None) -> float:
    """Bytes per unquantized parameter under vLLM's ``--dtype`` (auto: 16-bit, float32 checkpoints downcast)."""
    d = (dtype or "auto").lower().replace("torch.", "")
    return 4.0 if d in ("float32", "float") else 2.0


def quant_scheme(config: dict[str, Any], *, quantization: str | None = None,
                 compute_capability: tuple[int, int] | None = None, mxfp4_backend: str | None = None,
                 vllm_version: str | None = None, dtype: str | None = None) -> QuantScheme:
    """How each kind of weight is held, from config.json's quantization_config, vLLM's ``--quantization``
    (fp8 of a 16-bit checkpoint at load) and ``--dtype`` (the unquantized parts' width).

    vLLM never quantizes the embeddings; the unquantized parts of a checkpoint are in the model dtype.
    MXFP4 (gpt-oss) quantizes only the routed experts, which its MoE backend pads: Marlin (before Hopper,
    or Hopper without the ``triton_kernels`` package) the most; ``mxfp4_backend=None`` takes it.
    """
    cfg = _text_config(config)
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", default=1)
    qc = cfg.get("quantization_config") or cfg.get("compression_config") or config.get("quantization_config")
    b16 = dtype_bpw(dtype)

    def scheme(method: str | None, lin: float, mlp: float, exp: float, note: str = "") -> QuantScheme:
        return QuantScheme(method, lin, mlp, exp, b16, note, unquantized_bpw=b16)

    if not isinstance(qc, dict):
        q = (quantization or "").lower()
        if q in ONLINE_FP8:                 # online fp8 of a 16-bit checkpoint: fp8 weights, one fp32 scale each
            return scheme("fp8", 1.0, 1.0, 1.0, "online fp8, per-tensor scales")
        if q == "bitsandbytes":
            bpw = 0.5 + 4 / 64
            return scheme("bitsandbytes", bpw, bpw, bpw, "in-flight nf4, fp32 absmax per 64")
        return scheme(None, b16, b16, b16)
    method = str(qc.get("quant_method") or qc.get("format") or quantization or "").lower()
    skip = list(qc.get("modules_to_not_convert") or qc.get("ignore") or qc.get("ignored_layers")
                or qc.get("llm_int8_skip_modules") or [])
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "autoround"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        g = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        g = g if g > 0 else 1 << 30
        bpw = bits / 8 + bits / 8 / g + 2 / g       # packed weights, packed zero points, fp16 scales
        return _apply_skips(scheme(method.replace("_marlin", ""), bpw, bpw, bpw,
                                   f"{bits}-bit, group {g if g < 1 << 30 else 'channel'}"), skip, layers)
    if method == "fp8":
        blk = qc.get("weight_block_size")
        bpw = 1 + (4 / (blk[0] * blk[1]) if blk else 0.0)       # fp32 scale-inverse per block
        return _apply_skips(scheme("fp8", bpw, bpw, bpw, "block-wise" if blk else "per-tensor"), skip, layers)
    if method == "mxfp4":
        bpw = 0.5 + 1 / 32                          # e2m1 nibbles + one e8m0 scale per 32
        attn = bpw if skip and not _matches("model.layers.0.self_attn", skip) else b16
        s = scheme("mxfp4", attn, b16, bpw, "routed experts only")
        cc = compute_capability or (9, 0)
        backend = (mxfp4_backend or "").lower()
        if cc[0] >= 10 and backend in ("", "flashinfer"):
            s.expert_pad = (256, 256)
        elif cc[0] == 9 and backend == "triton":
            s.expert_pad, s.expert_bias_bytes = (64, 1), 4
            if vllm.rules(vllm_version) >= (0, 10, 1):
                s.expert_k_pad = 256                # the Hopper swizzle (torch >= 2.8.1)
        elif cc[0] == 9 and backend == "flashinfer":
            s.expert_pad = (128, 128)
        else:
            s.expert_pad = (128, 256)               # Marlin
        return s
    if method == "compressed-tensors":
        bits, strategy, gsize, sym = 8, "channel", 128, True
        for grp in (qc.get("config_groups") or {}).values():
            w = (grp or {}).get("weights") or {} if isinstance(grp, dict) else {}
            bits = int(w.get("num_bits") or bits)
            strategy = str(w.get("strategy") or strategy)
            gsize = int(w.get("group_size") or gsize)
            sym = bool(w.get("symmetric", True))
        if bits >= 8:
            bpw = bits / 8 + (4 / (128 * 128) if strategy == "block" else 0.0)
        else:
            g = gsize if strategy == "group" else 1 << 30
            bpw = bits / 8 + 2 / g + (0 if sym else bits / 8 / g)
        return _apply_skips(scheme("compressed-tensors", bpw, bpw, bpw, f"{bits}-bit {strategy}"),
                            [x for x in skip if "lm_head" not in str(x)], layers)
    if method in ("bitsandbytes", "bnb"):
        if qc.get("load_in_8bit") or (not qc.get("load_in_4bit") and not qc.get("bnb_4bit_quant_type")):
            bpw, note = 1.0, "LLM.int8"
        else:
            # vLLM dequantizes double-quantized absmax to fp32 at load (bitsandbytes_loader._dequantize_dq)
            bpw, note = 0.5 + 4 / 64, "4-bit, fp32 absmax per 64"
        return _apply_skips(scheme("bitsandbytes", bpw, bpw, bpw, note), skip, layers)
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str((qc.get("quantization") or {}).get("quant_algo") or qc.get("quant_algo") or "").upper()
        if "FP4" in algo:
            bpw = 0.5 + 1 / 16
            return scheme("nvfp4", bpw, bpw, bpw, "fp8 scale per 16")
        return scheme("fp8", 1.0, 1.0, 1.0, "modelopt fp8")
    return scheme(method or None, b16, b16, b16, "unknown method: 16-bit assumed")


#: The schemes the plan offers as a quantized variant of the same shapes (its verdict's options).
VARIANTS = {
    "AWQ 4-bit": {"quant_method": "awq", "bits": 4, "group_size": 128},
    "FP8": {"quant_method": "fp8"},
}


@dataclass
class WeightParts:
    """Parameter counts (not bytes) of one model, by how they are stored and sharded."""

    embed: int = 0            # vocab-parallel embedding (vocabulary padded to 64)
    lm_head: int = 0          # untied output projection
    attn: int = 0             # every layer's attention projections (+ biases)
    mlp: int = 0              # dense MLPs and shared experts
    experts: int = 0          # routed experts, every layer
    expert_bias: int = 0
    router: int = 0
    norms: int = 0
    vision: int = 0           # vision and audio towers + projectors


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def weight_parts(s: Shape) -> WeightParts:
    """Parameters per kind, from the shape: reproduces the checkpoints with an index to < 0.1%."""
    H, L = s.hidden, s.layers
    vpad = _round_up(s.vocab, 64)
    p = WeightParts(embed=vpad * H, lm_head=0 if s.tied else vpad * H)
    if s.mla:
        nope, rope_d, v_d = s.qk_nope or 128, s.qk_rope, s.v_head_dim or 128
        q = (H * s.q_lora_rank + s.q_lora_rank * s.heads * (nope + rope_d)) if s.q_lora_rank \
            else H * s.heads * (nope + rope_d)
        attn = (q + H * (s.kv_lora_rank + rope_d) + s.kv_lora_rank * s.heads * (nope + v_d) + s.heads * v_d * H
                + s.kv_lora_rank + s.q_lora_rank)
    else:
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        attn = 2 * H * q + 2 * H * kv + (q + 2 * kv if s.qkv_bias else 0) + (H if s.o_bias else 0)
        attn += s.heads if s.model_type == "gpt_oss" else 0          # attention sinks
    p.attn = L * attn
    dense_mlp = (3 if s.gated else 2) * H * (s.dense_intermediate or s.intermediate)
    if s.experts:
        p.mlp = s.dense_layers * dense_mlp + s.moe_layers * 3 * H * s.shared_intermediate
        p.experts = s.moe_layers * s.experts * 3 * H * s.moe_intermediate
        if s.router_bias:
            p.expert_bias = s.moe_layers * s.experts * (2 * s.moe_intermediate + H)
        p.router = s.moe_layers * (H * s.experts + (s.experts if s.router_bias else 0))
    else:
        p.mlp = L * dense_mlp
    p.norms = L * 2 * H + H + (L * 2 * s.head_dim if s.qk_norm else 0)
    p.vision = s.towers
    return p


def checkpoint_bytes(shape: Shape, scheme: QuantScheme) -> int:
    """The checkpoint's bytes (all ranks, no kernel padding): what a safetensors index would say."""
    p = weight_parts(shape)
    b16 = scheme.unquantized_bpw
    return int(p.embed * b16 + p.lm_head * scheme.lm_head_bpw + p.attn * scheme.linear_bpw
               + p.mlp * scheme.mlp_bpw + p.experts * scheme.expert_bpw + p.expert_bias * b16
               + (p.router + p.norms + p.vision) * b16)


def model_info_from_config(config: dict[str, Any], *, name: str = "", path: str | None = None,
                           weights_bytes: int | None = None, weights_source: str = "",
                           resolution: Resolution | None = None) -> ModelInfo | None:
    """Build a ModelInfo from a parsed config.json (pure); None when it has no transformer shape.

    ``resolution``: the config as transformers built it in vLLM's environment
    (:func:`supervisor.core.model_config.from_transformers`); without it, the fallback table's
    defaults (:func:`supervisor.core.model_config.with_defaults`).
    """
    if not isinstance(config, dict):
        return None
    res = resolution or with_defaults(config)
    resolved = res.config
    cfg = _text_config(resolved)
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    if not layers or not hidden or not heads or layers > 1 << 16:
        return None
    shape = shape_from_config(resolved)
    torch_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    types, window, chunk = attention_layout(cfg)
    keys = {k: int(cfg[k]) for k in MAX_LEN_KEYS
            if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool) and cfg[k] > 0}
    info = ModelInfo(
        name=name or str(config.get("_name_or_path") or ""),
        path=path,
        architectures=tuple(str(a) for a in (config.get("architectures") or cfg.get("architectures") or ())),
        model_type=str(config.get("model_type") or cfg.get("model_type") or ""),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        hidden_size=hidden,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        dtype_bytes=DTYPE_BYTES.get(torch_dtype, 2),
        torch_dtype=torch_dtype,
        mla=shape.mla,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope,
        sliding_window=window,
        layer_types=types,
        max_len_keys=keys,
        rope_scaling=_rope(cfg),
        weights_bytes=weights_bytes,
        weights_source=weights_source,
        quantization=_quantization(cfg),
        num_experts=shape.experts,
        attention_chunk_size=chunk,
        config_source=res.source,
        config_known=res.known,
        config=dict(resolved),
    )
    info = replace(info, derived_max_model_len=derive_max_model_len(info))
    if info.weights_bytes is None:
        # No index and no files: the checkpoint's bytes from the shapes and quantization_config.
        info = replace(info, weights_bytes=checkpoint_bytes(info.shape, quant_scheme(resolved)),
                       weights_source="estimate")
    return info
