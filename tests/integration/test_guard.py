"""``vllm-guard start`` end to end against the fake vLLM: every kind through the whole loop.

Each test runs the real guard process, which launches the fake vLLM (a real child printing
real-format logs, forking a ``VLLM::EngineCore``, serving real HTTP) and is observed only from
outside: its /status endpoint, its exit code, its output, and the processes left behind.
"""

from __future__ import annotations

import re
import signal
import sys
import time

import psutil
import pytest
from guardrun import LLAMA8B, ROOT, argv_flag, marked

sys.path.insert(0, str(ROOT / "tests" / "fakes"))
import emulator as emu  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "logs" / "real-0.32"


def true_fit(version: str, flags: dict | None = None, gpu: dict | None = None) -> int:
    spec = emu.ModelSpec(name="fake/model", **LLAMA8B)
    out = emu.simulate(spec, emu.GpuSpec(**{"total_gib": 23.55, **(gpu or {})}), version, flags or {})
    return out.numbers["kv_tokens"] if "fit_max_model_len" not in out.numbers else out.numbers["fit_max_model_len"]


@pytest.mark.parametrize("version", ["0.32.0", "0.10.2", "0.6.3"])
def test_kv_cache_failure_healed_in_one_relaunch_to_the_estimate(run, version):
    g = run({"version": version, "model": LLAMA8B})
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "kv_cache_insufficient" and first["outcome"] == "failed"
    # what the fake vLLM printed is the emulator's verdict (its figures from the calibration records),
    # not what the guard parsed: the guard must have read it right and cut to it, block-aligned
    fit = true_fit(version)
    assert first["numbers"]["fit_max_model_len"] == fit
    new = int(argv_flag(second["argv"], "--max-model-len"))
    assert new == fit // 16 * 16
    assert s["changed_flags"]["--max-model-len"]["source"] == "heal"
    r = g.chat()
    assert r.status_code == 200 and r.json()["choices"]
    assert "relaunch 2: --max-model-len (unset) -> " in g.output()
    assert g.terminate() == 0


def test_v1_without_estimate_scales_by_gib_ratio_and_keeps_90_percent(run):
    g = run({"version": "0.8.4", "model": LLAMA8B})
    s = g.wait_healthy(launches=2)
    new = int(argv_flag(s["launches"][1]["argv"], "--max-model-len"))
    fit = true_fit("0.8.4")
    assert 0.9 * fit <= new <= fit
    assert g.terminate() == 0


def test_insufficient_free_memory_lowers_utilization_only(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "gpu": {"other_used_gib": 3}},
            vllm_args=["--max-model-len", "8192"])
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "insufficient_free_memory"
    util = float(argv_flag(second["argv"], "--gpu-memory-utilization"))
    # vLLM printed 20.15 of 23.55 GiB free (its CUDA context already counted): the new share passes
    # its start-up check, and no more than the 0.005 margin and the 0.01 step are given away
    assert util * 23.55 <= 20.15 and util >= 20.15 / 23.55 - 0.005 - 0.01
    assert argv_flag(second["argv"], "--max-model-len") == "8192"     # length untouched
    assert g.terminate() == 0


def test_busy_gpu_with_the_models_config_heals_share_and_length_in_one_relaunch(run):
    # The guard reads the model's config.json (no NVML here): vLLM's "Free memory on device" numbers
    # and the model's facts give both flags at once, instead of a second failure about the length.
    model = str(ROOT / "tests" / "fixtures" / "models" / "Llama-3.1-8B-Instruct")
    g = run({"version": "0.32.0", "model": LLAMA8B, "gpu": {"other_used_gib": 3}}, model=model)
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "insufficient_free_memory"
    util = float(argv_flag(second["argv"], "--gpu-memory-utilization"))
    assert util * 23.55 <= 20.15
    # the plan says 131072 tokens do not fit at that share; vLLM 0.14+ sizes the length itself
    assert argv_flag(second["argv"], "--max-model-len") == "auto"
    fit = true_fit("0.32.0", {"--gpu-memory-utilization": str(util)}, {"other_used_gib": 3})
    note = s["changed_flags"]["--max-model-len"]
    assert note["value"] == f"auto ({fit})" and note["source"] == "heal"
    assert note["why"].startswith("131072 tokens do not fit")
    assert note["why"].endswith(f"chose {fit} tokens for the KV cache")
    assert "--max-model-len (unset) -> auto (131072 tokens do not fit" in g.output()   # each change's reason
    assert g.chat(model).status_code == 200
    assert g.terminate() == 0


