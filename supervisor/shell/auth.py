"""The status endpoint's bearer token, and redaction of secrets from anything the guard shows.

A token comes from ``VLLM_GUARD_TOKEN`` or a token file (both "explicit"); without either, one is
generated into the state dir with mode 0600. Redaction works on argv lists, environments, free
text and whole ``/status`` snapshots, so no ``--api-key``, ``HF_TOKEN`` or bearer token leaks
into the status JSON, the logs or the metrics.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from supervisor.config import ConfigError
from supervisor.errors import StateError
from supervisor.named_files import read_named_file
from supervisor.shell.statefiles import write_secret_file

log = structlog.get_logger("vllm_guard.auth")

TOKEN_ENV = "VLLM_GUARD_TOKEN"
TOKEN_FILE_NAME = "token"
MASK = "***"

# Words that make a flag or variable name secret. Whole words only: --max-num-batched-tokens,
# --tokenizer and TOKENIZERS_PARALLELISM are not secrets.
_SECRET_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials", "auth"}
)
_WORD_SPLIT = re.compile(r"[-_.\s]+")
# Well-known token shapes, caught even when nobody registered them.
_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),                          # Hugging Face
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),                        # OpenAI-style API keys
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),         # Authorization headers
]

_known: set[str] = set()
_known_lock = threading.Lock()


class TokenError(ConfigError):
    """The token file is missing, unreadable or empty."""


# -- tokens ---------------------------------------------------------------------------------------

MAX_TOKEN_FILE = 4096      # a token file is a line; /dev/zero or a log file is not read to the end


def _read_token(path: str) -> str:
    raw = read_named_file(path, "token file", MAX_TOKEN_FILE, f"{MAX_TOKEN_FILE} bytes; it should hold one token",
                         TokenError)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} is not UTF-8 text") from None
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise TokenError(f"token file {path} is {'empty' if not text else 'not one printable token'}")
    return text


def resolve_token(state_dir: str, token_file: str, environ: Mapping[str, str]) -> tuple[str, str | None, bool]:
    """Find the bearer token: ``(token, generated_path or None, explicit)``.

    ``$VLLM_GUARD_TOKEN`` wins, then ``token_file``; otherwise a fresh token is written to
    ``<state_dir>/token`` (0600) and its path returned so the caller can print it.
    """
    env = environ.get(TOKEN_ENV, "").strip()
    if env:
        register_secret(env)
        return env, None, True
    if token_file:
        token = _read_token(token_file)
        with contextlib.suppress(OSError):
            if os.stat(token_file).st_mode & 0o077:
                log.warning("token file is readable by other users; chmod 600 it",
                            token_file=token_file)
        register_secret(token)
        return token, None, True
    path = str(Path(state_dir) / TOKEN_FILE_NAME)
    token = secrets.token_urlsafe(32)
    register_secret(token)
    try:
        write_secret_file(path, token + "\n")
    except (OSError, StateError) as e:      # a full disk: the endpoint still works; clients need the token
        log.warning(f"could not write the token file {path} ({getattr(e, 'strerror', None) or e}); "
                    f"clients cannot read it: set {TOKEN_ENV} for both")
    return token, path, False


def read_client_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token a CLI client sends: $VLLM_GUARD_TOKEN, else ``token_file`` (the one given, or the one
    the guard named in its guard.json). Never a guess: a token is not sent where it does not belong."""
    env = environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    if token_file:
        try:
            return _read_token(token_file)
        except TokenError:
            return None
    return None


def check_token(header: str | None, token: str) -> int:
    """HTTP status for an ``Authorization`` header: 0 when it carries ``token``, else 401 or 403."""
    if not header:
        return 401
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401
    ok = hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8"))
    return 0 if ok else 403


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it can be reached from elsewhere


#: The shortest token accepted for a status endpoint other machines can reach.
MIN_REMOTE_TOKEN = 16


def check_bind(host: str, explicit_token: bool, token: str) -> None:
    """Refuse a status endpoint on a reachable address guarded only by a generated token, or by a
    token shorter than :data:`MIN_REMOTE_TOKEN` characters (guessable over the network)."""
    if is_loopback(host):
        return
    if not explicit_token:
        raise ConfigError(
            f"status.host = {host!r} is reachable from other machines; set {TOKEN_ENV} or "
            f"status.token_file (--token-file) to a token of your own, or bind 127.0.0.1"
        )
    if len(token) < MIN_REMOTE_TOKEN:
        raise ConfigError(
            f"status.host = {host!r} is reachable from other machines, and the token is {len(token)} characters; "
            f"use at least {MIN_REMOTE_TOKEN} (e.g. `openssl rand -hex 24`), or bind 127.0.0.1"
        )


