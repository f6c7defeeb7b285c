"""The README's promises held by a real guard at their exact values: exit codes, signals, rotation
sizes, the status endpoint's defaults, restart --reset, the stall timeout, a stop during the wait
for the GPU's memory. The table of every promise and the tests that hold it: docs/promises.md.

Each test runs the real ``vllm-guard`` (a process, or the Guard in this process where the GPU it
reads must be given) against the fake vLLM, and looks only from outside: exit codes, /status,
the state dir, the processes left.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from guardrun import FAKE, LLAMA8B, ROOT, GuardRun, argv_flag, free_port, marked

from supervisor.shell import procs

MiB = 1 << 20
SERVING = {"version": "0.32.0", "model": LLAMA8B}
FLAGS = ["--max-model-len", "8192"]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def until(pred, timeout: float, what: str):
    """``pred()`` once truthy; fails naming ``what`` after ``timeout`` seconds (polled, no blind sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.05)


# -- exit codes (README: "Exit codes") ---------------------------------------------------------------
def test_exit_0_on_post_stop_and_on_vllm_guard_stop(run):
    g = run(SERVING, vllm_args=FLAGS)
    g.wait_healthy(launches=1)
    assert g.post("/stop", token=g.token).status_code == 202
    assert g.wait_exit(30) == 0 and marked(g.state_dir) == []
    h = run(SERVING, vllm_args=FLAGS, state_dir=g.state_dir)
    h.wait_healthy(launches=1)
    stop = cli("stop", "--state-dir", str(h.state_dir), env={"VLLM_GUARD_TOKEN": h.token})
    assert stop.returncode == 0, stop.stderr
    assert h.wait_exit(30) == 0 and marked(h.state_dir) == []


@pytest.mark.parametrize("command", ["status", "restart", "stop"])
def test_exit_1_when_a_client_command_finds_no_guard(tmp_path, command):
    out = cli(command, "--state-dir", str(tmp_path), "--status-port", str(free_port()))
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert ("vllm-guard is not running" if command == "status" else "no vllm-guard holds") in out.stderr


def test_exit_1_with_an_error_object_from_status_json(tmp_path):
    out = cli("status", "--json", "--state-dir", str(tmp_path), "--status-port", str(free_port()))
    assert out.returncode == 1
    answer = json.loads(out.stdout)
    assert answer["running"] is False and answer["error"].startswith("vllm-guard is not running")


@pytest.mark.parametrize("argv", [[], ["no-such-command"], ["start", "--model", "m", "--max-model-len", "4096"],
                                  ["status", "--no-such-option"]])
def test_exit_2_on_a_bad_command_line(argv):
    assert cli(*argv).returncode == 2


def test_exit_3_when_plan_says_the_model_does_not_fit():
    model = ROOT / "tests" / "fixtures" / "models" / "Llama-3.3-70B-Instruct"
    out = cli("plan", str(model), "--gpu-memory-gib", "24", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 3, out.stderr
    fits = cli("plan", str(ROOT / "tests" / "fixtures" / "models" / "Llama-3.1-8B-Instruct"), "--gpu-memory-gib", "80",
               env={"HF_HUB_OFFLINE": "1"})
    assert fits.returncode == 0, fits.stderr


def test_exit_70_on_a_bug_in_the_guard_which_still_stops_vllm_and_leaves_nothing(run, tmp_path):
    """A bug is put into the guard from outside (a sitecustomize the interpreter loads): the session
    raises when the first launch ends. The guard must exit 70 and leave no process of vLLM behind."""
    hooks = tmp_path / "bug"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import supervisor.core.session as s\n"
        "def ended(self, outcome):\n"
        "    raise RuntimeError('a deliberate bug')\n"
        "s.Session.ended = ended\n")
    g = run({"version": "0.32.0", "model": LLAMA8B, "engine_death_after": 0.5, "death_count": 1}, vllm_args=FLAGS,
            env={"PYTHONPATH": f"{hooks}{os.pathsep}{ROOT}"})
    assert g.wait_exit(60) == 70
    assert "internal error: RuntimeError: a deliberate bug" in g.output()
    assert marked(g.state_dir) == []


def test_exit_75_when_the_launch_budget_is_spent(run):
    g = run({"version": "0.32.0", "silent_hang_at_start": True}, guard_args=["--max-launches", "2",
                                                                              "--stall-timeout", "1"])
    assert g.wait_exit(60) == 75
    assert "2 launches in a row failed without becoming healthy" in g.output()
    assert marked(g.state_dir) == []


