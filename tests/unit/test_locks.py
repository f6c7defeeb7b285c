"""supervisor.shell.locks against real flocks and real competing processes: one guard per state dir,
one vLLM start-up at a time per GPU."""

from __future__ import annotations

import asyncio
import json
import os
import select
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from supervisor.errors import AlreadyRunning
from supervisor.shell import locks as state
from supervisor.shell.locks import GpuTurnTimeout, StateDirLock

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw,
    )


def read_line(p: subprocess.Popen, timeout: float = 15.0) -> str:
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, f"no output from pid {p.pid} within {timeout}s"
    return p.stdout.readline().strip()


def wait_until(pred, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


@pytest.fixture
def gpu_key():
    key = f"test-{uuid.uuid4().hex[:12]}"
    yield key
    for p in state.gpu_lock_dir().glob(f"gpu-{key}*"):
        p.unlink(missing_ok=True)


# --- one guard per state dir ----------------------------------------------------------------

HOLD_STATE_DIR = """
    import sys
    from supervisor.shell.locks import StateDirLock
    lock = StateDirLock(sys.argv[1])
    lock.acquire()
    lock.publish(status_port=8077)
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_second_guard_on_a_state_dir_is_refused_naming_the_first(tmp_path):
    d = tmp_path / "state"
    first = python(HOLD_STATE_DIR, str(d))
    try:
        assert read_line(first) == "locked"
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        with pytest.raises(AlreadyRunning) as err:
            StateDirLock(str(d)).acquire()
        assert err.value.holder["pid"] == first.pid
        assert err.value.holder["status_port"] == 8077
        assert f"pid {first.pid}" in str(err.value) and "status port 8077" in str(err.value)
        assert str(d) in str(err.value)
    finally:
        first.kill()
        first.wait()
    # The kernel dropped the dead guard's lock: the next guard starts.
    with StateDirLock(str(d)) as lock:
        assert json.loads((d / "guard.lock").read_text())["pid"] == os.getpid()
        lock.publish(status_port=9000)
        assert json.loads((d / "guard.json").read_text())["status_port"] == 9000
    assert json.loads((d / "guard.json").read_text())["status_port"] == 9000   # kept: clients name the port it used


# --- GPU turns ------------------------------------------------------------------------------

TAKE_TURN = """
    import json, sys, time
    from pathlib import Path
    from supervisor.shell.locks import gpu_turn
    key, log, name, release = sys.argv[1:5]
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"who": name, "event": event, "t": time.monotonic()}) + "\\n")
    note("waiting")
    with gpu_turn(key, timeout=60, poll=0.02):
        note("acquired")
        while not Path(release).exists():   # hold the turn until the test says so
            time.sleep(0.02)
        note("released")
