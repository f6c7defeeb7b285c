"""The guard: a thin asyncio driver around the session, which makes every decision.

It gathers the facts, asks :class:`~supervisor.core.session.Session` what to launch, runs each
launch (:class:`~supervisor.shell.launch.Watcher`), reports how it ended, and does what the session
answers. Signals and the status endpoint only put a command on one queue (and set ``_stop``);
this loop acts on them, and every wait ends at once on a stop. Every resource (the state-dir lock,
the status server) is entered in :meth:`Guard._open` on one exit stack and left in reverse order,
after vLLM is stopped.

Signals: SIGTERM, SIGINT, SIGHUP (a closed terminal, ``systemctl reload``), SIGQUIT, SIGUSR1 and
SIGUSR2 all stop vLLM and the guard cleanly (exit 0); a second one during the stop skips the
grace and SIGKILLs what is left. A SIGHUP the guard was started ignoring (``nohup``) stays ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import shutil
import signal
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import structlog

from supervisor import facts as machine
from supervisor.config import GuardConfig, default_state_dir
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.exits import describe
from supervisor.core.flags import UTILIZATION, Flags
from supervisor.core.lifecycle import State
from supervisor.core.session import DIED, FAILED, STOPPED, End, Launch, Outcome, Session
from supervisor.errors import EX_SOFTWARE, ConfigError, GuardError, Refused
from supervisor.facts.nvml import NvmlProvider
from supervisor.shell import auth, procs, sdnotify, statedir
from supervisor.shell.child import Child
from supervisor.shell.gpus import Gpus
from supervisor.shell.history import History, run_id
from supervisor.shell.launch import LaunchHooks, LaunchTimers, Watcher
from supervisor.shell.metrics import Metrics
from supervisor.shell.output import VllmOutput
from supervisor.shell.probe import Prober, ProbeResult
from supervisor.shell.status_server import StatusServer, StatusServerError
from supervisor.shell.webhook import Webhook

log = structlog.get_logger("vllm-guard")
T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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
        self.history = History(self.state_dir, model=cfg.model, run_id=run_id())
        self.output = VllmOutput(None, quiet=cfg.quiet, live=live)
        self.webhook = Webhook(cfg.notify_url, model=cfg.model)
        self.context: dict[str, int | None] = {}
        self.session: Session | None = None
        self.gpus: Gpus | None = None
        self.child: Child | None = None
        self.exit_reason, self.exit_code = "", 0
        self.started_wall, self.started = time.time(), time.monotonic()
        self.healthy_since: float | None = None
        self.backoff_until: float | None = None
        self.last_probe: ProbeResult | None = None
        self.last_probe_at: float | None = None
        self._watcher: Watcher | None = None
        self._control: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._hurry = threading.Event()       # a second stop: no grace for vLLM
        self._heartbeat = time.monotonic()
        self._lock: statedir.StateDirLock | None = None
        self._learned_key: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- entry point ------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        handled = [s for s in STOP_SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        for sig in handled:
            self._loop.add_signal_handler(sig, self._command, "stop", {"signal": sig})
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    await self._open(stack)
                    self.exit_code = await self._supervise() if self.session is not None else 0
                except GuardError as e:
                    log.error(f"configuration error: {e}" if isinstance(e, ConfigError) else str(e))
                    self.exit_reason, self.exit_code = str(e), e.exit_code
                except Exception as e:      # a bug in the guard: still stop vLLM, leave nothing behind
                    log.exception(f"internal error: {type(e).__name__}: {e}")
                    self.exit_reason, self.exit_code = f"internal error: {e}", EX_SOFTWARE
                await self._shutdown()
                await self.webhook.aclose()
        finally:
            for sig in handled:
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
            raise ConfigError("no model: pass MODEL (or --model, or model = ... in the config file)")
        _check_vllm_command(cfg.vllm_argv, self.environ)
        try:
            self._lock = stack.enter_context(statedir.StateDirLock(self.state_dir))
        except (OSError, statedir.StateError) as e:
            raise Refused(f"cannot use the state dir {self.state_dir}: {getattr(e, 'strerror', None) or e}") from None
        auth.register_env_secrets(self.environ)
        requested = cfg.requested_flags()
        for value in [*auth.argv_secrets(cfg.vllm_args), requested.get("--api-key")]:
            auth.register_secret(value)
        self.output = VllmOutput(self.state_dir, secrets=auth.known_secrets(), quiet=cfg.quiet, live=self.live)
        for p in procs.sweep_orphans(self.state_dir, grace=min(cfg.stop_grace, 10.0)):
            log.warning(f"ended a process left by a previous guard: pid {p.get('pid')} "
                        f"{p.get('name')} ({auth.redact_text(' '.join(p.get('cmdline') or []))[:120]})")
        self._refuse_a_port_held_by_others()
        await self._start_status(stack)
        gave_up = self.history.last_gave_up()
        if gave_up:
            self.metrics.gave_up(gave_up)
        self.notifier.ready()              # supervising now; model loads can outlast start timeouts
        gathered = await self._unless_stopped(_in_daemon_thread(machine.gather, cfg, self.environ, self.gpu_provider))
        if gathered is None:
            self.exit_reason = "stopped on request"
            return
        for text in gathered.notes:
            log.info(text)
        for text in gathered.warnings:
            log.warning(text)
        facts = gathered.facts
        self.gpus = Gpus(self.gpu_provider, self.environ, self.state_dir, gathered.gpu_key, facts.devices, self._stop)
        if cfg.plan.learn:
            facts, self._learned_key = statedir.learned_facts(cfg, facts, self.state_dir)
        self.session = Session(cfg, facts, rng=self.rng, on_state=self._on_state)

    def _refuse_a_port_held_by_others(self) -> None:
        """vLLM's port held by anything but this guard's own (exiting) vLLM: refuse now, naming the holder."""
        holder = _port_holder(self.host, self.port, procs.state_id(self.state_dir))
        if holder is not None:
            raise Refused(f"{holder}; stop it or give vLLM another --port (no launch was made)")

    async def _start_status(self, stack: contextlib.AsyncExitStack) -> None:
        cfg = self.cfg
        if cfg.status.port <= 0:          # 0 disables the status endpoint
            log.info("status endpoint disabled (status.port = 0)")
            return
        token, generated, explicit = auth.resolve_token(self.state_dir, cfg.status.token_file, self.environ)
        auth.check_bind(cfg.status.host, explicit, token)
        server = StatusServer(cfg.status.host, cfg.status.port, token, self.snapshot, self.command, self.metrics,
                              self.ready, alive=self.alive)
        try:
            await server.start()
        except StatusServerError as e:
            raise Refused(str(e)) from None
        stack.push_async_callback(server.stop)
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
        assert s is not None and self.gpus is not None
        step: Launch | End | None = s.first_launch()
        if step.changes or step.reason == "learned":
            log.info(step.why)
        while not self._stop.is_set():
            if isinstance(step, End):
                return self._give_up(step)
            if step is None:
                break
            if step.forget_learned and self._learned_key:
                statedir.LearnedStore(self.state_dir).drop(self._learned_key)
            if step.delay:
                self.backoff_until = time.time() + step.delay
                command = await self._next_command(step.delay)
                self.backoff_until = None
                if command is not None:
                    step = s.restart(bool(command[1].get("reset"))) if command[0] == "restart" else None
                    continue
            flags, dropped = s.launching()
            for text in dropped:
                log.warning(text)
            step = s.ended(await self._launch(flags))
            if isinstance(step, Launch):
                self._announce(step)
                s.gpu_observed(await self.gpus.released())
        self.exit_reason = "stopped on request"
        return 0

    def _announce(self, step: Launch) -> None:
        n = (self.session.launches if self.session else 0) + 1
        self.metrics.relaunched(step.reason)
        changes = [{"flag": c.flag, "was": c.old, "now": c.new, "why": c.why} for c in step.changes]
        self.webhook.event("relaunch", f"relaunch {n} ({step.reason}): " + (
            "; ".join(f"{c.flag} {c.old or '(unset)'} -> {c.new or '(on)'}" for c in step.changes) or "the same flags"),
            kind=step.reason, launch=n, changes=changes, delay_s=round(step.delay, 1))
        if step.reason in ("request", "reset", "learned_failed"):
            (log.warning if step.reason == "learned_failed" else log.info)(step.why)
        elif not step.changes:
            log.warning(f"relaunch {n} with the same flags: {step.why}", launch=n, kind=step.reason)
        else:
            parts = [f"{c.flag} {'(unset)' if c.old is None else c.old} -> {c.new or '(on)'}" for c in step.changes]
            text = f"{parts[0]} because {step.why}" if len(parts) == 1 else "; ".join(
                f"{p} ({c.why})" for p, c in zip(parts, step.changes))
            log.warning(f"relaunch {n}: {text}", launch=n, kind=step.reason, changed=[c.flag for c in step.changes])

    def _give_up(self, end: End) -> int:
        holders = self.gpus.holders() if self.gpus else ""
        msg = end.message + (f". GPU memory is held by: {holders}" if holders else "")
        log.error(msg, exit_code=end.exit_code, kind=end.kind.value if end.kind else None)
        self.exit_reason = msg
        self.history.gave_up(msg, end.exit_code, end.kind.value if end.kind else None)
        self.metrics.gave_up(time.time())
        self.webhook.event("gave_up", msg, kind=end.kind.value if end.kind else None, exit_code=end.exit_code)
        return end.exit_code

    async def _next_command(self, delay: float) -> tuple[str, dict[str, Any]] | None:
        """Wait ``delay`` seconds, or until a command (stop, restart) comes; return it."""
        try:
            return await asyncio.wait_for(self._control.get(), timeout=delay)
        except asyncio.TimeoutError:
            return None

    async def _unless_stopped(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None as soon as the guard is asked to stop."""
        task, stop = asyncio.ensure_future(work), asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    # -- one launch -------------------------------------------------------------------------
    async def _launch(self, flags: Flags) -> Outcome:
        s, gpus, c = self.session, self.gpus, self.cfg
        assert s is not None and gpus is not None
        n, argv = s.launches, c.launch_argv(flags)
        shown = shlex.join(auth.redact_argv(argv))
        self.history.started(n, argv, {k: {"value": v.value, "requested": v.was, "why": v.text, "source": v.source}
                                       for k, v in s.notes.items()})
        self.output.launch(n, shown)
        log.info(f"launch {n}: {shown}", launch=n)
        ours = procs.state_id(self.state_dir)
        holder = _port_holder(self.host, self.port, ours)
        if holder is not None:      # not ours: a person must act, at once
            return self._finish(Outcome(FAILED, Diagnosis(Kind.CONFIG_ERROR, evidence=holder, phase="launching",
                                                          detail=f"{holder}; stop it or give vLLM another --port")))
        if _port_holder(self.host, self.port, None) is not None:   # our last vLLM, still exiting: retried
            d = Diagnosis(Kind.CONFIG_ERROR, evidence=f"OSError: [Errno 98] Address already in use: port {self.port} "
                          "is still held by this guard's previous vLLM", phase="launching",
                          detail=f"port {self.port} is still held by this guard's previous vLLM")
            return self._finish(Outcome(FAILED, d))
        while not self._control.empty():          # stale requests do not apply to a new launch
            if self._control.get_nowait()[0] == "stop":
                return self._finish(Outcome(STOPPED))
        prober = Prober(self.host, self.port, flags.get("--served-model-name") or c.model,
                        api_key=flags.get("--api-key") or self.environ.get("VLLM_API_KEY"), timeout=c.health.timeout)
        hooks = LaunchHooks(on_line=self.output.line, on_healthy=self._on_healthy, on_probe=self._on_probe,
                            on_unhealthy=s.unhealthy, on_recovered=s.recovered)
        timers = LaunchTimers(c.startup_timeout, c.stall_timeout, c.collect_after_fatal, c.health.interval,
                              c.health.failures, c.stop_grace)
        env = procs.child_env(sdnotify.child_environment(self.environ), self.state_dir, n)
        child = Child(argv, env, lambda line, stream: None, state_dir=self.state_dir)
        watcher = Watcher(child, prober, timers, hooks, self._control, bounds=s.check_auto_fit, hurry=self._hurry,
                          clean=self.output.mask)
        child.on_line = watcher.line
        self._watcher, self.child = watcher, child
        try:
            async with gpus.turn(c.startup_timeout) as ours:
                if not ours:
                    return self._finish(Outcome(STOPPED))
                try:
                    await child.start()
                except OSError as e:
                    d = Diagnosis(Kind.CONFIG_ERROR, evidence=f"cannot run {argv[0]}: {e}",
                                  detail=f"the vLLM command cannot be started: {e}")
                    return self._finish(Outcome(FAILED, d))
                self.history.started_process(child.pid)
                outcome = await watcher.run()
        finally:
            await prober.aclose()
        self.healthy_since = None
        return self._finish(outcome)

    def _finish(self, outcome: Outcome) -> Outcome:
        d = outcome.diagnosis
        record = self.history.current
        n = record["n"] if record else 0
        exit_text = describe(outcome.exit_code) if outcome.exit_code is not None else ""
        numbers = self._watcher.classifier.numbers if self._watcher is not None else {}
        if outcome.end in (FAILED, DIED):
            how = "died" if outcome.end == DIED else "failed"
            self.history.ended(how, kind=d.kind.value, evidence=d.evidence, phase=d.phase,
                               numbers={**numbers, **d.numbers}, exit_code=outcome.exit_code, exit_text=exit_text)
            log.warning(f"launch {n} {how}: {d.kind}: {d.evidence[:300]}", launch=n, kind=d.kind.value, phase=d.phase)
            self.webhook.event("died" if outcome.end == DIED else "launch_failed", f"launch {n} {how}: {d.kind}: "
                               f"{d.evidence[:300]}", kind=d.kind.value, launch=n, phase=d.phase,
                               evidence=d.evidence[:500], exit_code=outcome.exit_code)
        else:
            self.history.ended(outcome.end, numbers=numbers, exit_code=outcome.exit_code, exit_text=exit_text)
        self.metrics.launch_finished(record["outcome"] if record else outcome.end,
                                     (record or {}).get("kind") or "none", time.time())
        self.child = None
        return outcome

    async def _shutdown(self) -> None:
        """Stop vLLM (if running) before the endpoint and the lock go; tell systemd."""
        self.notifier.stopping()
        s = self.session
        if s is not None:
            s.stopping(self.exit_reason or "stopping")
        if self.child is not None:
            await self.child.stop(self.cfg.stop_grace, self._hurry)
        if self.gpus is not None:
            self.gpus.release_turn()
        if s is not None:
            s.stopped(self.exit_reason or "stopped")

    # -- hooks from the launch, the status endpoint and the signals ---------------------------
    def command(self, cmd: str, args: dict[str, Any] | None = None) -> None:
        """From any thread: ``restart`` (args ``reset``) or ``stop``."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._command, cmd, dict(args or {}))

    def _command(self, cmd: str, args: dict[str, Any]) -> None:
        if cmd == "stop":
            if self._stop.is_set():
                self._hurry.set()           # asked twice: do not wait for vLLM's grace
            self._stop.set()
        self._control.put_nowait((cmd, args))

    def _on_state(self, state: State, why: str) -> None:
        log.debug("state", state=state.value, why=why)
        self.notifier.status(f"{state.value}: {why}" if why else state.value)
        self.metrics.set_state(state.value)

    def _on_healthy(self, seconds: float) -> None:
        s, w, gpus = self.session, self._watcher, self.gpus
        assert s is not None and w is not None and gpus is not None
        self.healthy_since = time.time()
        numbers = w.classifier.numbers
        healthy = s.healthy(numbers, seconds)
        self.history.healthy(seconds, numbers)
        gpus.release_turn()      # the next vLLM on this GPU may start profiling now
        changed = ", ".join(f"{k} {v.value or '(on)'}" for k, v in s.notes.items()) or "none"
        failed = ", ".join(r["kind"] for r in self.history.records[:-1] if r.get("kind")) or "none"
        log.info(f"healthy: a chat completion succeeded after {seconds:.1f} s (launch {s.launches}, "
                 f"{time.monotonic() - self.started:.1f} s since the guard started); failures: {failed}; "
                 f"changed flags: {changed}", launch=s.launches, time_to_healthy_s=round(seconds, 1))
        self.metrics.healthy_after(seconds)
        self.context = s.context(numbers)
        self.metrics.set_context(**self.context, utilization=s.current.get_float(UTILIZATION))
        served = self.context["served"]
        self.webhook.event("healthy", f"launch {s.launches} serves after {seconds:.0f} s"
                           + (f"; context {served} tokens" if served else "") + f"; changed flags: {changed}",
                           launch=s.launches, time_to_healthy_s=round(seconds, 1), context=self.context,
                           changed_flags={k: v.value for k, v in s.notes.items()})
        if healthy.learn is not None and self._learned_key:
            try:
                statedir.LearnedStore(self.state_dir).put(self._learned_key, list(healthy.learn), {
                    "model": self.cfg.model, "vllm_version": s.vllm_version, "reasons": dict(healthy.reasons)})
            except (OSError, statedir.StateError) as e:
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

        s, w, record = self.session, self._watcher, self.history.current
        started = record["started_at"] if record else time.time()
        self.live.update(render(max(1, s.launches), w.classifier.phase if w else "launching", self.live.progress,
                                {k: v.value or "" for k, v in s.notes.items()}, time.time() - started, s.state.value))

    # -- what the status endpoint serves ------------------------------------------------------
    def alive(self) -> bool:
        """For /healthz: the loop turned within the last 30 s."""
        return time.monotonic() - self._heartbeat < 30.0

    def ready(self) -> bool:
        return self.session is not None and self.session.state is State.HEALTHY

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /status`` document (secrets redacted by the server and here)."""
        s, child, now = self.session, self.child, time.time()
        current = s.current if s is not None else self.cfg.requested_flags()
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
            "launches": [dict(r) for r in self.history.records],
            "restarts": s.restarts if s else 0,
            "crash_loop": {**(s.crash_loop() if s else {}), "backoff_until": self.backoff_until},
            "last_probe": None if self.last_probe is None else {**self.last_probe.to_dict(), "at": self.last_probe_at},
            "uptime_s": round(now - self.started_wall, 1),
            "healthy_for_s": round(now - self.healthy_since, 1) if self.healthy_since else None,
            "context": _context_text(self.context) if self.context else None,
            "gpu": self.gpus.snapshot if self.gpus else [],
            "exit_reason": self.exit_reason or None,
        }


