"""What the guard did, kept: one record per launch in memory (for ``/status``) and as JSON lines in
the state dir (``history.jsonl``), so ``vllm-guard history`` shows last night's failures after the
guard has stopped.

The file is append-only and bounded: past ``MAX_BYTES`` it is rotated to ``history.jsonl.1`` (one
generation kept). A record is written when a launch becomes healthy and again when it ends; the
reader keeps the last record of each launch. Secrets never reach it (argv and evidence are
redacted before they are recorded). The file goes through the state-file door
(:class:`~supervisor.shell.statelog.AppendLog`): a write the disk refuses is logged once and tried
again with the next record; the records in memory (``/status``) are whole whatever the disk does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from supervisor.secrets import REGISTRY
from supervisor.shell.statelog import AppendLog, read_lines

HISTORY_FILE = "history.jsonl"
MAX_BYTES = 4 << 20            # rotated past this (one older generation kept)
KEEP_IN_MEMORY = 50

#: Numbers vLLM prints about the KV cache it sized, recorded with each launch.
MEASURED = ("kv_cache_tokens", "kv_available_gib", "num_gpu_blocks", "auto_fit_max_model_len",
            "served_max_model_len", "model_loading_gib", "block_size")


class History:
    """The launches of this guard run; ``path`` None keeps them in memory only."""

    def __init__(self, state_dir: str | None, *, model: str, run_id: str) -> None:
        self.records: list[dict[str, Any]] = []
        self.path = Path(state_dir) / HISTORY_FILE if state_dir else None
        self._file = AppendLog(self.path, MAX_BYTES, retry_s=0.0) if self.path is not None else None
        self.model, self.run_id = model, run_id

    @property
    def current(self) -> dict[str, Any] | None:
        return self.records[-1] if self.records else None

    def started(self, n: int, argv: list[str], changed: dict[str, Any]) -> dict[str, Any]:
        """A launch begins: its number, redacted argv and the flags changed from the user's, with why."""
        record: dict[str, Any] = {
            "run": self.run_id, "model": self.model, "n": n, "argv": REGISTRY.argv(argv),
            "changed_flags": changed, "started_at": time.time(), "ended_at": None, "outcome": "running",
            "pid": None, "kind": None, "evidence": None, "phase": None, "exit_code": None, "exit": None,
            "time_to_healthy_s": None, "measured": {}}
        self.records.append(record)
        del self.records[:-KEEP_IN_MEMORY]
        return record

    def started_process(self, pid: int | None) -> None:
        """The launch's process is running: its pid."""
        if self.current is not None:
            self.current["pid"] = pid

    def healthy(self, seconds: float, numbers: dict[str, Any]) -> None:
        record = self.current
        if record is None:
            return
        record.update(outcome="healthy", time_to_healthy_s=round(seconds, 1), measured=_measured(numbers))
        self._write(record)

    def ended(self, outcome: str, *, kind: str | None = None, evidence: str = "", phase: str | None = None,
              numbers: dict[str, Any] | None = None, exit_code: int | None = None, exit_text: str = "") -> None:
        record = self.current
        if record is None:
            return
        record.update(ended_at=time.time(), outcome=outcome, exit_code=exit_code, exit=exit_text or None)
        if kind is not None:
            record.update(kind=kind, evidence=REGISTRY.text(evidence), phase=phase,
                          numbers={k: v for k, v in (numbers or {}).items() if not isinstance(v, (dict, list))})
        if numbers:
            record["measured"] = {**record["measured"], **_measured(numbers)}
        self._write(record)

    def gave_up(self, message: str, exit_code: int, kind: str | None) -> None:
        """This guard gave up: kept so the next guard (and its metrics) know when."""
        self._write({"run": self.run_id, "model": self.model, "n": None, "event": "gave_up", "at": time.time(),
                     "exit_code": exit_code, "kind": kind, "message": REGISTRY.text(message)})

    def last_gave_up(self) -> float | None:
        """When a guard on this state dir last gave up (Unix time), from the file; None: never."""
        if self.path is None:
            return None
        times = [r["at"] for r in read(str(self.path.parent)) if r.get("event") == "gave_up"
                 and isinstance(r.get("at"), (int, float))]
        return max(times) if times else None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(REGISTRY.obj(record), default=str).encode("utf-8", "replace"))
        self._file.flush()          # one record at a time: a torn file keeps every whole line before it

    def close(self) -> None:
        """Let go of the file (what is buffered is written, best effort)."""
        if self._file is not None:
            self._file.close()


def _measured(numbers: dict[str, Any]) -> dict[str, Any]:
    return {k: numbers[k] for k in MEASURED if numbers.get(k) is not None}


def read(state_dir: str) -> Iterator[dict[str, Any]]:
    """Every launch recorded in ``state_dir``, oldest first, the last record of each (bad lines skipped)."""
    latest: dict[tuple[Any, Any], dict[str, Any]] = {}
    for raw in read_lines(Path(state_dir) / HISTORY_FILE):
        try:
            record = json.loads(raw)
        except ValueError:
            continue            # a torn or corrupt line: the rest still count
        if isinstance(record, dict):
            latest.pop((record.get("run"), record.get("n")), None)
            latest[(record.get("run"), record.get("n"))] = record
    yield from latest.values()


def run_id() -> str:
    """An id for this guard run: its pid and start time."""
    return f"{os.getpid()}-{int(time.time())}"