"""


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_two_launches_on_one_gpu_take_turns(tmp_path, gpu_key):
    log = tmp_path / "log"
    go = {n: tmp_path / f"release-{n}" for n in "AB"}
    ps = {n: python(TAKE_TURN, gpu_key, str(log), n, str(go[n])) for n in "AB"}
    try:
        first = wait_until(lambda: [e for e in _events(log) if e["event"] == "acquired"], what="a first turn")[0]["who"]
        second = "B" if first == "A" else "A"
        wait_until(lambda: any(e["who"] == second and e["event"] == "waiting" for e in _events(log)), what="waiting")
        go[first].touch()
        assert ps[first].wait(timeout=15) == 0
        go[second].touch()
        assert ps[second].wait(timeout=15) == 0
    finally:
        for p in ps.values():
            p.kill()
            p.wait()
    t = {(e["who"], e["event"]): e["t"] for e in _events(log)}
    # The second holder got the turn only after the first gave it back.
    assert t[(first, "acquired")] < t[(first, "released")] <= t[(second, "acquired")]


def test_gpu_turn_times_out_naming_the_holder(gpu_key):
    with state.gpu_turn(gpu_key, timeout=5):
        t0 = time.monotonic()
        with pytest.raises(GpuTurnTimeout) as err:  # a second descriptor conflicts even in-process
            with state.gpu_turn(gpu_key, timeout=0.3, poll=0.05):
                pass
        assert time.monotonic() - t0 >= 0.3
        assert err.value.holder["pid"] == os.getpid()
        assert f"pid {os.getpid()}" in str(err.value)
    with state.gpu_turn(gpu_key, timeout=0.1):  # released on exit
        pass


def test_a_turn_on_several_gpus_conflicts_with_any_of_them(gpu_key):
    with state.gpu_turn(f"{gpu_key}-1", timeout=1):
        with pytest.raises(GpuTurnTimeout):
            with state.gpu_turn(f"{gpu_key}-0,{gpu_key}-1", timeout=0.2, poll=0.05):
                pass
        with state.gpu_turn(f"{gpu_key}-0", timeout=0.2):  # the partly taken turn was given back
            pass


def test_async_gpu_turn_waits_without_blocking_the_loop(gpu_key):
    async def main():
        ticks = 0
        order = []

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async def other():
            async with state.gpu_turn_async(gpu_key, timeout=10, poll=0.02):
                order.append("other acquired")

        t = asyncio.create_task(ticker())
        with state.gpu_turn(gpu_key, timeout=1):
            waiter = asyncio.create_task(other())
            while ticks < 20:  # the loop keeps running while `other` waits for the turn
                await asyncio.sleep(0.01)
            assert not waiter.done()
            order.append("first released")
        await asyncio.wait_for(waiter, 10)
        t.cancel()
        return order

    assert asyncio.run(main()) == ["first released", "other acquired"]



def test_gpu_lock_dir_is_shared_and_writable():
    d = state.gpu_lock_dir()
    assert d.name in ("vllm-guard", "vllm-guard-locks")
    assert os.access(d, os.W_OK) and stat.S_IMODE(d.stat().st_mode) & 0o1000


def test_the_turn_times_out_as_tempfail_releases_early_and_ends_at_once_on_stop(gpu_key):
    from supervisor.errors import Refused
    from supervisor.shell.gpus import Gpus

    waits: list[str] = []

    async def held_elsewhere():
        gpus = Gpus(None, {}, "/nonexistent", gpu_key, (), asyncio.Event())
        async with state.gpu_turn_async(gpu_key, timeout=1, on_wait=lambda: waits.append("mine")):
            with pytest.raises(Refused) as e:
                async with gpus.turn(0.4):
                    pytest.fail("the turn was taken twice")
            assert e.value.exit_code == 75 and "still held by" in str(e.value)

    async def stop_while_waiting():
        stop = asyncio.Event()
        gpus = Gpus(None, {}, "/nonexistent", gpu_key, (), stop)
        async with state.gpu_turn_async(gpu_key, timeout=5):
            asyncio.get_running_loop().call_later(0.2, stop.set)
            t0 = time.monotonic()
            async with gpus.turn(1800) as ours:
                assert ours is False                      # no turn: the guard stops instead
            assert time.monotonic() - t0 < 2              # at once, not at the 1800 s deadline

    async def ours_then_released_early():
        gpus = Gpus(None, {}, "/nonexistent", gpu_key, (), asyncio.Event())
        async with gpus.turn(5) as ours:
            assert ours is True
            gpus.release_turn()                   # healthy: the next guard may start now
            async with state.gpu_turn_async(gpu_key, timeout=0.5):
                waits.append("next guard went ahead")

    asyncio.run(held_elsewhere())
    asyncio.run(stop_while_waiting())
    asyncio.run(ours_then_released_early())
    assert waits == ["next guard went ahead"]        # the first turn was free: no wait was announced


def test_a_symlink_planted_at_a_gpu_lock_is_never_followed(tmp_path, gpu_key):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    planted = state.gpu_lock_dir() / state._lock_name(gpu_key)
    planted.symlink_to(victim)
    try:
        with state.gpu_turn(gpu_key, timeout=1):
            pass                                  # the turn is taken on a private lock instead
        assert victim.read_text() == "root's file\n"
    finally:
        planted.unlink()


def test_a_shared_lock_dir_that_is_not_sticky_or_not_trusted_is_not_used(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)                            # world-writable, not sticky: anyone may swap files
    assert not state._shared_dir_ok(loose)
    loose.chmod(0o1777)
    assert state._shared_dir_ok(loose)


@pytest.mark.parametrize("kind", ["fifo", "hardlink", "directory"])
def test_a_gpu_lock_that_is_not_a_plain_file_is_never_used(gpu_key, kind):
    from tests.fakes.planted import plant

    victims = state.gpu_lock_dir() / f"victims-{gpu_key}"       # a hard link needs the same file system
    planted = plant(state.gpu_lock_dir() / state._lock_name(gpu_key), kind, victims)
    try:
        t0 = time.monotonic()
        with state.gpu_turn(gpu_key, timeout=1):
            pass                                  # the turn is taken on a private lock instead, at once
        assert time.monotonic() - t0 < 2
        assert planted.untouched() == ""
    finally:
        if planted.path.is_dir() and not planted.path.is_symlink():
            for p in planted.path.iterdir():
                p.unlink()
            planted.path.rmdir()
        else:
            planted.path.unlink()
        for p in victims.iterdir():
            p.unlink()
        victims.rmdir()


def test_is_running_never_blocks_on_a_planted_lock_file(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    os.mkfifo(d / "guard.lock")
    t0 = time.monotonic()
    assert state.is_running(str(d)) is False
    assert time.monotonic() - t0 < 1
    with StateDirLock(str(d)):                    # the guard sets the FIFO aside and locks a file of its own
        assert state.is_running(str(d)) is True
        assert stat.S_ISREG(os.lstat(d / "guard.lock").st_mode)
    assert list(d.glob("guard.lock.corrupt-*"))
