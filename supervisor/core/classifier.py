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
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from supervisor.core import exits
from supervisor.core.diagnosis import PHASES, Diagnosis, Kind
from supervisor.core.messages import (
    _CAPTURE,
    _CUDA,
    _FATAL,
    _FRAME_PHASE,
    _INFO_PREFIXES,
    _INFO_RULES,
    _KEYS,
    _MILESTONE_PREFIXES,
    _MILESTONES,
    _OOM,
    _RULES,
    _RX_LOGO,
    _SERVING_PREFIXES,
    _WARN_KEYS,
    _WARN_RULES,
    _WEAK_FRAMES,
    COLLATERAL_ERRORS,
    REQUEST_ERRORS,
    REQUEST_FRAMES,
    RUNTIME_MARKERS,
    STOP_PREFIXES,
    _info_numbers,
)

_PHASE = {name: i for i, name in enumerate(PHASES)}
_KEEP = 1000          # characters kept per ring-buffer line: bounded memory on 1 MB lines
_EVIDENCE = 500       # evidence is trimmed to this many characters
_JOIN_CAP = 8000      # a re-assembled wrapped record never grows past this
_WRAP_WIDTH = 80      # terminal width of the hard-wrapped pastes we re-join
_WRAPPER = 10         # the priority of rules that only say "see the root cause above"

_INFO, _WARN, _ERROR, _RAW = 0, 1, 2, 3
_LEVELS = {"DEBUG": _INFO, "INFO": _INFO, "WARNING": _WARN, "WARN": _WARN,
           "ERROR": _ERROR, "CRITICAL": _ERROR}

# Real ESC sequences, caret-notation pastes (``^[[0;36m``) and pastes that lost the ESC byte.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\^\[\[[0-9;?]*[A-Za-z]|\[\d{1,3}(?:;\d{1,3})*m|\x1b")
_ANSI_HINT = ("\x1b", "^[", "m(", "[0", "[1", "[3")
# Anything in front of the record: docker compose service, ISO timestamps, process and rank tags.
_LEAD = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w-]*(?: [\w=.-]+)*) pid=\d+(?:, ip=[^)]*)?\)"
    r"|\[rank(?P<rank>\d+)\]:"
    r"|\[(?P<glog>[IWEF])(?:\d{4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\]"
    r"|[A-Za-z0-9][\w.-]*\s+\|(?=\s|$)"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?: std(?:out|err) [FP](?= ))?"
    r")\s?"
)
_HEADER = re.compile(
    r"(?:(?P<lvl>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) )?\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:\[[^\]\s]*\]|[\w.-]+:\d+\])\s?"
    r"|(?P<ulvl>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+"
)
_RANK = re.compile(r"(?:rank=|TP|rank)(\d+)")
# Where to cut a log that was pasted with its line breaks lost.
_SPLIT = re.compile(
    r"(?<=\S)\s++(?=(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d)"
    r"|\([A-Za-z_][\w-]*(?: [\w=.-]+)* pid=\d+\)|\[rank\d+\]:|Traceback \(most recent call last\)"
    r"|File \"|\[[IWEF](?:\d{4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\]|Killed$)"
)
_EOL = re.compile(r"[\r\n]+")
_FRAME = re.compile(r'\s*File "([^"]*)", line \d+,? in ([\w<>.]+)')   # faulthandler writes no comma
_ENV_READ = re.compile(r"""os\.(?:getenv\(|environ\.get\(|environ\[)\s*["'](\w+)["']""")
_EXC = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|Failed|Interrupt)(?::|$)")
_METHOD = re.compile(r"(?:Error executing method|while processing method) '?(\w+)")
_RECORD_STARTS = ("File \"", "Traceback", "During handling", "The above exception", "Process ")

