"""The disk as a trust boundary and as a thing that fails, against a real guard and the fake vLLM.

* Whatever is planted at the state files (every kind at every name, and hypothesis mixtures), the guard
  serves within a bounded time, writes nothing through what was planted, ends with its own files, and
  ``logs``, ``history``, ``status`` and ``ps`` answer while it runs.
* A real small tmpfs filled up during a run: restart and stop still signal vLLM, supervision and the
  status endpoint go on from memory, nothing is left running, the exit is truthful (0 on a stop; 75, not
  78, when the state dir's lock cannot even be made).
* On the journal, every line of vLLM's the guard passes through carries the guard's priority.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guardrun import FAKE, LLAMA8B, ROOT, GuardRun, marked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(ROOT))
from tests.fakes.planted import KINDS, STATE_FILES, can_plant, plant  # noqa: E402

SCENARIO = {"version": "0.32.0", "model": LLAMA8B}
ARGS = ["--max-model-len", "8192"]


def cli(*args: str, env: dict | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """A client command; a hang is a failure (TimeoutExpired), not a stuck test."""
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, encoding="utf-8",
                          errors="replace", timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _last_pid() -> int:
    try:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except (OSError, ValueError):
        return os.getpid()


def _plant_all(state: Path, victims: Path, kinds: dict[str, str]) -> list:
    state.mkdir(mode=0o700)
    made = [plant(state / name, kind, victims) for name, kind in kinds.items()]
    # The token's temporary file was .token.<guard pid>.tmp: links at the names the next pids would get.
    base = _last_pid()
    for pid in range(base + 1, base + 300):
        (state / f".token.{pid}.tmp").symlink_to(victims / "victim-token-temp")
    (victims / "victim-token-temp").write_text("root's precious token temp\n")
    return made


def _clients_answer(g: GuardRun) -> None:
    where = ["--state-dir", str(g.state_dir)]
    for args in (["logs", "-n", "5", *where], ["history", *where], ["history", "--json", *where],
                 ["status", "--json", *where], ["ps", "--json", *where]):
        t0 = time.monotonic()
        out = cli(*args, env={"VLLM_GUARD_TOKEN": g.token})
        assert time.monotonic() - t0 < 15, f"vllm-guard {' '.join(args)} took too long"
        assert out.returncode == 0, f"vllm-guard {' '.join(args)}: {out.returncode} {out.stderr[-2000:]}"
        assert "Traceback" not in out.stderr


def _serves_through(run, tmp_path: Path, kinds: dict[str, str]) -> None:
    state, victims = tmp_path / "state", tmp_path / "victims"
    made = _plant_all(state, victims, kinds)
    g = run(SCENARIO, vllm_args=ARGS, state_dir=state, env={"VLLM_GUARD_TOKEN": ""})   # it writes its own token
    t0 = time.monotonic()
    g.wait_for(lambda s: s["state"] == "healthy", 60, "healthy")
    assert time.monotonic() - t0 < 60
    assert g.chat().status_code == 200
    g.token = (state / "token").read_text().strip()
    _clients_answer(g)
    assert g.terminate() == 0
    assert marked(state) == []
    for p in made:
        assert p.untouched() == "", p.untouched()
    assert (victims / "victim-token-temp").read_text() == "root's precious token temp\n"
    for name in ("guard.lock", "guard.json", "token", "history.jsonl", "vllm.log"):
        st_ = os.lstat(state / name)
        assert stat.S_ISREG(st_.st_mode) and st_.st_nlink == 1 and st_.st_uid == os.geteuid(), name
    assert not os.path.lexists(state / "launch.json")          # cleared after the last launch
    out = cli("logs", "-n", "400", "--state-dir", str(state))
    assert out.returncode == 0 and "=== vllm-guard: launch 1" in out.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", KINDS)
def test_whatever_sits_at_every_state_file_the_guard_serves_and_clients_answer(run, tmp_path, kind):
    if can_plant(kind):
        pytest.skip(can_plant(kind))
    _serves_through(run, tmp_path, {name: kind for name in STATE_FILES})


@pytest.mark.timeout(600)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.dictionaries(st.sampled_from(STATE_FILES), st.sampled_from([k for k in KINDS if not can_plant(k)]),
                             min_size=3, max_size=len(STATE_FILES)))
def test_any_mixture_of_planted_state_files_is_served_through(run, tmp_path_factory, kinds):
    _serves_through(run, tmp_path_factory.mktemp("mix"), kinds)


# -- a disk that fails -------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real small tmpfs for the state dir (mounting needs root; skipped, saying so, where it cannot)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()

    def mount(options: str) -> Path:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        return mnt
    yield mount
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == 28          # ENOSPC
    finally:
        os.close(fd)


@pytest.mark.timeout(240)
def test_a_disk_that_fills_during_a_run_never_ends_supervision(run, small_disk):
    disk = small_disk("size=2m,mode=0700")
    state = disk / "state"
    g = run(SCENARIO, vllm_args=ARGS, state_dir=state)
    g.wait_healthy(launches=1)
    _fill(disk)
    assert g.post("/restart", token=g.token).status_code == 202          # record_launch fails: not a 78
    s = g.wait_healthy(launches=2)
    assert s["launches"][0]["outcome"] == "restart"
    assert g.chat().status_code == 200
    assert len(marked(state)) >= 1
    assert g.post("/restart", token=g.token).status_code == 202
    g.wait_healthy(launches=3)                                            # and again: it goes on from memory
    out = cli("status", "--json", "--state-dir", str(state), env={"VLLM_GUARD_TOKEN": g.token})
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "healthy"
    assert g.terminate() == 0                                             # the stop signals first
    assert marked(state) == []                                            # nothing left running
    log = g.output()
    assert not any(line.startswith("Traceback") for line in log.splitlines()), log[-3000:]   # none of the guard's
    assert "internal error" not in log
    # A fault is said once per file and failing episode, not per line: the few bytes a removed launch.json
    # frees let the next small record through, so that file may fail again once per launch, no more.
    assert 1 <= log.count(f"cannot write {state / 'vllm.log'} ") <= 2
    assert log.count(f"cannot write {state / 'launch.json'} ") <= 3
    assert "configuration error" not in log


@pytest.mark.timeout(180)
def test_a_full_disk_from_the_start_still_serves_from_memory(run, small_disk):
    disk = small_disk("size=1m,mode=0700")
    state = disk / "state"
    state.mkdir(mode=0o700)
    _fill(disk)
    g = run(SCENARIO, vllm_args=ARGS, state_dir=state)
    g.wait_healthy(launches=1)
    assert g.chat().status_code == 200
    assert g.terminate() == 0
    assert marked(state) == []
    assert not any(line.startswith("Traceback") for line in g.output().splitlines())


@pytest.mark.timeout(120)
def test_a_state_dir_whose_lock_cannot_be_made_is_a_tempfail_not_a_config_error(run, small_disk):
    disk = small_disk("size=1m,nr_inodes=16,mode=0700")
    state = disk / "state"
    state.mkdir(mode=0o700)
    n = 0
    while True:                                         # use up every inode: no file can be made
        try:
            (disk / f"inode-{n}").touch()
        except OSError as e:
            assert e.errno == 28
            break
        n += 1
    g = run(SCENARIO, vllm_args=ARGS, state_dir=state)
    assert g.wait_exit(60) == 75
    assert "No space left on device" in g.output() and marked(state) == []


# -- the journal -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_on_the_journal_every_vllm_line_carries_the_guards_priority(tmp_path):
    wrapper = tmp_path / "vllm-says-emerg"
    wrapper.write_text(f"#!/bin/sh\necho '<0>emerg from vLLM stdout'\necho '<1>alert from vLLM stderr' >&2\n"
                       f"exec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    g = GuardRun(tmp_path, SCENARIO, vllm_args=ARGS, vllm_command=f"{wrapper} serve")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)     # journald's stream socket
    st_ = os.fstat(theirs.fileno())
    env = {**g.env, "JOURNAL_STREAM": f"{st_.st_dev}:{st_.st_ino}"}
    proc = subprocess.Popen(g.argv, env=env, stdout=theirs, stderr=theirs, cwd=str(ROOT))
    theirs.close()
    g.proc = proc
    received = bytearray()
    ours.settimeout(0.2)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and b"Application startup complete" not in received:
            try:
                received += ours.recv(1 << 16)
            except TimeoutError:
                pass
        g.wait_healthy(launches=1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        while chunk := ours.recv(1 << 16):
            received += chunk
    except TimeoutError:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        g.close()
        ours.close()
    lines = bytes(received).splitlines()
    assert b"<6><0>emerg from vLLM stdout" in lines and b"<6><1>alert from vLLM stderr" in lines
    assert all(line[:1] == b"<" and line[1:2] in b"01234567" and line[2:3] == b">" for line in lines if line), \
        [line for line in lines if line[:1] != b"<"][:5]
    assert not any(line.startswith((b"<0>", b"<1>", b"<2>")) for line in lines), "vLLM's text set a priority"
