"""Living with the guard, and hostile conditions: real guard processes against the fake vLLM.

`serve` as a drop-in for `vllm serve` with only VLLM_GUARD_* settings, the webhook, the metrics,
`history` and `logs` after the guard stopped; every stop signal, a second SIGTERM, a stop while
waiting for another guard's start-up turn; symlinks planted at every state file, random bytes in
every state file.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from guardrun import FAKE, LLAMA8B, ROOT, argv_flag, free_port, marked


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook receiver that keeps every JSON body it gets."""

    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook():
    Hook.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Hook.received
    server.shutdown()


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_serve_heals_with_only_vllm_guard_variables_and_leaves_a_trace(tmp_path, webhook):
    """`vllm-guard serve MODEL --port P <vLLM flags>`: heals, counts, notifies, and keeps history and logs."""
    url, received = webhook
    port, status_port, state = free_port(), free_port(), tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.32.0", "model": LLAMA8B}),
           "FAKE_VLLM_STATE": str(tmp_path),
           "VLLM_GUARD_STATE_DIR": str(state), "VLLM_GUARD_STATUS_PORT": str(status_port),
           "VLLM_GUARD_VLLM_COMMAND": f"{sys.executable} {FAKE} serve", "VLLM_GUARD_NOTIFY_URL": url,
           "VLLM_GUARD_TOKEN": "a-token-of-my-own-long-enough", "VLLM_GUARD_BACKOFF_INITIAL": "0.1"}
    log = open(tmp_path / "guard.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "serve", "fake/model", "--port", str(port),
                             "--enable-prefix-caching"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, s = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                s = httpx.get(f"http://127.0.0.1:{status_port}/status", timeout=2).json()
            except httpx.HTTPError:
                s = None
            if s and s["state"] == "healthy":
                break
            assert proc.poll() is None, (tmp_path / "guard.log").read_text()
            time.sleep(0.2)
        assert s and s["state"] == "healthy", s
        first, second = s["launches"]
        assert first["kind"] == "kv_cache_insufficient"
        assert "--enable-prefix-caching" in second["argv"] and argv_flag(second["argv"], "--port") == str(port)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10, json={
            "model": "fake/model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{status_port}/metrics", timeout=5).text
        assert 'vllm_guard_relaunches_total{reason="kv_cache_insufficient"} 1.0' in metrics
        assert s["context"]["text"].startswith(f"context served {argv_flag(second['argv'], '--max-model-len')}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e["event"] == "healthy" for e in received):
            time.sleep(0.1)
        events = [e["event"] for e in received]
        assert events[:3] == ["launch_failed", "relaunch", "healthy"], events
        assert received[0]["kind"] == received[1]["kind"] == "kv_cache_insufficient"
        assert all(e["model"] == "fake/model" and e["text"] for e in received)
        assert "a-token-of-my-own-long-enough" not in json.dumps(received)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        log.close()
    hist = cli("history", "--json", "--state-dir", str(state), env={"VLLM_GUARD_TOKEN": ""})
    records = [json.loads(line) for line in hist.stdout.splitlines()]
    failed = [r for r in records if r.get("outcome") == "failed"]
    assert failed and failed[0]["kind"] == "kv_cache_insufficient" and failed[0]["evidence"]
    logs = cli("logs", "-n", "400", "--state-dir", str(state))
    assert logs.returncode == 0 and "estimated maximum model length" in logs.stdout
    assert "=== vllm-guard: launch 2" in logs.stdout


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2])
def test_every_signal_that_can_end_the_guard_stops_everything_cleanly(run, sig):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    assert marked(g.state_dir)
    g.proc.send_signal(sig)
    assert g.wait_exit(30) == 0
    assert marked(g.state_dir) == []
    assert "stopped on request" in g.output()


def test_a_second_sigterm_skips_the_grace(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "ignore_sigterm": True},
            vllm_args=["--max-model-len", "8192"], guard_args=["--stop-grace", "60"])
    g.wait_healthy(launches=1)
    g.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    g.proc.send_signal(signal.SIGTERM)
    assert g.wait_exit(20) == 0
    assert time.monotonic() - t0 < 15                    # not the 60 s grace vLLM ignores
    assert marked(g.state_dir) == []


