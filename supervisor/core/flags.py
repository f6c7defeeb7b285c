"""vLLM command-line flags as data: parse the user's arguments, change the managed ones, render argv.

Pure. A :class:`Flags` keeps the user's order and spelling for everything it does not touch;
flags the guard manages are replaced in place, never duplicated. Spellings are normalised the
way vLLM's ``FlexibleArgumentParser`` does (``--max_model_len`` is ``--max-model-len``), and the
short aliases ``-tp``/``-pp``/``-dp`` map to their long names.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Sequence
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

#: Flags that take one or more values (argparse ``nargs="+"``): every token up to the next flag is
#: theirs, so ``--api-key K1 K2`` gives two keys. From vLLM 0.32's own parser (``vllm serve``'s
#: actions with ``nargs="+"``) and earlier versions' sources: ``--served-model-name``,
#: ``--lora-modules`` and ``--prompt-adapters`` since 0.5, ``--api-key`` a list since 0.10.1
#: (``api_key: list[str] | None``; one value before), ``--cuda-graph-sizes`` (0.9-0.11, now
#: ``--cudagraph-capture-sizes``), ``--long-lora-scaling-factors`` (a tuple, until 0.11).
MULTI_VALUE_FLAGS = frozenset(
    {
        "--api-key",
        "--served-model-name",
        "--lora-modules",
        "--prompt-adapters",
        "--allowed-media-domains",
        "--sleep-preserve-parameter-names",
        "--logits-processors",
        "--ignore-patterns",
        "--numa-bind-nodes",
        "--numa-bind-cpus",
        "--kv-cache-dtype-skip-layers",
        "--cpu-offload-params",
        "--offload-params",
        "--lora-target-modules",
        "--collect-detailed-traces",
        "--cudagraph-capture-sizes",
        "--cuda-graph-sizes",
        "--long-lora-scaling-factors",
    }
)

#: Flags whose value is optional (``nargs="?"``): ``--hf-token`` alone means the cached login
#: (``hf_token: bool | str | None``, 0.8+).
OPTIONAL_VALUE_FLAGS = frozenset({"--hf-token"})

#: Flags vLLM itself never logs verbatim (``_SENSITIVE_ARG_FIELDS`` in
#: ``vllm/entrypoints/serve/utils/api_utils.py``, 0.29+; ``--watermark-config`` from 0.30). Every
#: flag whose name says token, key, secret, password ... is a secret too (``supervisor.secrets``).
VLLM_SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--watermark-config"})

#: Secret flags vLLM also reads from an environment variable, one value each: ``VLLM_API_KEY``
#: (``args.api_key or envs.VLLM_API_KEY`` since 0.5; the flag wins from 0.8) and ``HF_TOKEN``
#: (Hugging Face's own, read when no ``hf_token`` is passed). The guard passes them there, where
#: only the same user can read them: every local user can read a command line (``ps``).
SECRET_FLAG_ENV = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}

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

#: The flags the guard sets, and the others it reads that take exactly one value (argparse ``store``
#: in every vLLM): vLLM reads only the last of several, so a :class:`Flags` holds each once, as it
#: holds each switch of :data:`BOOLEAN_FLAGS` once (``_one_each``). Not here: flags that take several
#: values (``--served-model-name``, ``--api-key``) or may repeat (``--middleware``), and ``--config``
#: (vLLM refuses two).
READ_ONCE_FLAGS = frozenset({MAX_MODEL_LEN, UTILIZATION, KV_CACHE_DTYPE, KV_CACHE_BYTES, ENFORCE_EAGER, MAX_NUM_SEQS,
                             MAX_BATCHED_TOKENS, CPU_OFFLOAD, BLOCK_SIZE, CHUNKED_PREFILL, TENSOR_PARALLEL,
                             PIPELINE_PARALLEL, "--dtype", "--quantization", "--host", "--port", "--nnodes",
                             "--distributed-executor-backend"})


def canonical(name: str) -> str:
    """``--max_model_len`` -> ``--max-model-len``; ``-tp`` -> ``--tensor-parallel-size``."""
    if name in ALIASES:
        return ALIASES[name]
    if name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def _forms(name: str) -> tuple[str, str]:
    """A flag's two spellings as argparse's ``BooleanOptionalAction`` has them: ``--x`` and ``--no-x``
    (from either), one flag to vLLM."""
    if name.startswith("--no-"):
        return "--" + name[5:], name
    return name, "--no-" + name[2:]


def _read_once(name: str | None) -> str | None:
    """A flag vLLM reads once (the last occurrence wins), by its ``--x`` spelling; None for any other
    flag and for a positional."""
    if name is None:
        return None
    key = _forms(name)[0]
    return key if key in READ_ONCE_FLAGS or key in BOOLEAN_FLAGS else None


def _one_each(entries: Iterable[_Entry]) -> tuple[_Entry, ...]:
    """Entries where a flag vLLM reads once stands once: its last occurrence (argparse's answer, ``--x``
    or ``--no-x``), where its first stood. The one place a flag is replaced, so no combination of the
    user's flags, learned ones, the plan's and the remedies' can put one on the command line twice.
    Flags that may repeat (``--middleware`` is ``append``) and positionals are left as given."""
    entries = tuple(entries)
    last = {key: e for e in entries if (key := _read_once(e.name)) is not None}
    out: list[_Entry] = []
    for e in entries:
        key = _read_once(e.name)
        if key is None:
            out.append(e)
        elif key in last:
            out.append(last.pop(key))
    return tuple(out)


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token) and token != "-"


@dataclass(frozen=True)
class Arg:
    """One argument as vLLM's argparse reads it: a flag with its values, or a positional token."""

    start: int                 # index of its first token
    end: int                   # one past its last token
    name: str | None           # canonical flag name; None for a positional token
    raw: str | None            # the flag as written (before any ``=``)
    values: tuple[str, ...]    # () for a switch
    inline: bool = False       # ``--flag=value``


