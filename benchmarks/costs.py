"""Seconds each launch costs, by the phase it reached: published vLLM start-up figures.

Sources (published vLLM start-up figures, see docs/benchmarks.md):

* BOOTSTRAP_S 16: container start to engine config, vllm#44881 (Qwen3.6-35B, RTX 5090).
* WEIGHTS_GIB_PER_S 1.21: 21.8 GiB of weights loaded in 18 s, vllm#44881 (per rank: ranks load in parallel).
* COMPILE_S 19.4: dynamo 4.6 s + torch.compile 14.8 s for Llama-3-8B, vllm PR #11005 (V1 only,
  skipped by --enforce-eager).
* PROFILE_S 14: memory profiling, a published study of caching vLLM's memory profile (vllm-profile-cache).
* CAPTURE_S 10: CUDA-graph capture for Llama-3-8B, vllm PR #11005 (skipped by --enforce-eager).
* SETTLE_S 1: GPU memory settles 0.5-1.5 s after a kill (Ollama's scheduler, a code comment).
* EXIT_AFTER_ERROR_S 5: the API server exits ~5 s after the engine's error (the real vLLM 0.32
  capture in tests/fixtures/logs/real-0.32: error at 27.7 s, exit at 33 s); a script waits for the
  exit. The guard stops vLLM after its 2 s collection window instead (``collect_after_fatal``).
* RESTART_SEC 3: ``Restart=always`` units use RestartSec=3 (Ollama's systemd unit).

Estimates, not measurements: they only rank the policies by the work each launch repeats.
"""

from __future__ import annotations

from benchmarks.matrix import Case, model_spec
from benchmarks.policies import Launch, Run
from benchmarks.render import emu
from supervisor.config import BackoffConfig, GuardConfig

BOOTSTRAP_S = 16.0
WEIGHTS_GIB_PER_S = 21.8 / 18.0
COMPILE_S = 4.6 + 14.8
PROFILE_S = 14.0
CAPTURE_S = 10.0
SETTLE_S = 1.0
EXIT_AFTER_ERROR_S = 5.0
RESTART_SEC = 3.0
GUARD_COLLECT_S = GuardConfig().collect_after_fatal

_ORDER = ("config", "engine_init", "loading", "profiling", "kv_cache", "cudagraph", "serving")


def launch_seconds(case: Case, launch: Launch) -> float:
    """The start-up work a launch does before it serves or fails (no waiting after it)."""
    reached = _ORDER.index(launch.phase) if launch.phase in _ORDER else len(_ORDER) - 1
    eager = launch.flags.enabled("--enforce-eager")
    v1 = emu.engine_generation(case.version, launch.flags.as_dict(), case.gpu.spec()) == "v1"
    spec = model_spec(case.model, case.version)
    tp = launch.flags.get_int("--tensor-parallel-size") or 1
    seconds = BOOTSTRAP_S
    if reached >= _ORDER.index("loading"):
        seconds += spec.weights_gib / tp / WEIGHTS_GIB_PER_S
    if reached >= _ORDER.index("profiling"):
        seconds += PROFILE_S + (COMPILE_S if v1 and not eager else 0.0)
    if reached >= _ORDER.index("cudagraph") and not eager:
        seconds += CAPTURE_S
    return seconds


def time_to_healthy(case: Case, run: Run) -> float:
    """Seconds from the first launch to a serving vLLM (or to giving up)."""
    guard = run.policy.startswith("vllm-guard")
    total = 0.0
    for launch in run.launches:
        total += launch_seconds(case, launch)
        if launch.ok:
            break
        total += (GUARD_COLLECT_S if guard else EXIT_AFTER_ERROR_S) + SETTLE_S
        if run.policy == "plain restart":
            total += RESTART_SEC
        if guard and "same flags" in launch.decision:
            total += BackoffConfig().initial       # a backoff relaunch (never in this matrix so far)
    return total
