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
from collections.abc import Mapping
from pathlib import Path

import structlog

from supervisor.config import ConfigError
from supervisor.errors import StateError
from supervisor.named_files import read_named_file
from supervisor.secrets import MASK as MASK  # re-exported for callers on other branches
from supervisor.secrets import REGISTRY
from supervisor.secrets import argv_secrets as argv_secrets
from supervisor.secrets import is_secret_name as is_secret_name
from supervisor.secrets import restore_masked as restore_masked
from supervisor.shell.statefiles import write_secret_file

log = structlog.get_logger("vllm_guard.auth")

TOKEN_ENV = "VLLM_GUARD_TOKEN"
TOKEN_FILE_NAME = "token"

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
    REGISTRY.add(token)
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
