"""vLLM command-line flags as data: parse the user's arguments, change the managed ones, render argv.

Pure. A :class:`Flags` keeps the user's order and spelling for everything it does not touch;
flags the guard manages are replaced in place, never duplicated. Spellings are normalised the
way vLLM's ``FlexibleArgumentParser`` does (``--max_model_len`` is ``--max-model-len``), and the
short aliases ``-tp``/``-pp``/``-dp`` map to their long names.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from supervisor.core import vllm_flags_data


def _valueless_in_every_release() -> frozenset[str]:
    """vLLM's options that take no value in every release that has them (its own parsers, as
    :mod:`supervisor.core.vllm_flags_data` records them): switches, ``--no-`` and ``--disable-`` forms."""
    return frozenset(name for name, spans in vllm_flags_data.OPTIONS.items()
                     if name.startswith("--") and all(kind in ("0", "b") for _first, _last, kind, _main in spans))


#: Flags that take no value (``store_true`` or ``BooleanOptionalAction`` in vLLM): every option that
#: never takes one in any release, and those the guard writes without one (``--enable-chunked-prefill``
#: took an optional value up to 0.9).
BOOLEAN_FLAGS = _valueless_in_every_release() | frozenset(
    {
        "--enforce-eager",
        "--trust-remote-code",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-log-stats",
        "--disable-custom-all-reduce",
        "--disable-sliding-window",
        "--disable-frontend-multiprocessing",
        "--enable-auto-tool-choice",
        "--enable-lora",
        "--use-v2-block-manager",
        "--disable-fastapi-docs",
        "--enable-sleep-mode",
        "--calculate-kv-scales",
        "--skip-tokenizer-init",
        "--disable-hybrid-kv-cache-manager",
        "--enable-expert-parallel",
        "--headless",
        "--async-scheduling",
        "--enable-server-load-tracking",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        "--fully-sharded-loras",
        "--enable-eplb",
    }
)

ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
}

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")

# The flags the guard reads or changes, by their canonical names.
MAX_MODEL_LEN = "--max-model-len"
UTILIZATION = "--gpu-memory-utilization"
KV_CACHE_DTYPE = "--kv-cache-dtype"
KV_CACHE_BYTES = "--kv-cache-memory-bytes"
ENFORCE_EAGER = "--enforce-eager"
MAX_NUM_SEQS = "--max-num-seqs"
MAX_BATCHED_TOKENS = "--max-num-batched-tokens"
CPU_OFFLOAD = "--cpu-offload-gb"
BLOCK_SIZE = "--block-size"
CHUNKED_PREFILL = "--enable-chunked-prefill"
TENSOR_PARALLEL = "--tensor-parallel-size"
PIPELINE_PARALLEL = "--pipeline-parallel-size"

#: The values of ``--max-model-len`` that ask vLLM to size the length itself (0.14+).
AUTO_LENGTHS = ("auto", "-1")


def canonical(name: str) -> str:
    """``--max_model_len`` -> ``--max-model-len``; ``-tp`` -> ``--tensor-parallel-size``."""
    if name in ALIASES:
        return ALIASES[name]
    if name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token) and token != "-"


@dataclass(frozen=True)
class _Entry:
    name: str | None      # canonical flag name; None for a positional token
    value: str | None     # None for a boolean flag
    raw: str | None = None  # the user's spelling of the name, kept when rendering

    def tokens(self) -> list[str]:
        if self.name is None:
            return [self.value or ""]
        name = self.raw or self.name
        return [name] if self.value is None else [name, self.value]


class Flags:
    """An ordered, immutable set of vLLM arguments.

    ``base`` holds flags vLLM reads from elsewhere (its ``--config`` YAML): they answer queries the
    command line does not, but are not rendered by :meth:`argv` (vLLM reads the file itself), and
    a flag set here overrides them, as the command line does for vLLM.
    """

    __slots__ = ("_entries", "_base")

    def __init__(self, entries: Iterable[_Entry] = (), base: Flags | None = None) -> None:
        self._entries: tuple[_Entry, ...] = tuple(entries)
        self._base = base

    @property
    def base(self) -> Flags | None:
        return self._base

    def with_base(self, base: Flags | None) -> Flags:
        """These flags over ``base`` (flags vLLM reads from its config file)."""
        return Flags(self._entries, base)

    @classmethod
    def parse(cls, args: Sequence[str] | str, base: Flags | None = None) -> Flags:
        """Parse argv tokens (or a shell string) the way vLLM's argparse would see them."""
        tokens = shlex.split(args) if isinstance(args, str) else list(args)
        entries: list[_Entry] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if not _is_flag(tok):
                entries.append(_Entry(None, tok))
                continue
            raw, eq, inline = tok.partition("=")
            name = canonical(raw)
            keep_raw = raw if raw in ALIASES or raw.startswith("-") and not raw.startswith("--") else None
            if eq:
                entries.append(_Entry(name, inline, keep_raw))
            elif name in BOOLEAN_FLAGS or name.startswith("--no-") or i >= len(tokens) or _is_flag(tokens[i]):
                entries.append(_Entry(name, None, keep_raw))
            else:
                entries.append(_Entry(name, tokens[i], keep_raw))
                i += 1
        return cls(entries, base)

    # -- queries ---------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        name = canonical(name)
        return any(e.name == name for e in self._entries) or (self._base is not None and self._base.has(name))

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of the last occurrence (argparse semantics); ``""`` for a boolean flag."""
        name = canonical(name)
        for e in reversed(self._entries):
            if e.name == name:
                return "" if e.value is None else e.value
        return self._base.get(name, default) if self._base is not None else default

    def world_size(self) -> int:
        """The GPUs one launch uses: --tensor-parallel-size x --pipeline-parallel-size."""
        return (self.get_int(TENSOR_PARALLEL) or 1) * (self.get_int(PIPELINE_PARALLEL) or 1)

    def auto_length(self) -> bool:
        """``--max-model-len auto`` (or -1): vLLM sizes the length to its KV cache."""
        return self.get(MAX_MODEL_LEN) in AUTO_LENGTHS

    def get_int(self, name: str) -> int | None:
        return parse_int(self.get(name))

    def get_float(self, name: str) -> float | None:
        value = self.get(name)
        try:
            return float(value) if value else None
        except ValueError:
            return None

    def enabled(self, name: str) -> bool:
        """True for a boolean flag that is on (``--x`` present and not undone by ``--no-x``)."""
        name = canonical(name)
        neg = "--no-" + name[2:]
        state, seen = False, False
        for e in self._entries:
            if e.name == name:
                state, seen = e.value is None or e.value.lower() not in ("false", "0", "no"), True
            elif e.name == neg:
                state, seen = False, True
        if not seen and self._base is not None:
            return self._base.enabled(name)
        return state

    def positionals(self) -> list[str]:
        return [e.value or "" for e in self._entries if e.name is None]

    def names(self) -> list[str]:
        return [e.name for e in self._entries if e.name is not None]

    # -- changes (each returns a new Flags) --------------------------------------------------
    def set(self, name: str, value: str | int | float | None = None) -> Flags:
        """Set ``name`` to ``value`` (``None``: a boolean flag), replacing it where it stood."""
        name = canonical(name)
        text = None if value is None else format_value(value)
        new = _Entry(name, text)
        out: list[_Entry] = []
        placed = False
        neg = "--no-" + name[2:]
        for e in self._entries:
            if e.name in (name, neg):
                if not placed:
                    out.append(new)
                    placed = True
                continue
            out.append(e)
        if not placed:
            out.append(new)
        return Flags(out, self._base)

    def remove(self, name: str) -> Flags:
        """Without ``name`` on the command line (a value from the config file still stands)."""
        name = canonical(name)
        neg = "--no-" + name[2:]
        return Flags((e for e in self._entries if e.name not in (name, neg)), self._base)

    def argv(self) -> list[str]:
        out: list[str] = []
        for e in self._entries:
            out.extend(e.tokens())
        return out

    def as_dict(self) -> dict[str, str]:
        """Flag -> value (``""`` for booleans), the config file's under the command line's."""
        own = {e.name: ("" if e.value is None else e.value) for e in self._entries if e.name}
        return {**(self._base.as_dict() if self._base is not None else {}), **own}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Flags) and self.argv() == other.argv() and self._base == other._base

    def __hash__(self) -> int:
        return hash((tuple(self.argv()), self._base))

    def __repr__(self) -> str:
        base = f", base={self._base!r}" if self._base is not None else ""
        return f"Flags({shlex.join(self.argv())!r}{base})"


def diff(before: Flags, after: Flags) -> dict[str, tuple[str | None, str | None]]:
    """Flags whose value differs: name -> (before, after); ``None`` means absent."""
    a, b = before.as_dict(), after.as_dict()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def format_value(value: str | int | float) -> str:
    """How a flag value is written: floats with at most two decimals and no trailing zeros."""
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


_SUFFIX = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_int(value: str | None) -> int | None:
    """vLLM's ``human_readable_int``: ``32k`` = 32000, ``32K`` = 32768; ``auto``/``-1`` -> None."""
    if value is None or value == "":
        return None
    value = value.strip()
    if value in AUTO_LENGTHS:
        return None
    try:
        if value[-1] in _SUFFIX:
            return int(float(value[:-1]) * _SUFFIX[value[-1]])
        return int(value)
    except (ValueError, IndexError):
        return None