class Classifier:
    """Streaming classifier: feed it output lines, ask it for the verdict at any time."""

    def __init__(self, max_lines: int = 2000) -> None:
        self.lines: deque[str] = deque(maxlen=max(1, max_lines))
        self._phase = 0
        self._serving = False
        self._capture_done = False   # "Graph capturing finished": a later capture line is another launch's
        self._numbers: dict[str, Any] = {}
        # the verdict so far: (priority, kind, evidence, numbers, phase, placed, provisional); `placed` says
        # what placed an OOM ("message", "serving", "frames", "milestone"), `provisional` a verdict
        # vLLM only warned about and may recover from (a placement group Ray has not provided yet)
        self._best: tuple[int, Kind, str, dict[str, Any], str, str, bool] | None = None
        self._announced = False
        self._terminated = False     # a KeyboardInterrupt: our own SIGTERM during start-up
        self._stopping = False       # the API server said it got a stop signal: what follows is its echo
        self._frame_phase: str | None = None   # the phase the current traceback's frames place it in
        self._frame_strong = False   # ... set by a frame of that phase itself, not a weak (serving/sampler) one
        self._recent_first = False   # faulthandler's dump: the innermost frame comes first
        self._other_thread = False   # ... of a thread other than the one that crashed
        self._after_fatal = False    # the frames just after a "Fatal Python error" belong to it
        self._request = False        # the current traceback is the API server handling one request
        self._runtime = False        # a serving-time wrapper was seen: the engine was running when it died
        self._env_read: str | None = None     # the variable the current traceback's source line reads
        self._raise_open = False     # a `raise X(` source line whose message continues on the next line
        self._pydantic = False       # the last verdict line was pydantic's "N validation error for X"
        self._last_exc = ""          # the first exception no rule names (evidence for wrappers)
        self._exc_after_wrapper = ""
        self._exc_phase = ""         # where that exception happened (its frames, else the milestone)
        self._open_traceback = ""    # the last frame of a traceback whose exception line has not come
        self._from_vllm = False      # a log header, a milestone or a traceback was seen
        self._pending: tuple[str, int, int | None, bool] | None = None   # a wrapped record being re-joined
        self._prev_width = 0
        self._near_width = 0         # lines 70-80 columns wide: with none longer, the log was wrapped
        self._long_seen = False

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
        return _public(dict(self._numbers))

    def feed(self, line: str | bytes) -> Diagnosis | None:
        """Take one line of output; return the verdict the first time a fatal line shows up."""
        try:
            return self._feed(line)
        except Exception:  # noqa: BLE001 - a log line must never take the daemon down
            return None

    def diagnose(self, exit_code: int | None = None) -> Diagnosis:
        """The final verdict over everything seen; ``exit_code`` None means still running."""
        self._flush()
        return self._verdict(exit_code)

    def _verdict(self, exit_code: int | None) -> Diagnosis:
        if self._best is not None and not (self._terminated and self._best[0] < 25):
            prio, kind, evidence, nums, phase, placed, _ = self._best
            if prio <= _WRAPPER and (self._last_exc or self._exc_after_wrapper):
                # a wrapper ("Engine core initialization failed") around a root cause no rule names
                kind, evidence = Kind.UNKNOWN_FAILURE, self._last_exc or self._exc_after_wrapper
                phase = self._exc_phase or phase     # its own traceback's frames, not the wrapper's place
            elif kind in _OOM_KINDS and placed == "milestone" and self._runtime:
                kind, phase = Kind.OOM_RUNTIME, "serving"   # the serving-time wrappers came after it
            numbers = {**self._numbers, **nums}
            if kind is Kind.CONFIG_ERROR and "required_gpus" not in numbers and (
                    "grace_s" in numbers or "placement group" in evidence or "available GPUs" in evidence):
                tp = numbers.get("config_tensor_parallel_size")
                if tp:
                    numbers["required_gpus"] = tp * (numbers.get("config_pipeline_parallel_size") or 1)
            return Diagnosis(kind, _trim(evidence), _public(numbers), phase, _detail(kind, numbers, phase))
        numbers = _public(dict(self._numbers))
        if self._terminated or self._stopping:
            return Diagnosis(Kind.HEALTHY, "", numbers, self.phase,
                             "vLLM was stopped by a signal (SIGTERM or SIGINT, such as the guard's own stop); "
                             "nothing failed.")
        unknown = self._last_exc or self._exc_after_wrapper
        if self._open_traceback and not unknown:
            unknown = f"a traceback cut off before its exception line (last frame: {self._open_traceback})"
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
    def _feed(self, line: str | bytes) -> Diagnosis | None:
        if isinstance(line, (bytes, bytearray)):
            line = bytes(line).decode("utf-8", "replace")
        elif not isinstance(line, str):
            line = str(line)
        if "\x00" in line:
            line = line.replace("\x00", "")
        before = self._best
        if line[-1:] == "\n":
            line = line.rstrip("\r\n")
        if "\r" in line or "\n" in line:
            for seg in _EOL.split(line):
                if seg:
                    self._physical(seg)
        elif line:
            self._physical(line)
        if self._best is not before and self._best is not None and not self._announced:
            self._announced = True
            return self._verdict(None)
        return None

    def _physical(self, seg: str) -> None:
        if "\x1b" in seg or "^[" in seg or "m(" in seg or "[0" in seg or "[1" in seg or "[3" in seg:
            seg = _ANSI.sub("", seg)
        if len(seg) > 400 and _SPLIT.search(seg, 1):
            # A log pasted with its line breaks lost: cut it back into records, keeping each
            # process tag or log header together with the message that follows it.
            pieces: list[str] = []
            carry = ""
            for piece in _SPLIT.split(seg):
                if not piece:
                    continue
                if len(carry) < 256 and not _strip(carry + piece)[0].strip():
                    carry += piece + " "
                    continue
                pieces.append(carry + piece)
                carry = ""
            if carry:
                pieces.append(carry)
            if len(pieces) > 1:
                for piece in pieces:
                    self._one(piece, pasted=True)
                return
        self._one(seg)

    def _one(self, seg: str, pasted: bool = False) -> None:
        width = len(seg)
        text, level, rank = _strip(seg)
        self.lines.append(text[:_KEEP])
        if level != _RAW:
            self._from_vllm = True
        if width > _WRAP_WIDTH:
            self._long_seen = True
        elif width >= 70:
            self._near_width += 1
        # A log copied from an 80-column terminal: a header-less line after an 80-ish one
        # continues the record. Once the log is known to be wrapped (no line ever longer, several
        # close to the width) a record is classified only when whole; before that each piece is
        # classified as it comes and the growing record again, so nothing waits on a live pipe.
        maybe_wrapped = not self._long_seen
        confirmed = maybe_wrapped and self._near_width >= 3
        if self._pending is not None:
            ptext, plevel, prank, done = self._pending
            if (maybe_wrapped and level == _RAW and 60 <= self._prev_width <= _WRAP_WIDTH
                    and not text.lstrip().startswith(_RECORD_STARTS)
                    and (self._prev_width == _WRAP_WIDTH or not (_EXC.match(text) or ptext.startswith("    ")))):
                joined = ptext + text if self._prev_width == _WRAP_WIDTH else ptext.rstrip() + " " + text.lstrip()
                prank = prank if prank is not None else rank
                self._pending = (joined[:_JOIN_CAP], plevel, prank, done and not confirmed)
                if not confirmed:   # maybe a continuation, maybe a record of its own: read it both ways
                    self._line(text, level, rank)
                    self._line(self._pending[0], plevel, prank)
                self._prev_width = width
                return
            self._flush()
        if maybe_wrapped and 60 <= width <= _WRAP_WIDTH and not pasted:
            self._pending = (text, level, rank, not confirmed)
            if not confirmed:
                self._line(text, level, rank)
        else:
            self._line(text, level, rank, pasted)
        self._prev_width = width

    def _flush(self) -> None:
        if self._pending is not None:
            text, level, rank, done = self._pending
            self._pending = None
            if not done:
                self._line(text, level, rank)

    def _line(self, text: str, level: int, rank: int | None, pasted: bool = False) -> None:
        stripped = text.lstrip()
        if stripped.startswith("File \""):
            m = _FRAME.match(stripped)
            if m:
                self._frame(m, stripped)
                rest = stripped[m.end():]
                if len(rest) > 40 and ("Error" in rest or "Exception" in rest):   # a paste that lost its breaks
                    self._check(rest, level, rank)
            return
        elif stripped.startswith("Traceback (most recent call last)"):
            self._frame_phase, self._frame_strong, self._env_read = None, False, None
            self._recent_first = self._after_fatal = self._raise_open = self._request = self._other_thread = False
            self._open_traceback, self._from_vllm = "Traceback (most recent call last)", True
            return
        elif stripped.endswith("(most recent call first):"):   # faulthandler's dump of a dying interpreter
            self._frame_phase, self._frame_strong, self._recent_first = None, False, True
            self._other_thread = stripped.startswith("Thread ")   # not the one that crashed ("Current thread")
            self._from_vllm = True
            return
        if self._open_traceback and not text.startswith(" ") and level == _RAW:
            self._open_traceback = ""    # the exception line that ends the traceback
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
            if "validation error for" in best[2] and len(best[2]) < _EVIDENCE:
                self._best = (best[0], best[1], f"{best[2]}: {stripped}", *best[3:])
        if level != _ERROR and (text.startswith(_MILESTONE_PREFIXES) or "block_size" in text or "engine (v" in text
                                or "max_seq_len=" in text or "parallel_size" in text
                                or (self._phase <= 1 and "version" in text)):
            self._milestone(text, level, rank)
        if level == _INFO:
            if not self._serving and (text.startswith(_SERVING_PREFIXES) or ' HTTP/1.1" ' in text):
                self._serving = True     # a request served: the start-up line may not have been kept
                self._phase = _PHASE["serving"]
            if not pasted and "error: " not in text:
                return   # INFO/DEBUG records never carry a failure
            pasted = True   # an argparse error glued to an INFO record (a paste without line breaks)
        if level == _WARN:
            self._check_warning(text, rank)
            return
        if text.startswith("    ") and len(text) < 300:
            return   # traceback source lines never carry a failure of their own
        self._check(text, level, rank)

    def _frame(self, m: re.Match[str], stripped: str) -> None:
        """A traceback frame: where the failure happened, read from the deepest frame of a known phase."""
        self._open_traceback = stripped[:200]
        self._from_vllm = True
        name = m.group(2).rsplit(".", 1)[-1]
        where = _FRAME_PHASE.get(name)
        if where is None and ("torch/cuda/graphs" in m.group(1) or "CUDAGraph::capture" in stripped):
            where = "cudagraph"      # only real capture enters torch.cuda.graph (Python or C++)
        if where is None:
            if name in REQUEST_FRAMES:
                self._request = True
            return
        weak = name in _WEAK_FRAMES
        if self._other_thread:
            return
        if self._recent_first:           # innermost first: the first known frame is the deepest
            if self._frame_phase is None or (not self._frame_strong and not weak):
                self._frame_phase, self._frame_strong = where, not weak
        elif not weak or self._frame_phase is None:
            self._frame_phase, self._frame_strong = where, not weak
        best = self._best
        if self._after_fatal and best is not None and best[1] is Kind.UNKNOWN_FAILURE and not self._serving:
            if where == "cudagraph":     # the interpreter died inside CUDA-graph capture
                self._best = (best[0], Kind.OOM_CUDAGRAPH, best[2], best[3], "cudagraph", "frames", False)
                self._after_fatal = False
            elif not weak:               # faulthandler's innermost frame of a known phase
                self._best = (*best[:4], where, "frames", False)
                self._after_fatal = False

    def _raise_line(self, stripped: str, level: int, rank: int | None) -> None:
        """A ``raise`` source line: the failure it raises, should the exception line itself be missing."""
        self._raise_open = stripped.startswith("raise ") and not stripped.endswith(")")
        if self._request:
            return                       # a request handler raising: that request's error
        for key, _index in _KEYS:
            if key in stripped:
                self._check(stripped, level, rank, cap=_SOURCE)
                return

    def _milestone(self, text: str, level: int = _INFO, rank: int | None = None) -> None:
        for prefix, phase in _MILESTONES:
            if text.startswith(prefix):
                new = _PHASE[phase]
                if phase == "config" and prefix.startswith("vLLM") and self._phase > _PHASE["config"]:
                    self._new_launch()
                if new > self._phase or (phase == "cudagraph" and self._phase == _PHASE["warmup"]
                                         and not self._capture_done):
                    self._phase = new    # V1 warms kernels up before it captures
                if prefix in ("Graph capturing finished", "CUDA graph pool memory"):
                    self._capture_done = True
                if phase == "serving":
                    self._serving = True
                self._frame_phase, self._frame_strong = None, False   # a new stage: the old traceback is done
                if self._best is not None and self._best[6] and new >= _PHASE["loading"]:
                    self._best, self._announced = None, False   # the placement group came after all
                break
        else:
            if text.startswith(_INFO_PREFIXES):
                self._check_info(text, rank)
            elif text.startswith(STOP_PREFIXES):
                self._stopping = True    # stopped by a signal: the wrappers that follow are its echo
        found = _info_numbers(text)
        if "vllm_version" not in found and self._phase <= 1 and any(c in text for c in "█▄▀"):
            m = _RX_LOGO.search(text)
            if m:
                found["vllm_version"] = m.group(1)
        old = self._numbers.get("vllm_version")
        if old and "vllm_version" in found and not found["vllm_version"].startswith(old):
            del found["vllm_version"]   # the first launch's version stands
        self._numbers.update(found)

    def _new_launch(self) -> None:
        """A second launch's banner in the same log: its start-up starts over."""
        self._phase, self._serving, self._capture_done, self._runtime = 0, False, False, False
        self._stopping = False

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
        if self._serving:
            return "serving"
        return self._frame_phase or self.phase

    def _check(self, text: str, level: int, rank: int | None, cap: int = 100) -> None:
        if not text or "%|" in text:
            return   # progress bars
        if text.startswith("KeyboardInterrupt"):
            self._terminated = True
            return
        if text.startswith("Error executing method ") or "while processing method " in text:
            m = _METHOD.search(text)     # V0/Ray workers name the failing RPC
            if m and m.group(1) in _FRAME_PHASE:
                self._frame_phase, self._frame_strong = _FRAME_PHASE[m.group(1)], True
        if text == "Killed":   # the shell's note that the kernel (often the OOM killer) sent SIGKILL
            self._offer(_WRAPPER, Kind.ENGINE_DEAD, text, {}, self._place())
            return
        if not self._runtime and any(m in text for m in RUNTIME_MARKERS):
            self._runtime = True
        hit = None
        for key, index in _KEYS:
            if key in text:
                hit = index
                break
        if hit is None:
            if _EXC.match(text):
                self._unrecognised(text, level, rank)
            return
        keys, kind, prio, extract = _RULES[hit]
        prio = min(prio, cap)
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
            else:
                kind = Kind.ENGINE_DEAD if kind == _CUDA else Kind.UNKNOWN_FAILURE
                self._after_fatal = kind is Kind.UNKNOWN_FAILURE
                if self._after_fatal:        # a crash dump follows, innermost frame first
                    self._frame_phase, self._frame_strong, self._recent_first = None, False, True
                    self._other_thread = False
        if rank is not None:
            numbers["rank"] = rank
        self._pydantic = "validation error for" in text
        self._offer(prio, kind, text, numbers, phase, placed)

    def _unrecognised(self, text: str, level: int, rank: int | None) -> None:
        if (text.startswith(COLLATERAL_ERRORS) or self._request or self._stopping
                or any(e in text for e in REQUEST_ERRORS)):
            return   # the echo of a peer that died, or one request's error: never a root cause
        if self._in_capture() and not self._serving and not self._terminated:
            numbers = {"rank": rank} if rank is not None else {}
            self._offer(30, Kind.OOM_CUDAGRAPH, text, numbers, "cudagraph")
            return
        if self._best is None:
            if not self._last_exc:
                self._last_exc = text[:_KEEP]    # the first: the root cause, before the wrappers' echoes
                self._exc_phase = self._place()
        elif not self._exc_after_wrapper:
            self._exc_after_wrapper = text[:_KEEP]
            self._exc_phase = self._exc_phase or self._place()

    def _in_capture(self) -> bool:
        if self._serving:
            return False
        if self._frame_phase is not None:
            return self._frame_phase == "cudagraph"
        return self._phase == _PHASE["cudagraph"]

    def _where_oom(self, text: str) -> tuple[Kind, str, str]:
        """Place an OOM: (kind, phase, what placed it). The message itself, then serving, then the
        traceback's frames, then the serving-time wrappers, then the last start-up milestone."""
        if "not enough GPU memory" in text or "linear weights" in text or "allocate the weight" in text:
            return Kind.OOM_WEIGHTS, "loading", "message"
        sampler = "warming up" in text          # the sampler/pooler warm-up: profiling, or after capture
        if self._serving:
            where, placed = "serving", "serving"
        elif self._frame_phase is not None and (self._frame_strong or not sampler):
            where, placed = self._frame_phase, "frames"
        elif self._runtime or any(m in text for m in _OOM_RUNTIME_TEXT):
            where, placed = "serving", "frames"
        else:
            where, placed = self.phase, "milestone"
            if sampler:
                where = "profiling" if self._phase <= _PHASE["profiling"] else "warmup"
        if sampler:
            return Kind.OOM_PROFILE, where if where in ("profiling", "warmup") else "profiling", placed
        if where in ("launching", "config", "engine_init", "loading"):
            return Kind.OOM_WEIGHTS, where, placed
        if where in ("profiling", "warmup"):
            # warm-up (compile sizes, kernel warm-up, DeepGEMM, FlashInfer autotune) runs after the KV
            # cache took its share; eager mode would not skip it, the profile's ladder frees what it needs
            return Kind.OOM_PROFILE, where, placed
        if where == "kv_cache":
            # V1 logs nothing when capture starts, so after "GPU KV cache size" an OOM without
            # frames is most likely the capture; V0 announces its capture, so there it is the KV
            # allocation itself, which is sized during profiling.
            if placed == "frames" or "num_gpu_blocks" in self._numbers:
                return Kind.OOM_PROFILE, where, placed
            return Kind.OOM_CUDAGRAPH, "cudagraph", placed
        if where == "cudagraph":
            return Kind.OOM_CUDAGRAPH, where, placed
        return Kind.OOM_RUNTIME, "serving", placed

    def _offer(self, prio: int, kind: Kind, text: str, numbers: dict[str, Any], phase: str, placed: str = "",
               provisional: bool = False) -> None:
        best = self._best
        if best is None or prio > best[0]:
            self._best = (prio, kind, text, numbers, phase, placed, provisional)
        elif best[1] in _OOM_KINDS and kind in _OOM_KINDS and prio == best[0]:
            # V0 logs str(e) before the traceback: a later copy with frames places it better.
            merged = {**numbers, **best[3]}
            if best[5] == "milestone" and placed in ("frames", "serving"):
                self._best = (prio, kind, best[2], merged, phase, placed, False)
            else:
                self._best = (prio, best[1], best[2], merged, best[4], best[5], False)
        elif kind is best[1] and prio == best[0] and best[6] and not provisional:
            # vLLM gave up waiting (a placement group it could not get): its own error says it best
            merged = {k: v for k, v in {**best[3], **numbers}.items() if k != "grace_s"}
            self._best = (prio, kind, text, merged, phase, placed, False)
        elif kind is best[1] and prio == best[0] and len(numbers) > len(best[3]):
            self._best = (prio, kind, best[2], {**numbers, **best[3]}, best[4], best[5], best[6] and provisional)


