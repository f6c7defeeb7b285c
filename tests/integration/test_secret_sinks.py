"""A real guard, the fake vLLM, random secrets in every form: no sink ever holds one.

The guard is given one or several API keys in every form (``--api-key K1 K2``, a list since vLLM
0.10.1, first or after other flags; ``--api-key=K``; ``--api-key`` given twice; ``api-key:`` in vLLM's
``--config`` YAML; ``VLLM_API_KEY``), a Hugging Face token in every form (``--hf-token=T``,
``--hf-token T``, ``HF_TOKEN``, ``hf-token:`` in the YAML), a secret-named variable of its
environment, its own bearer token, and a webhook URL with a password and a token in its query. The fake
vLLM prints them back as vLLM 0.10-0.28 does (``non-default args: {...}``, unredacted). The first
launch fails (its KV cache is too small) and the second one serves, so every sink has something in
it: ``/status``, the status page, ``/metrics``, ``vllm-guard status`` and ``ps`` (text and JSON),
``history``, ``vllm.log`` and ``logs``, ``learned.json``, the webhook's bodies, the guard's log, the
command lines of every process of the launch, a message naming another process that holds vLLM's
port, ``--dry-run``, and ``diagnose`` (text and ``--json``) of a log that quotes them.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from guardrun import LLAMA8B, ROOT, GuardRun
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(ROOT / "tests" / "fakes"))
from hostile_http import HostileServer  # noqa: E402

# (a digit and a letter in it, as in every token: hypothesis also draws the words of the code it tests, and a
# "secret" that is one of the words the guard prints, VLLM_GUARD_TOKEN on the status page, cannot be told apart)
SECRET = st.text(string.ascii_letters + string.digits + "_-.~", min_size=12, max_size=40).filter(
    lambda s: not s.startswith("-") and any(c.isdigit() for c in s) and any(c.isalpha() for c in s))
URL_PART = st.text(string.ascii_letters + string.digits, min_size=12, max_size=32).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s))
KEY_FORMS = ["list", "after other flags", "equals", "repeated", "config yaml", "VLLM_API_KEY"]
HF_FORMS = ["equals", "space", "HF_TOKEN", "config yaml"]
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


# Every form of the API key, each beside a form of the Hugging Face token (every one of those too);
# hypothesis draws the values, the variable and the webhook URL's secrets.
FORMS = [(k, HF_FORMS[i % len(HF_FORMS)]) for i, k in enumerate(KEY_FORMS)]


@pytest.mark.parametrize("key_form, hf_form", FORMS, ids=[f"{k}+hf {h}" for k, h in FORMS])
@settings(max_examples=1, deadline=None, derandomize=False, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(keys=st.lists(SECRET, min_size=1, max_size=3, unique=True), hf=SECRET, var=st.sampled_from(VARS),
       env_secret=SECRET, token=SECRET, hook_password=URL_PART, hook_query=URL_PART)
def test_no_sink_holds_a_secret_given_in_any_form(tmp_path_factory, key_form, hf_form, keys, hf, var, env_secret,
                                                  token, hook_password, hook_query):
    if key_form in ("equals", "VLLM_API_KEY"):
        keys = keys[:1]                       # one value each
    if key_form == "repeated" and len(keys) == 1:
        keys = [*keys, keys[0][::-1] + "Z"]
    secrets = [*keys, hf, env_secret, token, hook_password, hook_query]
    # one secret inside another: where each went could not be told apart
    assume(not any(a in b for a in secrets for b in secrets if a is not b))
    tmp = tmp_path_factory.mktemp("guard")
    yaml_cfg: dict[str, object] = {"max-num-seqs": 8}
    env = {var: env_secret}
    vllm_args = {
        "list": ["--api-key", *keys, "--seed", "1"],
        "after other flags": ["--seed", "1", "--max-num-seqs", "8", "--api-key", *keys],
        "equals": [f"--api-key={keys[0]}"],
        "repeated": ["--api-key", keys[0], "--seed", "1", "--api-key", *keys[1:]],
        "config yaml": [],
        "VLLM_API_KEY": [],
    }[key_form]
    if key_form == "config yaml":
        yaml_cfg["api-key"] = keys if len(keys) > 1 else keys[0]
    elif key_form == "VLLM_API_KEY":
        env["VLLM_API_KEY"] = keys[0]
    if hf_form == "equals":
        vllm_args.append(f"--hf-token={hf}")
    elif hf_form == "space":
        vllm_args += ["--hf-token", hf]
    elif hf_form == "HF_TOKEN":
        env["HF_TOKEN"] = hf
    else:
        yaml_cfg["hf-token"] = hf
    vllm_yaml = tmp / "vllm.yaml"
    vllm_yaml.write_text(yaml.safe_dump(yaml_cfg))
    vllm_args += ["--config", str(vllm_yaml)]
    sinks: dict[str, str] = {}
    with HostileServer("ok") as hook:
        notify = hook.url.replace("http://", f"http://hookuser:{hook_password}@") + f"?token={hook_query}&x=1"
        # The guard's own command line is the operator's to keep clean: the secrets come from its config
        # file and environment, as under systemd (EnvironmentFile=).
        toml = tmp / "guard.toml"
        toml.write_text(f"vllm_args = {json.dumps(vllm_args)}\nnotify_url = {json.dumps(notify)}\n")
        g = GuardRun(tmp, {"version": "0.32.0", "model": LLAMA8B, "echo_secrets": True}, token=token, env=env,
                     guard_args=["--config", str(toml)]).start()
        try:
            s = g.wait_healthy(launches=2, timeout=90)
            assert s["last_probe"]["ok"], "the probe authenticates with the key vLLM uses"
            sinks["command lines"] = "\n".join(cmdlines(g.state_dir))
            base = f"http://127.0.0.1:{g.status_port}"
            sinks["/status"] = httpx.get(base + "/status", timeout=5).text
            sinks["status page"] = httpx.get(base + "/", timeout=5).text
            sinks["/metrics"] = httpx.get(base + "/metrics", timeout=5).text
            client_env = {k: v for k, v in g.env.items() if k != "VLLM_GUARD_TOKEN"}
            for what in (["status"], ["status", "--json"], ["ps"], ["ps", "--json"]):
                got = cli(*what, "--state-dir", str(g.state_dir), env=client_env)
                assert got.returncode == 0, got.stderr[-2000:]
                sinks[" ".join(what)] = got.stdout + got.stderr
            hook.wait_requests(2)
            assert g.terminate() == 0
        finally:
            g.close()
        sinks["webhook"] = "\n".join(b.decode("utf-8", "replace") for b in hook.bodies)
    env = {k: v for k, v in g.env.items() if k != "VLLM_GUARD_TOKEN"}
    sinks["guard log"] = g.output()
    sinks["vllm.log"] = (g.state_dir / "vllm.log").read_text(errors="replace")
    sinks["history.jsonl"] = (g.state_dir / "history.jsonl").read_text(errors="replace")
    sinks["learned.json"] = (g.state_dir / "learned.json").read_text(errors="replace")
    sinks["history"] = cli("history", "--json", "--state-dir", str(g.state_dir), env=env).stdout
    sinks["logs"] = cli("logs", "-n", "2000", "--state-dir", str(g.state_dir), env=env).stdout
    dry = cli("start", "--dry-run", "--config", str(toml), "--model", "fake/model", "--state-dir",
              str(tmp / "dry"), env=env)
    sinks["dry-run"] = dry.stdout + dry.stderr
    quoted = tmp / "quoted.log"
    quoted.write_text(f"vllm serve m --api-key {' '.join(keys)} --hf-token {hf}\n"
                      f"POST {notify} failed\n"
                      f"api_server.py: error: unrecognized arguments: --api-key {' '.join(keys)} --hf-token={hf}\n")
    for what in (["diagnose"], ["diagnose", "--json"]):
        diag = cli(*what, str(quoted), env=env)
        sinks[" ".join(what)] = diag.stdout + diag.stderr
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

    # vLLM was given each secret, from wherever the guard put it, and printed it alone: masked there
    assert sinks["vllm.log"].count("loaded ***") >= 2, sinks["vllm.log"][-3000:]
    warned = "every local user can read a command line" in sinks["guard log"]
    for value in secrets:
        for where, content in sinks.items():
            if where == "command lines" and value in keys and warned:
                continue          # several keys cannot leave vLLM's command line (VLLM_API_KEY holds one): told
            assert value not in content, f"{value!r} ({key_form}, hf {hf_form}) reached {where}:\n{content[-3000:]}"
    # one key, in any form, never needs vLLM's command line, and the operator is not warned
    if key_form in ("list", "after other flags"):
        assert warned == (len(keys) > 1)
    elif key_form != "repeated":        # a repeated flag: the guard may keep both on the command line, and say so
        assert not warned, key_form
