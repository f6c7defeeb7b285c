"""The terminal a person looks at (shell/live.py), read as a terminal emulator (pyte) draws it.

The byte stream is not what a person sees: a line can be in the bytes and wiped off the screen. So
every check here feeds the bytes to a pyte screen and reads its rows.
"""

from __future__ import annotations

import io

import pyte
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.shell.live import Terminal, TerminalStream, fit, render


class Tty(io.RawIOBase):
    """A TTY of ``columns`` x ``lines``: what is written to it is drawn by pyte, as a terminal would
    (the pty's line discipline turns "\\n" into "\\r\\n": onlcr)."""

    def __init__(self, columns: int, lines: int = 40) -> None:
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self.raw += data
        self.stream.feed(data.replace(b"\n", b"\r\n"))
        return len(data)

    def rows(self) -> list[str]:
        return [r.rstrip() for r in self.screen.display]

    def shows(self, line: str) -> bool:
        """Whether ``line`` is on the screen, whole: from a row's first column, wrapped over as many
        rows as it needs (pyte wraps at the last column, as a terminal does)."""
        cols = self.screen.columns
        want = [line[i:i + cols].rstrip() for i in range(0, len(line), cols)]
        rows = self.rows()
        return any(rows[i:i + len(want)] == want for i in range(len(rows)))


def terminal(columns: int, color: bool = True) -> tuple[Terminal, Tty]:
    tty = Tty(columns)
    return Terminal(tty, width=lambda: columns, color=color), tty


DIAGNOSIS = ("2026-12-01T09:00:02Z [warning  ] launch 1 failed: kv_cache_insufficient: ValueError: To serve at "
             "least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is "
             "larger than the available KV cache memory (5.31 GiB). Based on the available memory, the estimated "
             "maximum model length is 43472.")
RELAUNCH = ("2026-12-01T09:00:03Z [warning  ] relaunch 2: --max-model-len (unset) -> 43472 because vLLM said "
            "the estimated maximum model length is 43472")
HEALTHY = ("2026-12-01T09:00:09Z [info     ] healthy: a chat completion succeeded after 6.1 s (launch 2, 9.3 s "
           "since the guard started); failures: kv_cache_insufficient; changed flags: --max-model-len 43472")


@pytest.mark.parametrize("columns", [80, 120, 250])
def test_guard_lines_written_as_structlog_writes_them_stay_whole_above_the_live_line(columns):
    term, tty = terminal(columns)
    log = TerminalStream(term, "guard")
    term.update("vllm-guard: launch 1 · starting · loading weights 40%", force=True)
    for message in (DIAGNOSIS, RELAUNCH, HEALTHY):
        log.write(message)       # structlog's PrintLogger: the message, then the newline, as two writes
        log.write("\n")
        term.update("vllm-guard: launch 2 · starting · profiling memory")
    for message in (DIAGNOSIS, RELAUNCH, HEALTHY):
        assert tty.shows(message), (columns, tty.rows())
    rows = [r for r in tty.rows() if r]
    assert rows[-1].startswith("vllm-guard: launch 2"), rows         # the live line, below them
    assert sum(r.startswith("vllm-guard: launch") for r in rows) == 1  # drawn once, not left behind


@pytest.mark.parametrize("columns", [80, 120, 250])
def test_vllm_lines_and_guard_lines_interleave_in_order(columns):
    term, tty = terminal(columns)
    log = TerminalStream(term, "guard")
    term.update("vllm-guard: launch 1 · starting", force=True)
    term.line(b"(EngineCore pid=1) INFO 12-01 09:00:00 [core.py:1] Initializing a V1 LLM engine")
    log.write(DIAGNOSIS[:50])                       # a guard line cut in the middle...
    term.line(b"Loading safetensors checkpoint shards:  40% Completed | 2/5")   # ...while vLLM writes
    log.write(DIAGNOSIS[50:] + "\n")
    rows = tty.rows()
    assert tty.shows(DIAGNOSIS)
    initializing = [i for i, r in enumerate(rows) if "Initializing a V1" in r]
    loading = [i for i, r in enumerate(rows) if "Loading safet" in r]
    assert initializing < loading
    assert loading[0] < [i for i, r in enumerate(rows) if r.startswith(DIAGNOSIS[:40])][0]
    assert [r for r in tty.rows() if r][-1] == "vllm-guard: launch 1 · starting"


