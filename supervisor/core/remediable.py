"""The flags the guard itself changes, each with the type and range its value must have.

Pure. This table is all that the state dir's ``learned.json`` may hold: flag -> value for these flags
only, each value accepted only in its type and range. A planted or corrupt store can therefore at most
pick another value of a flag the guard manages; it can never add a flag (``--trust-remote-code``, a
tokenizer path, a second ``--model``) to vLLM's command line, nor smuggle one in a value (a value is
one token of a fixed shape: digits, a decimal, a name from a list).

The types and ranges are vLLM's own (its ``EngineArgs`` fields and their pydantic bounds:
``gpu_memory_utilization: Field(gt=0, le=1)``, ``max_num_seqs: Field(ge=1)``, ``cpu_offload_gb:
Field(ge=0)``, ``max_model_len: Field(ge=-1)`` where -1 and ``auto`` ask vLLM to size it, and the KV
cache dtypes of ``CacheDType``), narrowed where the guard is narrower: it only ever turns a switch on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.flags import (
    AUTO_LENGTHS,
    CHUNKED_PREFILL,
    CPU_OFFLOAD,
    ENFORCE_EAGER,
    KV_CACHE_BYTES,
    KV_CACHE_DTYPE,
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    UTILIZATION,
    Flags,
)

#: vLLM's KV cache dtypes (``CacheDType`` in ``vllm/config/cache.py``: 0.32's list, which holds the
#: earlier releases' ``auto``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2`` and ``fp8_inc``).
KV_CACHE_DTYPES = frozenset({
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
})

_INT = re.compile(r"[0-9]{1,19}")
_DECIMAL = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
_INT32 = (1 << 31) - 1

#: A learned value: the flag's value as vLLM reads it (one token), or True for a switch turned on.
LearnedValue = str | bool


@dataclass(frozen=True)
class Remediable:
    """One flag the guard changes: ``kind`` int | decimal | switch | choice, and the range of its value."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    low_open: bool = False          # (low, high] rather than [low, high]
    choices: frozenset[str] = frozenset()
    also: tuple[str, ...] = ()      # other words accepted as they are (``auto`` for a length)
    remedy: str = ""                # the ``remedies.allowed`` name that lets the guard change it

    def accept(self, value: Any) -> LearnedValue:
        """``value`` (from JSON) as the token vLLM gets, or ValueError saying what is wrong with it."""
        if self.kind == "switch":
            if value is True:
                return True
            raise ValueError(f"{value!r} is not true (the guard only turns this switch on)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{value!r} is not a {self.kind}")
        if self.kind == "choice":
            if isinstance(value, str) and value in self.choices:
                return value
            raise ValueError(f"{value!r} is not one of vLLM's values")
        if isinstance(value, str) and value in self.also:
            return value
        text = value if isinstance(value, str) else (str(value) if isinstance(value, int) else repr(value))
        shape = _INT if self.kind == "int" else _DECIMAL
        if not shape.fullmatch(text):
            raise ValueError(f"{value!r} is not a{'n integer' if self.kind == 'int' else ' decimal number'}")
        number = int(text) if self.kind == "int" else float(text)
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not finite")
        below = number <= self.low if self.low_open else number < self.low
        if below or number > self.high:
            opening = "(" if self.low_open else "["
            raise ValueError(f"{value!r} is outside {opening}{self.low:g}, {self.high:g}]")
        return text


def _int(remedy: str, low: int, high: int = _INT32, also: tuple[str, ...] = ()) -> Remediable:
    return Remediable("int", low, high, also=also, remedy=remedy)


