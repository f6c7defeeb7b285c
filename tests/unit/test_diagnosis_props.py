"""Properties of the classifier on arbitrary input: it never raises and always names a Kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.classifier import Classifier, classify, normalize
from supervisor.core.diagnosis import PHASES, VERDICT_PHASES, Kind

# Fragments of real vLLM output mixed into random noise, so the rules actually fire.
FRAGMENTS = [
    "(EngineCore_DP0 pid=1) ", "(Worker_TP1 pid=2) ", "(VllmWorker rank=3 pid=4) ", "vllm-1  | ", "[rank0]: ",
    "\x1b[1;36m", "\x1b[0;0m", "^[[0;36m", "INFO 07-23 10:00:01 [core.py:1] ", "ERROR 07-23 10:00:01 core.py:1] ",
    "WARNING 07-23 10:00:01 [a.py:1] ", "INFO:     ", "Traceback (most recent call last):", '  File "/x/vllm/y.py", line 1, in profile_run',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "GPU 0 has a total capacity of 1", "Tried to allocate ",
    "ValueError: To serve at least one request with the models's max seq len (", "estimated maximum model length is ",
    "is larger than the maximum number of tokens that can be stored in KV cache (", "No available memory for the cache blocks",
    "Free memory on device (", "/", " GiB) on startup is less than desired GPU memory utilization (", "Engine core initialization failed",
    "EngineCore failed to start.", "KeyboardInterrupt: terminated", "Application startup complete.", "GPU KV cache size: ",
    "Capturing CUDA graph", "Model loading took ", "vLLM API server version ", "Auto-fit max_model_len: reduced from ", " to ",
    "is greater than the derived max_model_len (", "=", "unrecognized arguments:", "\r", "\n", "\r\n", "\x00", "█", " ", "(", ")",
]

text_lines = st.lists(st.one_of(st.text(max_size=200), st.sampled_from(FRAGMENTS),
                                st.lists(st.sampled_from(FRAGMENTS + ["0", "12", "3.5", "x"]), max_size=12).map("".join)),
                      max_size=40)
byte_lines = st.lists(st.binary(max_size=300), max_size=40)
exit_codes = st.one_of(st.none(), st.integers(min_value=-15, max_value=255))


def _check(diagnosis) -> None:
    assert isinstance(diagnosis.kind, Kind)
    assert diagnosis.phase in VERDICT_PHASES      # a start-up phase, or "unknown" (nothing placed it)
    assert len(diagnosis.evidence) <= 500
    assert isinstance(diagnosis.numbers, dict)
    assert isinstance(diagnosis.detail, str) and diagnosis.detail


@settings(max_examples=300, deadline=None)
@given(text_lines, exit_codes)
def test_any_text_gets_a_kind(lines: list[str], exit_code: int | None) -> None:
    _check(classify(lines, exit_code))


@settings(max_examples=300, deadline=None)
@given(byte_lines, exit_codes)
def test_any_bytes_get_a_kind(lines: list[bytes], exit_code: int | None) -> None:
    _check(classify(lines, exit_code))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=50), st.binary(max_size=50), st.sampled_from(FRAGMENTS)), max_size=30))
def test_streaming_feed_never_raises_and_announces_at_most_once(lines: list) -> None:
    c = Classifier(max_lines=16)
    announced = [d for line in lines if (d := c.feed(line)) is not None]
    assert len(announced) <= 1
    assert len(c.lines) <= 16
    assert c.phase in PHASES
    _check(c.diagnose(None))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_normalize_total(raw) -> None:
    out = normalize(raw)
    assert isinstance(out, str)
    assert "\r" not in out and "\x00" not in out and "\x1b" not in out


@settings(max_examples=5, deadline=None)
@given(st.sampled_from(FRAGMENTS), st.integers(min_value=1, max_value=3))
def test_one_megabyte_lines(fragment: str, repeat: int) -> None:
    big = (fragment * (1_000_000 // max(1, len(fragment))))[:1_000_000]
    _check(classify([big] * repeat, 1))
    _check(classify([big.encode("utf-8", "surrogatepass")], None))


def test_no_newline_at_all() -> None:
    blob = "".join(FRAGMENTS) * 50   # one record-less run of text, carriage returns included
    _check(classify([blob]))
    _check(classify([blob.replace("\n", " ").replace("\r", " ")], 1))


# A garbled log is read in time linear in its size: each of these took minutes (quadratic) before, and
# takes about a second; the limit is many times that, for a busy machine.
@pytest.mark.timeout(20)
def test_a_lower_case_line_that_repeats_a_phrase_is_read_in_linear_time() -> None:
    # every repeat of a known phrase was checked against every one already given back its case
    line = "unrecognized arguments: --x " * 40_000          # 1.1 MB, no capital letter
    got = classify([line], 2)
    assert got.kind is Kind.CONFIG_ERROR, got


@pytest.mark.timeout(20)
def test_cri_partial_lines_that_never_close_are_read_in_linear_time() -> None:
    # each partial line copied the line joined so far (up to a megabyte) again
    lines = [f"2024-08-19T18:30:11.{i:09d}Z stdout P " + "x" * 50 for i in range(500_000)]
    got = classify(lines, 1)
    assert got.kind is Kind.UNKNOWN_FAILURE, got
