"""One launch of vLLM, watched to its end: failed start, healthy then died, hung, or stopped by us.

The shell around :class:`supervisor.shell.child.Child`: feeds every line to the classifier, probes
health without ever blocking the loop, notices a dead engine process while the API server
lingers, and applies the start-up, stall and collection deadlines. It reports how the launch
ended as an :class:`~supervisor.core.session.Outcome`; what to do next is the session's decision.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.config import GuardConfig
from supervisor.core import exits
from supervisor.core.classifier import Classifier, place
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.progress import Progress
from supervisor.core.session import DIED, FAILED, RESET, RESTART, STOPPED, Outcome
from supervisor.shell import procs
from supervisor.shell.child import Child
from supervisor.shell.probe import Prober, ProbeResult

#: While serving, how long the lines after an engine's loss are collected before the launch is stopped.
LOST_COLLECT_S = 0.2
#: How long what is left of a launch whose engine died while serving gets before SIGKILL: nothing it
#: could still finish (no request completes without its engine), and its teardown (seconds of Python
#: and native destructors) would come before serving again.
DEAD_GRACE_S = 0.5

#: Checks vLLM's own choices against the guard's bounds (the session's ``check_auto_fit``).
Bounds = Callable[[Mapping[str, Any], str], "Diagnosis | None"]


def port_taken(host: str, port: int, state_dir: str) -> Diagnosis | None:
    """vLLM's port is not free: a config error when another process holds it (a person must act), a
    retried one when it is this guard's previous vLLM, still exiting."""
    holder = procs.port_holder(host, port, ours=procs.state_id(state_dir))
    if holder is not None:
        return Diagnosis(Kind.CONFIG_ERROR, evidence=holder, phase="launching",
                         detail=f"{holder}; stop it or give vLLM another --port")
    if procs.port_holder(host, port) is not None:
        return Diagnosis(Kind.CONFIG_ERROR, evidence=f"OSError: [Errno 98] Address already in use: port {port} "
                         "is still held by this guard's previous vLLM", phase="launching",
                         detail=f"port {port} is still held by this guard's previous vLLM")
    return None


@dataclass
class LaunchTimers:
    startup_timeout: float
    stall_timeout: float
    collect_after_fatal: float
    health_interval: float
    health_failures: int
    stop_grace: float
    startup_probe_interval: float = 1.0
    engine_watch_interval: float = 1.0

    @classmethod
    def of(cls, cfg: GuardConfig) -> LaunchTimers:
        return cls(cfg.startup_timeout, cfg.stall_timeout, cfg.collect_after_fatal, cfg.health.interval,
                   cfg.health.failures, cfg.stop_grace)


@dataclass
class LaunchHooks:
    """Callbacks into the guard (all synchronous, cheap)."""

    on_lines: Callable[[list[bytes], str], object] = lambda lines, stream: None
    on_healthy: Callable[[float], None] = lambda seconds: None
    on_probe: Callable[[ProbeResult], None] = lambda r: None
    on_unhealthy: Callable[[str], None] = lambda why: None
    on_recovered: Callable[[], None] = lambda: None


