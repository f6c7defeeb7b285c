"""What the guard keeps in its state dir: the launch history and vLLM's output, bounded and redacted."""

from __future__ import annotations

import json

from supervisor.shell import auth, history, output


def test_history_keeps_the_last_record_of_each_launch_and_survives_a_torn_line(tmp_path):
    h = history.History(str(tmp_path), model="org/m", run_id="r1")
    h.started(1, ["vllm", "serve", "org/m", "--api-key", "sk-history-secret-1"], {})
    h.ended("failed", kind="kv_cache_insufficient", evidence="ValueError: ... estimated maximum model length is 30368",
            phase="profiling", numbers={"fit_max_model_len": 30368}, exit_code=1, exit_text="vLLM exited with code 1")
    h.started(2, ["vllm", "serve", "org/m", "--max-model-len", "30368"], {"--max-model-len": {"value": "30368"}})
    h.healthy(12.5, {"kv_cache_tokens": 30400, "model_loading_gib": 14.96})
    with open(tmp_path / history.HISTORY_FILE, "a") as f:
        f.write('{"torn": \n')                        # a guard killed mid-write
    h.ended("stopped")
    h.gave_up("giving up: test", 75, "engine_dead")
    records = list(history.read(str(tmp_path)))
    launches = [r for r in records if r.get("n")]
    assert [(r["n"], r["outcome"]) for r in launches] == [(1, "failed"), (2, "stopped")]
    assert launches[0]["kind"] == "kv_cache_insufficient" and launches[0]["exit"] == "vLLM exited with code 1"
    assert launches[1]["measured"]["kv_cache_tokens"] == 30400 and launches[1]["time_to_healthy_s"] == 12.5
    assert "sk-history-secret-1" not in (tmp_path / history.HISTORY_FILE).read_text()
    assert h.last_gave_up() is not None


def test_history_is_bounded_by_rotation(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "MAX_BYTES", 2000)
    h = history.History(str(tmp_path), model="m", run_id="r")
    for n in range(1, 60):
        h.started(n, ["vllm"], {})
        h.ended("failed", kind="engine_dead", evidence="x" * 50)
    assert (tmp_path / "history.jsonl").stat().st_size <= 2000
    assert (tmp_path / "history.jsonl.1").exists()
    assert max(r["n"] for r in history.read(str(tmp_path))) == 59


def test_vllm_output_is_masked_kept_and_tailed_across_launches(tmp_path):
    out = output.VllmOutput(str(tmp_path), secrets=["sk-output-secret-9"], quiet=True)
    out.launch(1, "vllm serve m --api-key ***")
    for i in range(5):
        out.line(out.mask(f"line {i} sk-output-secret-9".encode()), "stdout")
    out.launch(2, "vllm serve m")
    out.line(b"second launch", "stderr")
    lines = output.tail(str(tmp_path), 3)
    assert lines == [b"line 4 ***", lines[1], b"second launch"] and lines[1].startswith(b"=== vllm-guard: launch 2")
    assert b"sk-output-secret-9" not in (tmp_path / output.LOG_FILE).read_bytes()


def test_masked_secrets_come_back_from_the_users_own_flags():
    stored = auth.redact_argv(["--max-model-len", "8192", "--api-key", "k-1234", "--hf-token=hf_x1234"])
    assert stored == ["--max-model-len", "8192", "--api-key", "***", "--hf-token=***"]
    assert auth.restore_masked(stored, ["--api-key", "k-5678", "--hf-token=hf_new1"]) == [
        "--max-model-len", "8192", "--api-key", "k-5678", "--hf-token=hf_new1"]
    assert auth.restore_masked(stored, []) == ["--max-model-len", "8192"]    # not given any more: dropped


def test_history_json_lines_are_valid_json(tmp_path):
    h = history.History(str(tmp_path), model="m", run_id="r")
    h.started(1, ["vllm"], {})
    h.ended("died", kind="engine_dead", evidence="EngineDeadError", numbers={"vllm_version": "0.32.0"})
    for line in (tmp_path / history.HISTORY_FILE).read_text().splitlines():
        assert isinstance(json.loads(line), dict)
