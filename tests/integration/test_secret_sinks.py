"""A real guard, the fake vLLM, random secrets in every form: no sink ever holds one.

The guard is given several API keys (``--api-key K1 K2``, a list since vLLM 0.10.1) or one,
``--hf-token=T``, a secret-named variable of its environment, and its own bearer token. The fake
vLLM prints them back as vLLM 0.10-0.28 does (``non-default args: {...}``, unredacted). The first
launch fails (its KV cache is too small) and the second one serves, so every sink has something in
it: ``/status``, ``/metrics``, ``history``, ``vllm.log`` and ``logs``, ``learned.json``, the webhook's
bodies, the guard's log, ``ps`` (every process of the launch), a message naming another process
that holds vLLM's port, ``--dry-run``, and ``diagnose --json`` of a log that quotes them.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
from guardrun import LLAMA8B, ROOT, GuardRun
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(ROOT / "tests" / "fakes"))
from hostile_http import HostileServer  # noqa: E402

SECRET = st.text(string.ascii_letters + string.digits + "_-.~", min_size=12, max_size=40).filter(
    lambda s: not s.startswith("-"))
VARS = ["HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_SERVICE_TOKEN"]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))


def cmdlines(state_dir: Path) -> list[str]:
    from supervisor.shell import procs

    out = []
    for p in procs.marked_processes(str(state_dir)):
        h = p.psutil()
        if h is not None:
            try:
                out.append(" ".join(h.cmdline()))
            except psutil.Error:
                pass
    return out


@settings(max_examples=3, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(keys=st.lists(SECRET, min_size=1, max_size=3, unique=True), hf=SECRET, var=st.sampled_from(VARS),
       env_secret=SECRET, token=SECRET)
def test_no_sink_holds_a_secret_given_in_any_form(tmp_path_factory, keys, hf, var, env_secret, token):
    secrets = [*keys, hf, env_secret, token]
    # one secret inside another: where each went could not be told apart
    assume(not any(a in b for a in secrets for b in secrets if a is not b))
    tmp = tmp_path_factory.mktemp("guard")
    vllm_args = ["--api-key", *keys, f"--hf-token={hf}"]
    # The guard's own command line is the operator's to keep clean: the secrets come from its config
    # file and environment, as under systemd (EnvironmentFile=).
    toml = tmp / "guard.toml"
    toml.write_text(f"vllm_args = {json.dumps(vllm_args)}\n")
    sinks: dict[str, str] = {}
    with HostileServer("ok") as hook:
        g = GuardRun(tmp, {"version": "0.32.0", "model": LLAMA8B}, token=token, env={var: env_secret},
                     guard_args=["--config", str(toml), "--notify-url", hook.url]).start()
        try:
            s = g.wait_healthy(launches=2, timeout=90)
            assert s["last_probe"]["ok"], "the probe authenticates with the first key"
            sinks["ps"] = "\n".join(cmdlines(g.state_dir))
            base = f"http://127.0.0.1:{g.status_port}"
            sinks["/status"] = httpx.get(base + "/status", timeout=5).text
            sinks["/metrics"] = httpx.get(base + "/metrics", timeout=5).text
            hook.wait_requests(2)
            assert g.terminate() == 0
        finally:
            g.close()
        sinks["webhook"] = "\n".join(b.decode("utf-8", "replace") for b in hook.bodies)
    env = {**g.env}
    env.pop("VLLM_GUARD_TOKEN", None)
    sinks["guard log"] = g.output()
    sinks["vllm.log"] = (g.state_dir / "vllm.log").read_text(errors="replace")
    sinks["history.jsonl"] = (g.state_dir / "history.jsonl").read_text(errors="replace")
    sinks["learned.json"] = (g.state_dir / "learned.json").read_text(errors="replace")
    sinks["history"] = cli("history", "--json", "--state-dir", str(g.state_dir), env=env).stdout
    sinks["logs"] = cli("logs", "-n", "2000", "--state-dir", str(g.state_dir), env=env).stdout
    dry = cli("start", "--dry-run", "--config", str(toml), "--model", "fake/model", "--state-dir",
              str(tmp / "dry"), env={**env, var: env_secret})
    sinks["dry-run"] = dry.stdout + dry.stderr
    quoted = tmp / "quoted.log"
    quoted.write_text(f"vllm serve m --api-key {' '.join(keys)} --hf-token {hf}\n"
                      f"api_server.py: error: unrecognized arguments: --api-key {' '.join(keys)} --hf-token={hf}\n")
    diag = cli("diagnose", "--json", str(quoted), env=env)
    sinks["diagnose --json"] = diag.stdout + diag.stderr
    # A process holding vLLM's port with the secrets on its own command line: the refusal names it.
    listen = ("import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
              "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", listen, "--api-key", *keys, f"--token={token}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        other = cli("start", "--model", "fake/model", "--state-dir", str(tmp / "other"), "--port", str(port),
                    "--status-port", "0", "--vllm-command", f"{sys.executable} -c pass", env=env)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    sinks["another process"] = other.stdout + other.stderr
    assert other.returncode == 78 and "held by" in sinks["another process"], sinks["another process"][-2000:]

    many = len(keys) > 1
    for value in secrets:
        for where, content in sinks.items():
            if where == "ps" and many and value in keys:
                continue          # several keys cannot leave vLLM's command line (VLLM_API_KEY holds one)
            assert value not in content, f"{value!r} reached {where}:\n{content[-3000:]}"
    assert ("every local user can read a command line" in sinks["guard log"]) == many
