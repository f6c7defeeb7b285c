"""The status endpoint's bearer token and its bind policy.

A token comes from ``VLLM_GUARD_TOKEN`` or a token file (both "explicit"); without either, one is
generated into the state dir with mode 0600. Every token is registered as a secret
(:mod:`supervisor.secrets`, which masks it, and every other secret, wherever the guard shows,
keeps or sends anything).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path
from typing import Mapping

import structlog

from supervisor.config import ConfigError, read_user_file
from supervisor.secrets import MASK, REGISTRY, argv_secrets, is_secret_name, restore_masked  # noqa: F401

log = structlog.get_logger("vllm_guard.auth")

TOKEN_ENV = "VLLM_GUARD_TOKEN"
TOKEN_FILE_NAME = "token"

class TokenError(ConfigError):
    """The token file is missing, unreadable or empty."""


# -- tokens ---------------------------------------------------------------------------------------

MAX_TOKEN_FILE = 4096      # a token file is a line; /dev/zero or a log file is not read to the end


def _read_token(path: str) -> str:
    raw = read_user_file(path, "token file", MAX_TOKEN_FILE, f"{MAX_TOKEN_FILE} bytes; it should hold one token",
                         TokenError)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} is not UTF-8 text") from None
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise TokenError(f"token file {path} is {'empty' if not text else 'not one printable token'}")
    return text


def write_secret_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 (never readable by others, not even briefly)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; be explicit
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def resolve_token(state_dir: str, token_file: str, environ: Mapping[str, str]) -> tuple[str, str | None, bool]:
    """Find the bearer token: ``(token, generated_path or None, explicit)``.

    ``$VLLM_GUARD_TOKEN`` wins, then ``token_file``; otherwise a fresh token is written to
    ``<state_dir>/token`` (0600) and its path returned so the caller can print it.
    """
    env = environ.get(TOKEN_ENV, "").strip()
    if env:
        REGISTRY.add(env)
        return env, None, True
    if token_file:
        token = _read_token(token_file)
        with contextlib.suppress(OSError):
            if os.stat(token_file).st_mode & 0o077:
                log.warning("token file is readable by other users; chmod 600 it",
                            token_file=token_file)
        REGISTRY.add(token)
        return token, None, True
    path = str(Path(state_dir) / TOKEN_FILE_NAME)
    token = secrets.token_urlsafe(32)
    write_secret_file(path, token + "\n")
    REGISTRY.add(token)
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


# -- redaction: the registry is supervisor.secrets -------------------------------------------------
# These names are kept for callers on other branches of this round; new code uses
# ``supervisor.secrets.REGISTRY`` and the functions there directly.

known_secrets = REGISTRY.values
register_secret = REGISTRY.add
register_env_secrets = REGISTRY.add_environ
redact_text = REGISTRY.text
redact_argv = REGISTRY.argv
redact_env = REGISTRY.environ
redact_obj = REGISTRY.obj
