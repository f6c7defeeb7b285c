"""Two vLLMs on one port: a guard never calls another server's answer its own vLLM's.

Real guard processes and the fake vLLM (which binds its socket after ``bind_after`` seconds, as real
vLLM binds after its imports, and shares the port with ``SO_REUSEPORT`` from 0.7.3 to 0.24 as real
vLLM does). Polls /status and the guard's exit, no blind sleeps.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import httpx
from guardrun import FAKE, LLAMA8B, ROOT, kill_tree


def test_a_second_guard_that_waited_its_turn_checks_the_port_again_and_refuses_naming_the_first(run, tmp_path):
    """The first guard's vLLM has not bound the port yet when the second guard looks, so the second
    waits its start-up turn; by its turn the first vLLM serves on the port. The second must refuse
    (exit 78, no launch) naming the holder, not report healthy through the first guard's vLLM."""
    first = run({"version": "0.32.0", "model": LLAMA8B, "bind_after": 2.0, "speed": 0.1},
                vllm_args=["--max-model-len", "8192"])
    first.wait_for(lambda s: s["state"] == "starting" and s["launches"] and s["launches"][-1].get("pid"), 30,
                   "the first guard's launch (its vLLM still importing, the port still free)")
    second = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--port", str(first.port)],
                 state_dir=tmp_path / "second-state")
    assert second.wait_exit(90) == 78
    out = second.output()
    assert "waiting for its turn" in out                     # it did wait behind the first guard
    assert f"port {first.port} is held by another vllm-guard's vLLM (pid" in out
    launches = [r for r in second.history() if r.get("n") is not None]
    assert launches and all(r.get("pid") is None and r.get("outcome") != "healthy" for r in launches), launches
    assert first.wait_healthy(launches=1)["state"] == "healthy"
    assert first.terminate() == 0


def test_a_probe_answered_by_another_vllm_on_the_port_is_not_healthy(run, tmp_path):
    """vLLM 0.20 (SO_REUSEPORT): the guard's vLLM binds and loads; meanwhile another vLLM, run by
    hand, binds the same port and serves first. Its 200 is not this launch's: the guard stops its
    launch and exits 78 naming the process that answered, instead of reporting healthy."""
    guarded = run({"version": "0.20.0", "model": LLAMA8B, "speed": 5.0}, vllm_args=["--max-model-len", "8192"])
    guarded.wait_for(lambda s: s["state"] == "starting" and s["launches"] and s["launches"][-1].get("pid"), 30,
                     "the guard's launch")

    def held(port: int) -> bool:
        """Bound by someone: a plain bind (no SO_REUSEPORT) is refused."""
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                return e.errno == errno.EADDRINUSE
            return False

    guarded.wait_for(lambda s: held(guarded.port), 30, "the guard's vLLM to bind its port (not yet listening)")
    env = {**os.environ, "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.20.0", "speed": 0.01,
                                                           "engine_survives_parent": False}),
           "FAKE_VLLM_STATE": str(tmp_path / "fake-state"), "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "by-hand.log", "wb")
    other = subprocess.Popen([sys.executable, str(FAKE), "serve", "fake/model", "--port", str(guarded.port)],
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert guarded.wait_exit(90) == 78
        out = guarded.output()
        assert f"port {guarded.port} answers from another process (pid {other.pid}" in out, out[-3000:]
        assert other.poll() is None
        assert httpx.post(f"http://127.0.0.1:{guarded.port}/v1/chat/completions", timeout=10,
                          json={"model": "fake/model", "max_tokens": 1,
                                "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    finally:
        kill_tree(other.pid)
        log.close()
