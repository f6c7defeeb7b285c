"""The catalogue of vLLM's own messages (``tests/fixtures/catalogue``) is the classifier's specification.

``messages.tsv`` holds every message vLLM 0.5 to 0.34 prints that ends or marks a start-up, read from
vLLM's source, with the versions it appears in; ``frames.tsv`` the functions of each start-up
phase; ``chains.tsv`` each phase's call path per version. For every failure row, a short log is built
the way that version prints it (``tests/fakes/vllm_logs.py``: its milestones, the traceback through
its call path, its processes' wrappers, its log prefix) and must get the row's kind, in the right
phase, with the row's numbers. A new vLLM release is a table update; see docs/failure-catalogue.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.core import messages
from supervisor.core.classifier import Classifier, classify
from supervisor.core.diagnosis import PHASES, Kind

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import vllm_logs as cat  # noqa: E402

CASES = cat.all_cases()
ROWS = cat.messages()
KINDS = {k.value for k in Kind} | {"oom", "cuda_error", "not_fatal"}
WHERE = set(cat.PHASE_ORDER) | set(cat.PHASE_OF) | {"any"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_catalogued_message_is_recognised_and_placed(case: cat.Case) -> None:
    got = classify(case.lines, case.exit_code)
    assert got.kind.value == case.kind, f"{case.name}: {got.kind} ({got.phase}) from {got.evidence!r}"
    if case.phase is not None:
        assert got.phase == case.phase, f"{case.name}: placed in {got.phase}, evidence {got.evidence!r}"
    if case.evidence:
        # the line that decided it: the row's own text (its match), or a line of the row's log
        assert case.evidence in got.evidence or got.evidence.rstrip("…") in "\n".join(case.lines), got.evidence
    for key, value in case.numbers.items():
        assert got.numbers.get(key) == value, \
            f"{case.name}: numbers[{key!r}] = {got.numbers.get(key)!r}, want {value!r}"


def test_every_failure_row_is_tried_in_its_first_and_last_version() -> None:
    tried: dict[str, set[str]] = {}
    for c in CASES:
        tried.setdefault(c.row, set()).add(c.version)
    for row in ROWS:
        if row["kind"].startswith("milestone:"):
            continue
        assert row["id"] in tried, f"no log was built for {row['id']}"
        if not row["first_version"].startswith("pre-"):
            assert {row["first_version"], row["last_version"]} <= tried[row["id"]] | set(cat.REPRESENTATIVE), row["id"]
    assert len({c.name for c in CASES}) == len(CASES)
    assert len(CASES) > 800


def test_the_table_is_well_formed() -> None:
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    for r in ROWS:
        milestone = r["kind"].startswith("milestone:")
        assert r["kind"] in KINDS or (milestone and r["kind"].split(":", 1)[1] in PHASES), r["id"]
        assert r["role"] in (("",) if milestone else ("cause", "wrapper", "lookalike")), r["id"]
        assert (r["role"] == "lookalike") == (r["kind"] == "not_fatal"), r["id"]
        assert all(w in WHERE for w in r["where"].split()), r["id"]
        assert cat.vkey(r["first_version"]) <= cat.vkey(r["last_version"]), r["id"]
        assert r["match"] and r["match"] in r["example"] + r["template"], r["id"]
        assert r["source"] and r["level"], r["id"]
        assert not r["source"].startswith("/"), r["id"]     # cited inside its package, not a machine's path


# --------------------------------------------------------------------------- frames
# Functions of frames.tsv the classifier deliberately does not read as a phase: the frames every
# start-up traceback passes through (they span several phases), torch.compile's and the API
# server's, and config validation (a config error happens before any other milestone anyway).
SPANNING = {"run_engine_core", "run_mp_engine", "run_rpc_server", "_init_executor", "_initialize_kv_caches",
            "wait_for_engine_startup", "_wait_for_engine_startup", "wait_for_startup", "launch_core_engines",
            "startup_handshake", "_dummy_run", "__call__", "__enter__", "__exit__", "compile", "bytecode_hook",
            "call_module", "wrap_inductor"}
# ... and the ones it reads differently, on purpose:
READ_AS = {"profile_cudagraph_memory": "cudagraph"}   # it captures graphs to measure them: eager mode skips it


def test_frames_table_and_classifier_agree() -> None:
    checked = 0
    for row in cat.frames():
        name = row["function"].rsplit(".", 1)[-1]
        if row["phase"] == "config" or name in SPANNING:
            assert name not in messages._FRAME_PHASE or row["phase"] == "config", name
            continue
        want = READ_AS.get(name, row["phase"])
        if "torch/cuda/graphs" in row["file"]:
            continue   # read by the file name (only real capture enters torch.cuda.graph)
        assert messages._FRAME_PHASE.get(name) == want, f"{row['function']} ({row['file']}): frames.tsv says {want}"
        checked += 1
    assert checked > 300


# --------------------------------------------------------------------------- milestones
# Milestones the classifier reads one phase on (the table's phase is the one the line belongs to;
# the classifier's, the one that starts after it) or not at all (lines that do not mark a phase
# reliably: the attention backend is chosen while loading in V1, during init in V0).
NEXT = {"m_model_loading_took": "profiling", "m_capture_skipped": "warmup", "m_starting_api_server": "serving"}
NOT_READ = {"m_world_size_rank", "m_attn_backend", "m_free_memory_summary", "m_logo"}


@pytest.mark.parametrize("row", [r for r in ROWS if r["kind"].startswith("milestone:")], ids=lambda r: r["id"])
def test_milestones_are_read_as_the_table_says(row: dict) -> None:
    c = Classifier()
    line = row["example"].split("\n")[0]
    if row["level"] == "progress":
        c.feed(f"{line}:  45%|████▌     | 30/67 [00:02<00:02, 14.8it/s]")
    else:
        c.feed(f"INFO 11-30 12:00:00 [x.py:1] {line}")
    want = "launching" if row["base"] in NOT_READ else NEXT.get(row["base"], row["kind"].split(":", 1)[1])
    assert c.phase == want
    assert c.diagnose(None).kind in (Kind.INCOMPLETE, Kind.HEALTHY)


@pytest.mark.parametrize("row", [r for r in ROWS if r["kind"].startswith("milestone:") and r["guard_numbers"]],
                         ids=lambda r: r["id"])
def test_the_numbers_a_milestone_states_are_read_in_every_wording(row: dict) -> None:
    """What the guard measures with (the weights, the KV cache's memory, blocks and tokens, the graphs, the length
    vLLM serves or auto-fit chose), written out per wording in the table's ``guard_numbers``."""
    c = Classifier()
    c.feed(f"INFO 11-30 12:00:00 [x.py:1] {row['example'].split(chr(10))[0]}")
    got = c.diagnose(None).numbers
    want = cat._numbers(row)
    assert {k: got.get(k) for k in want} == want


