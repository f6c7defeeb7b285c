"""The log classifier: saved logs per vLLM generation, look-alikes, normalisation, streaming, memory."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.classifier import Classifier, classify, normalize, place
from supervisor.core.diagnosis import VERDICT_PHASES, Diagnosis, Kind

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
EXPECTED = json.loads((LOGS / "expected.json").read_text())
# Real vLLM 0.32 CPU output, captured by another engineer, carries its own expected.json.
for _sub in sorted(p for p in LOGS.iterdir() if p.is_dir() and (p / "expected.json").is_file()):
    EXPECTED.update({f"{_sub.name}/{rel}": want for rel, want in json.loads((_sub / "expected.json").read_text()).items()})


def _read(rel: str) -> list[bytes]:
    return (LOGS / rel).read_bytes().splitlines(keepends=True)


# --------------------------------------------------------------------------- the table
@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_fixture_kind_and_numbers(rel: str) -> None:
    want = EXPECTED[rel]
    got = classify(_read(rel), want.get("exit_code"))
    assert got.kind.value == want["kind"], f"{rel}: evidence {got.evidence!r}"
    for key, value in want["numbers"].items():
        assert got.numbers.get(key) == value, f"{rel}: numbers[{key!r}] = {got.numbers.get(key)!r}, want {value!r}"
    if "phase" in want:
        assert got.phase == want["phase"]
    assert got.phase in VERDICT_PHASES
    assert len(got.evidence) <= 500
    if got.names_a_failure and want.get("exit_code") is None:
        assert got.evidence, "a named failure carries the line that decided it"
    assert got.detail


def test_every_fixture_is_listed_and_every_kind_is_covered() -> None:
    on_disk = {str(p.relative_to(LOGS)) for p in LOGS.rglob("*.log")}
    assert on_disk == set(EXPECTED), on_disk ^ set(EXPECTED)
    kinds = {e["kind"] for e in EXPECTED.values()}
    # every kind a log can show (auto_fit_above_request is the launch watcher's own check)
    assert kinds == {k.value for k in Kind} - {Kind.AUTO_FIT_ABOVE_REQUEST.value}
    assert sum(rel.startswith("real-") for rel in EXPECTED) >= 10, "the real CPU captures are in the table"
    for generation in ("v0/", "v1/", "current/"):
        gen_kinds = {e["kind"] for rel, e in EXPECTED.items() if rel.startswith(generation)}
        assert len(gen_kinds) >= 8, (generation, gen_kinds)


# --------------------------------------------------------------------------- single lines
def _one(line: str, exit_code: int | None = None) -> Diagnosis:
    return classify([line], exit_code)


@pytest.mark.parametrize(
    "line, kind",
    [
        ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored in KV cache (2048). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", Kind.KV_CACHE_INSUFFICIENT),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", Kind.NO_KV_CACHE_MEMORY),
        ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`.", Kind.NO_KV_CACHE_MEMORY),
        ("ValueError: Free memory on device (3.2/23.64 GiB) on startup is less than desired GPU memory utilization (0.9, 21.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", Kind.INSUFFICIENT_FREE_MEMORY),
        ("ValueError: Externally held weights on device cuda:0 (40.1 GiB) exceed the desired GPU memory utilization (0.5, 39.6 GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.", Kind.INSUFFICIENT_FREE_MEMORY),
        ("ERROR 07-23 10:00:01 [gpu_model_runner.py:3421] Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, or using --quantization.", Kind.OOM_WEIGHTS),
        ("RuntimeError: Failed to create unquantized linear weights. This may be caused by insufficient memory to allocate the weight.", Kind.OOM_WEIGHTS),
        ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:", Kind.OOM_CUDAGRAPH),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", Kind.ENGINE_DEAD),
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error", Kind.ENGINE_DEAD),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.", Kind.ENGINE_DEAD),
        ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.", Kind.ENGINE_DEAD),
        ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}", Kind.ENGINE_DEAD),
        ("ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096 or model_max_length=None in model's config.json).", Kind.MAX_LEN_EXCEEDS_MODEL),
        ("api_server.py: error: unrecognized arguments: --foo 1", Kind.CONFIG_ERROR),
        ("vllm serve: error: argument --dtype: invalid choice: 'bf32' (choose from auto, half, float16, bfloat16, float, float32)", Kind.CONFIG_ERROR),
        ("OSError: [Errno 98] Address already in use", Kind.CONFIG_ERROR),
        ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use", Kind.CONFIG_ERROR),
        ("ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).", Kind.CONFIG_ERROR),
        ("RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min capability: 80. ', 'Current capability: 75.')", Kind.CONFIG_ERROR),
        ("ValueError: FlashAttention does not support fp8 kv-cache on this device.", Kind.CONFIG_ERROR),
        ("RuntimeError: No CUDA GPUs are available", Kind.CONFIG_ERROR),
        ("TimeoutError: Timed out waiting for engines to send initial message on input socket.", Kind.ENGINE_DEAD),
    ],
)
def test_single_line_kinds(line: str, kind: Kind) -> None:
    got = _one(line)
    assert got.kind is kind
    assert got.evidence == normalize(line)


@pytest.mark.parametrize(
    "line",
    [
        # the INFO summary of free memory at start-up, not the start-up check's error (docs/failure-catalogue.md)
        "(EngineCore_DP0 pid=9) INFO 09-20 10:00:01 [gpu_worker.py:391] Free memory on device (78.5/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB). Actual usage is 14.25 GiB for weight, 4.3 GiB for peak activation.",
        "(EngineCore_DP0 pid=9) WARNING 09-20 10:00:01 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 second. This typically happens when some processes are hanging.",
        "WARNING 07-23 10:00:01 scheduler.py:1560] Sequence group 12 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance.",
        "INFO 12-12 10:00:01 model_runner.py:1404] Capturing cudagraphs for decoding. If out-of-memory error occurs during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to eager mode.",
        "INFO 07-23 10:00:01 model_runner.py:984] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.",
        "ERROR 07-23 10:00:01 [serving_chat.py:222] Error in preprocessing prompt inputs",
        "ValueError: This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        "WARNING 07-23 10:00:01 [model.py:1700] User-specified max_model_len (65536) is greater than the derived max_model_len (max_position_embeddings=32768 or model_max_length=None in model's config.json). VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.",
        "INFO 07-23 10:00:01 [__init__.py:1] Cannot use FlashAttention-2 backend for FP8 KV cache.",
        "INFO:     127.0.0.1:5555 - \"POST /v1/chat/completions HTTP/1.1\" 500 Internal Server Error",
        "WARNING 07-23 10:00:01 [arg_utils.py:1] --kv-cache-dtype is not supported by the V1 Engine. Falling back to V0.",
        "INFO 07-23 10:00:01 [kv_cache_utils.py:1] Auto-fit max_model_len: reduced from 131072 to 41840 to fit in available GPU memory (5.23 GiB available for KV cache)",
    ],
)
def test_look_alikes_are_not_failures(line: str) -> None:
    got = _one(line)
    assert not got.names_a_failure, got


def test_sigterm_during_start_up_is_a_start_up_cut_short() -> None:
    stop = ["Traceback (most recent call last):",
            '  File "/x/vllm/entrypoints/openai/api_server.py", line 1, in signal_handler', "KeyboardInterrupt: terminated"]
    got = classify(["INFO 07-23 10:00:01 [core.py:1] Starting to load model x...", *stop], 1)
    assert got.kind is Kind.INCOMPLETE and got.phase == "loading"    # stopped, not failed, and never served
    assert "SIGTERM" in got.detail and "before serving" in got.detail
    served = classify(["INFO 07-23 10:00:01 [launcher.py:1] Application startup complete.", *stop], 1)
    assert served.kind is Kind.HEALTHY and "while serving" in served.detail


def test_exit_code_decides_when_the_log_says_nothing() -> None:
    lines = ["INFO 07-23 10:00:01 [gpu_model_runner.py:1] Starting to load model x..."]
    assert classify(lines, None).kind is Kind.INCOMPLETE        # stops while loading, nothing failed
    assert classify(lines, 0).kind is Kind.INCOMPLETE
    dead = classify(lines + ["Segfault-free nonsense", "ZeroDivisionError: division by zero"], -9)
    assert dead.kind is Kind.ENGINE_DEAD
    assert dead.evidence == "ZeroDivisionError: division by zero"
    assert dead.phase == "loading"


def test_root_cause_beats_the_wrappers_around_it() -> None:
    lines = [
        "(EngineCore_DP0 pid=2) ERROR 09-20 10:00:01 [core.py:718] EngineCore failed to start.",
        "(EngineCore_DP0 pid=2) ERROR 09-20 10:00:01 [core.py:718] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=2) ERROR 09-20 10:00:01 [core.py:718] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    assert classify(lines, 1).kind is Kind.NO_KV_CACHE_MEMORY
    # a root cause no rule names, inside the wrappers: an unknown failure, with that exception as evidence
    unknown = [lines[0], lines[1], "(EngineCore_DP0 pid=2) ERROR 09-20 10:00:01 [core.py:718] KeyError: 'lm_head.weight'", lines[3]]
    got = classify(unknown, 1)
    assert got.kind is Kind.UNKNOWN_FAILURE
    assert got.evidence == "KeyError: 'lm_head.weight'"
    # the wrappers alone (the engine died with nothing to say, e.g. SIGKILLed): the engine died
    assert classify([lines[0], lines[3]], 1).kind is Kind.ENGINE_DEAD


# --------------------------------------------------------------------------- where an OOM happened
_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.54 GiB of which 1.25 GiB is free."


def _frame(fn: str, path: str = "/x/vllm/v1/worker/gpu_model_runner.py") -> str:
    return f'  File "{path}", line 1, in {fn}'


@pytest.mark.parametrize(
    "milestones, frames, kind",
    [
        (["Starting to load model x..."], [], Kind.OOM_WEIGHTS),
        (["Model loading took 14.25 GiB and 4.1 seconds"], [], Kind.OOM_PROFILE),
        (["Model loading took 14.25 GiB and 4.1 seconds", "GPU KV cache size: 10,000 tokens"], [], Kind.OOM_CUDAGRAPH),
        # after capture only warm-up runs (the sampler's dummy requests): eager mode would not help
        (["Graph capturing finished in 5 secs, took 0.3 GiB"], [], Kind.OOM_PROFILE),
        (["Application startup complete."], [], Kind.OOM_RUNTIME),
        # frames beat milestones; the deepest known frame wins
        (["Starting to load model x..."], ["_initialize_kv_caches", "determine_available_memory", "profile_run", "_dummy_run"], Kind.OOM_PROFILE),
        (["GPU KV cache size: 10,000 tokens"], ["initialize_from_config", "compile_or_warm_up_model", "capture_model", "_dummy_run"], Kind.OOM_CUDAGRAPH),
        (["GPU KV cache size: 10,000 tokens"], ["initialize_from_config", "initialize_kv_cache", "_allocate_kv_cache_tensors"], Kind.OOM_PROFILE),
        (["Model loading took 14.25 GiB"], ["load_model", "get_model", "initialize_model", "create_weights"], Kind.OOM_WEIGHTS),
        # V0 runs execute_model inside profile_run: a runtime frame under a start-up frame stays start-up
        ([], ["determine_num_available_blocks", "profile_run", "execute_model"], Kind.OOM_PROFILE),
    ],
)
def test_oom_is_placed_by_frames_then_milestones(milestones: list[str], frames: list[str], kind: Kind) -> None:
    lines = [f"INFO 09-20 10:00:01 [x.py:1] {m}" for m in milestones] + ["Traceback (most recent call last):"]
    lines += [_frame(f) for f in frames] + [_OOM]
    got = classify(lines, 1)
    assert got.kind is kind, got
    assert got.numbers["tried_to_allocate_mib"] == 2048.0


def test_sampler_warm_up_oom_is_the_profiles_wherever_it_runs() -> None:
    """The sampler warm-up runs at the end of profile_run and again after capture: fewer sequences
    fix both (vLLM's own advice), so both are oom_profile; the phase says which one it was."""
    msg = "RuntimeError: CUDA out of memory occurred when warming up sampler with 512 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
    during_profile = classify(["INFO 09-20 10:00:01 [x.py:1] Model loading took 14.25 GiB", msg], 1)
    after_capture = classify(["INFO 09-20 10:00:01 [x.py:1] Graph capturing finished in 5 secs, took 0.3 GiB", msg], 1)
    assert (during_profile.kind, during_profile.phase) == (Kind.OOM_PROFILE, "profiling")
    assert (after_capture.kind, after_capture.phase) == (Kind.OOM_PROFILE, "warmup")
    assert after_capture.numbers["num_dummy_requests"] == 512
    # the frames tell the two apart when the milestones do not
    frames = ["Traceback (most recent call last):", _frame("compile_or_warm_up_model", "/x/vllm/v1/worker/gpu_worker.py"),
              _frame("_dummy_sampler_run")]
    assert classify(frames + [msg], 1).phase == "warmup"
    frames[1] = _frame("profile_run")
    assert classify(frames + [msg], 1).phase == "profiling"


@pytest.mark.parametrize(("milestone", "phase"), [
    ("Model loading took 14.25 GiB", "profiling"),
    ("Graph capturing finished in 5 secs, took 0.3 GiB", "warmup"),
])
@pytest.mark.parametrize("frame", ["_dummy_sampler_run", "_dummy_pooler_run"])
def test_a_torch_oom_whose_deepest_known_frame_is_the_samplers_warm_up_is_placed_by_the_milestones(
        milestone: str, phase: str, frame: str) -> None:
    """PyTorch's own OOM inside the sampler's dummy run (its frames from the dummy run down, the caller's in the
    traceback vLLM chains after it): the dummy run is profiling's and the warm-up's after capture, so the
    milestones say which (found: an OOM after capture read as the profile's)."""
    got = classify([f"INFO 09-20 10:00:01 [x.py:1] {milestone}", "Traceback (most recent call last):",
                    _frame(frame), _frame("forward_native", "/x/vllm/v1/sample/ops/topk_topp_sampler.py"),
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB."], 1)
    assert (got.kind, got.phase) == (Kind.OOM_PROFILE, phase), got


def test_non_oom_failure_during_capture_is_a_capture_failure() -> None:
    lines = ["Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  10%|█         | 7/67", "Traceback (most recent call last):",
             _frame("capture_model"), "AssertionError: some shape mismatch"]
    assert classify(lines, 1).kind is Kind.OOM_CUDAGRAPH


# --------------------------------------------------------------------------- numbers
def test_old_torch_oom_wording_numbers() -> None:
    got = _one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
               "14.50 GiB already allocated; 3.06 MiB free; 14.60 GiB reserved in total by PyTorch)")
    assert got.numbers["tried_to_allocate_mib"] == 20.0
    assert got.numbers["total_gib"] == 15.78
    assert got.numbers["free_gib"] == round(3.06 / 1024, 4)


@pytest.mark.parametrize("size, mib", [("2.00 GiB", 2048.0), ("512.00 KiB", 0.5), ("1048576 B", 1.0), ("20.00 MiB", 20.0)])
def test_tried_to_allocate_is_converted_to_mib(size: str, mib: float) -> None:
    assert _one(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size}.").numbers["tried_to_allocate_mib"] == mib


def test_version_sources() -> None:
    for line, version in [
        ("INFO 07-23 10:00:01 api_server.py:212] vLLM API server version 0.5.3.post1", "0.5.3.post1"),
        ("(APIServer pid=1) INFO 01-02 10:00:01 [utils.py:233] vLLM server version 0.15.1, serving model Qwen/Qwen3-8B", "0.15.1"),
        ("INFO 07-23 10:00:01 [core.py:76] Initializing a V1 LLM engine (v0.10.2rc3.dev253+ga684c0124) with config: model='x'", "0.10.2rc3.dev253+ga684c0124"),
        ("(APIServer pid=1) INFO 01-02 10:00:01 [utils.py:233]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.33.0", "0.33.0"),
    ]:
        c = Classifier()
        c.feed(line)
        assert c.numbers["vllm_version"] == version, line


def test_progress_numbers_are_exposed_while_streaming() -> None:
    c = Classifier()
    for line in [
        "(EngineCore_DP0 pid=2) INFO 09-20 10:00:01 [core.py:76] Initializing a V1 LLM engine (v0.32.0) with config: model='m', block_size=128, max_seq_len=4096",
        "(EngineCore_DP0 pid=2) INFO 09-20 10:00:02 [gpu_model_runner.py:1] Model loading took 0.94 GiB memory and 2.1 seconds",
        "(EngineCore_DP0 pid=2) INFO 09-20 10:00:03 [gpu_worker.py:1] Available KV cache memory: 3.5 GiB",
        "(EngineCore_DP0 pid=2) INFO 09-20 10:00:03 [kv_cache_utils.py:1] GPU KV cache size: 1,117,584 tokens",
        "(EngineCore_DP0 pid=2) INFO 09-20 10:00:03 [kv_cache_utils.py:1] Auto-fit max_model_len: reduced from 131072 to 41840 to fit in available KV cache memory (5.23 GiB)",
        "(APIServer pid=1) INFO 09-20 10:00:01 [model.py:1] Using max model len 41840",
    ]:
        assert c.feed(line) is None
    assert c.numbers == {"vllm_version": "0.32.0", "block_size": 128, "model_loading_gib": 0.94,
                         "kv_available_gib": 3.5, "kv_cache_tokens": 1117584, "auto_fit_max_model_len": 41840,
                         "served_max_model_len": 41840, "engine": "v1"}   # "Initializing a V1 LLM engine"
    assert c.phase == "kv_cache"
    assert not c.serving
    c.feed("(APIServer pid=1) INFO 09-20 10:00:09 [entry.py:1] Starting vLLM server on http://0.0.0.0:8000")
    assert c.serving and c.phase == "serving"


def test_rank_comes_from_the_worker_that_failed() -> None:
    for prefix, rank in [("(Worker_TP1 pid=7)", 1), ("(VllmWorker rank=3 pid=7)", 3), ("(Worker_PP0_TP2 pid=7)", 2), ("[rank1]:", 1)]:
        got = _one(prefix + " ValueError: No available memory for the cache blocks.")
        assert got.numbers.get("rank") == rank, prefix


# --------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize(
    "raw, text",
    [
        ("\x1b[1;36m(EngineCore_DP0 pid=6444)\x1b[0;0m ERROR 09-20 10:00:01 [core.py:718] EngineCore failed to start.\r\n", "EngineCore failed to start."),
        ("^[[1;36m(EngineCore_DP0 pid=6444)^[[0;0m ERROR 09-20 10:00:01 [core.py:718] EngineCore failed to start.", "EngineCore failed to start."),
        ("[1;36m(EngineCore_DP0 pid=6444)[0;0m ERROR 09-20 10:00:01 [core.py:718] x", "x"),
        ("vllm-1  | (APIServer pid=1) INFO 09-20 10:00:01 [api_server.py:1] hello", "hello"),
        ("vllm_openai_1  | INFO 07-23 10:00:01 api_server.py:212] vLLM API server version 0.5.3", "vLLM API server version 0.5.3"),
        ("2025-01-01T10:00:00.123456789Z (APIServer pid=1) INFO 09-20 10:00:01 [a.py:1] x", "x"),
        ("(VllmWorker rank=3 pid=123) INFO 07-23 10:00:01 [b.py:2] y", "y"),
        ("(RayWorkerWrapper pid=15645, ip=172.31.15.128) INFO 07-23 10:00:01 worker.py:1] z", "z"),
        ("(EngineCore pid=4242) INFO 07-23 10:00:01 [core.py:413] init engine", "init engine"),
        ("INFO:     Application startup complete.", "Application startup complete."),
        ("[rank0]: Traceback (most recent call last):", "Traceback (most recent call last):"),
        ("DEBUG 07-23 10:00:01 [v1/engine/core.py:12] deep", "deep"),
        ("07-23 10:00:01 [core.py:718] half a header", "half a header"),
        (b"ERROR 07-23 10:00:01 [core.py:718] bad \xff\xfe bytes\x00", "bad \ufffd\ufffd bytes"),
        ("Traceback (most recent call last):", "Traceback (most recent call last):"),
        # Kubernetes' container log format (CRI): timestamp, stream, partial/full flag
        ("2024-06-01T12:00:00.123456789Z stderr F (EngineCore_DP0 pid=1) ERROR 06-01 12:00:00 [core.py:1] x", "x"),
    ],
)
def test_normalize(raw: str | bytes, text: str) -> None:
    assert normalize(raw) == text


def test_feed_splits_carriage_returns_of_progress_bars() -> None:
    c = Classifier()
    c.feed("Capturing CUDA graph shapes:  10%|█  | 7/67\rCapturing CUDA graph shapes:  20%|██ | 14/67\r")
    assert c.phase == "cudagraph"


# --------------------------------------------------------------------------- streaming and memory
def test_feed_returns_the_first_fatal_line_only() -> None:
    lines = _read("v1/0.10.2-kv-insufficient-tp2-ansi.log")
    c = Classifier()
    hits = [(i, d) for i, line in enumerate(lines) if (d := c.feed(line)) is not None]
    assert len(hits) == 1
    first, diagnosis = hits[0]
    assert b"EngineCore failed to start." in lines[first]
    assert diagnosis.names_a_failure
    final = c.diagnose(1)
    assert final.kind is Kind.KV_CACHE_INSUFFICIENT
    assert final.numbers["fit_max_model_len"] == 40384


def test_feed_returns_at_the_root_cause_when_it_comes_first() -> None:
    c = Classifier()
    assert c.feed("INFO 09-20 10:00:01 [x.py:1] Starting to load model m...") is None
    got = c.feed("ValueError: Free memory on device (3.2/23.64 GiB) on startup is less than desired GPU memory utilization (0.9, 21.28 GiB).")
    assert got is not None and got.kind is Kind.INSUFFICIENT_FREE_MEMORY
    assert got.numbers["free_gib"] == 3.2 and got.numbers["requested_utilization"] == 0.9
    assert c.feed("RuntimeError: Engine core initialization failed. See root cause above.") is None
    assert c.diagnose(1).kind is Kind.INSUFFICIENT_FREE_MEMORY


def test_memory_is_bounded_by_the_ring_buffer() -> None:
    c = Classifier(max_lines=500)
    for i in range(100_000):
        c.feed(f"(APIServer pid=1) INFO 09-20 10:00:01 [loggers.py:1] Engine 000: Avg prompt throughput: {i}.0 tokens/s")
        if i % 1000 == 0:
            c.feed(f"ValueError: unrelated request error number {i}" + "x" * 5000)
    assert len(c.lines) == 500
    assert max(len(line) for line in c.lines) <= 1000
    assert len(c.numbers) < 20
    # the state besides the ring buffer stays a handful of short strings
    small = {k: v for k, v in vars(c).items() if k != "lines" and isinstance(v, str)}
    assert sum(len(v) for v in small.values()) < 4000


def test_a_one_megabyte_line_is_handled() -> None:
    c = Classifier()
    c.feed("x" * 1_000_000)
    c.feed(b"\xff" * 1_000_000 + b" CUDA out of memory. Tried to allocate 1.00 GiB.")
    assert c.diagnose(1).kind in (Kind.OOM_WEIGHTS,)


# --------------------------------------------------------------------------- shapes seen in issue reports
def test_torch_warnings_in_glog_format_are_not_failures() -> None:
    lines = ["[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
             "[rank0]:[W1129 10:00:00.123456789 socket.cpp:464] [c10d] The server socket has failed to listen (errno: 98 - Address already in use)."]
    assert not classify(lines).names_a_failure
    # the error-level twin of the same format is read as an error
    timeout = "[E1129 10:00:00.123456789 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)"
    assert classify([timeout]).kind is Kind.ENGINE_DEAD


@pytest.mark.parametrize("report", ["      Reason:       OOMKilled", '  "reason": "OOMKilled",',
                                    "Warning  OOMKilling  2m  kubelet  Container vllm was OOMKilled"])
def test_a_container_runtimes_report_of_its_memory_kill_is_an_engine_death(report: str) -> None:
    got = classify(["INFO 08-01 12:00:00 [gpu_model_runner.py:1] Starting to load model m...", "```",
                    "$ kubectl describe pod vllm-0", "    Last State:     Terminated", report, "      Exit Code:    137"])
    assert got.kind is Kind.ENGINE_DEAD and "OOMKilled" in got.evidence and got.phase == "loading"


@pytest.mark.parametrize("inspect", ['            "OOMKilled": false,', "OOMKilled=False", "      OOMKilled: false"])
def test_a_container_runtime_saying_it_did_not_kill_is_no_failure(inspect: str) -> None:
    got = classify(["INFO 08-01 12:00:00 [gpu_model_runner.py:1] Starting to load model m...", "$ docker inspect vllm",
                    '        "State": {', '            "Status": "exited",', inspect])
    assert got.kind is Kind.INCOMPLETE, got


def test_the_shell_saying_killed_is_an_engine_death() -> None:
    got = classify(["INFO 08-01 12:00:00 [gpu_model_runner.py:1] Starting to load model m...", "Killed"])
    assert got.kind is Kind.ENGINE_DEAD and got.evidence == "Killed" and got.phase == "loading"
    assert classify(["INFO 08-01 12:00:00 [multiproc_worker_utils.py:1] Killing local vLLM worker processes"]).kind is Kind.INCOMPLETE


def test_wrappers_around_our_own_sigterm_are_not_failures() -> None:
    lines = ["INFO 08-01 12:00:00 [gpu_model_runner.py:1] Starting to load model m...",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
             "KeyboardInterrupt: terminated"]
    assert classify(lines, 1).kind is Kind.INCOMPLETE
    # a real root cause before the kill still stands
    assert classify(["ValueError: No available memory for the cache blocks."] + lines, 1).kind is Kind.NO_KV_CACHE_MEMORY


def test_pasted_command_line_states_the_requested_numbers() -> None:
    got = classify(["$ vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 32K --gpu-memory-utilization=0.95",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity of 23.5 GiB of which 0 bytes is free."])
    assert got.numbers["max_model_len"] == 32768
    assert got.numbers["requested_utilization"] == 0.95
    assert got.numbers["free_gib"] == 0.0 and got.numbers["tried_to_allocate_mib"] == round(512 / 2**20, 4)


def test_ray_worker_names_the_failing_method() -> None:
    ray = "(RayWorkerWrapper pid=28614, ip=10.128.0.5) ERROR 05-14 08:12:45 worker_base.py:145] "
    got = classify([ray + "Error executing method determine_num_available_blocks. This might cause deadlock in distributed execution.",
                    ray + "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB."], None)
    assert got.kind is Kind.OOM_PROFILE


def test_ray_host_memory_kill_is_not_a_gpu_oom() -> None:
    """Ray's memory monitor killing a task is host memory: restart, no GPU remedy."""
    d = classify([
        "(RayWorkerWrapper pid=4242) INFO 09-20 10:00:01 [worker.py:1] Starting to load model x...",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Memory on the node (IP: 10.0.0.5, ID: 6f2a) where the task (actor ID: 91c) was running was "
        "60.12GB / 62.80GB (0.957), which exceeds the memory usage threshold of 0.95.",
    ], exit_code=1)
    assert d.kind is Kind.ENGINE_DEAD


@pytest.mark.parametrize("line", [
    "ModuleNotFoundError: No module named 'vllm'",
    "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
    "ImportError: /opt/vllm/lib/python3.12/site-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c10",
])
def test_a_broken_installation_is_a_config_error(line: str) -> None:
    """No relaunch fixes a missing module or library: exit 78, not a restart loop."""
    d = classify(["Traceback (most recent call last):", '  File "<frozen runpy>", line 1, in x', line],
                 exit_code=1)
    assert d.kind is Kind.CONFIG_ERROR


def test_cpu_kv_space_messages_tell_a_given_size_from_the_automatic_share():
    given = classify([
        "(Worker pid=17669) ERROR 11-29 16:39:35 [multiproc_executor.py:1063] ValueError: Available memory on "
        "node 0 (7.96/9.59 GiB) on kv cache allocation is less than requested memory for kv (64.0 GiB). "
        "Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes."])
    assert given.kind is Kind.INSUFFICIENT_FREE_MEMORY
    assert given.numbers["cpu_kv_gib"] == 64.0 and "cpu_kv_auto_gib" not in given.numbers
    assert "CPU memory" in given.detail and "VLLM_CPU_KVCACHE_SPACE" in given.detail
    auto = classify([
        "(Worker pid=17669) ERROR 11-29 16:39:35 [multiproc_executor.py:1063] ValueError: Available memory on "
        "node 0 (3.10/9.59 GiB) on kv cache allocation is less than requested memory for kv (4.52/8.63 GiB). "
        "Reduce CPU memory used by other processes."])
    assert auto.kind is Kind.INSUFFICIENT_FREE_MEMORY
    assert auto.numbers["cpu_kv_auto_gib"] == 4.52 and auto.numbers["free_gib"] == 3.10
    assert auto.numbers["cpu_share_gib"] == 8.63
    assert "cpu_kv_gib" not in auto.numbers


def test_cpu_share_above_the_nodes_free_memory_is_insufficient_free_memory():
    d = classify([
        "(Worker pid=1) ERROR 11-29 16:39:35 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
        "(3.10/9.59 GiB) on startup is less than desired CPU memory utilization (0.9, 8.63 GiB). On the CPU backend, "
        "the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name). To "
        "resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory "
        "used by other processes."])
    assert d.kind is Kind.INSUFFICIENT_FREE_MEMORY
    assert d.numbers == {"free_gib": 3.10, "total_gib": 9.59, "requested_utilization": 0.9, "requested_gib": 8.63,
                         "cpu_node": True}
    assert "CPU memory" in d.detail


def test_a_vllm_environment_variable_that_is_not_a_number_is_a_config_error_naming_it():
    d = classify([
        "(EngineCore pid=7) ERROR 11-29 19:01:04 [core.py:1510] EngineCore failed to start.",
        "(EngineCore pid=7) ERROR 11-29 19:01:04 [core.py:1510] Traceback (most recent call last):",
        '(EngineCore pid=7) ERROR 11-29 19:01:04 [core.py:1510]   File "/opt/vllm/lib/python3.11/site-packages/vllm/'
        'envs.py", line 901, in <lambda>',
        '(EngineCore pid=7) ERROR 11-29 19:01:04 [core.py:1510]     float(os.environ.get("VLLM_ENGINE_ITERATION_TIMEOUT_S", '
        '"60"))',
        "(EngineCore pid=7) ERROR 11-29 19:01:04 [core.py:1510] ValueError: could not convert string to float: 'soon'"])
    assert d.kind is Kind.CONFIG_ERROR and d.numbers["env_var"] == "VLLM_ENGINE_ITERATION_TIMEOUT_S"
    assert "VLLM_ENGINE_ITERATION_TIMEOUT_S" in d.detail
    # the same error without a variable read in its traceback is still a configuration error, unnamed
    plain = classify(["Traceback (most recent call last):", '  File "x.py", line 1, in f', "    int(value)",
                      "ValueError: invalid literal for int() with base 10: 'x'"])
    assert plain.kind is Kind.CONFIG_ERROR and "env_var" not in plain.numbers


# --------------------------------------------------------------------------- never healthy on a failure
_S = "/usr/local/lib/python3.10/dist-packages/vllm"
_TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
              "79.15 GiB of which 1.02 GiB is free. Process 1 has 78.12 GiB memory in use. Of the allocated memory "
              "74.03 GiB is allocated by PyTorch, with 2.50 GiB allocated in private pools (e.g., CUDA Graphs), and "
              "1.10 GiB is reserved by PyTorch but unallocated.")


def _tb(*frames: str, path: str = f"{_S}/v1/worker/gpu_model_runner.py") -> list[str]:
    return ["Traceback (most recent call last):"] + [_frame(f, path) for f in frames]


@pytest.mark.parametrize("before", [
    ["(EngineCore_DP0 pid=7) INFO 09-20 10:00:00 [gpu_model_runner.py:1] Model loading took 14.25 GiB and 4.1 seconds"],
    ["INFO 09-20 10:00:00 [api_server.py:1] vLLM API server version 0.8.5"],    # a paste from the banner on
], ids=["after loading", "no milestone since the banner"])
def test_an_error_with_a_traceback_no_rule_names_is_an_unknown_failure(before: list[str]) -> None:
    e = "(EngineCore_DP0 pid=7) ERROR 09-20 10:00:01 [core.py:718] "
    lines = [*before, e + "EngineCore failed to start."] + [e + x for x in _tb("determine_available_memory", "profile_run")] + [
             e + "KeyError: 'model.layers.0.mlp.experts.w13_weight'",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    got = classify(lines)      # a pasted log: no exit code
    assert (got.kind, got.phase) == (Kind.UNKNOWN_FAILURE, "profiling")
    assert got.evidence == "KeyError: 'model.layers.0.mlp.experts.w13_weight'"


def test_model_inspection_failing_in_a_subprocess_is_a_configuration_error() -> None:
    """vLLM reads a model's code in a subprocess (model_executor/models/registry.py: _run_in_subprocess);
    it fails when that code, or a package it needs, cannot load: an installation or model problem
    that no relaunch fixes. (Was unknown_failure; issue 22 names it: configuration/installation.)"""
    e = "ERROR 05-02 10:00:00 [registry.py:360] "
    cut = [e + "Error in inspecting model architecture 'Qwen2ForCausalLM'", e + "Traceback (most recent call last):",
           e + '  File "/usr/local/lib/python3.10/dist-packages/vllm/model_executor/models/registry.py", line 587, in '
               "_run_in_subprocess",
           e + "subprocess.CalledProcessError: Command '['/usr/bin/python3', '-m', "
               "'vllm.model_executor.models.registry']' returned non-zero exit status 1."]
    got = classify(cut)
    assert got.kind is Kind.CONFIG_ERROR and "Qwen2ForCausalLM" in got.evidence
    assert classify(cut[3:]).kind is Kind.CONFIG_ERROR            # the subprocess's exit alone
    # the subprocess's own error, quoted by the wrapper, names the root cause when a rule knows it
    root = classify(cut + [e + "The above exception was the direct cause of the following exception:",
                           e + "RuntimeError: Error raised in subprocess:",
                           e + "ModuleNotFoundError: No module named 'flash_attn'"])
    assert root.kind is Kind.CONFIG_ERROR and root.evidence == "ModuleNotFoundError: No module named 'flash_attn'"
    then = classify(["ValueError: Model architectures ['Qwen2ForCausalLM'] failed to be inspected. Please check the logs "
                     "for more details."])
    assert then.kind is Kind.CONFIG_ERROR


@pytest.mark.parametrize("thread, kind, phase", [
    ("Current thread", Kind.OOM_CUDAGRAPH, "cudagraph"),   # the crashing thread was capturing
    ("Thread", Kind.UNKNOWN_FAILURE, "profiling"),         # another thread's frames say nothing
])
def test_a_fatal_python_error_is_placed_by_the_crashing_threads_frames(thread: str, kind: Kind, phase: str) -> None:
    lines = ["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 4.1 seconds",
             "Fatal Python error: Segmentation fault", "",
             f"{thread} 0x00007f1b2c7fe640 (most recent call first):",
             '  File "/usr/lib/python3/dist-packages/torch/cuda/graphs.py", line 84 in capture_end',
             f'  File "{_S}/v1/worker/gpu_model_runner.py", line 2100 in _capture_cudagraphs', "",
             "Extension modules: numpy.core._multiarray_umath (total: 12)"]
    got = classify(lines, -11)
    assert (got.kind, got.phase) == (kind, phase)
    assert got.evidence == "Fatal Python error: Segmentation fault"


@pytest.mark.parametrize("lines, exit_code, kind", [
    ([], None, Kind.NO_VLLM_OUTPUT),
    ([b"\x00\x01\x02\xff\xfe" * 40], None, Kind.NO_VLLM_OUTPUT),
    (["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Starting to load model m..."], None, Kind.INCOMPLETE),
    (["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Starting to load model m...", "Traceback (most recent call last):",
      _frame("load_model")], None, Kind.UNKNOWN_FAILURE),                # cut off before its exception line
    (["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Starting to load model m..."], 1, Kind.UNKNOWN_FAILURE),
])
def test_what_is_known_when_nothing_names_a_failure(lines: list, exit_code: int | None, kind: Kind) -> None:
    assert classify(lines, exit_code).kind is kind


# --------------------------------------------------------------------------- runtime OOMs
_E0 = "ERROR 10-15 12:00:00 async_llm_engine.py:63] "
_E1 = "(EngineCore_DP0 pid=123) ERROR 09-20 10:00:01 [core.py:710] "
_API = "(APIServer pid=1) "
_RUNTIME_OOMS = {
    "v0 engine loop, Error in model execution": [_E0 + "Engine background task failed"] + [_E0 + x for x in [
        "Traceback (most recent call last):", _frame("run_engine_loop", f"{_S}/engine/async_llm_engine.py"),
        _frame("engine_step", f"{_S}/engine/async_llm_engine.py"), _frame("step_async", f"{_S}/engine/async_llm_engine.py"),
        _frame("execute_model_async", f"{_S}/executor/gpu_executor.py"), _frame("execute_model", f"{_S}/worker/worker_base.py"),
        _frame("_wrapper", f"{_S}/worker/model_runner_base.py"),
        '    raise type(err)(f"Error in model execution (input dumped to {filename}): "',
        _TORCH_OOM.replace("CUDA out of memory", "Error in model execution (input dumped to "
                           "/tmp/err_execute_model_input_20241015-120000.pkl): CUDA out of memory", 1)]],
    "MQEngineDeadError naming the OOM": [
        "vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not running. Inspect the stacktrace to find "
        "the original error: OutOfMemoryError('CUDA out of memory. Tried to allocate 3.00 GiB.')"],
    "v1 batch queue": [_E1 + "EngineCore encountered a fatal error."] + [_E1 + x for x in [
        "Traceback (most recent call last):", _frame("run_engine_core", f"{_S}/v1/engine/core.py"),
        _frame("run_busy_loop", f"{_S}/v1/engine/core.py"), _frame("step_with_batch_queue", f"{_S}/v1/engine/core.py"),
        _frame("execute_model", f"{_S}/v1/executor/abstract.py"), _TORCH_OOM]],
    "v1 without frames, output_handler after it": [
        _E1 + "EngineCore encountered a fatal error.", _E1 + _TORCH_OOM,
        _API + "ERROR 09-20 10:00:01 [async_llm.py:480] AsyncLLM output_handler failed.",
        _API + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
               "for the root cause."],
    "a long request's prefill, serving stats above": [
        _API + "INFO 09-20 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 3000.1 tokens/s, Avg "
               "generation throughput: 10.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 90.1%",
        _E1 + "Traceback (most recent call last):", _E1 + _frame("_prepare_inputs"), _E1 + _TORCH_OOM],
}


@pytest.mark.parametrize("name", sorted(_RUNTIME_OOMS))
def test_runtime_ooms_are_placed_by_their_frames_and_context(name: str) -> None:
    got = classify(_RUNTIME_OOMS[name])
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving"), got


#: V0's scheduler warns only about requests it is running (0.5-0.10, ``vllm/core/scheduler.py``): an excerpt of a
#: run that keeps no start-up line is a serving run's
_V0_SCHEDULER_WARNINGS = [
    "WARNING 05-19 03:12:16 [scheduler.py:1769] Sequence group 6403 is preempted by PreemptionMode.RECOMPUTE mode "
    "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=7601",
    "WARNING 05-19 03:12:17 [scheduler.py:1106] Input prompt (40123 tokens) is too long and exceeds limit of 32768",
    "WARNING 05-19 03:12:18 [scheduler.py:867] Failing the request 7 because there's not enough kv cache blocks to "
    "run the entire sequence.",
]


@pytest.mark.parametrize("warning", _V0_SCHEDULER_WARNINGS, ids=["preempted", "prompt too long", "request failed"])
def test_v0_schedulers_warnings_about_running_requests_say_the_engine_serves(warning: str) -> None:
    assert (classify([f"(WorkerDict pid=33871) {warning}"] * 3).kind) == Kind.HEALTHY
    got = classify([warning, _OOM])      # an OOM no frame places, after them
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving"), got


#: Packages installed at versions that do not go together, in the words of the package that found it (a
#: framework's pin on vLLM or its neighbours, a name that moved between releases): no relaunch fixes them
_VERSION_CONFLICTS = [
    # transformers.utils.versions.require_version (LLaMA-Factory, verl and others pin through it)
    "ImportError: vllm>=0.4.3,<=0.8.5 is required for a normal functioning of this module, but found vllm==0.10.2.",
    # pkg_resources (setuptools)
    "pkg_resources.DistributionNotFound: The 'triton==3.1.0' distribution was not found and is required by torch",
    "pkg_resources.VersionConflict: (torch 2.5.1 (/usr/local/lib/python3.10/dist-packages), "
    "Requirement.parse('torch==2.4.0'))",
    # importlib.metadata
    "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm",
    # an import of a name the installed release does not have
    "ImportError: cannot import name 'PoolingParams' from 'vllm' (/usr/local/lib/python3.10/dist-packages/vllm/__init__.py)",
]


@pytest.mark.parametrize("line", _VERSION_CONFLICTS,
                         ids=["require_version", "DistributionNotFound", "VersionConflict", "no metadata",
                              "cannot import name"])
def test_packages_at_versions_that_do_not_go_together_are_a_broken_installation(line: str) -> None:
    got = classify(["Traceback (most recent call last):", '  File "/app/src/train.py", line 12, in <module>',
                    "    from vllm import LLM", line], 1)
    assert got.kind == Kind.CONFIG_ERROR, got
    assert got.evidence == line


# --------------------------------------------------------------------------- each way an OOM is placed
# One test per path, each built so that only that path can place the OOM right (the other paths are
# absent from the log, or would place it elsewhere): removing the path fails its test.
_LOADING = "INFO 09-20 10:00:01 [gpu_model_runner.py:1] Starting to load model m..."      # a milestone
_PROFILING = "INFO 09-20 10:00:02 [gpu_model_runner.py:1] Model loading took 14.25 GiB and 4.1 seconds"


def test_an_oom_the_message_names_is_a_weight_oom_wherever_it_is() -> None:
    """vLLM's own "Failed to load model - not enough GPU memory" (gpu_model_runner.load_model, 0.13+)."""
    line = ("ERROR 09-20 10:00:03 [gpu_model_runner.py:3421] Failed to load model - not enough GPU memory. Try "
            "lowering --gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, or "
            "using --quantization.")
    got = classify([_PROFILING, "INFO 09-20 10:00:03 [kv_cache_utils.py:1] GPU KV cache size: 10,000 tokens", line], 1)
    assert (got.kind, got.phase) == (Kind.OOM_WEIGHTS, "loading")


def test_after_serving_began_an_oom_is_the_servings_whatever_start_up_frame_it_shows() -> None:
    """Once vLLM served, an OOM is a serving OOM even where the pasted traceback keeps only a loading
    frame (weights reloaded while serving)."""
    lines = [_LOADING, 'INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
             *_tb("load_weights", path=f"{_S}/model_executor/models/llama.py"), _OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving")


@pytest.mark.parametrize("frames", [
    # the API server streaming a chat completion (V0 runs the engine in the API server's process)
    (("chat_completion_stream_generator", f"{_S}/entrypoints/openai/serving_chat.py"),
     ("generate", f"{_S}/engine/async_llm_engine.py")),
    # attention over a prompt's computed context (a later chunk of a chunked prefill, a cached prefix):
    # the profile's dummy batch has none
    (("forward", f"{_S}/attention/backends/mla/common.py"),
     ("_compute_prefill_context", f"{_S}/attention/backends/mla/common.py")),
    # the V1 engine core's busy loop, reloading weights while serving (a loading frame under it)
    (("run_busy_loop", f"{_S}/v1/engine/core.py"), ("_process_input_queue", f"{_S}/v1/engine/core.py"),
     ("load_weights", f"{_S}/model_executor/models/llama.py")),
    # V0's engine loop
    (("run_engine_loop", f"{_S}/engine/async_llm_engine.py"), ("engine_step", f"{_S}/engine/async_llm_engine.py"),
     ("_dummy_sampler_run", f"{_S}/worker/model_runner.py")),
], ids=["request handler", "prefill over a computed context", "busy loop over a loading frame", "v0 engine loop"])
def test_a_frame_only_a_serving_vllm_runs_places_the_oom_in_serving(frames: tuple) -> None:
    lines = [_LOADING, "Traceback (most recent call last):", *[_frame(f, p) for f, p in frames], _OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving"), got


def test_a_serving_loop_name_in_another_package_places_nothing() -> None:
    """torch._dynamo has a ``step`` of its own (its bytecode interpreter, inside a compile in profile_run)."""
    lines = [_PROFILING, "Traceback (most recent call last):",
             _frame("step", "/usr/lib/python3/dist-packages/torch/_dynamo/symbolic_convert.py"), _OOM]
    assert classify(lines, 1).kind is Kind.OOM_PROFILE


def test_a_dead_engine_loop_naming_the_oom_places_it_in_serving_over_the_last_milestone() -> None:
    line = ("vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not running. Inspect the stacktrace to "
            "find the original error: OutOfMemoryError('CUDA out of memory. Tried to allocate 3.00 GiB.')")
    got = classify([_PROFILING, line], 1)
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving")


def test_a_serving_time_wrapper_after_a_frameless_oom_places_it_in_serving() -> None:
    """V1 0.8.5+: the engine core's "EngineCore encountered a fatal error." and the API server's
    "AsyncLLM output_handler failed." follow the root cause."""
    lines = [_PROFILING, _E1 + _TORCH_OOM, _API + "ERROR 09-20 10:00:01 [async_llm.py:480] AsyncLLM output_handler failed."]
    got = classify(lines)
    assert (got.kind, got.phase) == (Kind.OOM_RUNTIME, "serving")


def test_a_frame_of_the_models_execution_alone_places_the_oom_in_serving() -> None:
    """V1's GPUModelRunner.execute_model runs requests (profiling and capture use _dummy_run): with no
    frame of a start-up phase above it, the engine was serving, whatever milestone was last pasted."""
    lines = [_PROFILING, "INFO 09-20 10:00:03 [kv_cache_utils.py:1] GPU KV cache size: 10,000 tokens",
             *_tb("execute_model"), _OOM]
    assert (classify(lines, 1).kind, classify(lines, 1).phase) == (Kind.OOM_RUNTIME, "serving")


def test_a_later_copy_of_the_oom_with_frames_places_it_over_the_first_copys_milestone() -> None:
    """V0's MQ engine logs str(e) first (no frames), then the traceback: its frames place the OOM."""
    v0 = "ERROR 10-15 12:00:00 engine.py:366] "
    lines = ["INFO 10-15 12:00:00 model_runner.py:1077] Loading model weights took 14.9595 GB",
             v0 + "CUDA out of memory. Tried to allocate 2.00 GiB.", "Traceback (most recent call last):",
             _frame("capture_model", f"{_S}/worker/model_runner.py"), _frame("capture", f"{_S}/worker/model_runner.py"),
             _TORCH_OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (Kind.OOM_CUDAGRAPH, "cudagraph")
    assert got.numbers["tried_to_allocate_mib"] == 2048.0


def test_the_milestone_before_a_frameless_oom_places_it() -> None:
    assert classify([_PROFILING, _TORCH_OOM], 1).kind is Kind.OOM_PROFILE
    assert classify([_LOADING, _TORCH_OOM], 1).kind is Kind.OOM_WEIGHTS


@pytest.mark.parametrize(("banner", "kind", "phase"), [
    ("INFO 10-15 12:00:00 llm_engine.py:234] Initializing a V0 LLM engine (v0.7.3) with config: model='m'",
     Kind.OOM_PROFILE, "kv_cache"),
    ("(EngineCore_DP0 pid=7) INFO 10-15 12:00:00 [core.py:74] Initializing a V1 LLM engine (v0.11.0) with config: "
     "model='m'", Kind.OOM_CUDAGRAPH, "cudagraph"),
])
def test_a_frameless_oom_after_the_kv_cache_was_sized_is_placed_by_the_engine_generation(
        banner: str, kind: Kind, phase: str) -> None:
    """After the KV cache was sized, V0 announces its capture and V1 does not: a frameless OOM there is V0's
    allocation and V1's capture. The generation is the log's, though the line with V0's block count was left
    out of the paste (found: V0 read as V1 without it)."""
    lines = [banner, "INFO 10-15 12:00:00 executor_base.py:429] Maximum concurrency for 131072 tokens per request: "
             "8.53x", _TORCH_OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (kind, phase), got
    unplaced = Diagnosis(Kind.OOM_WEIGHTS, "CUDA out of memory.", {"engine": "v0" if "V0" in banner else "v1"},
                         "unknown", "")
    assert place(unplaced, "kv_cache").kind is kind      # (the daemon's: the phase its live stream reached)


@pytest.mark.parametrize(("frames", "kind", "phase"), [
    ([("run_mp_engine", f"{_S}/engine/multiprocessing/engine.py"), ("from_engine_args", f"{_S}/engine/llm_engine.py")],
     Kind.OOM_PROFILE, "kv_cache"),
    ([("run_engine_core", f"{_S}/v1/engine/core.py"), ("__init__", f"{_S}/v1/engine/core.py")],
     Kind.OOM_CUDAGRAPH, "cudagraph"),
])
def test_a_frameless_oom_is_placed_by_the_engine_generation_the_whole_log_shows(
        frames: list[tuple[str, str]], kind: Kind, phase: str) -> None:
    """A paste cut to its last lines (the banner gone): the engine generation shows only in the frames printed
    after the error, which place nothing themselves; the verdict is that generation's (found: V0's KV cache
    allocation read as V1's capture)."""
    lines = ["INFO 10-15 12:00:00 executor_base.py:429] Maximum concurrency for 131072 tokens per request: 8.53x",
             "ERROR 10-15 12:00:00 engine.py:366] CUDA out of memory. Tried to allocate 2.00 GiB.",
             "Traceback (most recent call last):", *[_frame(*f) for f in frames]]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (kind, phase), got


_V0_LOADED = "INFO 10-15 12:00:00 model_runner.py:1077] Loading model weights took 14.9595 GB"
_V0_BLOCKS = "INFO 10-15 12:00:03 distributed_gpu_executor.py:57] # GPU blocks: 2471, # CPU blocks: 2048"
_V0_CAPTURING = ("INFO 10-15 12:00:04 model_runner.py:1398] Capturing the model for CUDA graphs. This may lead to "
                 "unexpected consequences if the model is not static.")


@pytest.mark.parametrize(("before", "frames", "kind", "phase"), [
    # V0's worker initialize_cache sizes the KV cache, then warms up and captures: the frames below it were cut
    ([_V0_LOADED, _V0_BLOCKS, _V0_CAPTURING], [("initialize_cache", f"{_S}/worker/worker.py")],
     Kind.OOM_CUDAGRAPH, "cudagraph"),
    ([_V0_LOADED, _V0_BLOCKS], [("initialize_cache", f"{_S}/worker/worker.py")], Kind.OOM_PROFILE, "kv_cache"),
    # V0's model runner's execute_model runs the profile's batch: after the weights, before any serving
    ([_V0_LOADED], [("execute_model", f"{_S}/worker/model_runner.py")], Kind.OOM_PROFILE, "profiling"),
    ([_V0_LOADED, _V0_BLOCKS, _V0_CAPTURING], [("execute_model", f"{_S}/worker/model_runner.py")],
     Kind.OOM_CUDAGRAPH, "cudagraph"),
    # ... and the server's, once it serves
    ([_V0_LOADED, _V0_BLOCKS, "INFO:     Application startup complete."],
     [("execute_model", f"{_S}/worker/model_runner.py")], Kind.OOM_RUNTIME, "serving"),
    # V0's worker _warm_up_model captures the graphs (its warm-up is the sampler's seed): capture begun or not
    ([_V0_LOADED, _V0_BLOCKS, _V0_CAPTURING], [("_warm_up_model", f"{_S}/worker/worker.py")],
     Kind.OOM_CUDAGRAPH, "cudagraph"),
    ([_V0_LOADED, _V0_BLOCKS], [("_warm_up_model", f"{_S}/worker/worker.py")], Kind.OOM_CUDAGRAPH, "cudagraph"),
    ([_V0_LOADED, _V0_BLOCKS, _V0_CAPTURING, "INFO 10-15 12:00:20 model_runner.py:1523] Graph capturing finished in "
      "16 secs."], [("_warm_up_model", f"{_S}/worker/worker.py")], Kind.OOM_PROFILE, "warmup"),
    # V1's worker compile_or_warm_up_model warms up, captures and warms the sampler up: capture under way, or done
    # and the engine's start-up timed (a milestone logged after the call began says no more than its last phase)
    (["(EngineCore_DP0 pid=7) Capturing CUDA graph shapes:  45%|####5     | 30/67"],
     [("compile_or_warm_up_model", f"{_S}/v1/worker/gpu_worker.py")], Kind.OOM_CUDAGRAPH, "cudagraph"),
    (["(EngineCore_DP0 pid=7) INFO 10-15 12:00:55 [gpu_model_runner.py:3118] Graph capturing finished in 9 secs, "
      "took 0.59 GiB", "(EngineCore_DP0 pid=7) INFO 10-15 12:00:55 [core.py:218] init engine (profile, create kv "
      "cache, warmup model) took 55.48 seconds"],
     [("compile_or_warm_up_model", f"{_S}/v1/worker/gpu_worker.py")], Kind.OOM_PROFILE, "warmup"),
    # ... as does the executor's, which has its workers run it (found: a paste that left out the deeper frames)
    (["(EngineCore_DP0 pid=7) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|####5     | 30/67"],
     [("_initialize_kv_caches", f"{_S}/v1/engine/core.py"),
      ("compile_or_warm_up_model", f"{_S}/v1/executor/abstract.py")], Kind.OOM_CUDAGRAPH, "cudagraph"),
    # V1's executor initialize_from_config has its workers allocate, then compile, warm up and capture
    (["(EngineCore_DP0 pid=7) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|####5     | 30/67"],
     [("_initialize_kv_caches", f"{_S}/v1/engine/core.py"), ("initialize_from_config", f"{_S}/v1/executor/abstract.py")],
     Kind.OOM_CUDAGRAPH, "cudagraph"),
    # the whole traceback: its deepest frame places it, whatever the milestones
    ([_V0_LOADED, _V0_BLOCKS, _V0_CAPTURING], [("initialize_cache", f"{_S}/worker/worker.py"),
                                              ("_allocate_kv_cache", f"{_S}/worker/cache_engine.py")],
     Kind.OOM_PROFILE, "kv_cache"),
])
def test_a_traceback_cut_below_a_frame_that_runs_later_phases_is_placed_by_the_milestones(
        before: list[str], frames: list[tuple[str, str]], kind: Kind, phase: str) -> None:
    """A paste that left the deeper frames out ("..." in the traceback, or its end only): the deepest frame
    kept is one whose call runs the start-up's later phases too, so the milestones logged before it, of a later
    phase, say where it failed."""
    lines = [*before, "Traceback (most recent call last):", *[_frame(f, p) for f, p in frames], "...", _TORCH_OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (kind, phase), got


def test_v0_model_execution_wrapper_is_no_evidence_of_serving() -> None:
    """vLLM 0.6.x's dump_input_when_exception wraps execute_model, which profile_run calls too."""
    line = _TORCH_OOM.replace("CUDA out of memory", "Error in model execution (input dumped to "
                              "/tmp/err_execute_model_input_20241015-120000.pkl): CUDA out of memory", 1)
    assert classify([_PROFILING, line], 1).kind is Kind.OOM_PROFILE
    assert classify([line], 1).phase == "unknown"


def test_an_oom_nothing_places_has_an_unknown_phase_and_the_daemon_places_it_where_the_stream_was() -> None:
    got = classify([_TORCH_OOM], 1)
    assert got.phase == "unknown" and "nothing in the log says where" in got.detail
    assert got.kind is Kind.OOM_WEIGHTS       # read as the phase the output reached: the start-up's first
    assert got.numbers["tried_to_allocate_mib"] == 1536.0
    served = place(got, "serving")             # the live launch had answered a probe
    assert (served.kind, served.phase) == (Kind.OOM_RUNTIME, "serving")
    assert served.numbers == got.numbers
    assert (place(got, "profiling").kind, place(got, "cudagraph").kind) == (Kind.OOM_PROFILE, Kind.OOM_CUDAGRAPH)
    assert place(classify([_PROFILING, _TORCH_OOM], 1), "serving").phase == "profiling"   # placed: kept


def test_the_private_pools_phrase_is_no_evidence_of_capture() -> None:
    """Every PyTorch >= 2.1 OOM message names the private pools; only frames or milestones place it."""
    lines = ["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 4.1 seconds", _TORCH_OOM]
    assert classify(lines, 1).kind is Kind.OOM_PROFILE


# --------------------------------------------------------------------------- start-up OOMs
@pytest.mark.parametrize("frames, kind, phase", [
    (("determine_available_memory", "profile_run", "_dummy_run"), Kind.OOM_PROFILE, "profiling"),
    (("profile_run", "_dummy_sampler_run"), Kind.OOM_PROFILE, "profiling"),
    (("profile_run", "_get_mm_dummy_batch", "_dummy_mm_kwargs"), Kind.OOM_PROFILE, "profiling"),   # multimodal dummy data
    (("profile_run", "dummy_data_for_profiling", "get_dummy_data"), Kind.OOM_PROFILE, "profiling"),
    (("load_model", "process_weights_after_loading", "gptq_marlin_repack"), Kind.OOM_WEIGHTS, "loading"),
    (("compile_or_warm_up_model", "kernel_warmup", "deep_gemm_warmup", "_deepgemm_fp8_gemm_nt_warmup"),
     Kind.OOM_PROFILE, "warmup"),        # kernel warm-up after the KV cache: eager mode would not skip it
    (("compile_or_warm_up_model", "capture_model", "_capture_cudagraphs", "_dummy_run"), Kind.OOM_CUDAGRAPH, "cudagraph"),
    (("initialize_from_config", "initialize_kv_cache", "_allocate_kv_cache_tensors"), Kind.OOM_PROFILE, "kv_cache"),
])
def test_start_up_ooms_are_placed_by_their_frames(frames: tuple, kind: Kind, phase: str) -> None:
    lines = ["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 4.1 seconds",
             "INFO 09-20 10:00:01 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens"] + _tb(*frames) + [_TORCH_OOM]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (kind, phase)


def test_a_cuda_error_in_capture_frames_is_the_capture() -> None:
    lines = ["INFO 09-20 10:00:01 [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 4.1 seconds",
             *_tb("capture_model"), _frame("capture_begin", "/x/torch/cuda/graphs.py"),
             "RuntimeError: CUDA error: operation failed due to a previous error during capture"]
    assert classify(lines, 1).kind is Kind.OOM_CUDAGRAPH


def test_a_captured_graphs_replay_is_no_capture() -> None:
    """torch.cuda.graphs' replay runs a graph captured long before: an illegal memory access there, the engine's
    death while it serves (a paste cut at its top: nothing else says it served), never the capture."""
    lines = [_frame("__call__", f"{_S}/compilation/cuda_graph.py"), "    entry.cudagraph.replay()",
             _frame("replay", "/x/torch/cuda/graphs.py"), "    super().replay()",
             "RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert classify(lines, 1).kind is Kind.ENGINE_DEAD


@pytest.mark.parametrize("code, kind", [(-15, Kind.UNKNOWN_FAILURE), (-9, Kind.ENGINE_DEAD)])
def test_a_worker_the_executor_ended_is_no_cause_of_its_own(code: int, kind: Kind) -> None:
    """V0's monitor logs each worker's exit: -15 is the executor's SIGTERM after its own failure (the traceback
    above decides); -9 is a worker killed from outside (the kernel's OOM killer): a death of its own."""
    w = "(VllmWorkerProcess pid=19160) ERROR 10-30 11:05:22 multiproc_worker_utils.py:233] "
    exc = "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"
    lines = ["INFO 10-30 11:05:21 model_runner.py:1056] Starting to load model /m...",
             w + "Exception in worker VllmWorkerProcess while processing method load_model.",
             w + "Traceback (most recent call last):",
             w + f'  File "{_S}/model_executor/model_loader/weight_utils.py", line 420, in safetensors_weights_iterator',
             w + '    with safe_open(st_file, framework="pt") as f:', w + exc,
             f"ERROR 10-30 11:05:24 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 19160 died, exit code: {code}",
             "INFO 10-30 11:05:24 multiproc_worker_utils.py:124] Killing local vLLM worker processes"]
    got = classify(lines, 1)
    assert got.kind is kind, got
    if kind is Kind.UNKNOWN_FAILURE:
        assert got.evidence == exc and got.phase == "loading"


@pytest.mark.parametrize("end", [[], ["...(output cut here)"], ["", "[the rest was too long to paste]"]])
def test_a_traceback_cut_before_its_exception_line_is_an_unknown_failure_however_the_paste_ends(end: list[str]) -> None:
    """A traceback whose frames end the paste, or are followed by a line that has no exception line's form (the
    reporter's note that the rest was cut): the cause is not in the paste, but something failed."""
    lines = ["INFO 08-05 12:11:01 [gpu_model_runner.py:1] Model loading took 7.1 GiB and 9 s",
             "Traceback (most recent call last):",
             f'  File "{_S}/v1/engine/core.py", line 674, in run_engine_core',
             "    engine_core = EngineCoreProc(*args, **kwargs)",
             '  File "/usr/lib/python3/dist-packages/torch/_inductor/async_compile.py", line 346, in triton',
             "    kernel.precompile(", *end]
    got = classify(lines, 1)
    assert got.kind is Kind.UNKNOWN_FAILURE and "cut off before its exception line" in got.evidence, got
    assert "async_compile.py" in got.evidence


# --------------------------------------------------------------------------- short pastes
@pytest.mark.parametrize("lines, kind", [
    (_tb("determine_num_available_blocks", "raise_if_cache_size_invalid", path=f"{_S}/worker/worker.py")
     + ['    raise ValueError("No available memory for the cache blocks. "'], Kind.NO_KV_CACHE_MEMORY),
    (_tb("initialize_cache", path=f"{_S}/worker/worker.py") + ["    raise ValueError(",
                                                               '        "No available memory for the cache blocks. "'],
     Kind.NO_KV_CACHE_MEMORY),
    (["    raise ValueError(\"No available memory for the cache blocks. \""], Kind.NO_KV_CACHE_MEMORY),
    (["No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."],
     Kind.NO_KV_CACHE_MEMORY),
])
def test_short_pastes_still_name_the_failure(lines: list[str], kind: Kind) -> None:
    got = classify(lines)
    assert got.kind is kind
    assert "No available memory" in got.evidence


def test_the_exception_line_beats_its_raise_source_line() -> None:
    lines = _tb("check_enough_kv_cache_memory", path=f"{_S}/v1/core/kv_cache_utils.py") + [
        '    raise ValueError(f"To serve at least one request with the models\'s max seq len "',
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory, the "
        "estimated maximum model length is 41840. Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"]
    got = classify(lines, 1)
    assert got.kind is Kind.KV_CACHE_INSUFFICIENT and got.numbers["fit_max_model_len"] == 41840
    assert got.evidence.startswith("ValueError:") and got.phase == "kv_cache"


# --------------------------------------------------------------------------- placement groups
_PG = ["(APIServer pid=1) INFO 09-20 10:00:01 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: "
       "model='m', tensor_parallel_size=4, pipeline_parallel_size=2, seed=0",
       "(APIServer pid=1) WARNING 09-20 10:00:02 [ray_utils.py:300] The number of required GPUs exceeds the total "
       "number of available GPUs in the placement group."]


def test_a_placement_group_shortage_vllm_only_warns_about_is_a_config_error_with_a_grace() -> None:
    c = Classifier()
    announced = [d for line in _PG if (d := c.feed(line))]
    assert announced and announced[0].kind is Kind.CONFIG_ERROR
    got = c.diagnose(None)
    assert got.kind is Kind.CONFIG_ERROR and got.phase == "engine_init"
    assert got.numbers["required_gpus"] == 8 and got.numbers["grace_s"] == 60
    assert "8 GPUs" in got.detail
    # Ray's waiting line names the bundles: their count is what vLLM asked for
    wait = ("(APIServer pid=1) INFO 09-20 10:00:12 [ray_utils.py:178] Waiting for creating a placement group of specs "
            "for 10 seconds. specs=[{'GPU': 1.0, 'node:10.0.0.1': 0.001}, {'GPU': 1.0}]. Check `ray status`")
    assert classify([wait]).numbers == {"required_gpus": 2, "grace_s": 60}


def test_the_tensor_parallel_warning_says_how_many_gpus_were_asked_and_found() -> None:
    got = classify(["WARNING 09-20 10:00:02 [ray_utils.py:300] Tensor parallel size (4) exceeds available GPUs (2). "
                    "This may result in Ray placement group allocation failures. Consider reducing tensor_parallel_size "
                    "to 2 or less, or ensure your Ray cluster has 4 GPUs available."])
    assert got.kind is Kind.CONFIG_ERROR
    assert got.numbers == {"required_gpus": 4, "available_gpus": 2, "grace_s": 60}
    assert "needs 4 GPUs" in got.detail and "only 2 are available" in got.detail


def test_a_placement_group_that_comes_after_all_withdraws_the_verdict() -> None:
    c = Classifier()
    for line in _PG + ["(EngineCore pid=2) INFO 09-20 10:00:41 [gpu_model_runner.py:1] Starting to load model m...",
                       "(EngineCore pid=2) ValueError: No available memory for the cache blocks."]:
        c.feed(line)
    assert c.diagnose(1).kind is Kind.NO_KV_CACHE_MEMORY
    assert classify(_PG + ["INFO 09-20 10:00:41 [gpu_model_runner.py:1] Starting to load model m..."]).kind is Kind.INCOMPLETE


@pytest.mark.parametrize("line, required, available", [
    ("ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group. "
     "Required number of devices: 4. Total number of devices: 2.", 4, 2),
    ("AssertionError: please set tensor_parallel_size (4) to less than max local gpu count (1)", 4, 1),
    ("AssertionError: local_world_size (4) exceeds assigned_physical_gpu_ids count ([0, 1])", 4, 2),
    ("ValueError: World size (8) is larger than the number of available GPUs (4) in this node. If this is "
     "intentional and you are using:", 8, 4),
])
def test_more_gpus_than_there_are_is_a_config_error_that_counts_them(line: str, required: int, available: int) -> None:
    got = classify([line], 1)
    assert got.kind is Kind.CONFIG_ERROR and "grace_s" not in got.numbers     # vLLM exits by itself
    assert (got.numbers["required_gpus"], got.numbers["available_gpus"]) == (required, available)
    assert f"needs {required} GPUs" in got.detail


@pytest.mark.parametrize("line", [
    "(APIServer pid=1) INFO 09-20 10:00:02 [ray_utils.py:330] No current placement group found. Creating a new placement group.",
    "(APIServer pid=1) INFO 09-20 10:00:02 [ray_utils.py:310] Using the existing placement group",
    "(APIServer pid=1) DEBUG 09-20 10:00:02 [ray_utils.py:300] The number of required GPUs exceeds the total number of "
    "available GPUs in the placement group.",
])
def test_placement_group_look_alikes_are_not_failures(line: str) -> None:
    assert not classify([line]).names_a_failure


def test_a_requests_error_while_serving_stays_non_fatal() -> None:
    lines = ["(APIServer pid=1) ERROR 09-20 10:00:02 [serving_chat.py:222] Error in preprocessing prompt inputs",
             *_tb("create_chat_completion", path=f"{_S}/entrypoints/openai/serving_chat.py"),
             "vllm.exceptions.VLLMValidationError: The decoder prompt (length 5000) is longer than the maximum model "
             "length of 4096. Make sure that `max_model_len` is no smaller than the number of text tokens.",
             '(APIServer pid=1) INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request']
    got = classify(lines)
    assert got.kind is Kind.HEALTHY and got.phase == "serving"    # a request was answered: it serves
    # any exception inside a request handler's traceback is that request's
    other = lines[:3] + ["TypeError: 'NoneType' object is not subscriptable"]
    assert not classify(other).names_a_failure


# an offline `LLM(...)` script: the engine's start-up, then LLM.generate's tqdm bars (no log prefix)
_OFFLINE = ["INFO 08-20 10:00:13 [core.py:73] Initializing a V1 LLM engine (v0.10.1) with config: model='m'",
            "INFO 08-20 10:00:15 [gpu_model_runner.py:1913] Starting to load model m...",
            "INFO 08-20 10:00:20 [gpu_model_runner.py:1945] Model loading took 2.8876 GiB and 4.1 seconds",
            "INFO 08-20 10:00:30 [gpu_worker.py:276] Available KV cache memory: 16.31 GiB",
            "INFO 08-20 10:00:40 [core.py:193] init engine (profile, create kv cache, warmup model) took 20.31 seconds",
            "Adding requests: 100%|\u2588\u2588\u2588\u2588\u2588| 4/4 [00:00<00:00, 812.41it/s]"]


@pytest.mark.parametrize("bar", [
    "Processed prompts: 100%|\u2588\u2588\u2588\u2588\u2588| 4/4 [00:00<00:00,  9.11it/s, est. speed input: 59.23 "
    "toks/s, output: 145.79 toks/s]", "Processed prompts:   0%|          | 0/4 [00:00<?, ?it/s]"])
def test_an_offline_run_that_generates_has_served(bar: str) -> None:
    got = classify([*_OFFLINE, bar, "Prompt: 'Hello, my name is', Generated text: ' Joel'"], 0)
    assert (got.kind, got.phase) == (Kind.HEALTHY, "serving")
    # an out-of-memory error while it generates is the run's, not its start-up's
    oom = classify([*_OFFLINE, bar, "Traceback (most recent call last):", '  File "run.py", line 9, in <module>',
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
                    "capacity of 22.05 GiB of which 3.06 MiB is free."], 1)
    assert (oom.kind, oom.phase) == (Kind.OOM_RUNTIME, "serving")
    assert classify(_OFFLINE[:-1], 0).kind is Kind.INCOMPLETE    # started, generated nothing


@pytest.mark.parametrize("line, kind", [
    ("RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB", Kind.OOM_WEIGHTS),           # ROCm
    ("RuntimeError: hipErrorOutOfMemory", Kind.OOM_WEIGHTS),
    ("RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB",
     Kind.OOM_WEIGHTS),                                                                           # Gaudi
    ("RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", Kind.OOM_WEIGHTS),                      # XPU
    ("ImportError: DLL load failed while importing _C: The specified module could not be found.", Kind.CONFIG_ERROR),
    # a build without this GPU's kernels (ROCm's HIP runtime, CUDA's): an installation to fix, not a crash
    ('"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"', Kind.CONFIG_ERROR),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", Kind.CONFIG_ERROR),
])
def test_other_accelerators_and_platforms(line: str, kind: Kind) -> None:
    assert classify([line], 1).kind is kind


def test_vllm_0_3_profiling_frames_place_an_oom() -> None:
    lines = ["INFO 01-02 10:00:00 llm_engine.py:70] Initializing an LLM engine with config: model='m', tensor_parallel_size=1",
             *_tb("_init_cache", path=f"{_S}/engine/llm_engine.py"), _frame("_run_workers", f"{_S}/engine/llm_engine.py"),
             _frame("profile_num_available_blocks", f"{_S}/worker/worker.py"), _frame("execute_model", f"{_S}/worker/model_runner.py"),
             "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 15.78 GiB total capacity; "
             "14.50 GiB already allocated; 3.06 MiB free; 14.60 GiB reserved in total by PyTorch)"]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (Kind.OOM_PROFILE, "profiling")


# --------------------------------------------------------------------------- numbers that say the kind
@pytest.mark.parametrize("line, number", [
    # V1 gpu_worker.determine_available_memory (0.9.1+): logger.info("Available KV cache memory: %.2f GiB")
    ("(EngineCore_DP0 pid=7) INFO 09-20 10:00:41 [gpu_worker.py:298] Available KV cache memory: -2.77 GiB",
     ("kv_available_gib", -2.77)),
    # V0 worker.determine_num_available_blocks (0.6.4-0.7): the profile's summary, one record of several lines
    ("INFO 10-15 12:00:12 worker.py:232] model weights take 14.99GiB; non_torch_memory takes 0.09GiB; PyTorch "
     "activation peak memory takes 7.35GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
     ("kv_available_gib", -1.05)),
    # V0 worker.determine_num_available_blocks (0.6.4-0.7), its one-line summary: kv_cache_size={:.2f}GiB
    ("INFO 10-15 08:21:18 worker.py:262] Memory profiling results: total_gpu_memory=23.64GiB "
     "initial_memory_usage=23.06GiB peak_torch_memory=24.44GiB memory_usage_post_profile=23.18GiB "
     "non_torch_memory=0.37GiB kv_cache_size=-3.53GiB gpu_memory_utilization=0.90", ("kv_available_gib", -3.53)),
    # V0 executor_base.initialize_cache (0.7): logger.info("# %s blocks: %d, # CPU blocks: %d")
    ("INFO 10-15 12:00:13 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 2048", ("num_gpu_blocks", 0)),
    ("INFO 10-15 12:00:13 gpu_executor.py:76] # GPU blocks: 0, # CPU blocks: 2048", ("num_gpu_blocks", 0)),
])
def test_no_memory_left_for_the_kv_cache_is_read_from_the_sizing_line_when_the_traceback_is_cut(line: str, number: tuple) -> None:
    c = Classifier()
    assert c.feed("INFO 10-15 12:00:10 model_runner.py:1077] Loading model weights took 14.9595 GB") is None
    assert c.feed(line) is None      # not announced while streaming: vLLM raises at once, or goes on
    got = c.diagnose(None)
    assert (got.kind, got.phase) == (Kind.NO_KV_CACHE_MEMORY, "kv_cache")
    assert got.numbers[number[0]] == number[1]
    # the error itself, when it comes, is the evidence
    err = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
    assert c.feed(err) is not None and c.diagnose(1).evidence == err


def test_zero_blocks_of_an_attention_free_model_that_goes_on_is_no_failure() -> None:
    """V0 gives an attention-free model (Mamba) no cache blocks and goes on (worker.raise_if_cache_size_invalid)."""
    lines = ["INFO 10-15 12:00:13 gpu_executor.py:76] # GPU blocks: 0, # CPU blocks: 0",
             "INFO 10-15 12:00:14 model_runner.py:1404] Capturing cudagraphs for decoding.",
             "INFO 10-15 12:00:30 launcher.py:19] Available routes are:", "INFO:     Application startup complete."]
    assert classify(lines).kind is Kind.HEALTHY
    assert classify(["INFO 10-15 12:00:13 gpu_executor.py:76] # GPU blocks: 2471, # CPU blocks: 2048"]).kind \
        is Kind.INCOMPLETE


# --------------------------------------------------------------------------- wrapped causes with a plain meaning
def test_an_exception_raised_in_a_vllm_plugins_own_code_is_an_installation_error() -> None:
    """An out-of-tree platform plugin (vllm-ascend) failing in its own profile_run: a plugin that does not
    match the installed vLLM."""
    p = "/usr/local/python3.10/lib/python3.10/site-packages"
    lines = ["(EngineCore_DP0 pid=7) ERROR 09-20 10:00:41 [core.py:718] EngineCore failed to start.",
             "Traceback (most recent call last):",
             f'  File "{p}/vllm/v1/engine/core.py", line 709, in run_engine_core',
             f'  File "{p}/vllm_ascend/worker/worker_v1.py", line 214, in determine_available_memory',
             f'  File "{p}/vllm_ascend/worker/model_runner_v1.py", line 2411, in profile_run',
             "KeyError: 'attn_metadata'",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    got = classify(lines, 1)
    assert (got.kind, got.phase) == (Kind.CONFIG_ERROR, "profiling")
    assert got.numbers["plugin"] == "vllm_ascend" and "vllm_ascend" in got.detail
    assert got.evidence == "KeyError: 'attn_metadata'"
    # the same exception raised in vLLM's own code stays an unknown failure (a checkpoint's missing key)
    own = lines[:3] + [f'  File "{p}/vllm/model_executor/models/llama.py", line 480, in load_weights',
                       "KeyError: 'model.layers.0.mlp.gate_proj.weight'", lines[-1]]
    assert classify(own, 1).kind is Kind.UNKNOWN_FAILURE


# --------------------------------------------------------------------------- an exception line known by its place
@pytest.mark.parametrize("exc", [
    "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 65536. "
    "Reducing block sizes or `num_stages` may help.",
    "OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 65536.",
    "StopIteration",
])
def test_the_line_after_a_tracebacks_frames_is_its_exception_whatever_its_class_is_called(exc: str) -> None:
    """Not every exception class ends in Error: the line right after the frames is the exception line, and
    the root cause above the wrapper that follows it."""
    tag = "(EngineCore_DP0 pid=311) ERROR 11-02 09:12:52 [core.py:708] "
    lines = ["(EngineCore_DP0 pid=311) INFO 11-02 09:12:01 [gpu_model_runner.py:2602] Starting to load model m...",
             tag + "EngineCore failed to start.",
             tag + "Traceback (most recent call last):",
             tag + f'  File "{_S}/v1/engine/core.py", line 699, in run_engine_core',
             tag + "    engine_core = EngineCoreProc(*args, **kwargs)",
             tag + '  File "/usr/local/lib/python3.12/dist-packages/triton/compiler/compiler.py", line 423, in '
                   "_init_handles",
             tag + "    raise OutOfResources(self.metadata.shared, max_shared, \"shared memory\")",
             tag + exc,
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    got = classify(lines, 1)
    assert got.kind is Kind.UNKNOWN_FAILURE and got.evidence == exc, got
    # the same text where no traceback ends is no exception line: the wrapper alone says the engine died
    alone = lines[:2] + [tag + exc, lines[-1]]
    assert classify(alone, 1).kind is Kind.ENGINE_DEAD


# --------------------------------------------------------------------------- a request's error stays the request's
def test_a_requests_error_stays_the_requests_when_the_paste_stops_before_its_exception_line() -> None:
    lines = ["(APIServer pid=1) ERROR 09-20 10:00:02 [serving_chat.py:222] Error in preprocessing prompt inputs",
             "(APIServer pid=1) Traceback (most recent call last):",
             f'(APIServer pid=1)   File "{_S}/entrypoints/openai/serving_chat.py", line 196, in create_chat_completion',
             f'(APIServer pid=1)   File "{_S}/entrypoints/openai/serving_engine.py", line 808, in _preprocess_chat']
    for cut in range(1, len(lines) + 1):
        got = classify(lines[:cut])
        assert got.kind is Kind.HEALTHY and got.phase == "serving", (cut, got)


# --------------------------------------------------------------------------- warnings are not fatal
@pytest.mark.parametrize("line", [
    # journalctl -u vllm-guard: vLLM's WARNING behind journald's prefix (envs.py / platforms validate_environ)
    "Aug 19 18:30:11 gpu-host vllm-guard[8707]: (APIServer pid=8710) WARNING 08-19 18:30:11 [interface.py:1470] "
    "Unknown vLLM environment variable detected: VLLM_USE_V1",
    # the same message with its header lost (a paste of the message alone): the raised form says ValueError
    "Unknown vLLM environment variable detected: VLLM_USE_V1",
    "User-specified max_model_len (65536) is greater than the derived max_model_len (max_position_embeddings=32768 or "
    "model_max_length=None in model's config.json). VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.",
])
def test_a_text_vllm_also_only_warns_is_fatal_only_in_its_raised_form(line: str) -> None:
    assert not classify([line]).names_a_failure


def test_the_raised_forms_of_those_texts_are_fatal() -> None:
    assert classify(["ValueError: Unknown vLLM environment variable detected: VLLM_USE_V1"], 1).kind is Kind.CONFIG_ERROR
    got = classify(["  Value error, User-specified max_model_len (65536) is greater than the derived max_model_len "
                    "(max_position_embeddings=32768 or model_max_length=None in model's config.json). To allow "
                    "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."], 1)
    assert got.kind is Kind.MAX_LEN_EXCEEDS_MODEL and got.numbers["derived_max_model_len"] == 32768


_WATCHDOG = ("[rank3]:[E925 03:02:17.812370013 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
             "timeout: WorkNCCL(SeqNum=216734, OpType=_ALLGATHER_BASE, NumelIn=917504, NumelOut=7340032, "
             "Timeout(ms)=600000) ran for 600058 milliseconds before timing out.")
_SERVING = "(APIServer pid=1) INFO:     Application startup complete."
_LOADING = "(EngineCore_DP0 pid=7) INFO 10-15 12:00:00 [gpu_model_runner.py:1] Starting to load model m..."


@pytest.mark.parametrize("crash", ["(EngineCore_DP1 pid=199) Fatal Python error: Segmentation fault",
                                   "Fatal Python error: Aborted", "!!!!!!! Segfault encountered !!!!!!!",
                                   "Segmentation fault (core dumped)"])
@pytest.mark.parametrize(("before", "kind", "phase"), [
    ([_SERVING], Kind.ENGINE_DEAD, "serving"),                      # the serving engine died of a signal
    ([_LOADING], Kind.UNKNOWN_FAILURE, "loading"),                  # a start-up's crash no rule names
    ([_SERVING, _WATCHDOG, "terminate called after throwing an instance of 'c10::DistBackendError'"],
     Kind.ENGINE_DEAD, "serving"),
    ([_LOADING, _WATCHDOG, "terminate called after throwing an instance of 'c10::DistBackendError'"],
     Kind.ENGINE_DEAD, "loading"),                                  # the abort is what the watchdog's timeout ended in
])
def test_an_interpreters_crash_is_the_engines_death_while_serving_or_after_what_killed_it(
        crash: str, before: list[str], kind: Kind, phase: str) -> None:
    """A fatal signal (faulthandler's, PyTorch's, the shell's note) while serving: the serving engine died (found:
    a TP engine's NCCL watchdog abort and a DP engine's segfault, both read as a failure no rule names); during
    start-up, a crash no rule names; after an NCCL watchdog's timeout and the C++ terminate it raised, the abort is
    that death's end, whatever the phase."""
    got = classify([*before, crash, "(APIServer pid=1) ERROR 10-17 07:02:41 [core_client.py:564] Engine core proc "
                    "EngineCore_DP1 died unexpectedly, shutting down client."], None)
    assert (got.kind, got.phase) == (kind, phase), got


def test_a_record_behind_a_carriers_prefix_that_says_its_failure_at_its_start_is_no_stray_line() -> None:
    """Ray's raylet line (its "(raylet)" a carrier's prefix, no process tag of vLLM's) names the death at its
    start: a record, not a reporter's sentence, so the actor's exception after it, of the same weight, does not
    take its place (found: the first version of the stray line's rule took the raylet's for prose)."""
    got = classify(["(raylet) A worker died or was killed while executing a task by an unexpected system error.",
                    "Traceback (most recent call last):",
                    'File "/usr/local/lib/python3.10/dist-packages/vllm/executor/ray_gpu_executor.py", line 1, in f',
                    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."], 1)
    assert got.kind is Kind.ENGINE_DEAD and got.evidence.startswith("A worker died or was killed"), got


# --------------------------------------------------------------------------- a broken platform explains what follows
_NO_PLATFORM = [   # vLLM's words at import, per release (INFO 0.7-0.11, DEBUG later; its kernels' import: WARNING)
    "INFO 08-29 06:31:40 [__init__.py:246] No platform detected, vLLM is running on UnspecifiedPlatform",
    "DEBUG 11-02 09:00:01 [platforms/__init__.py:295] No platform detected, vLLM is running on UnspecifiedPlatform",
    "WARNING 08-29 06:31:40 [_custom_ops.py:20] Failed to import from vllm._C with ImportError('libcuda.so.1: "
    "cannot open shared object file: No such file or directory')",
    "WARNING 01-08 22:14:30 _custom_ops.py:19] Failed to import from vllm._C with ImportError('/venv/lib/python3.10/"
    "site-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c1010Dispatcher17runRecordFunctionERN2at14RecordFunctionE')",
    "WARNING 11-02 09:00:01 [interface.py:371] Failed to import from vllm._C: ImportError('/usr/local/lib/python3.12/"
    "dist-packages/vllm/_C.abi3.so: undefined symbol: _ZNK3c1011StorageImpl27throw_data_ptr_access_errorEv')",
]
_BANNER = "INFO 08-29 06:31:44 [api_server.py:1805] vLLM API server version 0.10.1.1"
_NAMELESS = [      # what then fails, in words no rule names
    ["RuntimeError: Device string must not be empty"],
    ["AttributeError: '_OpNamespace' '_C' object has no attribute 'rms_norm'"],
    ["Fatal Python error: Segmentation fault"],
    _tb("profile_run", "_dummy_run"),                              # cut before its exception line
]


@given(marker=st.sampled_from(_NO_PLATFORM), failure=st.sampled_from(_NAMELESS), before_banner=st.booleans(),
       tagged=st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_failure_no_rule_names_after_vllm_found_no_platform_or_could_not_load_its_kernels_is_a_config_error(
        marker: str, failure: list[str], before_banner: bool, tagged: bool) -> None:
    """Printed at import, before or after the banner, and not fatal where printed: what fails after it follows from
    it (found: a container without the GPU failing on "Device string must not be empty", a torch upgraded under
    vLLM failing on a missing custom op). No relaunch fixes an installation: exit 78, not a crash loop."""
    tag = "(APIServer pid=1) " if tagged else ""
    head = [tag + marker, _BANNER] if before_banner else [_BANNER, tag + marker]
    got = classify([*head, "INFO 08-29 06:31:45 [gpu_model_runner.py:1] Starting to load model m...",
                    *failure], 1)
    assert got.kind is Kind.CONFIG_ERROR and marker.endswith(got.evidence), got
    assert "installation" in got.detail


@pytest.mark.parametrize(("marker", "after", "kind"), [
    # a build with no vllm._C at all (a TPU's, a source tree's) says nothing of the failure after it
    ("WARNING 01-01 00:00:00 [_custom_ops.py:20] Failed to import from vllm._C with "
     "ModuleNotFoundError(\"No module named 'vllm._C'\")", ["RuntimeError: Device string must not be empty"],
     Kind.UNKNOWN_FAILURE),
    # a failure a rule names keeps its name; serving is serving
    (_NO_PLATFORM[2], [_OOM_LINE := "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                       "has a total capacity of 79.19 GiB of which 1.00 GiB is free."], Kind.OOM_WEIGHTS),
    (_NO_PLATFORM[0], ["INFO:     Application startup complete."], Kind.HEALTHY),
])
def test_what_a_missing_platform_does_not_explain(marker: str, after: list[str], kind: Kind) -> None:
    got = classify([_BANNER, marker, "INFO 08-29 06:31:45 [gpu_model_runner.py:1] Starting to load model m...",
                    *after], None if kind is Kind.HEALTHY else 1)
    assert got.kind is kind, got


def test_a_missing_platform_is_the_launch_it_was_printed_for_in_a_log_of_several() -> None:
    """The first launch's import warning, then a second launch (its own banner, no such warning) failing on
    something no rule names: the second launch's failure is its own."""
    got = classify([_NO_PLATFORM[0], _BANNER, "INFO 08-29 06:31:45 [gpu_model_runner.py:1] Starting to load model m...",
                    "RuntimeError: Device string must not be empty", _BANNER,
                    "INFO 08-29 06:35:45 [gpu_model_runner.py:1] Starting to load model m...",
                    "KeyError: 'model.layers.0.mlp.gate_up_proj.weight'"], 1)
    assert got.kind is Kind.UNKNOWN_FAILURE and "KeyError" in got.evidence, got


@pytest.mark.parametrize("wrapper", [
    "(APIServer pid=1) ERROR 10-02 11:00:00 [async_llm.py:480] AsyncLLM output_handler failed.",
    "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
    "(above) for the root cause.",
    "ERROR 10-02 11:00:00 [engine.py:160] MQEngineDeadError: Engine loop is not running. Inspect the stacktrace to "
    "find the original error: RuntimeError('CUDA error: an illegal memory access was encountered').",
])
def test_a_serving_time_wrapper_places_the_engines_death_in_serving_in_a_paste_cut_at_its_head(wrapper: str) -> None:
    """No milestone and no frame in the paste, only what vLLM says once it serves: the engine died serving."""
    got = classify([wrapper], 1)
    assert got.kind is Kind.ENGINE_DEAD and got.phase == "serving", got


# --------------------------------------------------------------------------- a message retyped with a typo
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import vllm_logs as cat  # noqa: E402

#: the catalogue's failures that vLLM raises, each with a word of six letters or more in its key
_RAISED = [r for r in cat.messages() if r["level"].startswith("raise:") and r["role"] == "cause"
           and r["kind"] not in ("oom", "cuda_error") and any(len(w) >= 6 for w in re.findall(r"[A-Za-z]+", r["match"]))]


@given(row=st.sampled_from(_RAISED), data=st.data())
@settings(max_examples=150, deadline=None)
def test_a_failure_retyped_with_a_letter_dropped_from_its_key_keeps_its_kind(row: dict, data: st.DataObject) -> None:
    """A person retyping vLLM's message (a screenshot, a session nothing can be copied out of) drops a letter:
    "KV cashe", "is larger then". The line is still the failure it names (found: a retyped V0 KV cache error,
    read as a failure no rule names)."""
    words = [m for m in re.finditer(r"[A-Za-z]{6,}", row["example"]) if m.group(0) in row["match"]]
    if not words:
        return
    word = data.draw(st.sampled_from(words), label="word")
    at = data.draw(st.integers(min_value=1, max_value=len(word.group(0)) - 2), label="letter")
    typed = row["example"][:word.start() + at] + row["example"][word.start() + at + 1:]
    got = classify(["INFO 11-30 12:00:00 [api_server.py:1] vLLM API server version 0.9.2", typed], 1)
    want = {"oom": "oom_weights"}.get(row["kind"], row["kind"])
    assert got.kind.value == want, (typed, got)


@pytest.mark.parametrize("specs", ["{'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}",
                                   "{'GPU ': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}",
                                   "{'GPU': 1.0}, {' GPU': 1.0}, {'GPU': 1. 0}, {'GPU' : 1.0}"],
                         ids=["as printed", "a key split by a wrap", "blanks a re-joined paste left"])
def test_a_placement_groups_specs_count_its_gpus_whatever_blanks_a_paste_put_in_them(specs: str) -> None:
    """Found by the paste compositions: a hard wrap re-joined with a blank inside ``'GPU'`` lost a GPU."""
    line = (f"ValueError: Cannot provide a placement group of placement_group_specs=[{specs}] within 1800 seconds. "
            "See `ray status` and `ray list nodes` to make sure the cluster has enough resources.")
    got = classify(["Traceback (most recent call last):",
                    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/ray_utils.py", line 135, '
                    "in _wait_until_pg_ready", line], 1)
    assert (got.kind, got.numbers.get("required_gpus")) == (Kind.CONFIG_ERROR, 4), got
