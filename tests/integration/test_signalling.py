"""Every signal goes to a verified process: real processes, real pid reuse, real stopped processes.

A process is made to take a reaped process's pid for real (tests/fakes/pid_reuse.py: clone3 with
set_tid, or ns_last_pid); it logs every catchable signal it gets, so "no signal" is read from it.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor.shell import procs, signalling
from supervisor.shell.child import Child
from supervisor.shell.signalling import Proc

ROOT = Path(__file__).resolve().parents[2]
FORKER = str(ROOT / "tests" / "fakes" / "forker.py")
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
import pid_reuse  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")


def read_line(stream, timeout: float = 15.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        pytest.fail(f"no output within {timeout}s")
    return stream.readline().strip()


def unmarked_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != procs.MARKER}


def state_of(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def gone(pid: int) -> bool:
    return state_of(pid) in ("gone", psutil.STATUS_ZOMBIE)


class Lines:
    """A launch's output lines, and a wait for the one that starts with ``prefix``."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.got = asyncio.Event()

    def __call__(self, lines: list[bytes], stream: str) -> None:
        self.lines.extend(lines)
        self.got.set()

    async def pids(self, timeout: float = 15.0) -> list[int]:
        async def find() -> list[int]:
            while True:
                for line in self.lines:
                    if line.startswith(b"pids "):
                        return [int(x) for x in line.split()[1:]]
                self.got.clear()
                await self.got.wait()
        return await asyncio.wait_for(find(), timeout)



@pytest.fixture
def impostors(tmp_path_factory):
    """``take(pid)``: an unrelated process (unmarked, its own session) now holds ``pid``."""
    with pid_reuse.impostors(tmp_path_factory.mktemp("pid_at"), env=unmarked_env()) as take_pid:
        def take(pid: int) -> pid_reuse.Impostor:
            try:
                return take_pid(pid)
            except pid_reuse.Unavailable as e:
                pytest.skip(str(e))

        yield take


@pytest.fixture
def reaper():
    """Orphans are reparented to the test, which reaps them: their pids are free to take again."""
    try:
        with pid_reuse.subreaper():
            yield
    except pid_reuse.Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def started():
    """Pids a test starts; whatever still runs at the end is SIGKILLed (by the test, as cleanup)."""
    pids: list[Proc] = []
    yield pids
    for p in pids:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            try:
                os.waitpid(p.pid, 0)
            except ChildProcessError:
                pass             # not ours to reap


# --- identity --------------------------------------------------------------------------------


def test_a_process_is_the_same_only_with_the_same_start(way):
    me = Proc.live(os.getpid())
    assert me is not None and me.is_alive()
    assert Proc.recorded(me.pid, me.start, me.boot) == me
    assert Proc.recorded(me.pid, me.start + 0.01) is None     # one clock tick later: another process
    assert Proc.recorded(me.pid, me.start, "another-boot") is None
    for bad in [("1", me.start), (me.pid, "x"), (True, me.start), (me.pid, None), (None, None)]:
        assert Proc.recorded(*bad) is None


def test_a_reaped_process_whose_pid_was_taken_is_never_signalled(way, impostors):
    p = subprocess.Popen([sys.executable, FORKER], stdout=subprocess.PIPE, text=True, process_group=0)
    read_line(p.stdout)
    old = Proc.live(p.pid)
    p.kill()
    p.wait()
    imp = impostors(old.pid)
    assert imp.pgid() == old.pid, "the impostor leads a group with the stale group id"
    now = Proc.live(old.pid)
    assert now is not None and now != old

    assert signalling.snapshot_tree(old) == []           # not whatever owns the pid now
    assert signalling.lost([old]) == [old.pid]
    assert not old.is_alive()
    assert signalling.send(old, signal.SIGTERM) is False
    assert signalling.send_group(old.pid, signal.SIGTERM, old) is False
    assert signalling.end([old], old.pid, grace=0.5) == []
    assert imp.signals() == [] and imp.alive()


def test_the_guards_stop_never_signals_what_took_the_reaped_launchs_pids(way, impostors, reaper, tmp_path):
    state = str(tmp_path / "state")

    async def main():
        out = Lines()
        child = Child([sys.executable, FORKER, "--engine"], procs.child_env(unmarked_env(), state, 1), out,
                      state_dir=state)
        await child.start()
        leader, engine = await out.pids()
        child.remember_tree()                 # as the watcher does once healthy
        assert set(child.tree) == {leader, engine}
        # The whole launch dies (as after the OOM killer) and is reaped: its pids are free again.
        os.kill(engine, signal.SIGKILL)
        os.kill(leader, signal.SIGKILL)
        await child.wait()
        pid_reuse.reap(engine)
        took = [impostors(leader), impostors(engine)]
        assert took[0].pgid() == leader
        t0 = time.monotonic()
        await child.stop(grace=5.0)
        return took, time.monotonic() - t0

    took, elapsed = asyncio.run(main())
    for imp in took:
        assert imp.signals() == [], f"pid {imp.pid} (not ours any more) got signals {imp.signals()}"
        assert imp.alive()
    assert elapsed < 5.0, "nothing of ours was left to wait for"


