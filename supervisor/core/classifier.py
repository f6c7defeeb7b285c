"""Name what ended a vLLM launch from its output: one pure classifier for the daemon and ``diagnose``.

Pure: lines in, :class:`~supervisor.core.diagnosis.Diagnosis` out; no I/O, no clock. The texts matched
here are vLLM's own (:mod:`supervisor.core.messages`; where each comes from and for which versions:
``docs/failure-catalogue.md``). Every line is first normalised (ANSI colour, ``\\r``,
docker/process/rank prefixes and the log header removed), then checked against a cheap substring
prefilter before any regular expression runs, because the daemon pushes every line of a
long-running server through here.

Decision rules, in the order they matter on real logs:

* A root cause beats its wrappers: each rule has a priority, and the first line of the highest
  priority decides (``ValueError: To serve at least one request ...`` beats the later
  ``Engine core initialization failed. See root cause above``). Wrappers around a root cause no rule
  names give ``unknown_failure`` with that root cause (the first such exception) as evidence.
* Where a failure happened is read from the traceback frames (the deepest frame of a known phase;
  serving-loop and sampler frames only where nothing above them says more), then from serving
  (its start-up line, its traffic, the serving-time wrappers), then from the last start-up
  milestone. OOM placement decides the OOM's kind; the "private pools (e.g., CUDA Graphs)" phrase of
  every PyTorch OOM message says nothing about capture.
* INFO and DEBUG records never carry a failure, so the look-alikes that vLLM logs at those levels
  (the ``Free memory on device ... on startup. Desired ...`` line, the V0 cudagraph OOM hint) are
  never matched; WARNING and INFO records match only the few rules fatal at that level (a Ray
  placement group vLLM cannot get, which it then waits for: a provisional verdict with ``grace_s``,
  withdrawn if the start-up goes on).
* A ``raise`` source line of a known failure, shown in a traceback whose exception line was cut off,
  names the failure at a lower priority than the exception line would.
* A stray line (no record of vLLM's or Python's, in no traceback: a reporter's sentence above a paste)
  gives way to the log's own record of its priority; of a log of several launches (vLLM's banner once
  each), the last launch's verdict is the log's.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from supervisor.core import exits
from supervisor.core.diagnosis import NO_FAILURE, PHASES, UNKNOWN_PHASE, Diagnosis, Kind
from supervisor.core.messages import (
    _CAPTURE,
    _CUDA,
    _FATAL,
    _FRAME_PHASE,
    _INFO_PREFIXES,
    _INFO_RULES,
    _MILESTONE_PREFIXES,
    _MILESTONES,
    _OOM,
    _RULES,
    _RX_LOGO,
    _SERVING_PREFIXES,
    _WARN_KEYS,
    _WARN_RULES,
    _WEAK_FRAMES,
    BROKEN_KERNELS,
    BROKEN_PLATFORM,
    COLLATERAL_ERRORS,
    ENCLOSING_FRAMES,
    ENDED_BY_EXECUTOR,
    ENGINE_BANNERS,
    ENGINE_FILES,
    ENGINE_PROCS,
    ENGINE_WORDS,
    OFFLINE_PROGRESS,
    PLUGIN_FILE,
    RAISED_ONLY,
    REQUEST_ERRORS,
    REQUEST_FRAMES,
    REQUEST_LOGS,
    RUNTIME_MARKERS,
    SAMPLER_FRAMES,
    SERVING_FRAMES,
    STOP_PREFIXES,
    TORCH_CAPTURE_FRAMES,
    VOCABULARY,
    _info_numbers,
    first_key,
    respelled,
)
from supervisor.core.vllm_text import EXCEPTION_FORM as _EXC_FORM
from supervisor.core.vllm_text import EXCEPTION_LINE as _EXC
from supervisor.core.vllm_text import NAMED_EXCEPTION_LINE as _NAMED_EXC
from supervisor.core.vllm_text import Level, Normalizer, Record, starts_own_record
from supervisor.core.vllm_text import normalize as normalize  # re-exported: the one normalisation, read here too

_PHASE = {name: i for i, name in enumerate(PHASES)}
_KEEP = 1000          # characters kept per ring-buffer line: bounded memory on 1 MB lines
_EVIDENCE = 500       # evidence is trimmed to this many characters
_LOGO_CHARS = frozenset("█▄▀")   # vLLM's logo (0.15+), its version on one of its lines
_WRAPPER = 10         # the priority of rules that only say "see the root cause above"

_INFO, _WARN, _ERROR, _RAW = Level.INFO, Level.WARN, Level.ERROR, Level.RAW
_FRAME = re.compile(r'\s*File "([^"]*)", line \d+,? in ([\w<>.]+)')   # faulthandler writes no comma
_ENV_READ = re.compile(r"""os\.(?:getenv\(|environ\.get\(|environ\[)\s*["'](\w+)["']""")
_METHOD = re.compile(r"(?:Error executing method|while processing method) '?(\w+)")
#: a container runtime's report of a kill at its memory limit (`kubectl describe pod`'s `Reason: OOMKilled`, an
#: event's JSON, a kubelet event), not `docker inspect`'s `"OOMKilled": false`
_OOM_KILLED = re.compile(r"OOMKilled\b(?![\"']?\s*[:=]\s*(?:false|False)\b)")
_RAISED = re.compile(r"(?:Error|Exception|error)[:,] |^\s*raise ")      # ValueError: ..., pydantic's Value error, ...


def _by_first(prefixes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``prefixes`` by their first character: ``text.startswith(d.get(text[:1], ()))`` is
    ``text.startswith(prefixes)``, without trying each of 81 milestone prefixes (0.3 us) on every line a
    busy server prints, none of which starts like one."""
    assert all(prefixes), "an empty prefix matches every line"
    out: dict[str, list[str]] = {}
    for p in prefixes:
        out.setdefault(p[:1], []).append(p)
    return {c: tuple(ps) for c, ps in out.items()}


_MILESTONE_STARTS = _by_first(_MILESTONE_PREFIXES)


class Verdict(NamedTuple):
    """The verdict so far: the line that decided it and what it says."""

    prio: int
    kind: Any             # a Kind, or one of messages' placeholders resolved by where it happened
    evidence: str
    numbers: dict[str, Any]
    phase: str
    placed: str = ""      # what placed an OOM: "message", "serving", "frames", "milestone", "generation" (the
    #                       milestone "kv_cache", and the engine generation: read again at the verdict)
    provisional: bool = False   # vLLM only warned and may recover (a placement group Ray has not provided yet)
    quiet: bool = False   # read from numbers a start-up line states: not announced while streaming (the
    #                       error follows at once), withdrawn if the start-up goes on past it
    stray: bool = False   # read from a line that is no record of vLLM's or Python's (no header, process tag,
    #                       exception's name at its start) and in no traceback: a reporter's prose around a paste,
    #                       a shell's note; the log's own record of the same weight, later, says it better


class Classifier:
    """Streaming classifier: feed it output lines, ask it for the verdict at any time."""

    def __init__(self, max_lines: int = 2000, *, live: bool = False) -> None:
        """``live``: fed from a running vLLM's pipes (the daemon), not a saved or pasted log (diagnose)."""
        self.lines: deque[str] = deque(maxlen=max(1, max_lines))
        self._from_vllm = False      # a log header, a milestone or a traceback was seen
        self._text = Normalizer(VOCABULARY, live=live)   # the one normalisation of vLLM's text
        self._launches = 1           # the launches the log shows (a banner after a verdict or past config)
        self._earlier: Diagnosis | None = None   # the verdict on the launch before the last
        self._announced = False      # a verdict was returned by feed() (once a classifier, whatever the launches)
        self.feed_errors = 0         # lines whose reading raised (a bug in a rule): counted, never raised
        self.last_feed_error = ""
        self._start_launch()

    def _start_launch(self) -> None:
        """What is known of one launch (its start-up's phase, its verdict, its numbers): a log may hold several."""
        self._phase = 0
        self._bannered = ""          # its banner (vLLM's version)
        self._serving = False
        self._capture_done = False   # "Graph capturing finished": a later capture line is another launch's
        self._numbers: dict[str, Any] = {}
        self._best: Verdict | None = None
        self._terminated = False     # a KeyboardInterrupt: our own SIGTERM during start-up
        self._stopping = False       # the API server said it got a stop signal: what follows is its echo
        self._frame_phase: str | None = None   # the phase the current traceback's frames place it in
        self._frame_strong = False   # ... set by a frame of that phase itself, not a weak (serving/sampler) one
        self._frame_at = ("", "")    # ... that frame's function and file
        self._frame_serving = False  # ... runs through a frame only a serving vLLM runs (its busy loop, a request)
        self._recent_first = False   # faulthandler's dump: the innermost frame comes first
        self._other_thread = False   # ... of a thread other than the one that crashed
        self._after_fatal = False    # the frames just after a "Fatal Python error" belong to it
        self._request = False        # the current traceback is the API server handling one request
        self._request_next = False   # ... and so is the next one (the handler logged its error first)
        self._last_file = ""         # the file of the current traceback's last frame
        self._runtime = False        # a serving-time wrapper was seen: the engine was running when it died
        self._env_read: str | None = None     # the variable the current traceback's source line reads
        self._raise_open = False     # a `raise X(` source line whose message continues on the next line
        self._pydantic = False       # the last verdict line was pydantic's "N validation error for X"
        self._last_exc = ""          # the first exception no rule names (evidence for wrappers)
        self._exc_after_wrapper = ""
        self._exc_phase = ""         # where that exception happened (its frames, else the milestone)
        self._ends_traceback = False  # this line comes right after a traceback's frames
        self._cut_frame = ""         # its last frame, where a line that is no exception line followed the frames
        self._open_traceback = ""    # the last frame of a traceback whose exception line has not come
        self._after_wrapper = False  # ... which began after a wrapper's line (the root cause it points to)
        self._engine: str | None = None       # the engine generation its banner named
        self._engine_seen = {"v0": 0, "v1": 0}   # ... else what its tags, files and words show
        self._last_proc = ""
        self._tagged = False         # the line read now came with a process tag
        self._stray = False          # ... is neither a record of vLLM's nor a traceback's (Verdict.stray)
        self._platform = ""          # vLLM found no GPU platform or could not load its kernels (BROKEN_PLATFORM)
        self._platform_fresh = False  # ... and no milestone came after it yet (it is the next launch's, if one begins)

    # ------------------------------------------------------------------ public
    @property
    def phase(self) -> str:
        """The latest start-up milestone seen (one of ``diagnosis.PHASES``)."""
        return PHASES[self._phase]

    @property
    def serving(self) -> bool:
        """True once vLLM said its HTTP server started (or served a request)."""
        return self._serving

    @property
    def numbers(self) -> dict[str, Any]:
        """Numbers stated so far by milestone and configuration lines."""
        return _public(self._with_engine(dict(self._numbers)))

    @property
    def engine(self) -> str | None:
        """``"v0"`` or ``"v1"``: the engine generation the log shows (None: it shows neither)."""
        if self._engine:
            return self._engine
        v0, v1 = self._engine_seen["v0"], self._engine_seen["v1"]
        return None if v0 == v1 else ("v0" if v0 > v1 else "v1")

    def _with_engine(self, numbers: dict[str, Any]) -> dict[str, Any]:
        engine = self.engine
        if engine and "engine" not in numbers:
            numbers["engine"] = engine
        return numbers

    def _saw(self, engine: str) -> None:
        self._engine_seen[engine] += 1

    @property
    def carrier(self) -> str | None:
        """The carrier the log's lines came through (``journald``, ``compose``, ...), None for vLLM's own."""
        return self._text.carrier

    @property
    def text(self) -> Normalizer:
        """The normalisation stage (carriers seen, wrap width, order)."""
        return self._text

    def feed(self, line: str | bytes) -> Diagnosis | None:
        """Take one line of output; return the verdict the first time a fatal line shows up."""
        try:
            return self._feed(self._text.feed(line))
        except Exception as e:  # noqa: BLE001 - a log line must never take the daemon down
            self._failed(e)
            return None

    def diagnose(self, exit_code: int | None = None) -> Diagnosis:
        """The final verdict over everything seen; ``exit_code`` None means still running."""
        try:
            self._feed(self._text.flush())
        except Exception as e:  # noqa: BLE001
            self._failed(e)
        return self._of_launches(self._verdict(exit_code))

    def _of_launches(self, last: Diagnosis) -> Diagnosis:
        """The verdict on a log of several launches: the last launch's, or, where it stops before serving with
        no failure in it (the log ends while it starts) or shows nothing past its banner (an exit status is no
        failure of its own there: a console's entries of one second, in an order nothing in so few can tell),
        the failure of the one before."""
        earlier, n = self._earlier, self._launches
        if earlier is None:
            return last
        shown = self._best is not None or self._serving or self._phase > _PHASE["config"]
        if earlier.kind not in NO_FAILURE and (last.kind is Kind.INCOMPLETE or not shown):
            return dataclasses.replace(earlier, detail=f"{earlier.detail} (The launch before the last of {n} in the "
                                       f"log; the last stops at '{last.phase}' with no failure in it.)")
        return dataclasses.replace(last, detail=f"{last.detail} (The last of {n} launches in the log; the one "
                                   f"before: {earlier.kind}.)")

    def _failed(self, e: Exception) -> None:
        self.feed_errors += 1
        self.last_feed_error = f"{type(e).__name__}: {e}"[:200]

    def _verdict(self, exit_code: int | None) -> Diagnosis:
        d = self._read(exit_code)
        if d.kind is Kind.UNKNOWN_FAILURE and self._platform and not self._serving:
            # what no rule names followed vLLM's finding no GPU, or its kernels failing to load: that is the cause
            return Diagnosis(Kind.CONFIG_ERROR, _trim(self._platform), d.numbers, d.phase,
                             "vLLM found no usable GPU platform or could not load its compiled kernels (a torch it "
                             "was not built for, no GPU or CUDA driver visible in the container), and then failed: "
                             f"{_trim(d.evidence)[:200]}. Repair the installation or the GPU access; changing "
                             "flags will not help.")
        return d

    def _read(self, exit_code: int | None) -> Diagnosis:
        if self._best is not None and not (self._terminated and self._best.prio < 25):
            prio, kind, evidence, nums, phase, placed = self._best[:6]
            root = self._last_exc or self._exc_after_wrapper
            if prio <= _WRAPPER and root and not _whole(root, evidence):
                # a wrapper ("Engine core initialization failed") around a root cause no rule names (not the
                # wrapper's own record, a wrap's piece of it read on its own first)
                kind, evidence = Kind.UNKNOWN_FAILURE, root
                phase = self._exc_phase or phase     # its own traceback's frames, not the wrapper's place
            elif (prio <= _WRAPPER and self._after_wrapper and (cut := self._open_traceback or self._cut_frame)
                  .startswith("File") and not self._runtime and self._place() != "serving"):
                # a wrapper ("EngineCore failed to start.") and then its root cause's traceback, cut before its
                # exception line (the paste ends, or a line of no exception's form follows the frames): no rule
                # names what failed (a serving engine's: it died, whatever the cause)
                kind, phase = Kind.UNKNOWN_FAILURE, self._place()
                evidence = f"{evidence} ... a traceback cut off before its exception line (last frame: {cut})"
            elif kind in _OOM_KINDS and placed in ("milestone", "generation", "none") and self._runtime:
                kind, phase = Kind.OOM_RUNTIME, "serving"   # the serving-time wrappers came after it
            elif kind in (Kind.ENGINE_DEAD, Kind.UNKNOWN_FAILURE) and self._runtime and placed != "frames":
                phase = "serving"    # a serving-time wrapper says the engine was running (a paste cut at its head)
            elif kind in _OOM_KINDS and placed == "generation":
                # placed after the KV cache was sized: by the engine generation the whole log shows (a paste
                # cut to its last lines shows it only in the frames after the error)
                kind, phase = _oom_at("kv_cache", v0=_v0(self._numbers, self.engine))
            if phase == "launching":
                phase = _SAID_IN.get(kind, phase)    # nothing placed it, but vLLM says this only in one phase
            numbers = self._with_engine({**self._numbers, **nums})
            if kind is Kind.CONFIG_ERROR and "required_gpus" not in numbers and (
                    "grace_s" in numbers or "placement group" in evidence.lower()
                    or "available gpus" in evidence.lower()):
                tp = numbers.get("config_tensor_parallel_size")
                if tp:
                    numbers["required_gpus"] = tp * (numbers.get("config_pipeline_parallel_size") or 1)
            return Diagnosis(kind, _trim(evidence), _public(numbers), phase, _detail(kind, numbers, phase))
        numbers = _public(self._with_engine(dict(self._numbers)))
        if self._terminated or self._stopping:
            # stopped, not failed: it served (healthy) or its start-up was cut short (incomplete)
            kind, when = ((Kind.HEALTHY, "while serving") if self._serving
                          else (Kind.INCOMPLETE, f"at '{self.phase}', before serving"))
            return Diagnosis(kind, "", numbers, self.phase, "vLLM was stopped by a signal (SIGTERM or SIGINT, "
                             f"such as the guard's own stop) {when}; nothing failed.")
        unknown = self._last_exc or self._exc_after_wrapper
        if (self._open_traceback or self._cut_frame) and not unknown:
            unknown = ("a traceback cut off before its exception line (last frame: "
                       f"{self._open_traceback or self._cut_frame})")
        phase = self._place()
        exited = exit_code not in (None, 0)
        if exited and exits.signal_of(exit_code) is not None:
            hint = exits.hint(exit_code)
            return Diagnosis(Kind.ENGINE_DEAD, _trim(unknown or exits.describe(exit_code)), numbers, phase,
                             f"{exits.describe(exit_code)}" + (f": {hint}." if hint else "."))
        if unknown and (exited or not self._serving):
            how = f"{exits.describe(exit_code)} after" if exited else "The start-up ended with"
            return Diagnosis(Kind.UNKNOWN_FAILURE, _trim(unknown), numbers, phase,
                             f"{how} a failure no rule of this tool names; the evidence is its root cause's "
                             "exception line.")
        if exited:
            return Diagnosis(Kind.UNKNOWN_FAILURE, exits.describe(exit_code), numbers, self.phase,
                             f"{exits.describe(exit_code)} and printed no failure this tool recognises.")
        if self._serving:
            return Diagnosis(Kind.HEALTHY, "", numbers, self.phase,
                             "vLLM reached serving and nothing fatal followed.")
        if not self._from_vllm and self._phase == 0:
            return Diagnosis(Kind.NO_VLLM_OUTPUT, "", numbers, self.phase,
                             "Nothing in the output comes from vLLM (empty, binary, or another program's).")
        return Diagnosis(Kind.INCOMPLETE, "", numbers, self.phase,
                         f"The start-up stops at '{self.phase}' before serving, with no failure in it.")

    # ------------------------------------------------------------------ internals
    def _feed(self, records: list[Record]) -> Diagnosis | None:
        before = self._best
        for text, level, rank, proc, pasted, joined in records:
            self.lines.append(text[:_KEEP])
            if proc is not None and proc != self._last_proc:
                self._last_proc = proc
                for tag, engine in ENGINE_PROCS:
                    if proc.startswith(tag):
                        self._saw(engine)
                        break
            if level != _RAW:
                self._from_vllm = True
            self._tagged = proc is not None
            # an INFO line joined to what may be the next record: never a failure (None)
            self._line(text, level, rank, None if joined and level == _INFO else pasted)
        if self._best is not before and self._best is not None and not self._announced and not self._best.quiet:
            self._announced = True
            return self._verdict(None)
        return None

    def _line(self, text: str, level: int, rank: int | None, pasted: bool | None = False) -> None:
        stripped = text.lstrip()
        if stripped.startswith("File \""):
            m = _FRAME.match(stripped)
            if m:
                self._frame(m, stripped)
                rest = stripped[m.end():]
                if len(rest) > 40 and ("Error" in rest or "Exception" in rest):   # a paste that lost its breaks
                    self._stray = False          # (a frame's line: a traceback's, whatever the line before was)
                    self._check(rest, level, rank)
                    self._open_traceback = ""      # ... and the exception line that ends the traceback
            return
        elif stripped.startswith("Traceback (most recent call last)"):
            self._frame_phase, self._frame_strong, self._env_read, self._frame_serving = None, False, None, False
            self._recent_first = self._after_fatal = self._raise_open = self._other_thread = False
            self._request, self._request_next, self._last_file = self._request_next, False, ""
            self._open_traceback, self._from_vllm = "Traceback (most recent call last)", True
            self._after_wrapper = self._best is not None and self._best.prio <= _WRAPPER
            self._cut_frame = ""
            return
        elif stripped.endswith("(most recent call first):"):   # faulthandler's dump of a dying interpreter
            self._frame_phase, self._frame_strong, self._recent_first, self._frame_serving = None, False, True, False
            self._other_thread = stripped.startswith("Thread ")   # not the one that crashed ("Current thread")
            self._from_vllm = True
            return
        self._stray = level == _RAW and not self._tagged and not self._open_traceback
        # the line after a traceback's frames is its exception line, whatever its class is called
        self._ends_traceback = self._open_traceback.startswith("File") and not text.startswith(" ")
        if self._open_traceback and not text.startswith(" "):
            formed = self._ends_traceback and _EXC_FORM.match(text) is not None
            if level == _RAW or formed:
                if self._ends_traceback and not formed:
                    self._cut_frame = self._open_traceback   # no exception line: a reporter's "(output cut here)"
                self._open_traceback = ""    # the exception line that ends the traceback
        elif self._cut_frame and not text.startswith(" ") and _EXC_FORM.match(text):
            self._cut_frame = ""         # its exception line after all, after a line that was none of its frames
        if text.startswith("    "):      # a traceback's source line
            if self._raise_open or stripped.startswith("raise "):
                self._raise_line(stripped, level, rank)
            if "os.getenv(" in text or "os.environ" in text:
                m = _ENV_READ.search(text)
                if m:
                    self._env_read = m.group(1)
        if self._pydantic and text.startswith("  ") and not text.startswith("    ") and self._best is not None:
            self._pydantic = False       # pydantic's detail line: the message its config class raised
            best = self._best
            if "validation error for" in best.evidence and len(best.evidence) < _EVIDENCE:
                self._best = best._replace(evidence=f"{best.evidence}: {stripped}")
        if level != _ERROR and (text.startswith(_MILESTONE_STARTS.get(text[:1], ())) or "block_size" in text
                                or "engine (v" in text or "max_seq_len=" in text or "parallel_size" in text
                                or ("version" in text and (self._phase <= 1 or _LOGO_CHARS.intersection(text)))):
            self._milestone(text, level, rank)
        if level != _INFO and text.startswith(REQUEST_LOGS):
            self._request_next = True    # a request's error: the server serves, the traceback is the request's
            if not self._serving:
                self._serving, self._phase = True, _PHASE["serving"]
        if level == _RAW and not self._serving and text.startswith(OFFLINE_PROGRESS):
            self._serving, self._phase = True, _PHASE["serving"]    # an offline run generating
        if level == _INFO:
            if not self._serving and (text.startswith(_SERVING_PREFIXES) or ' HTTP/1.1" ' in text):
                self._serving = True     # a request served: the start-up line may not have been kept
                self._phase = _PHASE["serving"]
            if pasted is None or (not pasted and "error: " not in text):
                return   # INFO/DEBUG records never carry a failure
            pasted = True   # an argparse error glued to an INFO record (a paste without line breaks)
        if level == _WARN:
            if not self._serving and text.startswith(_SERVING_PREFIXES):
                self._serving, self._phase = True, _PHASE["serving"]    # V0's scheduler, with requests running
            self._check_warning(text, rank)
            return
        if text.startswith("    ") and len(text) < 300 and not _OOM_KILLED.search(text):
            return   # traceback source lines never carry a failure of their own (a pod's indented state may)
        self._check(text, level, rank)

    def _frame(self, m: re.Match[str], stripped: str) -> None:
        """A traceback frame: where the failure happened, read from the deepest frame of a known phase."""
        self._open_traceback = "" if self._request else stripped[:200]    # a request's: never the start-up's
        self._cut_frame = ""             # the frames go on: the line that seemed to cut them was a piece of one
        self._from_vllm = True
        path = self._last_file = m.group(1)
        if "/vllm/" in path:
            for part, engine in ENGINE_FILES:
                if part in path:
                    self._saw(engine)
                    break
        name = m.group(2).rsplit(".", 1)[-1]
        ours = "vllm" in m.group(1)      # vLLM's own files (and its plugins'): torch._dynamo has a `step` too
        if ours and name in SERVING_FRAMES and not self._other_thread:
            self._frame_serving = True
        where = _FRAME_PHASE.get(name) if ours else None
        if where is None and (("torch/cuda/graphs" in m.group(1) and name in TORCH_CAPTURE_FRAMES)
                              or "CUDAGraph::capture" in stripped):
            where = "cudagraph"      # only real capture enters torch.cuda.graph (Python or C++); replay serves
        if where is None:
            if name in REQUEST_FRAMES:
                self._request = True
            return
        weak = name in _WEAK_FRAMES
        if self._other_thread:
            return
        if self._recent_first:           # innermost first: the first known frame is the deepest
            if self._frame_phase is None or (not self._frame_strong and not weak):
                self._frame_phase, self._frame_strong, self._frame_at = where, not weak, (name, path)
        elif not weak or self._frame_phase is None:
            self._frame_phase, self._frame_strong, self._frame_at = where, not weak, (name, path)
        best = self._best
        if self._after_fatal and best is not None and best.kind is Kind.UNKNOWN_FAILURE and not self._serving:
            if where == "cudagraph":     # the interpreter died inside CUDA-graph capture
                self._best = best._replace(kind=Kind.OOM_CUDAGRAPH, phase="cudagraph", placed="frames",
                                           provisional=False)
                self._after_fatal = False
            elif not weak:               # faulthandler's innermost frame of a known phase
                self._best = best._replace(phase=where, placed="frames", provisional=False)
                self._after_fatal = False

    def _raise_line(self, stripped: str, level: int, rank: int | None) -> None:
        """A ``raise`` source line: the failure it raises, should the exception line itself be missing."""
        self._raise_open = stripped.startswith("raise ") and not stripped.endswith(")")
        if self._request:
            return                       # a request handler raising: that request's error
        if first_key(stripped) is not None:
            self._check(stripped, level, rank, cap=_SOURCE)

    def _milestone(self, text: str, level: int = _INFO, rank: int | None = None) -> None:
        if text[:1] in "IGAM#tCLSE":       # the first letters of ENGINE_BANNERS' and ENGINE_WORDS' texts
            for banner, engine in ENGINE_BANNERS:
                if text.startswith(banner):
                    self._engine = engine
            for word, engine in ENGINE_WORDS:
                if text.startswith(word):
                    self._saw(engine)
                    break
        for prefix, phase in _MILESTONES:
            if text.startswith(prefix):
                new = _PHASE[phase]
                if phase == "config" and prefix.startswith("vLLM"):
                    self._banner(text)
                self._platform_fresh = False
                if new > self._phase or (phase == "cudagraph" and self._phase == _PHASE["warmup"]
                                         and not self._capture_done):
                    self._phase = new    # V1 warms kernels up before it captures
                if prefix in ("Graph capturing finished", "CUDA graph pool memory"):
                    self._capture_done = True
                if phase == "serving":
                    self._serving = True
                self._frame_phase, self._frame_strong, self._frame_at = None, False, ("", "")  # a new stage
                self._frame_serving = False
                if self._best is not None and self._best.provisional and new >= _PHASE["loading"]:
                    self._best, self._announced = None, False   # the placement group came after all
                elif self._best is not None and self._best.quiet and new > _PHASE["kv_cache"]:
                    self._best = None            # no KV cache blocks, and it went on: an attention-free model
                break
        else:
            if text.startswith(_INFO_PREFIXES):
                self._check_info(text, rank)
            elif text.startswith(STOP_PREFIXES):
                self._stopping = True    # stopped by a signal: the wrappers that follow are its echo
            elif text.startswith(BROKEN_PLATFORM) and (text.startswith("No platform")
                                                        or any(w in text for w in BROKEN_KERNELS)):
                self._platform, self._platform_fresh = text[:_KEEP], True
        found = _info_numbers(text)
        if "vllm_version" not in found and _LOGO_CHARS.intersection(text):
            m = _RX_LOGO.search(text)
            if m:
                self._banner(text)       # (0.15+ prints its version in its logo)
                found["vllm_version"] = m.group(1)
        old = self._numbers.get("vllm_version")
        if old and "vllm_version" in found and not found["vllm_version"].startswith(old):
            del found["vllm_version"]   # the first launch's version stands
        self._numbers.update(found)
        if found.get("kv_available_gib", 1) <= 0 or found.get("num_gpu_blocks", 1) == 0:
            # nothing left for the KV cache, as the sizing line says it (vLLM raises "No available memory
            # for the cache blocks" right after; a paste may stop before it). An attention-free model has
            # no blocks and goes on: the verdict is withdrawn when the start-up passes this phase.
            self._offer(20, Kind.NO_KV_CACHE_MEMORY, text, {k: found[k] for k in ("kv_available_gib", "num_gpu_blocks")
                                                             if k in found}, "kv_cache", quiet=True)

    def _banner(self, text: str) -> None:
        """vLLM's banner (its version, once a launch): another launch's after a verdict, a phase past the
        configuration or another banner (not this one's again, read as a wrap's pieces grew) (a journal of the
        guard's relaunches, a paste of two attempts): what is known starts over, and the verdict is the last
        launch's (:meth:`_of_launches`)."""
        # (the readings of one wrapped record differ in the spaces at its breaks: an editor's or a terminal's)
        seen, now = self._bannered.replace(" ", ""), text.replace(" ", "")
        again = now.startswith(seen) or seen.startswith(now)
        if self._phase > _PHASE["config"] or self._best is not None or (self._bannered and not again):
            self._earlier = self._verdict(None)
            self._launches += 1
            platform = self._platform if self._platform_fresh else ""   # printed at import, before the banner
            self._start_launch()
            self._platform = platform
        self._bannered = text

    def _check_warning(self, text: str, rank: int | None) -> None:
        """The few WARNING records that are fatal (everything else vLLM warns about is not)."""
        for key, index in _WARN_KEYS:
            if key in text:
                keys, kind, prio, extract, provisional = _WARN_RULES[index]
                if (self._terminated or self._stopping) and prio < 30:
                    return
                if kind is Kind.ENGINE_DEAD:
                    self._runtime = self._runtime or self._serving
                self._offer(prio, kind, text, extract(text) if extract else {}, self._place(), "", provisional)
                return

    def _check_info(self, text: str, rank: int | None) -> None:
        for keys, kind, prio, extract, provisional in _INFO_RULES:
            if text.startswith(keys):
                self._offer(prio, kind, text, extract(text) if extract else {}, self._place(), "", provisional)
                return

    def _place(self) -> str:
        """Where the failure being read happened: serving, else the traceback's frames, else the milestone."""
        if self._serving or self._frame_serving:
            return "serving"
        return self._frames_place()[0]

    def _check(self, text: str, level: int, rank: int | None, cap: int = 100) -> None:
        if not text or "%|" in text:
            return   # progress bars
        if text.startswith("KeyboardInterrupt"):
            self._terminated = True
            return
        if text.startswith("Error executing method ") or "while processing method " in text:
            m = _METHOD.search(text)     # V0/Ray workers name the failing RPC
            if m and m.group(1) in _FRAME_PHASE:
                self._frame_phase, self._frame_strong, self._frame_at = _FRAME_PHASE[m.group(1)], True, ("", "")
        if text == "Killed" or (level == _RAW and _OOM_KILLED.search(text)):
            # the shell's note that the kernel (often the OOM killer) sent SIGKILL; a container runtime's, at
            # the cgroup's memory limit
            self._offer(_WRAPPER, Kind.ENGINE_DEAD, text.strip(), {}, self._place())
            return
        if not self._runtime and any(m in text for m in RUNTIME_MARKERS):
            self._runtime = True
        if "Engine" in text:
            for word, engine in ENGINE_WORDS:
                if word in text:
                    self._saw(engine)
                    break
        found = first_key(text)
        if found is not None and level == _RAW and cap != _RETYPED:
            # a line typed by a person (no header of vLLM's): a typo in a rule's key leaves a less specific one
            # to match ("Cnnot auto-fit max_model_len: not enough GPU memory ..."); as vLLM spells it, the first
            hit_at = found[1]
            fixed = self._respelled(text, lambda r: (k := first_key(r)) is not None and k[1] < hit_at)
            if fixed is not None:
                text, found = fixed, first_key(fixed)
        hit = None
        if found is not None:
            key, hit = found
            # (a record says what it is at its start: a sentence that says it further on is a reporter's)
            self._stray = self._stray and not text.startswith(key)
        if hit is None:
            if _EXC.match(text) or (self._ends_traceback and _NAMED_EXC.match(text)):
                self._unrecognised(text, level, rank, retyped=cap == _RETYPED)
            return
        keys, kind, prio, extract = _RULES[hit]
        if level == _RAW and any(k in text for k in RAISED_ONLY) and not _RAISED.search(text):
            return   # also a WARNING's text: without its header only the raised form is the failure
        prio = min(prio, cap)
        if ENDED_BY_EXECUTOR.search(text):
            prio = min(prio, _WRAPPER)   # the executor's own cleanup after its failure: that failure decides
        if (self._terminated or self._stopping) and prio < 30:
            return   # the wrappers our own SIGTERM provokes are not failures
        numbers = extract(text) if extract else {}
        if kind is Kind.CONFIG_ERROR and self._env_read and ("invalid literal" in text or "could not convert" in text):
            numbers = {**numbers, "env_var": self._env_read}   # vLLM parsing one of its environment variables
        phase = self._place()
        placed = ""
        if kind == _OOM:
            kind, phase, placed = self._where_oom(text)
        elif kind == _CAPTURE:
            kind = Kind.OOM_CUDAGRAPH
            phase = "cudagraph" if self._in_capture() else phase
        elif kind == _CUDA or kind == _FATAL:
            if self._in_capture():
                kind, phase = Kind.OOM_CUDAGRAPH, "cudagraph"
            elif kind == _FATAL and self._best is not None and self._best.kind is Kind.ENGINE_DEAD:
                return       # the interpreter's end after what killed it (an NCCL watchdog's abort, a worker's)
            else:
                # an interpreter killed by a signal: while serving, the engine died; before, a crash no rule names
                serving = self._serving or self._frame_serving
                kind = Kind.ENGINE_DEAD if kind == _CUDA or serving else Kind.UNKNOWN_FAILURE
                self._after_fatal = kind is Kind.UNKNOWN_FAILURE
                if self._after_fatal:        # a crash dump follows, innermost frame first
                    self._frame_phase, self._frame_strong, self._recent_first = None, False, True
                    self._other_thread = False
        if rank is not None:
            numbers["rank"] = rank
        self._pydantic = "validation error for" in text
        self._offer(prio, kind, text, numbers, phase, placed)

    def _unrecognised(self, text: str, level: int, rank: int | None, retyped: bool = False) -> None:
        if not retyped and (fixed := self._respelled(text, first_key)) is not None:
            self._check(fixed, level, rank, cap=_RETYPED)   # a message retyped with a typo or two: as vLLM spells it
            return
        if (text.startswith(COLLATERAL_ERRORS) or self._request or self._stopping
                or any(e in text for e in REQUEST_ERRORS)):
            return   # the echo of a peer that died, or one request's error: never a root cause
        if self._in_capture() and not self._serving and not self._terminated:
            numbers = {"rank": rank} if rank is not None else {}
            self._offer(30, Kind.OOM_CUDAGRAPH, text, numbers, "cudagraph")
            return
        plugin = PLUGIN_FILE.search(self._last_file) if self._last_file else None
        if plugin and not self._terminated:
            # raised in a vLLM plugin's own code: a plugin built for another vLLM (an installation error)
            self._offer(20, Kind.CONFIG_ERROR, text, {"plugin": plugin.group(1)}, self._place())
            return
        if self._best is None:
            if not self._last_exc:
                self._last_exc = text[:_KEEP]    # the first: the root cause, before the wrappers' echoes
                self._exc_phase = self._place()
            elif _whole(self._last_exc, text[:_KEEP]):
                self._last_exc = text[:_KEEP]    # the same record whole (a wrap's piece was read on its own)
        elif not self._exc_after_wrapper or _whole(self._exc_after_wrapper, text[:_KEEP]):
            self._exc_after_wrapper = text[:_KEEP]
            self._exc_phase = self._exc_phase or self._place()

    def _respelled(self, text: str, matches: Callable[[str], object]) -> str | None:
        """:func:`~supervisor.core.messages.respelled`, a reading that matches only with vLLM's case given back to
        its phrases as the normaliser gives it (a line typed in lower case: the rules' keys are matched as vLLM
        prints them) given back so."""
        # (one pass over its words: each reading tried as typed, then with its phrases in vLLM's case)
        fixed = respelled(text, lambda r: matches(r) or matches(self._text.recased(r)))
        return fixed if fixed is None or matches(fixed) else self._text.recased(fixed)

    def _in_capture(self) -> bool:
        if self._serving or self._frame_serving:
            return False
        return self._frames_place()[0] == "cudagraph"

    def _frames_place(self) -> tuple[str, str]:
        """The phase the traceback's frames say, and what said it: the milestones when the deepest known frame
        is one whose call runs other phases too (:data:`ENCLOSING_FRAMES`) and they reached one of those."""
        where = self._frame_phase or self.phase
        name, path = self._frame_at
        part, floor, last = ENCLOSING_FRAMES.get(name, ("", "", ""))
        if floor and part in path and self._phase and not (self._serving or self._frame_serving):
            later = max(_PHASE[floor], self._phase)
            if last:
                later = min(later, _PHASE[last])
            if later != _PHASE[where]:
                return PHASES[later], "milestone"
        return where, "frames" if self._frame_phase else "milestone"

    def _where_oom(self, text: str) -> tuple[Kind, str, str]:
        """Place an OOM: (kind, phase, what placed it), from evidence only: the message itself, then
        serving (its start-up line, its traffic, a request), then the traceback's frames (one only a
        serving vLLM runs; else the deepest of a known phase), then the last start-up milestone seen
        before it; with none, its phase is unknown. (The serving-time wrappers, wherever they are in the
        log, move an OOM placed by a milestone or by nothing to serving: :meth:`_verdict`.)"""
        if "not enough GPU memory" in text or "linear weights" in text or "allocate the weight" in text:
            return Kind.OOM_WEIGHTS, "loading", "message"
        # the sampler/pooler warm-up: profiling, or after capture (its message says so, or its frame is the deepest
        # known: the milestones say which)
        sampler = "warming up" in text or (not self._frame_strong and self._frame_at[0] in SAMPLER_FRAMES)
        if self._serving:
            where, placed = "serving", "serving"
        elif self._frame_serving:
            where, placed = "serving", "frames"
        elif self._frame_phase is not None and (self._frame_strong or not sampler):
            where, placed = self._frames_place()
        elif sampler:
            return (Kind.OOM_PROFILE, "profiling" if self._phase <= _PHASE["profiling"] else "warmup",
                    "message" if not self._phase else "milestone")
        elif not self._phase:
            # nothing says where: read as the phase the output reached ("launching"), the phase unknown
            return Kind.OOM_WEIGHTS, UNKNOWN_PHASE, "none"
        else:
            where, placed = self.phase, "milestone"
        if sampler:
            return Kind.OOM_PROFILE, where if where in ("profiling", "warmup") else "profiling", placed
        kind, at = _oom_at(where, frames=placed == "frames", v0=_v0(self._numbers, self.engine))
        return kind, at, "generation" if where == "kv_cache" and placed == "milestone" else placed

    def _offer(self, prio: int, kind: Kind, text: str, numbers: dict[str, Any], phase: str, placed: str = "",
               provisional: bool = False, quiet: bool = False) -> None:
        if self._ends_traceback:
            self._cut_frame = ""     # a line right after the frames that a rule names is their exception line
        best = self._best
        stray = self._stray and not starts_own_record(text)    # (an exception line alone is the log's)
        if best is None or prio > best.prio or best.stray and not stray and prio == best.prio:
            self._best = Verdict(prio, kind, text, numbers, phase, placed, provisional, quiet, stray)
        elif best.quiet and prio == best.prio and not quiet:
            self._best = Verdict(prio, kind, text, {**best.numbers, **numbers}, phase, placed, provisional, False,
                                 stray)
        elif prio == best.prio and _whole(best.evidence, text):
            # the same record whole again (a piece of a wrapped line was read on its own first)
            self._best = Verdict(prio, kind, text, {**best.numbers, **numbers}, phase, placed, provisional, False,
                                 stray)
        elif best.kind in _OOM_KINDS and kind in _OOM_KINDS and prio == best.prio:
            # V0 logs str(e) before the traceback: a later copy with frames places it better.
            merged = {**numbers, **best.numbers}
            if (best.placed in ("milestone", "generation") and placed in ("frames", "serving")
                    or best.placed == "none" and placed in ("frames", "serving", "milestone", "generation")):
                self._best = Verdict(prio, kind, best.evidence, merged, phase, placed, False)
            else:
                self._best = best._replace(numbers=merged, provisional=False)
        elif kind is best.kind and prio == best.prio and best.provisional and not provisional:
            # vLLM gave up waiting (a placement group it could not get): its own error says it best
            merged = {k: v for k, v in {**best.numbers, **numbers}.items() if k != "grace_s"}
            self._best = Verdict(prio, kind, text, merged, phase, placed, False)
        elif kind is best.kind and prio == best.prio and len(numbers) > len(best.numbers):
            self._best = best._replace(numbers={**numbers, **best.numbers},
                                       provisional=best.provisional and provisional)


def _v0(numbers: dict[str, Any], engine: str | None) -> bool:
    """The log is V0's (which announces its capture): its block count was seen, or its engine generation says so
    (the block count's line left out of a paste)."""
    return "num_gpu_blocks" in numbers or engine == "v0"


def _oom_at(where: str, *, frames: bool = False, v0: bool = False) -> tuple[Kind, str]:
    """The kind of an out-of-memory error in a phase (docs/failure-catalogue.md, "Placing a failure")."""
    if where in ("launching", "config", "engine_init", "loading"):
        return Kind.OOM_WEIGHTS, where
    if where in ("profiling", "warmup"):
        # warm-up (compile sizes, kernel warm-up, DeepGEMM, FlashInfer autotune) runs after the KV
        # cache took its share; eager mode would not skip it, the profile's ladder frees what it needs
        return Kind.OOM_PROFILE, where
    if where == "kv_cache":
        # V1 logs nothing when capture starts, so after "GPU KV cache size" an OOM without frames is
        # most likely the capture; V0 announces its capture, so there it is the KV allocation itself
        if frames or v0:
            return Kind.OOM_PROFILE, where
        return Kind.OOM_CUDAGRAPH, "cudagraph"
    if where == "cudagraph":
        return Kind.OOM_CUDAGRAPH, where
    return Kind.OOM_RUNTIME, "serving"


def place(d: Diagnosis, phase: str) -> Diagnosis:
    """An out-of-memory error nothing in the log placed (phase ``unknown``), read where the launch was:
    ``phase`` is the phase the daemon's live stream last reached (``serving`` once a probe answered)."""
    if d.phase != UNKNOWN_PHASE or d.kind not in _OOM_KINDS:
        return d
    kind, where = _oom_at(phase, v0=_v0(d.numbers, d.numbers.get("engine")))
    return Diagnosis(kind, d.evidence, dict(d.numbers), where,
                     _detail(kind, d.numbers, where) + f" (The log did not say where; the launch had reached {phase}.)")


def _whole(piece: str, text: str) -> bool:
    """``text`` is ``piece``'s record whole (a piece of a wrapped line was read on its own first: its first,
    however short, or one of 20 characters or more anywhere in it; in any case: typed in lower case, the piece
    got back the case of fewer of vLLM's phrases than the whole)."""
    if len(text) <= len(piece):
        return False
    piece, text = piece.lower(), text.lower()
    return text.startswith(piece) or len(piece) >= 20 and piece in text


_OOM_KINDS = frozenset({Kind.OOM_WEIGHTS, Kind.OOM_PROFILE, Kind.OOM_CUDAGRAPH, Kind.OOM_RUNTIME})
_SOURCE = 20          # a `raise` source line of a traceback cut off before its exception line
#: the phase a failure's message is only ever printed in (vLLM sizes the KV cache, checks the length against the
#: model's, in one place): where a paste shows nothing else (a line retyped alone, the last lines only)
_SAID_IN = {Kind.KV_CACHE_INSUFFICIENT: "kv_cache", Kind.NO_KV_CACHE_MEMORY: "kv_cache",
            Kind.MAX_LEN_EXCEEDS_MODEL: "config"}
_RETYPED = 99         # (no cap: the mark of a line read again respelled, never respelled twice)


def classify(lines: Iterable[str | bytes], exit_code: int | None = None) -> Diagnosis:
    """Classify a whole log (an iterable of lines) in one go."""
    classifier = Classifier()
    for line in lines:
        classifier.feed(line)
    return classifier.diagnose(exit_code)


def check_auto_fit(numbers: dict[str, Any], phase: str, *, floor: int, cap: int | None) -> Diagnosis | None:
    """A launch with ``--max-model-len auto`` (vLLM 0.14+): vLLM's choice held to the guard's bounds.

    vLLM knows neither bound: it picks anything from 1 token up to the model's whole context. Below
    ``floor`` (--min-model-len) the launch is a KV cache too small; above ``cap`` (the length the
    user asked for, when the plan chose auto to size it) it would serve more than asked, and the
    length asked is known to fit. None: no choice printed yet, or it is within bounds.
    """
    chosen = numbers.get("auto_fit_max_model_len")
    if chosen is None:
        return None
    if chosen < floor:
        return Diagnosis(Kind.KV_CACHE_INSUFFICIENT,
                         evidence=f"Auto-fit max_model_len: vLLM chose {chosen} tokens, below the floor "
                                  f"--min-model-len {floor}",
                         numbers={"fit_max_model_len": chosen}, phase=phase,
                         detail=f"vLLM's auto-fit chose {chosen} tokens, below the floor {floor}")
    if cap and chosen > cap:
        return Diagnosis(Kind.AUTO_FIT_ABOVE_REQUEST,
                         evidence=f"Auto-fit max_model_len: vLLM chose {chosen} tokens, above the "
                                  f"--max-model-len {cap} asked for",
                         numbers={"fit_max_model_len": chosen, "max_model_len": cap}, phase=phase,
                         detail=f"vLLM's auto-fit found room for {chosen} tokens; {cap} were asked for, and fit")
    return None


def _trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EVIDENCE else text[: _EVIDENCE - 1] + "…"


_PUBLIC_DROP = ("config_max_seq_len", "config_tensor_parallel_size", "config_pipeline_parallel_size")


def _public(numbers: dict[str, Any]) -> dict[str, Any]:
    if "served_max_model_len" not in numbers and "config_max_seq_len" in numbers:
        numbers["served_max_model_len"] = numbers["config_max_seq_len"]
    for key in _PUBLIC_DROP:
        numbers.pop(key, None)
    return numbers


def _gpus_detail(n: dict[str, Any]) -> str:
    """More GPUs asked for than there are: how many were asked for and found."""
    if "required_placement_groups" in n:
        return (f"Ray could create only {n.get('created_placement_groups', '?')} of the "
                f"{n['required_placement_groups']} placement groups vLLM needs (one per data-parallel rank): "
                "add GPUs to the Ray cluster or lower --data-parallel-size.")
    asked = n["required_gpus"]
    k = n.get("available_gpus")
    found = f"only {k} {'is' if k == 1 else 'are'} available" if k is not None else "fewer are available"
    s = f"vLLM needs {asked} GPUs (tensor x pipeline parallel size) and {found}"
    if "grace_s" in n:
        s += (f"; vLLM waits (up to 30 minutes) for Ray to provide them, and after {n['grace_s']} s the guard "
              "stops waiting, since Ray may still be joining nodes but no relaunch adds GPUs")
    return s + ": lower --tensor-parallel-size / --pipeline-parallel-size, or add GPUs or nodes."


def _detail(kind: Kind, n: dict[str, Any], phase: str) -> str:
    """One readable sentence about the verdict."""
    if kind is Kind.KV_CACHE_INSUFFICIENT:
        s = f"max_model_len {n.get('max_model_len', '?')} does not fit in the KV cache"
        if "kv_needed_gib" in n:
            s += f" ({n['kv_needed_gib']} GiB needed, {n.get('kv_available_gib', '?')} GiB available)"
        if "fit_max_model_len" in n:
            s += f"; about {n['fit_max_model_len']} tokens fit"
        return s + "."
    if kind is Kind.NO_KV_CACHE_MEMORY:
        return "Nothing was left for the KV cache after the weights and activations."
    if kind is Kind.INSUFFICIENT_FREE_MEMORY:
        if "cpu_kv_gib" in n:
            return (f"Only {n.get('free_gib')} of {n.get('total_gib')} GiB of CPU memory was available for the "
                    f"{n.get('requested_gib')} GiB KV cache asked for; other processes hold the rest, or the KV "
                    "space (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes) is larger than this machine can give.")
        if "cpu_kv_auto_gib" in n or n.get("cpu_node"):
            return (f"Only {n.get('free_gib')} of {n.get('total_gib')} GiB of CPU memory was available, less than "
                    f"the share (--gpu-memory-utilization) asked for ({n.get('requested_gib')} GiB); other "
                    "processes hold the rest.")
        if "total_gib" in n:
            return (f"Only {n.get('free_gib')} of {n['total_gib']} GiB was free at start-up, less than the "
                    f"{n.get('requested_utilization')} utilisation asked for; something else holds GPU memory.")
        return "GPU memory held by other processes left less free than vLLM was asked to use."
    if kind in _OOM_KINDS:
        where = {Kind.OOM_WEIGHTS: "while loading the weights", Kind.OOM_PROFILE: "during the memory profile run",
                 Kind.OOM_CUDAGRAPH: "while capturing CUDA graphs",
                 Kind.OOM_RUNTIME: "while serving requests"}[kind]
        if kind is Kind.OOM_PROFILE and phase == "warmup":
            where = "warming up (kernels, compiled sizes, the sampler) after the KV cache took its share"
        elif kind is Kind.OOM_PROFILE and phase == "kv_cache":
            where = "allocating the KV cache"
        tried = f" (tried to allocate {n['tried_to_allocate_mib']} MiB)" if "tried_to_allocate_mib" in n else ""
        if phase == UNKNOWN_PHASE:
            return (f"The GPU ran out of memory{tried}; nothing in the log says where (no traceback frames, "
                    "no start-up or serving lines before it), so it is read as the phase the output reached: "
                    "loading the weights, the start-up's first.")
        return f"The GPU ran out of memory {where}{tried}."
    if kind is Kind.MAX_LEN_EXCEEDS_MODEL:
        return (f"max_model_len {n.get('max_model_len', '?')} is above the model's own limit of "
                f"{n.get('derived_max_model_len', '?')}.")
    if kind is Kind.CONFIG_ERROR:
        if "required_gpus" in n or "required_placement_groups" in n:
            return _gpus_detail(n)
        if n.get("plugin"):
            return (f"The vLLM plugin {n['plugin']} failed in its own code: usually a plugin built for another vLLM "
                    "release. Install the plugin's release that matches this vLLM; changing flags will not help.")
        if n.get("env_var"):
            return (f"vLLM could not read the environment variable {n['env_var']}: set it to a valid value "
                    "or unset it; changing flags will not help.")
        return "vLLM rejected its configuration; changing memory flags will not help."
    if kind is Kind.ENGINE_DEAD:
        return f"The vLLM engine died ({phase}); a restart may help."
    if kind is Kind.UNKNOWN_FAILURE:
        return ("vLLM failed with an error no rule of this tool names; the evidence is its last exception line. "
                "The guard relaunches the same flags after a backoff, up to the crash-loop limit.")
    return "No fatal failure in the output."
