"""The one registry of secrets, and the one way anything is masked before the guard shows, keeps or
sends it. Stdlib only (plus the pure :mod:`supervisor.core.flags`), so every layer may import it.

What is secret:

- every value of a secret flag: ``--api-key K1 K2`` (a list since vLLM 0.10.1), ``--api-key=K``,
  the flags vLLM itself never logs (:data:`~supervisor.core.flags.VLLM_SECRET_FLAGS`) and any flag
  whose name holds the word token, key, secret, password ... (:func:`is_secret_name`); every token
  after such a flag up to the next flag counts, whatever its arity, so no value is left out;
- the values of secret-named environment variables (``VLLM_API_KEY``, ``HF_TOKEN``,
  ``HUGGING_FACE_HUB_TOKEN``, ``*_TOKEN``, ``*_KEY``, ``*_SECRET`` ...), and of secret-named keys inside
  a flag's JSON value (``--hf-overrides '{"token": ...}'``);
- the parts of a URL that are credentials, which a library or an error message may print alone
  (httpx names host and path, a proxy error its user): the user info (``user:password@``) of every
  URL given in a flag or a variable (``--otlp-traces-endpoint``, ``HTTPS_PROXY``), its query values
  under secret-named keys (``?token=``, ``?sig=``), and of a URL that is a credential as a whole
  (:data:`CREDENTIAL_URL_FLAGS`: ``--notify-url``, Slack's and Discord's webhooks) the whole URL,
  every query value and every path segment that looks like a token (:func:`url_secrets`);
- the guard's own bearer token, and anything else registered with :meth:`Secrets.add`;
- well-known shapes nobody registered (``hf_...``, ``sk-...``, ``Bearer ...``, ``user:pass@`` in a URL),
  and the value after a secret name in text (``api_key='K'``, ``"hf_token": "..."``,
  ``'api_key': ['K1', 'K2']`` as vLLM prints its arguments, ``HF_TOKEN=...``).

Which of vLLM's flags are secret is decided here, once, for every flag of every release the guard
knows (``supervisor/core/vllm_flags_data.py``): :data:`~supervisor.core.flags.VLLM_SECRET_FLAGS`
(``--api-key``, ``--hf-token``, ``--watermark-config``: vLLM's own ``_SENSITIVE_ARG_FIELDS``) and the
word rule, less :data:`NOT_SECRET_FLAGS`, the flags whose name holds a secret word but whose value is
a number, a switch or a path (``--long-prefill-token-threshold``, ``--allow-credentials``). A path
to a key (``--ssl-keyfile``) is not a secret: the file is, and the guard never reads it. A test
holds that every flag of the table with a secret word in its name is decided one way or the other.

Masking reads the registry at call time, so a value registered after a sink was made is masked
there too; text (:meth:`Secrets.text`) and vLLM's raw lines (:meth:`Secrets.line`, and
:meth:`Secrets.lines` for the lines of one read of its pipe) use the same values and the same patterns.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from supervisor.core.flags import VLLM_SECRET_FLAGS, canonical, split_args

MASK = "***"

# Words that make a flag or variable name secret. Whole words only: --max-num-batched-tokens,
# --tokenizer and TOKENIZERS_PARALLELISM are not secrets.
SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "passphrase",
                          "credential", "credentials", "auth", "authorization"})
_WORD_SPLIT = re.compile(r"[-_.\s]+")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")

#: vLLM's flags whose name holds a secret word and whose value is no secret: a count or length of
#: tokens, a token id, a switch (``--allow-credentials`` is CORS's ``Access-Control-Allow-Credentials``).
#: A new flag of this kind fails ``tests/unit/test_secrets.py`` until it is put here or in
#: ``VLLM_SECRET_FLAGS``; until then it is masked (a false alarm costs a masked number, a miss a key).
NOT_SECRET_FLAGS = frozenset({
    "--allow-credentials", "--no-allow-credentials",           # a switch
    "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold",   # counts of tokens
    "--long-prefill-token-threshold", "--long-prefill-token-threshold-adaptive",
    "--no-long-prefill-token-threshold-adaptive",
    "--max-prompt-adapter-token",                              # a count
    "--image-token-id",                                        # a vocabulary id
    "--return-tokens-as-token-ids", "--no-return-tokens-as-token-ids",   # a switch
})

#: Flags (the guard's and vLLM's) whose value is a URL that is a credential as a whole: a chat
#: webhook's URL is its password (Slack's ``/services/T../B../XXXX``, Discord's ``/webhooks/ID/TOKEN``).
CREDENTIAL_URL_FLAGS = frozenset({"--notify-url"})

#: Query keys whose value is a credential in any URL (besides the secret words): signed URLs' ``sig``.
_SECRET_QUERY_KEYS = frozenset({"sig", "signature", "x-amz-signature", "x-amz-credential", "x-goog-signature",
                                "code", "access_token", "apikey", "pass", "pwd"})

#: The guard's own variables a child never needs.
NOT_FOR_VLLM = frozenset({"VLLM_GUARD_TOKEN"})

# Values that a secret-named variable may hold without being a secret (a switch); masking them
# would shred ordinary text.
_NOT_SECRETS = frozenset({"true", "false", "none", "null", "auto", "yes", "no", "on", "off"})
MIN_SECRET = 4   # masking a 1-3 character "secret" would shred ordinary text

# The patterns, written once as text and compiled for text and for bytes (vLLM's raw lines).
# Bounded repetitions only: a 256 KiB line costs linear time whatever it holds.
_SHAPES = (
    r"(?P<hf>\bhf_[A-Za-z0-9]{20,400})"
    r"|(?P<sk>\bsk-[A-Za-z0-9_-]{16,400})"
    r"|(?P<scheme>(?i:\bbearer\s+|\bauthorization:\s{0,4}basic\s+))[A-Za-z0-9._~+/=-]{8,4096}"
    r"|(?P<userinfo>://[^/\s:@]{1,256}:)[^/\s@]{1,256}(?=@)"
)
# A secret word inside a name (found in the lowered line), the name around it, and what follows a
# name that has a value: ``api_key='K'``, ``"hf_token": "..."``, ``'api_key': ['K1', 'K2']``, ``X_TOKEN=v``.
_WORDS = r"token|key|secret|passw|passphrase|credential|auth"
_NAME_RIGHT = r"[\w.-]{0,100}"
_VALUE = (r"(?P<q>['\"]?)\s{0,4}[:=]\s{0,4}"
          r"(?P<val>'(?:[^'\\\n]|\\.){0,4096}'|\"(?:[^\"\\\n]|\\.){0,4096}\"|\[[^\]\n]{0,4096}\]"
          r"|(?P<how>(?i:bearer|basic)\s{1,4})?[^\s,;)}\]'\"]{1,4096})")
# What a shape or a registered value needs in the lowered line: one fast scan (a case-sensitive
# alternation: ~1.5 us for a 120-byte line, where a case-insensitive one took 10) decides whether
# anything else runs; most of vLLM's lines have none of these.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _lower(s: Any) -> Any:
    """ASCII letters lowered, every other character kept: positions in the result are positions in
    ``s`` (``str.lower`` can change the length), and text and bytes lower alike."""
    return s.lower() if isinstance(s, bytes) else s.translate(_ASCII_LOWER)


_TRIGGER_WORDS = ("token", "key", "secret", "passw", "credential", "auth", "bearer", "hf_", "sk-", "://")


def _as_text(pattern: str) -> str:
    return pattern


def _as_bytes(pattern: str) -> bytes:
    return pattern.encode()


class _Masker:
    """The patterns for one type (``str`` or ``bytes``), and the masking of one string of it."""

    def __init__(self, kind: type) -> None:
        enc: Callable[[str], Any] = _as_text if kind is str else _as_bytes
        # ASCII classes for text too (\w, \s, \b): text and its UTF-8 bytes are masked alike.
        flags = re.ASCII if kind is str else 0
        self.kind = kind
        self.mask = enc(MASK)
        self.shapes = re.compile(enc(_SHAPES), flags)
        self.words = re.compile(enc(_WORDS), flags)
        self.run = re.compile(enc(r"[\w.-]+"), flags)
        self.right = re.compile(enc(_NAME_RIGHT), flags)
        self.value = re.compile(enc(_VALUE), flags)
        self.after_flag = re.compile(enc(r"(?:[ \t]{1,16}(?![-\s])\S{1,4096}){1,64}"), flags)
        self.token = re.compile(enc(r"\S+"), flags)
        self.dashes = enc("--")
        self.space = (enc(" "), enc("\t"))
        self.name_chars = re.compile(enc(r"[\w.-]"), flags)
        self.quotes = {enc("'"), enc('"')}
        self.bracket = enc("[")
        self.shape_hints = tuple(enc(h) for h in ("hf_", "sk-", "bearer", "authorization", "://"))

    def __call__(self, s: Any, known: re.Pattern[Any] | None) -> Any:
        if known is not None:
            s = known.sub(self.mask, s)
        low = _lower(s)
        if any(h in low for h in self.shape_hints):
            s = self.shapes.sub(self._shape, s)
            low = _lower(s)
        return self._values_after_names(s, low)

    def _shape(self, m: re.Match[Any]) -> Any:
        keep = m.group("scheme") if m.group("scheme") is not None else m.group("userinfo")
        return self.mask if keep is None else keep + self.mask

    def _values_after_names(self, s: Any, low: Any) -> Any:
        out, done = [], 0
        for hit in self.words.finditer(low):
            if hit.start() < done:
                continue
            name_end = self.right.match(s, hit.end())
            end = name_end.end() if name_end is not None else hit.end()
            v = self.value.match(s, end)      # most hits ("tokens/s") have no value: cheap to rule out
            if v is None and s[end:end + 1] not in self.space:
                continue
            lo = max(0, hit.start() - 100)
            runs = list(self.run.finditer(s, lo, hit.end()))   # the last: the run of name characters holding the hit
            start = runs[-1].start() if runs else hit.start()
            if start == lo and lo > 0 and self.name_chars.match(s, lo - 1):
                continue                      # the name runs on beyond 100 characters: not a key
            name = s[start:end]
            if v is None:
                # A secret flag in free text (a command line quoted in a log): every token after it
                # up to the next flag, as argv masking does.
                if not name.startswith(self.dashes) or not is_secret_name(
                        name if self.kind is str else name.decode("ascii", "replace")):
                    continue
                tail = self.after_flag.match(s, end)
                if tail is None:
                    continue
                out.append(s[done:end])
                out.append(self.token.sub(self.mask, tail.group(0)))
                done = tail.end()
                continue
            quote_before = start > 0 and s[start - 1:start] in self.quotes
            if bool(v.group("q")) != quote_before:
                continue
            if not is_secret_name(name if self.kind is str else name.decode("ascii", "replace")):
                continue
            val = v.group("val")
            first = val[:1]
            if first in self.quotes:
                masked = first + self.mask + first
            elif first == self.bracket:
                masked = self.bracket + self.mask + val[-1:]
            else:
                masked = (v.group("how") or val[:0]) + self.mask     # "Bearer ***"
            out.append(s[done:v.start("val")])
            out.append(masked)
            done = v.end("val")
        if not out:
            return s
        out.append(s[done:])
        return s[:0].join(out)


_MASK_TEXT = _Masker(str)
_MASK_BYTES = _Masker(bytes)


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or key name holds a secret: a whole word token/key/secret/password,
    or a flag vLLM itself treats as secret (``--watermark-config``)."""
    if not isinstance(name, str):
        return False
    flag = canonical("--" + name.lstrip("-").replace("_", "-"))
    if flag in VLLM_SECRET_FLAGS:
        return True          # also as the key vLLM prints its arguments under ('watermark_config')
    if flag in NOT_SECRET_FLAGS:
        return False
    spaced = _CAMEL.sub(r"\1_\2", name.lstrip("-"))
    words = {w for w in _WORD_SPLIT.split(spaced.lower()) if w}
    return bool(words & SECRET_WORDS)