@dataclass
class Watcher:
    child: Child
    prober: Prober
    timers: LaunchTimers
    hooks: LaunchHooks
    control: asyncio.Queue[tuple[str, dict[str, Any]]]
    classifier: Classifier = field(default_factory=lambda: Classifier(live=True))   # vLLM's own pipes
    first_fatal: Diagnosis | None = None
    fatal_at: float | None = None
    last_output: float = field(default_factory=time.monotonic)
    bounds: Bounds | None = None
    hurry: threading.Event | None = None    # set by a second stop request: SIGKILL without the grace
    clean: Callable[[list[bytes]], list[bytes]] | None = None   # masks secrets in the lines of a read
    progress: Progress | None = None        # where the launch is, in words (fed here, read by the guard)

    def __post_init__(self) -> None:
        self._grace_phase: str | None = None
        self._nudge = asyncio.Event()
        self._ready_hint = False
        self._lost: list[int] = []
        self._lost_at: float | None = None
        self._probed_fatal = False
        self._own_fatal: Diagnosis | None = None

    def lines(self, lines: list[bytes], stream: str) -> None:
        """The lines of one read of vLLM's ``stream``: masked, kept and shown, then classified one by one."""
        self.last_output = time.monotonic()
        if self.clean is not None:
            lines = self.clean(lines)     # secrets out before anything keeps or shows the lines
        self.hooks.on_lines(lines, stream)
        classifier, progress = self.classifier, self.progress
        for line in lines:
            d = classifier.feed(line)
            if progress is not None:
                progress.line(line, classifier.phase)
            # (a busy server's lines, once it serves, decide nothing: skip the call)
            if d is not None or self._grace_phase is not None or not self._ready_hint or self.bounds is not None:
                self._decide(d)

    def _decide(self, d: Diagnosis | None) -> None:
        """After one line: a first fatal verdict, a grace that ended, serving reached, vLLM's bounds."""
        if d is not None and self.first_fatal is None:
            self.first_fatal = d
            # A failure vLLM only warns about and then waits on (a Ray placement group short of
            # GPUs while nodes may still be joining) is acted on after its grace, unless the
            # start-up moves on meanwhile.
            grace = d.numbers.get("grace_s")
            self._grace_phase = self.classifier.phase if grace else None
            self.fatal_at = time.monotonic() + (float(grace) if isinstance(grace, (int, float)) else 0.0)
            self._nudge.set()
        elif (self._grace_phase is not None and self.classifier.phase != self._grace_phase
              and self.first_fatal is not None and self.fatal_at is not None and time.monotonic() < self.fatal_at):
            self.first_fatal = self.fatal_at = self._grace_phase = None     # it got its GPUs after all
        elif not self._ready_hint and self.classifier.serving:
            self._ready_hint = True      # "Application startup complete.": probe now, not later
            self._nudge.set()
        if self.bounds is not None and self.first_fatal is None:
            self._check_bounds(self.bounds)

    def _check_bounds(self, bounds: Bounds) -> None:
        """``--max-model-len auto`` has no bounds of its own: hold vLLM's choice to the guard's."""
        d = bounds(self.classifier.numbers, self.classifier.phase)
        if d is None:
            return
        self.first_fatal = self._own_fatal = d
        self.fatal_at = time.monotonic() - self.timers.collect_after_fatal   # act now
        self._nudge.set()

    def _foreign(self, r: ProbeResult) -> None:
        """The probe's 200 came from another process on vLLM's port: this launch cannot serve there."""
        d = Diagnosis(Kind.CONFIG_ERROR, evidence=r.error, phase=self.classifier.phase,
                      detail=f"{r.error}; stop it or give vLLM another --port")
        self.first_fatal = self._own_fatal = d
        self.fatal_at = time.monotonic() - self.timers.collect_after_fatal   # act now
        self._nudge.set()

    async def run(self) -> Outcome:
        t = self.timers
        started = time.monotonic()
        exit_task = asyncio.ensure_future(self.child.wait())
        nudge_task = asyncio.ensure_future(self._nudge.wait())
        control_task: asyncio.Future[Any] = asyncio.ensure_future(self.control.get())
        probe_task: asyncio.Task[ProbeResult] | None = None
        healthy_at: float | None = None
        next_probe = started + t.startup_probe_interval
        next_engine_check = next_noted = 0.0
        failures = 0
        try:
            while True:
                now = time.monotonic()
                # -- our own commands first: a stop must never wait for anything else --
                if control_task.done():
                    cmd, args = control_task.result()
                    end = STOPPED if cmd == "stop" else (RESET if args.get("reset") else RESTART)
                    code = await self.child.stop(t.stop_grace, self.hurry)
                    return self._result(end, Diagnosis(Kind.HEALTHY, detail=f"{cmd} requested"),
                                        healthy_at, started, code, stopped=True)
                # -- the process exited (any code: vLLM exits 0 after its engine dies) --
                if exit_task.done():
                    code = exit_task.result()
                    await self.child.drain()
                    # its engine/workers may linger; after serving, nothing of it is worth waiting for
                    await self.child.stop(self._grace(healthy_at), self.hurry)
                    return self._ended(code, healthy_at, started, exits.describe(code))
                # -- a fatal line: collect what follows briefly, then stop without waiting --
                # (While serving, a fatal-looking line alone does not end a launch that still
                # answers: the exit, a lost engine process or failed probes decide.)
                collected = self._collected_by(healthy_at)
                if collected is not None and now >= collected:
                    code = await self.child.stop(self._grace(healthy_at), self.hurry)
                    return replace(self._ended(code, healthy_at, started, "fatal error"), stopped=True)
                # -- probes: one at a time, never blocking this loop --
                if probe_task is not None and probe_task.done():
                    r = probe_task.result()
                    probe_task = None
                    self.hooks.on_probe(r)
                    if self.progress is not None:
                        self.progress.probed(r.status is not None)
                    if r.ok:
                        if healthy_at is None:
                            healthy_at = time.monotonic()
                            self.child.remember_tree()
                            if self.progress is not None:
                                self.progress.healthy(healthy_at - started)
                            self.hooks.on_healthy(healthy_at - started)
                        elif failures:
                            self.hooks.on_recovered()
                        failures = 0
                    elif r.foreign and healthy_at is None and self.first_fatal is None:
                        self._foreign(r)          # another server answers on vLLM's port: end this launch now
                    elif healthy_at is not None:
                        failures += 1
                        self.hooks.on_unhealthy(r.error or f"HTTP {r.status}")
                        if failures >= t.health_failures:
                            code = await self.child.stop(t.stop_grace, self.hurry)
                            d = self._verdict(code, healthy=True) if self.first_fatal else Diagnosis(
                                Kind.ENGINE_DEAD,
                                evidence=f"{failures} health probes failed in a row: {r.error}",
                                phase="serving",
                                detail="vLLM is alive but does not answer (hung)")
                            return Outcome(DIED, d, True, time.monotonic() - healthy_at, code, stopped=True)
                    next_probe = time.monotonic() + (
                        t.health_interval if healthy_at is not None else t.startup_probe_interval)
                if healthy_at is not None and self.fatal_at is not None and not self._probed_fatal:
                    self._probed_fatal = True      # a fatal line while serving: probe and look at the engine now
                    next_probe = next_engine_check = now
                if probe_task is None and now >= next_probe and (
                        self.fatal_at is None or healthy_at is not None):
                    probe_task = asyncio.ensure_future(self.prober.probe())
                # -- the launch's processes on record; a lost engine process while the API server lingers --
                if now >= next_noted:
                    next_noted = now + t.engine_watch_interval
                    self.child.note_descendants()
                if healthy_at is not None and now >= next_engine_check:
                    next_engine_check = now + t.engine_watch_interval
                    lost = self.child.lost_processes()
                    if lost and not self._lost:
                        self._lost, self._lost_at = lost, now
                        if self.fatal_at is None:
                            self.fatal_at = now
                # -- start-up deadlines --
                if healthy_at is None:
                    if now - started > t.startup_timeout:
                        code = await self.child.stop(t.stop_grace, self.hurry)
                        return replace(self._timeout(code, started, f"not healthy within {t.startup_timeout:g} s"),
                                       stopped=True)
                    if now - self.last_output > t.stall_timeout:
                        code = await self.child.stop(t.stop_grace, self.hurry)
                        why = f"no output for {t.stall_timeout:g} s while starting"
                        return replace(self._timeout(code, started, why), stopped=True)
                waits = [exit_task, nudge_task, control_task]
                if probe_task is not None:
                    waits.append(probe_task)
                await asyncio.wait(waits, timeout=self._tick(now, next_probe, healthy_at),
                                   return_when=asyncio.FIRST_COMPLETED)
                if nudge_task.done():
                    self._nudge.clear()
                    nudge_task = asyncio.ensure_future(self._nudge.wait())
                    if self._ready_hint and healthy_at is None:
                        next_probe = min(next_probe, time.monotonic())
        finally:
            for task in (nudge_task, control_task, probe_task):
                if task is not None and not task.done():
                    task.cancel()
            if not exit_task.done():
                exit_task.cancel()

    def _grace(self, healthy_at: float | None) -> float:
        """SIGTERM to SIGKILL for what is left of a launch: ``stop_grace``, or :data:`DEAD_GRACE_S` after serving."""
        return self.timers.stop_grace if healthy_at is None else min(self.timers.stop_grace, DEAD_GRACE_S)

    def _collected_by(self, healthy_at: float | None) -> float | None:
        """When the lines after a fatal one have been collected and the launch is stopped (None: not yet
        due). Starting up: ``collect_after_fatal`` after the first fatal line. Serving: only once the
        engine process is gone, and then briefly (:data:`LOST_COLLECT_S`): vLLM printed why before the
        loss was seen, and every second here is a second more before it serves again."""
        if self.fatal_at is None:
            return None
        if healthy_at is None:
            return self.fatal_at + self.timers.collect_after_fatal
        if self._lost_at is None:
            return None
        return self._lost_at + min(self.timers.collect_after_fatal, LOST_COLLECT_S)

    def _tick(self, now: float, next_probe: float, healthy_at: float | None) -> float:
        deadlines = [next_probe - now, 1.0]
        collected = self._collected_by(healthy_at)
        if collected is not None:
            deadlines.append(collected - now)
        return max(0.01, min(deadlines))

    def _verdict(self, code: int | None, ours: bool = True, healthy: bool = False) -> Diagnosis:
        """The classifier's verdict; the exit status counts only when vLLM exited by itself. A failure
        the log does not place (an OOM with no frames, no milestone) is placed where the live stream
        was: serving once a probe answered, else the last milestone it printed."""
        d = self.classifier.diagnose(None if ours else code)
        if not d.names_a_failure and self._own_fatal is not None:
            return self._own_fatal       # our own auto-fit bounds, not a vLLM failure
        return place(d, "serving" if healthy else self.classifier.phase)

    def _ended(self, code: int | None, healthy_at: float | None, started: float,
               how: str) -> Outcome:
        d = self._verdict(code, ours=False, healthy=healthy_at is not None)
        lost = self._lost
        if not d.names_a_failure:   # nothing in the log explains it
            phase = "serving" if healthy_at is not None else self.classifier.phase
            if lost:
                evidence = f"engine process(es) {', '.join(map(str, lost))} exited while serving"
            else:
                evidence = f"{how}" + (" while serving" if healthy_at is not None
                                       else " before becoming healthy")
            hint = exits.hint(code)
            d = Diagnosis(Kind.ENGINE_DEAD, evidence=evidence, numbers=dict(d.numbers), phase=phase,
                          detail="the engine died without a message" + (f" ({hint})" if hint else ""))
        if healthy_at is not None:
            return Outcome(DIED, d, True, time.monotonic() - healthy_at, code)
        return Outcome(FAILED, d, False, 0.0, code)

    def _timeout(self, code: int | None, started: float, why: str) -> Outcome:
        d = self._verdict(code)
        if not d.names_a_failure:
            d = Diagnosis(Kind.ENGINE_DEAD, evidence=why, numbers=dict(d.numbers),
                          phase=self.classifier.phase, detail=f"vLLM hung while starting: {why}")
        return Outcome(FAILED, d, False, 0.0, code)

    def _result(self, end: str, d: Diagnosis, healthy_at: float | None, started: float,
                code: int | None, stopped: bool = False) -> Outcome:
        healthy_for = time.monotonic() - healthy_at if healthy_at is not None else 0.0
        return Outcome(end, d, healthy_at is not None, healthy_for, code, stopped)
