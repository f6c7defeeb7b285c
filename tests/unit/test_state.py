"""supervisor.shell.statedir against real files, real flocks and real competing processes."""

from __future__ import annotations

import asyncio
import json
import os
import select
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from supervisor.shell import statedir as state
from supervisor.shell.statedir import AlreadyRunning, GpuTurnTimeout, LearnedStore, StateDirLock, StateError

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


# --- atomic writes --------------------------------------------------------------------------


def test_atomic_write_replaces_whole_with_mode_and_no_leftovers(tmp_path):
    target = tmp_path / "f.json"
    state.atomic_write(target, "old")
    state.atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_atomic_write_failure_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "f"
    state.atomic_write(target, "old")
    with pytest.raises(TypeError):
        state.atomic_write(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_readers_never_see_a_partial_write(tmp_path):
    target = tmp_path / "f"
    a, b = b"a" * 300_000, b"b" * 200_000
    state.atomic_write(target, a)
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(target.read_bytes())

    t = threading.Thread(target=reader)
    t.start()
    for i in range(100):
        state.atomic_write(target, a if i % 2 else b)
    stop.set()
    t.join()
    assert seen <= {a, b} and seen


def test_read_json_missing_is_none_and_broken_is_a_clear_error(tmp_path):
    assert state.read_json(tmp_path / "nope.json") is None
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(StateError, match="bad.json is not valid JSON"):
        state.read_json(tmp_path / "bad.json")


# --- one guard per state dir ----------------------------------------------------------------

HOLD_STATE_DIR = """
    import sys
    from supervisor.shell.statedir import StateDirLock
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
    from supervisor.shell.statedir import gpu_turn
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


# --- learned flags --------------------------------------------------------------------------


def _key(**over):
    args = dict(model="m", revision=None, gpus=[("H100", 80), ("H100", 80)], tp=2, vllm_version="0.32.0",
                user_args=["--max-model-len", "8192"])
    args.update(over)
    return state.learned_key(**args)


def test_learned_key_is_stable_and_sensitive_to_each_part():
    assert _key() == _key()
    assert _key(gpus=[("H100", 80), ("H100", 80)]) == _key(gpus=[("H100", 80), ("H100", 80)])
    variants = [_key(model="n"), _key(revision="abc"), _key(gpus=[("A100", 40)]), _key(tp=1),
                _key(vllm_version="0.31.0"), _key(user_args=[])]
    assert len({_key(), *variants}) == 1 + len(variants)
    assert _key().startswith("m@-#")


def test_learned_store_round_trip_and_drop(tmp_path):
    d = str(tmp_path / "s")
    k = _key()
    LearnedStore(d).put(k, ["--max-model-len", "4096"], {"model": "m"})
    entry = LearnedStore(d).get(k)  # a new instance reads it from disk
    assert entry["argv"] == ["--max-model-len", "4096"] and entry["meta"] == {"model": "m"}
    assert "saved_at" in entry
    assert LearnedStore(d).get(_key(tp=1)) is None
    LearnedStore(d).drop(k)
    assert LearnedStore(d).get(k) is None


@pytest.mark.parametrize("content", ["{truncated", "[1, 2]"])
def test_a_corrupt_learned_store_is_set_aside_with_a_warning(tmp_path, content):
    (tmp_path / "learned.json").write_text(content)
    warnings: list[str] = []
    store = LearnedStore(str(tmp_path), warn=warnings.append)
    assert store.get("k") is None
    aside = list(tmp_path.glob("learned.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert len(warnings) == 1 and str(aside[0]) in warnings[0]
    store.put("k", ["--enforce-eager"], {})
    assert store.get("k")["argv"] == ["--enforce-eager"]


def test_a_malformed_entry_is_ignored_with_a_warning(tmp_path):
    (tmp_path / "learned.json").write_text(json.dumps({"k": {"argv": "not a list"}}))
    warnings: list[str] = []
    assert LearnedStore(str(tmp_path), warn=warnings.append).get("k") is None
    assert warnings and "malformed" in warnings[0]


def test_measured_memory_is_kept_for_this_host_whatever_the_flags(tmp_path):
    from supervisor.config import GuardConfig
    from supervisor.core.gpus import GpuDevice
    from supervisor.core.session import Facts, Measured

    h100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", 80 << 30, 0, 80 << 30, (9, 0), ())
    facts = Facts(devices=(h100,), vllm_version="0.11.0")
    measured = Measured(6 << 30, 61 << 30, (("--max-num-seqs", None),))
    asked = GuardConfig(model="m", vllm_args=("--max-model-len", "16000"))
    _, keys = state.learned_facts(asked, facts, str(tmp_path))
    LearnedStore(str(tmp_path)).put(keys.measured, [], {"measured": measured.to_dict()})
    other_flags = GuardConfig(model="m", vllm_args=("--max-model-len", "8192"))
    found, other = state.learned_facts(other_flags, facts, str(tmp_path))
    assert other.flags != keys.flags and other.measured == keys.measured
    assert found.measured == measured and found.learned is None
    other_gpu = Facts(devices=(GpuDevice(0, "NVIDIA L4", 22 << 30, 0, 22 << 30, (8, 9), ()),), vllm_version="0.11.0")
    assert state.learned_facts(other_flags, other_gpu, str(tmp_path))[0].measured is None


@pytest.mark.parametrize("garbage", [5, {"overhead_bytes": "6"},
                                     {"overhead_bytes": -1, "weights_bytes": 0, "under": []},
                                     {"overhead_bytes": 1, "weights_bytes": 1, "under": 7}])
def test_a_malformed_measurement_is_ignored(tmp_path, garbage):
    from supervisor.config import GuardConfig
    from supervisor.core.session import Facts

    _, keys = state.learned_facts(GuardConfig(model="m"), Facts(), str(tmp_path))
    LearnedStore(str(tmp_path)).put(keys.measured, [], {"measured": garbage})
    assert state.learned_facts(GuardConfig(model="m"), Facts(), str(tmp_path))[0].measured is None


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


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\xff\xfe not utf-8", b"[1, 2, 3]", b'{"k": 5}'])
def test_corrupt_learned_flags_are_set_aside_and_the_store_works_again(tmp_path, content):
    (tmp_path / "learned.json").write_bytes(content)
    warnings: list[str] = []
    store = LearnedStore(str(tmp_path), warn=warnings.append)
    assert store.get("k") is None
    store.put("k", ["--max-model-len", "8192", "--api-key", "sk-secret-value"], {})
    entry = store.get("k")
    assert entry is not None and entry["argv"] == ["--max-model-len", "8192", "--api-key", "***"]
    assert "sk-secret-value" not in (tmp_path / "learned.json").read_text()


def test_a_directory_where_a_state_file_should_be_is_set_aside(tmp_path):
    (tmp_path / "learned.json").mkdir()
    warnings: list[str] = []
    assert LearnedStore(str(tmp_path), warn=warnings.append).get("k") is None
    assert warnings and list(tmp_path.glob("learned.json.corrupt-*"))
