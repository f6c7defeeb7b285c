"""Every default the README states is the one in force, read through the public configuration.

The README's settings table is the source of truth: each row's variable, key and default is
parsed from it and checked against what ``config.resolve`` gives with nothing set (no file, an
empty environment), and each variable is shown to set its key. The status endpoint's request
deadline (5 s) and connection cap (256), the launch budget, the rotation sizes and the stop grace
are checked at their stated values too. The defaults are exercised at their values by real guards
in tests/integration/test_promises.py (the 5 s deadline and the 256-connection cap) and by the
session's scenarios (backoff, the crash-loop limit and window, the launch budget, port retries).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from supervisor import config
from supervisor.shell import history, output, status_server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def settings_table() -> list[tuple[str, str, str]]:
    """(variable, key, default) for each row of the README's settings table that names a key."""
    rows = []
    for line in README.splitlines():
        m = re.fullmatch(r"\| `(VLLM_GUARD_[A-Z_]+)` \| `([a-z_.]+)` \| `([^`]*)` \|.*", line.strip())
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


ROWS = settings_table()


def resolved(environ: dict[str, str] | None = None) -> dict[str, object]:
    env = {"HOME": "/home/nobody-here", "XDG_CONFIG_HOME": "/nonexistent", **(environ or {})}
    cfg = config.resolve(argparse.Namespace(), env, require_model=False)
    return config.flatten(cfg)


def as_text(value: object) -> str:
    """A value the way the README's table writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def test_the_table_has_every_setting_and_nothing_else():
    assert len(ROWS) >= 40
    assert {key for _, key, _ in ROWS} == set(config.SPECS) - {"vllm_file_args"}
    assert all(config.env_name(key) == var for var, key, _ in ROWS)


@pytest.mark.parametrize("var,key,default", ROWS, ids=[r[1] for r in ROWS])
def test_each_setting_defaults_to_what_the_readme_says(var, key, default):
    values = resolved()
    if key == "state_dir":        # filled in: $XDG_STATE_HOME/vllm-guard, else ~/.local/state/vllm-guard
        assert values[key] == "/home/nobody-here/.local/state/vllm-guard"
        return
    assert as_text(values[key]) == default, f"{key}: {values[key]!r}, the README says {default!r}"


SAMPLES = {"log_level": "debug", "log_format": "json", "remedies.allowed": "restart",
           "remedies.no_kv_order": "enforce_eager", "notify_url": "http://127.0.0.1:9/hook", "port": "8123",
           "status.port": "8124", "status.host": "127.0.0.2", "host": "127.0.0.3", "backoff.maximum": "300.0",
           "backoff.multiplier": "3.0", "vllm_args": "--enforce-eager"}


@pytest.mark.parametrize("var,key,default", ROWS, ids=[r[1] for r in ROWS])
def test_each_variable_sets_its_key(var, key, default):
    kind = config.SPECS[key].kind
    sample = SAMPLES.get(key) or {bool: "false" if default == "true" else "true", int: "7", float: "0.25"}.get(
        kind, "/tmp/x" if ("dir" in key or "file" in key or "command" in key) else "x")
    got = resolved({var: sample})[key]
    if key == "vllm_args":
        assert got == ("--enforce-eager",)
    elif kind is float:
        assert got == float(sample)
    else:
        assert as_text(got) == sample, (key, got)


def test_the_status_endpoints_request_deadline_and_connection_cap_at_their_defaults():
    """README: "each connection must send its whole request within 5 s, and past 256 connections the
    oldest one still sending makes room" -- the guard builds its endpoint with the defaults."""
    server = status_server.StatusServer("127.0.0.1", 0, "a-token", dict, lambda c, a: None, None, lambda: True)
    assert (server.request_timeout, server.max_connections) == (5.0, 256)
    assert "within 5 s" in README and "past 256 connections" in README


def test_the_state_logs_rotate_at_the_sizes_the_readme_states():
    assert "rotated at 4 MiB" in README and "rotated at 8 MiB" in README
    assert history.MAX_BYTES == 4 * 1024 * 1024
    assert output.MAX_BYTES == 8 * 1024 * 1024


def test_the_documented_timeouts_and_limits_are_in_force():
    values = resolved()
    # README: "--stall-timeout (900 s ...)", "--startup-timeout (1800 s)", "--stop-grace, 20 s",
    # "the launch budget (max_launches, 6)", "--min-model-len (default 2048)"
    assert (values["stall_timeout"], values["startup_timeout"], values["stop_grace"]) == (900.0, 1800.0, 20.0)
    assert (values["max_launches"], values["remedies.min_model_len"]) == (6, 2048)
    for text in ("`--stall-timeout` (900 s", "`--startup-timeout` (1800 s)", "`--stop-grace`, 20 s",
                 "(`max_launches`, 6)", "`--min-model-len` (default 2048)", "`127.0.0.1:8077` by default"):
        assert text in README, text
    assert (values["status.host"], values["status.port"]) == ("127.0.0.1", 8077)