def split_args(tokens: Sequence[str], greedy: Callable[[str], bool] | None = None) -> list[Arg]:
    """``tokens`` as argparse reads them: each flag takes the values its arity allows (none for a
    switch, one or none for an optional value, every token up to the next flag for a
    :data:`MULTI_VALUE_FLAGS` member, else one). ``greedy(name)`` true makes a flag take every token up
    to the next flag whatever its arity, also after ``--flag=value`` (to mask every value a secret
    flag could have)."""
    out: list[Arg] = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if not _is_flag(tok):
            out.append(Arg(i, i + 1, None, None, (tok,)))
            i += 1
            continue
        raw, eq, inline = tok.partition("=")
        name = canonical(raw)
        eager = greedy is not None and greedy(name)
        j = i + 1
        values: list[str] = [inline] if eq else []
        if eq and not eager:
            pass
        elif name in BOOLEAN_FLAGS or name.startswith("--no-"):
            if eager:
                while j < n and not _is_flag(tokens[j]):
                    values.append(tokens[j])
                    j += 1
        elif eager or name in MULTI_VALUE_FLAGS:
            while j < n and not _is_flag(tokens[j]):
                values.append(tokens[j])
                j += 1
        elif j < n and not _is_flag(tokens[j]):
            values.append(tokens[j])
            j += 1
        out.append(Arg(i, j, name, raw, tuple(values), bool(eq)))
        i = j
    return out


@dataclass(frozen=True)
class _Entry:
    name: str | None      # canonical flag name; None for a positional token
    value: str | None     # None for a boolean flag
    raw: str | None = None  # the user's spelling of the name, kept when rendering
    more: tuple[str, ...] = ()  # the further values of a flag that takes several

    def tokens(self) -> list[str]:
        if self.name is None:
            return [self.value or ""]
        name = self.raw or self.name
        return [name] if self.value is None else [name, self.value, *self.more]