def test_auto_fit_above_the_asked_length_is_pinned_to_it(run):
    # The plan is pessimistic here (the fake's weights are 12 GiB, config.json says 15): it sizes
    # the relaunch with --max-model-len auto, vLLM finds room for more than the 40000 asked, and
    # the guard stops that launch and pins what was asked, which vLLM has just shown to fit.
    model = str(ROOT / "tests" / "fixtures" / "models" / "Llama-3.1-8B-Instruct")
    g = run({"version": "0.32.0", "model": {**LLAMA8B, "weights_gib": 12.0}, "gpu": {"other_used_gib": 3}},
            model=model, vllm_args=["--max-model-len", "40000"])
    s = g.wait_healthy(launches=3)
    first, second, third = s["launches"]
    assert first["kind"] == "insufficient_free_memory"
    assert argv_flag(second["argv"], "--max-model-len") == "auto"
    assert second["kind"] == "auto_fit_above_request" and "above the --max-model-len 40000" in second["evidence"]
    assert argv_flag(third["argv"], "--max-model-len") == "40000"
    assert argv_flag(third["argv"], "--gpu-memory-utilization") == argv_flag(second["argv"],
                                                                              "--gpu-memory-utilization")
    assert g.chat(model).status_code == 200
    assert g.terminate() == 0


def test_v0_kv_cache_allocation_oom_on_a_busy_gpu_lowers_the_share(run):
    # V0 sizes its cache against its own share; allocating it runs out where another process holds
    # memory (the traceback ends in cache_engine.py _allocate_kv_cache). No NVML here: a step down.
    g = run({"version": "0.6.6.post1", "model": LLAMA8B, "gpu": {"other_used_gib": 3.5}},
            vllm_args=["--max-model-len", "8192", "--enforce-eager"])
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "oom_profile"
    assert "_allocate_kv_cache" in g.output()
    assert argv_flag(second["argv"], "--gpu-memory-utilization") == "0.85"
    assert argv_flag(second["argv"], "--max-model-len") == "8192"
    assert g.terminate() == 0


TINY_CPU = {"device": "cpu", "version": "0.32.0",
            "model": {"weights_gib": 0.05, "kv_bytes_per_token": 16384, "num_kv_heads": 8,
                      "derived_max_model_len": 131072, "vocab": 4096, "hidden": 512, "intermediate": 1024}}


def test_cpu_kv_space_from_the_environment_is_for_a_person_to_change(run):
    # vLLM applies VLLM_CPU_KVCACHE_SPACE over any flag: no relaunch can shrink it, so exit 78 with the size that fits
    g = run(TINY_CPU, env={"VLLM_CPU_KVCACHE_SPACE": "64"})
    assert g.wait_exit() == 78
    out = g.output()
    assert "only 7.96 of 9.59 GiB of CPU memory is available" in out
    assert "set VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) to at most 7 GiB" in out
    assert "launch 2:" not in out and "relaunch" not in out


def test_cpu_kv_cache_memory_bytes_too_large_is_lowered_under_free_memory(run):
    g = run(TINY_CPU, vllm_args=["--kv-cache-memory-bytes", "64G"], env={"VLLM_CPU_KVCACHE_SPACE": ""})
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "insufficient_free_memory"
    new = int(argv_flag(second["argv"], "--kv-cache-memory-bytes"))
    assert 0.85 * 7.96 * 2**30 <= new <= 7.96 * 2**30                     # under what the node has free
    assert argv_flag(second["argv"], "--max-model-len") is None           # 131072 x 16 KiB still fits
    assert g.chat().status_code == 200
    assert g.terminate() == 0


def test_cudagraph_oom_heals_with_enforce_eager(run):
    g = run({"version": "0.10.2", "model": LLAMA8B, "cudagraph_gib": 3.0},
            vllm_args=["--max-model-len", "8192"])
    s = g.wait_healthy(launches=2)
    assert s["launches"][0]["kind"] == "oom_cudagraph"
    assert "--enforce-eager" in s["launches"][1]["argv"]
    assert argv_flag(s["launches"][1]["argv"], "--max-model-len") == "8192"
    assert g.terminate() == 0


