"""What the guard learned on this host, kept in ``<state_dir>/learned.json`` (a dict by key).

Two kinds of entry: the flags the guard itself changed for a launch that became healthy (for the
model, the GPUs, vLLM and the flags the user asked: :func:`learned_key`), and vLLM's memory as a
healthy launch printed it (for the host, the model, the GPUs and vLLM, whatever the flags).

Learned flags are data, not a command line. An entry holds ``{"flags": {flag: {"value", "why"}}}``
for the flags of :data:`supervisor.core.remediable.REMEDIABLE` only; every value is checked against
its type and range when it is read, and applied over the user's own flags, so a planted or corrupt
store can at most pick another value of a flag the guard manages, never add one. An entry of an older
guard (``"argv"``: a whole command line) is read the same way: only what it changed among those flags,
each value checked, is kept. No secret is ever stored (no secret flag is remediable).

The store is an optimisation: one that cannot be read is set aside and the guard starts without it;
one that cannot be written (a full disk) is a warning, never the end of supervision.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from supervisor.core import remediable
from supervisor.core.flags import Flags
from supervisor.core.session import Facts, Learned, Measured
from supervisor.errors import StateError
from supervisor.shell.diskfaults import FAULTS
from supervisor.shell.statefiles import ensure_dir, read_json, set_aside, write_json

if TYPE_CHECKING:
    from supervisor.config import GuardConfig

log = structlog.get_logger("vllm-guard")

LEARNED = "learned.json"
#: learned.json keys of vLLM's measured memory (one per host, model, GPUs, TP and vLLM, whatever the flags).
MEASURED_PREFIX = "measured:"


@dataclass(frozen=True)
class StoreKeys:
    flags: str              # the flags that served, for the flags asked
    measured: str           # vLLM's memory as it printed it, for any flags


def learned_key(
    *,
    model: str,
    revision: str | None,
    gpus: list[tuple[str, int]],
    tp: int,
    vllm_version: str | None,
    user_args: list[str],
) -> str:
    """A stable key for flags learned under these conditions: ``<model>@<revision>#<digest>``."""
    what = {
        "model": model,
        "revision": revision,
        "gpus": sorted([str(name), int(mem)] for name, mem in gpus),
        "tp": int(tp),
        "vllm_version": vllm_version,
        "user_args": list(user_args),
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return f"{model}@{revision or '-'}#{digest}"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _log_warning(message: str) -> None:
    log.warning(message)


class LearnedStore:
    """``<state_dir>/learned.json``: read through the state-file door, written atomically, best effort."""

    def __init__(self, state_dir: str, warn: Callable[[str], None] = _log_warning) -> None:
        self.state_dir = state_dir
        self.path = Path(state_dir) / LEARNED
        self._warn = warn

    def _load(self) -> dict[str, Any]:
        try:
            data = read_json(self.path)
        except StateError as e:
            self._set_aside(str(e))
            return {}
        if data is None:
            return {}
        if not isinstance(data, dict):
            self._set_aside(f"{self.path} holds {type(data).__name__}, not an object")
            return {}
        return data

    def _set_aside(self, why: str) -> None:
        try:
            set_aside(self.path, f"{why} (starting without learned flags)", self._warn)
        except StateError:
            pass            # said so; the guard goes on without learned flags

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry for ``key`` (a dict), or None."""
        entry = self._load().get(key)
        if entry is None:
            return None
        if not isinstance(entry, dict):
            self._warn(f"the entry for {key} in {self.path} is malformed; ignoring it")
            return None
        return entry

    def _write(self, change: Callable[[dict[str, Any]], bool]) -> bool:
        """Apply ``change`` to the store and write it back (best effort: False when the disk refused)."""
        def write() -> None:
            ensure_dir(self.state_dir)
            data = self._load()
            if change(data):
                write_json(self.path, data, 0o600)
        return FAULTS.attempt(self.path, write)

    def put(self, key: str, flags: Mapping[str, remediable.LearnedValue], reasons: Mapping[str, str],
            meta: Mapping[str, Any]) -> bool:
        """Store what the guard changed for a launch that became healthy under ``key`` (only flags the guard
        changes, each value checked: ValueError otherwise)."""
        entry = {"flags": {flag: {"value": remediable.accept(flag, value), "why": remediable.reason(reasons.get(flag))}
                           for flag, value in flags.items()},
                 "saved_at": _now_iso(), "meta": dict(meta)}

        def change(data: dict[str, Any]) -> bool:
            data[key] = entry
            return True
        return self._write(change)

    def put_measured(self, key: str, measured: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
        """Store vLLM's memory as a healthy launch printed it (:meth:`Measured.to_dict`) under ``key``."""
        entry = {"saved_at": _now_iso(), "meta": {**meta, "measured": dict(measured)}}

        def change(data: dict[str, Any]) -> bool:
            data[key] = entry
            return True
        return self._write(change)

    def drop(self, key: str) -> bool:
        """Forget ``key`` (a launch with these flags failed)."""
        return self._write(lambda data: data.pop(key, None) is not None)


def learned_from_entry(entry: Mapping[str, Any], requested: Flags) -> Learned:
    """The learned flags of a store entry, checked (ValueError naming what is wrong). An older guard's
    entry (``argv``) gives what its command line changed from ``requested`` among the flags the guard
    changes; everything else in it is ignored."""
    stamp = entry.get("saved_at")
    saved_at = stamp if isinstance(stamp, str) else ""
    flags = entry.get("flags")
    if isinstance(flags, dict):
        values: dict[str, Any] = {}
        reasons: dict[str, str] = {}
        for flag, item in flags.items():
            if not isinstance(item, dict) or "value" not in item:
                raise ValueError(f"{flag!r} has no value")
            values[flag] = item["value"]
            reasons[flag] = remediable.reason(item.get("why"))
        return Learned(values, saved_at, reasons)
    argv = entry.get("argv")
    if isinstance(argv, list) and all(isinstance(a, str) and "\x00" not in a for a in argv):
        found = entry.get("meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        found = meta.get("reasons")
        old: dict[str, Any] = found if isinstance(found, dict) else {}
        changed = remediable.changes(requested, Flags.parse(argv, base=requested.base))
        return Learned(changed, saved_at, {k: remediable.reason(old.get(k)) for k in changed})
    raise ValueError("neither flags nor an argv")


def learned_facts(cfg: GuardConfig, facts: Facts, state_dir: str,
                  warn: Callable[[str], None] = _log_warning) -> tuple[Facts, StoreKeys]:
    """``facts`` with what the state dir learned on this host: what the guard changed for a launch of this
    model on these GPUs and vLLM with the flags asked, and vLLM's memory as a healthy launch printed it
    (for any flags); with the keys to store them under."""
    requested = cfg.requested_flags()
    gpus = [(d.name, d.total_bytes) for d in facts.devices] or [("cpu", int((facts.cpu_kv_space_gib or 0) * (1 << 30)))]
    tp = requested.get_int("--tensor-parallel-size") or 1

    def key(user_args: list[str]) -> str:
        return learned_key(model=cfg.model, revision=None, gpus=gpus, tp=tp, vllm_version=facts.vllm_version,
                           user_args=user_args)
    keys = StoreKeys(key(list(cfg.vllm_args)), MEASURED_PREFIX + key([]))
    if not os.path.isdir(state_dir):
        return facts, keys
    store = LearnedStore(state_dir, warn)
    entry = store.get(keys.measured)
    found = entry.get("meta") if entry is not None else None
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    if "measured" in meta:
        facts = replace(facts, measured=Measured.from_dict(meta["measured"]))
    entry = store.get(keys.flags)
    if entry is None:
        return facts, keys
    try:
        learned = learned_from_entry(entry, requested)
    except ValueError as e:
        warn(f"the learned flags for {keys.flags} in {store.path} are not the guard's ({e}); ignoring them")
        return facts, keys
    return replace(facts, learned=learned), keys
