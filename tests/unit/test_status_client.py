"""Tokens, the endpoint file, redaction helpers, and the CLI clients against a real StatusServer."""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import subprocess
import sys

import pytest

from supervisor.cli import client as cli_client
from supervisor.config import ConfigError
from supervisor.shell import auth
from supervisor.shell.metrics import Metrics
from supervisor.shell.statedir import StateDirLock
from supervisor.shell.status_server import StatusServer
from tests.fakes.serve import serving

SNAP = {
    "state": "healthy",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "pid": 31337,
    "guard_pid": 31300,
    "argv": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "27000"],
    "changed_flags": {"--max-model-len": {"value": "27000", "requested": "32768",
                                          "why": "vLLM: KV cache can hold 27392 tokens", "source": "heal"}},
    "launches": [
        {"n": 1, "outcome": "failed", "kind": "kv_cache_insufficient", "evidence": "ValueError: To serve ..."},
        {"n": 2, "outcome": "healthy", "kind": None, "evidence": None},
    ],
    "last_probe": {"ok": True, "latency_ms": 212.5, "error": None},
    "uptime_s": 3725.0,
}


# -- tokens ------------------------------------------------------------------------------------------

def test_token_from_environment_is_explicit(tmp_path):
    token, generated, explicit = auth.resolve_token(str(tmp_path), "", {"VLLM_GUARD_TOKEN": " tok-env "})
    assert (token, generated, explicit) == ("tok-env", None, True)
    assert not (tmp_path / "token").exists()


def test_token_from_file_is_explicit(tmp_path):
    f = tmp_path / "mytoken"
    f.write_text("tok-file\n")
    assert auth.resolve_token(str(tmp_path), str(f), {}) == ("tok-file", None, True)


def test_missing_or_empty_token_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        auth.resolve_token(str(tmp_path), str(tmp_path / "nope"), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        auth.resolve_token(str(tmp_path), str(tmp_path / "empty"), {})


def test_generated_token_is_0600_in_the_state_dir(tmp_path):
    state = tmp_path / "state"
    old = os.umask(0o022)
    try:
        token, generated, explicit = auth.resolve_token(str(state), "", {})
    finally:
        os.umask(old)
    assert generated == str(state / "token") and explicit is False
    assert (state / "token").read_text().strip() == token and len(token) >= 32
    assert stat.S_IMODE(os.stat(generated).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    again, _, _ = auth.resolve_token(str(state), "", {})
    assert again != token                       # fresh per start


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 401), ("", 401), ("Bearer", 401), ("Basic abc", 401), ("Bearer wrong", 403),
     ("Bearer right", 0), ("bearer right", 0), ("Bearer  right ", 0), ("Bearer \udcff", 403)],
)
def test_check_token(header, expected):
    assert auth.check_token(header, "right") == expected


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_binds_need_no_explicit_token(host):
    auth.check_bind(host, False, "")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "guard.example.com"])
def test_reachable_binds_need_an_explicit_token(host):
    with pytest.raises(ConfigError, match="reachable from other machines"):
        auth.check_bind(host, False, "a-generated-token-that-is-long")
    with pytest.raises(ConfigError, match="at least 16"):
        auth.check_bind(host, True, "x")
    auth.check_bind(host, True, "a-token-of-my-own-long-enough")
    auth.check_bind("127.0.0.1", True, "x")          # loopback: any token


# -- redaction ----------------------------------------------------------------------------------------

def test_redact_argv():
    argv = ["vllm", "serve", "m", "--api-key", "k1", "--hf-token=hf_x", "--max-num-batched-tokens", "8192",
            "--tokenizer", "org/tok", "--ssl-keyfile", "/k.pem", "--client_secret", "s", "--db-password", "p",
            "--hf-token", "--enforce-eager"]
    assert auth.redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--max-num-batched-tokens", "8192",
        "--tokenizer", "org/tok", "--ssl-keyfile", "/k.pem", "--client_secret", "***", "--db-password", "***",
        "--hf-token", "--enforce-eager"]


def test_redact_env():
    env = {"HF_TOKEN": "hf_abc", "VLLM_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": "0,1", "VLLM_GUARD_TOKEN": "t", "EMPTY_TOKEN": ""}
    assert auth.redact_env(env) == {"HF_TOKEN": "***", "VLLM_API_KEY": "***", "AWS_SECRET_ACCESS_KEY": "***",
                                    "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "0,1",
                                    "VLLM_GUARD_TOKEN": "***", "EMPTY_TOKEN": ""}


def test_redact_text_catches_known_token_shapes():
    text = "auth failed for hf_AbCdEfGhIjKlMnOpQrStUv with header Authorization: Bearer abc.def-ghi_jkl"
    assert auth.redact_text(text) == "auth failed for *** with header Authorization: Bearer ***"


# -- the endpoint file ----------------------------------------------------------------------------------

def test_the_guard_announces_its_endpoint_and_clients_read_it(tmp_path):
    with StateDirLock(str(tmp_path)) as lock:
        lock.publish(status_host="127.0.0.1", status_port=8077, token_file=str(tmp_path / "token"))
        assert stat.S_IMODE(os.stat(tmp_path / "guard.json").st_mode) == 0o600
        got = cli_client.read_endpoint_file(str(tmp_path))
        assert got is not None and (got["pid"], got["status_port"]) == (os.getpid(), 8077)
    # kept after the guard stops: a client then says the guard's pid is gone, on the port it used
    assert cli_client.read_endpoint_file(str(tmp_path))["status_port"] == 8077