def test_max_len_above_derived_uses_derived(run):
    g = run({"version": "0.32.0", "model": {**LLAMA8B, "weights_gib": 5.0, "kv_bytes_per_token": 65536}},
            vllm_args=["--max-model-len", "200000"])
    s = g.wait_healthy(launches=2)
    assert s["launches"][0]["kind"] == "max_len_exceeds_model"
    assert argv_flag(s["launches"][1]["argv"], "--max-model-len") == "131072"
    assert g.terminate() == 0


def test_no_kv_memory_ladder_reaches_health(run):
    # No NVML here, so no free memory known to raise the share into: the ladder frees memory instead.
    g = run({"version": "0.32.0", "model": {**LLAMA8B, "weights_gib": 20.75, "derived_max_model_len": 8192}},
            guard_args=["--no-plan"])
    s = g.wait_healthy(timeout=90)
    kinds = [x["kind"] for x in s["launches"] if x.get("kind")]
    assert kinds[0] == "no_kv_cache_memory"
    assert set(kinds) <= {"no_kv_cache_memory", "kv_cache_insufficient"}
    assert "--enforce-eager" in s["argv"] and argv_flag(s["argv"], "--gpu-memory-utilization") is None
    assert g.terminate() == 0


def test_a_share_you_set_is_never_raised(run):
    g = run({"version": "0.32.0", "model": {**LLAMA8B, "weights_gib": 20.0, "derived_max_model_len": 8192}},
            vllm_args=["--gpu-memory-utilization", "0.85"], guard_args=["--no-plan", "--max-launches", "2"])
    assert g.wait_exit(90) == 75
    launches = [r for r in g.history() if r.get("n")]
    assert all(argv_flag(r["argv"], "--gpu-memory-utilization") == "0.85" for r in launches)
    assert "--enforce-eager" in launches[1]["argv"]             # the ladder's next step instead


def test_replayed_real_log_until_the_right_flags_arrive(run):
    """A server that replays the real 0.32 KV failure until --max-model-len <= 65408."""
    g = run({"version": "0.32.0", "replay": str(REAL / "kv-cache-default-context.log"),
             "heal_when": {"max_model_len_le": 65408},
             "model": {"derived_max_model_len": 131072, "kv_bytes_per_token": 16384, "weights_gib": 0.1}})
    s = g.wait_healthy(launches=2)
    assert argv_flag(s["launches"][1]["argv"], "--max-model-len") == "65408"
    assert g.chat().status_code == 200
    assert g.terminate() == 0


def test_config_error_exits_78_after_one_launch(run):
    g = run({"version": "0.32.0"}, vllm_args=["--not-a-vllm-flag", "1"])
    assert g.wait_exit() == 78
    out = g.output()
    assert "unrecognized arguments" in out and "giving up" in out
    assert out.count("launch 1:") == 1 and "launch 2:" not in out


def test_engine_death_exit_0_relaunches_with_unchanged_flags(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "engine_death_after": 0.5, "death_count": 1},
            vllm_args=["--max-model-len", "8192"])
    s = g.wait_healthy(launches=2, timeout=60)
    first, second = s["launches"]
    assert first["outcome"] == "died" and first["kind"] == "engine_dead"
    # vLLM's own exit 0 (its API server shuts down after the loss) is a death, never a clean end; or, when
    # the guard saw the lost engine first, its stop 0.2 s later (issue 21: after serving, no waiting for a
    # teardown that comes before serving again) ended it with SIGTERM
    assert first["exit_code"] in (0, -signal.SIGTERM)
    assert first["argv"] == second["argv"]
    assert s["changed_flags"] == {}
    assert g.terminate() == 0


def test_killed_engine_process_is_detected(run):
    """SIGKILL of the VLLM::EngineCore while serving: the guard relaunches, same flags."""
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    s = g.wait_healthy(launches=1)
    engines = [p for p in marked(g.state_dir) if p.name().startswith("VLLM::EngineCore")]
    assert engines, "the fake vLLM forks a VLLM::EngineCore"
    engines[0].kill()
    s = g.wait_healthy(launches=2)
    assert s["launches"][0]["kind"] == "engine_dead"
    assert s["launches"][0]["argv"] == s["launches"][1]["argv"]
    assert g.terminate() == 0


