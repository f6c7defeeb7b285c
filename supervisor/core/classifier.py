"""Name what ended a vLLM launch from its output: one pure classifier for the daemon and ``diagnose``.

Pure: lines in, :class:`~supervisor.core.diagnosis.Diagnosis` out; no I/O, no clock. The texts matched here
come from ``research/vllm-failures.md`` (vLLM 0.2 to 0.33). Every line is first normalised (ANSI
colour, ``\\r``, docker/process/rank prefixes and the log header removed), then checked against a
cheap substring prefilter before any regular expression runs, because the daemon pushes every line
of a long-running server through here.

Decision rules, in the order they matter on real logs:

* A root cause beats its wrappers: each rule has a priority, and the first line of the highest
  priority decides (``ValueError: To serve at least one request ...`` beats the later
  ``Engine core initialization failed. See root cause above``).
* Where an OOM happened is read from the traceback frames seen so far and, failing that, from the
  last start-up milestone (research §3.d).
* INFO and DEBUG records never carry a failure, so the look-alikes that vLLM logs at those levels
  (the ``Free memory on device ... on startup. Desired ...`` line, the V0 cudagraph OOM hint) are
  never matched; WARNING records only match rules that are fatal at that level.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Iterable

from supervisor.core import exits
from supervisor.core.diagnosis import PHASES, Diagnosis, Kind
from supervisor.core.messages import (COLLATERAL_ERRORS, REQUEST_ERRORS, _CAPTURE, _CUDA, _FRAME_PHASE, _KEYS, _MILESTONE_PREFIXES,
                                 _MILESTONES, _OOM, _RULES, _RX_LOGO, _info_numbers)

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
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
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
_FRAME = re.compile(r'\s*File "([^"]*)", line \d+, in ([\w<>.]+)')
_ENV_READ = re.compile(r"""os\.(?:getenv\(|environ\.get\(|environ\[)\s*["'](\w+)["']""")
_EXC = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|Failed|Interrupt)(?::|$)")
_RECORD_STARTS = ("File \"", "Traceback", "During handling", "The above exception", "Process ")

class Classifier:
    """Streaming classifier: feed it output lines, ask it for the verdict at any time."""

    def __init__(self, max_lines: int = 2000) -> None:
        self.lines: deque[str] = deque(maxlen=max(1, max_lines))
        self._phase = 0
        self._serving = False
        self._numbers: dict[str, Any] = {}
        # verdict: (priority, kind, evidence, numbers, phase, detail)
        self._best: tuple[int, Kind, str, dict[str, Any], str] | None = None
        self._oom_by_frames = False
        self._oom_frames = False
        self._announced = False
        self._terminated = False
        self._frame_phase: str | None = None
        self._env_read: str | None = None     # the variable the current traceback's source line reads
        self._last_exc = ""          # last unrecognised exception line (evidence for wrappers)
        self._exc_after_wrapper = ""
        self._open_traceback = ""    # the last frame of a traceback whose exception line has not come
        self._from_vllm = False      # a log header, a milestone or a traceback was seen
        self._pending: tuple[str, int, int | None, bool] | None = None   # a wrapped record being re-joined
        self._prev_width = 0
        self._near_width = 0         # lines 70-80 columns wide: with none longer, the log was wrapped
        self._long_seen = False

    # ------------------------------------------------------------------ public
    @property
    def phase(self) -> str:
        """The latest start-up milestone seen (one of ``model.PHASES``)."""
        return PHASES[self._phase]

    @property
    def serving(self) -> bool:
        """True once vLLM said its HTTP server started."""
        return self._serving

    @property
    def numbers(self) -> dict:
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
            prio, kind, evidence, nums, phase = self._best
            if prio <= _WRAPPER and (self._last_exc or self._exc_after_wrapper):
                # a wrapper ("Engine core initialization failed") around a root cause no rule names
                kind, evidence = Kind.UNKNOWN_FAILURE, self._last_exc or self._exc_after_wrapper
            numbers = {**self._numbers, **nums}
            return Diagnosis(kind, _trim(evidence), _public(numbers), phase, _detail(kind, numbers, phase))
        numbers = _public(dict(self._numbers))
        if self._terminated:
            return Diagnosis(Kind.HEALTHY, "", numbers, self.phase,
                             "vLLM was stopped by a signal (our own SIGTERM); nothing failed.")
        unknown = self._last_exc or self._exc_after_wrapper
        if self._open_traceback and not unknown:
            unknown = f"a traceback cut off before its exception line (last frame: {self._open_traceback})"
        exited = exit_code not in (None, 0)
        if exited and exits.signal_of(exit_code) is not None:
            hint = exits.hint(exit_code)
            return Diagnosis(Kind.ENGINE_DEAD, _trim(unknown or exits.describe(exit_code)), numbers, self.phase,
                             f"{exits.describe(exit_code)}" + (f": {hint}." if hint else "."))
        if unknown and (exited or not self._serving):
            how = f"{exits.describe(exit_code)} after" if exited else "The start-up ended with"
            return Diagnosis(Kind.UNKNOWN_FAILURE, _trim(unknown), numbers, self.phase,
                             f"{how} a failure no rule of this tool names; the evidence is its last line.")
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
                self._open_traceback = stripped[:200]
                self._from_vllm = True
                where = _FRAME_PHASE.get(m.group(2).rsplit(".", 1)[-1])
                if where and not (where == "serving" and self._frame_phase not in (None, "serving")):
                    self._frame_phase = where
                elif "torch/cuda/graphs" in m.group(1):   # only real capture enters torch.cuda.graph
                    self._frame_phase = "cudagraph"
                rest = stripped[m.end():]
                if len(rest) > 40 and ("Error" in rest or "Exception" in rest):   # a paste that lost its breaks
                    self._check(rest, level, rank)
            return
        elif stripped.startswith("Traceback (most recent call last)"):
            self._frame_phase = self._env_read = None
            self._open_traceback, self._from_vllm = "Traceback (most recent call last)", True
            return
        if self._open_traceback and not text.startswith(" ") and level == _RAW:
            self._open_traceback = ""    # the exception line that ends the traceback
        if text.startswith("    ") and ("os.getenv(" in text or "os.environ" in text):   # a traceback source line
            m = _ENV_READ.search(text)
            if m:
                self._env_read = m.group(1)
        if level != _ERROR and (text.startswith(_MILESTONE_PREFIXES) or "block_size" in text or "engine (v" in text
                                or "max_seq_len=" in text or (self._phase <= 1 and "version" in text)):
            self._milestone(text)
        if level == _INFO and not pasted and "error: " in text:
            pasted = True   # an argparse error glued to an INFO record (a paste without line breaks)
        if (level == _INFO and not pasted) or (text.startswith("    ") and len(text) < 300):
            return   # INFO/DEBUG records and traceback source lines never carry a failure
        self._check(text, level, rank)

    def _milestone(self, text: str) -> None:
        for prefix, phase in _MILESTONES:
            if text.startswith(prefix):
                if phase == "config" and prefix.startswith("vLLM") and self._phase > _PHASE["config"]:
                    self._phase, self._serving = 0, False   # a new launch in the same log
                self._phase = max(self._phase, _PHASE[phase])
                if phase == "serving":
                    self._serving = True
                break
        found = _info_numbers(text)
        if "vllm_version" not in found and self._phase <= 1 and any(c in text for c in "█▄▀"):
            m = _RX_LOGO.search(text)
            if m:
                found["vllm_version"] = m.group(1)
        old = self._numbers.get("vllm_version")
        if old and "vllm_version" in found and not found["vllm_version"].startswith(old):
            del found["vllm_version"]   # the first launch's version stands
        self._numbers.update(found)

    def _check(self, text: str, level: int, rank: int | None) -> None:
        if level == _WARN or not text or "%|" in text:
            return   # nothing vLLM logs at WARNING is fatal (e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN's override); progress bars
        if text.startswith("KeyboardInterrupt"):
            self._terminated = True
            return
        if text.startswith("Error executing method "):   # V0/Ray workers name the failing RPC
            method = text[len("Error executing method "):].split(".", 1)[0].strip("'\" ")
            self._frame_phase = _FRAME_PHASE.get(method, self._frame_phase)
        if text == "Killed":   # the shell's note that the kernel (often the OOM killer) sent SIGKILL
            self._offer(20, Kind.ENGINE_DEAD, text, {}, self.phase)
            return
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
        if self._terminated and prio < 30:
            return   # the wrappers our own SIGTERM provokes are not failures
        numbers = extract(text) if extract else {}
        if kind is Kind.CONFIG_ERROR and self._env_read and ("invalid literal" in text or "could not convert" in text):
            numbers = {**numbers, "env_var": self._env_read}   # vLLM parsing one of its environment variables
        phase = self.phase
        if kind == _OOM:
            kind, phase = self._where_oom(text)
        elif kind == _CAPTURE:
            kind = Kind.OOM_CUDAGRAPH
            phase = "cudagraph" if self._in_capture() else phase
        elif kind == _CUDA:
            if self._in_capture():
                kind, phase = Kind.OOM_CUDAGRAPH, "cudagraph"
            else:
                kind = Kind.ENGINE_DEAD
        if rank is not None:
            numbers["rank"] = rank
        self._offer(prio, kind, text, numbers, phase)

    def _unrecognised(self, text: str, level: int, rank: int | None) -> None:
        if text.startswith(COLLATERAL_ERRORS) or any(e in text for e in REQUEST_ERRORS):
            return   # the echo of a peer that died, or one request's error: never a root cause
        if self._in_capture() and not self._serving and not self._terminated:
            numbers = {"rank": rank} if rank is not None else {}
            self._offer(30, Kind.OOM_CUDAGRAPH, text, numbers, "cudagraph")
            return
        if self._best is None:
            self._last_exc = text[:_KEEP]
        elif not self._exc_after_wrapper:
            self._exc_after_wrapper = text[:_KEEP]

    def _in_capture(self) -> bool:
        if self._serving:
            return False
        if self._frame_phase is not None:
            return self._frame_phase == "cudagraph"
        return self._phase == _PHASE["cudagraph"]

    def _where_oom(self, text: str) -> tuple[Kind, str]:
        """Place an OOM: the message itself, then the traceback frames, then the last milestone."""
        self._oom_frames = self._frame_phase is not None
        if "not enough GPU memory" in text or "linear weights" in text or "allocate the weight" in text:
            return Kind.OOM_WEIGHTS, "loading"
        where = self._frame_phase
        if self._serving:
            where = "serving"
        elif where is None:
            where = self.phase
            if "warming up" in text:
                where = "profiling" if self._phase <= _PHASE["profiling"] else "warmup"
            elif "private pools (e.g., CUDA Graphs)" in text and "with 0 bytes allocated" not in text:
                where = "cudagraph"   # graph pools hold memory only once capture has begun
        if where in ("launching", "config", "engine_init", "loading"):
            return Kind.OOM_WEIGHTS, where
        if where in ("profiling",):
            return Kind.OOM_PROFILE, where
        if where == "kv_cache":
            # V1 logs nothing when capture starts, so after "GPU KV cache size" an OOM without
            # frames is most likely the capture; V0 announces its capture, so there it is the KV
            # allocation itself, which is sized during profiling.
            if self._frame_phase == "kv_cache" or "num_gpu_blocks" in self._numbers:
                return Kind.OOM_PROFILE, where
            return Kind.OOM_CUDAGRAPH, "cudagraph"
        if where in ("cudagraph", "warmup"):
            return Kind.OOM_CUDAGRAPH, where
        return Kind.OOM_RUNTIME, "serving"

    def _offer(self, prio: int, kind: Kind, text: str, numbers: dict[str, Any], phase: str) -> None:
        best = self._best
        oom_frames = self._oom_frames
        if best is None or prio > best[0]:
            self._best = (prio, kind, text, numbers, phase)
            self._oom_by_frames = oom_frames
        elif best[1] in _OOM_KINDS and kind in _OOM_KINDS and prio == best[0]:
            # V0 logs str(e) before the traceback: a later copy with frames places it better.
            merged = {**numbers, **best[3]}
            if oom_frames and not self._oom_by_frames:
                self._best = (prio, kind, best[2], merged, phase)
                self._oom_by_frames = True
            else:
                self._best = (prio, best[1], best[2], merged, best[4])
        elif kind is best[1] and prio == best[0] and len(numbers) > len(best[3]):
            self._best = (prio, kind, best[2], {**numbers, **best[3]}, best[4])


_OOM_KINDS = frozenset({Kind.OOM_WEIGHTS, Kind.OOM_PROFILE, Kind.OOM_CUDAGRAPH, Kind.OOM_RUNTIME})


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


_PUBLIC_DROP = ("config_max_seq_len",)


def _public(numbers: dict[str, Any]) -> dict[str, Any]:
    if "served_max_model_len" not in numbers and "config_max_seq_len" in numbers:
        numbers["served_max_model_len"] = numbers["config_max_seq_len"]
    for key in _PUBLIC_DROP:
        numbers.pop(key, None)
    return numbers


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
                 Kind.OOM_CUDAGRAPH: "during CUDA graph capture or warm-up",
                 Kind.OOM_RUNTIME: "while serving requests"}[kind]
        tried = f" (tried to allocate {n['tried_to_allocate_mib']} MiB)" if "tried_to_allocate_mib" in n else ""
        return f"The GPU ran out of memory {where}{tried}."
    if kind is Kind.MAX_LEN_EXCEEDS_MODEL:
        return (f"max_model_len {n.get('max_model_len', '?')} is above the model's own limit of "
                f"{n.get('derived_max_model_len', '?')}.")
    if kind is Kind.CONFIG_ERROR:
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
