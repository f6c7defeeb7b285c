"""Logging set-up: JSON lines off a TTY, readable on one, secrets never written."""

from __future__ import annotations

import io
import json
import logging
import os

import pytest
import structlog

from supervisor.shell import auth
from supervisor.shell.logs import configure_logging, on_journal


@pytest.fixture(autouse=True)
def _reset():
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_vllm_guard", False):
            root.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_when_not_a_tty_with_fields():
    out = io.StringIO()
    configure_logging(level="info", stream=out)
    structlog.get_logger("t").info("launch failed", launch=2, kind="oom_weights")
    [event] = lines(out)
    assert event["event"] == "launch failed"
    assert (event["launch"], event["kind"], event["level"]) == (2, "oom_weights", "info")
    assert event["timestamp"].endswith("Z")


def test_level_filters():
    out = io.StringIO()
    configure_logging(level="warning", stream=out)
    log = structlog.get_logger("t")
    log.info("quiet")
    log.warning("loud")
    assert [e["event"] for e in lines(out)] == ["loud"]


def test_console_renderer_when_asked():
    out = io.StringIO()
    configure_logging(json=False, stream=out)
    structlog.get_logger("t").info("healthy", launch=1)
    text = out.getvalue()
    assert "healthy" in text and "launch=1" in text and not text.startswith("{")
    assert "\x1b[" not in text   # no colours into something that is not a terminal


def test_unknown_level_is_rejected():
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging(level="loud", stream=io.StringIO())


def test_secrets_are_redacted_from_events(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue1234567890abcdef")
    out = io.StringIO()
    configure_logging(stream=out)
    log = structlog.get_logger("t")
    log.info("launch 1", argv=["vllm", "serve", "m", "--api-key", "sk-abcdefghijklmnopqrstu"],
         env={"HF_TOKEN": "hf_secretvalue1234567890abcdef", "CUDA_VISIBLE_DEVICES": "0"})
    log.warning("vLLM said: token hf_secretvalue1234567890abcdef was rejected")
    log.info("probe", api_key="abcd-efgh", authorization="Bearer abcdefghijkl")
    text = out.getvalue()
    assert "hf_secretvalue" not in text and "sk-abcdefghij" not in text
    assert "abcd-efgh" not in text and "abcdefghijkl" not in text
    first, second, third = lines(out)
    assert first["argv"][-2:] == ["--api-key", "***"]
    assert first["env"] == {"HF_TOKEN": "***", "CUDA_VISIBLE_DEVICES": "0"}
    assert second["event"] == "vLLM said: token *** was rejected"
    assert third["api_key"] == "***"


def test_journald_priority_prefix_only_on_the_journal_stream(tmp_path, monkeypatch):
    with open(tmp_path / "journal", "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert on_journal(stream)
        configure_logging(stream=stream)
        structlog.get_logger("t").error("gave up", kind="engine_dead")
    line = (tmp_path / "journal").read_text().splitlines()[0]
    assert line.startswith("<3>{")
    assert json.loads(line[3:])["kind"] == "engine_dead"
    assert not on_journal(io.StringIO())


def test_stdlib_warnings_reach_the_same_stream():
    out = io.StringIO()
    configure_logging(stream=out)
    logging.getLogger("httpx").warning("connection pool full")
    logging.getLogger("httpx").info("request sent")     # below WARNING: dropped
    assert out.getvalue() == "WARNING httpx: connection pool full\n"


def test_reconfiguring_does_not_duplicate_stdlib_handlers():
    configure_logging(stream=io.StringIO())
    out = io.StringIO()
    configure_logging(stream=out)
    logging.getLogger("x").warning("once")
    assert out.getvalue().count("once") == 1
    assert sum(getattr(h, "_vllm_guard", False) for h in logging.getLogger().handlers) == 1


def test_registered_secrets_are_masked():
    auth.register_secret("guard-token-abcdef")
    out = io.StringIO()
    configure_logging(stream=out)
    structlog.get_logger("t").info("token guard-token-abcdef printed by mistake")
    assert lines(out)[0]["event"] == "token *** printed by mistake"


def test_libraries_records_are_masked_too():
    from supervisor.secrets import REGISTRY

    out = io.StringIO()
    configure_logging(level="info", stream=out)
    REGISTRY.add("lib-secret-value-42")                  # registered after logging was set up
    logging.getLogger("httpx").warning("POST https://hooks.example/lib-secret-value-42 failed")
    assert "lib-secret-value-42" not in out.getvalue() and "POST https://hooks.example/***" in out.getvalue()
