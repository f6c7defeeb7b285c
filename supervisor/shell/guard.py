"""The guard: a thin asyncio driver around the session, which makes every decision.

It gathers the facts, asks :class:`~supervisor.core.session.Session` what to launch, runs each
launch (:class:`~supervisor.shell.launch.Watcher`), reports how it ended, and does what the session
answers. Signal handlers and the status endpoint only put a command on one queue; this loop acts
on it. Every resource (the state-dir lock, the status server, the GPU turn) is entered in
:meth:`Guard._open` on one exit stack and left in reverse order, after vLLM is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import signal
import sys
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Mapping

import structlog

from supervisor import facts as machine
from supervisor.config import GuardConfig, default_state_dir
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.gpus import visible
from supervisor.core.flags import MAX_MODEL_LEN, UTILIZATION, Flags
from supervisor.core.lifecycle import State
from supervisor.core.session import (DIED, FAILED, RESET, RESTART, STOPPED, End, Facts, Launch, Learned, Outcome,
                                     Session)
from supervisor.core.units import GiB
from supervisor.errors import EX_SOFTWARE, EX_TEMPFAIL, ConfigError, GuardError, Refused
from supervisor.facts.nvml import NvmlProvider
from supervisor.shell import auth, procs, sdnotify, statedir
from supervisor.shell.child import Child, passthrough
from supervisor.shell.launch import LaunchHooks, LaunchTimers, Watcher
from supervisor.shell.metrics import Metrics
from supervisor.shell.probe import Prober, ProbeResult
from supervisor.shell.status_server import StatusServer, StatusServerError

log = structlog.get_logger("vllm-guard")


class Guard:
    """One guard run: ``await Guard(cfg).run()`` returns the exit code."""

    def __init__(self, cfg: GuardConfig, environ: Mapping[str, str] | None = None, gpu_provider: Any = None,
                 live: Any = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.environ = dict(os.environ if environ is None else environ)
        self.gpu_provider = gpu_provider if gpu_provider is not None else NvmlProvider()
        self.live = live                   # supervisor.shell.live.LiveLine on a TTY, else None
        self.rng = rng or random.Random()
        self.host, self.port = cfg.endpoint()
        self.state_dir = os.path.abspath(os.path.expanduser(cfg.state_dir or default_state_dir(self.environ)))
        self.metrics = Metrics()
        self.notifier = sdnotify.Notifier(self.environ)
        self.session: Session | None = None
        self.launches: list[dict[str, Any]] = []      # one record per launch, for /status
        self.gpu_snapshot: list[dict[str, Any]] = []
        self.child: Child | None = None
        self.exit_reason, self.exit_code = "", 0
        self.started_wall, self.started = time.time(), time.monotonic()
        self.healthy_since: float | None = None
        self.backoff_until: float | None = None
        self.last_probe: ProbeResult | None = None
        self.last_probe_at: float | None = None
        self._watcher: Watcher | None = None
        self._control: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._stop_requested = False
        self._heartbeat = time.monotonic()
        self._secrets: list[bytes] = []
        self._lock: statedir.StateDirLock | None = None
        self._learned_key: str | None = None
        self._gpu_key = "nogpu"
        self._turn: statedir.GpuTurn | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- entry point ------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._command, "stop", {"signal": sig})
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    await self._open(stack)
                    self.exit_code = await self._supervise()
                except GuardError as e:
                    log.error(f"configuration error: {e}" if isinstance(e, ConfigError) else str(e))
                    self.exit_reason, self.exit_code = str(e), e.exit_code
                except Exception as e:      # a bug in the guard: still stop vLLM, leave nothing behind
                    log.exception(f"internal error: {type(e).__name__}: {e}")
                    self.exit_reason, self.exit_code = f"internal error: {e}", EX_SOFTWARE
                await self._shutdown()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.remove_signal_handler(sig)
            watchdog.cancel()
            if self.live is not None:
                self.live.close()
        log.info(f"vllm-guard exits with code {self.exit_code}: {self.exit_reason or 'done'}",
                 exit_code=self.exit_code)
        return self.exit_code

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """Claim the state dir, end orphans, open the status endpoint, gather the facts, build the session."""
        cfg = self.cfg
        if not cfg.model:
            raise ConfigError("no model: pass --model MODEL (or set model = ... in the config file)")
        try:
            statedir.ensure_dir(self.state_dir)
            self._lock = stack.enter_context(statedir.StateDirLock(self.state_dir))
        except statedir.AlreadyRunning as e:
            raise Refused(str(e), EX_TEMPFAIL) from None
        except OSError as e:
            raise Refused(f"cannot use the state dir {self.state_dir}: {e.strerror or e}") from None
        auth.register_env_secrets(self.environ)
        for value in [*auth.argv_secrets(cfg.vllm_args), Flags.parse(list(cfg.vllm_args)).get("--api-key")]:
            auth.register_secret(value)
        for p in procs.sweep_orphans(self.state_dir, grace=min(cfg.stop_grace, 10.0)):
            log.warning(f"ended a process left by a previous guard: pid {p.get('pid')} "
                        f"{p.get('name')} ({' '.join(p.get('cmdline') or [])[:120]})")
        self._refuse_port_of_another_guard()
        self._start_status(stack)
        self._secrets = [s.encode() for s in auth.known_secrets()]
        self.notifier.ready()              # supervising now; model loads can outlast start timeouts
        gathered = await asyncio.to_thread(machine.gather, cfg, self.environ, self.gpu_provider)
        for text in gathered.notes:
            log.info(text)
        for text in gathered.warnings:
            log.warning(text)
        self._gpu_key = gathered.gpu_key
        self.gpu_snapshot = [machine.device_dict(d) for d in gathered.facts.devices]
        facts = gathered.facts
        if cfg.plan.learn:
            gpus = [(d.name, d.total_bytes) for d in facts.devices] or [("cpu", int((facts.cpu_kv_space_gib or 0) * GiB))]
            self._learned_key = statedir.learned_key(
                model=cfg.model, revision=None, gpus=gpus, tp=Flags.parse(list(cfg.vllm_args)).get_int(
                    "--tensor-parallel-size") or 1, vllm_version=facts.vllm_version, user_args=list(cfg.vllm_args))
            entry = statedir.LearnedStore(self.state_dir).get(self._learned_key)
            if entry is not None:
                facts = _with_learned(facts, entry)
        self.session = Session(cfg, facts, rng=self.rng, on_state=self._on_state)

    def _refuse_port_of_another_guard(self) -> None:
        """A vLLM port held by another guard's vLLM: refuse now, naming it (no launch is made)."""
        info = procs.port_holder_info(self.host, self.port)
        if info and info.get("marker") and not info["marker"].startswith(procs.state_id(self.state_dir)):
            cmd = auth.redact_text(" ".join(auth.redact_argv(info.get("cmdline") or []))[:160])
            raise Refused(f"port {self.port} is already served by another vllm-guard's vLLM (pid {info.get('pid')}, "
                          f"{cmd}); stop that guard or choose another --port")

    def _start_status(self, stack: contextlib.AsyncExitStack) -> None:
        cfg = self.cfg
        if cfg.status.port <= 0:          # 0 disables the status endpoint
            log.info("status endpoint disabled (status.port = 0)")
            return
        token, generated, explicit = auth.resolve_token(self.state_dir, cfg.status.token_file, self.environ)
        auth.check_bind(cfg.status.host, explicit)
        server = StatusServer(cfg.status.host, cfg.status.port, token, self.snapshot, self.command, self.metrics,
                              self.ready, alive=self.alive)
        try:
            server.start()
        except StatusServerError as e:
            raise Refused(str(e)) from None
        stack.callback(server.stop)
        from_env = auth.TOKEN_ENV in self.environ
        token_path = cfg.status.token_file or generated or os.path.join(self.state_dir, auth.TOKEN_FILE_NAME)
        assert self._lock is not None
        self._lock.publish(status_host=cfg.status.host, status_port=server.port,
                           token_file=None if from_env else token_path)
        where = f"token in ${auth.TOKEN_ENV}" if from_env else f"token file {token_path}"
        log.info(f"status endpoint: {server.url}/status ({where})", status_port=server.port)

    # -- the loop ---------------------------------------------------------------------------
    async def _supervise(self) -> int:
        s = self.session
        assert s is not None
        step: Launch | End | None = s.first_launch()
        if step.changes or step.reason == "learned":
            log.info(step.why)
        while not self._stop_requested:
            if isinstance(step, End):
                return self._give_up(step)
            if step is None:
                break
            if step.forget_learned and self._learned_key:
                statedir.LearnedStore(self.state_dir).drop(self._learned_key)
            if step.delay:
                self.backoff_until = time.time() + step.delay
                command = await self._wait_for_command(step.delay)
                self.backoff_until = None
                if command is not None:
                    step = s.restart(bool(command[1].get("reset"))) if command[0] == "restart" else None
                    continue
            flags, dropped = s.launching()
            for text in dropped:
                log.warning(text)
            outcome = await self._launch(flags)
            step = s.ended(outcome)
            if isinstance(step, Launch):
                self._announce(step)
                await self._wait_gpu_released()
        self.exit_reason = "stopped on request"
        return 0

    def _announce(self, step: Launch) -> None:
        n = len(self.launches) + 1
        self.metrics.restarted(step.reason)
        if step.reason in ("request", "reset", "learned_failed"):
            log.warning(step.why) if step.reason == "learned_failed" else log.info(step.why)
            return
        if not step.changes:
            log.warning(f"relaunch {n} with the same flags: {step.why}", launch=n, kind=step.reason)
            return
        parts = [f"{c.flag} {'(unset)' if c.old is None else c.old} -> {c.new or '(on)'}" for c in step.changes]
        text = f"{parts[0]} because {step.why}" if len(parts) == 1 else "; ".join(
            f"{p} ({c.why})" for p, c in zip(parts, step.changes))
        log.warning(f"relaunch {n}: {text}", launch=n, kind=step.reason, changed=[c.flag for c in step.changes])

    def _give_up(self, end: End) -> int:
        msg = end.message
        holders = ", ".join(f"pid {p['pid']} {p['name']} ({p['gib']} GiB)"
                            for d in self.gpu_snapshot for p in d.get("processes", []))
        if holders:
            msg += f". GPU memory is held by: {holders}"
        log.error(msg, exit_code=end.exit_code, kind=end.kind.value if end.kind else None)
        self.exit_reason = msg
        return end.exit_code

    async def _wait_for_command(self, delay: float) -> tuple[str, dict[str, Any]] | None:
        """Wait ``delay`` seconds, or until a command (stop, restart) comes; return it."""
        try:
            return await asyncio.wait_for(self._control.get(), timeout=delay)
        except asyncio.TimeoutError:
            return None

    # -- one launch -------------------------------------------------------------------------
    async def _launch(self, flags: Flags) -> Outcome:
        s = self.session
        assert s is not None
        n = s.launches
        argv = self.cfg.launch_argv(flags)
        record: dict[str, Any] = {
            "n": n, "argv": auth.redact_argv(argv), "started_at": time.time(), "ended_at": None,
            "outcome": "running", "kind": None, "evidence": None, "exit_code": None, "time_to_healthy_s": None}
        self.launches.append(record)
        del self.launches[:-50]
        log.info(f"launch {n}: {shlex.join(auth.redact_argv(argv))}", launch=n)
        holder = procs.port_holder(self.host, self.port)
        if holder:
            d = Diagnosis(Kind.CONFIG_ERROR, evidence=f"OSError: [Errno 98] Address already in use: {holder}",
                          phase="launching", detail=f"port {self.port} is in use: {holder}")
            return self._finish(record, Outcome(FAILED, d))
        while not self._control.empty():          # stale requests do not apply to a new launch
            if self._control.get_nowait()[0] == "stop":
                return self._finish(record, Outcome(STOPPED))
        env = procs.child_env(sdnotify.child_environment(self.environ), self.state_dir, n)
        prober = Prober(self.host, self.port, flags.get("--served-model-name") or self.cfg.model,
                        api_key=flags.get("--api-key") or self.environ.get("VLLM_API_KEY"),
                        timeout=self.cfg.health.timeout)
        hooks = LaunchHooks(on_line=self._on_line, on_healthy=self._on_healthy, on_probe=self._on_probe,
                            on_unhealthy=s.unhealthy, on_recovered=s.recovered)
        c = self.cfg
        timers = LaunchTimers(c.startup_timeout, c.stall_timeout, c.collect_after_fatal, c.health.interval,
                              c.health.failures, c.stop_grace)
        child = Child(argv, env, lambda line, stream: None, state_dir=self.state_dir)
        watcher = Watcher(child, prober, timers, hooks, self._control, bounds=s.check_auto_fit)
        child.on_line = watcher.line
        self._watcher, self.child = watcher, child
        try:
            async with self._gpu_turn():
                try:
                    await child.start()
                except OSError as e:
                    d = Diagnosis(Kind.CONFIG_ERROR, evidence=f"cannot run {argv[0]}: {e}",
                                  detail=f"the vLLM command cannot be started: {e}")
                    return self._finish(record, Outcome(FAILED, d))
                record["pid"] = child.pid
                outcome = await watcher.run()
        finally:
            await prober.aclose()
        self.healthy_since = None
        return self._finish(record, outcome)

    def _finish(self, record: dict[str, Any], outcome: Outcome) -> Outcome:
        d = outcome.diagnosis
        record["ended_at"] = time.time()
        record["exit_code"] = outcome.exit_code
        if outcome.end in (STOPPED, RESTART, RESET):
            record["outcome"] = outcome.end
        else:
            record["outcome"] = "died" if outcome.end == DIED else "failed"
            record.update(kind=d.kind.value, evidence=auth.redact_text(d.evidence), phase=d.phase,
                          numbers={k: v for k, v in d.numbers.items() if not isinstance(v, (dict, list))})
            log.warning(f"launch {record['n']} {record['outcome']}: {d.kind}: {auth.redact_text(d.evidence)[:300]}",
                        launch=record["n"], kind=d.kind.value, phase=d.phase)
        self.metrics.launch_finished(record["outcome"], record.get("kind") or "none")
        self.child = None
        return outcome

    @contextlib.asynccontextmanager
    async def _gpu_turn(self) -> AsyncIterator[None]:
        """Hold the GPU's start-up turn while this launch starts (released when healthy or over)."""
        def waiting() -> None:
            log.info("another vLLM is starting on this GPU; waiting for its turn")

        try:
            async with statedir.gpu_turn_async(self._gpu_key, self.cfg.startup_timeout, on_wait=waiting) as turn:
                self._turn = turn
                try:
                    yield
                finally:
                    self._release_turn()
        except statedir.GpuTurnTimeout as e:
            raise Refused(f"timed out waiting for another guard's vLLM to finish starting: {e}", EX_TEMPFAIL) from None

    def _release_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.close()

    async def _wait_gpu_released(self, timeout: float = 60.0) -> None:
        """After a launch ends, wait (bounded, polled) until its GPU memory is free again."""
        s = self.session
        if s is None or not s.facts.devices:
            return
        deadline = time.monotonic() + timeout
        indexes = {d.index for d in s.facts.devices}
        while True:
            devices = [d for d in visible(self.gpu_provider.snapshot(), self.environ.get("CUDA_VISIBLE_DEVICES"))
                       if d.index in indexes]
            marked = {p.pid for p in procs.marked_processes(self.state_dir)}
            ours = [p for d in devices for p in d.processes if p.pid in marked]
            if devices:
                self.gpu_snapshot = [machine.device_dict(d) for d in devices]
                s.gpu_observed(min(d.free_bytes for d in devices) / GiB)
            if not ours:
                return
            if time.monotonic() > deadline:
                log.warning(f"GPU memory of the last launch not released after {timeout:g} s: "
                            + ", ".join(f"pid {p.pid}" for p in ours))
                return
            await asyncio.sleep(0.5)

    async def _shutdown(self) -> None:
        """Stop vLLM (if running) before the endpoint and the lock go; tell systemd."""
        self.notifier.stopping()
        s = self.session
        if s is not None:
            s.stopping(self.exit_reason or "stopping")
        if self.child is not None:
            await self.child.stop(self.cfg.stop_grace)
        self._release_turn()
        if s is not None:
            s.stopped(self.exit_reason or "stopped")

    # -- hooks from the launch, the status endpoint and the signals ---------------------------
    def command(self, cmd: str, args: dict[str, Any] | None = None) -> None:
        """From any thread: ``restart`` (args ``reset``) or ``stop``."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._command, cmd, dict(args or {}))

    def _command(self, cmd: str, args: dict[str, Any]) -> None:
        if cmd == "stop":
            self._stop_requested = True
        self._control.put_nowait((cmd, args))

    def _on_state(self, state: State, why: str) -> None:
        log.debug("state", state=state.value, why=why)
        self.notifier.status(f"{state.value}: {why}" if why else state.value)
        self.metrics.set_state(state.value)

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

    def _on_healthy(self, seconds: float) -> None:
        s, w = self.session, self._watcher
        assert s is not None and w is not None
        self.launches[-1].update(outcome="healthy", time_to_healthy_s=round(seconds, 1))
        self.healthy_since = time.time()
        healthy = s.healthy(w.classifier.numbers, seconds)
        self._release_turn()      # the next vLLM on this GPU may start profiling now
        changed = ", ".join(f"{k} {v.value or '(on)'}" for k, v in s.notes.items()) or "none"
        failed = ", ".join(r["kind"] for r in self.launches[:-1] if r.get("kind")) or "none"
        log.info(f"healthy: a chat completion succeeded after {seconds:.1f} s (launch {s.launches}, "
                 f"{time.monotonic() - self.started:.1f} s since the guard started); failures: {failed}; "
                 f"changed flags: {changed}", launch=s.launches, time_to_healthy_s=round(seconds, 1))
        self.metrics.healthy_after(seconds)
        self.metrics.set_flags(s.current.get_int(MAX_MODEL_LEN) or w.classifier.numbers.get("auto_fit_max_model_len"),
                               s.current.get_float(UTILIZATION))
        if healthy.learn is not None and self._learned_key:
            try:
                statedir.LearnedStore(self.state_dir).put(self._learned_key, list(healthy.learn), {
                    "model": self.cfg.model, "vllm_version": s.vllm_version, "reasons": dict(healthy.reasons)})
            except OSError as e:
                log.warning(f"could not store the learned flags: {e}")

    def _on_probe(self, r: ProbeResult) -> None:
        self.last_probe, self.last_probe_at = r, time.time()
        if not r.refused:
            self.metrics.probe(r.ok, r.latency)

    async def _watchdog(self) -> None:
        """WATCHDOG=1 from the loop itself: a wedged loop stops pinging and systemd restarts us."""
        next_ping = 0.0
        while True:
            now = time.monotonic()
            self._heartbeat = now
            self._refresh_live()
            interval = self.notifier.watchdog_interval()
            if interval and now >= next_ping:
                self.notifier.watchdog()
                next_ping = now + interval
            await asyncio.sleep(min(interval or 1.0, 1.0))

    def _refresh_live(self) -> None:
        if self.live is None or self.session is None:
            return
        from supervisor.shell.live import render

        s, w = self.session, self._watcher
        started = self.launches[-1]["started_at"] if self.launches else time.time()
        self.live.update(render(max(1, s.launches), w.classifier.phase if w else "launching", self.live.progress,
                                {k: v.value or "" for k, v in s.notes.items()}, time.time() - started, s.state.value))

    # -- what the status endpoint serves (any thread) ------------------------------------------
    def alive(self) -> bool:
        """For /healthz: the loop turned within the last 30 s."""
        return time.monotonic() - self._heartbeat < 30.0

    def ready(self) -> bool:
        return self.session is not None and self.session.state is State.HEALTHY

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /status`` document (secrets redacted by the server and here)."""
        s, child, now = self.session, self.child, time.time()
        current = s.current if s is not None else Flags.parse(list(self.cfg.vllm_args))
        return {
            "state": s.state.value if s is not None else State.PLANNING.value,
            "model": self.cfg.model,
            "served_model_name": current.get("--served-model-name") or self.cfg.model,
            "pid": child.pid if child is not None else None,
            "guard_pid": os.getpid(),
            "vllm": {"host": self.host, "port": self.port, "version": s.vllm_version if s else None},
            "argv": auth.redact_argv(self.cfg.launch_argv(current)),
            "requested_args": auth.redact_argv(list(self.cfg.vllm_args)),
            "changed_flags": {} if s is None else {
                k: {"value": v.value, "requested": v.was, "why": v.text, "source": v.source} for k, v in s.notes.items()},
            "flags_source": s.flags_source if s else "user",
            "launches": [dict(r) for r in self.launches],
            "restarts": s.restarts if s else 0,
            "crash_loop": {**(s.crash_loop() if s else {}), "backoff_until": self.backoff_until},
            "last_probe": None if self.last_probe is None else {**self.last_probe.to_dict(), "at": self.last_probe_at},
            "uptime_s": round(now - self.started_wall, 1),
            "healthy_for_s": round(now - self.healthy_since, 1) if self.healthy_since else None,
            "gpu": self.gpu_snapshot,
            "exit_reason": self.exit_reason or None,
        }


def _with_learned(facts: Facts, entry: dict[str, Any]) -> Facts:
    """The facts with the learned flags of a store entry (its argv was checked when read)."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    reasons = meta.get("reasons") if isinstance(meta.get("reasons"), dict) else {}
    return replace(facts, learned=Learned(tuple(entry["argv"]), str(entry.get("saved_at") or ""),
                                          {str(k): str(v) for k, v in reasons.items()}))