_OOM_KINDS = frozenset({Kind.OOM_WEIGHTS, Kind.OOM_PROFILE, Kind.OOM_CUDAGRAPH, Kind.OOM_RUNTIME})
# An OOM that names the running engine: V0's model-execution wrapper, the MQ client's dead engine.
_OOM_RUNTIME_TEXT = ("Error in model execution", "MQEngineDeadError", "Engine loop is not running",
                     "EngineDeadError")
_SOURCE = 20          # a `raise` source line of a traceback cut off before its exception line


_FAST = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w-]*(?: [\w=.-]+)*) pid=\d+\) ?)?"
    r"(?:(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:\[[^\]\s]*\]|[\w.-]+:\d+\]) ?|(?P<ulvl>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+)"
)
_RANK_OF: dict[str, int | None] = {}


def _rank_of(proc: str) -> int | None:
    """TP rank from a process tag such as ``Worker_TP1`` or ``VllmWorker rank=1`` (cached)."""
    if proc not in _RANK_OF:
        if len(_RANK_OF) > 4096:
            _RANK_OF.clear()
        m = _RANK.search(proc)
        _RANK_OF[proc] = int(m.group(1)) if m else None
    return _RANK_OF[proc]


def _strip(seg: str) -> tuple[str, int, int | None]:
    """Remove prefixes and the log header; return (message, level, TP rank or None)."""
    m = _FAST.match(seg)   # the common case: one optional process tag, then a log header
    if m:
        proc = m.group("proc")
        rank = _rank_of(proc) if proc else None
        text = seg[m.end():]
        if text[:1] == "(":   # 0.31+ puts the process tag inside the log format
            m2 = _LEAD.match(text)
            if m2 and m2.group("proc"):
                rank = _rank_of(m2.group("proc"))
                text = text[m2.end():]
        return text, _LEVELS[m.group("lvl") or m.group("ulvl")], rank
    text = seg
    rank = None
    level = _RAW
    for _ in range(6):
        c = text[:1]
        if not (c == "(" or c == "[" or c.isdigit() or "|" in text[:64]):
            break
        m = _LEAD.match(text)
        if not m or not m.group(0):
            break
        if m.group("rank"):
            rank = int(m.group("rank"))
        elif m.group("proc"):
            rank = _rank_of(m.group("proc"))
        elif m.group("glog"):
            level = {"I": _INFO, "W": _WARN}.get(m.group("glog"), _ERROR)
        text = text[m.end():]
    c = text[:1]
    if c in "DIWEC" or c.isdigit():
        m = _HEADER.match(text)
        if m:
            lvl = m.group("lvl") or m.group("ulvl")
            level = _LEVELS.get(lvl, _ERROR) if lvl else _RAW
            text = text[m.end():]
            if text[:1] == "(":
                m = _LEAD.match(text)
                if m and m.group("proc"):
                    rank = _rank_of(m.group("proc"))
                    text = text[m.end():]
    return text, level, rank


def normalize(line: str | bytes) -> str:
    """The message of one log line: ANSI colour, ``\\r``, prefixes and log header removed."""
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", "replace")
    line = line.replace("\x00", "").replace("\r", "").replace("\n", " ")
    if any(h in line for h in _ANSI_HINT):
        line = _ANSI.sub("", line)
    return _strip(line)[0].strip()


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
        return f"The GPU ran out of memory {where}{tried}."
    if kind is Kind.MAX_LEN_EXCEEDS_MODEL:
        return (f"max_model_len {n.get('max_model_len', '?')} is above the model's own limit of "
                f"{n.get('derived_max_model_len', '?')}.")
    if kind is Kind.CONFIG_ERROR:
        if "required_gpus" in n or "required_placement_groups" in n:
            return _gpus_detail(n)
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