def test_the_orphan_sweep_never_signals_what_took_a_recorded_pid(way, impostors, reaper, tmp_path, started):
    state = str(tmp_path / "state")
    env = procs.child_env(unmarked_env(), state, 1)
    p = subprocess.Popen([sys.executable, FORKER, "--engine"], env=env, stdout=subprocess.PIPE, text=True,
                         process_group=0)
    leader, engine = (int(x) for x in read_line(p.stdout).split()[1:])
    root = Proc.live(leader)
    procs.record_launch(state, root, leader)
    procs.note_tree(state, signalling.snapshot_tree(root))
    # One engine of that launch outlives it, in a group of its own (as the guard found it).
    left = subprocess.Popen([sys.executable, FORKER, "--role", "engine"], env=env, stdout=subprocess.PIPE,
                            text=True, process_group=0)
    assert read_line(left.stdout) == "ready"
    started.append(Proc.live(left.pid))
    os.kill(engine, signal.SIGKILL)
    p.kill()
    p.wait()
    pid_reuse.reap(engine)
    took = [impostors(leader), impostors(engine)]

    ended = procs.sweep_orphans(state, grace=2.0)

    assert [e["pid"] for e in ended] == [left.pid]
    left.wait(timeout=10)
    for imp in took:
        assert imp.signals() == [] and imp.alive(), f"pid {imp.pid} got {imp.signals()}"


TREE = r"""
import os, subprocess, sys
marked = subprocess.Popen([sys.executable, sys.argv[1], "--role", "engine"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
env = {k: v for k, v in os.environ.items() if k != "VLLMGUARD_LAUNCH"}
stranger = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[3]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
assert marked.stdout.readline().strip() == "ready" and stranger.stdout.readline().strip() == "ready"
print("pids", os.getpid(), marked.pid, stranger.pid, flush=True)
import signal
while True:
    signal.pause()
"""


def test_a_group_whose_leader_is_gone_is_ended_only_through_verified_members(way, reaper, tmp_path, started):
    # The leader dies; two members of its group remain: one carries the launch marker, one does not
    # (and is not recorded). Without a live leader the group id proves nothing, so no killpg: the
    # marked member is ended by itself, the unverified one is left untouched.
    state = str(tmp_path / "state")
    log = tmp_path / "stranger-signals"

    async def main():
        out = Lines()
        child = Child([sys.executable, "-c", TREE, FORKER, pid_reuse.IMPOSTOR, str(log)],
                      procs.child_env(unmarked_env(), state, 1), out, state_dir=state)
        await child.start()
        leader, marked, stranger = await out.pids()
        started.extend([Proc.live(marked), Proc.live(stranger)])
        assert os.getpgid(marked) == os.getpgid(stranger) == leader, out.lines
        os.kill(leader, signal.SIGKILL)
        await child.wait()
        await child.stop(grace=5.0)
        return marked, stranger

    marked, stranger = asyncio.run(main())
    pid_reuse.reap(marked)
    assert gone(marked)
    assert not gone(stranger) and not log.exists(), "an unverified member was signalled"


def test_the_leaders_exit_is_seen_while_an_orphan_still_holds_its_pipes(reaper, tmp_path):
    # vLLM's engine inherits the API server's stdout and stderr; when the API server dies first, the
    # pipes stay open. The exit must still be seen (asyncio's Process.wait() alone waits for the pipes).
    state = str(tmp_path / "state")

    async def main():
        out = Lines()
        child = Child([sys.executable, FORKER, "--engine"], procs.child_env(unmarked_env(), state, 1), out,
                      state_dir=state)
        await child.start()
        leader, engine = await out.pids()
        os.kill(leader, signal.SIGKILL)
        code = await asyncio.wait_for(child.wait(), 10)
        assert not gone(engine), "the orphan engine still runs, holding the pipes"
        await child.stop(grace=5.0)
        return code, engine

    code, engine = asyncio.run(main())
    assert code == -signal.SIGKILL
    assert gone(engine)


# --- stopped processes -----------------------------------------------------------------------


def test_a_stopped_process_is_killed_at_once_not_after_the_grace(way, started):
    p = subprocess.Popen([sys.executable, FORKER], stdout=subprocess.PIPE, text=True, process_group=0)
    read_line(p.stdout)
    started.append(Proc.live(p.pid))
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while state_of(p.pid) != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "SIGSTOP did not take"
        time.sleep(0.01)
    t0 = time.monotonic()
    ended = signalling.end([Proc.live(p.pid)], p.pid, grace=60.0)
    assert ended == [p.pid]
    assert time.monotonic() - t0 < 5.0
    assert gone(p.pid)


def test_a_process_stopped_during_the_grace_is_killed_then(way, started):
    p = subprocess.Popen([sys.executable, FORKER, "--ignore-term"], stdout=subprocess.PIPE, text=True,
                         process_group=0)
    read_line(p.stdout)
    proc = Proc.live(p.pid)
    started.append(proc)
    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.append(signalling.end([proc], p.pid, grace=60.0)))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)          # the SIGTERM was ignored; now it hangs for good
    os.kill(p.pid, signal.SIGSTOP)
    t.join(timeout=20)
    assert result == [[p.pid]]
    assert time.monotonic() - t0 < 10.0


def test_a_sigstopped_vllm_is_killed_at_once_and_relaunched(run):
    # A hang by SIGSTOP: the probes fail, the guard stops the launch; a stopped API server cannot act
    # on SIGTERM, so it gets SIGKILL without the 30 s grace, and the relaunch follows within seconds.
    g = run(guard_args=["--stop-grace", "30"])
    s = g.wait_healthy(launches=1)
    pid = s["pid"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    g.wait_for(lambda s: len(s["launches"]) == 2 and s["state"] == "healthy", 60, "the relaunch")
    took = time.monotonic() - t0
    assert gone(pid)
    # 2 failed probes (0.3 s apart, 2 s timeout each), the stop, a backoff of 0.1 s, a fake start-up.
    assert took < 20.0, f"{took:.1f} s: the stopped process was given the grace"
    assert g.terminate() == 0