# --------------------------------------------------------------------------- the engine generation
_NAMES_THE_VERSION = ("version", "Initializing a", "LLM engine (v")
_AFTER_INIT = {"loading", "profiling", "kv_cache", "cudagraph", "warmup", "api_starting", "serving"}


def test_the_engine_generation_is_read_from_a_log_whose_version_is_hidden() -> None:
    """A wrapper or a build that hides vLLM's version: the generation comes from the log itself (its
    process tags, files, and the words only one generation prints). Expected: the generation that
    version runs by default (V1 from 0.8, cat.is_v1), for every catalogue log past engine start-up."""
    read = 0
    wrong = []
    cases = [c for c in CASES if c.phase in _AFTER_INIT]
    for case in cases:
        c = Classifier()
        for line in case.lines:
            if not any(n in line for n in _NAMES_THE_VERSION):
                c.feed(line)
        got = c.diagnose(case.exit_code).numbers.get("engine")
        want = "v1" if cat.is_v1(case.version) else "v0"
        if got is not None:
            read += 1
            if got != want:
                wrong.append(case.name)
    assert not wrong, wrong[:10]
    assert read >= 0.95 * len(cases), f"the generation read in {read} of {len(cases)} logs"
    # its own banner says it outright, whatever else the log shows
    c = Classifier()
    c.feed("INFO 03-05 10:00:00 [llm_engine.py:232] Initializing a V0 LLM engine (v0.8.5) with config: model='m'")
    assert c.numbers["engine"] == "v0"


#: the catalogue's lines that state the CUDA graphs' memory, with the figure each example prints (read here
#: from the example text as vLLM's source formats it: "took {cuda_graph_size / (1 << 30):.2f} GiB",
#: "CUDA graph pool memory: {GiB(cuda_graph_memory_bytes)} GiB (actual)")
GRAPH_MEMORY_ROWS = {"m_capture_done@0.6.4": 0.56, "m_cudagraph_pool_memory": 0.56}


@pytest.mark.parametrize("row_id", sorted(GRAPH_MEMORY_ROWS))
def test_the_memory_cuda_graphs_took_is_a_number_of_the_launch(row_id: str) -> None:
    row = next(r for r in ROWS if r["id"] == row_id)
    assert f"{GRAPH_MEMORY_ROWS[row_id]:.2f} GiB" in row["example"]
    c = Classifier()
    c.feed(f"(EngineCore_DP0 pid=7) INFO 09-20 10:00:41 [gpu_model_runner.py:1] {row['example']}")
    assert c.numbers["cudagraph_gib"] == GRAPH_MEMORY_ROWS[row_id]


def test_graphs_captured_without_a_size_state_no_graph_memory() -> None:
    row = next(r for r in ROWS if r["id"] == "m_capture_done@0.5.0")      # V0 before 0.6.4: seconds only
    c = Classifier()
    c.feed(f"INFO 09-20 10:00:41 model_runner.py:1] {row['example']}")
    assert "cudagraph_gib" not in c.numbers
