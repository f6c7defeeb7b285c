"""What vLLM will see of a model: its config.json shape, context rules and weight size.

Pure: a parsed config.json in, :class:`ModelInfo` out (:func:`model_info_from_config`), and the
context length vLLM derives from it (:func:`derive_max_model_len`). Finding config.json and the
weight files is :mod:`supervisor.facts.model_files`. Nothing here raises for missing data:
unknown is ``None``.
"""

from __future__ import annotations

import functools
import re
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
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)   # config.json as read

    @functools.cached_property
    def shape(self) -> Shape:
        """The shape the weight and activation formulas read (from config.json, else these fields)."""
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
            for k in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
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


def _quantization(cfg: dict[str, Any]) -> str | None:
    """The quantization method config.json names (``quant_method``), or None when unquantized."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or qc.get("format") or "unknown").lower()
    return method.replace("_marlin", "") if method in ("awq_marlin", "gptq_marlin") else (
        "bitsandbytes" if method == "bnb" else method)


# -- the shape the weight and activation formulas read -----------------------------------------

#: Architectures whose MLP is not gated (two matrices, not three).
_NON_GATED = {"gpt2", "gpt_bigcode", "opt", "phi", "falcon", "gpt_neox", "starcoder2", "bloom", "gptj", "mpt"}
#: Architectures with q/k/v biases but none on the output projection.
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}


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
    dense_layers: int = 0              # leading dense layers of a MoE (DeepSeek's first_k_dense_replace)
    router_bias: bool = False
    mla: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head_dim: int = 0
    multimodal: bool = False
    vision: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def moe_layers(self) -> int:
        return (self.layers - self.dense_layers) if self.experts else 0


def shape_from_config(config: dict[str, Any]) -> Shape:
    """The :class:`Shape` of a parsed config.json (the text model of a multimodal one)."""
    cfg = _text_config(config)
    mt = str(cfg.get("model_type") or config.get("model_type") or "")
    L = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers") or 0)
    H = int(cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model") or 0)
    nh = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    nkv = int(cfg.get("num_key_value_heads") or cfg.get("multi_query_group_num") or nh)
    hd = int(cfg.get("head_dim") or H // max(1, nh))
    inter = int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * H)
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
    max_pos = min([int(cfg[k]) for k in keys if isinstance(cfg.get(k), (int, float))] or [2048])
    rope = _rope(cfg) or {}
    if rope.get("rope_type") in ("yarn", "deepseek_yarn"):
        max_pos = int((rope.get("original_max_position_embeddings") or max_pos) * float(rope.get("factor") or 1))
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    moe_i = int(cfg.get("moe_intermediate_size") or (inter if experts else 0))
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * moe_i
    elif cfg.get("shared_expert_intermediate_size"):
        shared = int(cfg["shared_expert_intermediate_size"])
    dense = int(cfg.get("first_k_dense_replace") or 0)
    if experts and cfg.get("mlp_only_layers"):
        dense = len(cfg["mlp_only_layers"])
    vision_config = config.get("vision_config")
    vision: dict[str, Any] = vision_config if isinstance(vision_config, dict) else {}
    archs = " ".join(str(a) for a in (config.get("architectures") or ()))
    return Shape(
        model_type=mt, layers=L, hidden=H, heads=nh, kv_heads=nkv, head_dim=hd, intermediate=inter,
        vocab=int(cfg.get("vocab_size") or 32000),
        tied=bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        gated=mt not in _NON_GATED,
        qkv_bias=bool(cfg.get("attention_bias")) or mt in _QKV_BIAS or bool(cfg.get("qkv_bias")),
        o_bias=bool(cfg.get("attention_bias")) and mt not in _QKV_BIAS,
        qk_norm=mt.startswith("qwen3"), max_positions=max_pos,
        rotary_dim=int(hd * float(cfg.get("partial_rotary_factor") or 1.0)),
        experts=experts, topk=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0),
        moe_intermediate=moe_i, shared_intermediate=shared, dense_layers=dense, router_bias=mt == "gpt_oss",
        mla=bool(cfg.get("kv_lora_rank")) and cfg.get("qk_rope_head_dim") is not None,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        qk_nope=int(cfg.get("qk_nope_head_dim") or 0), qk_rope=int(cfg.get("qk_rope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        multimodal=bool(vision) or any(k in archs for k in ("ConditionalGeneration", "VL", "Vision")),
        vision=vision,
    )


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


def _matches(name: str, patterns: Any) -> bool:
    for p in patterns or ():
        p = str(p)
        if p == name or p in name or re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), name):
            return True
    return False


def _apply_skips(s: QuantScheme, skip: Any) -> QuantScheme:
    """Modules a checkpoint leaves unquantized (modules_to_not_convert, ignore, llm_int8_skip_modules)."""
    text = " ".join(str(x) for x in (skip or ()))
    if re.search(r"self_attn|attention|\battn\b|q_proj|qkv", text):
        s.linear_bpw = 2.0
    if re.search(r"\bmlp\b|gate_up|down_proj|feed_forward", text) and "experts" not in text:
        s.mlp_bpw = 2.0
    if "experts" in text:
        s.expert_bpw = 2.0
    return s


#: The MXFP4 MoE backends' padding of the expert matrices, on Hopper unless said otherwise
#: (``quantization/mxfp4.py``: ``get_mxfp4_backend``, ``Mxfp4MoEMethod.create_weights``, 0.10.1+).
MXFP4_BACKENDS = ("marlin", "triton", "flashinfer")


def quant_scheme(config: dict[str, Any], *, quantization: str | None = None,
                 compute_capability: tuple[int, int] | None = None, mxfp4_backend: str | None = None,
                 vllm_version: str | None = None) -> QuantScheme:
    """How each kind of weight is stored, from config.json's quantization_config (or ``--quantization``).

    vLLM never quantizes the embeddings; the unquantized parts of a checkpoint stay 16-bit. MXFP4
    (gpt-oss) quantizes only the routed experts, which its MoE backend pads: Marlin (before Hopper,
    or Hopper without the ``triton_kernels`` package) the most; ``mxfp4_backend=None`` takes it.
    """
    cfg = _text_config(config)
    qc = cfg.get("quantization_config") or cfg.get("compression_config") or config.get("quantization_config")
    b16 = 2.0
    if not isinstance(qc, dict):
        if quantization in ("fp8", "ptpc_fp8"):                # online fp8 of a 16-bit checkpoint
            return QuantScheme("fp8", 1.0, 1.0, 1.0, b16, "online fp8, per-tensor scales")
        if quantization == "bitsandbytes":
            bpw = 0.5 + 4 / 64
            return QuantScheme("bitsandbytes", bpw, bpw, bpw, b16, "in-flight nf4, fp32 absmax per 64")
        return QuantScheme(None, b16, b16, b16, b16)
    method = str(qc.get("quant_method") or qc.get("format") or quantization or "").lower()
    skip = list(qc.get("modules_to_not_convert") or qc.get("ignore") or qc.get("ignored_layers")
                or qc.get("llm_int8_skip_modules") or [])
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "autoround"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        g = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        g = g if g > 0 else 1 << 30
        bpw = bits / 8 + bits / 8 / g + 2 / g       # packed weights, packed zero points, fp16 scales
        return _apply_skips(QuantScheme(method.replace("_marlin", ""), bpw, bpw, bpw, b16,
                                        f"{bits}-bit, group {g if g < 1 << 30 else 'channel'}"), skip)
    if method == "fp8":
        blk = qc.get("weight_block_size")
        bpw = 1 + (4 / (blk[0] * blk[1]) if blk else 0.0)       # fp32 scale-inverse per block
        return QuantScheme("fp8", bpw, bpw, bpw, b16, "block-wise" if blk else "per-tensor")
    if method == "mxfp4":
        bpw = 0.5 + 1 / 32                          # e2m1 nibbles + one e8m0 scale per 32
        attn = bpw if skip and not _matches("model.layers.0.self_attn", skip) else b16
        s = QuantScheme("mxfp4", attn, b16, bpw, b16, "routed experts only")
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
        return _apply_skips(QuantScheme("compressed-tensors", bpw, bpw, bpw, b16, f"{bits}-bit {strategy}"),
                            [x for x in skip if "lm_head" not in str(x)])
    if method in ("bitsandbytes", "bnb"):
        if qc.get("load_in_8bit") or (not qc.get("load_in_4bit") and not qc.get("bnb_4bit_quant_type")):
            bpw, note = 1.0, "LLM.int8"
        else:
            # vLLM dequantizes double-quantized absmax to fp32 at load (bitsandbytes_loader._dequantize_dq)
            bpw, note = 0.5 + 4 / 64, "4-bit, fp32 absmax per 64"
        return _apply_skips(QuantScheme("bitsandbytes", bpw, bpw, bpw, b16, note), skip)
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str((qc.get("quantization") or {}).get("quant_algo") or qc.get("quant_algo") or "").upper()
        if "FP4" in algo:
            bpw = 0.5 + 1 / 16
            return QuantScheme("nvfp4", bpw, bpw, bpw, b16, "fp8 scale per 16")
        return QuantScheme("fp8", 1.0, 1.0, 1.0, b16, "modelopt fp8")
    return QuantScheme(method or None, b16, b16, b16, b16, "unknown method: 16-bit assumed")


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
    vision: int = 0           # vision tower + projector


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _vision_params(vision: dict[str, Any], text_hidden: int) -> int:
    """A ViT-style tower and a two-layer projector from vision_config (an estimate)."""
    h = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or 0)
    if not h or not layers:
        return 0
    i = int(vision.get("intermediate_size") or 4 * h)
    patch, ch = int(vision.get("patch_size") or 14), int(vision.get("num_channels") or 3)
    per_layer = 4 * h * h + (3 if "silu" in str(vision.get("hidden_act") or "") else 2) * h * i + 4 * h
    return layers * per_layer + ch * patch * patch * h + h * text_hidden + text_hidden * text_hidden


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
    dense_mlp = (3 if s.gated else 2) * H * s.intermediate
    if s.experts:
        p.mlp = s.dense_layers * dense_mlp + s.moe_layers * 3 * H * s.shared_intermediate
        p.experts = s.moe_layers * s.experts * 3 * H * s.moe_intermediate
        if s.router_bias:
            p.expert_bias = s.moe_layers * s.experts * (2 * s.moe_intermediate + H)
        p.router = s.moe_layers * (H * s.experts + (s.experts if s.router_bias else 0))
    else:
        p.mlp = L * dense_mlp
    p.norms = L * 2 * H + H + (L * 2 * s.head_dim if s.qk_norm else 0)
    p.vision = _vision_params(s.vision, H) if s.vision else 0
    return p


def checkpoint_bytes(shape: Shape, scheme: QuantScheme) -> int:
    """The checkpoint's bytes (all ranks, no kernel padding): what a safetensors index would say."""
    p = weight_parts(shape)
    return int(p.embed * 2 + p.lm_head * scheme.lm_head_bpw + p.attn * scheme.linear_bpw
               + p.mlp * scheme.mlp_bpw + p.experts * scheme.expert_bpw + p.expert_bias * 2
               + (p.router + p.norms + p.vision) * 2)


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
        quantization=_quantization(cfg),
        num_experts=int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0),
        config=dict(config),
    )
    info = replace(info, derived_max_model_len=derive_max_model_len(info))
    if info.weights_bytes is None:
        # No index and no files: the checkpoint's bytes from the shapes and quantization_config.
        info = replace(info, weights_bytes=checkpoint_bytes(info.shape, quant_scheme(config)),
                       weights_source="estimate")
    return info
