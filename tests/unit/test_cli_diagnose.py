"""``vllm-guard diagnose``: through run() with a real argparse parser, and as a real subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
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


def test_diagnose_reads_a_file_as_the_daemon_reads_a_pipe(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One reader: a line is cut where the daemon's pipe reader cuts it (256 KiB, the rest dropped),
    so a fatal message beyond the cut is not seen by either, and one before it is seen by both."""
    from supervisor.core.vllm_text import MAX_LINE

    assert MAX_LINE == 256 * 1024
    oom = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    beyond = tmp_path / "beyond.log"
    beyond.write_bytes(b"x" * (MAX_LINE + 10) + b" " + oom + b"\n")
    within = tmp_path / "within.log"
    within.write_bytes(b"x" * (MAX_LINE - len(oom) - 10) + b" " + oom + b"\r\n")
    assert _run(["--json", str(beyond), str(within)]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got[0]["kind"] == "no_vllm_output"
    assert got[1]["kind"] == "oom_weights" and got[1]["numbers"]["tried_to_allocate_mib"] == 2048.0


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


# A V0 start-up (vLLM 0.6.x wording: worker.determine_num_available_blocks' summary, gpu_executor's
# block count, the MQ engine's error) whose banner was not kept: only the log says which engine ran.
_V0_NO_KV = """\
INFO 10-15 12:00:04 model_runner.py:1072] Starting to load model meta-llama/Llama-3.1-8B-Instruct...
INFO 10-15 12:00:10 model_runner.py:1077] Loading model weights took 14.9595 GB
INFO 10-15 12:00:12 worker.py:232] Memory profiling takes 1.43 seconds
INFO 10-15 12:00:12 worker.py:232] the current vLLM instance can use total_gpu_memory (23.68GiB) x gpu_memory_utilization (0.70) = 16.58GiB
INFO 10-15 12:00:12 worker.py:232] model weights take 14.99GiB; non_torch_memory takes 0.09GiB; PyTorch activation peak memory takes 2.23GiB; the rest of the memory reserved for KV Cache is -0.73GiB.
INFO 10-15 12:00:13 gpu_executor.py:76] # GPU blocks: 0, # CPU blocks: 2048
ERROR 10-15 12:00:14 engine.py:366] No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/multiprocessing/engine.py", line 357, in run_mp_engine
  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 299, in initialize_cache
  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 480, in raise_if_cache_size_invalid
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""  # noqa: E501  (vLLM's lines as it printed them)


def test_a_v0_log_without_its_version_is_healed_by_v0s_rules(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """V0 sizes the KV cache (determine_num_available_blocks, profile_run without graphs) before it
    captures CUDA graphs (_warm_up_model, after initialize_cache): eager mode frees no KV memory there.
    At the share the user set, a smaller batch is what frees it: on V0 below 32768 tokens, chunked
    prefill (the profile runs one chunk instead of the whole context)."""
    log = tmp_path / "v0-no-version.log"
    log.write_text(_V0_NO_KV)
    assert _run(["--json", "--flags", "--gpu-memory-utilization 0.7 --max-model-len 8192", str(log)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kind"] == "no_kv_cache_memory" and got["numbers"]["engine"] == "v0"
    assert "vllm_version" not in got["numbers"]
    assert got["remedy"]["flags"] == {"--enable-chunked-prefill": ""}, got["remedy"]
    # the same failure from a V1 engine (its own wording), version hidden too: eager mode first
    v1 = tmp_path / "v1-no-version.log"
    v1.write_text("(EngineCore_DP0 pid=7) INFO 09-20 10:00:41 [gpu_worker.py:298] "
                  "Available KV cache memory: -2.77 GiB\n"
                  "(EngineCore_DP0 pid=7) ERROR 09-20 10:00:41 [core.py:718] EngineCore failed to start.\n"
                  "(EngineCore_DP0 pid=7) ERROR 09-20 10:00:41 [core.py:718] ValueError: No available memory for the "
                  "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n")
    assert _run(["--json", "--flags", "--gpu-memory-utilization 0.7 --max-model-len 8192", str(v1)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["numbers"]["engine"] == "v1" and got["remedy"]["flags"] == {"--enforce-eager": ""}, got["remedy"]


# --------------------------------------------------------------------------- how the log was read
CARRIED = LOGS / "carriers"


def _guard_own_lines(path: Path) -> int:
    """The guard's own lines in a journal: its JSON log records and journalctl's ``-- Boot`` notes
    (counted here from the file, by their shape)."""
    lines = path.read_text().splitlines()
    return (sum(1 for ln in lines if ']: {"' in ln and '"event"' in ln and '"level"' in ln)
            + sum(1 for ln in lines if ln.startswith("-- ")))


def test_journalctl_piped_to_diagnose_dash_names_journald_and_the_guards_own_lines() -> None:
    """`journalctl -u vllm-guard | vllm-guard diagnose -`: the verdict, and a line saying how it was read."""
    path = CARRIED / "journalctl-u-vllm-guard-kv-cache.log"
    done = _subprocess("-", stdin=path.read_bytes())
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode().splitlines()
    assert out[0] == "-: kv_cache_insufficient (healable, during kv_cache)"
    own = _guard_own_lines(path)
    assert own == 3
    assert (f"  read as:  journald (journalctl) lines, their prefixes removed; {own} of vllm-guard's own "
            "lines skipped") in out
    assert "  relaunch: --max-model-len 65408" in out


def test_json_report_says_which_carrier_and_that_a_console_listed_newest_first() -> None:
    done = _subprocess("--json", "-", stdin=(CARRIED / "gcloud-logging-read-newest-first-model-path-missing.log")
                       .read_bytes())
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["kind"] == "config_error" and got["healable"] is False
    assert (got["carrier"], got["carrier_what"]) == ("console", "a cloud console or log viewer")
    assert got["newest_first"] is True and got["wrapped_at"] is None and got["guard_lines"] == 0


@pytest.mark.parametrize(("name", "marker"), [("github-quote-wrapped-100-kv-cache.log", "> "),
                                              ("list-item-indented-wordwrap-72-cpu-kv-space.log", "    ")])
def test_a_wrapped_paste_reports_the_width_it_was_wrapped_at(name: str, marker: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The width is the paste's own widest line once its quote or indentation is off."""
    path = CARRIED / name
    width = max(len(ln[len(marker):]) for ln in path.read_text().splitlines()
                if ln.startswith(marker) and not ln[len(marker):].startswith((" ", "\t")))
    assert _run(["--json", str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["wrapped_at"] == width
    assert got["carrier"] is None and got["newest_first"] is False
    assert _run([str(path)]) == 0
    assert f"  read as:  wrapped at {width} columns, re-joined" in capsys.readouterr().out.splitlines()


def test_vllms_own_output_has_no_read_as_line(capsys: pytest.CaptureFixture[str]) -> None:
    plain = LOGS / "v0" / "0.7.2-oom-cudagraph.log"      # vLLM's own lines, as its server printed them
    assert _run([str(plain)]) == 0
    assert "read as:" not in capsys.readouterr().out
    assert _run(["--json", str(plain)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["carrier"], got["carrier_what"], got["wrapped_at"], got["newest_first"], got["guard_lines"]) == (
        None, "", None, False, 0)


def test_an_oom_nothing_places_is_reported_as_unknown_not_as_the_weights(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    """A paste of the OOM's line alone: no frames, no milestones before it. The report says the phase
    is unknown, and neither the verdict nor the reason claims the weights were the cause."""
    log = tmp_path / "oom.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 23.64 GiB of which 1.06 GiB is free.\n")
    assert _run([str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("during unknown)")
    why = next(line for line in out if line.startswith("  why:"))
    assert "nothing in the log says where" in why and "do not fit" not in why
    assert _run(["--json", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["phase"] == "unknown"


def test_a_wrapped_repr_is_not_said_to_have_come_through_a_carrier(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    """A failure's text pasted as one string and wrapped by an editor at 80 columns: a piece that begins with a
    progress bar's ``Completed | 2/4`` reads like compose's prefix, but one such line in the paste is no carrier's:
    the report says what was undone, and nothing else (found: ``read as:  compose (docker compose) lines``)."""
    tagged = [f"(EngineCore pid=31) INFO 11-30 12:00:0{i} [core.py:1] Loading safetensors checkpoint shards:  "
              f"{25 * i}% Completed | {i}/4 [00:0{i}<00:01,  1.22it/s]" for i in range(1, 4)]
    log = tmp_path / "repr.log"
    text = "\\n".join([*tagged, *(LOGS / "v1" / "0.8.4-kv-insufficient-no-estimate.log").read_text().splitlines()])
    log.write_text("\n".join(textwrap.wrap(text, 80, break_long_words=False)) + "\n")
    assert _run([str(log)]) == 0
    out = capsys.readouterr().out
    assert "kv_cache_insufficient" in out.splitlines()[0]
    assert "  read as:  wrapped at" in out and "compose" not in out


def test_a_paste_of_two_attempts_reports_the_last_and_says_so(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """A reporter's two attempts in one paste, a sentence between (a flag misspelt, then the real failure): the
    report is the last launch's, its relaunch that launch's, and it says there was one before."""
    first = (LOGS / "current" / "0.21.0-invalid-choice.log").read_text()
    last = (LOGS / "current" / "0.11.0-kv-insufficient.log").read_text()
    log = tmp_path / "two.log"
    log.write_text(f"{first}\nmy bad, a typo; the second try:\n\n{last}")
    assert _run([str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "kv_cache_insufficient" in out[0]
    assert "The last of 2 launches in the log; the one before: config_error." in out[1]
    assert any(line.startswith("  relaunch: --max-model-len 41840") for line in out), out


_AUTO_FIT = [
    "(APIServer pid=1) INFO 06-03 22:15:20 [api_server.py:1] vLLM API server version 0.24.0",
    "(EngineCore pid=9) INFO 06-03 22:15:38 [kv_cache_utils.py:1954] Auto-fit max_model_len: reduced from 32768 to "
    "{chosen} to fit in available GPU memory (0.06 GiB available for KV cache)",
    "(APIServer pid=1) INFO:     Application startup complete.",
]


@pytest.mark.parametrize(("chosen", "flags", "kind"), [
    (1744, [], "kv_cache_insufficient"),             # below the floor (--min-model-len, 2048 by default)
    (8192, [], "healthy"),
    (1744, ["--flags", "--max-model-len auto --enforce-eager"], "kv_cache_insufficient"),
    (8192, ["--flags", "--max-model-len 4096"], "healthy"),   # (not auto: no choice of vLLM's to hold)
])
def test_a_launch_whose_log_shows_vllms_auto_fit_choice_is_held_to_the_floor_as_the_daemon_holds_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, chosen: int, flags: list[str], kind: str) -> None:
    """vLLM prints its auto-fit choice only for --max-model-len auto: a log that shows it ran so, and the choice
    below the guard's floor is a KV cache too small, though vLLM served (found: a laptop served 1744 tokens)."""
    log = tmp_path / "auto.log"
    log.write_text("\n".join(_AUTO_FIT).replace("{chosen}", str(chosen)) + "\n")
    assert _run(["--json", *flags, str(log)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == kind, out
    if kind == "kv_cache_insufficient":
        assert out["numbers"]["fit_max_model_len"] == chosen and out["phase"] == "kv_cache"