def _worth_masking(value: str) -> bool:
    return len(value) >= MIN_SECRET and value.strip().lower() not in _NOT_SECRETS


def _secret_flag(name: str) -> bool:
    return is_secret_name(name)


# A path segment or query value that looks like a token: long, URL-safe, letters and digits mixed
# (Slack's 24-character hook secret, Discord's 68), or very long whatever it holds.
_TOKEN_LIKE = re.compile(r"(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9._~+=%-]{12,}|[A-Za-z0-9._~+=%-]{32,}")


def url_secrets(value: str, *, credential: bool = False) -> list[str]:
    """The parts of a URL that are secrets, as written and percent-decoded: the user info (the
    password, and a user that looks like a token: ``https://TOKEN@host``; not ``admin``, which
    masked would shred every text naming it), the values of secret-named query keys; with
    ``credential`` (a webhook URL) also the URL itself, its query and every query value and path
    segment that looks like a token. [] for what is not a URL."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    if not isinstance(value, str) or "://" not in value:
        return []
    try:
        parts = urlsplit(value.strip())
        netloc = parts.netloc
    except ValueError:
        return []
    found: list[str] = [value, value.strip()] if credential else []
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        user, _, password = userinfo.partition(":")
        found += [userinfo, password, *([user] if _TOKEN_LIKE.fullmatch(unquote(user)) else [])]
    for key, val in parse_qsl(parts.query, keep_blank_values=False):
        if is_secret_name(key) or key.lower() in _SECRET_QUERY_KEYS or (credential and _TOKEN_LIKE.fullmatch(val)):
            found.append(val)
    if credential:
        found += [seg for seg in parts.path.split("/") if _TOKEN_LIKE.fullmatch(seg)]
        if parts.query:
            found.append(parts.query)
    out: list[str] = []
    for v in found:
        for form in (v, unquote(v)):
            if form and form not in out:
                out.append(form)
    return out


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """The values of secret flags in ``argv`` (every token after one, up to the next flag), the
    secret-named values inside any flag's JSON value, and the secret parts of any URL given."""
    found: list[str] = []
    for arg in split_args([str(t) for t in argv], greedy=_secret_flag):
        if arg.name is not None and _secret_flag(arg.name):
            found.extend(v for v in arg.values if v)
            continue
        credential = arg.name in CREDENTIAL_URL_FLAGS
        for v in arg.values:
            found.extend(url_secrets(v, credential=credential))
            if arg.name is not None:
                found.extend(_json_secrets(v))
    return found


