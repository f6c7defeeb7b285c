"""The rules' keys are found through the words of a line: the same key, of the same rule, as trying each in turn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.messages import _KEYS, first_key


def _every_key_in_turn(text: str) -> tuple[str, int] | None:
    for key, index in _KEYS:
        if key in text:
            return key, index
    return None


_KEY_TEXTS = [k for k, _ in _KEYS]
# text around a key: words, punctuation and word characters glued to the key's ends (a key that is part of a
# longer word: "CUBLAS_STATUS_" in "CUBLAS_STATUS_ALLOC_FAILED")
_FILL = st.text(alphabet=st.sampled_from("abcXYZ_019 .,:;'\"()[]=-/\t"), max_size=30)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.tuples(_FILL, st.sampled_from(_KEY_TEXTS)), max_size=3), _FILL,
       st.sampled_from(["", "lower", "cut"]))
def test_the_first_key_found_is_the_first_tried(parts: list[tuple[str, str]], tail: str, how: str) -> None:
    text = "".join(f + k for f, k in parts) + tail
    if how == "lower":
        text = text.lower()
    elif how == "cut" and text:
        text = text[1:-1]            # a key's first or last character gone: its inner words stay
    assert first_key(text) == _every_key_in_turn(text)


def test_every_key_alone_and_inside_a_line_is_found() -> None:
    for key, index in _KEYS:
        for text in (key, f"ERROR 08-20 10:00:13 [core.py:1] x{key}y", f"{key}{key}"):
            assert first_key(text) == _every_key_in_turn(text), key
            assert first_key(text) is not None and _KEYS.index(first_key(text)) <= _KEYS.index((key, index))