class Flags:
    """An ordered, immutable set of vLLM arguments.

    ``base`` holds flags vLLM reads from elsewhere (its ``--config`` YAML): they answer queries the
    command line does not, but are not rendered by :meth:`argv` (vLLM reads the file itself), and
    a flag set here overrides them, as the command line does for vLLM.
    """

    __slots__ = ("_entries", "_base")

    def __init__(self, entries: Iterable[_Entry] = (), base: Flags | None = None) -> None:
        self._entries: tuple[_Entry, ...] = _one_each(entries)
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
        for arg in split_args(tokens):
            if arg.name is None:
                entries.append(_Entry(None, arg.values[0]))
                continue
            raw = arg.raw or arg.name
            keep_raw = raw if raw in ALIASES or raw.startswith("-") and not raw.startswith("--") else None
            if arg.inline:
                entries.append(_Entry(arg.name, arg.values[0], keep_raw))
            elif not arg.values:
                entries.append(_Entry(arg.name, None, keep_raw))
            else:
                entries.append(_Entry(arg.name, arg.values[0], keep_raw, arg.values[1:]))
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

    def get_all(self, name: str) -> list[str]:
        """Every value of the last occurrence (``--api-key K1 K2`` -> ``["K1", "K2"]``); [] when absent."""
        name = canonical(name)
        for e in reversed(self._entries):
            if e.name == name:
                return [] if e.value is None else [e.value, *e.more]
        return self._base.get_all(name) if self._base is not None else []

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
        """Set ``name`` to ``value`` (``None``: a boolean flag), replacing it where it stood: every
        occurrence of the flag, in either spelling (``--x``, ``--no-x``), is this one entry."""
        name = canonical(name)
        text = None if value is None else format_value(value)
        new = _Entry(name, text)
        forms = _forms(name)
        out: list[_Entry] = []
        placed = False
        for e in self._entries:
            if e.name in forms:
                if not placed:
                    out.append(new)
                    placed = True
                continue
            out.append(e)
        if not placed:
            out.append(new)
        return Flags(out, self._base)

    def remove(self, name: str) -> Flags:
        """Without ``name`` on the command line, in either spelling (a value from the config file still
        stands)."""
        forms = _forms(canonical(name))
        return Flags((e for e in self._entries if e.name not in forms), self._base)

    def argv(self) -> list[str]:
        out: list[str] = []
        for e in self._entries:
            out.extend(e.tokens())
        return out

    def as_dict(self) -> dict[str, str]:
        """Flag -> value (``""`` for booleans; a flag's several values joined by spaces), the config
        file's under the command line's."""
        own = {e.name: ("" if e.value is None else " ".join([e.value, *e.more])) for e in self._entries if e.name}
        return {**(self._base.as_dict() if self._base is not None else {}), **own}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Flags) and self.argv() == other.argv() and self._base == other._base

    def __hash__(self) -> int:
        return hash((tuple(self.argv()), self._base))

    def __repr__(self) -> str:
        base = f", base={self._base!r}" if self._base is not None else ""
        return f"Flags({shlex.join(self.argv())!r}{base})"


def secrets_to_environ(argv: Sequence[str], environ: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``argv`` without the secret flags that can be given in the environment instead
    (:data:`SECRET_FLAG_ENV`), and the variables that give them. A flag stays on the command line
    when it is given more than once, with no value or several (``--api-key K1 K2``: the variable
    holds one key), or when the variable is already set to something else (vLLM before 0.8 let
    the variable win: moving the flag would change which key it uses)."""
    args = split_args(list(argv))
    environ = environ or {}
    counts: dict[str, int] = {}
    for a in args:
        if a.name is not None:
            counts[a.name] = counts.get(a.name, 0) + 1
    drop: set[int] = set()
    moved: dict[str, str] = {}
    for k, a in enumerate(args):
        var = SECRET_FLAG_ENV.get(a.name or "")
        if var is None or counts[a.name or ""] != 1 or len(a.values) != 1 or not a.values[0]:
            continue
        if environ.get(var) not in (None, "", a.values[0]):
            continue
        moved[var] = a.values[0]
        drop.add(k)
    out = [t for k, a in enumerate(args) if k not in drop for t in argv[a.start:a.end]]
    return out, moved


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