#: Every flag the guard's plan, remedies and session may change, with its type and range, and the
#: remedy (a name of ``remedies.allowed``) that must be allowed for the guard to change it. The
#: memory share's remedy also covers the CPU backend's KV cache size (``--kv-cache-memory-bytes``,
#: the share there); chunked prefill is a change to how prompts are batched, the batch's remedy.
REMEDIABLE: Mapping[str, Remediable] = {
    MAX_MODEL_LEN: _int("max_model_len", 1, also=AUTO_LENGTHS),
    UTILIZATION: Remediable("decimal", 0.0, 1.0, low_open=True, remedy="gpu_memory_utilization"),
    KV_CACHE_DTYPE: Remediable("choice", choices=KV_CACHE_DTYPES, remedy="kv_cache_fp8"),
    KV_CACHE_BYTES: _int("gpu_memory_utilization", 1, (1 << 63) - 1),
    MAX_NUM_SEQS: _int("max_num_seqs", 1),
    MAX_BATCHED_TOKENS: _int("max_num_batched_tokens", 1),
    CPU_OFFLOAD: Remediable("decimal", 0.0, float(1 << 20), remedy="cpu_offload"),
    ENFORCE_EAGER: Remediable("switch", remedy="enforce_eager"),
    CHUNKED_PREFILL: Remediable("switch", remedy="max_num_batched_tokens"),
}

MAX_REASON = 500          # characters of a learned "why" that are kept


def accept(flag: str, value: Any) -> LearnedValue:
    """The learned ``value`` of ``flag`` as the guard applies it; ValueError naming the flag when the flag
    is not one the guard changes or the value is not in its type and range."""
    rule = REMEDIABLE.get(flag) if isinstance(flag, str) else None
    if rule is None:
        raise ValueError(f"{flag!r} is not a flag the guard changes")
    try:
        return rule.accept(value)
    except ValueError as e:
        raise ValueError(f"{flag} {e}") from None


def reason(text: Any) -> str:
    """A learned "why" as it may be shown: printable text, at most :data:`MAX_REASON` characters."""
    if not isinstance(text, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in text)[:MAX_REASON]


def changes(requested: Flags, flags: Flags) -> dict[str, LearnedValue]:
    """What ``flags`` changed from the user's ``requested`` among the flags the guard changes: the values
    to learn (a switch turned on is True; a value removed or outside its type is not learned)."""
    out: dict[str, LearnedValue] = {}
    for flag, rule in REMEDIABLE.items():
        if rule.kind == "switch":
            if flags.enabled(flag) and not requested.enabled(flag):
                out[flag] = True
            continue
        value = flags.get(flag)
        if value is None or value == requested.get(flag):
            continue
        try:
            out[flag] = rule.accept(value)
        except ValueError:
            continue
    return out


def apply(requested: Flags, learned: Mapping[str, LearnedValue]) -> Flags:
    """The user's ``requested`` flags with the ``learned`` values over them (each checked again here:
    ValueError for a flag the guard does not change or a value outside its type)."""
    flags = requested
    for flag, value in learned.items():
        checked = accept(flag, value)
        flags = flags.set(flag) if checked is True else flags.set(flag, checked)
    return flags


def remedy_of(flag: str) -> str | None:
    """The ``remedies.allowed`` name that lets the guard change ``flag`` (None: not a flag the guard changes)."""
    rule = REMEDIABLE.get(flag)
    return rule.remedy if rule is not None else None


def refused(requested: Flags, flags: Flags, allowed: Iterable[str]) -> tuple[str, ...]:
    """The flags in which ``flags`` differ from the user's ``requested`` although their remedy is not in
    ``allowed`` (``remedies.allowed``): the changes the user's rules refuse. Flags outside
    :data:`REMEDIABLE` (a flag this vLLM removed, dropped) are not remedies and never refused here."""
    permitted = frozenset(allowed)
    return tuple(flag for flag, rule in REMEDIABLE.items()
                 if rule.remedy not in permitted and _differs(requested, flags, flag, rule))


def _differs(requested: Flags, flags: Flags, flag: str, rule: Remediable) -> bool:
    if rule.kind == "switch":
        return flags.enabled(flag) != requested.enabled(flag)
    return flags.get(flag) != requested.get(flag)


def within(requested: Flags, flags: Flags, allowed: Iterable[str]) -> Flags:
    """``flags`` with every change :func:`refused` names put back as the user had it: the one check
    every launch's flags pass (first launch, learned flags, relaunch), so a change the user's rules do
    not allow never reaches vLLM's command line."""
    out = flags
    for flag in refused(requested, flags, allowed):
        if REMEDIABLE[flag].kind == "switch":
            out = out.set(flag) if requested.enabled(flag) else out.remove(flag)
        else:
            value = requested.get(flag)
            out = out.remove(flag) if value is None else out.set(flag, value)
    return out
