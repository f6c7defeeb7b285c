"""What the guard tells, in one place: its log, ``history.jsonl``, the metrics, the webhook, and the
``GET /status`` document built from them.

The guard calls one method per event (a launch starts, ends, serves, is replaced, the guard gives
up); each method sends that event everywhere it belongs, in the same words, so the log line, the
history record, the metric and the webhook's text never disagree.
"""

from __future__ import annotations

import collections
import os
import shlex
import time
from collections.abc import Mapping
from typing import Any

import structlog

from supervisor.config import GuardConfig
from supervisor.core import picture, vllm
from supervisor.core.exits import describe
from supervisor.core.flags import UTILIZATION, Flags
from supervisor.core.lifecycle import State
from supervisor.core.progress import Progress, last_failure, probe_text, summary
from supervisor.core.session import DIED, FAILED, End, FlagNote, Launch, Outcome, Session
from supervisor.secrets import REGISTRY
from supervisor.shell.history import History, run_id
from supervisor.shell.metrics import Metrics
from supervisor.shell.probe import ProbeResult, probe_host
from supervisor.shell.webhook import Webhook

log = structlog.get_logger("vllm-guard")

RECENT_LINES = 200          # vLLM's last lines kept in memory for /status and the page
RECENT_LINE_CHARS = 2000


def _notes(notes: dict[str, FlagNote]) -> dict[str, dict[str, Any]]:
    return {k: {"value": v.value, "requested": v.was, "why": v.text, "source": v.source} for k, v in notes.items()}


def _change(flag: str, old: str | None, new: str | None) -> str:
    return f"{flag} {'(unset)' if old is None else old} -> {new or '(on)'}"