def test_unreadable_endpoint_file_reads_as_absent(tmp_path):
    (tmp_path / "guard.json").write_text("{not json")
    assert cli_client.read_endpoint_file(str(tmp_path)) is None
    (tmp_path / "guard.json").write_bytes(bytes(range(256)))
    assert cli_client.read_endpoint_file(str(tmp_path)) is None


# -- the clients ----------------------------------------------------------------------------------------

class Inbox:
    def __init__(self) -> None:
        self.commands: list[tuple[str, dict]] = []

    def __call__(self, name: str, params: dict) -> None:
        self.commands.append((name, params))


@pytest.fixture
def running(tmp_path):
    """A real StatusServer plus the guard.json and generated token a guard would leave."""
    state = tmp_path / "state"
    token, token_path, _ = auth.resolve_token(str(state), "", {})
    inbox = Inbox()
    srv = StatusServer("127.0.0.1", 0, token, lambda: SNAP, inbox, Metrics(), lambda: True)
    with serving(srv), StateDirLock(str(state)) as lock:
        lock.publish(status_host="127.0.0.1", status_port=srv.port, token_file=token_path)
        yield str(state), inbox


def run(command: str, *argv: str, environ: dict | None = None) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli_client.add_client_arguments(parser, command)
    args = parser.parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    code = cli_client.run_client(command, args, {"HOME": "/nonexistent", **(environ or {})}, out, err)
    return code, out.getvalue(), err.getvalue()


def test_status_human_view(running):
    state, _ = running
    code, out, err = run("status", "--state-dir", state)
    assert (code, err) == (0, "")
    assert "state      healthy" in out
    assert "model      meta-llama/Llama-3.1-8B-Instruct" in out
    assert "pid        31337 (guard 31300)" in out
    assert "uptime     1h 02m" in out
    assert "launches   2" in out
    assert "probe      ok in 212.5 ms" in out
    assert "--max-model-len 32768 -> 27000  (vLLM: KV cache can hold 27392 tokens)" in out


def test_status_json(running):
    state, _ = running
    code, out, _ = run("status", "--json", "--state-dir", state)
    assert code == 0 and json.loads(out)["changed_flags"]["--max-model-len"]["value"] == "27000"


def test_restart_and_reset_and_stop_use_the_token_file(running):
    state, inbox = running
    assert run("restart", "--state-dir", state)[:2] == (0, "vllm-guard: restart requested\n")
    assert run("restart", "--reset", "--state-dir", state)[0] == 0
    assert run("stop", "--state-dir", state)[0] == 0
    assert inbox.commands == [("restart", {"reset": False}), ("restart", {"reset": True}), ("stop", {})]


def test_wrong_token_is_a_clear_failure(running):
    state, inbox = running
    code, _, err = run("stop", "--state-dir", state, environ={"VLLM_GUARD_TOKEN": "wrong"})
    assert code == 1 and "rejected the token" in err
    assert inbox.commands == []


def test_no_guard_running_is_exit_1(tmp_path):
    code, out, err = run("status", "--state-dir", str(tmp_path), "--status-port", "9")
    assert (code, out) == (1, "")
    assert err.startswith("vllm-guard is not running (nothing listens on http://127.0.0.1:9)")


def test_stale_endpoint_file_is_not_running(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "guard.json").write_text(json.dumps({"pid": dead.pid, "status_host": "127.0.0.1", "status_port": 9}))
    code, _, err = run("stop", "--state-dir", str(tmp_path))
    assert code == 1 and f"pid {dead.pid}" in err and "is gone" in err


def test_disabled_endpoint(tmp_path):
    code, _, err = run("status", "--state-dir", str(tmp_path), "--status-port", "0")
    assert code == 1 and "disabled" in err


def test_render_human_tolerates_a_sparse_snapshot():
    text = cli_client.render_human({"state": "planning"})
    assert text.splitlines()[0] == "state      planning"
    assert "flags      as asked" in text and "probe      none yet" in text


def test_render_human_says_the_context_served_of_what_fit():
    text = cli_client.render_human({"state": "healthy", "context": {
        "served": 65408, "requested": 131072, "fit": 65408,
        "text": "context served 65408 of 65408 that fit (131072 asked)"}})
    assert "context    served 65408 of 65408 that fit (131072 asked)" in text.splitlines()
    assert "context" not in cli_client.render_human({"state": "planning", "context": None})


def test_guard_without_an_endpoint_yet(tmp_path):
    (tmp_path / "guard.json").write_text(json.dumps({"pid": os.getpid(), "started": 1.0}))
    code, _, err = run("status", "--state-dir", str(tmp_path))
    assert code == 1 and f"vllm-guard (pid {os.getpid()}) has no status endpoint" in err


def test_group_readable_token_file_is_used_with_a_warning(tmp_path):
    from structlog.testing import capture_logs

    f = tmp_path / "tok"
    f.write_text("tok-abcdef\n")
    f.chmod(0o644)
    with capture_logs() as logs:
        assert auth.resolve_token(str(tmp_path), str(f), {})[0] == "tok-abcdef"
    assert [e["event"] for e in logs] == ["token file is readable by other users; chmod 600 it"]