def test_hung_server_is_restarted(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "hang_after": 0.3, "death_count": 1},
            vllm_args=["--max-model-len", "8192"])
    s = g.wait_for(lambda s: len(s["launches"]) >= 2 and s["launches"][0]["outcome"] == "died",
                   60, "a relaunch after the hang")
    assert s["launches"][0]["kind"] == "engine_dead"
    assert s["launches"][0]["argv"] == s["launches"][1]["argv"]
    assert g.terminate() == 0


def test_sigterm_leaves_nothing_even_when_vllm_ignores_sigterm(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "ignore_sigterm": True},
            vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    assert marked(g.state_dir), "vLLM and its engine carry the launch marker"
    assert g.terminate(timeout=30) == 0
    assert marked(g.state_dir) == []


def test_budget_exhausted_exits_75(run):
    bad = ROOT / "tests" / "fixtures" / "logs" / "real-0.32" / "engine-core-killed-while-serving.log"
    g = run({"version": "0.32.0", "replay": str(bad), "heal_when": {"flag": "--never-given"},
             "replay_exit": 0}, guard_args=["--max-launches", "3"])
    assert g.wait_exit() == 75
    assert g.output().count("launch 3:") == 1 and "launch 4:" not in g.output()
    assert "3 launches in a row failed" in g.output()


def test_restart_requires_the_token(run):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    assert g.post("/restart").status_code == 401
    assert g.post("/restart", token="wrong").status_code in (401, 403)
    assert g.post("/restart", token=g.token).status_code == 202
    s = g.wait_healthy(launches=2)
    assert s["launches"][0]["outcome"] == "restart"
    assert g.post("/stop", token=g.token).status_code == 202
    assert g.wait_exit() == 0


def test_second_guard_on_the_same_state_dir_refuses(run, tmp_path):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    other = run({"version": "0.32.0"}, state_dir=g.state_dir)
    assert other.wait_exit() == 78          # a person must act: systemd does not restart it (RestartPreventExitStatus)
    assert str(g.proc.pid) in other.output()
    assert g.terminate() == 0


def test_sigkilled_guard_leaves_orphans_the_next_guard_ends_before_launching(run):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    before = {p.pid for p in marked(g.state_dir)}
    assert len(before) >= 2, "API server and its VLLM::EngineCore"
    g.proc.kill()
    g.proc.wait()
    # the API server dies with the guard (parent-death signal); its engine is orphaned
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = {p.pid for p in marked(g.state_dir)}
        if left and len(left) < len(before):
            break
        time.sleep(0.05)
    orphans = [p for p in marked(g.state_dir) if p.name().startswith("VLLM::")]
    assert orphans, "the engine survives its API server, as real vLLM's does"
    second = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"],
                 state_dir=g.state_dir)
    s = second.wait_healthy(launches=1)
    assert all(not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE for p in orphans)
    assert "ended a process left by a previous guard" in second.output()
    assert s["launches"][0]["pid"] not in before
    assert second.terminate() == 0


def test_second_guard_on_the_same_vllm_port_refuses_naming_the_first(run, tmp_path):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"])
    g.wait_healthy(launches=1)
    other = run({"version": "0.32.0"}, vllm_args=["--port", str(g.port)],
                state_dir=tmp_path / "other-state")
    assert other.wait_exit() == 78
    assert f"port {g.port} is held by another vllm-guard's vLLM (pid" in other.output()
    assert g.status()["state"] == "healthy"
    assert g.terminate() == 0


def test_crash_loop_backs_off_and_ends_failed(run):
    g = run({"version": "0.32.0", "model": LLAMA8B, "engine_death_after": 0.2},
            vllm_args=["--max-model-len", "8192"],
            env={"VLLM_GUARD_BACKOFF_CRASH_LOOP_LIMIT": "2"})
    assert g.wait_exit() == 75
    out = g.output()
    # the first death after serving relaunches at once; the second, soon after serving again, waits first
    # and says for how long (read from what the guard said, not by catching the passing backoff state,
    # which a loaded machine can poll past)
    assert re.search(r"relaunch 2 with the same flags: ", out), out[-3000:]
    assert re.search(r"relaunch 3 with the same flags after a [0-9]+\.[0-9] s backoff: ", out), out[-3000:]
    assert "died 3 times in a row soon after becoming healthy" in out