class Report:
    """The guard's events, told to the log, the history, the metrics and the webhook."""

    def __init__(self, cfg: GuardConfig, state_dir: str, webhook: Webhook | None = None) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.history = History(state_dir, model=cfg.model, run_id=run_id())
        self.webhook = webhook or Webhook(cfg.notify_url, model=cfg.model, on_result=self.metrics.webhook)
        self.started_wall, self.started = time.time(), time.monotonic()
        self.context: dict[str, int | None] = {}
        self.healthy_since: float | None = None
        self.backoff_until: float | None = None
        self.last_probe: ProbeResult | None = None
        self.last_probe_at: float | None = None
        self.progress: Progress | None = None      # the current launch's (the guard sets it per launch)
        self.recent: collections.deque[str] = collections.deque(maxlen=RECENT_LINES)
        self._plan_picture: tuple[tuple[str, ...], dict[str, Any] | None] | None = None
        gave_up = self.history.last_gave_up()
        if gave_up:
            self.metrics.gave_up(gave_up)

    # -- events ---------------------------------------------------------------------------------
    def launching(self, n: int, argv: list[str], notes: dict[str, FlagNote]) -> str:
        """Launch ``n`` starts; returns its command line as shown (secrets masked)."""
        shown = shlex.join(REGISTRY.argv(argv))
        self.history.started(n, argv, _notes(notes))
        log.info(f"launch {n}: {shown}", launch=n)
        return shown

    def ended(self, outcome: Outcome, numbers: dict[str, Any]) -> None:
        """The current launch ended: how, with vLLM's numbers (its diagnosis when it failed or died)."""
        d, record = outcome.diagnosis, self.history.current
        n = record["n"] if record else 0
        exit_text = describe(outcome.exit_code) if outcome.exit_code is not None else ""
        if exit_text and outcome.stopped:
            exit_text = f"stopped by the guard ({exit_text})"
        self.healthy_since = None
        if outcome.end in (FAILED, DIED):
            how = "died" if outcome.end == DIED else "failed"
            self.history.ended(how, kind=d.kind.value, evidence=d.evidence, phase=d.phase,
                               numbers={**numbers, **d.numbers}, exit_code=outcome.exit_code, exit_text=exit_text)
            text = f"launch {n} {how}: {d.kind}: {d.evidence[:300]}"
            log.warning(text, launch=n, kind=d.kind.value, phase=d.phase, exit=exit_text or None)
            self.webhook.event("died" if outcome.end == DIED else "launch_failed", text, kind=d.kind.value,
                               launch=n, phase=d.phase, evidence=d.evidence[:500], exit_code=outcome.exit_code)
        else:
            self.history.ended(outcome.end, numbers=numbers, exit_code=outcome.exit_code, exit_text=exit_text)
        self.metrics.launch_finished(record["outcome"] if record else outcome.end,
                                     (record or {}).get("kind") or "none", time.time())

    def relaunch(self, n: int, step: Launch) -> None:
        """Launch ``n`` will be made with ``step``'s flags, for ``step``'s reason."""
        self.metrics.relaunched(step.reason)
        changes = [{"flag": c.flag, "was": c.old, "now": c.new, "why": c.why} for c in step.changes]
        self.webhook.event("relaunch", f"relaunch {n} ({step.reason}): " + (
            "; ".join(_change(c.flag, c.old, c.new) for c in step.changes) or "the same flags"),
            kind=step.reason, launch=n, changes=changes, delay_s=round(step.delay, 1))
        wait = f" after a {step.delay:.1f} s backoff" if step.delay else ""
        if step.reason in ("request", "reset", "learned_failed"):
            (log.warning if step.reason == "learned_failed" else log.info)(step.why, launch=n, kind=step.reason)
        elif not step.changes:
            log.warning(f"relaunch {n} with the same flags{wait}: {step.why}", launch=n, kind=step.reason,
                        backoff_s=round(step.delay, 1))
        else:
            parts = [_change(c.flag, c.old, c.new) for c in step.changes]
            text = f"{parts[0]} because {step.why}" if len(parts) == 1 else "; ".join(
                f"{p} ({c.why})" for p, c in zip(parts, step.changes, strict=True))
            log.warning(f"relaunch {n}{wait}: {text}", launch=n, kind=step.reason,
                        changed=[c.flag for c in step.changes], backoff_s=round(step.delay, 1))

    def healthy(self, s: Session, seconds: float, numbers: dict[str, Any]) -> None:
        """The current launch answered a chat completion ``seconds`` after it started."""
        self.healthy_since = time.time()
        self.history.healthy(seconds, numbers)
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

    def gave_up(self, end: End, holders: str) -> str:
        """The guard stops supervising; returns the last message (with who holds the GPU, if known)."""
        msg = end.message + (f" GPU memory is held by: {holders}." if holders else "")
        kind = end.kind.value if end.kind else None
        log.error(msg, exit_code=end.exit_code, kind=kind)
        self.history.gave_up(msg, end.exit_code, kind)
        self.metrics.gave_up(time.time())
        self.webhook.event("gave_up", msg, kind=kind, exit_code=end.exit_code)
        return msg

    def vllm_lines(self, lines: list[bytes]) -> None:
        """(Masked) lines of vLLM's output, the last of them kept for /status and the page."""
        self.recent.extend(line.decode("utf-8", "replace")[:RECENT_LINE_CHARS] for line in lines[-RECENT_LINES:])

    def probe(self, r: ProbeResult) -> None:
        self.last_probe, self.last_probe_at = r, time.time()
        if not r.refused:
            self.metrics.probe(r.ok, r.latency)

    # -- the status document ----------------------------------------------------------------------
    def url(self) -> str:
        """Where vLLM answers (its OpenAI API), as a client on this host reaches it."""
        host, port = self.cfg.endpoint()
        return f"http://{probe_host(host)}:{port}"

    def status(self, s: Session | None, *, pid: int | None, gpus: list[Any], exit_reason: str,
               numbers: Mapping[str, Any] | None = None, recent: int = 60) -> dict[str, Any]:
        """The ``GET /status`` document (secrets redacted by the server and here)."""
        cfg, now = self.cfg, time.time()
        current: Flags = s.current if s is not None else cfg.requested_flags()
        host, port = cfg.endpoint()
        state = s.state.value if s is not None else State.PLANNING.value
        progress = self.progress.to_dict(now) if self.progress is not None else None
        failure = last_failure(self.history.records)
        url = self.url()
        last_probe = None
        if self.last_probe is not None:
            last_probe = {**self.last_probe.to_dict(), "at": self.last_probe_at,
                          "text": probe_text(self.last_probe.to_dict(), state,
                                             progress["elapsed_s"] if progress else None)}
        return {
            "state": state,
            "summary": summary(state, progress, url, failure, (self.context or {}).get("served")),
            "model": cfg.model,
            "served_model_name": current.get("--served-model-name") or cfg.model,
            "pid": pid,
            "guard_pid": os.getpid(),
            "vllm": {"host": host, "port": port, "version": s.vllm_version if s else None, "url": url},
            "progress": progress,
            "last_failure": failure,
            "argv": REGISTRY.argv(cfg.launch_argv(current)),
            "requested_args": REGISTRY.argv(list(cfg.vllm_args)),
            "changed_flags": _notes(s.notes) if s is not None else {},
            "flags_source": s.flags_source if s else "user",
            "launches": [dict(r) for r in self.history.records],
            "restarts": s.restarts if s else 0,
            "crash_loop": {**(s.crash_loop() if s else {}), "backoff_until": self.backoff_until},
            "last_probe": last_probe,
            "uptime_s": round(now - self.started_wall, 1),
            "healthy_for_s": round(now - self.healthy_since, 1) if self.healthy_since else None,
            "context": context_text(self.context) if self.context else None,
            "memory": self.memory(s, numbers or {}),
            "gpu": gpus,
            "recent_output": list(self.recent)[-recent:] if recent > 0 else [],
            "exit_reason": exit_reason or None,
        }

    def memory(self, s: Session | None, numbers: Mapping[str, Any]) -> dict[str, Any]:
        """One rank's GPU memory: as the plan expected it at the current flags, and as vLLM printed it."""
        if s is None or s.facts.platform == "cpu":
            return {"plan": None, "vllm": None}
        key = tuple(s.current.argv())
        if self._plan_picture is None or self._plan_picture[0] != key:
            try:
                drawn = picture.planned(s.sizing, s.current, total_gib=s.facts.total_gib, free_gib=s.facts.free_gib,
                                        served_len=(self.context or {}).get("served"))
            except Exception:      # the picture is for people; a gap in it must not take /status down
                log.debug("plan picture failed", exc_info=True)
                drawn = None
            self._plan_picture = (key, drawn)
        util = vllm.utilization(s.vllm_version, s.current, s.facts.platform)
        return {"plan": self._plan_picture[1],
                "vllm": picture.printed(numbers, total_gib=s.facts.total_gib, utilization=util)}


def context_text(context: dict[str, int | None]) -> dict[str, Any]:
    """The context served, next to what was asked and what fit, with a sentence for people."""
    served, requested, fit = context.get("served"), context.get("requested"), context.get("fit")
    text = f"context served {served}" if served else "context served: vLLM's default"
    if fit:
        text += f" of {fit} that fit"
    if requested and served and served < requested:
        text += f" ({requested} asked)"
    return {**context, "text": text}
