"""The status page (shell/status_page.py): no string in a snapshot can make an element or an attribute.

vLLM's lines, its evidence, the model's name and the flags' values are untrusted text; the page must
show each as text. Checked by parsing the HTML (the standard library's parser) and comparing its
elements and attributes with the page of the same snapshot whose strings are all "x".
"""

from __future__ import annotations

import copy
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.lifecycle import State
from supervisor.shell.status_page import PAGE_HEADERS, render_page

SNAPSHOT: dict[str, Any] = {
    "state": "healthy",
    "summary": ("healthy: launch 2 serves on http://127.0.0.1:8000 (context 45760); healed kv_cache_insufficient "
                "(launch 1)"),
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "pid": 4242, "guard_pid": 4200,
    "vllm": {"host": "127.0.0.1", "port": 8000, "version": "0.32.0", "url": "http://127.0.0.1:8000"},
    "progress": {"launch": 2, "phase": "serving", "percent": None, "text": "serving", "elapsed_s": 9.5,
                 "listening": True, "healthy_after_s": 6.1, "waiting": None},
    "last_failure": {"launch": 1, "outcome": "failed", "kind": "kv_cache_insufficient", "phase": "kv_cache",
                     "evidence": "ValueError: To serve at least one request ...", "healed": True, "at": 1.0},
    "changed_flags": {"--max-model-len": {"value": "45760", "requested": None, "why": "the KV cache holds 45760",
                                          "source": "heal"},
                      "--enforce-eager": {"value": "", "requested": None, "why": "graphs did not fit",
                                          "source": "heal"}},
    "launches": [
        {"n": 1, "outcome": "failed", "kind": "kv_cache_insufficient", "evidence": "ValueError: To serve ...",
         "started_at": 1.0, "time_to_healthy_s": None, "changed_flags": {}},
        {"n": 2, "outcome": "healthy", "kind": None, "evidence": None, "started_at": 3.0, "time_to_healthy_s": 6.1,
         "changed_flags": {"--max-model-len": {"value": "45760"}}},
    ],
    "last_probe": {"ok": True, "latency_ms": 12.5, "text": "ok in 12.5 ms"},
    "uptime_s": 20.0, "healthy_for_s": 10.0,
    "context": {"served": 45760, "requested": 131072, "fit": 45760, "text": "context served 45760 of 45760 that fit"},
    "memory": {"plan": {"source": "plan", "total_gib": 23.55, "utilization": 0.9,
                        "segments": [["weights", 14.96], ["activation", 1.2], ["non_torch", 0.3], ["cudagraph", 0.5],
                                     ["kv_cache", 4.2], ["unused", 2.39]]},
               "vllm": {"source": "vllm", "total_gib": 23.55, "utilization": 0.9,
                        "segments": [["weights", 14.96], ["overhead", 1.3], ["kv_cache", 4.93], ["unused", 2.36]]}},
    "recent_output": ["(APIServer pid=1) INFO Starting vLLM server on http://127.0.0.1:8000",
                      "INFO:     Application startup complete."],
    "exit_reason": None,
}