def test_learned_flags_make_the_next_start_a_single_launch(run, tmp_path):
    scenario = {"version": "0.32.0", "model": LLAMA8B}
    g = run(scenario)
    first = g.wait_healthy(launches=2)
    assert g.terminate() == 0
    again = run(scenario, state_dir=g.state_dir)
    s = again.wait_healthy(launches=1)
    assert s["flags_source"] == "store"
    assert argv_flag(s["argv"], "--max-model-len") == argv_flag(first["argv"], "--max-model-len")
    assert s["changed_flags"]["--max-model-len"]["source"] == "store"
    assert again.chat().status_code == 200
    assert again.terminate() == 0


def test_learned_flags_that_fail_are_dropped(run, tmp_path):
    g = run({"version": "0.32.0", "model": LLAMA8B})
    g.wait_healthy(launches=2)
    assert g.terminate() == 0
    # the GPU got smaller: the learned length no longer fits; the guard forgets it and heals again
    again = run({"version": "0.32.0", "model": LLAMA8B, "gpu": {"total_gib": 22.0}},
                state_dir=g.state_dir)
    s = again.wait_healthy()
    assert s["launches"][0]["kind"] == "kv_cache_insufficient", (s["launches"], again.output()[-3000:])
    assert "forgetting them" in again.output(), (s["launches"], again.output()[-3000:])
    assert again.terminate() == 0


@pytest.mark.parametrize("quirk,endpoint", [("no_chat_template", "completions"), ("pooling", "embeddings")])
def test_probe_falls_back_for_models_without_chat(run, quirk, endpoint):
    g = run({"version": "0.32.0", "model": LLAMA8B, quirk: True}, vllm_args=["--max-model-len", "8192"])
    s = g.wait_healthy(launches=1)
    assert s["last_probe"]["ok"] and s["last_probe"]["endpoint"] == endpoint
    assert g.terminate() == 0


def test_probe_uses_api_key_and_served_model_name(run):
    g = run({"version": "0.32.0", "model": LLAMA8B},
            vllm_args=["--max-model-len", "8192", "--api-key", "sekrit", "--served-model-name", "alias"])
    s = g.wait_healthy(launches=1)
    assert s["last_probe"]["ok"]
    assert "sekrit" not in str(s) and "sekrit" not in g.output()
    assert g.terminate() == 0


def test_ready_flips_with_vllm_health(run):
    import httpx

    g = run({"version": "0.32.0", "model": LLAMA8B, "speed": 0.4, "engine_death_after": 1.0,
             "death_count": 1}, vllm_args=["--max-model-len", "8192"])
    url = f"http://127.0.0.1:{g.status_port}"
    g.wait_for(lambda s: s["state"] == "starting", 30, "starting")
    assert httpx.get(url + "/ready").status_code == 503
    assert httpx.get(url + "/healthz").status_code == 200
    g.wait_healthy(launches=1)
    assert httpx.get(url + "/ready").status_code == 200
    g.wait_for(lambda s: s["state"] != "healthy", 30, "the engine death")
    assert httpx.get(url + "/ready").status_code == 503
    g.wait_healthy(launches=2)
    assert httpx.get(url + "/ready").status_code == 200
    assert g.terminate() == 0