def test_stop_while_waiting_for_another_guards_start_up_turn_ends_at_once(run, tmp_path):
    # Without NVML both guards take turns on the same key; the first one's vLLM hangs at start-up,
    # holding the turn.
    slow = run({"version": "0.32.0", "model": LLAMA8B, "silent_hang_at_start": True},
               vllm_args=["--max-model-len", "8192"], state_dir=tmp_path / "slow",
               guard_args=["--stall-timeout", "600"])
    slow.wait_for(lambda s: s["state"] == "starting" and s["pid"], 30, "the first guard's launch")
    second = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"],
                 state_dir=tmp_path / "second", guard_args=["--startup-timeout", "1800"])
    deadline = time.monotonic() + 30
    while "waiting for its turn" not in second.output():
        assert time.monotonic() < deadline, second.output()[-2000:]
        time.sleep(0.1)
    t0 = time.monotonic()
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait_exit(15) == 0 and time.monotonic() - t0 < 10
    assert marked(tmp_path / "second") == []
    assert slow.terminate() == 0


STATE_FILES = ("guard.lock", "guard.json", "token", "learned.json", "launch.json", "history.jsonl", "vllm.log")


def test_symlinks_planted_at_every_state_file_are_never_followed(run, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victims = {}
    for name in STATE_FILES:
        target = tmp_path / f"victim-{name}"
        target.write_text(f"precious {name}\n")
        victims[target] = target.read_text()
        (state / name).symlink_to(target)
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"], state_dir=state,
            env={"VLLM_GUARD_TOKEN": ""})           # the guard writes its own token file too
    g.wait_for(lambda s: s["state"] == "healthy", 60, "healthy")
    assert g.terminate() == 0
    for target, content in victims.items():
        assert target.read_text() == content, f"{target.name} was written through a symlink"


def test_random_bytes_in_every_state_file_and_the_next_guard_serves(run, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for name in STATE_FILES:
        (state / name).write_bytes(os.urandom(4096))
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"], state_dir=state)
    g.wait_healthy(launches=1)
    assert g.chat().status_code == 200
    assert g.terminate() == 0
    assert list(state.glob("learned.json.corrupt-*")) and list(state.glob("launch.json.corrupt-*"))


def test_a_state_dir_others_can_write_and_we_do_not_own_is_refused(run, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    state = tmp_path / "shared"
    state.mkdir()
    os.chown(state, 65534, 65534)
    state.chmod(0o777)
    g = run({"version": "0.32.0"}, state_dir=state)
    assert g.wait_exit(30) == 78
    assert "another user could plant links there" in g.output()


def test_a_world_writable_state_dir_of_ours_is_made_private(run, tmp_path):
    state = tmp_path / "open"
    state.mkdir()
    state.chmod(0o777)
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"], state_dir=state)
    g.wait_healthy(launches=1)
    assert state.stat().st_mode & 0o077 == 0
    assert g.terminate() == 0


def test_dry_run_prints_the_first_launch_and_launches_nothing(tmp_path):
    out = cli("start", "--dry-run", "--model", "fake/model", "--vllm-command", f"{sys.executable} {FAKE} serve",
              "--state-dir", str(tmp_path / "state"), "--", "--max-model-len", "8192", "--swap-space", "4",
              env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    command = next(line for line in lines if not line.startswith("#"))
    assert command.endswith("--max-model-len 8192 --swap-space 4") and "fake/model" in command
    assert not (tmp_path / "state").exists()             # nothing claimed, nothing launched


def test_a_missing_vllm_command_is_refused_saying_where_it_looked(run):
    g = run({"version": "0.32.0"}, vllm_command="no-such-vllm-binary serve")
    assert g.wait_exit(30) == 78
    out = g.output()
    assert "'no-such-vllm-binary' is not on PATH" in out and "VLLM_GUARD_VLLM_COMMAND" in out


def test_vllm_flags_without_the_double_dash_get_a_hint():
    out = cli("start", "--model", "m", "--max-model-len", "4096")
    assert out.returncode == 2
    assert "vllm-guard serve MODEL --max-model-len 4096" in out.stderr


def test_status_json_is_json_even_when_no_guard_runs(tmp_path):
    out = cli("status", "--json", "--state-dir", str(tmp_path), "--status-port", str(free_port()))
    assert out.returncode == 1
    assert json.loads(out.stdout)["running"] is False


def test_after_stop_status_names_the_port_that_guard_used_and_ps_lists_it(run):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    ps = cli("ps", "--json", "--state-dir", str(g.state_dir))
    rows = [json.loads(line) for line in ps.stdout.splitlines()]
    mine = next(r for r in rows if r["state_dir"] == str(g.state_dir))
    assert mine["state"] == "healthy" and mine["model"] == "fake/model" and mine["vllm"].endswith(str(g.port))
    assert g.terminate() == 0
    out = cli("status", "--state-dir", str(g.state_dir))
    assert out.returncode == 1 and f"it listened on port {g.status_port}" in out.stderr
    assert psutil.pid_exists(g.proc.pid) is False or psutil.Process(g.proc.pid).status() == psutil.STATUS_ZOMBIE