def test_exit_78_for_a_second_guard_on_the_same_state_dir_naming_the_first(run):
    g = run(SERVING, vllm_args=FLAGS)
    g.wait_healthy(launches=1)
    second = run(SERVING, vllm_args=FLAGS, state_dir=g.state_dir)
    assert second.wait_exit(30) == 78          # RestartPreventExitStatus=78: systemd must not retry it
    assert str(g.proc.pid) in second.output()
    assert g.status()["state"] == "healthy"
    assert g.terminate() == 0


def test_exit_78_for_a_setting_that_is_wrong(run):
    g = run(SERVING, env={"VLLM_GUARD_HEALTH_INTERVAL": "soon"})
    assert g.wait_exit(30) == 78
    assert "VLLM_GUARD_HEALTH_INTERVAL" in g.output()


# -- signals (README: "Every signal that can end the guard stops it cleanly") ---------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                                 signal.SIGUSR2], ids=lambda s: s.name)
def test_each_stop_signal_ends_a_vllm_that_ignores_sigterm_within_the_grace(run, sig):
    """vLLM ignores SIGTERM: the guard SIGKILLs it after --stop-grace (3 s here) and exits 0."""
    g = run({**SERVING, "ignore_sigterm": True}, vllm_args=FLAGS)
    g.wait_healthy(launches=1)
    assert len(marked(g.state_dir)) >= 2                    # the API server and its engine
    t0 = time.monotonic()
    g.proc.send_signal(sig)
    assert g.wait_exit(20) == 0
    took = time.monotonic() - t0
    assert 3.0 <= took < 3.0 + 5.0, f"{sig.name}: {took:.1f} s (the grace is 3 s, then SIGKILL)"
    assert marked(g.state_dir) == []
    assert "stopped on request" in g.output()


def test_sigint_stops_a_vllm_that_obeys_without_waiting_the_grace(run):
    g = run(SERVING, vllm_args=FLAGS, guard_args=["--stop-grace", "60"])
    g.wait_healthy(launches=1)
    t0 = time.monotonic()
    g.proc.send_signal(signal.SIGINT)
    assert g.wait_exit(30) == 0 and time.monotonic() - t0 < 15
    assert marked(g.state_dir) == []


class NohupRun(GuardRun):
    """A guard started the way ``nohup`` starts it: SIGHUP ignored before it runs."""

    def start(self) -> NohupRun:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=str(ROOT), preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        return self


def test_a_sighup_under_nohup_stays_ignored(tmp_path):
    g = NohupRun(tmp_path, SERVING, vllm_args=FLAGS).start()
    try:
        s = g.wait_healthy(launches=1)
        pid = s["pid"]
        g.proc.send_signal(signal.SIGHUP)
        sent = time.time()
        # the loop has turned since: a probe made after the signal has passed (probes run every 0.3 s)
        after = g.wait_for(lambda s: (s.get("last_probe") or {}).get("at", 0) > sent + 0.5, 30,
                           "a probe after the SIGHUP")
        assert g.proc.poll() is None, g.output()[-2000:]
        assert after["state"] == "healthy" and after["pid"] == pid and len(after["launches"]) == 1
        assert "stopped on request" not in g.output()
        assert g.terminate() == 0
    finally:
        g.close()


def test_a_terminal_that_went_away_does_not_end_the_guard(tmp_path):
    """The guard's stdout and stderr are a terminal (a pty); its master is closed, as when the
    terminal window goes. The guard goes on: a relaunch asked afterwards serves, and vLLM's lines
    are still kept in the state dir."""
    master, slave = pty.openpty()
    port, status_port, state = free_port(), free_port(), tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_GUARD_TOKEN": "test-token", "HF_HUB_OFFLINE": "1",
           "FAKE_VLLM_SCENARIO": json.dumps(SERVING), "FAKE_VLLM_STATE": str(tmp_path),
           "VLLM_GUARD_BACKOFF_INITIAL": "0.1"}
    argv = [sys.executable, "-m", "supervisor", "start", "--model", "fake/model",
            "--vllm-command", f"{sys.executable} {FAKE} serve", "--port", str(port), "--status-port", str(status_port),
            "--state-dir", str(state), "--health-interval", "0.3", "--stop-grace", "3", "--", *FLAGS]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    url = f"http://127.0.0.1:{status_port}"

    def status() -> dict | None:
        try:
            r = httpx.get(url + "/status", timeout=2)
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    try:
        seen = b""
        deadline = time.monotonic() + 60
        while (s := status()) is None or s["state"] != "healthy":
            assert proc.poll() is None and time.monotonic() < deadline, seen[-2000:]
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 65536)
        os.close(master)                                   # the terminal is gone
        master = -1
        r = httpx.post(url + "/restart", headers={"Authorization": "Bearer test-token"}, timeout=5)
        assert r.status_code == 202
        until(lambda: (s := status()) is not None and s["state"] == "healthy" and len(s["launches"]) == 2, 60,
              "the relaunch asked after the terminal went away serves")
        assert proc.poll() is None
        kept = (state / "vllm.log").read_bytes()
        assert kept.count(b"=== vllm-guard: launch 2") == 1 and b"Application startup complete." in kept
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in procs.marked_processes(str(state)):
            p.kill()