def test_sd_notify_ready_status_watchdog_stopping_on_a_real_socket(run, tmp_path):
    import socket as sk
    import threading

    path = str(tmp_path / "notify.sock")
    sock = sk.socket(sk.AF_UNIX, sk.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    messages: list[str] = []
    done = threading.Event()

    def read() -> None:      # as systemd does: the socket's queue holds only 10 datagrams
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                if done.is_set():
                    return    # the guard has exited: its datagrams are all queued, and now read

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"],
            env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    g.wait_healthy(launches=1)
    assert g.terminate() == 0
    done.set()
    reader.join(10)
    assert not reader.is_alive()
    sock.close()
    text = "\n".join(messages)
    assert "READY=1" in text and "WATCHDOG=1" in text and "STOPPING=1" in text
    statuses = [m for m in messages if m.startswith("STATUS=")]
    assert any("starting" in m for m in statuses) and any("healthy" in m for m in statuses)
    ready_at = next(i for i, m in enumerate(messages) if "READY=1" in m)
    healthy_at = next(i for i, m in enumerate(messages) if m.startswith("STATUS=healthy"))
    assert ready_at < healthy_at     # READY once supervising, not after the model loads


def test_auto_fit_below_the_floor_is_caught(run):
    """--max-model-len auto (0.14+) has no floor: the guard holds vLLM's choice to --min-model-len."""
    g = run({"version": "0.32.0", "model": {**LLAMA8B, "weights_gib": 20.0}},
            guard_args=["--min-model-len", "8192"], vllm_args=["--max-model-len", "auto"])
    s = g.wait_for(lambda s: len(s["launches"]) >= 2, 60, "a relaunch after auto-fit")
    first = s["launches"][0]
    assert first["kind"] == "kv_cache_insufficient" and "below the floor" in first["evidence"]
    assert argv_flag(s["launches"][1]["argv"], "--kv-cache-dtype") == "fp8"
    g.terminate()


def test_auto_fit_choice_is_reported(run):
    g = run({"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "auto"])
    s = g.wait_healthy(launches=1)
    assert s["changed_flags"]["--max-model-len"]["value"].startswith("auto (")
    assert g.terminate() == 0


def test_ray_head_node_worker_death_relaunches_the_engine(run, tmp_path):
    """vllm serve --distributed-executor-backend ray on the head node: a Ray worker death is
    classified engine_dead and the engine is relaunched with the same flags."""
    from supervisor.shell import procs

    state = tmp_path / "state"
    ray_log = ROOT / "tests" / "fixtures" / "logs" / "v0" / "0.6.0-ray-worker-died.log"
    second_launch = f"{procs.state_id(str(state))}:2"     # the guard's marker on its 2nd launch
    g = run({"version": "0.32.0", "model": LLAMA8B, "replay": str(ray_log),
             "heal_when": {"env": {"VLLMGUARD_LAUNCH": second_launch}}},
            vllm_args=["--max-model-len", "8192", "--distributed-executor-backend", "ray",
                       "--tensor-parallel-size", "1"],
            state_dir=state)
    s = g.wait_healthy(launches=2)
    first, second = s["launches"]
    assert first["kind"] == "engine_dead" and "worker died" in first["evidence"].lower()
    assert first["argv"] == second["argv"]
    assert "--distributed-executor-backend" in second["argv"]
    assert g.terminate() == 0


def test_a_fatal_looking_line_does_not_kill_a_server_that_still_answers(run, tmp_path):
    """While serving, only the exit, a lost engine or failed probes end a launch."""
    noisy = tmp_path / "noisy.log"
    noisy.write_text("ERROR 11-29 10:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
                     "Tried to allocate 20.00 MiB.\n")
    import asyncio

    from supervisor.shell.child import Child
    from supervisor.shell.launch import LaunchHooks, LaunchTimers, Watcher
    from supervisor.shell.probe import Prober

    script = tmp_path / "srv.py"
    script.write_text(
        "import http.server, json, sys\n"
        "seen = []\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        self.rfile.read(int(self.headers.get('content-length', 0)))\n"
        "        seen.append(1)\n"
        "        if len(seen) == 2:  # once healthy: a fatal-looking line, and keep serving\n"
        f"            print(open({str(noisy)!r}).read(), flush=True)\n"
        "        b = json.dumps({'choices': [{'message': {'content': 'x'}}]}).encode()\n"
        "        self.send_response(200); self.send_header('content-length', str(len(b)))\n"
        "        self.end_headers(); self.wfile.write(b)\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    from guardrun import free_port
    port = free_port()

    async def main():
        control: asyncio.Queue = asyncio.Queue()
        healthy = asyncio.Event()
        child = Child([sys.executable, str(script), str(port)], dict(__import__("os").environ),
                      lambda lines, stream: None)
        w = Watcher(child, Prober("127.0.0.1", port, "m", timeout=2),
                    LaunchTimers(60, 60, 0.2, 0.2, 2, 3), LaunchHooks(on_healthy=lambda s: healthy.set()),
                    control)
        child.on_lines = w.lines
        await child.start()
        task = asyncio.ensure_future(w.run())
        await asyncio.wait_for(healthy.wait(), 10)
        deadline = time.monotonic() + 10
        while w.first_fatal is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert w.first_fatal is not None             # the line was seen ...
        await asyncio.sleep(1.5)                      # ... several probe rounds later:
        assert not task.done()                        # still supervising, not stopped
        control.put_nowait(("stop", {}))
        result = await asyncio.wait_for(task, 20)
        await w.prober.aclose()
        return result

    result = asyncio.run(main())
    assert result.end == "stopped" and result.was_healthy


def test_flag_removed_in_this_vllm_is_dropped_not_fatal(run):
    """--swap-space was removed in 0.18: vLLM 0.32 calls it unrecognized; the guard drops it."""
    g = run({"version": "0.32.0", "model": LLAMA8B},
            vllm_args=["--max-model-len", "8192", "--swap-space", "4"])
    s = g.wait_healthy()
    assert "--swap-space" not in s["argv"]
    assert s["changed_flags"]["--swap-space"]["value"] is None
    assert "removed in vLLM 0.18.0" in s["changed_flags"]["--swap-space"]["why"]
    assert g.terminate() == 0


# --------------------------------------------------------------------------- issue 14's new kinds
CURRENT = ROOT / "tests" / "fixtures" / "logs" / "current"


def _history(g) -> list[dict]:
    """The last record of each launch, from the state dir's history.jsonl."""
    import json
    last: dict[int, dict] = {}
    for line in (g.state_dir / "history.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("n"), int):      # a launch's record (not the giving-up one)
            last[rec["n"]] = rec
    return [last[n] for n in sorted(last)]


def test_an_unknown_traceback_at_start_up_relaunches_the_same_flags_with_backoff_then_fails(run):
    """A failure no rule names (real 0.32 output: a corrupt tokenizer_config.json) is treated like the
    engine dying: the same flags after a backoff, and `failed` (exit 75) once the launch budget is spent."""
    g = run({"version": "0.32.0", "replay": str(REAL / "tokenizer-config-corrupt.log"),
             "heal_when": {"flag": "--never-given"}},
            vllm_args=["--max-model-len", "4096"], guard_args=["--max-launches", "3"],
            env={"VLLM_GUARD_BACKOFF_INITIAL": "1.0", "VLLM_GUARD_BACKOFF_JITTER": "0"})
    assert g.wait_exit() == 75
    out = g.output()
    assert "relaunch 2 with the same flags after a 1.0 s backoff" in out, out[-3000:]
    assert "relaunch 3 with the same flags after a 2.0 s backoff" in out, out[-3000:]
    assert out.count("launch 3:") == 1 and "launch 4:" not in out
    assert "3 launches in a row failed" in out and "unknown_failure" in out
    launches = _history(g)
    assert [r["kind"] for r in launches] == ["unknown_failure"] * 3
    assert len({tuple(r["argv"]) for r in launches}) == 1          # never a change of flags
    assert all(r["evidence"] for r in launches)      # the exception line no rule names
    gaps = [b["started_at"] - a["ended_at"] for a, b in zip(launches, launches[1:], strict=False)]
    assert all(gap >= 0.9 for gap in gaps) and gaps[1] > gaps[0]   # backoff, growing: no hot loop


def test_a_placement_group_shortage_ends_78_naming_the_gpus_asked_and_found(run):
    """vLLM 0.32 with Ray and --tensor-parallel-size 4 on two GPUs: it warns and waits for Ray (up to
    30 minutes); the guard gives up with exit 78 and says how many GPUs were asked for and found.
    The fake waits 5 s and then fails the way vLLM does when its wait times out, so this holds
    whether the guard acts on the warning at once or after the classifier's grace_s."""
    g = run({"version": "0.32.0", "replay": str(CURRENT / "0.32.0-placement-group-shortage.log"),
             "replay_wait": 5, "replay_tail": str(CURRENT / "0.32.0-placement-group-timeout.log")},
            vllm_args=["--max-model-len", "32768", "--distributed-executor-backend", "ray",
                       "--tensor-parallel-size", "4"])
    assert g.wait_exit(timeout=90) == 78
    out = g.output()
    assert "giving up" in out and "vLLM needs 4 GPUs" in out and "only 2 are available" in out
    assert out.count("launch 1:") == 1 and "launch 2:" not in out
    (launch,) = _history(g)
    assert launch["kind"] == "config_error"
    assert launch["numbers"]["required_gpus"] == 4 and launch["numbers"]["available_gpus"] == 2
