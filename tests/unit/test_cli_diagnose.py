"""``vllm-guard diagnose``: through run() with a real argparse parser, and as a real subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import diagnose as cli_diagnose

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"
KV = LOGS / "v1" / "0.9.2-kv-insufficient-compose.log"
CONFIG = LOGS / "v1" / "0.10.2-unrecognized-argument.log"


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vllm-guard")
    cli_diagnose.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", *argv])
    return args.func(args)


def test_json_one_object_per_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--json", str(KV), str(CONFIG)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["file"] for o in out] == [str(KV), str(CONFIG)]
    kv, config = out
    assert set(kv) >= {"file", "kind", "healable", "evidence", "numbers", "phase", "remedy"}
    assert kv["kind"] == "kv_cache_insufficient" and kv["healable"] is True
    assert kv["numbers"]["fit_max_model_len"] == 95632
    assert kv["evidence"].startswith("ValueError: To serve at least one request")
    assert set(kv["remedy"]) >= {"flags", "why"}
    assert config["kind"] == "config_error" and config["healable"] is False


def test_flags_reach_the_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--json", "--flags", "--max-model-len 131072 --gpu-memory-utilization 0.9", str(KV)]) == 0
    remedy = json.loads(capsys.readouterr().out)["remedy"]
    assert remedy["flags"], remedy        # a healable KV failure comes with the flags that fit
    assert remedy["why"]


def test_human_output_names_kind_evidence_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(KV)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{KV}: kv_cache_insufficient (healable")
    assert "evidence: ValueError: To serve at least one request" in out
    assert "fit_max_model_len=95632" in out


def test_missing_file_is_an_error_but_the_others_are_diagnosed(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    assert _run(["--json", str(missing), str(KV)]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err and "No such file" in captured.err
    assert json.loads(captured.out)["kind"] == "kv_cache_insufficient"


def test_unreadable_directory_and_binary_garbage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(bytes(range(256)) * 4000 + b"\xff\xfe\x00" * 1000)
    assert _run(["--json", str(tmp_path), str(garbage)]) == 2     # a directory cannot be read
    captured = capsys.readouterr()
    assert str(tmp_path) in captured.err
    assert json.loads(captured.out)["kind"] == "no_vllm_output"


def test_exit_code_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "cut.log"
    log.write_text("INFO 07-23 10:00:01 [gpu_model_runner.py:1] Starting to load model m...\n")
    assert _run(["--json", "--exit-code", "-9", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "engine_dead"


def test_lines_reads_in_bounded_chunks() -> None:
    import io

    data = b"a\r\nb\n" + b"x" * (cli_diagnose._MAX_LINE * 2 + 5) + b"\nlast"
    lines = list(cli_diagnose._lines(io.BytesIO(data)))
    assert lines[:2] == [b"a\r", b"b"]
    assert max(len(line) for line in lines) <= cli_diagnose._MAX_LINE
    assert b"".join(lines[2:-1]) == b"x" * (cli_diagnose._MAX_LINE * 2 + 5)
    assert lines[-1] == b"last"


def _subprocess(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "supervisor", "diagnose", *argv], input=stdin,
                          capture_output=True, cwd=ROOT, timeout=60)


def test_real_command_reads_standard_input() -> None:
    done = _subprocess("--json", "-", stdin=(LOGS / "v0" / "0.7.2-oom-cudagraph.log").read_bytes())
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["file"] == "-" and got["kind"] == "oom_cudagraph"
    assert got["remedy"]["flags"]


def test_real_command_on_every_fixture() -> None:
    expected = json.loads((LOGS / "expected.json").read_text())
    files = sorted(expected)
    done = _subprocess("--json", *[str(LOGS / f) for f in files])
    assert done.returncode == 0, done.stderr
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(got) == len(files)
    for rel, out in zip(files, got, strict=True):
        want = expected[rel]
        if "exit_code" not in want:
            assert out["kind"] == want["kind"], rel


def test_real_command_missing_file_exit_status() -> None:
    done = _subprocess(str(KV), "/nonexistent/vllm.log")
    assert done.returncode == 2
    assert b"/nonexistent/vllm.log" in done.stderr
    assert b"kv_cache_insufficient" in done.stdout


def test_model_and_gpu_facts_replay_the_daemons_sizing(capsys: pytest.CaptureFixture[str]) -> None:
    busy = LOGS / "v1" / "0.10.2-insufficient-free-memory-tp2.log"       # 61.42 of 79.19 GiB free
    model = ROOT / "tests" / "fixtures" / "models" / "Qwen2.5-7B-Instruct"
    assert _run(["--json", "--flags", "--tensor-parallel-size 2", str(busy)]) == 0
    alone = json.loads(capsys.readouterr().out)["remedy"]["flags"]
    assert set(alone) == {"--gpu-memory-utilization"}
    assert _run(["--json", "--flags", "--tensor-parallel-size 2", "--model", str(model), str(busy)]) == 0
    sized = json.loads(capsys.readouterr().out)["remedy"]["flags"]
    assert float(sized["--gpu-memory-utilization"]) * 79.19 <= 61.42    # passes vLLM's free check
    assert "--max-model-len" not in sized                               # 32768 still fits at that share

    lean = LOGS / "v1" / "0.9.1-insufficient-free-memory.log"           # 10.2 of 23.64 GiB free
    assert _run(["--json", "--model", str(model), str(lean)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["healable"] is False and "weights" in out["remedy"]["why"]   # 14.2 GiB of weights cannot fit

    assert _run(["--json", "--model", "/no/such/model", str(lean)]) == 0
    captured = capsys.readouterr()
    assert "no config.json found" in captured.err
    assert json.loads(captured.out)["remedy"]["flags"] == {"--gpu-memory-utilization": "0.4"}


def test_gpu_memory_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-3", "nan", "lots"):
        with pytest.raises(SystemExit) as e:
            _run(["--gpu-total-gib", bad, str(KV)])
        assert e.value.code == 2
        assert "is not a positive number of GiB" in capsys.readouterr().err
