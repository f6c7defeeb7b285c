"""The line splitter takes arbitrary bytes and yields bounded lines."""

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.vllm_text import LineSplitter


def test_splits_on_lf_crlf_and_lone_cr():
    s = LineSplitter()
    assert s.feed(b"a\nb\r\nc\rd") == [b"a", b"b", b"c"]
    assert s.close() == [b"d"]


def test_crlf_split_across_chunks_is_one_break():
    s = LineSplitter()
    assert s.feed(b"a\r") == [b"a"]
    assert s.feed(b"\nb\n") == [b"b"]


def test_long_line_is_cut_and_rest_dropped():
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 25 + b"\nshort\n")
    assert out == [b"x" * 10, b"short"]


def test_line_longer_than_64k_across_chunks():
    s = LineSplitter()
    out = []
    for _ in range(3):
        out += s.feed(b"y" * 40000)
    out += s.feed(b"\n")
    assert out == [b"y" * 120000]


def test_invalid_utf8_and_nul_pass_through():
    s = LineSplitter()
    assert s.feed(b"\xff\x00bad\n") == [b"\xff\x00bad"]


@given(st.lists(st.binary(max_size=300), max_size=30))
def test_bounded_and_lossless_for_short_lines(chunks):
    s = LineSplitter(max_line=1000)
    lines = []
    for c in chunks:
        lines += s.feed(c)
    lines += s.close()
    assert all(len(x) <= 1000 for x in lines)
    data = b"".join(chunks).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    expected = list(data.split(b"\n"))
    if expected and expected[-1] == b"":
        expected.pop()
    if all(len(x) <= 1000 for x in expected):
        assert lines == expected