def test_the_live_line_is_one_row_whatever_its_length():
    term, tty = terminal(80)
    term.update("vllm-guard: launch 3 · starting · loading weights 40% · 12 s · changed " + "--flag value " * 20,
                force=True)
    term.line(b"x")
    rows = [r for r in tty.rows() if r]
    assert rows == ["x", rows[-1]] and len(rows[-1]) <= 79 and rows[-1].endswith("…")


def test_close_takes_the_live_line_away_and_later_lines_stay():
    term, tty = terminal(80)
    log = TerminalStream(term, "guard")
    term.update("vllm-guard: launch 1 · healthy", force=True)
    log.write("vllm-guard exits with code 0: stopped on request")
    log.write("\n")
    term.close()
    log.write("after\n")
    term.update("must not be drawn", force=True)
    assert [r for r in tty.rows() if r] == ["vllm-guard exits with code 0: stopped on request", "after"]


def test_close_shows_a_line_still_held_back():
    term, tty = terminal(80)
    TerminalStream(term, "guard").write("a last line without its newline")
    term.close()
    assert [r for r in tty.rows() if r] == ["a last line without its newline"]


def test_no_color_draws_the_live_line_without_attributes():
    term, tty = terminal(80, color=False)
    term.update("vllm-guard: launch 1 · starting", force=True)
    term.line(b"vLLM line")
    assert b"\x1b[7m" not in tty.raw and b"\x1b[0m" not in tty.raw
    colored, ctty = terminal(80)
    colored.update("vllm-guard: launch 1 · starting", force=True)
    assert ctty.screen.buffer[0][0].reverse          # with colour: reverse video, as pyte draws it


OUTPUT = [("guard", DIAGNOSIS + "\n"), ("vllm", "(EngineCore pid=9) INFO [core.py:1] Starting to load model\n"),
          ("guard", RELAUNCH + "\n"), ("stderr", "a warning written to sys.stderr\n"),
          ("vllm", "Loading safetensors checkpoint shards: 100% Completed | 4/4\n"), ("guard", HEALTHY + "\n")]


def _screen(columns: int, cuts: list[list[int]]) -> Tty:
    term, tty = terminal(columns)
    term.update("vllm-guard: launch 2 · starting", force=True)
    for (source, text), points in zip(OUTPUT, cuts, strict=False):
        data = text.encode()
        edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
        for a, b in zip(edges, edges[1:], strict=False):
            term.write(data[a:b], source)
    return tty


@settings(max_examples=60, deadline=None)
@given(columns=st.sampled_from([80, 120, 250]),
       cuts=st.lists(st.lists(st.integers(0, 400), max_size=6), min_size=len(OUTPUT), max_size=len(OUTPUT)))
def test_any_split_of_the_same_output_into_writes_gives_the_same_screen(columns, cuts):
    whole = _screen(columns, [[] for _ in OUTPUT])
    assert _screen(columns, cuts).rows() == whole.rows()
    for message in (DIAGNOSIS, RELAUNCH, HEALTHY):
        assert whole.shows(message)
    assert [r for r in whole.rows() if r][-1] == "vllm-guard: launch 2 · starting"


def test_fit_counts_wide_characters_as_two_columns():
    assert fit("模型" * 10, 9) == "模型模型…"
    assert fit("a\nb", 10) == "a b"


def test_render_is_one_bounded_line():
    text = render("starting", {"launch": 2, "text": "loading weights 40%", "elapsed_s": 12.3},
                  {"--max-model-len": "41840"}, width=80)
    assert text.startswith("vllm-guard: launch 2 · starting · loading weights 40% · 12 s") and len(text) <= 80
    assert "\n" not in text
    stopping = "stopping vLLM, 2 s of up to 20 s (Ctrl-C again to kill now)"
    assert render("starting", {"launch": 1}, {}, stopping=stopping) == f"vllm-guard: launch 1 · starting · {stopping}"