# -- redaction ------------------------------------------------------------------------------------

def known_secrets() -> list[str]:
    """The secret values registered so far (for masking vLLM's own passed-through lines)."""
    with _known_lock:
        return sorted(_known, key=len, reverse=True)


def register_secret(value: str | None) -> None:
    """Remember a secret value so redact_text() masks it wherever it appears."""
    if value and len(value) >= 4:  # masking a 1-3 character "secret" would shred ordinary text
        with _known_lock:
            _known.add(value)


def register_env_secrets(environ: Mapping[str, str]) -> None:
    """Register the values of secret-named variables (HF_TOKEN, *_API_KEY, ...)."""
    for name, value in environ.items():
        if is_secret_name(name):
            register_secret(value)


def is_secret_name(name: str) -> bool:
    """Whether a flag or variable name holds a secret: a whole word token/key/secret/password."""
    words = {w for w in _WORD_SPLIT.split(name.lower().lstrip("-")) if w}
    return bool(words & _SECRET_WORDS)


def redact_text(text: str, extra: Iterable[str] = ()) -> str:
    """Mask registered secrets, ``extra`` values and well-known token shapes in free text."""
    with _known_lock:
        values = sorted(_known | {v for v in extra if v and len(v) >= 4}, key=len, reverse=True)
    for value in values:  # longest first, so a secret containing another is masked whole
        if value in text:
            text = text.replace(value, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + MASK, text)
    return text


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Mask the values of secret flags: ``--api-key X`` -> ``--api-key ***`` (``=`` form too)."""
    out: list[str] = []
    mask_next = False
    for token in argv:
        token = str(token)
        if mask_next:
            mask_next = False
            if not token.startswith("--"):
                out.append(MASK)
                continue
        if token.startswith("-") and len(token) > 1:
            name, eq, _value = token.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                    continue
                mask_next = True
        out.append(redact_text(token))
    return out


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` with secret-named variables masked."""
    return {k: (MASK if is_secret_name(k) and v else redact_text(v)) for k, v in environ.items()}


def restore_masked(argv: Iterable[str], source: Iterable[str]) -> list[str]:
    """``argv`` whose masked secret values (``--api-key ***``) are taken back from ``source`` (the
    user's own flags); a masked value ``source`` does not have is dropped with its flag."""
    values: dict[str, str] = {}
    src = [str(t) for t in source]
    for i, token in enumerate(src):
        name, eq, value = token.partition("=")
        if token.startswith("-") and is_secret_name(name):
            if eq:
                values[name] = value
            elif i + 1 < len(src):
                values[name] = src[i + 1]
    out: list[str] = []
    tokens = [str(t) for t in argv]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        if token.startswith("-") and is_secret_name(name):
            masked = value if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
            step = 1 if eq else 2
            if masked == MASK:
                if name in values:
                    out += [f"{name}={values[name]}"] if eq else [name, values[name]]
                i += step
                continue
        out.append(token)
        i += 1
    return out


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """The values of secret flags in ``argv`` (to mask them wherever else they appear)."""
    tokens = [str(t) for t in argv]
    found: list[str] = []
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if not token.startswith("-") or not is_secret_name(name):
            continue
        if eq:
            found.append(value)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            found.append(tokens[i + 1])
    return found


def _harvest(obj: Any, into: list[str]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str):
                into.append(v)
            _harvest(v, into)
    elif isinstance(obj, (list, tuple)):
        if all(isinstance(x, str) for x in obj):
            into.extend(argv_secrets(obj))
        else:
            for x in obj:
                _harvest(x, into)


def redact_obj(obj: Any, extra: Iterable[str] = ()) -> Any:
    """Redact a JSON-like tree: secret-named keys masked, argv-like lists and strings scrubbed.

    Secret values found anywhere in the tree (an ``--api-key`` in one argv) are masked
    everywhere else too (the same key quoted in a changed-flags entry or an evidence line).
    """
    found: list[str] = list(extra)
    _harvest(obj, found)
    return _redact(obj, tuple(found))


def _redact(obj: Any, extra: tuple[str, ...]) -> Any:
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, (str, bytes)) and v:
                out[k] = MASK
            elif isinstance(k, str) and k.lower() in ("env", "environ", "environment") and isinstance(v, Mapping):
                out[k] = {ek: (MASK if is_secret_name(str(ek)) and ev else _redact(ev, extra))
                          for ek, ev in v.items()}
            else:
                out[k] = _redact(v, extra)
        return out
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, str) for x in obj) and any(x.startswith("-") for x in obj):
            return [redact_text(x, extra) for x in redact_argv(obj)]
        return [_redact(x, extra) for x in obj]
    if isinstance(obj, str):
        return redact_text(obj, extra)
    return obj