async def _in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread: unlike the default executor, a stop does not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def work() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):      # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=work, name="vllm-guard-facts", daemon=True).start()
    return await future


def _context_text(context: dict[str, int | None]) -> dict[str, Any]:
    """The context served, next to what was asked and what fit, with a sentence for people."""
    served, requested, fit = context.get("served"), context.get("requested"), context.get("fit")
    text = f"context served {served}" if served else "context served: vLLM's default"
    if fit:
        text += f" of {fit} that fit"
    if requested and served and served < requested:
        text += f" ({requested} asked)"
    return {**context, "text": text}


def _port_holder(host: str, port: int, ours: str | None) -> str | None:
    """What holds vLLM's port, in words, unless it is free or (``ours`` given) a process of this guard's."""
    info = procs.port_holder_info(host, port)
    if info is None:
        return None
    if not info["in_use"]:
        return f"vLLM cannot listen on {host or '*'}:{port}: {info['error']}"
    marker = info.get("marker") or ""
    if ours is not None and marker.startswith(ours + ":"):
        return None
    if info.get("pid") is None:
        return f"port {port} is in use by a process this user cannot see (another user's; `sudo ss -ltnp` names it)"
    cmd = auth.redact_text(" ".join(auth.redact_argv(info.get("cmdline") or [])) or info.get("name", "?"))[:160]
    who = "another vllm-guard's vLLM" if marker else (info.get("name") or "a process")
    user = f", user {info['user']}" if info.get("user") else ""
    return f"port {port} is held by {who} (pid {info['pid']}{user}: {cmd})"


def _check_vllm_command(argv: list[str], environ: Mapping[str, str]) -> None:
    """vLLM's command must exist before anything is launched: say where it was looked for and how to point at it."""
    exe = argv[0] if argv else ""
    path = environ.get("PATH", os.defpath)
    found = shutil.which(exe, path=path) if exe else None
    if found:
        return
    where = f"{exe} does not exist or is not executable" if "/" in exe else f"'{exe}' is not on PATH ({path})"
    venv = environ.get("VIRTUAL_ENV")
    raise ConfigError(
        f"cannot find vLLM's command: {where}"
        + (f"; the active virtualenv is {venv}" if venv else "")
        + ". Install vLLM there, or point vllm_command (--vllm-command, VLLM_GUARD_VLLM_COMMAND) at it, e.g. "
          "'/opt/vllm/bin/vllm serve' or '/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server'")
