"""The state dir as a trust boundary, as a class: whatever sits at any state file's name (a symbolic or
hard link to root's file, a FIFO, a socket, a directory, a device, another user's file, random bytes, an
empty file, one over the size cap), every entry point the guard and its clients use on that file answers
at once, nothing is written through it, and the guard ends with its own regular file there.

The entry points are the real ones, in the order a guard runs them (lock, token, guard.json, the orphan
sweep's launch record, history, learned flags, vLLM's output with its rotation, the launch record,
learned flags stored); the clients are what ``vllm-guard history``, ``logs``, ``status`` and ``ps`` read.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli import client
from supervisor.config import GuardConfig
from supervisor.core.session import Facts
from supervisor.shell import auth, history, learned, locks, output, procs
from supervisor.shell.signalling import Proc
from tests.fakes.planted import FOREIGN, KINDS, STATE_FILES, can_plant, plant

TOKEN_TEMP = f".token.{os.getpid()}.tmp"          # the name the token's temporary file had (predictable)
FILES = (*STATE_FILES, TOKEN_TEMP)
PLANTABLE = tuple(k for k in KINDS if not can_plant(k))
SLOW = 2.0                                       # no entry point may take longer than this


def _timed(what: str, fn, *args, **kw):
    t0 = time.monotonic()
    result = fn(*args, **kw)
    took = time.monotonic() - t0
    assert took < SLOW, f"{what} took {took:.1f} s"
    return result


def clients(d: Path) -> None:
    """What the CLI clients read; each must answer (whatever it finds) without blocking."""
    _timed("history", lambda: list(history.read(str(d))))
    _timed("logs", output.tail, str(d), 20)
    _timed("status (guard.json)", client.read_endpoint_file, str(d))
    _timed("ps (is_running)", locks.is_running, str(d))


def guard(d: Path, monkeypatch) -> None:
    """What one guard run does to its state dir, in order, with the logs rotated (small bounds)."""
    monkeypatch.setattr(output, "MAX_BYTES", 2048)
    monkeypatch.setattr(history, "MAX_BYTES", 2048)
    lock = locks.StateDirLock(str(d))
    _timed("the state-dir lock", lock.acquire)
    try:
        _timed("the token", auth.resolve_token, str(d), "", {})
        _timed("guard.json", lock.publish, status_port=1234)
        _timed("the orphan sweep", procs.sweep_orphans, str(d), 0.1)
        h = history.History(str(d), model="m", run_id="r")
        _timed("history read at start", h.last_gave_up)
        cfg = GuardConfig(model="m", vllm_args=("--max-model-len", "8192"))
        _, keys = _timed("learned flags", learned.learned_facts, cfg, Facts(), str(d))
        out = output.VllmOutput(str(d), quiet=True)
        out.launch(1, "vllm serve m")
        for i in range(60):                             # past 2048 bytes: both logs rotate
            _timed("vLLM's output", out.line, f"(APIServer pid=1) INFO line {i} {'x' * 60}".encode(), "stdout")
            h.started(i + 1, ["vllm", "serve", "m"], {})
            _timed("history", h.ended, "failed", kind="engine_dead", evidence="x" * 40)
        _timed("the launch record", procs.record_launch, str(d), Proc.live(os.getpid()), os.getpgrp())
        _timed("the launch record's tree", procs.note_tree, str(d), [])
        _timed("learned flags stored", learned.LearnedStore(str(d)).put, keys.flags, {"--max-model-len": "4096"},
               {"--max-model-len": "it fits"}, {"model": "m"})
        _timed("the launch record cleared", procs.clear_launch, str(d))
        out.close()
        h.close()
    finally:
        lock.release()


def _state_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="vg-planted-"))
    (d / "state").mkdir(mode=0o700)
    return d


def _own_regular_file(path: Path) -> str:
    try:
        st_ = os.lstat(path)
    except FileNotFoundError:
        return ""
    if not stat.S_ISREG(st_.st_mode) or st_.st_nlink != 1 or st_.st_uid != os.geteuid():
        return f"{path.name} is not the guard's own regular file after the run (mode {st_.st_mode:o}, " \
               f"{st_.st_nlink} links, uid {st_.st_uid})"
    return ""


def check(planted: dict[str, str], monkeypatch) -> None:
    base = _state_dir()
    d = base / "state"
    made = {name: plant(d / name, kind, base / "victims") for name, kind in planted.items()}
    clients(d)                                      # the planted state as found: readers answer, change nothing
    for name, p in made.items():
        if p.kind in FOREIGN:
            assert os.path.lexists(d / name), f"a reader moved the {p.kind} at {name}"
    guard(d, monkeypatch)
    clients(d)
    for p in made.values():
        assert p.untouched() == "", p.untouched()
    for name in ("guard.lock", "guard.json", "token", "learned.json", "history.jsonl", "vllm.log", "launch.json"):
        assert _own_regular_file(d / name) == "", _own_regular_file(d / name)
    assert (d / "token").read_text().strip() and stat.S_IMODE((d / "token").stat().st_mode) == 0o600
    assert client.read_endpoint_file(str(d))["status_port"] == 1234
    assert any(b"line 59" in line for line in output.tail(str(d), 5))
    assert max(r["n"] for r in history.read(str(d)) if r.get("n")) == 60
    assert learned.LearnedStore(str(d)).get(learned.learned_facts(
        GuardConfig(model="m", vllm_args=("--max-model-len", "8192")), Facts(), str(d))[1].flags) is not None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_whatever_is_planted_at_a_state_file_the_guard_serves_and_clients_answer(name, kind, monkeypatch):
    if can_plant(kind):
        pytest.skip(can_plant(kind))
    check({name: kind}, monkeypatch)


@pytest.mark.timeout(300)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(FILES), st.sampled_from(PLANTABLE), min_size=2, max_size=len(FILES)))
def test_any_mixture_of_planted_state_files_is_survived(monkeypatch, planted):
    check(planted, monkeypatch)
