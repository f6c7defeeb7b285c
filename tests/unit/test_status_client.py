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
from supervisor.shell.locks import StateDirLock
from supervisor.shell.metrics import Metrics
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
    # the snapshot of the guard that holds the lock (this process): a client believes no other
    srv = StatusServer("127.0.0.1", 0, token, lambda: {**SNAP, "guard_pid": os.getpid()}, inbox, Metrics(),
                       lambda: True)
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
    assert f"pid        31337 (guard {os.getpid()})" in out
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
    # a guard that took its state dir (the lock names it) and has not published an endpoint yet
    with StateDirLock(str(tmp_path)):
        code, _, err = run("status", "--state-dir", str(tmp_path))
    assert code == 1 and f"vllm-guard (pid {os.getpid()}) has no status endpoint" in err


def test_a_guard_json_whose_pid_does_not_hold_the_lock_is_no_guard(tmp_path):
    (tmp_path / "guard.json").write_text(json.dumps({"pid": os.getpid(), "status_port": 9}))
    code, _, err = run("status", "--state-dir", str(tmp_path))
    assert code == 1 and f"vllm-guard is not running in {tmp_path} (pid {os.getpid()} no longer holds it" in err


def test_group_readable_token_file_is_used_with_a_warning(tmp_path):
    from structlog.testing import capture_logs

    f = tmp_path / "tok"
    f.write_text("tok-abcdef\n")
    f.chmod(0o644)
    with capture_logs() as logs:
        assert auth.resolve_token(str(tmp_path), str(f), {})[0] == "tok-abcdef"
    assert [e["event"] for e in logs] == ["token file is readable by other users; chmod 600 it"]



# -- where the token goes: only with a POST, only to the guard that holds the state dir ---------------

class Recorder:
    """Something listening on a port (a squatter, a stale endpoint's new owner): records every request."""

    def __init__(self, snapshot: dict | None = None) -> None:
        import http.server
        import threading

        self.requests: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                recorder.requests.append((self.command, self.path, self.headers.get("Authorization")))
                body = json.dumps(snapshot or {"state": "healthy", "guard_pid": 1}).encode()
                self.send_response(200 if self.command == "GET" else 202)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *a) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def tokens(self) -> list[str]:
        return [auth for _, _, auth in self.requests if auth]


@pytest.fixture
def recorder():
    made: list[Recorder] = []

    def make(snapshot: dict | None = None) -> Recorder:
        made.append(Recorder(snapshot))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_a_stale_guard_json_pointing_at_a_listener_gets_no_token(tmp_path, recorder):
    squatter = recorder({"state": "healthy", "guard_pid": os.getpid()})
    (tmp_path / "guard.json").write_text(json.dumps({"pid": os.getpid(), "status_host": "127.0.0.1",
                                                     "status_port": squatter.port}))
    for command in ("stop", "restart", "status"):
        code, _, err = run(command, "--state-dir", str(tmp_path), environ={"VLLM_GUARD_TOKEN": "secret-token"})
        assert code == 1 and "not running" in err
    assert squatter.requests == []


def test_a_port_given_by_hand_is_asked_for_status_but_never_sent_the_token(tmp_path, recorder):
    other = recorder({"state": "healthy", "guard_pid": 4242, "model": "m"})
    code, out, _ = run("status", "--state-dir", str(tmp_path), "--status-port", str(other.port),
                       environ={"VLLM_GUARD_TOKEN": "secret-token"})
    assert code == 0 and "state      healthy" in out
    code, _, err = run("stop", "--state-dir", str(tmp_path), "--status-port", str(other.port),
                       environ={"VLLM_GUARD_TOKEN": "secret-token"})
    assert code == 1 and "the token is sent only to a running guard" in err
    assert other.requests == [("GET", "/status", None)]


def test_an_endpoint_answering_for_another_guard_is_not_believed_nor_sent_the_token(tmp_path, recorder):
    impostor = recorder({"state": "healthy", "guard_pid": 4242})
    with StateDirLock(str(tmp_path)) as lock:
        lock.publish(status_host="127.0.0.1", status_port=impostor.port)
        for command in ("status", "stop"):
            code, _, err = run(command, "--state-dir", str(tmp_path), environ={"VLLM_GUARD_TOKEN": "secret-token"})
            assert code == 1 and "answers for pid 4242, not for the guard that holds" in err
    assert impostor.tokens() == [] and {m for m, _, _ in impostor.requests} == {"GET"}


