"""vLLM's lines on the journal carry the guard's own syslog priority, taken from the level vLLM printed,
so a line vLLM's text starts with ``<0>`` (emerg: journald broadcasts it to every terminal) is filed as
what it is. Off the journal, lines pass through unchanged. The stream is a real pipe whose dev:inode
``$JOURNAL_STREAM`` names, as systemd sets it."""

from __future__ import annotations

import io
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.core.vllm_text import CARRIERS
from supervisor.shell import output

# vLLM's levels (Python logging's names as vLLM's formatter prints them) and the syslog priority each is
# filed at (RFC 5424: 7 debug, 6 info, 4 warning, 3 err; vLLM's CRITICAL is filed as err too: only the
# guard's own messages go above err).
SYSLOG = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 3}


@pytest.fixture
def journal(monkeypatch):
    """The guard's stdout and stderr as one pipe that $JOURNAL_STREAM names (or not); yields a reader."""
    def make(on: bool):
        r, w = os.pipe()
        os.set_blocking(r, False)
        stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(w, "w")), write_through=True)
        monkeypatch.setattr(sys, "stdout", stream)
        monkeypatch.setattr(sys, "stderr", stream)
        st_ = os.fstat(w)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st_.st_dev}:{st_.st_ino}" if on else "1:1")

        def read() -> list[bytes]:
            chunks = []
            while True:
                try:
                    chunk = os.read(r, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).splitlines()
        return read
    return make


def test_a_line_that_starts_with_an_emergency_priority_is_filed_as_what_vllm_said(journal):
    read = journal(True)
    out = output.VllmOutput(None)
    for line in (b"<0>the engine says: emergency", b"(APIServer pid=7) INFO 11-29 17:00:00 [api_server.py:1] ready",
                 b"(EngineCore_DP0 pid=9) ERROR 11-29 17:00:01 [core.py:1] EngineCore failed to start.",
                 b"Traceback (most recent call last):", b'  File "x.py", line 1, in <module>',
                 b"<2>ValueError: not enough KV cache", b"WARNING 11-29 17:00:02 [x.py:1] slow",
                 b"INFO:     127.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK",
                 b"(APIServer pid=7) CRITICAL 11-29 17:00:03 [x.py:1] gone"):
        out.line(line, "stdout")
    out.flush()
    assert read() == [
        b"<6><0>the engine says: emergency",
        b"<6>(APIServer pid=7) INFO 11-29 17:00:00 [api_server.py:1] ready",
        b"<3>(EngineCore_DP0 pid=9) ERROR 11-29 17:00:01 [core.py:1] EngineCore failed to start.",
        b"<3>Traceback (most recent call last):",
        b'<3>  File "x.py", line 1, in <module>',
        b"<3><2>ValueError: not enough KV cache",           # the traceback's last line keeps its level
        b"<4>WARNING 11-29 17:00:02 [x.py:1] slow",
        b"<6>INFO:     127.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK",
        b"<3>(APIServer pid=7) CRITICAL 11-29 17:00:03 [x.py:1] gone",
    ]


def test_off_the_journal_lines_pass_through_unchanged(journal):
    read = journal(False)
    out = output.VllmOutput(None)
    out.line(b"<0>as it came", "stderr")
    out.line(b"INFO second", "stdout")
    out.flush()
    assert read() == [b"<0>as it came", b"INFO second"]


_level = st.sampled_from(list(SYSLOG))
_prefix = st.sampled_from(["", "(APIServer pid=4242) ", "(EngineCore_DP0 pid=17) ", "(Worker_TP1 pid=9) "])
_rest = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))
_vllm_line = st.builds(lambda p, lv, rest: (p + lv + " 11-29 17:00:00 [x.py:1] ").encode() + rest,
                       _prefix, _level, _rest)
_bare = st.one_of(_rest, st.builds(lambda n, rest: f"<{n}>".encode() + rest, st.integers(0, 7), _rest))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(_vllm_line, _bare), min_size=1, max_size=40))
def test_every_line_on_the_journal_starts_with_the_guards_priority(journal, lines):
    read = journal(True)
    out = output.VllmOutput(None)
    for line in lines:
        out.line(line, "stdout")
    out.flush()
    shown = read()
    assert len(shown) == len(lines)
    level = 6
    for line, got in zip(lines, shown, strict=True):
        # a syslog priority vLLM's text starts with is a carrier's prefix: the level is the word behind it
        seen = line[3:] if len(line) >= 3 and line[:1] == b"<" and line[1:2] in b"01234567" and line[2:3] == b">" \
            else line
        words = seen.split(b") ", 1)[1] if seen.startswith(b"(") and b") " in seen else seen
        word = words.split(b" ", 1)[0].decode("latin-1").removesuffix(":")   # uvicorn's "INFO:"
        if word in SYSLOG:
            level = SYSLOG[word]
        elif line.startswith(b"Traceback (most recent call last)"):
            level = 3
        assert got == f"<{level}>".encode() + line, (line, got)


# A vLLM launched through a wrapper that prefixes its lines: the priority is the level behind the prefix,
# read by the normaliser's carriers (each carrier's own example line, with vLLM's line in it).
_ERROR_LINE = "(EngineCore_DP0 pid=9) ERROR 11-29 17:00:01 [core.py:1] EngineCore failed to start."
_WARNING_LINE = "WARNING 11-29 17:00:02 [x.py:1] slow"


@pytest.mark.parametrize("carrier", [c for c in CARRIERS if c.name != "priority"], ids=lambda c: c.name)
def test_a_wrapped_vllms_line_gets_the_priority_of_the_level_behind_the_wrappers_prefix(journal, carrier):
    read = journal(True)
    out = output.VllmOutput(None)
    lines = [carrier.example.replace("MSG", m).encode() for m in (_ERROR_LINE, _WARNING_LINE)]
    for line in lines:
        out.line(line, "stdout")
    out.flush()
    assert read() == [b"<3>" + lines[0], b"<4>" + lines[1]]