# -- hangs (README: "Hangs are failures") ------------------------------------------------------------
def test_the_stall_timeout_ends_a_silent_start_up_when_it_runs_out(run):
    """vLLM falls silent while loading: with --stall-timeout 2 the launch is ended as hung 2 s after its
    last line, long before the start-up timeout (600 s here). A stall timeout 1000 times longer fails
    this test in 20 s, saying so."""
    g = run({"version": "0.32.0", "model": LLAMA8B, "silent_hang_at_start": True}, vllm_args=FLAGS,
            guard_args=["--stall-timeout", "2", "--startup-timeout", "600", "--max-launches", "1"])
    code = None
    try:
        code = g.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("a vLLM silent for 20 s was not ended as hung with --stall-timeout 2")
    assert code == 75
    (launch,) = [r for r in g.history() if r.get("n")]
    assert launch["kind"] == "engine_dead" and launch["evidence"] == "no output for 2 s while starting"
    took = launch["ended_at"] - launch["started_at"]
    assert 2.0 <= took < 2.0 + 4.0, took
    assert marked(g.state_dir) == []


# -- restart --reset (README: "POST /restart[?reset=1]", `restart [--reset]`) ------------------------------
def test_restart_reset_relaunches_the_users_own_flags_and_drops_the_learned_ones(run, tmp_path):
    """The first guard heals the model's whole context to what fits and learns it; the second starts
    from the learned flags; `vllm-guard restart --reset` relaunches the flags the user gave (none: the
    whole context again) and forgets the learned ones: a guard started after it learns afresh."""
    g = run(SERVING)
    healed = g.wait_healthy(launches=2)
    length = argv_flag(healed["argv"], "--max-model-len")
    assert length is not None and g.terminate() == 0
    learned = run(SERVING, state_dir=g.state_dir)
    s = learned.wait_healthy(launches=1)
    assert s["flags_source"] == "store" and argv_flag(s["argv"], "--max-model-len") == length
    out = cli("restart", "--reset", "--state-dir", str(g.state_dir), env={"VLLM_GUARD_TOKEN": learned.token})
    assert out.returncode == 0, out.stderr
    after = learned.wait_for(lambda s: len(s["launches"]) >= 2 and s["launches"][0]["outcome"] == "reset", 60,
                             "the reset's relaunch")
    assert argv_flag(after["launches"][1]["argv"], "--max-model-len") is None      # the user's own flags
    assert after["flags_source"] == "user"
    learned.wait_healthy(launches=3)                         # the whole context fails once more, and heals
    assert learned.terminate() == 0
    records = [r for r in learned.history() if r.get("n")]
    assert [argv_flag(r["argv"], "--max-model-len") for r in records[-3:]] == [length, None, length]


def test_a_reset_forgets_the_learned_flags_even_when_the_guard_stops_before_serving_again(run):
    g = run(SERVING)
    g.wait_healthy(launches=2)
    assert g.terminate() == 0
    slow = {**SERVING, "speed": 1.0}                         # its start-ups take seconds: time to stop one
    second = run(slow, state_dir=g.state_dir)
    assert second.wait_healthy(launches=1, timeout=90)["flags_source"] == "store"
    assert second.post("/restart?reset=1", token=second.token).status_code == 202
    second.wait_for(lambda s: len(s["launches"]) == 2 and s["state"] == "starting", 30, "the reset's launch")
    assert second.terminate() == 0
    third = run(SERVING, state_dir=g.state_dir)
    s = third.wait_healthy(launches=2)
    assert s["launches"][0]["kind"] == "kv_cache_insufficient" and s["flags_source"] == "user"
    assert third.terminate() == 0


