"""`vllm-guard start` against the real CPU build of vLLM 0.32 and a tiny random Llama.

Figures these tests rest on (observed, see tests/fixtures/logs/real-0.32/README.md): with
VLLM_CPU_KVCACHE_SPACE=1 the tiny model's default context (131072) needs 2.0 GiB of KV cache, and
vLLM fails with "the estimated maximum model length is 65408"; at 65408 it serves in about 25 s
on 2 cores. Killing VLLM::EngineCore makes the API server exit 0 within 2 s. SIGKILL of the API
server leaves VLLM::EngineCore and VLLM::Worker running, in its process group.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from realguard import GuardProc, Tracker, alive, guard_exe, is_api_server, is_vllm_proc

# Each test may include the one-time venv set-up (minutes on a fresh machine); waits inside have
# their own deadlines, sized for 2 busy cores.
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(1500)]

LAUNCH_S = 180          # one vLLM start-up or failure, with margin (observed 22-33 s)
BLOCK = 128             # the CPU backend's KV block size


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _engine_cores(g: GuardProc) -> list[psutil.Process]:
    return [p for p in g.vllm_descendants() if is_vllm_proc(p) and "EngineCore" in _title(p)]


def _title(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd and cmd[0].startswith("VLLM::") else p.name()
    except psutil.Error:
        return ""


def _gone_within(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of ``procs`` still alive (not zombies) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    left = [p for p in procs if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


def _describe(procs: list[psutil.Process]) -> str:
    return ", ".join(f"{p.pid} {_title(p)!r}" for p in procs)


def _assert_chat(g: GuardProc) -> None:
    r = g.chat()
    assert r.status_code == 200, f"chat completion through vLLM: {r.status_code} {r.text[:500]}"
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant", body
    assert body["usage"]["completion_tokens"] == 1, body


# --------------------------------------------------------------------------------------------
# One guard with --no-plan: the real KV failure, healed; then an engine kill; then SIGTERM.
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def noplan(start_guard, tmp_path_factory) -> GuardProc:
    state = tmp_path_factory.mktemp("state-noplan")
    return start_guard(state, ["--enforce-eager"], extra=["--no-plan", "--health-interval", "2"])


def test_kv_cache_failure_is_healed_in_one_relaunch(noplan: GuardProc) -> None:
    s = noplan.wait_healthy(2, timeout=2 * LAUNCH_S)
    first, second = s["launches"]
    assert first["outcome"] == "failed", first
    assert first["kind"] == "kv_cache_insufficient", first
    assert _flag(first["argv"], "--max-model-len") is None, first["argv"]
    # The estimate vLLM itself printed, read from the evidence the guard kept.
    m = re.search(r"estimated maximum model length is (\d+)", first["evidence"] or "")
    assert m, f"the launch record lacks vLLM's estimate: {first['evidence']!r}"
    estimate = int(m.group(1))
    chosen = _flag(second["argv"], "--max-model-len")
    assert chosen is not None, second["argv"]
    assert abs(int(chosen) - estimate) <= BLOCK, (chosen, estimate)
    assert second["outcome"] == "healthy", second
    # One line for the one relaunch, naming the changed flag.
    out = noplan.output()
    relaunch_lines = [ln for ln in out.splitlines() if re.search(r"\brelaunch\b", ln, re.I)]
    assert len(relaunch_lines) == 1, relaunch_lines
    assert "--max-model-len" in relaunch_lines[0] and chosen in relaunch_lines[0], relaunch_lines[0]
    _assert_chat(noplan)


def test_diagnose_reads_the_kept_output_of_both_launches_for_the_last(noplan: GuardProc) -> None:
    """The guard's kept output holds both launches (the real KV cache failure, then the healed one): diagnose
    reads it for the last, serving, and says what the one before ended in."""
    noplan.wait_healthy(2, timeout=2 * LAUNCH_S)
    done = subprocess.run([guard_exe(), "diagnose", str(noplan.state_dir / "vllm.log")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, detail = done.stdout.splitlines()[:2]
    assert first.endswith(": healthy"), done.stdout
    assert "The last of 2 launches in the log; the one before: kv_cache_insufficient." in detail, done.stdout


def test_the_status_shows_the_kv_capacity_vllm_measured(noplan: GuardProc) -> None:
    s = noplan.wait_healthy(2, timeout=2 * LAUNCH_S)
    # What vLLM printed, from the guard's own copy of its output ("CPU KV cache size: 65,536 tokens").
    printed = re.findall(r"KV cache size: ([\d,]+) tokens", (noplan.state_dir / "vllm.log").read_text())
    assert printed, "vLLM's KV cache size line is not in the kept output"
    tokens = int(printed[-1].replace(",", ""))
    served = int(_flag(s["launches"][1]["argv"], "--max-model-len") or 0)
    assert s["launches"][1]["measured"]["kv_cache_tokens"] == tokens, s["launches"][1]["measured"]
    # vLLM 0.32 holds one block back (its null block): the longest context that fits is one block less.
    assert s["context"]["fit"] == tokens - BLOCK and s["context"]["served"] == served, s["context"]
    # the model's own context (131072) was asked for: the cut is named
    assert s["context"]["text"] == f"context served {served} of {tokens - BLOCK} that fit (131072 asked)", s["context"]


def test_killed_engine_core_is_relaunched_with_the_same_flags(noplan: GuardProc) -> None:
    s = noplan.wait_healthy(2, timeout=2 * LAUNCH_S)
    old_api = s["pid"]
    engines = _engine_cores(noplan)
    assert len(engines) == 1, f"expected one VLLM::EngineCore under the guard: {_describe(engines)}"
    engines[0].kill()
    s = noplan.wait_healthy(3, timeout=LAUNCH_S + 60)
    died, again = s["launches"][1], s["launches"][2]
    assert died["outcome"] == "died" and died["kind"] == "engine_dead", died
    assert again["argv"] == died["argv"], (again["argv"], died["argv"])
    assert again["outcome"] == "healthy", again
    assert s["pid"] != old_api
    assert not [r for r in s["launches"][1:] if r["outcome"] == "failed"], s["launches"]
    _assert_chat(noplan)


def test_sigterm_to_the_guard_leaves_no_vllm_process(noplan: GuardProc, tracker: Tracker) -> None:
    noplan.wait("healthy", lambda s: s.get("state") == "healthy", timeout=2 * LAUNCH_S)
    tree = noplan.vllm_descendants()
    assert any(is_api_server(p) for p in tree) and any(is_vllm_proc(p) for p in tree), _describe(tree)
    noplan.signal(signal.SIGTERM)
    assert noplan.wait_exit(90) == 0
    left = _gone_within(tree, 3.0)
    assert not left, f"left behind after SIGTERM: {_describe(left)}"
    stray = _gone_within(tracker.living_vllm(), 3.0)
    assert not stray, f"vLLM processes of this session still alive: {_describe(stray)}"


# --------------------------------------------------------------------------------------------
# With the plan: the first launch serves; a SIGKILLed guard's orphans are ended by the next
# guard on the same state dir, which serves in one launch from the flags it learned.
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_state(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("state-plan")


@pytest.fixture(scope="module")
def planned(start_guard, plan_state: Path) -> GuardProc:
    return start_guard(plan_state, ["--enforce-eager"], extra=["--health-interval", "2"])


def test_planned_first_launch_serves(planned: GuardProc) -> None:
    s = planned.wait_healthy(1, timeout=LAUNCH_S)
    assert [r["outcome"] for r in s["launches"]] == ["healthy"], s["launches"]
    assert s["flags_source"] == "plan", s.get("flags_source")
    _assert_chat(planned)


def test_sigkilled_guard_orphans_are_ended_and_learned_flags_serve(
        planned: GuardProc, start_guard, plan_state: Path, tracker: Tracker) -> None:
    first = planned.wait_healthy(1, timeout=LAUNCH_S)
    tree = planned.vllm_descendants()
    planned.signal(signal.SIGKILL)
    assert planned.wait_exit(10) == -signal.SIGKILL
    # vLLM's engine and worker outlive their API server (observed), so they outlive the guard.
    orphans = [p for p in tree if alive(p) and (is_vllm_proc(p) or is_api_server(p))]
    assert any(is_vllm_proc(p) for p in orphans), (
        f"expected VLLM:: orphans after SIGKILL of the guard; tree was {_describe(tree)}")

    again = start_guard(plan_state, ["--enforce-eager"], extra=["--health-interval", "2"],
                        port=planned.port)
    # Watch for the new guard's first vLLM: the orphans must be gone by the time it exists.
    deadline = time.monotonic() + LAUNCH_S
    new_api: psutil.Process | None = None
    while new_api is None and time.monotonic() < deadline:
        assert again.proc.poll() is None, f"the second guard exited:\n{again.tail()}"
        new_api = next((p for p in again.vllm_descendants() if is_api_server(p)), None)
        if new_api is None:
            time.sleep(0.1)
    assert new_api is not None, f"the second guard launched nothing:\n{again.tail()}"
    still = [p for p in orphans if alive(p)]
    assert not still, f"orphans alive when the next launch started: {_describe(still)}\n{again.tail()}"

    s = again.wait_healthy(1, timeout=LAUNCH_S)
    assert [r["outcome"] for r in s["launches"]] == ["healthy"], s["launches"]
    assert s["flags_source"] == "store", s.get("flags_source")
    assert _flag(s["launches"][0]["argv"], "--max-model-len") == _flag(
        first["launches"][0]["argv"], "--max-model-len")
    _assert_chat(again)
    again.signal(signal.SIGTERM)
    assert again.wait_exit(90) == 0
    stray = _gone_within(tracker.living_vllm(), 3.0)
    assert not stray, f"vLLM processes of this session still alive: {_describe(stray)}"


# --------------------------------------------------------------------------------------------
# The CPU build's KV cache sized by --kv-cache-memory-bytes above what the node has free.
# --------------------------------------------------------------------------------------------

def test_kv_cache_memory_bytes_above_free_memory_is_lowered_under_it(start_guard, tmp_path_factory) -> None:
    # No VLLM_CPU_KVCACHE_SPACE (vLLM applies it over the flag): the flag alone sizes the cache.
    g = start_guard(tmp_path_factory.mktemp("state-kv-bytes"),
                    ["--enforce-eager", "--max-model-len", "65408", "--kv-cache-memory-bytes", "64G"],
                    extra=["--no-plan", "--health-interval", "2"], env={"VLLM_CPU_KVCACHE_SPACE": None})
    s = g.wait_healthy(2, timeout=2 * LAUNCH_S)
    first, second = s["launches"]
    assert first["kind"] == "insufficient_free_memory", first
    m = re.search(r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation", first["evidence"])
    assert m, first["evidence"]
    free = float(m.group(1))
    new = int(_flag(second["argv"], "--kv-cache-memory-bytes") or 0)
    assert 0.8 * free * 2**30 <= new <= free * 2**30, (new, free)
    assert _flag(second["argv"], "--max-model-len") == "65408"       # 1 GiB of it still fits
    _assert_chat(g)
    g.signal(signal.SIGTERM)
    assert g.wait_exit(60) == 0


# --------------------------------------------------------------------------------------------
# --max-model-len auto (0.14+): vLLM sizes the length itself; the guard reads and reports its choice.
# --------------------------------------------------------------------------------------------

def test_auto_fit_serves_and_its_choice_is_reported(start_guard, tmp_path_factory) -> None:
    g = start_guard(tmp_path_factory.mktemp("state-auto"), ["--enforce-eager", "--max-model-len", "auto"],
                    extra=["--no-plan", "--health-interval", "2"])
    s = g.wait_healthy(1, timeout=LAUNCH_S)
    assert _flag(s["launches"][0]["argv"], "--max-model-len") == "auto"
    # the same 1 GiB KV cache as the failing default: vLLM's auto-fit lands on its own estimate
    assert s["changed_flags"]["--max-model-len"]["value"] == "auto (65408)", s["changed_flags"]
    _assert_chat(g)
    g.signal(signal.SIGTERM)
    assert g.wait_exit(60) == 0
