"""What people read, from a real guard healing the fake vLLM: ``status`` (and ``--watch``), ``ps``,
``history``, ``logs -f`` and systemd's STATUS= line, checked line by line as a person reads them.

The guard is started as a unit would start it: ``vllm-guard serve`` with its state dir in
``$VLLM_GUARD_STATE_DIR`` (not on its command line), so ``ps`` must find it from the process table.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from guardrun import FAKE, LLAMA8B, ROOT, free_port, kill_marked

TOKEN = "a-token-people-read-with-0123"


def cli(*args: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


class Notify:
    """systemd's end of $NOTIFY_SOCKET: every datagram the guard sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                self.messages.append(self.sock.recv(65536).decode())
            except OSError:
                continue

    def statuses(self) -> list[str]:
        return [line[len("STATUS="):] for m in self.messages for line in m.splitlines() if line.startswith("STATUS=")]

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def served(tmp_path):
    """A guard run by `vllm-guard serve` with VLLM_GUARD_* variables only, and systemd listening."""
    port, status_port, state = free_port(), free_port(), tmp_path / "state"
    notify = Notify(tmp_path / "notify.sock")
    home = tmp_path / "home"
    home.mkdir()
    base = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HOME": str(home)}
    base.pop("VLLM_GUARD_STATE_DIR", None)
    base.pop("VLLM_GUARD_TOKEN", None)
    env = {**base, "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.32.0", "model": LLAMA8B, "speed": 1.0}),
           "FAKE_VLLM_STATE": str(tmp_path), "VLLM_GUARD_STATE_DIR": str(state),
           "VLLM_GUARD_STATUS_PORT": str(status_port), "VLLM_GUARD_VLLM_COMMAND": f"{sys.executable} {FAKE} serve",
           "VLLM_GUARD_TOKEN": TOKEN, "VLLM_GUARD_BACKOFF_INITIAL": "0.1", "VLLM_GUARD_HEALTH_INTERVAL": "2",
           "NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        log = open(tmp_path / f"guard-{len(procs)}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "supervisor", "serve", "fake/model", "--port", str(port)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path)))
        return procs[-1]

    # the person's shell: the state dir is found the way the guard found it, from the same variable
    person = {**base, "VLLM_GUARD_STATE_DIR": str(state)}
    yield start, person, base, state, port, status_port, notify
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    kill_marked(state)
    notify.close()


def status_lines(env: dict) -> tuple[int, dict[str, str], str]:
    out = cli("status", env=env)
    rows = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key and key not in rows:
            rows[key] = value.strip()
    return out.returncode, rows, out.stdout + out.stderr


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {last}")


