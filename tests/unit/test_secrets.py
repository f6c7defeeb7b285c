"""Secrets, as a class: every form a secret is given in, every sink it could reach, every order.

The forms come from vLLM's own parsing (``--api-key`` takes a list since 0.10.1: ``api_key:
list[str] | None``; ``_SENSITIVE_ARG_FIELDS``), and the lines vLLM prints them in from its sources
(0.5-0.9: ``args: Namespace(...)``; 0.10-0.28: ``non-default args: {...}`` unredacted).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import string

import httpx
import pytest
import structlog
import tenacity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.core.flags import secrets_to_environ
from supervisor.secrets import MASK, REGISTRY, Secrets, argv_secrets, is_secret_name, restore_masked
from supervisor.shell.history import History
from supervisor.shell.logs import configure_logging
from supervisor.shell.metrics import Metrics
from supervisor.shell.output import LOG_FILE, VllmOutput
from supervisor.shell.webhook import Webhook

# What an API key or token looks like: URL-safe characters, long enough to be one.
SECRET = st.text(string.ascii_letters + string.digits + "_-.~", min_size=12, max_size=48).filter(
    lambda s: not s.startswith("-"))
SECRET_FLAGS = ["--api-key", "--api_key", "--hf-token", "--watermark-config", "--my-service-token",
                "--db-password", "--s3-secret-key"]
SECRET_VARS = ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "WANDB_API_KEY",
               "AWS_SECRET_ACCESS_KEY", "MY_SERVICE_TOKEN", "DB_PASSWORD"]


# --- names and forms -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SECRET_FLAGS, *SECRET_VARS, "apiKey", "accessToken", "api_key",
                                  "hf_token", "watermark_config", "Authorization", "--token-file"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["--max-num-batched-tokens", "--tokenizer", "TOKENIZERS_PARALLELISM",
                                  "--ssl-keyfile", "--kv-cache-dtype", "max_tokens", "--keyboard", "monkey"])
def test_names_that_are_not_secret(name):
    assert not is_secret_name(name)


def test_every_value_of_a_secret_flag_is_masked_in_every_form():
    argv = ["vllm", "serve", "M", "--api-key", "K1-aaaa", "K2-bbbb", "--port", "8000", "--api_key=K3-cccc",
            "--hf-token", "hf-dddd", "--max-num-batched-tokens", "8192", "--my-token=e-eeee", "f-ffff"]
    shown = REGISTRY.argv(argv)
    assert shown == ["vllm", "serve", "M", "--api-key", MASK, MASK, "--port", "8000", f"--api_key={MASK}",
                     "--hf-token", MASK, "--max-num-batched-tokens", "8192", f"--my-token={MASK}", MASK]
    assert argv_secrets(argv) == ["K1-aaaa", "K2-bbbb", "K3-cccc", "hf-dddd", "e-eeee", "f-ffff"]


def test_secret_keys_inside_a_flags_json_value_are_secrets():
    argv = ["--hf-overrides", json.dumps({"token": "tok-in-json-1", "nested": {"api_key": "key-in-json-2"}})]
    assert argv_secrets(argv) == ["tok-in-json-1", "key-in-json-2"]


def test_masked_values_come_back_from_the_users_own_flags():
    user = ["--api-key", "K1-aaaa", "K2-bbbb", "--port", "1"]
    stored = ["--max-model-len", "4096", "--api-key", MASK, MASK, "--hf-token", MASK]
    assert restore_masked(stored, user) == ["--max-model-len", "4096", "--api-key", "K1-aaaa", "K2-bbbb"]


def test_a_single_key_goes_to_vllms_environment_not_its_command_line():
    argv, env = secrets_to_environ(["vllm", "serve", "M", "--api-key", "K1", "--hf-token=T1", "--port", "1"])
    assert argv == ["vllm", "serve", "M", "--port", "1"] and env == {"VLLM_API_KEY": "K1", "HF_TOKEN": "T1"}
    # several keys: VLLM_API_KEY holds one; a variable set to another key: vLLM < 0.8 let it win
    assert secrets_to_environ(["--api-key", "K1", "K2"]) == (["--api-key", "K1", "K2"], {})
    assert secrets_to_environ(["--api-key", "K1"], {"VLLM_API_KEY": "K0"}) == (["--api-key", "K1"], {})


@pytest.mark.parametrize("line, leaked", [
    (b"args: Namespace(host=None, api_key='ns-key-1234', hf_token=None)", b"ns-key-1234"),
    (b"non-default args: {'model_tag': 'm', 'api_key': ['nd-key-1', 'nd-key-2'], 'port': 8000}", b"nd-key-"),
    (b'{"HF_TOKEN": "json-token-99", "x": 1}', b"json-token-99"),
    (b"export HUGGING_FACE_HUB_TOKEN=env-token-77", b"env-token-77"),
    (b"$ vllm serve M --api-key cmd-key-1 cmd-key-2 --port 8000", b"cmd-key-"),
    (b"GET https://user:url-pass-5@host/x", b"url-pass-5"),
    (b"Authorization: Bearer abcdefghijklmnop", b"abcdefghijklmnop"),
])
def test_secrets_nobody_registered_are_masked_where_vllm_prints_them(line, leaked):
    fresh = Secrets()
    assert leaked not in fresh.line(line)
    assert leaked.decode() not in fresh.text(line.decode())


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.text(min_size=1, max_size=20), max_size=4), text=st.text(max_size=300))
def test_text_and_bytes_are_masked_alike(values, text):
    s = Secrets()
    for v in values:
        s.add(v)
    assert s.line(text.encode("utf-8", "surrogatepass")) == s.text(text).encode("utf-8", "surrogatepass")


@settings(max_examples=200, deadline=None)
@given(secret=SECRET, before=st.text(max_size=80), after=st.text(max_size=80))
def test_a_registered_value_never_survives_masking_wherever_it_sits(secret, before, after):
    s = Secrets()
    s.add(secret)
    for text in (before + secret + after, secret * 3, f"{before}{secret}"):
        assert secret not in s.text(text)
        assert secret.encode() not in s.line(text.encode())


@settings(max_examples=100, deadline=None)
@given(line=st.binary(max_size=256 * 1024))
def test_masking_any_bytes_never_fails(line):
    REGISTRY.line(line)


def test_masking_a_long_line_is_linear():
    # 256 KiB lines (the longest the guard keeps) of the worst shapes: names and separators everywhere.
    import time
    for unit in (b"a_key=", b"token:" * 3 + b" ", b"x" * 200 + b"_token=", b"'" * 50, b"--api-key " * 3):
        line = (unit * (256 * 1024 // len(unit) + 1))[:256 * 1024]
        t0 = time.perf_counter()
        REGISTRY.line(line)
        assert time.perf_counter() - t0 < 2.0, unit


# --- every sink, generatively --------------------------------------------------------------------


def _vllm_lines(flag: str, values: list[str]) -> list[bytes]:
    """How vLLM prints what it was given (its sources: the Namespace of 0.5-0.9, the non-default args
    of 0.10+, the command line when it fails to parse), and a plain line holding the value."""
    key = flag.lstrip("-").replace("-", "_")
    shown = values if len(values) > 1 else values[0]
    return [f"INFO 12-01 07:40:00 [api_server.py:1234] args: Namespace(host=None, {key}={shown!r})".encode(),
            f"(APIServer pid=1) INFO 12-01 07:40:00 [utils.py:286] non-default args: {{'model_tag': 'm', "
            f"'{key}': {shown!r}}}".encode(),
            f"vllm serve m {flag} {' '.join(values)}: error: unrecognized arguments".encode(),
            f"the key {values[-1]} was refused".encode()]


@pytest.fixture
def logged():
    out = io.StringIO()
    configure_logging(json=True, level="debug", stream=out)
    yield out
    structlog.reset_defaults()
    for handler in list(logging.getLogger().handlers):
        if getattr(handler, "_vllm_guard", False):
            logging.getLogger().removeHandler(handler)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_secret_in_any_form_registered_at_any_time_reaches_no_sink(data, tmp_path_factory, logged):
    values = data.draw(st.lists(SECRET, min_size=1, max_size=3, unique=True), label="values")
    flag = data.draw(st.sampled_from(SECRET_FLAGS), label="flag")
    form = data.draw(st.sampled_from(["list", "equals", "env"]), label="form")
    var = data.draw(st.sampled_from(SECRET_VARS), label="var")
    register_after = data.draw(st.booleans(), label="registered after the sinks exist")
    if form == "equals":
        values = values[:1]
        argv, env = ["vllm", "serve", "m", f"{flag}={values[0]}", "--port", "8000"], {}
    elif form == "list":
        argv, env = ["vllm", "serve", "m", flag, *values, "--port", "8000"], {}
    else:
        values = values[:1]
        argv, env = ["vllm", "serve", "m", "--port", "8000"], {var: values[0]}
    state = tmp_path_factory.mktemp("state")

    def register() -> None:
        REGISTRY.add_argv(argv)
        REGISTRY.add_environ(env)

    if not register_after:
        register()
    output = VllmOutput(str(state), quiet=True)
    history = History(str(state), model="m", run_id="r")
    metrics = Metrics()
    bodies: list[bytes] = []
    log = structlog.get_logger("vllm-guard")
    if register_after:
        register()

    async def send() -> None:
        hook = Webhook("http://hooks.example/x", model="m", wait=tenacity.wait_none(),
                       transport=httpx.MockTransport(lambda r: (bodies.append(r.content), httpx.Response(204))[1]))
        hook.event("launch_failed", f"vLLM said: {_vllm_lines(flag, values)[-1].decode()}",
                   evidence=_vllm_lines(flag, values)[1].decode(), argv=argv, env=env)
        await hook.aclose()

    output.launch(1, " ".join(REGISTRY.argv(argv)))
    evidence = []
    for line in _vllm_lines(flag, values):
        evidence.append(output.line(output.mask(line), "stdout"))
    history.started(1, argv, {})
    history.ended("failed", kind="config_error", evidence=_vllm_lines(flag, values)[0].decode(), exit_code=2)
    log.warning("launch ended", argv=argv, env=env, evidence=_vllm_lines(flag, values)[1].decode(),
                text=f"vLLM refused {' '.join(values)}")
    asyncio.run(send())
    status = json.dumps(REGISTRY.obj({"argv": argv, "requested_args": argv[3:], "env": env,
                                      "launches": [dict(r) for r in history.records]}, ()))
    sinks = {
        "vllm.log": (state / LOG_FILE).read_bytes(),
        "evidence": b"\n".join(evidence),
        "history.jsonl": (state / "history.jsonl").read_bytes(),
        "log": logged.getvalue().encode(),
        "webhook": b"\n".join(bodies),
        "/status": status.encode(),
        "/metrics": metrics.render()[0],
    }
    for value in values:
        for where, content in sinks.items():
            assert value.encode() not in content, f"{value!r} ({form} {flag or var}) reached {where}"
    assert bodies and sinks["history.jsonl"] and sinks["vllm.log"]
