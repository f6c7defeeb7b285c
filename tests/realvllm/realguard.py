"""Helpers of the real-vLLM tier: guards run as real processes, and the processes they leave.

Every process this tier starts carries the environment marker ``VLLM_GUARD_REALTEST=<token>``
(the guard hands its environment on to vLLM, and sets ``SPT_NOENV`` so vLLM's process titles do not
erase it), and every descendant seen while polling is remembered; teardown ends exactly those.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "VLLM_GUARD_REALTEST"
TOKEN = uuid.uuid4().hex
CACHE = Path(os.environ.get("VLLM_GUARD_CACHE", Path.home() / ".cache" / "vllm-guard"))


class Real:
    """Where the real vLLM and the tiny model live."""

    def __init__(self, python: str, model: str) -> None:
        self.python = python
        self.model = model
        self.vllm_command = f"{python} -m vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def guard_exe() -> str:
    """``$VLLM_GUARD_EXE``, else the ``vllm-guard`` beside the test interpreter, else on PATH."""
    if os.environ.get("VLLM_GUARD_EXE"):
        return os.environ["VLLM_GUARD_EXE"]
    here = Path(sys.executable).parent / "vllm-guard"
    if here.exists():
        return str(here)
    found = shutil.which("vllm-guard")
    if not found:
        pytest.fail("no vllm-guard executable beside the test interpreter or on PATH (pip install -e .)")
    return found


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_vllm_proc(p: psutil.Process) -> bool:
    """A vLLM engine/worker process, by name or by the title it sets (``VLLM::EngineCore``)."""
    try:
        cmd = p.cmdline()
        return p.name().startswith("VLLM::") or bool(cmd and cmd[0].startswith("VLLM::"))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def is_api_server(p: psutil.Process) -> bool:
    try:
        return "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


class Tracker:
    """Every process this session started, directly or through a guard and vLLM."""

    def __init__(self) -> None:
        self.seen: dict[int, psutil.Process] = {}

    def marked(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER) == TOKEN:
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return out

    def note(self, root: psutil.Process | int) -> None:
        """Remember ``root`` and its descendants (call often: orphans lose their parent link)."""
        try:
            p = root if isinstance(root, psutil.Process) else psutil.Process(root)
            for q in [p, *p.children(recursive=True)]:
                self.seen.setdefault(q.pid, q)
        except psutil.NoSuchProcess:
            pass
        for q in self.marked():
            self.seen.setdefault(q.pid, q)

    def living(self) -> list[psutil.Process]:
        by_pid = {p.pid: p for p in self.marked()}
        for pid, p in self.seen.items():
            by_pid.setdefault(pid, p)
        return [p for p in by_pid.values() if alive(p)]

    def living_vllm(self) -> list[psutil.Process]:
        return [p for p in self.living() if is_vllm_proc(p) or is_api_server(p)]

    def kill_all(self) -> list[int]:
        """SIGKILL what is left (only what this session started); returns their pids."""
        left = self.living()
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        return [p.pid for p in left]


class GuardProc:
    """One ``vllm-guard start`` as a real subprocess, with its output in a file and /status polled."""

    def __init__(self, real: Real, tracker: Tracker, state_dir: Path, log_path: Path,
                 port: int, status_port: int, extra: list[str], vllm_args: list[str],
                 extra_env: dict[str, str | None] | None = None) -> None:
        self.real, self.tracker = real, tracker
        self.state_dir, self.log_path = state_dir, log_path
        self.port, self.status_port = port, status_port
        self.argv = [
            guard_exe(), "start", "--model", real.model, "--vllm-command", real.vllm_command,
            "--host", "127.0.0.1", "--port", str(port), "--status-port", str(status_port),
            "--state-dir", str(state_dir), *extra, "--", *vllm_args,
        ]
        env = dict(os.environ)
        env.update({MARKER: TOKEN, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"})
        for key, value in (extra_env or {}).items():    # None: unset
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        self._log = open(log_path, "ab")
        self._log.write(f"\n===== {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        tracker.note(self.proc.pid)
        self.last: dict[str, Any] | None = None

    # -- observation -------------------------------------------------------------------------
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-n:])

    def status(self) -> dict[str, Any] | None:
        """GET /status, or None while the endpoint is not up."""
        try:
            r = httpx.get(f"http://127.0.0.1:{self.status_port}/status", timeout=5)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        self.last = r.json()
        return self.last

    def wait(self, what: str, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """Poll /status until ``pred`` holds; fail with the guard's output if it exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tracker.note(self.proc.pid)
            s = self.status()
            if s is not None and pred(s):
                return s
            if self.proc.poll() is not None:
                pytest.fail(f"the guard exited ({self.proc.returncode}) while waiting for {what}; "
                            f"last status: {json.dumps(self.last)[:3000]}\n--- guard output ---\n"
                            f"{self.tail()}")
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last status: "
                    f"{json.dumps(self.last)[:3000]}\n--- guard output ---\n{self.tail()}")

    def wait_healthy(self, launches: int, timeout: float) -> dict[str, Any]:
        return self.wait(f"healthy at launch {launches}",
                         lambda s: s.get("state") == "healthy" and len(s.get("launches", [])) == launches
                         and s["launches"][-1].get("outcome") == "healthy", timeout)

    def vllm_descendants(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.tracker.note(self.proc.pid)
        return [p for p in kids if alive(p)]

    def chat(self, max_tokens: int = 1) -> httpx.Response:
        """A real chat completion through vLLM's own port (not through the guard)."""
        return httpx.post(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            json={"model": self.real.model, "max_tokens": max_tokens,
                  "messages": [{"role": "user", "content": "Say hello in one word."}]},
            timeout=60,
        )

    # -- control -----------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        self.tracker.note(self.proc.pid)
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the guard did not exit within {timeout:.0f} s\n--- guard output ---\n{self.tail()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
