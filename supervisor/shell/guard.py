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
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import structlog

from supervisor import facts as machine
from supervisor.config import GuardConfig, default_state_dir
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags, secrets_to_environ
from supervisor.core.lifecycle import State
from supervisor.core.progress import Progress, last_failure, seconds_text, summary
from supervisor.core.session import FAILED, STOPPED, End, Launch, Outcome, Session
from supervisor.errors import EX_SOFTWARE, EX_TEMPFAIL, ConfigError, GuardError, Refused, StateError
from supervisor.facts import preflight
from supervisor.facts.nvml import NvmlProvider
from supervisor.facts.vllm_install import require_command
from supervisor.secrets import REGISTRY, argv_secrets
from supervisor.shell import auth, learned, procs, sdnotify
from supervisor.shell.child import Child
from supervisor.shell.diskfaults import DISK_FAULTS
from supervisor.shell.gpus import Gpus
from supervisor.shell.launch import LaunchHooks, LaunchTimers, Watcher, port_taken
from supervisor.shell.live import render
from supervisor.shell.locks import StateDirLock
from supervisor.shell.output import VllmOutput
from supervisor.shell.probe import Prober, answered_by
from supervisor.shell.report import Report
from supervisor.shell.status_server import StatusServer, StatusServerError

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
        self.report = Report(cfg, self.state_dir)
        self.notifier = sdnotify.Notifier(self.environ)
        self.output = VllmOutput(None, quiet=cfg.quiet, live=live)
        self.session: Session | None = None
        self.gpus: Gpus | None = None
        self.child: Child | None = None
        self.exit_reason, self.exit_code = "", 0
        self._watcher: Watcher | None = None
        self._control: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._hurry = threading.Event()       # a second stop: no grace for vLLM
        self._heartbeat = time.monotonic()
        self._lock: StateDirLock | None = None
        self._keys: learned.StoreKeys | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warned_visible = False
        self.progress: Progress | None = None   # the current launch's, in words
        self._stop_asked: tuple[float, str] | None = None   # when the first stop came, and what kills now
        self._told: tuple[str, float] = ("", 0.0)            # systemd's last STATUS= and when

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
                await self.report.webhook.aclose()
        finally:
            for sig in handled:
                self._loop.remove_signal_handler(sig)
            watchdog.cancel()
        if self.live is not None:         # the live line gone first: the exit line is the last one drawn
            self.live.close()
        log.info(f"vllm-guard exits with code {self.exit_code}: {self.exit_reason or 'done'}",
                 exit_code=self.exit_code)
        return self.exit_code

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """Claim the state dir, end orphans, open the status endpoint, gather the facts, build the session."""
        cfg = self.cfg
        if not cfg.model:
            raise ConfigError("no model: pass MODEL (or --model, or model = ... in the config file)")
        require_command(cfg.vllm_argv, self.environ)
        notes = await self._unless_stopped(_in_daemon_thread(preflight.check, cfg, self.environ))
        if notes is None:
            self.exit_reason = "stopped on request"
            return
        for text in notes:
            log.info(text)
        try:
            self._lock = stack.enter_context(StateDirLock(self.state_dir))
        except (OSError, StateError) as e:
            # A full or failing disk may pass (75: systemd tries again); anything else needs a person (78).
            fault = isinstance(e, OSError) and e.errno in DISK_FAULTS
            raise Refused(f"cannot use the state dir {self.state_dir}: {getattr(e, 'strerror', None) or e}",
                          EX_TEMPFAIL if fault else None) from None
        REGISTRY.add_environ(self.environ)
        REGISTRY.add_argv(cfg.vllm_args)
        REGISTRY.add_argv(cfg.vllm_file_args)        # vLLM's --config YAML, as the arguments vLLM makes of it
        self.output = VllmOutput(self.state_dir, quiet=cfg.quiet, live=self.live)
        for p in procs.sweep_orphans(self.state_dir, grace=min(cfg.stop_grace, 10.0)):
            log.warning(f"ended a process left by a previous guard: pid {p.get('pid')} "
                        f"{p.get('name')} ({REGISTRY.text(' '.join(REGISTRY.argv(p.get('cmdline') or [])))[:120]})")
        holder = procs.port_holder(self.host, self.port, ours=procs.state_id(self.state_dir))
        if holder is not None:
            raise Refused(f"{holder}; stop it or give vLLM another --port (no launch was made)")
        await self._start_status(stack)
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
            facts, self._keys = learned.learned_facts(cfg, facts, self.state_dir)
        self.session = Session(cfg, facts, rng=self.rng, on_state=self._on_state)

    async def _start_status(self, stack: contextlib.AsyncExitStack) -> None:
        cfg = self.cfg
        if cfg.status.port <= 0:          # 0 disables the status endpoint
            log.info("status endpoint disabled (status.port = 0)")
            return
        token, generated, explicit = auth.resolve_token(self.state_dir, cfg.status.token_file, self.environ)
        auth.check_bind(cfg.status.host, explicit, token)
        server = StatusServer(cfg.status.host, cfg.status.port, token, self.snapshot, self.command,
                              self.report.metrics, self.ready, alive=self.alive)
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
        s, gpus = self.session, self.gpus
        assert s is not None and gpus is not None
        first = s.first_launch()
        if first.changes or first.reason == "learned":
            log.info(first.why)
        step: Launch | End | None = first
        while not self._stop.is_set():
            if isinstance(step, End):
                self.exit_reason = self.report.gave_up(step, gpus.holders())
                return step.exit_code
            if step is None:
                break
            if step.forget_learned and self._keys is not None:
                learned.LearnedStore(self.state_dir).drop(self._keys.flags)
            if step.delay:
                self.report.backoff_until = time.time() + step.delay
                command = await self._next_command(step.delay)
                self.report.backoff_until = None
                if command is not None:
                    step = s.restart(bool(command[1].get("reset"))) if command[0] == "restart" else None
                    continue
            flags, dropped = s.launching()
            for text in dropped:
                log.warning(text)
            step = s.ended(await self._launch(flags))
            if isinstance(step, Launch):
                self.report.relaunch(s.launches + 1, step)
                s.gpu_observed(await gpus.released())
        self.exit_reason = "stopped on request"
        return 0

    async def _next_command(self, delay: float) -> tuple[str, dict[str, Any]] | None:
        """Wait ``delay`` seconds, or until a command (stop, restart) comes; return it."""
        try:
            return await asyncio.wait_for(self._control.get(), timeout=delay)
        except TimeoutError:
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
        outcome = await self._watch(flags)
        self.report.ended(outcome, self._watcher.classifier.numbers if self._watcher is not None else {})
        self.child = None
        return outcome

    async def _watch(self, flags: Flags) -> Outcome:
        s, gpus, c = self.session, self.gpus, self.cfg
        assert s is not None and gpus is not None
        n, argv = s.launches, c.launch_argv(flags)
        self.output.launch(n, self.report.launching(n, argv, s.notes))
        self._watcher = None
        self.progress = self.report.progress = Progress(n, time.time())
        taken = await asyncio.to_thread(port_taken, self.host, self.port, self.state_dir)
        if taken is not None:
            return Outcome(FAILED, taken)
        while not self._control.empty():          # stale requests do not apply to a new launch
            if self._control.get_nowait()[0] == "stop":
                return Outcome(STOPPED)
        marker = f"{procs.state_id(self.state_dir)}:{n}"
        prober = Prober(self.host, self.port, flags.get("--served-model-name") or c.model,
                        api_key=flags.get("--api-key") or self.environ.get("VLLM_API_KEY"), timeout=c.health.timeout,
                        identity=lambda port, client: answered_by(child.leader, marker, port, client))
        hooks = LaunchHooks(on_lines=self._on_lines, on_healthy=self._on_healthy, on_probe=self.report.probe,
                            on_unhealthy=s.unhealthy, on_recovered=s.recovered)
        env = procs.child_env(sdnotify.child_environment(self.environ), self.state_dir, n)
        run_argv, moved = secrets_to_environ(argv, env)     # out of `ps`: into vLLM's own environment
        env.update(moved)
        self._warn_visible_secrets(run_argv)
        self.child = child = Child(run_argv, env, lambda line, stream: None, state_dir=self.state_dir)
        bounds = s.check_auto_fit if flags.auto_length() else None      # asked per line: only where it applies
        self._watcher = watcher = Watcher(child, prober, LaunchTimers.of(c), hooks, self._control,
                                          bounds=bounds, hurry=self._hurry, clean=self.output.mask_lines,
                                          progress=self.progress)
        child.on_lines = watcher.lines
        try:
            async with gpus.turn(c.startup_timeout) as ours:
                if not ours:
                    return Outcome(STOPPED)
                # Again: another guard's vLLM may have bound the port while this one waited its turn.
                taken = await asyncio.to_thread(port_taken, self.host, self.port, self.state_dir)
                if taken is not None:
                    return Outcome(FAILED, taken)
                try:
                    await child.start()
                except OSError as e:
                    cannot = f"cannot run {argv[0]}: {e}"
                    return Outcome(FAILED, Diagnosis(Kind.CONFIG_ERROR, evidence=cannot, detail=(
                        f"{cannot}; point vllm_command (--vllm-command, VLLM_GUARD_VLLM_COMMAND) at vLLM's command")))
                self.report.history.started_process(child.pid)
                return await watcher.run()
        finally:
            await prober.aclose()

    def _warn_visible_secrets(self, argv: list[str]) -> None:
        """Once: secret values that must stay on vLLM's command line can be read by every local user."""
        if self._warned_visible or not argv_secrets(argv):
            return
        self._warned_visible = True
        log.warning("vLLM's command line holds secret values (several API keys, or a secret flag vLLM "
                    "reads nowhere else); every local user can read a command line (ps). Give one API key (the "
                    "guard then passes it in VLLM_API_KEY), or mount /proc with hidepid=2")

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
        self.output.close()
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
                if not self._hurry.is_set() and self._vllm_running():
                    log.warning("asked to stop again: killing vLLM now")
                self._hurry.set()           # asked twice: do not wait for vLLM's grace
            else:
                self._stopping(args.get("signal"))
            self._stop.set()
        self._control.put_nowait((cmd, args))

    def _vllm_running(self) -> bool:
        return self.child is not None and self.child.pid is not None and self.child.returncode is None

    def _stopping(self, sig: Any) -> None:
        """The first stop: say what happens now, for how long, and how to cut it short."""
        again = ("Ctrl-C again" if sig == signal.SIGINT else
                 "`vllm-guard stop` again" if sig is None else "a second stop signal")
        self._stop_asked = (time.monotonic(), again)
        why = "asked over the status endpoint" if sig is None else f"{signal.Signals(sig).name}"
        if self._vllm_running():
            log.warning(f"stopping vLLM (up to {self.cfg.stop_grace:g} s; {again} to kill now) [{why}]")
        else:
            log.info(f"stopping [{why}]")
        self._refresh(force=True)

    def _on_lines(self, lines: list[bytes], stream: str) -> None:
        self.output.lines(lines, stream)
        self.report.vllm_lines(lines)

    def _on_state(self, state: State, why: str) -> None:
        log.debug("state", state=state.value, why=why)
        self.report.metrics.set_state(state.value)
        self._tell_systemd(state.value, force=True)

    def _on_healthy(self, seconds: float) -> None:
        s, w, gpus = self.session, self._watcher, self.gpus
        assert s is not None and w is not None and gpus is not None
        gpus.release_turn()      # the next vLLM on this GPU may start profiling now
        healthy = s.healthy(w.classifier.numbers, seconds)
        self.report.healthy(s, seconds, w.classifier.numbers)
        if healthy.learn is not None and self._keys is not None:
            # Best effort (a full disk is one warning): the store is an optimisation for the next start.
            store = learned.LearnedStore(self.state_dir)
            meta = {"model": self.cfg.model, "vllm_version": s.vllm_version}
            store.put(self._keys.flags, healthy.learn, healthy.reasons, meta)
            if healthy.measured is not None:
                store.put_measured(self._keys.measured, healthy.measured.to_dict(), meta)

    async def _watchdog(self) -> None:
        """WATCHDOG=1 from the loop itself: a wedged loop stops pinging and systemd restarts us."""
        next_ping = 0.0
        while True:
            now = time.monotonic()
            self._heartbeat = now
            self._refresh()
            interval = self.notifier.watchdog_interval()
            if interval and now >= next_ping:
                self.notifier.watchdog()
                next_ping = now + interval
            await asyncio.sleep(min(interval or 1.0, 1.0))

    def _refresh(self, force: bool = False) -> None:
        """Once a second: the live line and systemd's STATUS= follow the launch's progress."""
        if self.session is None:
            return
        s = self.session
        progress = self.progress.to_dict(time.time()) if self.progress is not None else None
        if self.live is not None:
            stopping = ""
            if self._stop_asked is not None:
                since, again = self._stop_asked
                stopping = (f"stopping vLLM, {seconds_text(time.monotonic() - since)} of up to "
                            f"{self.cfg.stop_grace:g} s ({again} to kill now)"
                            if self._vllm_running() and not self._hurry.is_set() else "stopping")
            self.live.update(render(s.state.value, progress, {k: v.value or "" for k, v in s.notes.items()},
                                    stopping=stopping), force=force)
        self._tell_systemd(s.state.value)

    def _tell_systemd(self, state: str, force: bool = False) -> None:
        """STATUS= with the phase, elapsed time, vLLM's URL and the last failure: on each change of state or
        phase, and every 5 s while a launch starts (the elapsed time)."""
        if not self.notifier.enabled:
            return
        progress = self.progress.to_dict(time.time()) if self.progress is not None else None
        text = summary(state, progress, self.report.url(), last_failure(self.report.history.records),
                       (self.report.context or {}).get("served"))
        told, at = self._told
        def head(t: str) -> list[str]:       # the state and phase, without the seconds
            return t.split(", ", 2)[:2]

        if text != told and (force or head(text) != head(told) or time.monotonic() - at >= 5.0):
            self.notifier.status(text)
            self._told = (text, time.monotonic())

    # -- what the status endpoint serves ------------------------------------------------------
    def alive(self) -> bool:
        """For /healthz: the loop turned within the last 30 s."""
        return time.monotonic() - self._heartbeat < 30.0

    def ready(self) -> bool:
        return self.session is not None and self.session.state is State.HEALTHY

    def snapshot(self) -> dict[str, Any]:
        return self.report.status(self.session, pid=self.child.pid if self.child is not None else None,
                                  gpus=self.gpus.snapshot if self.gpus else [], exit_reason=self.exit_reason,
                                  numbers=self._watcher.classifier.numbers if self._watcher is not None else {})


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
