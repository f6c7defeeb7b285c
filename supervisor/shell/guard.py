"""The guard: launch vLLM, watch each launch, ask the remedy policy what next, until stopped.

The shell that ties the pieces together. Signal handlers only set an event; one loop decides.
Exit codes: 0 after SIGTERM/SIGINT or POST /stop, 78 for a configuration vLLM refuses, 75 when
the launch budget or the remedies are exhausted.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

import structlog

from supervisor.shell import auth
from supervisor.shell import procs
from supervisor.shell.child import Child, passthrough
from supervisor.config import ConfigError, GuardConfig
from supervisor.core.flags import Flags
from supervisor.shell.probe import Prober, ProbeResult
from supervisor.shell.launch import DIED, RESET, RESTART, STOPPED, LaunchHooks, LaunchResult, LaunchTimers, Watcher
from supervisor.core.lifecycle import Lifecycle, State
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.remedy import EX_CONFIG, EX_TEMPFAIL, Context, GiveUp, Relaunch, decide
from supervisor.shell import sdnotify
from supervisor.shell import startup

log = structlog.get_logger("vllm-guard")

MANAGED = ("--host", "--port", "--model")
EX_SOFTWARE = 70


def vllm_endpoint(cfg: GuardConfig) -> tuple[str, int]:
    """Where vLLM will listen: ``--host``/``--port`` in the vLLM args win over the guard's own."""
    flags = Flags.parse(list(cfg.vllm_args))
    port = flags.get("--port")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--port {port!r} in the vLLM arguments is not a port number")
    return flags.get("--host") or cfg.host, int(port) if port else cfg.port


@dataclass
class FlagNote:
    """Why a flag differs from what the user asked, and who decided it."""

    value: str | None
    was: str | None
    why: str
    source: str      # "plan" | "store" | "heal" | "version"