class Shape(HTMLParser):
    """Every element and attribute of a page, in order, and all of its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.shape: list[tuple[str, tuple[tuple[str, str | None], ...]]] = []
        self.text: list[str] = []
        self.classes: set[str | None] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # a class is chosen from the page's own names (the state's, an outcome's): its value is checked
        # against that list, the rest of the shape must not move
        self.classes.update(v for k, v in attrs if k == "class")
        self.shape.append((tag, tuple((k, "*" if k == "class" else v) for k, v in attrs)))

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag: str) -> None:
        self.shape.append(("/" + tag, ()))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: bytes) -> Shape:
    p = Shape()
    p.feed(page.decode("utf-8"))
    p.close()
    return p


def replace_strings(obj: Any, strings: list[str], keys: bool = True) -> Any:
    """``obj`` with every string (and every dict key but the page's own field names) drawn from ``strings``."""
    it = iter(strings * 1000)
    n = iter(range(10**6))

    def walk(o: Any, top: bool) -> Any:
        if isinstance(o, str):
            return next(it)
        if isinstance(o, list):
            return [walk(x, False) for x in o]
        if isinstance(o, dict):
            # a flag's name is a key: drawn too (numbered, so two drawn alike stay two flags)
            return {(k if top or not keys or k in FIELD_NAMES else f"{next(it)}{next(n)}"):
                    (v if k == "segments" else walk(v, False)) for k, v in o.items()}
        return o

    return walk(copy.deepcopy(obj), True)


FIELD_NAMES = {"host", "port", "version", "url", "launch", "phase", "percent", "text", "elapsed_s", "listening",
               "healthy_after_s", "waiting", "outcome", "kind", "evidence", "healed", "at", "value", "requested", "why",
               "source", "n", "started_at", "time_to_healthy_s", "changed_flags", "ok", "latency_ms", "served", "fit",
               "plan", "vllm", "total_gib", "utilization", "segments"}

#: The page's own class names: the only attribute values a snapshot's strings may choose between.
CLASSES = ({f"badge state-{s.value}" for s in State} | {"badge state-unknown", "nw failed", "nw died", "nw healthy",
           "nw ", "nw", "mono nw", "", "mono", "model", "wide", "muted", "controls", "danger", "legend"}
           | {f"seg-{n}" for n in ("weights", "activation", "non_torch", "cudagraph", "overhead", "runtime",
                                   "other_processes",
                                   "kv_cache", "unused")})

HOSTILE = ["<script>alert(1)</script>", "</pre><img src=x onerror=alert(1)>", "\"><svg onload=alert(1)>",
           "' onmouseover='alert(1)", "</title></svg><b>", "<!--", "]]>", "&lt;not an entity&gt;", "</style>",
           "</textarea><iframe src=//evil>"]


def test_hostile_vllm_lines_and_names_render_as_text():
    snap = replace_strings(SNAPSHOT, HOSTILE)
    snap["recent_output"] = list(HOSTILE)
    snap["state"] = "healthy"
    page = parse(render_page(snap))
    plain = parse(render_page(replace_strings(SNAPSHOT, ["x"]) | {"recent_output": ["x"] * len(HOSTILE),
                                                                   "state": "healthy"}))
    assert page.shape == plain.shape and page.classes <= CLASSES
    text = "".join(page.text)
    for line in HOSTILE:
        assert line in text           # shown as the very characters vLLM printed


#: Any text, text made of markup's characters, and known attacks.
TEXT = st.one_of(st.text(max_size=40), st.text(alphabet="<>/=\"' &;!-[]abcdeimnoprstv", max_size=40),
                 st.sampled_from(HOSTILE))


@settings(max_examples=150, deadline=None)
@given(strings=st.lists(TEXT, min_size=1, max_size=12))
def test_any_string_in_any_snapshot_field_makes_no_element_or_attribute(strings):
    hostile = parse(render_page(replace_strings(SNAPSHOT, strings)))
    placeholder = parse(render_page(replace_strings(SNAPSHOT, ["x"])))
    assert hostile.shape == placeholder.shape
    assert hostile.classes <= CLASSES


@settings(max_examples=60, deadline=None)
@given(line=st.text(max_size=200).filter(lambda t: "\r" not in t))
def test_a_vllm_line_is_shown_as_it_was_printed(line):
    page = parse(render_page({**SNAPSHOT, "recent_output": [line]}))
    assert line in "".join(page.text)


def test_a_progress_bar_redrawn_with_carriage_returns_shows_its_last_state():
    page = parse(render_page({**SNAPSHOT, "recent_output": ["\rCapturing: 0%|  | 0/51\rCapturing: 100%|██| 51/51\r"]}))
    text = "".join(page.text)
    assert "Capturing: 100%|██| 51/51" in text and "0/51" not in text


@pytest.mark.parametrize("state", [s.value for s in State])
def test_every_state_renders(state):
    page = render_page({**SNAPSHOT, "state": state}).decode()
    assert f'class="badge state-{state}">{state}</span>' in page


def test_a_sparse_snapshot_renders():
    page = render_page({"state": "planning"}).decode()
    assert "None yet." in page and "No picture yet" in page and "the flags as you gave them" in page


def test_no_secret_or_token_field_in_the_page_and_a_policy_that_runs_only_its_own_code():
    page = render_page(SNAPSHOT).decode()
    assert "Bearer" in page and "token" in page            # the button script asks for it...
    assert 'value="' not in page.split('id="token"')[1][:200]   # ...but no value is ever in the page
    csp = PAGE_HEADERS["Content-Security-Policy"]
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp and "http" not in csp
