"""On a TTY, `vllm-guard start` draws a live line under vLLM's output (checked through a real pty)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

from guardrun import FAKE, ROOT, free_port

from supervisor.shell.live import render


def test_render_is_one_bounded_line():
    text = render(2, "loading", 40, {"--max-model-len": "41840"}, 12.3, "starting", width=60)
    assert "launch 2" in text and "loading weights 40%" in text and len(text) <= 60
    assert "\n" not in text


def test_live_line_on_a_tty(tmp_path):
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_GUARD_TOKEN": "t",
           "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.32.0", "speed": 0.3})}
    argv = [sys.executable, "-m", "supervisor", "start", "--model", "fake/model",
            "--vllm-command", f"{sys.executable} {FAKE} serve", "--port", str(free_port()),
            "--status-port", str(free_port()), "--state-dir", str(tmp_path / "s"), "--no-plan"]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and b"serving" not in seen:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        os.close(master)
    assert b"\x1b[7mvllm-guard: launch 1" in seen          # the live line, in reverse video
    assert b"Application startup complete." in seen        # vLLM's own lines still shown
    assert b"serving" in seen                              # the live line followed the phases
    assert b"healthy: a chat completion succeeded" in seen  # the one-line summary
    assert code == 0