class Guard:
    def __init__(self, cfg: GuardConfig, environ: Mapping[str, str] | None = None,
                 gpu_provider: Any = None, live: Any = None) -> None:
        self.cfg = cfg
        self.environ = dict(os.environ if environ is None else environ)
        self.gpu_provider = gpu_provider
        self.live = live                  # supervisor.shell.live.LiveLine on a TTY, else None
        self._watcher: Watcher | None = None
        self.lifecycle = Lifecycle()
        self.requested = Flags.parse(list(cfg.vllm_args))
        self.host, self.port = vllm_endpoint(cfg)
        self.current = self.requested
        self.notes: dict[str, FlagNote] = {}
        self.launches: list[dict[str, Any]] = []
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.healthy_since: float | None = None
        self.last_probe: ProbeResult | None = None
        self.last_probe_at: float | None = None
        self.vllm_version: str | None = None
        self.block_size: int | None = None
        self.child: Child | None = None
        self.exit_reason = ""
        self.exit_code = 0
        self.restarts = 0
        self.gpu_snapshot: list[dict[str, Any]] = []
        self.env_start = startup.Environment()
        self._control: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._stop_requested = False
        self._heartbeat = time.monotonic()
        self.backoff_until: float | None = None
        self._secrets: list[bytes] = []
        self.runtime_deaths = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics: Any = None
        self.notifier: Any = None
        self.status_server: Any = None

    # -- state ------------------------------------------------------------------------------
    def _to(self, state: State, why: str = "") -> None:
        if self.lifecycle.state is State.STOPPED:
            return
        if self.lifecycle.to(state, time.time(), why):
            log.debug("state", state=state.value, why=why)
            if self.notifier is not None:
                self.notifier.status(f"{state.value}: {why}" if why else state.value)
            if self.metrics is not None:
                self.metrics.set_state(state.value)

    def served_model(self) -> str:
        return self.current.get("--served-model-name") or self.cfg.model

    def argv(self, flags: Flags) -> list[str]:
        cmd = shlex.split(self.cfg.vllm_command)
        rest = flags
        for name in MANAGED:
            rest = rest.remove(name)
        positional_model = bool(cmd) and cmd[-1] == "serve"
        model = [self.cfg.model] if positional_model else ["--model", self.cfg.model]
        return cmd + model + ["--host", self.host, "--port", str(self.port)] + rest.argv()

    # -- control (thread-safe entry points for the status server and signals) ----------------
    def command(self, cmd: str, args: dict[str, Any] | None = None) -> None:
        """Called from any thread: "restart" (args reset=bool) or "stop"."""
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(self._command, cmd, dict(args or {}))

    def _command(self, cmd: str, args: dict[str, Any]) -> None:
        if cmd == "stop":
            self._stop_requested = True
        if self._control is not None:
            self._control.put_nowait((cmd, args))

    async def _watchdog(self) -> None:
        """WATCHDOG=1 from the loop itself: a wedged loop stops pinging and systemd restarts us."""
        next_ping = 0.0
        while True:
            now = time.monotonic()
            self._heartbeat = now
            self._refresh_live()
            notifier = self.notifier
            interval = notifier.watchdog_interval() if notifier is not None else None
            if interval and now >= next_ping:
                notifier.watchdog()
                next_ping = now + interval
            await asyncio.sleep(min(interval or 1.0, 1.0))

    def alive(self) -> bool:
        """For /healthz (any thread): the loop turned within the last 30 s."""
        return time.monotonic() - self._heartbeat < 30.0

    def _on_signal(self, signum: int) -> None:
        self._command("stop", {"signal": signum})

    # -- the main loop -----------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._control = asyncio.Queue()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            await startup.prepare(self)
            code = await self._supervise()
        except startup.Refused as e:
            log.error(str(e))
            self.exit_reason, code = str(e), e.exit_code
        except ConfigError as e:
            log.error(f"configuration error: {e}")
            self.exit_reason, code = str(e), EX_CONFIG
        except Exception as e:      # a bug in the guard: still stop vLLM, leave nothing behind
            log.exception(f"internal error: {type(e).__name__}: {e}")
            self.exit_reason, code = f"internal error: {e}", EX_SOFTWARE
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.remove_signal_handler(sig)
        self.exit_code = code
        watchdog.cancel()
        if self.live is not None:
            self.live.close()
        await startup.shutdown(self)
        return code

    async def _supervise(self) -> int:
        cfg = self.cfg
        fails_without_health = 0
        runtime_deaths = 0
        tried: list[str] = []
        previous: list[Diagnosis] = []
        port_failures = 0
        last_good: Flags | None = None
        attempt_backoff = 0
        while not self._stop_requested:
            self.current = startup.drop_removed(self, self.current)
            self._to(State.STARTING, f"launch {len(self.launches) + 1}")
            result = await self._launch(self.current)
            if result.end == STOPPED or self._stop_requested:
                self.exit_reason = "stopped on request"
                return 0
            if result.end in (RESTART, RESET):
                self.restarts += 1
                if self.metrics is not None:
                    self.metrics.restarted("reset" if result.end == RESET else "request")
                if result.end == RESET:
                    self.current, self.notes = self.requested, {}
                    log.info("restart requested: back to the flags you asked for")
                else:
                    log.info("restart requested: relaunching with the current flags")
                self._to(State.RESTARTING, "restart requested")
                continue
            d = result.diagnosis
            if result.was_healthy:
                last_good = self.current
                fails_without_health, tried, previous, port_failures = 0, [], [], 0
                if result.healthy_for < cfg.backoff.crash_loop_window:
                    runtime_deaths += 1
                else:
                    runtime_deaths, attempt_backoff = 1, 0
                self.runtime_deaths = runtime_deaths
            else:
                fails_without_health += 1
            if startup.forget_learned(self, result):
                # Learned flags failed: drop them and plan afresh (counts as a launch).
                previous.append(d)
                self._to(State.RESTARTING, "learned flags failed; re-planning")
                continue
            ctx = self.remedy_context(last_good=last_good, tried=tuple(tried), previous=tuple(previous),
                                      port_failures=port_failures)
            decision = decide(d, self.current, ctx)
            if isinstance(decision, GiveUp):
                return self._give_up(decision.reason, decision.exit_code, decision.advice, d)
            if fails_without_health >= cfg.max_launches:
                return self._give_up(
                    f"{fails_without_health} launches in a row failed without becoming healthy "
                    f"(last: {d.kind}: {d.evidence[:200]})", EX_TEMPFAIL,
                    "see the diagnosis above; raise --max-launches to keep trying", d)
            if result.was_healthy and runtime_deaths > cfg.backoff.crash_loop_limit:
                return self._give_up(
                    f"vLLM died {runtime_deaths} times in a row soon after becoming healthy "
                    f"(last: {d.kind}: {d.evidence[:200]})", EX_TEMPFAIL,
                    "look at the vLLM output above; the engine keeps crashing", d)
            tried.append(decision.step)
            previous.append(d)
            if decision.step == "port_retry":
                port_failures += 1
            self._announce(decision, d)
            self.current = decision.flags
            if decision.backoff:
                attempt_backoff += 1
                delay = startup.backoff_delay(cfg.backoff, attempt_backoff)
                self.backoff_until = time.time() + delay
                self._to(State.BACKOFF, f"{d.kind}; retrying in {delay:.1f} s")
                stop = await self._sleep_or_stop(delay)
                self.backoff_until = None
                if stop:
                    self.exit_reason = "stopped on request"
                    return 0
            else:
                self._to(State.RESTARTING, f"{d.kind}; relaunching with new flags")
            await startup.wait_gpu_released(self)
        self.exit_reason = "stopped on request"
        return 0

    def remedy_context(self, **loop_state: Any) -> Context:
        """What the remedy policy knows besides a diagnosis: the facts gathered at start-up plus
        the loop's state (``last_good``, ``tried``, ``previous``, ``port_failures``)."""
        env = self.env_start
        return Context(requested=self.requested, rules=self.cfg.remedies, gpu_free_gib=env.free_gib,
                       gpu_total_gib=env.total_gib, vllm_version=self.vllm_version,
                       block_size=self.block_size, derived_max_model_len=env.derived_max_model_len,
                       fp8_supported=env.fp8_supported, sizing=env.sizing,
                       cpu_kv_space_gib=startup.cpu_kv_space_gib(self), **loop_state)

    def _announce(self, decision: Relaunch, d: Diagnosis) -> None:
        n = len(self.launches) + 1
        if decision.changes:
            parts = []
            for c in decision.changes:
                was = c.old if c.old is not None else "(unset)"
                now = c.new if c.new not in (None, "") else "(on)"
                parts.append(f"{c.flag} {was} -> {now}")
                self.notes[c.flag] = FlagNote(c.new, self.requested.get(c.flag), c.why, "heal")
            if len(parts) == 1:
                text = f"{parts[0]} because {decision.why}"
            else:       # each change with its own reason
                text = "; ".join(f"{p} ({c.why})" for p, c in zip(parts, decision.changes))
            log.warning(f"relaunch {n}: {text}", launch=n, kind=d.kind.value,
                        changed=[c.flag for c in decision.changes])
        else:
            log.warning(f"relaunch {n} with the same flags: {decision.why}", launch=n,
                        kind=d.kind.value)

    def _give_up(self, reason: str, code: int, advice: str, d: Diagnosis | None) -> int:
        self._to(State.FAILED, reason)
        holders = startup.gpu_holders_text(self)
        msg = f"giving up: {reason}"
        if advice:
            msg += f". What could help: {advice}"
        if holders:
            msg += f". GPU memory is held by: {holders}"
        log.error(msg, exit_code=code, kind=d.kind.value if d else None)
        self.exit_reason = msg
        return code

    async def _sleep_or_stop(self, delay: float) -> bool:
        """Sleep, but wake for a stop (True) or a restart request (False, no more wait)."""
        assert self._control is not None
        try:
            cmd, args = await asyncio.wait_for(self._control.get(), timeout=delay)
        except asyncio.TimeoutError:
            return False
        if cmd == "stop":
            return True
        if args.get("reset"):
            self.current, self.notes = self.requested, {}
        return False

    async def _launch(self, flags: Flags) -> LaunchResult:
        n = len(self.launches) + 1
        argv = self.argv(flags)
        record: dict[str, Any] = {
            "n": n, "argv": auth.redact_argv(argv), "started_at": time.time(), "ended_at": None,
            "outcome": "running", "kind": None, "evidence": None, "exit_code": None,
            "time_to_healthy_s": None,
        }
        self.launches.append(record)
        del self.launches[:-50]
        log.info(f"launch {n}: {shlex.join(auth.redact_argv(argv))}", launch=n)
        holder = procs.port_holder(self.host, self.port)
        if holder:
            d = Diagnosis(Kind.CONFIG_ERROR,
                          evidence=f"OSError: [Errno 98] Address already in use: port {self.port} "
                                   f"is held by {holder}",
                          phase="launching", detail=f"port {self.port} is in use by {holder}")
            return self._finish(record, LaunchResult("failed", d))
        assert self._control is not None
        while not self._control.empty():          # stale requests do not apply to a new launch
            cmd, args = self._control.get_nowait()
            if cmd == "stop":
                return self._finish(record, LaunchResult(STOPPED, Diagnosis(Kind.HEALTHY)))
        env = procs.child_env(sdnotify.child_environment(self.environ), self.state_dir, n)
        prober = Prober(self.host, self.port, self.served_model(),
                        api_key=flags.get("--api-key") or self.environ.get("VLLM_API_KEY"),
                        timeout=self.cfg.health.timeout)
        hooks = LaunchHooks(on_line=self._on_line, on_healthy=self._on_healthy,
                            on_probe=self._on_probe, on_unhealthy=self._on_unhealthy,
                            on_recovered=lambda: self._to(State.HEALTHY, "probes pass again"))
        timers = LaunchTimers(self.cfg.startup_timeout, self.cfg.stall_timeout,
                              self.cfg.collect_after_fatal, self.cfg.health.interval,
                              self.cfg.health.failures, self.cfg.stop_grace)
        child = Child(argv, env, lambda line, stream: None, state_dir=self.state_dir)
        watcher = Watcher(child, prober, timers, hooks, self._control)
        if flags.get("--max-model-len") in ("auto", "-1"):
            watcher.min_model_len = self.cfg.remedies.min_model_len
            watcher.max_model_len_cap = self.requested.get_int("--max-model-len")
        child.on_line = watcher.line
        self._watcher = watcher
        self.child = child
        try:
            async with startup.gpu_turn(self):
                try:
                    await child.start()
                except OSError as e:
                    d = Diagnosis(Kind.CONFIG_ERROR, evidence=f"cannot run {argv[0]}: {e}",
                                  detail=f"the vLLM command cannot be started: {e}")
                    return self._finish(record, LaunchResult("failed", d))
                record["pid"] = child.pid
                result = await watcher.run()
        finally:
            await prober.aclose()
        numbers = watcher.classifier.numbers
        self.vllm_version = numbers.get("vllm_version") or self.vllm_version
        self.block_size = numbers.get("block_size") or self.block_size
        self.healthy_since = None
        return self._finish(record, result)

    def _finish(self, record: dict[str, Any], result: LaunchResult) -> LaunchResult:
        d = result.diagnosis
        record["ended_at"] = time.time()
        record["exit_code"] = result.exit_code
        if result.end in (STOPPED, RESTART, RESET):
            record["outcome"] = result.end
        else:
            record["outcome"] = "died" if result.end == DIED else "failed"
            record["kind"] = d.kind.value
            record["evidence"] = auth.redact_text(d.evidence)
            record["phase"] = d.phase
            record["numbers"] = {k: v for k, v in d.numbers.items() if not isinstance(v, (dict, list))}
            level = log.warning
            level(f"launch {record['n']} {record['outcome']}: {d.kind}: {d.evidence[:300]}",
                  launch=record["n"], kind=d.kind.value, phase=d.phase)
        if self.metrics is not None:
            self.metrics.launch_finished(record["outcome"], record.get("kind") or "none")
        self.child = None
        return result

    # -- hooks from the launch ---------------------------------------------------------------
    def _on_line(self, line: bytes, stream: str) -> None:
        if self.cfg.quiet:
            return
        for secret in self._secrets:      # vLLM prints its own args ("non-default args: {...}")
            if secret in line:
                line = line.replace(secret, b"***")
        if self.live is not None:
            self.live.note_progress(line)
            self.live.above(line, sys.stdout if stream == "stdout" else sys.stderr)
        else:
            passthrough(line, stream)

    def _refresh_live(self) -> None:
        if self.live is None:
            return
        from supervisor.shell.live import render

        w = self._watcher
        phase = w.classifier.phase if w is not None else "launching"
        started = self.launches[-1]["started_at"] if self.launches else time.time()
        self.live.update(render(max(1, len(self.launches)), phase, self.live.progress,
                                {k: v.value or "" for k, v in self.notes.items()},
                                time.time() - started, self.lifecycle.state.value))

    def _on_healthy(self, seconds: float) -> None:
        n = len(self.launches)
        self.launches[-1]["outcome"] = "healthy"
        self.launches[-1]["time_to_healthy_s"] = round(seconds, 1)
        self.healthy_since = time.time()
        chosen = self._watcher.classifier.numbers.get("auto_fit_max_model_len") if self._watcher else None
        if chosen and self.current.get("--max-model-len") in ("auto", "-1"):
            before = self.notes.get("--max-model-len")      # why auto (plan, heal), if not the user's
            chose = "vLLM's auto-fit chose"
            why = f"{chose} {chosen} tokens for the KV cache"
            if before is not None:
                why = f"{before.why.split('; ' + chose)[0]}; {why}"
            self.notes["--max-model-len"] = FlagNote(f"auto ({chosen})", self.requested.get("--max-model-len"),
                                                     why, before.source if before is not None else "plan")
        startup.release_turn(self)      # the next vLLM on this GPU may start profiling now
        self._to(State.HEALTHY, f"launch {n} serves")
        total = time.monotonic() - self.started
        changed = ", ".join(f"{k} {v.value or '(on)'}" for k, v in self.notes.items()) or "none"
        failed = [f"{r['kind']}" for r in self.launches[:-1] if r.get("kind")]
        log.info(f"healthy: a chat completion succeeded after {seconds:.1f} s "
                 f"(launch {n}, {total:.1f} s since the guard started); failures: "
                 f"{', '.join(failed) or 'none'}; changed flags: {changed}",
                 launch=n, time_to_healthy_s=round(seconds, 1))
        if self.metrics is not None:
            self.metrics.healthy_after(seconds)
            self.metrics.set_flags(self.current.get_int("--max-model-len") or chosen,
                                   self.current.get_float("--gpu-memory-utilization"))
        startup.learn(self)

    def _on_probe(self, r: ProbeResult) -> None:
        self.last_probe, self.last_probe_at = r, time.time()
        if self.metrics is not None and not r.refused:
            self.metrics.probe(r.ok, r.latency)

    def _on_unhealthy(self, why: str) -> None:
        self._to(State.UNHEALTHY, why)

    # -- /status ----------------------------------------------------------------------------
    @property
    def state_dir(self) -> str:
        return self.env_start.state_dir

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /status`` document (secrets redacted by the server and here)."""
        child = self.child
        now = time.time()
        return {
            "state": self.lifecycle.state.value,
            "model": self.cfg.model,
            "served_model_name": self.served_model(),
            "pid": child.pid if child is not None else None,
            "guard_pid": os.getpid(),
            "vllm": {"host": self.host, "port": self.port, "version": self.vllm_version},
            "argv": auth.redact_argv(self.argv(self.current)),
            "requested_args": auth.redact_argv(self.requested.argv()),
            "changed_flags": {k: {"value": v.value, "requested": v.was, "why": v.why,
                                  "source": v.source} for k, v in self.notes.items()},
            "flags_source": self.env_start.flags_source,
            "launches": [dict(r) for r in self.launches],
            "restarts": self.restarts,
            "crash_loop": {"runtime_deaths": self.runtime_deaths,
                           "limit": self.cfg.backoff.crash_loop_limit,
                           "backoff_until": self.backoff_until},
            "last_probe": None if self.last_probe is None else {
                **self.last_probe.to_dict(), "at": self.last_probe_at},
            "uptime_s": round(now - self.started_wall, 1),
            "healthy_for_s": round(now - self.healthy_since, 1) if self.healthy_since else None,
            "gpu": self.gpu_snapshot,
            "exit_reason": self.exit_reason or None,
        }

    def ready(self) -> bool:
        return self.lifecycle.state is State.HEALTHY