# -- rotation (README: "history.jsonl (every launch, rotated at 4 MiB) and vllm.log (rotated at 8 MiB)") ----
def _padding(path: Path, size: int, line: bytes) -> int:
    """Fill ``path`` with whole lines up to ``size`` bytes; the bytes written."""
    count = size // len(line)
    path.write_bytes(line * count)
    return count * len(line)


# room left below the limit: more than the guard's first line there, less than what one run writes
# (a launch's history record is about 600 bytes and a run writes two; vLLM's start-up, about 7 KB)
@pytest.mark.parametrize("name,limit,room", [("history.jsonl", 4 * MiB, 900), ("vllm.log", 8 * MiB, 2000)])
def test_a_state_log_rotates_at_its_size_and_loses_nothing(run, tmp_path, name, limit, room):
    """The file is filled to ``room`` bytes below its limit before a real guard starts: the guard's first
    lines still go into it, and the first line that does not fit moves the file to <name>.1 whole and
    starts a new one. Rotated earlier, the guard's lines would not be in <name>.1; later, there would be
    no <name>.1."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    pad = (json.dumps({"event": "padding", "n": None, "note": "x" * 40}) + "\n").encode() if name.endswith(
        ".jsonl") else b"INFO 12-01 09:00:00 [padding.py:1] an earlier vLLM line kept in the state dir\n"
    written = _padding(state / name, limit - room, pad)
    assert limit - room - len(pad) < written <= limit - room
    g = run(SERVING, vllm_args=FLAGS, state_dir=state)
    g.wait_healthy(launches=1)
    assert g.terminate() == 0
    assert (state / (name + ".1")).exists(), f"{name} grew past {limit} bytes without rotating"
    old, new = (state / (name + ".1")).read_bytes(), (state / name).read_bytes()
    assert len(old) <= limit and old[:written] == pad * (written // len(pad))
    assert len(old) > written, "rotated before the limit: none of the guard's own lines went into the old file"
    first_new = new.split(b"\n", 1)[0] + b"\n"
    assert len(old) + len(first_new) > limit                # that line did not fit: the limit is exactly this
    assert old.count(pad) == written // len(pad)            # the earlier lines, every one
    if name == "vllm.log":
        assert b"Application startup complete." in new
        logs = cli("logs", "-n", "1000000", "--state-dir", str(state))
        assert logs.returncode == 0 and logs.stdout.count("an earlier vLLM line") == written // len(pad)
    else:
        records = [json.loads(x) for x in cli("history", "--json", "--state-dir", str(state)).stdout.splitlines()]
        launches = [r for r in records if r.get("n")]
        assert launches and launches[-1]["outcome"] in ("healthy", "stopped")


# -- the status endpoint at its defaults (README: "5 s", "past 256 connections") ---------------------------
def _trickle(port: int, first: bytes = b"GET /status HTTP/1.1\r\n") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(first)
    return s


def _closed(s: socket.socket, within: float) -> bool:
    """Whether the server closes ``s`` within ``within`` seconds."""
    s.settimeout(within)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_the_status_endpoint_gives_a_request_5_s_at_its_default(run):
    """A client that sends a byte every half second (so no per-read timeout would ever fire) is cut
    5 s after it connected: the default deadline for a whole request."""
    g = run(SERVING, vllm_args=FLAGS)
    g.wait_healthy(launches=1)
    s = _trickle(g.status_port, b"G")
    t0 = time.monotonic()
    s.settimeout(0.5)
    closed_at = None
    for byte in b"ET /status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 40:
        if time.monotonic() - t0 > 10:
            break
        try:
            s.sendall(bytes([byte]))
            if s.recv(65536) == b"":
                closed_at = time.monotonic()
                break
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            closed_at = time.monotonic()
            break
    s.close()
    assert closed_at is not None, "a request trickling for 10 s was never cut (the deadline is 5 s)"
    assert 4.5 <= closed_at - t0 < 6.5, closed_at - t0
    assert g.terminate() == 0


def test_past_256_connections_the_oldest_still_sending_makes_room(run):
    g = run(SERVING, vllm_args=FLAGS)
    g.wait_healthy(launches=1)
    t0 = time.monotonic()
    first = _trickle(g.status_port)
    rest = [_trickle(g.status_port) for _ in range(254)]       # 255 still sending
    r = httpx.get(f"http://127.0.0.1:{g.status_port}/healthz", timeout=3)   # the 256th: answered
    assert r.status_code == 200 and r.text == "ok\n"
    assert not _closed(first, 0.2), "the oldest was dropped at 256 connections"
    rest.append(_trickle(g.status_port))                     # 256 still sending
    rest.append(_trickle(g.status_port))                     # 257: the oldest makes room
    assert _closed(first, 2.0), "257 connections and the oldest one still sending was not dropped"
    assert time.monotonic() - t0 < 4.5, "too slow to tell the cap from the 5 s deadline"
    assert not _closed(rest[0], 0.1)                        # only the oldest
    for s in [first, *rest]:
        s.close()
    assert g.status()["state"] == "healthy"
    assert g.terminate() == 0


# -- a stop ends every wait at once (README) -------------------------------------------------------------
def test_a_stop_during_the_wait_for_the_last_launchs_gpu_memory_ends_it_at_once(tmp_path):
    """The guard in this process, reading the GPU through a stand-in for NVML that shows a process of
    the last launch still holding memory after vLLM died (the driver has not released it). The guard
    waits for it (up to 60 s) before relaunching; a stop then ends the wait at once, with no launch."""
    from supervisor.config import GuardConfig, build, flatten
    from supervisor.core.flags import Flags
    from supervisor.core.gpus import GpuDevice, GpuProcess
    from supervisor.core.lifecycle import State
    from supervisor.shell.guard import Guard

    state = tmp_path / "state"
    total = int(23.55 * 2**30)

    class HeldMemory:
        """NVML as seen while a dead launch's memory is not yet released: once ``held``, a process
        carrying this guard's launch marker holds 10 GiB of the GPU."""

        def __init__(self) -> None:
            self.held = False
            self.holder: subprocess.Popen[bytes] | None = None

        def snapshot(self) -> list[GpuDevice]:
            held: tuple[GpuProcess, ...] = ()
            if self.held:
                if self.holder is None:
                    self.holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                                   env=procs.child_env(os.environ, str(state), 1))
                held = (GpuProcess(self.holder.pid, "VLLM::EngineCore", 10 * 2**30),)
            used = sum(p.used_bytes for p in held)
            return [GpuDevice(0, "NVIDIA L4", total, used, total - used, (8, 9), held)]

    nvml = HeldMemory()
    cfg = build({**flatten(GuardConfig()), "model": "fake/model", "vllm_command": f"{sys.executable} {FAKE} serve",
                 "vllm_args": tuple(Flags.parse("--max-model-len 8192").argv()), "port": free_port(),
                 "state_dir": str(state), "status.port": 0, "health.interval": 0.3, "stop_grace": 3.0,
                 "plan.enabled": False})
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "FAKE_VLLM_STATE": str(tmp_path),
               "FAKE_VLLM_SCENARIO": json.dumps({**SERVING, "engine_death_after": 0.5, "death_count": 1})}
    guard = Guard(cfg, environ, gpu_provider=nvml)

    async def main() -> tuple[int, float]:
        run = asyncio.ensure_future(guard.run())
        while not run.done() and not (guard.session and guard.session.state is State.HEALTHY):
            await asyncio.wait({run}, timeout=0.05)
        nvml.held = True                                    # from now on the GPU shows memory held
        while not run.done() and nvml.holder is None:        # the guard is waiting for it after the death
            await asyncio.wait({run}, timeout=0.05)
        assert guard.session is not None and guard.session.launches == 1
        t0 = time.monotonic()
        guard.command("stop")
        code = await asyncio.wait_for(run, 30)
        return code, time.monotonic() - t0

    try:
        code, took = asyncio.run(asyncio.wait_for(main(), 120))
        assert code == 0 and took < 2.0, (code, took)
        assert guard.session is not None and guard.session.launches == 1      # no launch after the stop
        assert guard.exit_reason == "stopped on request"
    finally:
        if nvml.holder is not None:
            nvml.holder.kill()
            nvml.holder.wait()
        for p in procs.marked_processes(str(state)):
            p.kill()


