"""The fake vLLM as a real executable: its output, exit codes, processes and HTTP, per scenario.

Every test launches ``tests/fakes/fake_vllm.py`` as a subprocess (in its own session, killed as a
group afterwards so orphaned fake engines never outlive a test) and waits on its printed lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes import emulator

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_vllm.py"
QWEN_7B = {"weights_gib": 14.25, "kv_bytes_per_token": 57344, "num_kv_heads": 4, "derived_max_model_len": 32768,
           "vocab": 152064, "hidden": 3584, "intermediate": 18944}
LLAMA_8B = {"weights_gib": 14.99, "kv_bytes_per_token": 131072, "num_kv_heads": 8,
            "derived_max_model_len": 131072, "vocab": 128256, "hidden": 4096, "intermediate": 14336}

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fake:
    """One fake vLLM launch with both pipes read into line lists."""

    def __init__(self, args: list[str], scenario: dict | None = None, *, cwd: str | None = None,
                 env: dict | None = None, serve: bool = True):
        self.port = free_port()
        scenario = {"speed": 0.01, **(scenario or {})}
        e = dict(os.environ, FAKE_VLLM_SCENARIO=json.dumps(scenario), **(env or {}))
        head = ["serve"] if serve else []
        port = [] if "--port" in args else ["--port", str(self.port)]
        self.argv = [sys.executable, str(FAKE), *head, *args, "--host", "127.0.0.1", *port]
        self.lines: dict[str, list[str]] = {"out": [], "err": []}
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                                     cwd=cwd, start_new_session=True)
        self.pgid = self.proc.pid
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, "out"), daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, "err"), daemon=True)]
        for t in self.readers:
            t.start()

    def _read(self, pipe, name):
        for raw in iter(pipe.readline, b""):
            with self.cond:
                self.lines[name].append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines[name + "_eof"] = []
            self.cond.notify_all()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self, stream: str = "out") -> str:
        with self.cond:
            return "\n".join(self.lines[stream])

    def wait_for(self, needle: str, stream: str = "err", timeout: float = 20) -> str:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(needle in ln for ln in self.lines[stream])
                                    or f"{stream}_eof" in self.lines, timeout)
            hit = [ln for ln in self.lines[stream] if needle in ln]
        assert ok and hit, f"{needle!r} not on {stream}:\n{self.text('out')}\n---\n{self.text('err')}"
        return hit[0]

    def ready(self) -> None:
        """Serving, with the API server's stdout read as far as the stderr line (two pipes, no order)."""
        self.wait_for("Application startup complete.")
        self.wait_for("Route: /metrics, Methods: GET", stream="out")

    def wait(self, timeout: float = 20) -> int:
        rc = self.proc.wait(timeout)
        # orphaned engines keep the pipes open (as real ones do): then there is no EOF to wait for
        grace = 0.3 if self.group() else 5
        for t in self.readers:
            t.join(grace)
        return rc

    def engine(self) -> psutil.Process:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for child in psutil.Process(self.proc.pid).children():
                if child.name() == "VLLM::EngineCore":
                    return child
            time.sleep(0.02)
        raise AssertionError("no VLLM::EngineCore child")

    def group(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == self.pgid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        return out

    def kill(self):
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def launch():
    started: list[Fake] = []

    def start(*args, **kw) -> Fake:
        fake = Fake(list(args), **kw)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.kill()


def chat(fake: Fake, model: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 1, **extra}
    return httpx.post(fake.url + "/v1/chat/completions", json=body, timeout=5, headers=extra.pop("headers", None))


# ---------------------------------------------------------------------------- healthy


def test_healthy_launch_serves_a_real_chat_completion(launch):
    fake = launch("Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192", scenario={"model": QWEN_7B})
    fake.ready()
    out = fake.text()
    want = emulator.simulate(emulator.ModelSpec("q", **QWEN_7B), emulator.GpuSpec(23.55), "0.32.0",
                             {"--max-model-len": "8192"}).numbers
    for milestone in ("version 0.32.0", "Using max model len 8192", "Initializing a V1 LLM engine (v0.32.0)",
                      "Starting to load model Qwen/Qwen2.5-7B-Instruct...", "Model loading took 14.25 GiB memory",
                      f"Available KV cache memory: {round(want['kv_available_gib'], 2)} GiB",
                      f"GPU KV cache size: {want['kv_tokens']:,} tokens, Maximum concurrency for 8,192 tokens",
                      "Graph capturing finished",
                      "init engine (profile, create kv cache, warmup model) took",
                      f"Starting vLLM server on http://127.0.0.1:{fake.port}"):
        assert milestone in out, milestone
    assert out.index("Using max model len") < out.index("Initializing a V1") < out.index("Starting vLLM server")
    api, engine = os.getpid(), fake.engine().pid
    assert f"(APIServer pid={fake.proc.pid}) INFO " in out and f"(EngineCore pid={engine}) INFO " in out
    assert api != engine
    assert "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)" in fake.text("err")

    resp = chat(fake, "Qwen/Qwen2.5-7B-Instruct", max_tokens=3)
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "chat.completion" and len(data["choices"]) == 1
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert data["usage"]["completion_tokens"] == 3 and data["choices"][0]["finish_reason"] == "length"
    assert httpx.get(fake.url + "/health").status_code == 200
    assert httpx.get(fake.url + "/version").json() == {"version": "0.32.0"}
    models = httpx.get(fake.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "Qwen/Qwen2.5-7B-Instruct" and models[0]["max_model_len"] == 8192
    wrong = chat(fake, "other")
    assert wrong.status_code == 404 and wrong.json()["error"]["type"] == "NotFoundError"
    too_long = chat(fake, "Qwen/Qwen2.5-7B-Instruct", max_tokens=9000)
    assert too_long.status_code == 400
    completion = httpx.post(fake.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    fake.wait_for('"POST /v1/chat/completions HTTP/1.1" 200 OK', stream="out")   # uvicorn access log

    fake.proc.send_signal(signal.SIGTERM)
    assert fake.wait() == 0
    assert "INFO:     Shutting down" in fake.text("err")
    assert fake.text("err").splitlines()[-1] == "INFO:     Application shutdown complete."
    out = fake.text()
    assert out.index("[shutdown] API server: shutdown triggered") \
        < out.index("[shutdown] EngineCore: trigger received signal=SIGTERM") \
        < out.index("[shutdown] API server: shutting down FastAPI HTTP server")
    assert not fake.group(), "the engine must end with a graceful shutdown"


def test_port_refuses_connections_until_ready(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"speed": 0.2})
    fake.wait_for("Starting to load model", stream="out")
    with pytest.raises(httpx.ConnectError):
        httpx.get(fake.url + "/health", timeout=2)
    fake.ready()
    assert httpx.get(fake.url + "/health").status_code == 200


def test_served_model_name_and_api_key(launch):
    fake = launch("org/model", "--max-model-len", "4096", "--served-model-name", "alias", "--api-key", "s3cret")
    fake.ready()
    assert httpx.get(fake.url + "/v1/models").status_code == 401
    assert httpx.get(fake.url + "/v1/models").json() == {"error": "Unauthorized"}
    auth = {"Authorization": "Bearer s3cret"}
    assert httpx.get(fake.url + "/v1/models", headers=auth).json()["data"][0]["id"] == "alias"
    assert httpx.get(fake.url + "/health").status_code == 200      # not guarded, like vLLM
    ok = httpx.post(fake.url + "/v1/chat/completions", headers=auth,
                    json={"model": "alias", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert ok.status_code == 200


def test_api_server_style_invocation_and_any_cwd(launch, tmp_path):
    fake = launch("--model", "m", "--max-model-len", "4096", serve=False, cwd=str(tmp_path))
    fake.ready()
    assert f"non-default args: {{'host': '127.0.0.1', 'port': {fake.port}, 'model': 'm', " in fake.text()
    assert chat(fake, "m").status_code == 200


def test_no_chat_template_and_pooling_models(launch):
    fake = launch("base-model", "--max-model-len", "4096", scenario={"no_chat_template": True})
    fake.ready()
    resp = chat(fake, "base-model")
    assert resp.status_code == 400 and "chat template" in resp.json()["error"]["message"]
    assert httpx.post(fake.url + "/v1/completions", json={"model": "base-model", "prompt": "x"}).status_code == 200

    emb = launch("BAAI/bge-m3", "--max-model-len", "4096", scenario={"pooling": True})
    emb.ready()
    resp = chat(emb, "BAAI/bge-m3")
    assert resp.status_code == 501 and "does not support Chat Completions API" in resp.json()["error"]["message"]
    vec = httpx.post(emb.url + "/v1/embeddings", json={"model": "BAAI/bge-m3", "input": "hello"})
    assert vec.status_code == 200 and vec.json()["data"][0]["object"] == "embedding"


# ---------------------------------------------------------------------------- failures, per kind


def test_kv_cache_insufficient_current(launch):
    fake = launch("meta-llama/Llama-3.1-8B-Instruct", scenario={"model": LLAMA_8B})
    assert fake.wait() == 1
    out, err = fake.text(), fake.text("err")
    assert "Using max model len 131072" in out
    assert "ERROR" in out and "[core.py:1510] EngineCore failed to start.\r" in out
    assert "the estimated maximum model length is 4" in out            # ~42K at 0.92 with graphs budgeted
    assert "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache" in out
    err_lines = err.splitlines()
    assert "Process EngineCore:" in err_lines
    assert err_lines[-1] == ("RuntimeError: Engine core initialization failed. See root cause above. "
                             "Failed core proc(s): {}")
    # every traceback line of the logger block carries the record prefix (docs/failure-catalogue.md)
    block = [ln for ln in out.splitlines() if "[core.py:1510]" in ln]
    assert len(block) > 10 and all(ln.startswith("(EngineCore pid=") for ln in block)


def test_no_kv_cache_memory(launch):
    fake = launch("Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-utilization", "0.6", scenario={"model": QWEN_7B})
    assert fake.wait() == 1
    out = fake.text()
    assert "Available KV cache memory: -" in out
    assert "ValueError: No available memory for the cache blocks." in out


def test_insufficient_free_memory(launch):
    fake = launch("Qwen/Qwen2.5-7B-Instruct", scenario={"model": QWEN_7B, "gpu": {"other_used_gib": 4.0}})
    assert fake.wait() == 1
    out = fake.text()
    assert "Free memory on device cuda:0 (19.15/23.55 GiB) on startup is less than desired GPU memory " \
           "utilization (0.92, 21.67 GiB)." in out
    assert "Starting to load model" not in out


def test_oom_while_loading_weights(launch):
    big = {**QWEN_7B, "weights_gib": 61.03}
    fake = launch("Qwen/Qwen2.5-32B-Instruct", "--max-model-len", "4096", scenario={"model": big})
    assert fake.wait() == 1
    out = fake.text()
    assert "Failed to load model - not enough GPU memory." in out
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in out
    assert "Model loading took" not in out


def test_oom_in_the_profile_run_names_the_sampler(launch):
    fake = launch("Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192", "--max-num-seqs", "8192",
                  "--max-num-batched-tokens", "8192", scenario={"model": QWEN_7B})
    assert fake.wait() == 1
    out = fake.text()
    assert "CUDA out of memory occurred when warming up sampler with 8192 dummy requests." in out
    assert "Model loading took" in out and "Available KV cache memory" not in out


def test_oom_during_cuda_graph_capture_before_0_20(launch):
    scenario = {"model": QWEN_7B, "version": "0.18.0"}
    fake = launch("Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192", "--gpu-memory-utilization", "0.97",
                  scenario=scenario)
    assert fake.wait() == 1
    out, err = fake.text(), fake.text("err")
    assert "GPU KV cache size" in out and "Graph capturing finished" not in out
    assert "Capturing CUDA graphs (decode, FULL):  33%" in err
    assert "allocated in private pools (e.g., CUDA Graphs)" in out
    assert "Starting vLLM API server 0 on" not in out
    healed = launch("Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192", "--gpu-memory-utilization", "0.97",
                    "--enforce-eager", scenario=scenario)
    healed.ready()
    assert f"Starting vLLM server on http://127.0.0.1:{healed.port}" in healed.text()


def test_max_len_exceeds_model_fails_in_the_api_server(launch):
    fake = launch("Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "65536", scenario={"model": QWEN_7B})
    assert fake.wait() == 1
    err = fake.text("err")
    assert "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig" in err
    assert "Value error, User-specified max_model_len (65536) is greater than the derived max_model_len " \
           "(max_position_embeddings=32768.0 or model_max_length=None in model's config.json)." in err
    assert "Initializing a V1 LLM engine" not in fake.text()


def test_unrecognized_flag_is_an_argparse_error(launch):
    fake = launch("m", "--no-such-flag", "3")
    assert fake.wait() == 2
    err = fake.text("err").splitlines()
    assert err[0].startswith("usage: vllm serve [model_tag] [options]")
    assert err[-1] == "vllm: error: unrecognized arguments: --no-such-flag 3"
    removed = launch("m", "--swap-space", "4")           # removed in 0.18.0
    assert removed.wait() == 2
    assert "unrecognized arguments: --swap-space 4" in removed.text("err")
    assert launch("m", "--kv-cache-dtype", "fp9").wait() == 2
    api_style = launch("--model", "m", "--no-such-flag", "3", serve=False)   # the 3 becomes model_tag
    assert api_style.wait() == 2
    assert api_style.text("err").splitlines()[-1] == "api_server.py: error: unrecognized arguments: --no-such-flag"


def test_fp8_kv_refused_on_ampere(launch):
    fake = launch("m", "--kv-cache-dtype", "fp8", "--max-model-len", "4096", scenario={"gpu": {"cc": [8, 6]}})
    assert fake.wait() == 1
    assert "No valid attention backend found for cuda" in fake.text()


def test_port_already_in_use(launch):
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        fake = launch("m", "--port", str(port))
        assert fake.wait() == 1
    err = fake.text("err").splitlines()
    assert err[-1] == "OSError: [Errno 98] Address already in use"
    assert any("sock.bind(addr)" in ln for ln in err)


@pytest.mark.parametrize("version, needle", [
    ("0.6.3", "is larger than the maximum number of tokens that can be stored in KV cache ({fit})"),
    ("0.8.4", "GiB). Based on the available memory,  Try increasing"),
    ("0.10.2", "the estimated maximum model length is {fit}."),
])
def test_kv_messages_follow_the_version(launch, version, needle):
    """Each version's wording, with the emulator's verdict in it (the fake prints what it computes)."""
    truth = emulator.simulate(emulator.ModelSpec("m", **LLAMA_8B), emulator.GpuSpec(23.55), version, {})
    needle = needle.format(fit=truth.numbers.get("fit_max_model_len"))
    fake = launch("meta-llama/Llama-3.1-8B-Instruct", scenario={"model": LLAMA_8B, "version": version})
    rc = fake.wait()
    assert needle in fake.text() + fake.text("err")
    if version == "0.10.2":
        assert rc == 1 and "models's max seq len" in fake.text()
        assert "\x1b[1;36m(EngineCore_DP0 pid=" in fake.text()          # coloured prefix, even when piped
        assert fake.text("err").splitlines()[-1].endswith("Failed core proc(s): {}")
    if version == "0.6.3":
        assert rc == 1 and "# GPU blocks:" in fake.text() and "(EngineCore" not in fake.text()


def test_0_7_v1_engine_failure_sigkills_the_api_server(launch):
    fake = launch("meta-llama/Llama-3.1-8B-Instruct",
                  scenario={"model": LLAMA_8B, "version": "0.8.2", "fork_engine": True})
    assert fake.wait() == -signal.SIGKILL
    assert "Got fatal signal from worker processes, shutting down." in fake.text()
    assert "EngineCore hit an exception: Traceback" in fake.text()


# ---------------------------------------------------------------------------- replay until healed


def test_replay_until_the_right_flag_arrives(launch, tmp_path):
    log = tmp_path / "real.log"
    log.write_bytes(
        b"(APIServer pid=11) INFO 11-29 16:30:48 [model.py:2152] Using max model len 131072\n"
        b"(EngineCore pid=12) ERROR 11-29 16:31:03 [core.py:1510] EngineCore failed to start.\r\n"
        b"Process EngineCore:\n"
        b"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    scenario = {"replay": str(log), "heal_when": {"max_model_len_le": 5632}}
    first = launch("m", scenario=scenario)
    assert first.wait() == 1
    assert first.text().split("\n") == ["(APIServer pid=11) INFO 11-29 16:30:48 [model.py:2152] Using max model "
                                         "len 131072", "(EngineCore pid=12) ERROR 11-29 16:31:03 [core.py:1510] "
                                         "EngineCore failed to start.\r"]
    assert first.text("err").splitlines()[0] == "Process EngineCore:"
    still = launch("m", "--max-model-len", "8192", scenario=scenario)
    assert still.wait() == 1 and "Using max model len 131072" in still.text()
    healed = launch("m", "--max-model-len", "5632", scenario=scenario)
    healed.ready()
    assert "Using max model len 5632" in healed.text()


# ---------------------------------------------------------------------------- runtime behaviour


def test_engine_death_exits_zero_and_counts_deaths(launch, tmp_path):
    scenario = {"engine_death_after": 0.3, "death_count": 1}
    env = {"FAKE_VLLM_STATE": str(tmp_path)}
    fake = launch("m", "--max-model-len", "4096", scenario=scenario, env=env)
    fake.ready()
    fake.wait_for("EngineDeadError", stream="out")
    assert fake.wait() == 0
    out = fake.text()
    assert "EngineCore encountered a fatal error." in out
    assert "an illegal memory access was encountered" in out
    assert "Process EngineCore:" in fake.text("err")
    assert "AsyncLLM output_handler failed." in out
    assert "INFO:     Shutting down" in fake.text("err")
    assert fake.text("err").splitlines()[-1] == f"INFO:     Finished server process [{fake.proc.pid}]"
    assert (tmp_path / "deaths").read_text() == "1"

    survivor = launch("m", "--max-model-len", "4096", scenario=scenario, env=env)   # death_count reached
    survivor.ready()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert httpx.get(survivor.url + "/health").status_code == 200
        time.sleep(0.1)
    assert survivor.proc.poll() is None
    assert len((tmp_path / "launches.jsonl").read_text().splitlines()) == 2


def test_killing_the_engine_makes_the_api_server_exit_zero(launch):
    fake = launch("m", "--max-model-len", "4096")
    fake.ready()
    engine = fake.engine()
    assert engine.name() == "VLLM::EngineCore"                        # comm + cmdline, like setproctitle
    assert open(f"/proc/{engine.pid}/comm").read().strip() == "VLLM::EngineCor"
    assert os.getpgid(engine.pid) == fake.pgid                       # same process group, like vLLM
    engine.kill()
    fake.wait_for("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", stream="out")
    statuses = set()
    while fake.proc.poll() is None:
        try:
            statuses.add(httpx.get(fake.url + "/health", timeout=1).status_code)
        except httpx.HTTPError:
            break
    assert fake.wait() == 0
    assert statuses <= {503} and 200 not in statuses


def test_api_server_sigkill_leaves_the_engine_orphaned(launch):
    fake = launch("m", "--max-model-len", "4096")
    fake.ready()
    engine = fake.engine()
    fake.proc.kill()
    assert fake.wait() == -signal.SIGKILL
    time.sleep(0.3)                       # give a dying engine the chance to go (it must not)
    assert engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE
    assert engine.ppid() != fake.proc.pid


def test_engine_can_be_made_to_die_with_its_parent(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"engine_survives_parent": False})
    fake.ready()
    engine = fake.engine()
    fake.proc.kill()
    fake.wait()
    engine.wait(5)
    assert not engine.is_running()


def test_ignore_sigterm_needs_sigkill(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"ignore_sigterm": True})
    fake.ready()
    fake.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        fake.proc.wait(0.5)
    assert httpx.get(fake.url + "/health").status_code == 200
    fake.proc.kill()
    assert fake.wait() == -signal.SIGKILL


def test_sigterm_during_startup_is_a_keyboard_interrupt(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"speed": 0.5})
    fake.wait_for("Starting to load model", stream="out")
    fake.proc.send_signal(signal.SIGTERM)
    assert fake.wait() == -signal.SIGINT
    assert fake.text("err").splitlines()[-1] == "KeyboardInterrupt: terminated"
    assert not fake.group()


def test_hang_after_accepts_but_never_answers(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"hang_after": 0.2})
    fake.ready()
    time.sleep(0.3)                       # past hang_after (a scenario timer, not a race)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(fake.url + "/health", timeout=0.5)
    assert fake.proc.poll() is None


def test_silent_hang_at_start_never_serves(launch):
    fake = launch("m", "--max-model-len", "4096", scenario={"silent_hang_at_start": True})
    fake.wait_for("Starting to load model", stream="out")
    count = len(fake.text().splitlines())
    time.sleep(0.5)
    assert len(fake.text().splitlines()) == count and fake.proc.poll() is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(fake.url + "/health", timeout=1)


# ---------------------------------------------------------------------------- against the real captures

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.32"
TINY = {"device": "cpu", "model": {"weights_gib": 0.05, "kv_bytes_per_token": 16384, "num_kv_heads": 8,
                                   "derived_max_model_len": 131072, "vocab": 4096, "hidden": 512,
                                   "intermediate": 1024}}
_NORMALISE = [
    (re.compile(r"\x1b\[[0-9;]*m"), ""), (re.compile(r"pid[= ]\d+"), "pid=N"),
    (re.compile(r"\d\d-\d\d \d\d:\d\d:\d\d"), "TS"), (re.compile(r"\d+\.\d+ (seconds|s)\b"), r"X \1"),
    (re.compile(r"process \[\d+\]"), "process [N]"), (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:P"),
    (re.compile(r"'port': \d+"), "'port': P"), (re.compile(r"vllm_dist_[0-9a-f]+"), "vllm_dist_X"),
]


def norm(line: str) -> str:
    line = line.rstrip("\r")
    for pattern, repl in _NORMALISE:
        line = pattern.sub(repl, line)
    return line


def real_lines(name: str) -> list[str]:
    return [norm(ln) for ln in (REAL / name).read_text(encoding="utf-8").split("\n")]


def tiny(launch, *args, scenario=None, env=None) -> Fake:
    """The fake started the way the real fixtures were captured (api_server style, CPU, 1 GiB KV)."""
    return launch("--model", "/models/tiny-llama", "--enforce-eager", *args, serve=False,
                  scenario={**TINY, **(scenario or {})},
                  env={"VLLM_CPU_KVCACHE_SPACE": "1", "NO_COLOR": "1", **(env or {})})


def assert_like_real(fake: Fake, fixture: str, exact: list[str], ordered: list[str]) -> None:
    """Lines holding an ``exact`` anchor are identical (after normalising pids, times, ports); the
    ``ordered`` anchors (and the exact ones) appear in the same order on each stream."""
    real = real_lines(fixture)
    streams = {name: [norm(ln) for ln in fake.text(name).split("\n")] for name in ("out", "err")}
    for anchor in exact:
        want = [ln for ln in real if anchor in ln]
        got = [ln for name in streams for ln in streams[name] if anchor in ln]
        assert want, f"{anchor!r} not in {fixture}"
        assert got[:1] == want[:1], f"{anchor!r}:\nreal: {want[0]!r}\nfake: {got[:1]!r}"
    for name, lines in streams.items():
        anchors = [a for a in exact + ordered if any(a in ln for ln in lines)]
        first = {a: next(i for i, ln in enumerate(lines) if a in ln) for a in anchors}
        real_first = {a: next(i for i, ln in enumerate(real) if a in ln) for a in anchors}
        assert sorted(anchors, key=first.get) == sorted(anchors, key=real_first.get), name
    missing = [a for a in exact + ordered if not any(a in ln for s in streams.values() for ln in s)]
    assert not missing, missing


def test_like_real_kv_cache_default_context(launch):
    fake = tiny(launch)
    assert fake.wait() == 1
    assert_like_real(fake, "kv-cache-default-context.log",
                     exact=["Using max model len 131072", "Starting to load model", "Loading weights took",
                            "Explicitly set (1.0/8.21) GiB", "EngineCore failed to start.",
                            "ERROR TS [core.py:1510] ValueError: To serve at least one request",
                            "Worker proc VllmWorker-0 died unexpectedly", "Process EngineCore:",
                            "RuntimeError: Engine core initialization failed"],
                     ordered=["version 0.32.0", "non-default args:", "Resolved architecture:",
                              "Initializing a V1 LLM engine (v0.32.0) with config: model='/models/tiny-llama'",
                              "Loading safetensors checkpoint shards: 100%"])
    real, out, err = real_lines("kv-cache-default-context.log"), fake.text().split("\n"), fake.text("err").split("\n")
    block = [ln for ln in real if "[core.py:1510]" in ln]
    assert [norm(ln) for ln in out if "[core.py:1510]" in ln] == block          # the whole logged traceback
    start = real.index("Process EngineCore:")
    raw = real[start:start + len(block) + 4]
    at = err.index("Process EngineCore:")
    assert [norm(ln) for ln in err[at:at + len(raw)]] == raw                     # multiprocessing's print
    tail = real[real.index("RuntimeError: Engine core initialization failed. See root cause above. "
                           "Failed core proc(s): {}") - 60:]
    api_tb = tail[tail.index("Traceback (most recent call last):"):]
    api_tb = api_tb[:next(i for i, ln in enumerate(api_tb) if ln.startswith("RuntimeError")) + 1]
    assert err[-len(api_tb):] == api_tb                                          # the API server's last words


def test_like_real_healthy_and_auto_fit_then_sigterm(launch):
    fake = tiny(launch, "--max-model-len", "65408")
    fake.ready()
    assert httpx.get(fake.url + "/v1/models").json()["data"][0]["max_model_len"] == 65408
    fake.wait_for('"GET /v1/models HTTP/1.1" 200 OK', stream="out")
    assert_like_real(fake, "healthy-max-model-len-65408.log",
                     exact=["Using max model len 65408", "Explicitly set (1.0/8.21) GiB",
                            "CPU KV cache size: 65,536 tokens, Maximum concurrency for 65,408 tokens per request",
                            "init engine (profile, create kv cache, warmup model) took",
                            "Starting vLLM server on", "Available routes are:", "INFO:     Started server process",
                            "INFO:     Waiting for application startup.", "INFO:     Application startup complete.",
                            '"GET /v1/models HTTP/1.1" 200 OK'],
                     ordered=["Supported tasks:"])

    auto = tiny(launch, "--max-model-len", "auto")
    auto.ready()
    auto.proc.send_signal(signal.SIGTERM)
    assert auto.wait() == 0
    assert_like_real(auto, "autofit-then-sigterm.log",
                     exact=["Using max model len 131072",
                            "Auto-fit max_model_len: reduced from 131072 to 65408 to fit in available KV cache",
                            "CPU KV cache size: 65,536 tokens",
                            "[shutdown] API server: shutdown triggered",
                            "[shutdown] API server: stopping engine client mode=abort timeout=0s",
                            "[shutdown] Process manager: send sigterm to process EngineCore",
                            "[shutdown] EngineCore: trigger received signal=SIGTERM",
                            "[shutdown] EngineCore: exiting busy loop",
                            "[shutdown] MPClient: complete", "[shutdown] API server: shutting down FastAPI HTTP server",
                            "INFO:     Shutting down", "INFO:     Application shutdown complete."],
                     ordered=[])
    assert not auto.group()


def test_like_real_engine_killed_while_serving(launch):
    fake = tiny(launch, "--max-model-len", "65408")
    fake.ready()
    fake.engine().kill()
    assert fake.wait() == 0
    assert_like_real(fake, "engine-core-killed-while-serving.log",
                     exact=["[shutdown] Process manager: send sigterm to process EngineCore",
                            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                            "[shutdown] MPClient: complete", "AsyncLLM output_handler failed.",
                            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
                            "INFO:     Shutting down", "INFO:     Finished server process"],
                     ordered=[])


@pytest.mark.parametrize("fixture, args", [
    ("max-len-exceeds-derived.log", ["--max-model-len", "200000"]),
    ("unrecognized-argument.log", ["--no-such-flag", "3"]),
])
def test_like_real_config_errors(launch, fixture, args):
    fake = tiny(launch, *args)
    rc = fake.wait()
    real = [ln for ln in real_lines(fixture) if ln and "Warning" not in ln and "warnings.warn" not in ln
            and "Triton" not in ln]
    err = [norm(ln) for ln in fake.text("err").split("\n") if ln]
    assert err[-1] == real[-1]
    if fixture.startswith("max-len"):
        assert rc == 1
        tb = real[real.index("Traceback (most recent call last):"):]
        assert err[-len(tb):][:-2] == tb[:-2]          # the input_value dump differs; the rest is identical
        assert err[-2].startswith(tb[-2].split(" [type=value_error")[0])
    else:
        assert rc == 2


def test_like_real_port_in_use(launch):
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        fake = tiny(launch, "--port", str(taken.getsockname()[1]), "--max-model-len", "65408")
        assert fake.wait() == 1
    real = [ln for ln in real_lines("port-in-use.log") if ln]
    tb = real[real.index("Traceback (most recent call last):"):]
    assert [norm(ln) for ln in fake.text("err").split("\n") if ln][-len(tb):] == tb
    assert "non-default args:" in fake.text() and "Using max model len" not in fake.text()