def test_the_guard_holding_the_state_dir_gets_the_token_with_a_post_only(tmp_path, recorder):
    guard = recorder({"state": "healthy", "guard_pid": os.getpid()})
    with StateDirLock(str(tmp_path)) as lock:
        lock.publish(status_host="127.0.0.1", status_port=guard.port)
        assert run("status", "--state-dir", str(tmp_path), environ={"VLLM_GUARD_TOKEN": "secret-token"})[0] == 0
        assert run("restart", "--state-dir", str(tmp_path), environ={"VLLM_GUARD_TOKEN": "secret-token"})[0] == 0
    assert guard.requests == [("GET", "/status", None), ("GET", "/status", None),
                              ("POST", "/restart", "Bearer secret-token")]


def test_status_of_a_state_dir_no_guard_holds_says_so_whatever_listens_on_the_default_port(tmp_path, recorder):
    default = recorder({"state": "healthy", "guard_pid": 4242, "model": "someone-else"})
    code, out, err = run("status", "--state-dir", str(tmp_path / "nonexistent"),
                         environ={"VLLM_GUARD_STATUS_PORT": str(default.port)})
    assert (code, out) == (1, "")
    assert err == f"no vllm-guard is running in {tmp_path / 'nonexistent'} (no guard holds it; give the guard's " \
                  "--state-dir, or see `vllm-guard ps`)\n"
    assert default.requests == []


# -- history as a person reads it --------------------------------------------------------------------

T0 = 1_764_000_000.0


@pytest.mark.parametrize("record, alive, says", [
    ({"n": 2, "outcome": "restart", "time_to_healthy_s": 62.4, "started_at": T0, "ended_at": T0 + 62.4 + 190},
     False, "launch 2  healthy in 1 min 02 s, served 3 min 10 s, then restarted on request"),
    ({"n": 1, "outcome": "failed", "kind": "kv_cache_insufficient", "phase": "kv_cache", "evidence": "ValueError: x",
      "started_at": T0}, False, "launch 1  failed while allocating the KV cache: kv_cache_insufficient: ValueError: x"),
    ({"n": 3, "outcome": "died", "kind": "engine_dead", "evidence": "EngineDeadError", "time_to_healthy_s": 5.0,
      "started_at": T0, "ended_at": T0 + 65.0}, False, "launch 3  healthy in 5 s, served 1 min 00 s, then died: "
                                                       "engine_dead: EngineDeadError"),
    ({"n": 4, "outcome": "stopped", "time_to_healthy_s": 5.0, "started_at": T0, "ended_at": T0 + 10},
     False, "launch 4  healthy in 5 s, served 5 s, then stopped"),
    ({"n": 5, "outcome": "healthy", "time_to_healthy_s": 5.0, "started_at": T0}, True,
     "launch 5  healthy in 5 s, still serving"),
    ({"n": 5, "outcome": "healthy", "time_to_healthy_s": 5.0, "started_at": T0}, False,
     "launch 5  healthy in 5 s, then the guard ended without recording more"),
    ({"n": 6, "outcome": "stopped", "started_at": T0, "ended_at": T0 + 3}, False, "launch 6  stopped while starting"),
    ({"n": 7, "outcome": "running", "started_at": T0}, True, "launch 7  starting"),
])
def test_each_history_line_says_what_happened_in_order(record, alive, says):
    line = cli_client._history_line(record, alive)
    assert line.endswith(says) and "restart in" not in line


def test_history_marks_each_guard_run():
    records = [{"run": f"111-{int(T0)}", "n": 1, "outcome": "failed", "kind": "k", "started_at": T0},
               {"run": f"111-{int(T0)}", "n": 2, "outcome": "stopped", "time_to_healthy_s": 3.0, "started_at": T0 + 5,
                "ended_at": T0 + 9},
               {"run": f"222-{int(T0) + 3600}", "n": 1, "outcome": "healthy", "time_to_healthy_s": 2.0,
                "started_at": T0 + 3600}]
    lines = list(cli_client.history_lines(records, {"pid": 222}))
    heads = [i for i, line in enumerate(lines) if line.startswith("── guard run started")]
    assert heads == [0, 3]
    assert lines[0].endswith(" (pid 111) ──") and lines[3].endswith(" (pid 222) ──")
    assert lines[4].endswith("launch 1  healthy in 2 s, still serving")


@pytest.mark.parametrize("argv, guard", [
    (["/usr/local/bin/vllm-guard", "serve", "m"], True),
    (["/opt/vg/bin/python3", "/opt/vg/bin/vllm-guard", "start", "--model", "m"], True),
    (["python", "-m", "supervisor", "start", "--model", "m"], True),
    (["vllm-guard", "status"], False),                  # a client, not a guard
    (["python", "-m", "supervisor", "ps"], False),
    (["vllm", "serve", "m"], False),
    (["supervisord", "-c", "x"], False),
    ([], False),
])
def test_which_processes_are_guards(argv, guard):
    assert cli_client._is_guard_argv(argv) is guard