def test_a_stop_during_a_backoff_ends_it_at_once(run):
    # the first death after serving relaunches at once (issue 21 item 6); the second, soon after
    # serving again, is a crash loop and backs off
    g = run({**SERVING, "engine_death_after": 0.5, "death_count": 2}, vllm_args=FLAGS,
            env={"VLLM_GUARD_BACKOFF_INITIAL": "120", "VLLM_GUARD_BACKOFF_JITTER": "0"})
    s = g.wait_for(lambda s: s["state"] == "backoff", 60, "the backoff after vLLM died twice")
    assert s["crash_loop"]["backoff_until"] is not None
    t0 = time.monotonic()
    g.proc.send_signal(signal.SIGTERM)
    assert g.wait_exit(30) == 0 and time.monotonic() - t0 < 5.0
    assert [r["n"] for r in g.history() if r.get("n")] == [1, 2]       # no launch after the stop


def test_a_stop_while_reading_the_models_config_ends_it_at_once(run, tmp_path):
    """The model's config.json comes from a Hub that accepts the connection and never answers (the
    guard gives it 3 s): a stop meanwhile ends the guard at once, with no launch."""
    hub = socket.socket()
    hub.bind(("127.0.0.1", 0))
    hub.listen(16)                                           # connections queue; nothing ever answers
    try:
        g = run(SERVING, model="org/some-model", vllm_args=FLAGS,
                env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}",
                     "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})
        g.wait_for(lambda s: s["state"] == "planning", 30, "the guard gathering its facts")
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGTERM)
        assert g.wait_exit(30) == 0
        assert time.monotonic() - t0 < 1.5, "the stop waited for the model's config"
        assert not (g.state_dir / "vllm.log").exists() and marked(g.state_dir) == []
    finally:
        hub.close()


