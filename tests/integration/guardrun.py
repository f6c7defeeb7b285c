"""Run a real ``vllm-guard start`` process against the fake vLLM and watch it through /status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.fakes.emulator import printed

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakes" / "fake_vllm.py"
MARKER = "VLLMGUARD_LAUNCH"
#: The fake vLLM's Llama-3.1-8B (its scenario's "model"): real config.json figures, and the weights
#: vLLM printed loading it ("Model loading took 14.99 GiB", calibration record 5).
LLAMA8B = {"weights_gib": printed("Llama-3.1-8B-Instruct", "obs_weights_gib"), "kv_bytes_per_token": 131072,
           "num_kv_heads": 8,
           "derived_max_model_len": 131072, "vocab": 128256, "hidden": 4096, "intermediate": 14336}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GuardRun:
    """One guard process; ``wait_for`` polls /status against a deadline (no blind sleeps)."""

    def __init__(self, tmp: Path, scenario: dict[str, Any] | None = None, vllm_args: list[str] = (),
                 guard_args: list[str] = (), env: dict[str, str] | None = None,
                 model: str = "fake/model", state_dir: Path | None = None,
                 vllm_command: str | None = None, token: str = "test-token") -> None:
        self.tmp = tmp
        self.port = free_port()
        self.status_port = free_port()
        self.state_dir = state_dir or tmp / "state"
        self.token = token
        self.log_path = tmp / f"guard-{self.status_port}.log"
        self.argv = [
            sys.executable, "-m", "supervisor", "start",
            "--model", model,
            "--vllm-command", vllm_command or f"{sys.executable} {FAKE} serve",
            "--port", str(self.port), "--status-port", str(self.status_port),
            "--state-dir", str(self.state_dir),
            "--health-interval", "0.3", "--health-timeout", "2", "--health-failures", "2",
            "--stop-grace", "3", "--startup-timeout", "60",
            *guard_args, "--", *vllm_args,
        ]
        self.env = {
            **os.environ,
            "FAKE_VLLM_SCENARIO": json.dumps(scenario or {}),
            "FAKE_VLLM_STATE": str(tmp / "fake-state"),
            "VLLM_GUARD_TOKEN": token,
            "VLLM_GUARD_BACKOFF_INITIAL": "0.1",
            "VLLM_GUARD_BACKOFF_JITTER": "0.1",
            "HF_HUB_OFFLINE": "1",          # the guard never asks the Hub for a test model's config
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        (tmp / "fake-state").mkdir(exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GuardRun:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=str(ROOT))
        return self

    # -- observation -----------------------------------------------------------------------
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.status_port}/status", timeout=2)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 60,
                 what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            s = self.status()
            if s is not None:
                last = s
                if pred(s):
                    return s
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"guard exited {self.proc.returncode} while waiting for {what}; "
                                     f"last status {json.dumps(last)[:2000]}\n{self.output()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status {json.dumps(last)[:2000]}\n"
                             f"{self.output()[-4000:]}")

    def wait_healthy(self, launches: int | None = None, timeout: float = 60) -> dict[str, Any]:
        def ok(s: dict[str, Any]) -> bool:
            return s["state"] == "healthy" and (launches is None or len(s["launches"]) == launches)
        return self.wait_for(ok, timeout, f"healthy (launches={launches})")

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"guard did not exit in {timeout} s\n{self.output()[-4000:]}") from None

    def history(self) -> list[dict[str, Any]]:
        """What ``vllm-guard history --json`` prints for this guard's state dir (also after it stopped)."""
        out = subprocess.run([sys.executable, "-m", "supervisor", "history", "--json", "--state-dir",
                              str(self.state_dir)], env=self.env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    def chat(self, model: str = "fake/model") -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", timeout=10,
                          json={"model": model, "max_tokens": 1,
                                "messages": [{"role": "user", "content": "hi"}]})

    def post(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(f"http://127.0.0.1:{self.status_port}{path}", headers=headers, timeout=5)

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_marked(self.state_dir)
        if hasattr(self, "_log"):
            self._log.close()


def marked(state_dir: Path | None = None) -> list[psutil.Process]:
    """Live processes carrying a guard's launch marker (for this state dir, if given)."""
    from supervisor.shell import procs

    if state_dir is not None:
        return [h for p in procs.marked_processes(str(state_dir)) if (h := p.psutil()) is not None]
    out = []
    for p in psutil.process_iter():
        try:
            if MARKER in p.environ():
                out.append(p)
        except psutil.Error:
            continue
    return out


def kill_tree(pid: int, timeout: float = 30) -> None:
    """SIGKILL ``pid`` and its descendants and reap them; a process that has already gone is skipped
    (a child may exit between being listed and being signalled)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=timeout)


def kill_marked(state_dir: Path) -> None:
    for p in marked(state_dir):
        try:
            p.kill()
        except psutil.Error:
            pass


def argv_flag(argv: list[str], flag: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None
