"""The output path works per read of vLLM's pipe (issue 20: 200,000 lines a second on one core), and a
read's lines come out of it exactly as each line alone would: masked alike, read alike, never lost.

The references are the per-line forms each batch form replaces (``Secrets.line``, a fresh normaliser for
each line), which their own tests hold; here only the batch/cache is under test."""

from __future__ import annotations

import asyncio
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.classifier import _MILESTONE_STARTS as MILESTONE_STARTS
from supervisor.core.messages import _MILESTONE_PREFIXES as MILESTONE_PREFIXES
from supervisor.core.vllm_text import Normalizer
from supervisor.secrets import Secrets
from supervisor.shell.child import Child

# -- masking a read ------------------------------------------------------------------------------
TRIGGERS = ["token", "TOKEN", "Key", "secret", "passw", "Credential", "auth", "Bearer", "hf_", "sk-", "://"]
SHAPES = ["api_key=", "'api_key': '", "--api-key ", "hf_AbCdEfGhIjKlMnOp", "sk-abcdefghijklmnop1234",
          "https://user:pw@host/", "Authorization: Bearer ", "max_tokens=12", "tokens/s"]
piece = st.one_of(st.sampled_from(TRIGGERS + SHAPES), st.text(alphabet=" =:'\",.-_abcXYZ019", max_size=12))


@st.composite
def a_read(draw: st.DrawFn) -> tuple[list[str], list[bytes]]:
    """Registered values (some holding a line break) and the lines of one read: pieces of vLLM-like text,
    trigger words in any case and secret shapes, with the values put anywhere, across line ends too."""
    values = draw(st.lists(st.text(alphabet="abcdefXYZ0189-_\n :", min_size=4, max_size=16), max_size=3))
    parts = st.one_of(piece, st.just("\n"), *(st.just(v) for v in values))
    body = "".join(draw(st.lists(parts, max_size=60)))
    return values, [ln.encode() for ln in body.split("\n")]


@settings(max_examples=300, deadline=None)
@given(a_read())
def test_a_reads_lines_are_masked_as_each_line_alone(read: tuple[list[str], list[bytes]]) -> None:
    values, raws = read
    secrets = Secrets()
    for v in values:
        secrets.add(v)
    assert secrets.lines(raws) == [secrets.line(r) for r in raws]


def test_a_read_with_a_secret_in_one_line_masks_that_line_only() -> None:
    secrets = Secrets()
    secrets.add("s3cr3t-value")
    raws = [b"INFO: nothing here", b"--api-key s3cr3t-value", b"INFO: tokens/s 12", b"done"]
    assert secrets.lines(raws) == [b"INFO: nothing here", b"--api-key ***", b"INFO: tokens/s 12", b"done"]


# -- reading a busy server's repeated headers ----------------------------------------------------------
HEADERS = ["(APIServer pid=4242) INFO:     ", "(APIServer pid=4242) INFO:  ", "INFO:     ",
           "(APIServer pid=4242) INFO 12-01 10:00:00 [loggers.py:123] ",
           "(APIServer pid=4242) INFO 12-01 10:00:00 [loggers.py:123]", "WARNING 12-01 10:00:01 [api.py:7] ",
           "(EngineCore_DP0 pid=9) ERROR 12-01 10:00:02.123 [core.py:1] ", "(Worker_TP1 pid=10) DEBUG:\t"]
# what follows a header: whatever a message starts with, a space, a tab, a second process tag (0.31+)
STARTS = ["", " ", "  ", "\t", "(EngineCore pid=3) ", "(x", "10.0.0.1:4321 - \"POST /v1 HTTP/1.1\" 200 OK",
          "Avg prompt throughput: 1.0 tokens/s", "ERROR x", "File \"x.py\", line 1", "\u00a0nbsp"]
# lines with no header between them (the fast path's cache must not carry over them)
OTHERS = ["Traceback (most recent call last):", '  File "/vllm/x.py", line 3, in f', "    raise X", "",
          "RuntimeError: boom", "Killed"]


@st.composite
def server_lines(draw: st.DrawFn) -> list[str]:
    """A run of lines as a busy server prints them: two headers taking turns (so each repeats), whatever
    starts the message after it, and lines of no header in between."""
    heads = draw(st.lists(st.sampled_from(HEADERS), min_size=1, max_size=2))
    line = st.one_of(st.tuples(st.sampled_from(heads), st.sampled_from(STARTS), st.text(max_size=20)).map("".join),
                     st.sampled_from(OTHERS))
    return draw(st.lists(line, min_size=1, max_size=40))


@settings(max_examples=300, deadline=None)
@given(server_lines())
def test_a_busy_servers_headed_line_reads_as_the_same_line_alone(lines: list[str]) -> None:
    live = Normalizer(live=True)
    for ln in lines:
        got = live.feed(ln)
        if ln in OTHERS:
            continue
        assert got == Normalizer(live=True).feed(ln), ln


# -- a failing handler loses its read, never the pipe ---------------------------------------------------
def test_a_failing_output_handler_never_stops_reading_the_pipe() -> None:
    # 20,000 lines (well over a pipe's 64 KiB buffer): a reader that stopped at the first read would leave
    # the child blocked on its write, never exiting
    script = "import sys\nfor i in range(20000): sys.stdout.write(f'line {i}\\n')\nsys.stdout.flush()\n"
    seen: list[bytes] = []

    def handler(lines: list[bytes], stream: str) -> None:
        if not seen and stream == "stdout":
            seen.append(b"")              # the first read fails
            raise RuntimeError("a bug in a handler")
        seen.extend(lines)

    async def run() -> int:
        child = Child([sys.executable, "-c", script], {}, handler)
        await child.start()
        code = await asyncio.wait_for(child.wait(), 30)
        await child.drain(timeout=30)
        assert child.handler_errors == 1
        return code

    assert asyncio.run(run()) == 0
    assert seen[-1] == b"line 19999"          # every read after the failed one came through


def test_the_status_keeps_the_last_lines_of_a_read_longer_than_it_keeps(tmp_path) -> None:
    from supervisor.config import GuardConfig
    from supervisor.shell.report import RECENT_LINES, Report

    r = Report(GuardConfig(model="m"), str(tmp_path))
    r.vllm_lines([b"first read"])
    r.vllm_lines([f"line {i}".encode() for i in range(RECENT_LINES + 50)])
    assert list(r.recent) == [f"line {i}" for i in range(50, RECENT_LINES + 50)]


# -- the classifier's milestone prefixes, indexed by their first character ------------------------------
@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=30),
                 st.tuples(st.sampled_from(MILESTONE_PREFIXES), st.text(max_size=10)).map("".join),
                 st.sampled_from(MILESTONE_PREFIXES).map(lambda p: p[:-1])))
def test_the_milestone_index_finds_what_trying_every_prefix_finds(text: str) -> None:
    assert text.startswith(MILESTONE_STARTS.get(text[:1], ())) == text.startswith(MILESTONE_PREFIXES)