def test_status_ps_history_logs_and_systemd_read_as_a_person_reads_them(served, tmp_path):
    start, person, base, state, port, status_port, notify = served
    guard = start()
    url = f"http://127.0.0.1:{port}"

    # -- while vLLM starts: the phase, the elapsed time, the URL; not listening yet is not a failure --
    seen: list[dict[str, str]] = []

    def starting_and_not_listening():
        code, rows, text = status_lines(person)
        if code == 0:
            seen.append(rows)
        return code == 0 and rows.get("state", "").startswith("starting: launch") and \
            rows.get("probe", "").startswith("vLLM not listening yet (starting, ")

    wait_for(starting_and_not_listening, 90, "status during a start-up")
    rows = seen[-1]
    assert re.fullmatch(r"starting: launch \d, [a-zA-Z ]+( \d+%)?, \d+ s", rows["state"]), rows
    assert rows["vllm"].startswith(url)
    assert all("failed" not in r.get("probe", "") and "connection attempts" not in r.get("probe", "") for r in seen)

    # -- healed: status names the last failure and that it was healed --
    def healthy():
        code, rows, _ = status_lines(person)
        return rows if code == 0 and rows.get("state", "").startswith("healthy") else None

    rows = wait_for(healthy, 120, "healthy")
    assert re.fullmatch(r"healthy: launch 2 serving for \d+s", rows["state"]), rows
    assert rows["failure"] == "launch 1 failed: kv_cache_insufficient while allocating the KV cache (healed)"
    assert rows["evidence"].startswith(
        "ValueError: To serve at least one request with the model's max seq len (131072)")
    new = re.match(r"--max-model-len \(unset\) -> (\d+)  \(", rows["flags"])
    assert new, rows["flags"]
    assert rows["launches"] == "2" and rows["probe"].startswith("ok in ")
    assert rows["context"].startswith(f"served {new.group(1)} of ")

    # -- status --watch: the same view again and again until Ctrl-C, which exits 0 --
    watch = subprocess.Popen([sys.executable, "-m", "supervisor", "status", "--watch", "0.5"], env=person,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frames: list[str] = []

    def read() -> None:                  # the view as it comes, until the third frame is drawn
        assert watch.stdout is not None
        for line in watch.stdout:
            frames.append(line)
            if sum("state      healthy: launch 2 serving for" in f for f in frames) >= 3:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)                      # three frames at 0.5 s apart: a loaded machine's start-up included
    watch.send_signal(signal.SIGINT)
    rest, err = watch.communicate(timeout=20)
    out = "".join(frames) + rest
    assert watch.returncode == 0, err
    assert out.count("state      healthy: launch 2 serving for") >= 3, out

    # -- ps: found from the process table, with no state dir given and none in the environment --
    for env in (base, person):
        out = cli("ps", env=env)
        assert out.returncode == 0, out.stderr
        head, *table = out.stdout.splitlines()
        assert head.split() == ["STATE", "DIR", "PID", "STATE", "MODEL", "VLLM", "STATUS", "GPU", "MEMORY", "NOW"]
        row = next((r for r in table if r.startswith(str(state) + " ")), None)
        assert row is not None, out.stdout
        assert f" {guard.pid} " in row and " healthy " in row and f" {url} " in row
        assert f"127.0.0.1:{status_port}" in row
        assert row.rstrip().endswith("; healed kv_cache_insufficient") and "launch 2 serving for" in row
    assert json.loads(cli("ps", "--json", env=base).stdout.splitlines()[0])["last_failure"]["healed"] is True

    # -- systemd's STATUS=: the phase while starting, then where it serves and what was healed --
    statuses = notify.statuses()
    assert any(re.fullmatch(r"starting: launch \d, [a-zA-Z ]+( \d+%)?, \d+ s; vLLM on " + re.escape(url) + ".*", s)
               for s in statuses), statuses
    assert any(s.startswith("starting: launch 1, loading weights") for s in statuses), statuses
    assert statuses[-1] == (f"healthy: launch 2 serves on {url} (context {new.group(1)}); "
                            "healed kv_cache_insufficient (launch 1)"), statuses

    # -- logs -f follows a restart's new launch --
    follow = subprocess.Popen([sys.executable, "-m", "supervisor", "logs", "-f", "-n", "0"], env=person,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(follow.stdout.readline, "")), daemon=True)
    reader.start()
    time.sleep(1.0)
    assert cli("restart", env={**person, "VLLM_GUARD_TOKEN": TOKEN}).stdout == "vllm-guard: restart requested\n"
    wait_for(lambda: (healthy() or {}).get("launches") == "3, 1 restart", 120, "the restarted launch to serve")

    def launch_3_followed() -> bool:     # logs -f reads the file every half second: wait for it, do not race it
        marks = [i for i, line in enumerate(lines) if line.startswith("=== vllm-guard: launch 3 at ")]
        return bool(marks) and any("Application startup complete." in line for line in lines[marks[0]:])

    wait_for(launch_3_followed, 20, "logs -f to print launch 3 up to its start-up line")
    follow.send_signal(signal.SIGINT)
    assert follow.wait(timeout=20) == 0
    reader.join(5)
    followed = "".join(lines)
    assert TOKEN not in followed

    assert cli("stop", env={**person, "VLLM_GUARD_TOKEN": TOKEN}).stdout == "vllm-guard: stop requested\n"
    assert guard.wait(30) == 0

    # -- a second guard run on the same state dir, stopped while it starts --
    second = start()
    wait_for(lambda: status_lines(person)[1].get("state", "").startswith("starting"), 60, "the second run")
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0

    # -- history: each guard run under its heading, each launch saying what happened, in order --
    out = cli("history", env=person)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("── guard run started ")]
    assert len(heads) == 2 and heads[0] == 0, lines
    assert lines[0].endswith(f"(pid {guard.pid}) ──") and lines[heads[1]].endswith(f"(pid {second.pid}) ──")
    first_run = [line.split("  ", 1)[1] for line in lines[1:heads[1]]]
    assert first_run[0].startswith("launch 1  failed while allocating the KV cache: kv_cache_insufficient: ValueError:")
    assert re.match(r"launch 2  healthy in \d+ s, served (\d+ min )?\d+ s, then restarted on request  "
                    rf"\[--max-model-len {new.group(1)}\]", first_run[1]), first_run[1]
    assert re.match(r"launch 3  healthy in \d+ s, served (\d+ min )?\d+ s, then stopped", first_run[2]), first_run[2]
    assert not any("restart in" in line for line in lines)
    assert any("stopped while starting" in line for line in lines[heads[1]:]), lines[heads[1]:]

    # -- nothing runs now: status says so for this dir, and for a dir no guard ever used --
    code, _, text = status_lines(person)
    assert code == 1 and text.startswith(f"vllm-guard is not running in {state} (pid {second.pid} is gone; "
                                         f"it listened on port {status_port})"), text
    empty = cli("status", "--state-dir", str(tmp_path / "nonexistent"), env=person)
    assert empty.returncode == 1 and empty.stdout == "" and \
        empty.stderr.startswith(f"no vllm-guard is running in {tmp_path / 'nonexistent'}")
    out = cli("ps", env=person)
    assert any(r.startswith(str(state) + " ") and " stopped " in r for r in out.stdout.splitlines()), out.stdout
