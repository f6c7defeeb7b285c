"""The daemon reads vLLM's own pipes: nothing there is wrapped or out of order, so the normaliser never
guesses either for a live stream (a server printing lines of one length looked hard-wrapped at it)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.vllm_text import Normalizer
from supervisor.shell.launch import Watcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import vllm_logs as cat  # noqa: E402

# uvicorn's access line as vLLM's API server prints it: every one the same width
ACCESS = '(APIServer pid=7) INFO:     10.0.0.{:03d}:4321{} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
# a line the same width that starts no record of its own: in a paste it may be the previous one's wrap
TAIL = "x" * len(ACCESS.format(1, 0))


def _texts(n: Normalizer, lines: list[str]) -> list[str]:
    out = [r.text for line in lines for r in n.feed(line)]
    return out + [r.text for r in n.flush()]


@given(st.lists(st.integers(0, 999), min_size=3, max_size=30))
def test_a_live_stream_keeps_every_line_as_printed(hosts: list[int]) -> None:
    lines = [ACCESS.format(h, h % 10) for h in hosts] + [TAIL]
    got = _texts(Normalizer(live=True), lines)
    # each access line its own record (its header taken off), the header-less line its own too: no joins
    assert got == [line.split("INFO:     ", 1)[1] for line in lines[:-1]] + [TAIL]


def test_the_same_lines_pasted_are_read_as_a_wrap() -> None:
    # what live mode rules out: in a paste, equal widths and a header-less next line are a terminal's wrap
    lines = [ACCESS.format(h, h % 10) for h in range(5)] + [TAIL]
    assert _texts(Normalizer(), lines)[-1].endswith(TAIL) and _texts(Normalizer(), lines)[-1] != TAIL


def test_the_daemons_classifier_reads_a_live_stream() -> None:
    classifier = Watcher.__dataclass_fields__["classifier"].default_factory()   # type: ignore[misc]
    lines = [ACCESS.format(h, h % 10) for h in range(5)] + [TAIL]
    for line in lines:
        classifier.feed(line)
    classifier.diagnose(None)
    assert list(classifier.lines)[-2:] == [lines[-2].split("INFO:     ", 1)[1], TAIL]


def test_a_wrapper_that_prefixes_the_live_lines_is_read_as_the_log_itself() -> None:
    # a launcher that tags its child's lines with a prefix nobody listed (srun --label's "0: "): the daemon's
    # classifier learns it from the lines that carry vLLM's header and reads the traceback's lines behind it
    cases = [c for c in cat.all_cases() if c.kind not in ("healthy", "incomplete", "no_vllm_output")][::25]
    assert cases
    for case in cases:
        plain = Watcher.__dataclass_fields__["classifier"].default_factory()   # type: ignore[misc]
        tagged = Watcher.__dataclass_fields__["classifier"].default_factory()  # type: ignore[misc]
        for line in case.lines:
            plain.feed(line)
            tagged.feed("0: " + line)
        want, got = plain.diagnose(case.exit_code), tagged.diagnose(case.exit_code)
        assert (got.kind, got.phase, got.numbers) == (want.kind, want.phase, want.numbers), case.name
        assert got.kind.value == case.kind, case.name