# -- a restart from another host (README: "A restart from another host") --------------------------------
def _readme_block(containing: str) -> str:
    """The README's ```sh block that holds ``containing``, as written."""
    text = (ROOT / "README.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in text.split("```sh")[1:]]
    found = [b.split("```", 1)[0].strip() for b in blocks if containing in b.split("```", 1)[0]]
    assert len(found) == 1, f"{len(found)} README blocks hold {containing!r}"
    return found[0]


def _reachable_address() -> str:
    """An address of this host other than loopback when it has one (what another host would dial)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))                  # TEST-NET-1: no packet is sent for a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return address if not address.startswith("127.") else "127.0.0.1"


def test_the_documented_curl_line_restarts_a_guard_bound_for_other_hosts(run):
    """The README's curl line, run by a shell as written (only GPU-HOST and the port are this test's),
    restarts a guard whose status endpoint is bound to 0.0.0.0 with a token of its own: 202 with the
    body the README quotes, and a relaunch with the current flags. The same line without the token, or
    with another one, is refused (curl exits 22) and nothing is relaunched; `vllm-guard restart
    --status-host` sends no token and exits 1."""
    line = _readme_block("/restart")
    assert line.startswith("curl ") and "http://GPU-HOST:8077/restart" in line
    text = (ROOT / "README.md").read_text()
    promised = json.loads(text.split("The guard answers `202` with `", 1)[1].split("`", 1)[0])
    g = run(SERVING, vllm_args=FLAGS, guard_args=["--status-host", "0.0.0.0"], token="a-token-of-my-own")
    g.wait_healthy(launches=1)
    here = line.replace("GPU-HOST:8077", f"{_reachable_address()}:{g.status_port}")

    def curl(token: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_GUARD_TOKEN"}
        if token is not None:
            env["VLLM_GUARD_TOKEN"] = token
        return subprocess.run(["bash", "-c", here], capture_output=True, text=True, timeout=30, env=env)

    assert curl(None).returncode == 22                      # no token: 401
    assert curl("not-the-token").returncode == 22           # another token: 403
    remote = cli("restart", "--status-host", _reachable_address(), "--status-port", str(g.status_port),
                 "--state-dir", str(g.state_dir / "elsewhere"), env={"VLLM_GUARD_TOKEN": g.token})
    assert remote.returncode == 1 and "the token is sent only to a running guard" in remote.stderr
    assert len(g.status()["launches"]) == 1                 # none of these relaunched anything
    ok = curl(g.token)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == promised == {"accepted": "restart", "reset": False}
    after = g.wait_healthy(launches=2)
    assert after["launches"][0]["outcome"] == "restart"
    assert argv_flag(after["launches"][1]["argv"], "--max-model-len") == "8192"     # the current flags