def _json_secrets(value: str) -> list[str]:
    if not value.lstrip().startswith(("{", "[")):
        return []
    try:
        obj = json.loads(value)
    except ValueError:
        return []
    found: list[str] = []
    _harvest(obj, found)
    return found


def _harvest(obj: Any, into: list[str]) -> None:
    """Secret values in a JSON-like tree: under secret-named keys, and after secret flags in argv lists."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k):
                if isinstance(v, str):
                    into.append(v)
                elif isinstance(v, (list, tuple)):
                    into.extend(x for x in v if isinstance(x, str))
            _harvest(v, into)
    elif isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, str) for x in obj):
            into.extend(argv_secrets(obj))
        else:
            for x in obj:
                _harvest(x, into)


class Secrets:
    """The secret values known so far, and every way of masking them (thread-safe)."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._text: re.Pattern[str] | None = None
        self._bytes: re.Pattern[bytes] | None = None
        self._trigger_text, self._trigger_bytes, self._trigger_words = self._triggers()

    def _triggers(self) -> tuple[re.Pattern[str], re.Pattern[bytes], tuple[bytes, ...]]:
        words = sorted({*_TRIGGER_WORDS, *(_lower(v) for v in self._values)}, key=len, reverse=True)
        raw = tuple(w.encode("utf-8", "surrogateescape") for w in words)
        return (re.compile("|".join(re.escape(w) for w in words)),
                re.compile(b"|".join(re.escape(w) for w in raw)), raw)

    # -- registering ----------------------------------------------------------------------------
    def add(self, value: str | None) -> None:
        """Mask ``value`` wherever it appears from now on (also in sinks made earlier)."""
        if not isinstance(value, str) or not _worth_masking(value):
            return
        with self._lock:
            if value in self._values:
                return
            self._values.add(value)
            ordered = sorted(self._values, key=len, reverse=True)   # a secret holding another is masked whole
            self._text = re.compile("|".join(re.escape(v) for v in ordered))
            self._bytes = re.compile(b"|".join(re.escape(v.encode("utf-8", "surrogateescape")) for v in ordered))
            self._trigger_text, self._trigger_bytes, self._trigger_words = self._triggers()

    def add_environ(self, environ: Mapping[str, str]) -> None:
        """Register the values of secret-named variables (``HF_TOKEN``, ``*_API_KEY`` ...)."""
        for name, value in environ.items():
            if is_secret_name(name):
                self.add(value)
            for part in url_secrets(value):       # HTTPS_PROXY=http://user:password@proxy:3128
                self.add(part)

    def add_url(self, url: str, *, credential: bool = False) -> None:
        """Register the secret parts of ``url`` (:func:`url_secrets`); ``credential``: the URL is a
        password as a whole (a webhook's)."""
        for part in url_secrets(url, credential=credential):
            self.add(part)

    def add_argv(self, argv: Iterable[str]) -> None:
        """Register the values of the secret flags in ``argv``."""
        for value in argv_secrets(argv):
            self.add(value)

    def values(self) -> list[str]:
        """The registered values, longest first."""
        with self._lock:
            return sorted(self._values, key=len, reverse=True)

    # -- masking --------------------------------------------------------------------------------
    def text(self, s: str, extra: Iterable[str] = ()) -> str:
        """``s`` with every registered (and ``extra``) value and every known shape masked."""
        if not isinstance(s, str):
            return s
        with self._lock:
            known, trigger = self._text, self._trigger_text
        more = sorted({v for v in extra if isinstance(v, str) and _worth_masking(v)}, key=len, reverse=True)
        if more:
            s = re.sub("|".join(re.escape(v) for v in more), MASK, s)
        if not trigger.search(_lower(s)):
            return s
        masked: str = _MASK_TEXT(s, known)
        return masked

    def line(self, raw: bytes) -> bytes:
        """One raw line of vLLM's, masked as :meth:`text` masks text (same values, same patterns)."""
        with self._lock:
            known, trigger = self._bytes, self._trigger_bytes
        if not trigger.search(_lower(raw)):
            return raw
        masked: bytes = _MASK_BYTES(raw, known)
        return masked

    def lines(self, raws: list[bytes]) -> list[bytes]:
        """The lines of one read of vLLM's pipe, each masked as :meth:`line` masks it.

        The same decision, made once per read: the trigger words are looked for with ``bytes.find`` in
        the lowered read (C, a few GB/s; the alternation above costs ~1.5 us per 120-byte line), and
        only the lines holding one are masked. A hit counts for a line only when it lies inside it, so
        a registered value spanning a line break masks nothing here either."""
        with self._lock:
            known, words = self._bytes, self._trigger_words
        if not raws:
            return raws
        low = b"\n".join(raws).lower()
        hits: set[int] = set()
        ends: list[int] = []
        for word in words:
            at = low.find(word)
            while at >= 0:
                if not ends:                  # where each line ends in ``low`` (made at the first hit)
                    ends = list(itertools.accumulate(len(r) + 1 for r in raws))
                i = bisect.bisect_right(ends, at)
                if at + len(word) < ends[i]:          # inside line i (its end is the newline at ends[i] - 1)
                    hits.add(i)
                    at = low.find(word, ends[i])      # the rest of line i decides nothing more
                else:
                    at = low.find(word, at + 1)
        if not hits:
            return raws
        return [_MASK_BYTES(r, known) if i in hits else r for i, r in enumerate(raws)]

    def argv(self, argv: Iterable[str]) -> list[str]:
        """``argv`` with every value of a secret flag masked (``--api-key *** ***``, ``--api-key=***``)
        and every other token masked as text."""
        tokens = [str(t) for t in argv]
        out = list(tokens)
        for arg in split_args(tokens, greedy=_secret_flag):
            if arg.name is None or not _secret_flag(arg.name):
                continue
            first = arg.start
            if arg.inline:
                out[first] = f"{arg.raw}={MASK}"
            for k in range(first + 1, arg.end):
                out[k] = MASK
        return [t if t == MASK or t.endswith("=" + MASK) else self.text(t) for t in out]

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """A copy of ``environ`` with secret-named variables masked, the rest masked as text."""
        return {k: (MASK if is_secret_name(k) and v else self.text(v)) for k, v in environ.items()}

    def obj(self, obj: Any, extra: Iterable[str] = ()) -> Any:
        """A JSON-like tree masked: secret-named keys' values, argv-like lists as argv, every string
        as text. Secret values found anywhere in the tree (an ``--api-key`` in one argv) are masked
        everywhere else in it too (the same key quoted in an evidence line)."""
        found: list[str] = list(extra)
        _harvest(obj, found)
        return self._obj(obj, tuple(found))

    def _obj(self, obj: Any, extra: tuple[str, ...]) -> Any:
        if isinstance(obj, Mapping):
            out: dict[Any, Any] = {}
            for k, v in obj.items():
                if isinstance(k, str) and is_secret_name(k) and v and isinstance(v, (str, bytes, list, tuple)):
                    out[k] = MASK if isinstance(v, (str, bytes)) else [MASK for _ in v]
                elif isinstance(k, str) and k.lower() in ("env", "environ", "environment") and isinstance(v, Mapping):
                    out[k] = {ek: (MASK if is_secret_name(str(ek)) and ev else self._obj(ev, extra))
                              for ek, ev in v.items()}
                else:
                    out[self._obj(k, extra) if isinstance(k, str) else k] = self._obj(v, extra)
            return out
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(x, str) for x in obj) and any(x.startswith("-") for x in obj):
                return [self.text(x, extra) for x in self.argv(obj)]
            return [self._obj(x, extra) for x in obj]
        if isinstance(obj, str):
            return self.text(obj, extra)
        if isinstance(obj, bytes):
            return self.line(obj)
        return obj


#: The guard's registry (one per process).
REGISTRY = Secrets()


def restore_masked(argv: Iterable[str], source: Iterable[str]) -> list[str]:
    """``argv`` whose masked secret values (``--api-key *** ***``) are taken back from ``source`` (the
    user's own flags); a masked flag ``source`` does not have is dropped with its values."""
    src = [str(t) for t in source]
    values: dict[str, tuple[bool, list[str]]] = {}
    for arg in split_args(src, greedy=_secret_flag):
        if arg.name is not None and _secret_flag(arg.name):
            values[arg.name] = (arg.inline, [str(t) for t in src[arg.start:arg.end]])
    tokens = [str(t) for t in argv]
    out: list[str] = []
    for arg in split_args(tokens, greedy=_secret_flag):
        piece = tokens[arg.start:arg.end]
        if arg.name is not None and _secret_flag(arg.name) and MASK in arg.values:
            if arg.name in values:
                out.extend(values[arg.name][1])
            continue
        out.extend(piece)
    return out
