"""vLLM's text as it arrives: bytes -> lines -> records, with whatever carried the log taken off.

Pure: no I/O, no clock. One stage, run the same on the daemon's live pipes and on ``vllm-guard
diagnose``'s files, before any rule of :mod:`supervisor.core.classifier` sees a line:

1. :class:`LineSplitter`: bytes in bounded chunks -> lines (``\\n``, ``\\r\\n``, lone ``\\r``), each at
   most :data:`MAX_LINE` bytes; what a line holds beyond that is dropped.
2. :class:`Normalizer`, per line: in a paste, what the medium it went through last did to the
   characters undone (:func:`plain_chars`) and a terminal's padding off, a code fence taken as the start
   of a paste of its own, a rule of dashes read as a blank line, IPython's rendering of a traceback put
   in Python's own form (:data:`_IPY_HEADER`); NUL bytes and ANSI colour out; markdown quote markers (``> ``) and
   the indentation of a whole indented paste out; the prefixes of the carriers that shipped the log
   (:data:`CARRIERS`: journald, docker and compose, Kubernetes' CRI files and ``kubectl``, Ray, cloud
   consoles, JSON log lines, ...; and any other's, learnt from the log: :data:`LEARNT`) out, CRI's
   partial lines joined; entries of a console that printed
   newest first put back in time order; lines wrapped by a terminal (cut mid-word at its width) or by an
   editor or a mail client (broken at words, 40 to 300 columns, the space at each break dropped, a word
   longer than the width cut or left whole) re-joined, a carrier's own prefix among what a narrow wrap
   cuts; a log pasted with its line breaks lost cut back into
   records; a line retyped in lower case given back the case of the phrases vLLM prints; then vLLM's
   own prefixes (process tags, ``[rankN]:``, the log header) read into a :class:`Record`.

The guard's own log lines (a journal holds them beside vLLM's) are not vLLM's and are dropped.
Where each carrier's format comes from: ``docs/failure-catalogue.md``, "How logs arrive".
"""

from __future__ import annotations

import bisect
import csv
import enum
import functools
import html
import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple, TypeVar

# --------------------------------------------------------------------------- bytes -> lines
MAX_LINE = 256 * 1024   # longer lines are cut here (the rest of the line is dropped)


class LineSplitter:
    """Bytes in, complete lines out (split on ``\\n``, ``\\r\\n`` and lone ``\\r``); pure.

    The daemon's pipes and ``diagnose``'s files both go through it, so both see the same lines."""

    __slots__ = ("_buf", "_skipping", "_pending_cr", "max_line")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._skipping = False        # inside an over-long line: drop until its end
        self._pending_cr = False      # the last chunk ended in \r: a following \n belongs to it
        self.max_line = max_line

    def feed(self, data: bytes) -> list[bytes]:
        # The common chunk (no \r, not inside an over-long line) is cut by bytes.split, in C: a busy vLLM
        # prints 100,000+ lines a second, and the loop below costs a microsecond a line.
        if not self._skipping and not self._pending_cr and b"\r" not in data:
            lines = data.split(b"\n")
            rest = lines.pop()
            if lines:
                if self._buf:
                    lines[0] = bytes(self._buf) + lines[0]
                if len(rest) <= self.max_line and max(map(len, lines)) <= self.max_line:
                    self._buf.clear()
                    self._buf += rest
                    return lines
            elif len(self._buf) + len(rest) <= self.max_line:
                self._buf += rest
                return []
        return self._feed_slow(data)

    def _feed_slow(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        start = 0
        if self._pending_cr and data[:1] == b"\n":
            start = 1
        self._pending_cr = False
        n = len(data)
        i = start
        while i < n:
            j_n = data.find(b"\n", i)
            j_r = data.find(b"\r", i)
            if j_n < 0 and j_r < 0:
                self._append(data[i:], out)
                break
            j = j_n if j_r < 0 or (0 <= j_n < j_r) else j_r
            self._append(data[i:j], out)
            if self._skipping:
                self._skipping = False
            else:
                out.append(bytes(self._buf))
            self._buf.clear()
            if data[j:j + 1] == b"\r":
                if j + 1 < n and data[j + 1:j + 2] == b"\n":
                    j += 1
                elif j + 1 == n:
                    self._pending_cr = True
            i = j + 1
        return out

    def _append(self, piece: bytes, out: list[bytes]) -> None:
        if self._skipping or not piece:
            return
        room = self.max_line - len(self._buf)
        if len(piece) <= room:
            self._buf += piece
            return
        self._buf += piece[:room]
        out.append(bytes(self._buf))
        self._buf.clear()
        self._skipping = True

    def close(self) -> list[bytes]:
        """The unterminated last line, if any."""
        rest = [] if self._skipping or not self._buf else [bytes(self._buf)]
        self._buf.clear()
        self._skipping = False
        return rest


# --------------------------------------------------------------------------- records
class Level(enum.IntEnum):
    """The level of a record: vLLM's log header's, or RAW for text without one (tracebacks, stderr)."""

    INFO = 0       # INFO and DEBUG: never a failure
    WARN = 1
    ERROR = 2      # ERROR and CRITICAL
    RAW = 3


LEVELS = {"DEBUG": Level.INFO, "INFO": Level.INFO, "WARNING": Level.WARN, "WARN": Level.WARN,
          "ERROR": Level.ERROR, "CRITICAL": Level.ERROR}


class Record(NamedTuple):
    """One record as the rules read it: vLLM's message, its level, the TP rank and process tag."""

    text: str
    level: int = Level.RAW
    rank: int | None = None
    proc: str | None = None      # the process tag: EngineCore_DP0, Worker_TP1, VllmWorkerProcess, ...
    pasted: bool = False         # cut out of a paste that lost its line breaks
    joined: bool = False         # a line and what may be its continuation, joined while not yet known to be


def _record(fields: tuple[str, int, int | None, str | None, bool, bool]) -> Record:
    """A Record from all six fields, made in C (``Record(...)`` runs Python code: a quarter of a microsecond
    on the path that reads each line of a busy server)."""
    return _new_tuple(Record, fields)


_new_tuple = tuple.__new__

# --------------------------------------------------------------------------- what a medium did to the characters
def _typography() -> dict[int, str | None]:
    """The characters a page, a chat or an editor puts in place of vLLM's ASCII, mapped back: spaces of
    every width (a rendered page's no-break space, an ideographic space), characters of no width (a
    zero-width space, a byte-order mark, a soft hyphen), typographic quotes, dashes and minus signs,
    the ellipsis, a markdown typographer's (c) (r) (tm) +-, the full-width forms of ASCII (an input
    method's colon and brackets). vLLM prints none of them, so nothing it printed changes."""
    table: dict[int, str | None] = {i: chr(i - 0xFEE0) for i in range(0xFF01, 0xFF5F)}     # full width
    table.update({i: " " for i in (0x00A0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000)})
    table.update({i: None for i in (0x00AD, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF)})
    table.update({ord(c): "'" for c in "\u2018\u2019\u201a\u201b\u2032\u00b4"})
    table.update({ord(c): '"' for c in "\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb"})
    table.update({ord(c): "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63"})
    table.update({0x2026: "...", 0x00A9: "(c)", 0x00AE: "(r)", 0x2122: "(tm)", 0x00B1: "+-"})
    return table


_TYPOGRAPHY = _typography()
_DASHED_FLAG = re.compile(r"(?<![\w-])[\u2013\u2014](?=[a-z])")     # "\u2014max-model-len": a flag's "--"
_ENTITY = re.compile(r"&(?:[A-Za-z]{2,8}|#\d{2,7}|#[xX][0-9A-Fa-f]{2,6});")
_MD_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def plain_chars(line: str, escaped: bool = False) -> str:
    """vLLM's characters back from what a medium made of them: the typography above; HTML's character
    references (a page's source, a scraper that kept them); markdown's backslash escapes (a rich-text
    editor's ``max\\_model\\_len``: undone only on a line that has one before ``_`` or ``*``, which
    nothing vLLM prints has, or ``escaped``: a line of a paste that showed one, so a Windows path or a regex
    in a message stays as it is)."""
    if not line.isascii():
        if "\u2013" in line or "\u2014" in line:
            line = _DASHED_FLAG.sub("--", line)
        if "\u2026/" in line:          # a typographer's ellipsis for a relative path's ".."
            line = line.replace("\u2026/", "../")
        line = line.translate(_TYPOGRAPHY)
    if "&" in line and _ENTITY.search(line):
        line = html.unescape(line)
    if escaped or "\\_" in line or "\\*" in line:
        line = _MD_ESCAPED.sub(r"\1", line)
    return line


def _medium_touched(line: str) -> bool:
    """Worth :func:`plain_chars`: a character no vLLM line has, an ``&``, a backslash."""
    return not line.isascii() or "&" in line or "\\" in line


# --------------------------------------------------------------------------- vLLM's own prefixes
# Real ESC sequences, caret-notation pastes (``^[[0;36m``) and pastes that lost the ESC byte.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\^\[\[[0-9;?]*[A-Za-z]|\[\d{1,3}(?:;\d{1,3})*m|\x1b")
_ANSI_HINT = ("\x1b", "^[", "m(", "[0", "[1", "[3")
_PROC = r"[A-Za-z_][\w:-]*(?: [\w=.:-]+)*"
#: the level names vLLM's logger (and uvicorn's) prints
_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
# Anything in front of the record: process and rank tags, glog headers, compose services, ISO stamps.
_LEAD = re.compile(
    r"(?:\((?P<proc>" + _PROC + r") pid=\d+(?:, ip=[^)]*)?\)"
    r"|\[(?:rank|default)(?P<rank>\d+)\]:"
    r"|\[(?P<glog>[IWEF])(?:\d{4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\]"
    r"|[A-Za-z0-9][\w.-]*\s+\|(?=\s|$)"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?: std(?:out|err) [FP](?= ))?"
    r")\s?"
)
#: what follows the level in vLLM's log header: its date and time, and its file and line ("[core.py:718]", 0.6+;
#: "engine.py:366]" before)
_STAMP_FILE = r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?:\[[^\]\s]*\]|[\w.-]+:\d+\])"
_HEADER = re.compile(
    r"(?:(?P<lvl>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) )?" + _STAMP_FILE + r"\s?"
    r"|(?P<ulvl>" + _LEVELS + r"):\s+"
)
# The common case, tried first: one optional process tag, then vLLM's log header or uvicorn's.
_FAST = re.compile(
    r"(?:\((?P<proc>" + _PROC + r") pid=\d+\) ?)?"
    r"(?:(?P<lvl>" + _LEVELS + r") " + _STAMP_FILE + r" ?|(?P<ulvl>" + _LEVELS + r"):\s+)"
)
_FAST_ANY_CASE = re.compile(_FAST.pattern, re.I)
_RANK = re.compile(r"(?:rank=|TP|rank)(\d+)", re.I)
_RANK_OF: dict[str, int | None] = {}
# Where to cut a log that was pasted with its line breaks lost.
_SPLIT = re.compile(
    r"(?<=\S)\s++(?=(?:(?:" + _LEVELS + r") \d\d-\d\d \d\d:\d\d:\d\d)"
    r"|\([A-Za-z_][\w-]*(?: [\w=.-]+)* pid=\d+\)|\[rank\d+\]:|Traceback \(most recent call last\)"
    r"|File \"|\[[IWEF](?:\d{4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\]|Killed$)"
)
_EOL = re.compile(r"[\r\n]+")
_FAST_FIRST = frozenset("DIWEC(")
#: An exception line (``ValueError: ...``, ``torch.OutOfMemoryError: ...``, a bare ``KeyboardInterrupt``, Ray's
#: ``ray.exceptions.RayTaskError(RuntimeError): ...``: a worker's exception class in parentheses).
EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|Failed|Interrupt)"
                            r"(?:\([\w.]+\))?(?::|$)")
#: ... of any class name, where its place says it is one (the line right after a traceback's frames): a
#: module-qualified or CamelCase name (triton's ``OutOfResources``, ``SystemExit``, ``StopIteration``)
NAMED_EXCEPTION_LINE = re.compile(r"(?:(?:[a-z_]\w*\.)+[A-Z]\w*|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)"
                                  r"(?:\([\w.]+\))?(?::\s|$)")
#: ... of any form at all (a name, a class in parentheses, then ":" or nothing): a line after a traceback's frames
#: without it is no exception line (a reporter's "...(output cut here)"): the traceback was cut
EXCEPTION_FORM = re.compile(r"[A-Za-z_][\w.]*(?:\([\w.]+\))?(?::|$)")
# an exception line as it starts a record, in any case (a class name: a letter first, then more)
_EXC_ANY_CASE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z][A-Za-z0-9]+(?:Error|Exception|Failure|Interrupt)"
                           r"(?:\([\w.]+\))?(?::|$)", re.I)
_FRAME_END = re.compile(r'File "[^"]*", line \d+,? in [\w<>.]+[ \t]*$', re.I)   # (a copy padded)


def _starts_record(text: str) -> bool:
    """A line that begins a record: vLLM's header or process tag, a traceback's lines, an exception
    line, a carrier's prefix (what a quoted or indented paste begins with)."""
    body = text.lstrip(" \t")
    return starts_own_record(body) or bool(strip_carriers(body).carriers)


def starts_own_record(body: str) -> bool:
    """... of vLLM's or Python's own (no carrier's): the lines that may carry an indentation of their own."""
    return bool(_vllm_starts(body) or _FAST_ANY_CASE.match(body) or body.startswith(RECORD_STARTS)
                or body.startswith(("[rank", '{"', "$ ", "vllm serve", "python -m vllm", "python3 -m vllm"))
                or _EXC_ANY_CASE.match(body))


def _framed(piece: str) -> str:
    """A line cut out of one that held several: a traceback's frame with Python's two spaces before it (the
    spaces were lost with the line break, or an editor's wrap broke there and joined the pieces with one)."""
    if piece[:3] != "  F" and piece.lstrip().startswith('File "'):
        return "  " + piece.lstrip()
    return piece


def _breaks_written(text: str) -> bool:
    """``text`` is a string's repr pasted (an exception's text, a JSON field copied raw): a line break written
    out (``\\n``) stands before a line that begins a record or one of argparse's (vLLM's own text writes one
    only inside a repr of its own, a chat template's, before no such line)."""
    return any(_starts_record(p) or _ARGPARSE.match(p) for p in text.split("\\n")[1:])


# the beginning of vLLM's process tag and log header, cut anywhere ("(EngineCore pid=31", "ERR", "ERROR 11-30 12:0",
# "INFO 11-30 12:00:00 [core.py")
_HEADER_BEGUN = re.compile(r"(?:\([\w:-]*(?: [\w=.:-]*)*\)? ?)?(?:"
                           + "|".join(w[:k] for w in _LEVELS.split("|") for k in range(len(w), 0, -1))
                           + r")?(?: [\d:. -]*(?:\[?[\w./-]*:?\d*\]?)?)?", re.I)


def _header_begun(text: str) -> int | None:
    """Where a string's repr pasted ends in a written-out break and only the beginning of the next record after
    it (a wrap's piece, cut there: its header's, a traceback's or multiprocessing's first words), or None."""
    k = text.rfind("\\n")
    if k < 0 or len(text) - k > 80:
        return None
    tail = text[k + 2:].lower()
    if (_HEADER_BEGUN.fullmatch(tail) or any(s.startswith(tail) for s in _RECORD_STARTS_LOW)
            or _PROCESS_BEGUN.fullmatch(tail)):
        return k
    return None


def _ends_a_frame(raw: str) -> bool:
    """A whole traceback frame or source line: an exception line after it is the traceback's end,
    not the rest of a line cut at the terminal's width."""
    return bool(_FRAME_END.search(raw)) or strip_header(raw)[0].startswith("    ")


#: Lines that start a record of their own (never the continuation of a wrapped line).
RECORD_STARTS = ("File \"", "Traceback", "During handling", "The above exception", "Process ")
_RECORD_STARTS_LOW = tuple(s.lower() for s in RECORD_STARTS)
_PROCESS_LINE = re.compile(r"Process [\w.-]+:\s*$", re.I)     # multiprocessing's "Process EngineCore_DP0:"
_PROCESS_BEGUN = re.compile(r"process(?: [\w.-]*)?")           # ... its beginning (in lower case)


#: The shell's notes on how a process it ran ended, each a whole line of its own (bash's job report):
#: never the rest of a line the terminal wrapped, even after one exactly as wide as the wrap.
SHELL_NOTES = frozenset(f"{what}{core}" for what in ("Killed", "Terminated", "Aborted", "Segmentation fault",
                                                      "Bus error", "Illegal instruction", "Floating point exception")
                        for core in ("", " (core dumped)"))
_SHELL_NOTES_LOW = frozenset(n.lower() for n in SHELL_NOTES)


#: what an interpreter's crash handlers print, each line a whole one (faulthandler's dump, PyTorch's)
_CRASH_STARTS = ("Fatal Python error", "!!!", "Current thread 0x", "Thread 0x")   # (a typographer: "!!!")
_CRASH_STARTS_LOW = tuple(s.lower() for s in _CRASH_STARTS)
#: argparse's own lines: its usage and its error (``%(prog)s: error: %(message)s``)
_ARGPARSE = re.compile(r"(?:usage: [\w.-]+(?: [\w.-]+)? \[|[\w.-]+(?: [\w.-]+)?: error: )", re.I)
#: the start of vLLM's log header, its file and line cut off onto the next line by a wrap
_HEADER_START = re.compile(r"(?:" + _LEVELS + r") \d\d-\d\d \d\d:\d\d(?::\d\d(?:\.\d+)?)?(?: |$)",
                           re.I)
#: a log header's level ending a line (after a break, written out in a repr or not): the rest of the header
#: on the next line goes on with it
_LEVEL_ENDS = re.compile(r"(?:^|\W|\\n)(?:" + _LEVELS + r") ?$", re.I)
#: vLLM's process tag ending a line (what a log header after it on the next line belongs to)
_TAG_END = re.compile(r"\(" + _PROC + r" pid=\d+\)\s*$")


def _begins_record(stripped: str, low: bool = False) -> bool:
    """A traceback's own lines, argparse's and the shell's notes begin a record (never the rest of a line
    the terminal or an editor wrapped)."""
    if ": " in stripped[:64] and _ARGPARSE.match(stripped):
        return True
    if stripped.startswith(_CRASH_STARTS) or (low and stripped.lower().startswith(_CRASH_STARTS_LOW)):
        return True
    if len(stripped) <= 40 and (stripped.rstrip().lower() in _SHELL_NOTES_LOW if low
                                else stripped.rstrip() in SHELL_NOTES):
        return True
    if (stripped.lower() if low else stripped).startswith(_RECORD_STARTS_LOW if low else RECORD_STARTS):
        return not stripped[:8].lower().startswith("process ") or bool(_PROCESS_LINE.match(stripped))
    return False


def _rank_of(proc: str) -> int | None:
    """TP rank from a process tag such as ``Worker_TP1`` or ``VllmWorker rank=1`` (cached)."""
    if proc not in _RANK_OF:
        if len(_RANK_OF) > 4096:
            _RANK_OF.clear()
        m = _RANK.search(proc)
        _RANK_OF[proc] = int(m.group(1)) if m else None
    return _RANK_OF[proc]


def _headed(m: re.Match[str], seg: str) -> tuple[str, int, int | None, str | None]:
    """The record of a line ``_FAST`` matched: one optional process tag, then vLLM's or uvicorn's header."""
    proc = m.group("proc")
    rank = _rank_of(proc) if proc else None
    text = seg[m.end():]
    if text[:1] == "(":   # 0.31+ puts the process tag inside the log format
        m2 = _LEAD.match(text)
        if m2 and m2.group("proc"):
            proc = m2.group("proc")
            rank = _rank_of(proc)
            text = text[m2.end():]
    return text, LEVELS[m.group("lvl") or m.group("ulvl")], rank, proc


def strip_header(seg: str) -> tuple[str, int, int | None, str | None]:
    """vLLM's own prefixes off one line: (message, level, TP rank or None, process tag or None)."""
    m = _FAST.match(seg)   # the common case: one optional process tag, then a log header
    if m:
        return _headed(m, seg)
    text = seg
    rank = proc = None
    level = Level.RAW
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
            proc = m.group("proc")
            rank = _rank_of(proc)
        elif m.group("glog"):
            level = {"I": Level.INFO, "W": Level.WARN}.get(m.group("glog"), Level.ERROR)
        text = text[m.end():]
    c = text[:1]
    if c in "DIWEC" or c.isdigit():
        m = _HEADER.match(text)
        if m:
            lvl = m.group("lvl") or m.group("ulvl")
            level = LEVELS.get(lvl, Level.ERROR) if lvl else Level.RAW
            text = text[m.end():]
            if text[:1] == "(":
                m = _LEAD.match(text)
                if m and m.group("proc"):
                    proc = m.group("proc")
                    rank = _rank_of(proc)
                    text = text[m.end():]
    return text, level, rank, proc


_VLLM_TAG = re.compile(r"\(" + _PROC + r" pid=\d+\) ?")


def _vllm_starts(text: str) -> bool:
    """Does ``text`` start with vLLM's own header or process tag (so no carrier prefix is left)?"""
    return bool(_FAST.match(text)) or (text[:1] == "(" and bool(_VLLM_TAG.match(text)))


# --------------------------------------------------------------------------- carriers
class Carrier(NamedTuple):
    """A program that ships vLLM's lines and puts its own prefix on each: one documented line each."""

    name: str
    what: str
    example: str        # one line as that carrier prints it, around the message "MSG"


#: The carriers whose prefixes are taken off, with a line of each (the tests render every one).
CARRIERS: tuple[Carrier, ...] = (
    # journalctl's short, short-precise, short-full, short-iso[-precise], short-monotonic, short-unix
    Carrier("journald", "journalctl", "Aug 19 18:30:11 gpu-host vllm-guard[8707]: MSG"),
    Carrier("syslog", "a syslog file or moreutils' ts", "Aug 19 18:30:11 MSG"),
    Carrier("docker", "docker/kubectl logs --timestamps", "2024-08-19T18:30:11.123456789Z MSG"),
    Carrier("compose", "docker compose", "vllm-1  | MSG"),
    Carrier("cri", "a Kubernetes container log file", "2024-08-19T18:30:11.123456789Z stderr F MSG"),
    Carrier("kubectl", "kubectl logs --prefix", "[pod/vllm-0/vllm] MSG"),
    # "(pid=N, ip=A)", "(Name pid=N, ip=A)", and " [repeated Nx across cluster]" after a folded line
    Carrier("ray", "Ray's worker and actor output", "(RayWorkerWrapper pid=1234, ip=10.0.0.2) MSG"),
    Carrier("tag", "a wrapper's tag", "[vllm]: MSG"),
    # a time stamp, then the console's own host and level (GKE / Cloud Logging, CloudWatch, container clouds)
    Carrier("console", "a cloud console or log viewer", "2024-08-19 18:30:11.123 UTC\tERROR\tMSG"),
    # ... its table copied, the level first (Logs Explorer's "SEVERITY TIMESTAMP SUMMARY")
    Carrier("console-table", "a cloud console's table, copied", "ERROR   2024-08-19 18:30:11.123 UTC  MSG"),
    # docker's json-file driver, journalctl -o json, Cloud Logging's LogEntry, fluent-bit
    Carrier("json", "JSON log lines", '{"log":"MSG\\n","stream":"stderr","time":"2024-08-19T18:30:11.123456789Z"}'),
    Carrier("priority", "syslog priorities", "<6>MSG"),
    # a log console's export as CSV (CloudWatch Logs Insights, Grafana, a spreadsheet): quoted fields, one a stamp
    Carrier("csv", "a log export's CSV rows", '"2024-08-19 18:30:11.123","MSG","ecs/vllm/4a1f0d7e"'),
)
#: Any other carrier's: a prefix of one shape on every line, learnt from the log itself (see
#: :meth:`Normalizer._unprefixed`): ``grep -n``, ``cat -n``, ``srun --label``, ``pdsh``, ``stern``, a job
#: runner's tag, a viewer's clock.
LEARNT = Carrier("prefix", "an unlisted program's: one shape on every line, learnt from the log", "vllm.log:123:MSG")

# vLLM's own header (or its process tag before one) inside a line, or a traceback's frame: nothing vLLM
# prints holds one (it does print "Traceback (most recent call last):" inside its messages), so what stands
# before one is a carrier's, unless another follows (a paste that lost its line breaks)
# (the header may be cut short by a wrap: its process tag alone, or its level and date, still say it)
_VLLM_INSIDE = re.compile(r"\(" + _PROC + r" pid=\d+\) (?=(?:" + _LEVELS + r")\b|$)"
                          r"|(?:" + _LEVELS + r") \d\d-\d\d(?: \d|$)"
                          r"|  File \"[^\"]+\", line \d+", re.I)
# the tail of a known prefix that a narrow wrap cut off its line: a syslog identifier ("vllm-guard[8707]: ",
# after journald's time and host), a process tag's "pid=N) " without its "(" (vLLM's, Ray's)
_CUT_TAIL = re.compile(r"^[^\s\[\]:]+\[\d+\]: $|^[^(]*pid=\d+(?:, ip=[^)]*)?\) ?$")
# ... and the rest of a process tag a wrap cut anywhere ("(APIServer pid=28" / "17) INFO ..."): a head that
# closes a bracket the line before left open
_CLOSES = re.compile(r"[^()\[\]]*[)\]]:? ?$")
# ... or of vLLM's log header ("ERROR 11-30 12:0" / "0:00 [core.py:242]   File ..."): one that ends where
# the head does
_HEADER_ENDS = re.compile(r"(?:" + _LEVELS + r") " + _STAMP_FILE + r" ?$", re.I)


def _cut_off(before: str, head: str) -> bool:
    """``head``, what stands before vLLM's header or a frame on a line, is the rest of the line ``before`` (a
    wrap's piece), not a carrier's prefix: ``before`` leaves the bracket open that ``head`` closes, or begins
    the log header that ``head`` ends."""
    if len(head) < 60:
        tail, rest = before[-60:], head.rstrip(" \t")
        for joined in (tail + rest, tail + " " + rest):     # (a terminal's cut; an editor's, its space dropped)
            m = _HEADER_ENDS.search(joined)
            if m is not None and m.start() < len(tail):
                return True
    if not _CLOSES.fullmatch(head):
        return False
    close = head.rstrip(": ")[-1]
    opening = "(" if close == ")" else "["
    return before.rfind(opening) > before.rfind(close)


def _no_prefix(text: str, h: re.Match[str], before: str) -> bool:
    """What stands before the header or frame ``h`` found in ``text`` is no carrier's prefix: records that lost
    their line breaks (another follows, or the head ends in one written out: a wrap's piece of a repr), a known
    prefix's tail a narrow wrap cut off, or the rest of the line ``before`` (a wrap's piece)."""
    head = text[:h.start()]
    return (head[-2:] == "\\n" or _another_anchor(text, h) or bool(_CUT_TAIL.match(head))
            or _cut_off(before, head))


def _another_anchor(text: str, h: re.Match[str]) -> bool:
    """Another of vLLM's headers or frames after the one ``h`` found (past its whole header): ``text`` holds
    several records, a paste that lost its line breaks."""
    whole = _FAST.match(text, h.start())
    after = _VLLM_INSIDE.search(text, max(h.end(), whole.end() if whole else 0))
    if after is not None and after.start() == h.end():      # (a process tag's own header, cut by a wrap)
        after = _VLLM_INSIDE.search(text, after.end())
    return after is not None


_SHAPE_TOKEN = re.compile(r"\d+|[ \t]+|[^\d \t]")
_PREFIX_MAX = 120       # how long a carrier's prefix may be
_PAD_RUN = 8            # spaces at a line's end that are a terminal's padding, not vLLM's text
# what a viewer puts after a line number: a tab or a space (cat -n, less -N, nl), grep -n's ":" or "-", a bracket,
# a bar (bat's "   1 │ "), ... (a clock's "12:00:01" and a date's "2024-08-19" are no line number)
_NUMBER_END = r"(?:\t| |[:\])|│>.-](?!\d))"
# a line number right-aligned in its column: spaces that are no indentation
_NUMBERED = re.compile(r"[ \t]+\d{1,7}" + _NUMBER_END)
# ... any line number a viewer puts before a line, and how many lines numbered one after another say it is one
_LINE_NUMBER = re.compile(r"[ \t]*(\d{1,7})" + _NUMBER_END)
_NUMBERED_RUN = 3       # (two, where the paste ends there)
_PRELUDE = 8            # the lines of a command pasted above a log held until a line shows a carrier's prefix
_COMMAND_IN = re.compile(r"vllm serve|python3? -m vllm|docker run|vllm/vllm-openai")   # ... such a command


def prefix_shape(prefix: str) -> str:
    """The shape of a carrier's prefix, as a pattern: its digits any number (a line number, a clock, a
    rank); the spaces it starts with, or that stand before a number, any number (a right-aligned number);
    a digit's ``:`` or ``-`` either (``grep -n`` marks its matches with one and the lines around them with
    the other); the rest as it is, the spaces it ends with exactly (a traceback's indentation follows)."""
    out: list[str] = []
    tokens = _SHAPE_TOKEN.findall(prefix)
    for k, tok in enumerate(tokens):
        if tok[0].isdigit():
            out.append(r"\d+")
        elif tok[0] in " \t" and (not out or k + 1 < len(tokens) and tokens[k + 1][0].isdigit()):
            out.append(r"[ \t]*")      # (before a right-aligned number: as wide as the number leaves it)
        elif tok in ":-" and out and out[-1] == r"\d+":
            out.append("[:-]")
        else:
            out.append(re.escape(tok))
    return "".join(out)

_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"), 1)}
_ZONE = r"(?:Z|[+-]\d\d:?\d\d)"
_IDENT = r"[^\s\[\]:]+(?:\[\d+\])?:"       # a syslog identifier and pid: "vllm-guard[8707]:", "kernel:"
_LVL_WORD = (r"(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|WARN|ERROR|CRITICAL|ALERT|EMERGENCY|FATAL|TRACE|stdout|stderr"
             r"|debug|info|notice|warning|warn|error|critical|fatal)")
_STAMPED = re.compile(
    # journald's short-iso / short-iso-precise (before a host and identifier), CRI, docker -t
    r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
    r"(?:" + _ZONE + r"|(?-i: ?(?:UTC|GMT|[A-Z][A-Z]?[SD]?T)))?)"
    r"(?:(?P<cri> (?P<stream>stdout|stderr) (?P<tag>[FP])(?: |$))"
    # (an identifier, not an exception's name nor uvicorn's level: "<time> INFO KeyError: ..." and "<time> INFO
    # INFO:     ..." are a console's level and a message)
    r"|(?P<jd> [\w.-]+ (?![\w.]*(?:Error|Exception|Warning|Interrupt|Exit):|(?:" + _LEVELS + r"):)"
    + _IDENT + r"(?: |$))"
    r"|(?P<sep>\t+|\s*\|\s*| |$))", re.I   # (a paste retyped in lower case: "t", "z")
)
_SYSLOG = re.compile(
    # journald's short / short-precise (month day time host ident:), short-full (weekday date time zone ...),
    # and a bare syslog/ts stamp
    r"(?P<ts>(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? [A-Z]{2,5})"
    r"|" + _MON + r" [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,6})?)"
    r"(?:(?P<jd> [\w.-]+ " + _IDENT + r"(?: |$))| |$)", re.I
)
_MONO = re.compile(r"\[ *(?P<ts>\d+\.\d{6})(?: <[ \d.]+>)?\] [\w.-]+ " + _IDENT + r"(?: |$)", re.I)   # short-monotonic
_UNIX = re.compile(r"(?P<ts>\d{9,11}\.\d{6}) [\w.-]+ " + _IDENT + r"(?: |$)", re.I)                  # short-unix
_KUBECTL = re.compile(r"\[pod/[^/\]\s]+/[^\]\s]+\] ?")
_TAG = re.compile(r"\[(?!rank\d|default\d)[A-Za-z][\w.-]*\]: ?")
_RAY = re.compile(r"\((?:pid=\d+(?:, ip=[^)]*)?|raylet(?:, ip=[^)]*)?|autoscaler[^)]*|gcs_server[^)]*"
                  r"|[\w:.-]+(?: [\w=.:-]+)*? pid=\d+, ip=[^)]*|[\w.-]*:[\w:.-]+ pid=\d+)\) ?")
_RAY_REPEATED = re.compile(r" \[repeated \d+x across cluster\]$")
_COMPOSE = re.compile(r"(?P<svc>[A-Za-z0-9][\w.-]*) +\|(?: |$)")
_PRIORITY = re.compile(r"<[0-7]>")
#: a time stamp with its date anywhere in a learnt prefix (ISO's, syslog's month and day): a clock alone is not
#: one (a prefix learnt from vLLM's own header typed in lower case holds vLLM's, of whole seconds)
_PREFIX_STAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?|" + _MON
                           + r" [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,6})?")
#: a console's level before its time stamp (a cloud console's table copied: "SEVERITY TIMESTAMP SUMMARY", its
#: level padded to a column), then the column's gap: two spaces where there are two (else one, or a tab)
_LEVEL_FIRST = re.compile(r"(?P<lvl>" + _LVL_WORD + r")(?:\t+| +)"
                          r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:" + _ZONE
                          + r"|(?-i: ?(?:UTC|GMT)))?)(?:\t+|  | |$)", re.I)
# After a console's time stamp: a host and a level, or a level, of the console's own (not vLLM's).
_CONSOLE_REST = re.compile(r"(?:(?P<host>(?!(?:" + _LEVELS + r")\b)[\w.-]+)(?:\t+|\s*\|\s*| ))?"
                           r"(?P<lvl>" + _LVL_WORD
                           + r")(?:\t+|\s*\|\s*| )(?!\d\d-\d\d )")
_JSON_KEYS = ("log", "MESSAGE", "textPayload", "message", "msg")
_JSON_TIME = ("time", "timestamp", "__REALTIME_TIMESTAMP", "@timestamp", "ts")
# The guard's own records (structlog's JSON and console renderings) and its kept-output markers.
_GUARD_CONSOLE = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z? \[(?:debug|info|warning|error|critical) *\] ")
_JOURNAL_NOTES = ("-- Boot ", "-- Logs begin at", "-- No entries --", "-- Journal begins at", "-- Reboot --")


def _ts_key(ts: str) -> tuple[int, ...]:
    """A time stamp as a sortable tuple (year, month, day, hh, mm, ss, nanoseconds); one format per log."""
    nums = re.findall(r"\d+", ts)
    low = ts[:3].lower()
    if len(nums) == 2 and re.fullmatch(r"\d+\.\d+", ts):            # seconds since an epoch or boot
        return (int(nums[0]), int(nums[1].ljust(9, "0")[:9]))
    if len(nums) == 1:                                                  # journald's JSON: microseconds
        return (int(nums[0]),)
    out: list[int] = []
    if low in _MONTHS:
        out.append(_MONTHS[low])
    m = re.search(r"[.,](\d{1,9})", ts)
    frac = int(m.group(1).ljust(9, "0")) if m else 0
    for n in nums[:6] if not m else [x for x in nums if x != m.group(1)][:6]:
        out.append(int(n))
    out.append(frac)
    return tuple(out)


class _Peeled(NamedTuple):
    text: str
    carriers: tuple[str, ...]
    ts: str | None
    stream: str | None
    partial: bool


def strip_carriers(line: str) -> _Peeled:
    """The carriers' prefixes off one line: the rest, the carriers found, the time stamp, the stream
    and whether the carrier marked the line as partial (CRI ``P``, a JSON ``log`` without its newline)."""
    text = line
    found: list[str] = []
    ts = stream = None
    partial = False
    for _ in range(5):
        c = text[:1]
        if not c or (c in "DIWEC(" and _vllm_starts(text)):
            break
        m = None
        name = ""
        if c.isdigit():
            m = _STAMPED.match(text)
            if m:
                ts = ts or m.group("ts")
                if m.group("cri"):
                    name, stream, partial = "cri", m.group("stream"), m.group("tag") == "P"
                elif m.group("jd"):
                    name = "journald"
                else:
                    name = "docker" if "T" in m.group("ts") and m.group("sep") == " " else "console"
                    rest = text[m.end():]
                    if not _vllm_starts(rest):
                        m2 = _CONSOLE_REST.match(rest)
                        if m2 and (m2.group("host") is None or not m2.group("host").isdigit()):
                            name = "console"
                            text = rest[m2.end():]
                            found.append(name)
                            continue
            else:
                m = _UNIX.match(text)
                name = "journald"
                if m:
                    ts = ts or m.group("ts")
        elif c.isalpha() and (m := _LEVEL_FIRST.match(text)) is not None:
            ts, name = ts or m.group("ts"), "console-table"
        elif c in "JFMASONDjfmasondTWStws" and text[3:4] == " ":
            m = _SYSLOG.match(text)
            if m:
                ts = ts or m.group("ts")
                name = "journald" if m.group("jd") else "syslog"
        elif c == "[":
            for rx, nm in ((_KUBECTL, "kubectl"), (_MONO, "journald"), (_TAG, "tag")):
                m = rx.match(text)
                if m:
                    name = nm
                    ts = ts or m.groupdict().get("ts")
                    break
        elif c == "(":
            m = _RAY.match(text)
            name = "ray"
        elif c == "{" and text.rstrip().endswith("}"):
            got = _json_message(text)
            if got is None:
                break
            text, jts, jstream, partial = got
            ts, stream = ts or jts, stream or jstream
            found.append("json")
            continue
        elif c == '"' and '","' in text[:80]:
            got_csv = _csv_message(text)
            if got_csv is None:
                break
            text, cts = got_csv
            ts = ts or cts
            found.append("csv")
            continue
        elif c == "<":
            m = _PRIORITY.match(text)
            name = "priority"
        elif "|" in text[:64]:
            m = _COMPOSE.match(text)
            name = "compose"
        if not m or not m.group(0):
            break
        found.append(name)
        text = text[m.end():]
    if found and "ray" in found and text.endswith("across cluster]"):
        text = _RAY_REPEATED.sub("", text)
    return _Peeled(text, tuple(found), ts, stream, partial)


# The level word of a line as Python's logging printed it: one of its five names, a whole word (never WARN
# or FATAL), behind at most vLLM's process tag ("(APIServer pid=7) INFO 11-29 ...", uvicorn's "INFO:  ...").
_LEVEL_WORD = re.compile(rb"(?:\([^)\n]{0,120}\) +)?(" + _LEVELS.encode() + rb"):?(?: |$)")
_YEAR_NEXT = re.compile(rb"[ \t]*\d{4}-\d\d-\d\d")


def level_word(line: bytes) -> bytes | None:
    """The logging level a line of vLLM's printed (``b"INFO"``, ...), or None for a line without one (a
    traceback's, a progress bar). Read behind the prefixes of a carrier too (:func:`strip_carriers`: a
    vLLM launched through a wrapper that stamps or tags its lines), so the journal's priority of a line
    is decided by the same reading as the classifier's. Bytes, for the output path: the common line
    is one regex match, the carriers are looked for only where none matched."""
    m = _LEVEL_WORD.match(line)
    if m is not None and not _YEAR_NEXT.match(line, m.end()):
        return m.group(1)        # (a level before a dated stamp is a console table's own: vLLM's is behind it)
    c = line[:1]
    if not c or c in b" \t" or line.startswith(b"Traceback"):    # a traceback's: never behind a carrier here
        return None
    peeled = strip_carriers(line.decode("utf-8", "replace"))
    if not peeled.carriers:
        return None
    m = _LEVEL_WORD.match(peeled.text.encode("utf-8", "replace"))
    return m.group(1) if m is not None else None


def _json_closed(text: str) -> bool:
    """Whether a JSON log line put together from a terminal's wrapped pieces is whole: a piece may end
    with a brace of the message's own text (``{'GPU': 1.0}``), so only a parse says."""
    if not text.rstrip().endswith("}"):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


_CSV_STAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d| ?UTC)?|\d{10,19}")


def _csv_message(text: str) -> tuple[str, str] | None:
    """(message, time) of a CSV row a log console exported: quoted fields, one of them a time stamp; the message
    is the first field after it with a space in it (or vLLM's text), else the one right after it (a level's or a
    stream's name is one word, as is "Killed"); None for other rows (the export's header, a line that only begins
    with a quote)."""
    try:
        fields = next(csv.reader([text]))
    except (csv.Error, StopIteration):
        return None
    at = next((i for i, f in enumerate(fields) if _CSV_STAMP.fullmatch(f.strip())), None)
    if at is None or len(fields) < 2:
        return None
    after = fields[at + 1:] or fields[:at]
    message = next((f for f in after if " " in f or _vllm_starts(f)), after[0])
    return message.rstrip("\r\n"), fields[at].strip()


def _json_message(text: str) -> tuple[str, str | None, str | None, bool] | None:
    """(message, time, stream, partial) of a JSON log line; None for other JSON (the guard's own records)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key in _JSON_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            break
        if key == "MESSAGE" and isinstance(value, list) and all(isinstance(b, int) for b in value):
            value = bytes(b & 0xFF for b in value).decode("utf-8", "replace")   # journald's binary-safe form
            break
    else:
        return None
    if "event" in obj and "level" in obj and key not in ("log", "MESSAGE", "textPayload"):
        return None
    ts = next((str(obj[k]) for k in _JSON_TIME if k in obj), None)
    stream = obj.get("stream") if isinstance(obj.get("stream"), str) else None
    partial = key == "log" and not value.endswith("\n")
    return value.rstrip("\r\n"), ts, stream, partial


def guard_own(line: str) -> bool:
    """A line the guard itself wrote (its log records, the launch markers of its kept output)."""
    c = line[:1]
    if c == "{":
        if '"event"' in line and '"level"' in line:
            try:
                obj = json.loads(line)
            except ValueError:
                return False
            return isinstance(obj, dict) and "event" in obj and "level" in obj and "log" not in obj \
                and "MESSAGE" not in obj
        return False
    if c == "=":
        return line.startswith("=== vllm-guard: ")
    if c == "-":
        return line.startswith(_JOURNAL_NOTES)
    return c.isdigit() and bool(_GUARD_CONSOLE.match(line))


def normalize(line: str | bytes) -> str:
    """The message of one log line: ANSI colour, ``\\r``, carriers' and vLLM's prefixes removed."""
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", "replace")
    line = line.replace("\x00", "").replace("\r", "").replace("\n", " ")
    if _medium_touched(line):
        line = plain_chars(line)
    if any(h in line for h in _ANSI_HINT):
        line = _ANSI.sub("", line)
    if line[:1] == ">":
        line = _QUOTE.sub("", line)
    return strip_header(strip_carriers(line).text)[0].strip()


# --------------------------------------------------------------------------- lower case
class Recaser:
    """Gives a line typed in lower case back the case of the phrases vLLM prints (its rules' texts).

    Only lines with no capital letter at all are touched (:func:`folded`), and only the known
    phrases in them, so the rules, written in vLLM's case, match them as they are: :meth:`level`
    for vLLM's log level at the start of a line (before the line's prefixes are read), :meth:`phrases`
    for the message (once a wrapped record is whole)."""

    _LEVEL = re.compile(r"^(?:\((?:[\w:-]+(?: [\w=.:-]+)*) pid=\d+\) ?)?(debug|info|warning|error|critical)"
                        r"(?= \d\d-\d\d \d\d:|: {2,}\S)")
    _EXC = re.compile(r"\b([a-z][a-z0-9_.]+?)(error|exception|interrupt)(?=:)")
    _UNITS = re.compile(r"(?<=\d)( ?)(gib|mib|kib|gb|mb)\b")
    _UNIT_CASE = {"gib": "GiB", "mib": "MiB", "kib": "KiB", "gb": "GB", "mb": "MB"}

    def __init__(self, phrases: Iterable[str]) -> None:
        by_word: dict[str, list[tuple[str, str]]] = {}
        for p in set(phrases):
            if len(p) < 3:
                continue
            low = p.lower()     # a phrase vLLM prints in lower case is kept as it is
            first = re.search(r"[a-z0-9_]+", low)
            by_word.setdefault(first.group(0) if first else low[:1], []).append((low, p))
        self._by_word = by_word
        self._words: frozenset[str] | None = None

    @property
    def words(self) -> frozenset[str]:
        """The words of the phrases, as printed and in lower case (when first needed)."""
        if self._words is None:
            cased = {w for phrases in self._by_word.values() for _, p in phrases for w in _WORD.findall(p)}
            self._words = frozenset(w.lower() for w in cased) | cased
        return self._words

    _GLOG = re.compile(r"^((?:\[rank\d+\]:)?\[)([iwef])(?=(?:\d{4} [\d:.]+(?: \d+)?)? ?[\w./-]+:\d+\])")

    def level(self, text: str) -> str:
        """vLLM's (or uvicorn's, or a glog header's) log level at the start of a folded line, in capitals."""
        c = text[:1]
        if c == "[":
            return self._GLOG.sub(lambda m: m.group(1) + m.group(2).upper(), text, count=1)
        return self._LEVEL.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)] + m.group(1).upper(), text, count=1)

    def phrases(self, text: str) -> str:
        """The known phrases of a folded message in vLLM's case."""
        stripped = text.lstrip()
        if text[:4] == "    " and not stripped.startswith("raise"):
            return text          # traceback source lines: only a `raise` line names a failure
        out = text
        found: list[tuple[str, str]] = []
        for word in set(re.findall(r"[a-z0-9_]+", out)):
            found.extend(self._by_word.get(word, ()))
        if found:
            # the longest phrase wins where phrases overlap ("on kv cache allocation ..." stays lower case)
            found.sort(key=lambda lc: -len(lc[0]))
            # the spans taken, disjoint, by start: a span overlaps one only if it overlaps the last that
            # starts before its end (a bisection, so a long line that repeats a phrase stays linear)
            starts: list[int] = []
            taken: list[tuple[int, int, str]] = []
            for low, cased in found:
                i = out.find(low)
                while i >= 0:
                    j = i + len(low)
                    k = bisect.bisect_left(starts, j)
                    if k == 0 or taken[k - 1][1] <= i:
                        starts.insert(k, i)
                        taken.insert(k, (i, j, cased))
                    i = out.find(low, j)
            pieces, at = [], 0
            for i, j, cased in taken:
                pieces.append(out[at:i])
                pieces.append(cased)
                at = j
            out = "".join(pieces) + out[at:]
        if "file \"" in out:
            out = out.replace("file \"", "File \"")
        out = self._EXC.sub(lambda m: m.group(1) + m.group(2).capitalize(), out)
        return self._UNITS.sub(lambda m: m.group(1) + self._UNIT_CASE[m.group(2)], out)


@functools.lru_cache(maxsize=8)
def _recaser(vocabulary: tuple[str, ...]) -> Recaser:
    """One Recaser per vocabulary (the rules' phrases do not change: a paste read, a launch, builds none)."""
    return Recaser(vocabulary)


_UPPER = re.compile(r"[A-Z]")
_VLLM_TIME = re.compile(r"(?:" + _LEVELS + r") (\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) ", re.I)


def folded(text: str) -> bool:
    """No capital letter in it: maybe retyped in lower case."""
    return _UPPER.search(text) is None


# --------------------------------------------------------------------------- the stage
#: IPython's (Jupyter's) rendering of a traceback: its header ("KeyError          Traceback (most recent call
#: last)"), its frames (IPython 8+: "File /p/x.py:93, in LLM.__init__(self, ...)"; before: "/p/x.py in
#: __init__(self, ...)", "<ipython-input-2-...> in <module>"; a cell: "Cell In[2], line 3"), its source lines
#: numbered, the one running marked with an arrow ("---> 93 self.llm_engine = ...", "     91 ...")
_IPY_HEADER = re.compile(r"[A-Za-z_][\w.]*(?:\([\w.]+\))?[ \t]{2,}Traceback \(most recent call last\)", re.I)
_IPY_FRAME = re.compile(r"File (?P<path>\S+?\.pyx?):(?P<line>\d+), in (?P<name>[\w.<>]+)", re.I)
_IPY_OLD = re.compile(r"(?P<path>(?:/|[A-Za-z]:\\|<ipython-input-)\S*?) in (?P<name>[\w<>]+)(?:\(|$)")
_IPY_CELL = re.compile(r"(?:Cell|Input) In ?\[(?P<cell>\d*)\],? line (?P<line>\d+)", re.I)
_IPY_LEAD = re.compile(r"[ \t]*(?:>[ \t]?)*")     # what stands before its lines: a quote's markers, indentation
_IPY_MAX = 400       # the lines of one such traceback at most (a deep one with its source lines around each frame)
_IPY_SOURCE = re.compile(r"[ \t]*(?:-*>[ \t]*)?\d+(?:[ \t](?P<src>.*))?")
_QUOTE = re.compile(r"^(?:> ?)+")           # (a tab after a ">" is the text's own indentation)
_WRAP_MIN, _WRAP_MAX = 40, 300   # the widths a hard-wrapped paste can have (a terminal, an editor, a mail)
#: the widest line of a paste an editor wrapped at _WRAP_MIN may fall short of it by a word
_SOFT_MIN = _WRAP_MIN - 10
_EM_DASH_AFTER = re.compile(r"[\w!\"'&.,?]").fullmatch    # what a dash textwrap breaks at follows
_WORD_CHAR = re.compile(r"\w").fullmatch
_HYPHEN, _PUNCT = 1, 2             # a break after a hyphen, where a space was (see Normalizer._judge)
_WORD = re.compile(r"[a-z]+", re.I)
_BREAKS_KEPT = 1024              # the breaks judged again when a wider line comes (the first ones)
_SOURCE_INDENT = "    "          # a traceback's source line, as Python prints it under its frame
_JOIN_CAP = 8000                 # a re-assembled wrapped record never grows past this
_HOLD = 64                       # entries held while the order of a time-stamped log is not yet known
_HOLD_MAX = 200_000              # entries kept of a newest-first paste (the newest; older ones are dropped)
_PARTIAL_CAP = 1 << 20           # a CRI partial line joined up to this many characters
_JSON_WRAP_CAP = 64 << 10        # a wrapped JSON line that never parses is given up at this many characters


#: a record that may go on in the next line: its text so far, its first line, read already (while the wrap
#: was not known), folded, the line as its carrier printed it (None: no carrier; "": several put together)
_Chain = tuple[str, str, bool, bool, "str | None"]


def _may_be_prefix(text: str) -> bool:
    """``text`` may begin with a carrier's prefix (see :data:`CARRIERS`), cheaply told: a stamp's digit,
    a bracket or parenthesis, a month's or weekday's name, a priority, a JSON object, a compose service."""
    c = text[:1]
    return c.isdigit() or c in "[(<{" or (c.isalpha() and text[3:4] == " ") or "|" in text[:64]


_RAISED_ANY_CASE = re.compile(EXCEPTION_LINE.pattern, re.I)


_T = TypeVar("_T")


def _both_ways(ways: list[_T]) -> list[_T]:
    """A record read two ways, the likelier first: it again after the other, as the rules keep the first
    verdict a record gives but the last number a start-up line states."""
    if len(ways) < 2 or ways[0] == ways[1]:
        return ways[:1]
    return [ways[0], ways[1], ways[0]]


def _under_frame(text: str, before: str) -> bool:
    """An exception line after a traceback's frame or source line: the traceback's end, not the rest of it."""
    return bool(_RAISED_ANY_CASE.match(text)) and _ends_a_frame(before)


_SPACES = re.compile(r" {2,}")
_NAME_REST = re.compile(r"[\w<>]+")
#: how the carriers' prefixes that hold a time stamp begin (see CARRIERS): one cut before its end
_PREFIX_START = re.compile(r"(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\[ *\d+\.\d{6}\]|\d{9,11}\.\d{6}|\[pod/"
                           r"|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d"
                           r"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d\d-\d\d)", re.I)
#: ... and any carrier's, Ray's among them (``(Name pid=N, ip=...)``)
_CUT_PREFIX = re.compile(_PREFIX_START.pattern + r"|\((?:[\w:.-]+ )?pid=\d+,", re.I)
_WORD_ENDS = frozenset('",;:)]}\'')
_WORD_OPENS = frozenset('"\'([{')
_WORD_GOES_ON = frozenset(",.;:)]}")


def _gap(line: str) -> int:
    """How wide the space an editor dropped after ``line`` may have been: two (text puts two after a
    sentence as often as one), or as wide as the widest run of spaces between the line's own words (a
    banner, a table, a progress bar's padding)."""
    body = line.strip()
    return max(2, *map(len, _SPACES.findall(body))) if "  " in body else 2


def _one_word(line: str) -> bool:
    """A line of one word alone (no space inside it)."""
    body = line.strip()
    return " " not in body and "\t" not in body


_HEADER_TIME = re.compile(r"(?:(?:" + _LEVELS + r") )?\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: (?:\[|[\w.-]+:\d))?", re.I)


def _header_gap(before: str, line: str) -> bool:
    """The break between ``before`` and ``line`` fell where vLLM's log header has a space (its level, date, time
    and file are apart: ``INFO 07-23`` / ``10:00:00 ...``), and no space is left on either side: it was dropped."""
    a, b = before[-16:], line[:16]
    k = len(a)
    spaced = any(m.start() < k < m.end() for m in _HEADER_TIME.finditer(a + " " + b))
    return spaced and not any(m.start() < k < m.end() for m in _HEADER_TIME.finditer(a + b))


def _fields_alike(tails: list[str]) -> int:
    """How far the prefix lines numbered one after another share goes on after their line number (``tails``: each
    line's rest), in the last of them: the fields every one shows alike (a right-aligned number's column, a file's
    name: ``1      1 f.log  ``), to the last space or separator among them and before any line's record begins
    (none into vLLM's header)."""
    tokens = [[(m.start(), m.end(), r"\d+" if m[0][0].isdigit() else " " if m[0][0] in " \t" else m[0])
               for m in _SHAPE_TOKEN.finditer(tail)] for tail in tails]
    cut = 0
    for k, (start, end, shape) in enumerate(tokens[-1]):
        if start >= _PREFIX_MAX or any(len(ts) <= k or ts[k][2] != shape for ts in tokens):
            break
        if any(starts_own_record(tail[ts[k][0]:]) for tail, ts in zip(tails, tokens, strict=True)):
            break                        # (a record begins here on one of them: no field of a prefix)
        if shape == " " or shape in ":|>]":
            cut = end
    return cut


def _column(text: str) -> tuple[int, int]:
    """The spaces and tabs ``text`` begins with, and where the number after them ends (a right-aligned
    column's end, as its number grows)."""
    lead = _lead(text)
    end = lead
    while end < len(text) and text[end].isdigit():
        end += 1
    return lead, end


def _lead(text: str) -> int:
    """How many spaces and tabs ``text`` begins with."""
    return len(text) - len(text.lstrip(" \t"))


def _hyphen_break(last: str, first: str) -> bool:
    """An editor broke a word after a hyphen, ``last`` the word before the break, ``first`` the one after:
    a hyphenated word's (textwrap's rule: two letters before it, one after), or a dash of two hyphens or
    more between words (a flag's ``'--`` / ``nnodes'``: textwrap's em-dash, where a browser breaks too)."""
    if last[-1:] != "-" or not first[:1]:
        return False
    if last[-3:-1].isalpha() and first[:1].isalpha():
        return True
    word = last.rstrip("-")
    return len(last) - len(word) >= 2 and bool(word and _EM_DASH_AFTER(word[-1]) and _WORD_CHAR(first[0]))


def _in_word(last: str, first: str, full: bool, width: int, alone: bool = False) -> bool:
    """An editor broke inside a word, not at a space it dropped: after a hyphen, or (``full``: the line before
    as wide as the wrap) in a word longer than the width, cut at it. ``alone``: that word stood alone on the
    line before; one that ends a quoted path or a clause (``",``, ``)``, ``:``) filled the line whole, as
    one cut falls anywhere in a word."""
    if _hyphen_break(last, first):
        return True
    # (a word longer than the width that goes on in the next line is the rest of one cut; one longer than
    # the width itself stands whole on its line: a cut leaves no piece wider than the width)
    # (and a word that opens with a quote or a bracket began after a space: the editor put it on a line of
    # its own as the one before was full, and cut it there; a comma or a closing mark opens none)
    return (full and len(last) + len(first) > width
            and not (alone and last[-1:] in _WORD_ENDS and first[:1] not in _WORD_GOES_ON)
            and len(first) <= width and first[:1] not in _WORD_OPENS)


def _whole_frame(text: str) -> bool:
    """A traceback's frame line, whole (``File "...", line N, in name``): Python puts its source line, the
    next frame or the exception on lines of their own, so nothing an editor broke off goes on with it."""
    return ", line " in text and bool(_FRAME_END.search(text))


class _Pieces:
    """A line being put together from pieces (a CRI file's partial lines), up to :data:`_PARTIAL_CAP`
    characters: kept as a list and joined once, so a long run of partial lines costs each piece once,
    not the line so far again (a run that never closes is a garbled log, not a reason to hang)."""

    __slots__ = ("pieces", "_size", "width", "wraps", "entries", "bared", "bare", "closing", "ts")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self._size = 0
        self.width = 0          # how wide the line of the last piece was, as printed
        self.bare = False       # ... and it was the carrier's prefix alone (its text wrapped onto the next)
        self.closing = False    # the line's last piece came, bare: it ends at the carrier's next line
        self.ts: str | None = None
        self.entries: list[int] = []    # where the text of each of the carrier's lines starts
        self.bared: set[int] = set()    # ... those whose prefix stood alone on its line
        # the pieces that are a terminal's or an editor's wrap of the line before (not the carrier's own
        # pieces): (where, how wide that line was, the last word on it)
        self.wraps: list[tuple[int, int, str]] = []

    def add(self, piece: str, width: int = 0, wrap: bool = False, entry: bool = False) -> None:
        """``entry``: the text of one of the carrier's lines; ``wrap``: the wrap of the line before."""
        if entry:
            self.entries.append(len(self.pieces))
            if not piece:
                self.bared.add(len(self.entries) - 1)
        room = _PARTIAL_CAP - self._size
        if room > 0 and piece:
            if wrap and self.pieces:
                before = self.pieces[-1]
                self.wraps.append((len(self.pieces), self.width, before.rsplit(None, 1)[-1] if before.strip() else ""))
            piece = piece[:room]
            self.pieces.append(piece)
            self._size += len(piece)
        self.width = width
        self.bare = entry and not piece

    @property
    def last(self) -> str:
        return self.pieces[-1] if self.pieces else ""

    def text(self) -> str:
        return "".join(self.pieces)


class Normalizer:
    """The one normalisation of vLLM's text, line by line: :meth:`feed` a line (str or bytes), get the
    records the rules read, in the order they read them; :meth:`flush` at the end.

    A line that may be the head of a wrapped record comes out at once and again joined with what
    continues it, until the log is known to be wrapped (several lines at the same widest width, none
    wider); from then on a wrapped record comes out once, whole. Lines of a time-stamped carrier are
    held until their order is known (at most :data:`_HOLD` entries); a newest-first paste comes out
    at :meth:`flush`, oldest first.
    """

    def __init__(self, vocabulary: Iterable[str] = (), *, live: bool = False) -> None:
        """``live``: the lines come from vLLM's own pipes as it prints them, not from a paste: nothing
        wraps them (a pipe has no width) and they come in time order, so neither is ever guessed (a
        server printing lines of one length looked hard-wrapped at it, and every line took the slow
        path); carriers, quotes and the rest are still taken off where they appear."""
        self.carriers: Counter[str] = Counter()    # the carriers recognised, by lines
        self._paste_lines = 0                       # the lines of a paste read
        self.guard_lines = 0                        # the guard's own lines dropped
        self.newest_first = False                   # the entries came newest first and were re-ordered
        self.dropped = 0                            # old entries of an over-long newest-first paste dropped
        self._recase = _recaser(tuple(vocabulary))
        self._block_lead = 0                        # the indentation of the block of lines being read
        self._block_char = ""                       # ... its first character (a space or a tab)
        self._reprs = False                         # a record held a string's repr, its breaks written out
        self._drawn = self._drawn_before = 0        # how wide the line read now was drawn, and the one before
        self._drawn_max = 0                         # ... and the widest drawn (no wider than a wrap)
        self._escaped = False                       # a line showed a rich-text editor's markdown escapes
        self._numbered = False                      # ... whose first line began with a right-aligned number
        self._first_rows = False                    # ... indented on its lines' first rows only (before a wrap)
        self._new_block = True                      # the next non-blank line starts a block
        self._quote_depth = 0                       # the depth of a markdown quote the paste is in
        self._quote = ""                            # ... and its markers, as its first line wrote them
        self._all_quoted = True                     # every line of the paste so far began with ">"
        self._json_buf = ""                         # a JSON log line being put back together
        self._json_pieces: list[str] = []           # ... and its pieces, as wrapped
        self._json_widths: list[int] = []           # ... how wide each was drawn
        self._cut_head: tuple[str, int] | None = None      # a line that began like a carrier's prefix, cut
        self._partial: dict[str | None, _Pieces] = {}      # CRI partial lines being joined, by stream
        self._cri_cuts: Counter[int] = Counter()            # ... their lengths (the kubelet's cut, mostly)
        # order of a time-stamped log: None unknown, "in" oldest first, "newest" newest first
        self._order: str | None = None
        self._held: list[list[tuple[str, int, str | None]]] = []   # entries: their (text, width, carried) lines
        self._last_ts: tuple[int, ...] | None = None
        self._desc = 0
        # wrapped lines
        # the records that may go on in the next line, read as a terminal's wrap and as an editor's
        self._pending: tuple[_Chain | None, _Chain | None] | None = None
        self._prev_width = 0
        self._prev_raw = ""
        self._soft_before = ""                      # the record before, read as an editor's wrap
        self._live = live
        self._ipython = False                       # inside IPython's rendering of a traceback (_from_ipython)
        self._ipy_lead = ""                         # ... the quote markers and indentation of its header
        self._ipy_lines = 0                         # ... and its lines read so far
        self._shapes: Counter[str] = Counter()      # the shapes of the prefixes before vLLM's header ...
        self._prefix: re.Pattern[str] | None = None     # ... the one shown most: a carrier's, off every line
        self._prefix_widths: dict[int, tuple[int, int]] = {}   # ... how long it was on those lines: the spaces
        #                                                           before it, and where its first number ended
        self._numbers_only = False                  # ... learnt from line numbers, no line of vLLM's behind it yet
        self._last_text = ""                        # the text of the line before (a wrap's piece's, too)
        self._prelude: list[str] | None = [] if not live else None     # a paste's first lines (_prelude_step)
        self._replaying = False                     # ... being read
        self._wrap_unknown()
        if live:
            self._order = "in"
        self._out: list[Record] = []
        self._plain = False          # nothing held, pending, quoted or indented, wraps ruled out: the fast path
        self._head: tuple[str, int, int | None, str | None] | None = None   # the fast path's last header read

    def _wrap_unknown(self) -> None:
        """Nothing known of how the text is wrapped: at the start, and where a paste of its own starts (a
        code fence: a bug report's blocks were each pasted on their own, an environment's report at one
        width, the log at another or at none)."""
        self._breaks: list[tuple[int, int, str, int, bool]] = []    # where lines may have been broken
        self._max_width = 0
        self._max_lead = 0                          # ... the indentation of its block taken off that line
        self._lead_off = 0                          # ... and off the line read now
        self._at_max = 0
        self._at_max_text = ""
        self._hard_seen = 0                         # lines that went on after one as wide as the widest
        self._soft_seen = 0                         # ... after one a word short of it
        self._spaced_cuts = 0                       # ... the first with a space at the cut
        self._spaced_end = False                    # a line as wide as the widest ended in a space
        self._dropped_seen = 0                      # ... a line that wide, the space after it dropped
        self._cuts_seen: set[str] = set()           # the full lines' breaks counted (the word before each)
        self._long_seen = self._live                # a line wider than any wrap (live: wraps ruled out)
        #: the paragraph read now (the lines since a blank line): the widest line before it widened the paste,
        #: and whether one of its lines began a record (see _narrowed)
        self._para_from: tuple[int, int, str, int, bool] | None = None
        self._para_record = False

    # ------------------------------------------------------------------ public
    @property
    def carrier(self) -> str | None:
        """The carrier most of the log's lines came through, or None (vLLM's own output). In a paste, one on a
        tenth of its lines at least: a wrap's piece or two that read like a carrier's prefix (a progress bar's
        "Completed | 2/4" like compose's) say nothing of how the paste came."""
        if not self.carriers:
            return None
        name, count = self.carriers.most_common(1)[0]
        return name if self._live or count * 10 >= self._paste_lines else None

    def recased(self, text: str) -> str:
        """``text`` with vLLM's case given back to the phrases the rules know (a line retyped in lower case)."""
        return self._recase.phrases(text)

    @property
    def wrap_width(self) -> int | None:
        """The width the log was hard-wrapped at, once known (the paste's own: without the indentation of a
        block indented as a whole)."""
        return self._max_width - self._max_lead if self._confirmed() else None

    def feed(self, line: str | bytes) -> list[Record]:
        if type(line) is bytes:
            line = line.decode("utf-8", "replace")
        elif isinstance(line, (bytes, bytearray)):
            line = bytes(line).decode("utf-8", "replace")
        elif not isinstance(line, str):
            line = str(line)
        last = line[-1:]
        if last == "\n" or last == "\r":      # (a paste's CRLF lines split at LF: a blank one is "\r")
            line = line.rstrip("\r\n")
        if not self._live:               # a paste: what a medium did to it undone (a pipe went through none)
            self._paste_lines += 1
            line = self._as_typed(line)
            if "---" in line[:16] and not line.strip("-> \t"):
                line = ""                # a rule (markdown's, IPython's above a traceback): no text, no wrap's piece
            if self._ipython or "recent call last)" in line:
                python = self._from_ipython(line)
                if python is None:
                    return []
                line = python
            fence = line.lstrip(" \t>")[:3] in ("```", "~~~")
            if fence and self._prelude:
                out = self._held_out() + self._feed_line(line)      # (the lines held: their paste ended)
            elif self._prelude is not None:
                out = []
                lines = self._prelude_step(line)
                for k, one in enumerate(lines):
                    self._replaying = k < len(lines) - 1        # a held line (its prefix as the next line's)
                    out += self._feed_line(one)
                self._replaying = False
            else:
                out = self._feed_line(line)
            if fence:
                self._prelude = []      # a paste of its own starts: its first lines are read as a paste's are
            return out
        return self._feed_line(line)

    def _feed_line(self, line: str) -> list[Record]:
        if (self._plain and line[:1] in _FAST_FIRST and len(line) <= 400 and "\x1b" not in line
                and "\r" not in line and "\n" not in line and "\x00" not in line):
            # the common case, a live vLLM's own line: its header read once, nothing to undo or hold (a
            # line starting with vLLM's header carries no ANSI remnants: those come before the header)
            head = self._head
            if head is not None and line.startswith(head[0]):
                k = len(head[0])
                after = line[k:k + 1]
                if after != "(" and not after.isspace():
                    # the header of the line before (a busy server repeats it): ``_FAST`` would end where it
                    # does, as nothing of the header's pattern goes past it but a space, and read the same
                    self._new_block = self._all_quoted = False
                    one = [_record((line[k:], head[1], head[2], head[3], False, False))]
                    return one if self._live or "\\n" not in line else self._apart(one)
            m = _FAST.match(line)
            if m:
                self._new_block = self._all_quoted = False
                text, level, rank, proc = _headed(m, line)
                end = m.end()
                # kept unless a second process tag followed (0.31+), read by more than ``_FAST``
                self._head = (line[:end], level, rank, proc) if line[end:end + 1] != "(" else None
                one = [_record((text, level, rank, proc, False, False))]
                return one if self._live or "\\n" not in line else self._apart(one)
        if "\x00" in line:
            line = line.replace("\x00", "")
        out: list[Record] = []
        self._out = out
        if "\r" in line or "\n" in line:
            for seg in _EOL.split(line):
                if seg:
                    self._physical(seg)
        elif line:
            self._physical(line)
        else:
            self._new_block = True        # a blank line: an indented block may start after it
            if self._para_from is not None and not self._para_record:
                self._narrowed(self._para_from)
            self._para_from, self._para_record = None, False
        self._plain = (self._long_seen and self._pending is None and not self._held and self._order != "newest"
                       and not self._partial and not self._json_buf and not self._block_lead
                       and not self._quote_depth)
        return self._apart(out) if out else out

    def _apart(self, records: list[Record]) -> list[Record]:
        """Records that hold several lines, each a record: a carrier's entry whose message has line breaks (a
        structured logger's traceback, decoded from JSON), a paste of a string's repr (its line breaks written
        ``\\n``; only before a line that begins a record, see :func:`_breaks_written`). Read once whole
        again: a wrap's pieces were joined first."""
        if not any("\n" in r.text or (not self._live and "\\n" in r.text) for r in records):
            return records
        out: list[Record] = []
        for r in records:
            text = r.text
            if "\n" in text:
                pieces = text.split("\n")
            elif not self._live and "\\n" in text and (self._reprs or _breaks_written(text)):
                # (once a record shows the paste holds a repr, a piece of it the wrap cut off is one too)
                self._reprs = True
                pieces = text.split("\\n")
            elif not self._live and (cut := _header_begun(text)) is not None:
                # (a repr's piece that a wrap cut just after a break, or in the log header after it: the line
                # after it begins the next record, or goes on with it)
                out.append(r._replace(text=text[:cut]))
                continue
            else:
                out.append(r)
                continue
            out.append(r._replace(text=pieces[0]))
            for piece in pieces[1:]:
                if piece.strip():
                    # (its own level: a traceback Python printed is no INFO's; typed in lower case, as the record
                    # was: its phrases' case given back already, so not all of it folded)
                    more = self._record(_framed(self._recase.level(piece)))
                    out.append(more._replace(proc=more.proc or r.proc, rank=more.rank if more.rank is not None
                                             else r.rank, joined=r.joined))
        return out

    def _as_typed(self, line: str) -> str:
        """A pasted line as it was before the medium it went through (:func:`plain_chars`) and without a
        terminal's padding (a copy that keeps the screen's cells: every row as wide as the terminal).

        A wrap cuts a line inside a run of spaces as often as anywhere (vLLM's traceback lines hold runs
        of five), and the kubelet cuts a partial entry after a count of bytes: those spaces are the text's.
        A run of :data:`_PAD_RUN` or more ends no line of vLLM's: padding. A shorter one stays (a line
        almost as wide as the terminal keeps a few spaces of padding, read as a wrap's cut at a space)."""
        if _medium_touched(line):
            # (a rich-text editor escaped the whole paste: a wrap's piece of a line shows it or not)
            self._escaped = self._escaped or "\\_" in line or "\\*" in line
            line = plain_chars(line, self._escaped)
        if line[-2:] == "  " and line.strip(" "):
            bare = line.rstrip(" ")
            if len(line) - len(bare) >= _PAD_RUN:
                return bare
        return line

    def _from_ipython(self, line: str) -> str | None:
        """A line of IPython's (Jupyter's) rendering of a traceback in Python's own form (:data:`_IPY_HEADER`),
        or None for one of its blank lines between frames (none of Python's: a traceback's lines are one block):
        read from its header to its exception line (or a record of vLLM's); a line that is neither, nor one
        of its frames or numbered source lines (a wrap's piece of one), is left as it is."""
        m = _IPY_LEAD.match(line)                # (a quote's markers, indented or not)
        k = m.end() if m else 0
        lead, body = line[:k], line[k:]
        stripped = body.strip()
        if not self._ipython:
            if _IPY_HEADER.fullmatch(stripped) is None and stripped.lower() != "traceback (most recent call last)":
                return line              # (IPython's header has no colon: an editor's wrap may leave it alone)
            self._ipython, self._ipy_lines = True, 0
            # (the paste's own indentation, as its header shows it, stays on every line read back)
            self._ipy_lead = lead + body[:len(body) - len(body.lstrip())]
            return self._ipy_lead + "Traceback (most recent call last):"
        if not stripped:
            return None
        self._ipy_lines += 1
        if self._ipy_lines > _IPY_MAX:
            self._ipython = False        # no exception line came: a paste cut inside it, the rest read as it is
            return line
        at = self._ipy_lead
        m = _IPY_FRAME.match(stripped) or _IPY_OLD.match(stripped)
        if m is not None:
            number = m.groupdict().get("line") or "0"
            return f'{at}  File "{m.group("path")}", line {number}, in {m.group("name")}'
        m = _IPY_CELL.match(stripped)
        if m is not None:
            return f'{at}  File "<cell In[{m.group("cell")}]>", line {m.group("line")}, in <module>'
        m = _IPY_SOURCE.fullmatch(body)
        if m is not None:
            return f"{at}    {(m.group('src') or '').strip()}"
        if _EXC_ANY_CASE.match(stripped) or NAMED_EXCEPTION_LINE.match(stripped) or _vllm_starts(stripped):
            self._ipython = False        # its exception line (Python's own form already), or vLLM's next record
        return line

    def flush(self) -> list[Record]:
        """What is still held: a newest-first paste (re-ordered), an undecided order, a wrapped record."""
        out = self._held_out()
        self._out = out
        self._end_of_paste()
        return self._apart(out) if out else out

    def _held_out(self) -> list[Record]:
        """The lines held at a paste's start (:meth:`_prelude_step`), read now: the paste ended (two numbered
        lines say a viewer's prefix then)."""
        out: list[Record] = []
        prelude, self._prelude = self._prelude or [], None
        self._replaying = self._numbered_run(prelude, 2)
        for line in prelude:
            out += self._feed_line(line)
        self._replaying = False
        return out

    def _prelude_step(self, line: str) -> list[str]:
        """The lines to read now. The command a paste shows above the log, before any line that shows vLLM's
        header or a traceback's frame, is held with the lines after it (at most :data:`_PRELUDE`; a paste
        that starts otherwise is read at once): if that line shows a carrier's prefix none of :data:`CARRIERS`
        is, the command is read with it known (see :meth:`_unprefixed`), as the lines after it are."""
        prelude = self._prelude
        assert prelude is not None
        body = _ANSI.sub("", line) if any(h in line for h in _ANSI_HINT) else line
        if body[:1] in " \t" and not _NUMBERED.match(body):
            body = body.lstrip(" \t")      # (an indented block's: off before the line is read, see _dedent)
        if body[:1] == ">":
            body = _QUOTE.sub("", body)     # (a quote's markers, likewise: see _unquote)
        body = strip_carriers(body).text
        starts = _vllm_starts(body)
        h = None if starts else _VLLM_INSIDE.search(body, 1, _PREFIX_MAX + 40)
        if not starts and h is None:
            numbered = _LINE_NUMBER.match(body)
            if len(prelude) < _PRELUDE - 1 and (prelude or numbered or _COMMAND_IN.search(body, 0, _PREFIX_MAX + 40)):
                prelude.append(line)        # the command that was run, pasted above the log, and what follows
                if numbered is not None and self._numbered_run(prelude, _NUMBERED_RUN):
                    self._prelude = None
                    return prelude
                return []
            self._prelude = None
            return [*prelude, line]
        self._prelude = None
        if (h is not None and h.start() <= _PREFIX_MAX and body[:h.start()].strip(" \t>")
                and not _no_prefix(body, h, prelude[-1] if prelude else "")):
            shape = prefix_shape(body[:h.start()])     # (behind a known carrier's, if any)
            self._shapes[shape] += 1
            self._prefix, self._numbers_only = re.compile(shape), False     # (its length read on each line)
        return [*prelude, line]

    def _numbered_run(self, held: list[str], run: int) -> bool:
        """The last ``run`` of the lines held begin with numbers one after another (cat -n, less -N, nl, grep -n
        of a whole file): a viewer's prefix, though no line shows vLLM's header behind it; learnt if so."""
        numbers, tails = [], []
        m = None
        last = ""
        for line in held[-run:]:
            last = strip_carriers(line).text
            m = _LINE_NUMBER.match(last)
            if m is None:
                return False
            numbers.append(int(m.group(1)))
            tails.append(last[m.end():])
        if m is None or len(numbers) < run or any(b != a + 1 for a, b in zip(numbers, numbers[1:], strict=False)):
            return False
        shape = prefix_shape(last[:m.end() + _fields_alike(tails)])
        self._shapes[shape] += 1
        rx = re.compile(shape)
        end = rx.match(last)
        self._prefix, self._prefix_widths, self._numbers_only = rx, {end.end() if end else m.end(): _column(last)}, True
        return True

    def _end_of_paste(self) -> None:
        """The paste ended (the log did, or a code fence closed it): what it still holds comes out."""
        if self._cut_head is not None:
            head, head_width = self._cut_head
            self._cut_head = None
            self._ordered(head, head_width, None, None)
        if self._json_buf:
            rest = self._json_joined()[0]
            self._ordered(rest, len(rest), None, None)
        for stream in list(self._partial):
            rest = self._partial_text(self._partial.pop(stream))
            self._carried(rest, _WRAP_MAX + 1, rest)
        if self._held:
            if self._order is None:
                self._decide()
            held, self._held = self._held, []
            for entry in (reversed(held) if self._order == "newest" else held):
                for text, width, carried in entry:
                    self._carried(text, width, carried)
        self._flush_pending()

    # ------------------------------------------------------------------ stage A: one physical line
    def _narrowed(self, before: tuple[int, int, str, int, bool]) -> None:
        """A paragraph (the lines since a blank line) that widened the paste ended, and none of its lines began a
        record: a reporter's prose above, between or below the log's blocks, typed at no wrap's width. The widest
        line is what it was before it, and the breaks are judged again."""
        self._max_width, self._at_max, self._at_max_text, self._max_lead, self._long_seen = before
        self._recount()

    def _physical(self, seg: str) -> None:
        if "\x1b" in seg or "^[" in seg or "m(" in seg or "[0" in seg or "[1" in seg or "[3" in seg:
            seg = _ANSI.sub("", seg)
        # how wide the line was when wrapped: as drawn, with its quote's markers and its indentation (the same on
        # every line of a quote or an indented block; a right-aligned line number's spaces, a carrier's, were
        # there when the terminal wrapped it). A quote's markers are the same on every line whatever a wrap did
        # to what follows them (a ">" before an indentation of its text's own: a first piece's)
        width = len(seg)
        self._drawn_before, self._drawn = self._drawn, width
        if self._drawn_max < width <= _WRAP_MAX:
            self._drawn_max = width
        c = seg[:1]
        if c == " " or c == "\t" or c == ">":
            body = seg.lstrip(" \t")
            if body[:1] == ">" and (self._quote_depth or self._all_quoted or body[1:2] == " "
                                    or _starts_record(_QUOTE.sub("", body))):
                seg = self._unquote(body)       # (in a list item, a quote's markers are indented)
            elif self._all_quoted and body:
                self._all_quoted = False
        elif c:
            self._all_quoted = False
            if self._quote_depth and _starts_record(seg):
                self._quote_depth, self._quote = 0, ""      # the quote ended
        seg = self._dedent(seg)
        self._lead_off = width - len(seg)
        if not self._para_record and _starts_record(seg):
            self._para_record = True        # (a paragraph of the log's, not prose: see _narrowed)
        c = seg[:1]
        if (c == "`" or c == "~") and seg.startswith(("```", "~~~")) and not self._live:
            # a paste of its own starts: a bug report's blocks were pasted each on its own, each wrapped at its
            # own width or at none, and a console's entries listed newest first end with their block
            self._end_of_paste()
            self._wrap_unknown()
            self._order, self._last_ts, self._desc, self._reprs = None, None, 0, False
            self._all_quoted = True         # (its lines all quoted so far: a ">" before a prefix nobody listed)
            self._drawn_max = 0
        if self._json_buf and ((self._json_piece_last(seg) and _starts_record(seg))
                               or (c == "{" and seg[:2] == '{"' and _json_closed(seg))):
            # the open JSON line before was no wrapped line, or the last piece of one an editor wrapped (its
            # pieces have any width): this line begins a record of its own, or is a JSON line whole
            before = self._json_widths[-1]
            self._ordered(self._json_joined()[0], before, None, None)
        if self._json_buf or (c == "{" and seg[:2] == '{"' and not _json_closed(seg)):
            # a JSON log line a terminal or an editor wrapped: its pieces until the object closes. Every
            # piece of a terminal's but the last is as wide as the terminal, so a narrower one that ends in a
            # brace and leaves it open ends it, and only a piece that ends in a brace can close it: a run of
            # lines that never closes costs a parse per brace-ended piece of a wrap's width, not one per line
            # of the whole run
            self._json_buf += seg
            if self._json_pieces:      # what the break says of how the paste was wrapped (see _wrap)
                self._judge_break(self._json_pieces[-1], self._json_widths[-1], seg)
            self._json_pieces.append(seg)
            self._json_widths.append(width)     # (as drawn: its block's indentation with it)
            self._note_width(width, seg, _one_word(seg))
            braced = seg.rstrip()[-1:] == "}"
            if (len(self._json_buf) < _JSON_WRAP_CAP and (len(seg) >= _SOFT_MIN or not braced)
                    and not (braced and _json_closed(self._json_buf))):
                return
            seg, other = self._json_joined()
            c = "{"
            if other is not None:
                # how the paste was wrapped is not known yet: the line read both ways, the likelier first
                if self._with_header(seg, other) is other:
                    seg, other = other, seg
                ways = [(one, strip_carriers(one)) for one in (seg, other)]
                if all(p.carriers and not p.partial and not guard_own(one) and not guard_own(p.text)
                       for one, p in ways):
                    self.carriers[ways[0][1].carriers[0]] += 1
                    for one, p in _both_ways(ways):     # (one line: its time as the likelier reading has it)
                        self._ordered(p.text, width, one, ways[0][1].ts)
                    return
        if self._cut_head is not None:
            seg, width = self._rest_of_prefix(seg, width)
            c = seg[:1]
        if (not c or (c in "DIWEC(" and _FAST.match(seg))) and not self._partial:   # the fast path: vLLM's own line
            self._ordered(seg, width, None, None)
            return
        if guard_own(seg):
            self.guard_lines += 1
            return
        p = strip_carriers(seg)
        # (behind a known carrier's prefix too: a PaaS's "app[web.1]: "; never in the pieces of a partial line)
        whole = not (self._partial or p.partial or self._json_buf)
        bare = self._unprefixed(p.text) if whole else None
        carried: str | None = None
        stamp = None
        if bare is not None:
            self.carriers[LEARNT.name] += 1
            # a console's columns in an order no listed carrier's is: its time stamp orders the entries all the
            # same (a console that lists newest first, whatever else its prefix holds)
            found = _PREFIX_STAMP.search(p.text, 0, len(p.text) - len(bare))
            stamp = found.group(0) if found else None
            if p.carriers:
                p = p._replace(text=bare)
            else:
                seg, carried = bare, seg        # (a carrier's line: never the rest of the line before)
                if guard_own(seg):
                    self.guard_lines += 1
                    return
                p = strip_carriers(seg)      # (a known carrier's line behind it: a grep of a journal)
        if not p.carriers:
            if self._partial:          # a terminal's or an editor's wrap of a partial line of a CRI file
                joined = self._partial[next(reversed(self._partial))]
                self._note_width(width, seg, _one_word(seg))
                self._judge_break(joined.last, joined.width, seg)
                # after the carrier's prefix alone, the rest of its line: the space dropped there was the
                # carrier's own, and what the kubelet cut before goes on here
                joined.add(seg, width, wrap=not joined.bare)
                return
            if not self._long_seen and _PREFIX_START.match(seg):
                # a carrier's time stamp, the rest of its prefix wrapped onto the next line (a paste narrower
                # than the prefix): held for that line
                self._cut_head = (seg, width)
                return
            self._ordered(seg, width, carried, stamp)
            return
        text = p.text
        if guard_own(text):
            self.guard_lines += 1
            return
        self.carriers[p.carriers[0]] += 1
        if self._partial:
            for stream, ended in list(self._partial.items()):
                if ended.closing:               # its last piece, wrapped onto the lines before this one
                    del self._partial[stream]
                    self._partial_done(ended, ended.width, ended.ts)
        if p.partial or p.stream in self._partial:
            joined = self._partial.pop(p.stream) if p.stream in self._partial else _Pieces()
            self._note_width(width, seg, False)
            joined.add(text, width, entry=True)
            if p.partial or (not text and joined.last):
                # (the stream last written to is the last one); a last piece with its prefix alone on the
                # line: its text is on the lines that follow, up to the carrier's next line
                self._partial[p.stream] = joined
                joined.closing, joined.ts = not p.partial, p.ts
                return
            self._partial_done(joined, width, p.ts)
            return
        self._ordered(text, width, seg, p.ts or stamp)

    def _unprefixed(self, seg: str) -> str | None:
        """``seg`` without the prefix of a carrier none of :data:`CARRIERS` is, or None (no such prefix).

        The log shows it: what stands before vLLM's header on a line is a carrier's (nothing vLLM prints
        holds its own header), taken off there at once. The shape of the prefix shown most so far
        (:func:`prefix_shape`) comes off every line that begins with it, as long as it was on those (a
        traceback's lines, a raw line, uvicorn's): a wrap's piece that begins like a right-aligned line
        number ("3 seconds") is not as long as ``cat -n``'s six columns. A prefix learnt from line numbers
        alone (:meth:`_numbered_run`) gives way to the one a line shows before vLLM's header (``grep -n`` of
        ``cat -n``'s lines: two numbers)."""
        bare = self._learnt_off(seg)
        if bare is not None and not self._numbers_only:
            return bare
        if seg[:1] in "DIWECdiwec(" and _vllm_starts(seg):
            return bare
        h = _VLLM_INSIDE.search(seg, 1, _PREFIX_MAX + 40)
        if h is None or h.start() > _PREFIX_MAX or (bare is not None and h.start() <= len(seg) - len(bare)):
            return bare
        k = h.start()
        if not seg[:k].strip() or _no_prefix(seg, h, self._last_text):
            # indentation (a paste's or a traceback's own), records that lost their breaks, a known prefix's tail,
            # the rest of the line before
            return bare
        self._numbers_only = False
        shape = prefix_shape(seg[:k])
        self._shapes[shape] += 1
        if len(self._prefix_widths) < 16 and (self._prefix is None
                                              or self._shapes[shape] >= self._shapes[self._prefix.pattern]):
            if self._prefix is None or self._prefix.pattern != shape:
                self._prefix, self._prefix_widths = re.compile(shape), {}
            self._prefix_widths[k] = _column(seg)
        return seg[k:]

    def _learnt_off(self, seg: str) -> str | None:
        """``seg`` without the learnt prefix it begins with (as long as it was where learnt: a digit more or less
        for each of its numbers, or a ``:`` for a ``-``; a right-aligned number's column exactly, or wider by a
        digit for each of its numbers where the number outgrew the column, or after as many spaces: an indented
        block's numbers, left-aligned, grew a digit; or where the column ends where it ended: a number after it
        grew; a wrap's piece "29500 (errno ..." is no ``less -N`` column), or None."""
        rx = self._prefix
        if rx is None:
            return None
        m = rx.match(seg)
        if m is None or not m.end():
            return None
        end, widths = m.end(), self._prefix_widths
        slack = max(1, rx.pattern.count("\\d+"))     # (each of its numbers a digit more or less)
        if rx.pattern[:6] == "[ \\t]*":       # a right-aligned number's column
            fits = end in widths
            if not fits:
                lead_col = _column(seg)
                fits = any(0 < end - w <= slack and (seg[:1] not in " \t" or lead_col[0] == lead
                                                     or lead_col[1] == col)
                           for w, (lead, col) in widths.items())
        else:
            fits = any(abs(end - w) <= slack for w in widths)
        return seg[end:] if fits or self._replaying else None

    def _json_piece_last(self, seg: str) -> bool:
        """The open JSON line's last piece was its end, not a wrap's: shorter than any wrap leaves a line,
        unless ``seg``'s first word would not have fit after it (an editor's wrap at 40 columns leaves a
        line of 22 before a word of 23)."""
        last = self._json_widths[-1]
        if last >= _SOFT_MIN:
            return False
        first = seg.lstrip().split(" ", 1)[0]
        return last + 1 + len(first) <= max(self._max_width, _WRAP_MIN)

    def _reads_soft(self) -> bool:
        """The paste reads as an editor's wrap, known or likelier so far (see :meth:`_mode`): a terminal's
        wrap leaves a short line that goes on far more rarely than an editor's fills a line to the width, so
        a short one weighs more (about 3 to 2); with nothing seen, or as much of each, a terminal's (the
        likelier paste)."""
        mode = self._mode()
        return mode == "soft" or (mode is None and 3 * self._soft_seen > 2 * self._hard_seen + 1)

    def _dropped_space(self, width: int, last: str, first: str, alone: bool = False) -> bool:
        """A line ``width`` wide (as printed) ending in the word ``last``, its wrap going on with ``first``,
        as an editor wrapped it: broken at a space it dropped, not inside a word (see :meth:`_wrap`)."""
        return bool(last and first) and not _in_word(last, first, width == self._max_width,
                                                     self._max_width - self._max_lead, alone)

    def _partial_done(self, joined: _Pieces, width: int, ts: str | None) -> None:
        """A CRI file's partial lines, the line whole: read as the paste's wrap reads (while it is not known,
        the reading that gives a record vLLM's log header where the other does not, else the likelier one:
        what wraps it next goes on with the one record)."""
        soft = self._reads_soft()
        text = self._partial_text(joined, soft=soft)
        if self._mode() is None and joined.wraps:
            text = self._with_header(text, self._partial_text(joined, soft=not soft))
        self._ordered(text, width, "", ts)     # carried, but no longer one line of it

    def _with_header(self, likelier: str, other: str) -> str:
        """Of a line read two ways, the one where vLLM's log header is whole (a wrap cut into it in the
        other; in any case), else the likelier."""
        def headed(text: str) -> bool:
            body = strip_carriers(text).text
            return strip_header(self._recase.level(body) if folded(body) else body)[1] != Level.RAW
        return other if headed(other) and not headed(likelier) else likelier

    def _partial_text(self, joined: _Pieces, soft: bool | None = None) -> str:
        """A CRI file's partial lines put together: the kubelet's pieces glued, a wrap's after the space an
        editor dropped (``soft``: read so, or not; None: as the paste's wrap reads, decided once the line is
        whole, when the paste has said more of it). The kubelet cuts every partial line at one length: one
        a character short of it (where the paste was wrapped) lost the space it ended in, dropped by the
        editor with the end of its line."""
        if not joined.wraps:
            return joined.text()
        pieces = list(joined.pieces)
        soft = self._reads_soft() if soft is None else soft
        for i, width, last in joined.wraps:
            piece = pieces[i]
            if soft and self._dropped_space(width, last, piece.split(None, 1)[0] if piece.strip() else "",
                                            pieces[i - 1].strip() == last):
                pieces[i] = " " + piece
        bounds = [*joined.entries, len(pieces)]
        sizes = [sum(map(len, pieces[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)][:-1]
        if len(self._cri_cuts) < 64:
            self._cri_cuts.update(sizes)
        cut, seen = self._cri_cuts.most_common(1)[0] if self._cri_cuts else (0, 0)
        for k, size in enumerate(sizes):
            a, b = bounds[k], bounds[k + 1]
            # (while the length is not known, one seen once: where a space reads well between the pieces)
            # (a space there already, at the piece's end or the next one's start, was not lost)
            spaced = pieces[b - 1][-1:] == " " or (b < len(pieces) and pieces[b][:1] == " ")
            if b > a and not spaced and (size == cut - 1 if seen > 1 else b < len(pieces)
                                         and self._space_reads(pieces[b - 1], pieces[b]) == 2):
                # ... or began with, dropped with the prefix's own space: where a space reads likelier (none
                # where it would split a number: the character lost was a space inside, two where one is)
                end = self._space_reads(pieces[b - 1], pieces[b]) if b < len(pieces) else 1
                start = self._space_reads(pieces[a - 1], pieces[a]) if k in joined.bared and a > 0 else -1
                if start > end:
                    pieces[a] = " " + pieces[a]
                elif end > 0:
                    pieces[b - 1] += " "
        final = len(bounds) - 2         # the line's last piece (its length not the kubelet's): its prefix alone
        a = bounds[final] if final >= 0 else 0
        if (final in joined.bared and 0 < a < len(pieces) and not pieces[a - 1].endswith(" ")
                and self._space_reads(pieces[a - 1], pieces[a]) == 2):
            pieces[a] = " " + pieces[a]     # on its line, and a space reads well before what followed
        return "".join(pieces)

    def _space_reads(self, before: str, after: str) -> int:
        """How well a space reads between the end of ``before`` and the start of ``after``: 2 after a comma
        or a colon (before a word, a quote or a bracket: a repr's ``: {``) or between two words of vLLM's
        messages, 0 inside a number or a word of vLLM's cut in two ("proce" and "ss"), 1 otherwise."""
        last = before.rsplit(None, 1)[-1] if before.strip() else ""
        first = after.split(None, 1)[0] if after.strip() else ""
        if not last or not first:
            return 1
        if last[-1] in ",;:." and (first[0].isalpha() or first[0] in "([{"):
            return 2
        if last[-1].isalpha() and first[0].isalpha():
            if self._two_words(last, first):
                return 2
            if self._glued_word(last, first):
                return 0
        digits = last[-1].isdigit() or last[-1] == "."
        return 0 if digits and (first[0].isdigit() or first[0] == ".") else 1

    def _rest_of_prefix(self, seg: str, width: int) -> tuple[str, int]:
        """The line after one that began like a carrier's prefix (held in ``_cut_head``): with it, the
        carrier's line whole (put together as the paste's wrap reads: an editor's dropped space, a
        terminal's cut), or, when it makes none, the held line as it was and this one next."""
        head, head_width = self._cut_head or ("", 0)
        self._cut_head = None
        ways = [head.rstrip() + " " + seg.lstrip(), head + seg]
        if not self._reads_soft():
            ways.reverse()
        for line in ways:
            if strip_carriers(line).carriers:
                self._note_width(head_width, head, _one_word(head))
                self._judge_break(head, head_width, seg)
                self._note_width(width, seg, _one_word(seg))
                return line, width      # (its pieces noted: wider than either, it says nothing of the wrap)
        self._ordered(head, head_width, None, None)
        return seg, width

    def _json_joined(self) -> tuple[str, str | None]:
        """The wrapped JSON log line whole again: its pieces glued where a terminal cut them (every piece but
        the last as wide as the terminal), or, where an editor broke it at words (pieces of several widths,
        as the log's other wrapped lines showed), joined with the space it dropped, glued only where it
        broke inside a word (see :meth:`_wrap`); glued when it would not parse otherwise. While the wrap is
        not known, both: (the likelier, the other); else (the one, None)."""
        glued, pieces, widths = self._json_buf, self._json_pieces, self._json_widths
        self._json_buf, self._json_pieces, self._json_widths = "", [], []
        if len(pieces) < 2:
            return glued, None
        undecided = self._mode() is None
        soft = self._reads_soft()
        if not undecided and not soft:
            return glued, None
        w = max(self._max_width, *widths[:-1])
        out = [pieces[0]]
        for before, width, piece in zip(pieces, widths, pieces[1:], strict=False):
            last = before.rsplit(None, 1)[-1] if before.strip() else ""
            first = piece.split(None, 1)[0] if piece.strip() else ""
            # (a backslash before the break began an escape: no space was there, JSON has none after one)
            out.append(piece if (before[-1:] == "\\" or _in_word(last, first, width == w, w - self._max_lead,
                                                                     before.strip() == last))
                       else " " + piece.lstrip())
        spaced = "".join(out)
        if not _json_closed(spaced) and _json_closed(glued):
            return glued, None
        if undecided and spaced != glued:
            return (spaced, glued) if soft else (glued, spaced)
        return spaced if soft else glued, None

    def _unquote(self, seg: str) -> str:
        """Take off a markdown quote's markers, as the quote's first record wrote them (``> `` or ``>``,
        as deep as it was): a ``>`` further on, or a space after a bare ``>``, is the text's. A line that
        begins with the bare markers and text right after them says they were bare on every line: the space
        after them on the lines before was the text's (their block's indentation one space deeper)."""
        if not self._quote:
            m = _QUOTE.match(seg)
            self._quote = m.group(0) if m else ">"
            self._quote_depth = self._quote.count(">")
        q = self._quote
        if seg.startswith(q):
            return seg[len(q):]
        bare = q.rstrip(" \t")
        if not seg.startswith(bare):
            return _QUOTE.sub("", seg, count=1)
        rest = seg[len(bare):]
        if rest and rest[:1] not in " \t" and self._block_lead:
            self._quote = bare
            self._relead(self._block_lead + len(q) - len(bare))
        return rest

    def _relead(self, lead: int) -> None:
        """The block's indentation decided again, from a line read after others (a numbered block's, a quote's
        markers that were bare): a prefix learnt from those lines was where they stood with the old one taken off,
        and is where the lines after it stand with the new one taken off."""
        shift = self._block_lead - lead
        if shift and self._prefix_widths:
            self._prefix_widths = {w + shift: (pad + shift, col + shift)
                                   for w, (pad, col) in self._prefix_widths.items() if w + shift > 0}
        self._block_lead = lead

    def _dedent(self, seg: str) -> str:
        """Take off the indentation of an indented block (a markdown code block, a list item's paste):
        a block starts the paste or follows a blank line or a code fence, and its first line's
        indentation is the block's (a traceback's own indentation, deeper, stays; a line indented less keeps
        its spaces, a wrap's piece, unless it begins a record: then the block's is its), unless that line
        begins with a right-aligned line number: then the least its other lines show."""
        c = seg[:1]
        if c != " " and c != "\t":
            fence = (c == "`" or c == "~") and seg.startswith(("```", "~~~"))
            if self._new_block and self._first_rows and c and not fence:
                # the block's lines were indented before the wrap, its pieces not: after a blank line, a piece
                # again, the block goes on
                self._new_block = False
            elif self._new_block or (self._numbered and c):
                self._block_lead, self._new_block, self._numbered, self._first_rows = 0, False, False, False
            elif c and self._block_lead:
                self._first_rows = True
            if fence:
                self._new_block, self._first_rows = True, False
            elif not c:
                self._new_block = True
            return seg
        body = seg.lstrip(" \t")
        if not body:
            rest = seg[self._block_lead:]
            if rest and (self._partial or self._json_buf):
                # not a blank line: the terminal's wrap of a line that ended in spaces (the kubelet cuts a
                # partial entry after a fixed count, on a space as often as mid-word), and those spaces are
                # the text's, between the words the joined entry puts back side by side
                return rest
            self._new_block = True
            return ""
        lead = len(seg) - len(body)
        if self._new_block:
            self._new_block = False
            # a right-aligned line number (cat -n, less -N, nl): its spaces are no indentation; the block's is
            # what the other lines show, the least (the wrap's pieces of the numbered lines, a carrier's, none)
            self._numbered = _NUMBERED.match(seg) is not None
            self._block_lead, self._block_char = 0 if self._numbered else lead, seg[:1]
        elif self._numbered and not _NUMBERED.match(seg):
            if self._block_lead == 0 and lead and starts_own_record(body):
                # the first line after the numbered one a record's, indented, with no number: the first line's was
                # its text's (a paste that began mid-line: "896] vLLM API server version ..."), the block's
                # indentation this line's
                self._numbered = False
                self._relead(lead)
            else:
                self._relead(lead if self._block_lead == 0 else min(lead, self._block_lead))
            self._block_char = seg[:1]
        elif (lead < self._block_lead and starts_own_record(body)
              and not (self._drawn_before == self._drawn_max >= _WRAP_MIN)):
            # a record's line indented less than the block's first: that one's own indentation was in it (a
            # traceback's frame); the block's is this (a carrier's line has none of its own: "50%" / " Completed
            # | 2/4 ..." is a wrap's piece, no compose line; nor is the line after one as wide as the widest,
            # which goes on with the text's own space: "... with the model's" / " ValueError: ...")
            self._relead(lead)
            self._block_char = seg[:1]
        if body.startswith(("```", "~~~")):
            self._new_block = True
        # a line indented less than the block's first is none of its indented lines: a wrap's piece that begins
        # with the text's own spaces (the block's lines were indented before the terminal wrapped them, or
        # their spaces were a right-aligned line number's, a carrier's); so is one indented with the other kind
        # of space (a piece's space in a block indented with tabs)
        return seg[self._block_lead:] if lead >= self._block_lead and seg[:1] == self._block_char else seg

    # ------------------------------------------------------------------ stage B: order
    def _ordered(self, text: str, width: int, carried: str | None, ts: str | None) -> None:
        """``carried``: the whole line as the carrier printed it ("" when put together from several,
        None when the line had no carrier)."""
        self._last_text = text
        order = self._order
        if order == "in" or (order is None and ts is None and not self._held):
            self._carried(text, width, carried)
            return
        if ts is None:                              # a line of the entry above (or before any stamp)
            if self._held:
                self._held[-1].append((text, width, carried))
                self._check_hold()
            else:
                self._carried(text, width, carried)
            return
        key = _ts_key(ts)
        if order is None and self._last_ts is not None:
            if key > self._last_ts:
                self._order = "in"
                self._release()
                self._carried(text, width, carried)
                return
            if key < self._last_ts:
                self._desc += 1
                if self._desc >= 2:
                    self._order = "newest"
                    self.newest_first = True
        self._last_ts = key
        if len(self._held) >= _HOLD_MAX:
            self.dropped += 1
            return
        self._held.append([(text, width, carried)])
        self._check_hold()

    def _check_hold(self) -> None:
        if self._order is None and (len(self._held) > _HOLD or sum(map(len, self._held)) > 4 * _HOLD):
            self._decide()
            if self._order == "in":
                self._release()

    def _decide(self) -> None:
        """The order of held entries whose stamps never went forward: back in time once is enough;
        equal stamps (a console's whole seconds) leave it to the text: a traceback lists its frames
        after "Traceback (most recent call last):", and vLLM's banner comes first."""
        if self._desc:
            self._order, self.newest_first = "newest", True
            return
        # an entry: its wrap pieces too, put together as a terminal cut them and as an editor broke them
        lines = ["".join(text for text, _, _ in entry).lower() + ("\n" + " ".join(text for text, _, _ in entry).lower()
                                                                  if len(entry) > 1 else "")
                 for entry in self._held]
        natural = backwards = 0
        stamps = [m.group(1) for m in map(_VLLM_TIME.search, lines) if m]   # vLLM's own header times
        for a, b in zip(stamps, stamps[1:], strict=False):
            natural += b > a
            backwards += b < a
        for i, text in enumerate(lines):
            pair = text + (lines[i + 1] if i + 1 < len(lines) else "")    # a line the terminal wrapped
            # the header starts on this line (whole, or wrapped onto the next): counted once, here
            if 0 <= pair.find("traceback (most recent call last)") < len(text):
                after = any('file "' in ln for ln in lines[i + 1:i + 4])
                before = any('file "' in ln for ln in lines[max(0, i - 3):i])
                natural += after and not before
                backwards += before and not after
            elif "server version" in pair and ("vllm api server version" in pair or "vllm server version" in pair):
                if i < len(lines) // 2:
                    natural += 1
                else:
                    backwards += 1
        if backwards > natural:
            self._order, self.newest_first = "newest", True
        else:
            self._order = "in"

    def _release(self) -> None:
        held, self._held = self._held, []
        for entry in held:
            for text, width, carried in entry:
                self._carried(text, width, carried)

    # ------------------------------------------------------------------ stage C: records, wrapped lines
    def _carried(self, text: str, width: int, carried: str | None) -> None:
        low = folded(text)
        if len(text) > 400 and carried != "":
            # (one line as printed, not a CRI file's partial lines put together: how long those are says nothing
            # of how the paste was wrapped, and a wrap of the last goes on with them)
            lines = [text]
            if len(text) > _WRAP_MAX and not self._live and "\\n" in text and _breaks_written(text):
                lines = [ln for ln in text.split("\\n") if ln.strip()]   # a string's repr: its breaks written out
            pieces = [p for ln in lines for p in (self._pasted(ln) if len(ln) > 400 and _SPLIT.search(ln, 1)
                                                  else [ln])]
            if len(pieces) > 1:
                self._flush_pending()
                self._note_width(_WRAP_MAX + 1, "")
                for piece in pieces:
                    # (as a line is read: typed in lower case, its level's case given back too)
                    self._out.append(self._record(_framed(piece))._replace(pasted=True))
                return
        self._wrap(text, width, carried, low)

    def _record(self, raw: str) -> Record:
        """The record of a (whole) line; typed in lower case, vLLM's case given back to it. Spaces at the
        end of a line of no log header (the shell's ``Killed``) are a terminal's padding or an editor's:
        they told how the paste was wrapped, and are read by then."""
        if not folded(raw) or not raw:
            text, level, rank, proc = strip_header(raw)
        else:
            text, level, rank, proc = strip_header(self._recase.level(raw))
            text = self._recase.phrases(text)
        end = text[-1:]
        if (end == " " or end == "\t") and level == Level.RAW:
            text = text.rstrip(" \t")
        return Record(text, level, rank, proc)

    @staticmethod
    def _pasted(seg: str) -> list[str]:
        """A log pasted with its line breaks lost, cut back into records (each process tag or log
        header kept with the message that follows it)."""
        pieces: list[str] = []
        carry = ""
        for piece in _SPLIT.split(seg):
            if not piece:
                continue
            if len(carry) < 256 and not strip_header(carry + piece)[0].strip():
                carry += piece + " "
                continue
            pieces.append(carry + piece)
            carry = ""
        if carry:
            pieces.append(carry)
        return pieces

    def _note_width(self, width: int, text: str, word: bool = False) -> None:
        """``word``: the line is one word alone (no space in it): an editor leaves a word longer than its
        width whole on a line of its own, so such a line says nothing of the width, nor rules a wrap out."""
        if word:
            return
        if width - self._lead_off > _WRAP_MAX:    # (a quote's markers, a block's indentation: none of the wrap's)
            if self._para_from is None:
                self._para_from = (self._max_width, self._at_max, self._at_max_text, self._max_lead, self._long_seen)
            self._long_seen = True
            return
        if width > self._max_width:
            if self._para_from is None:
                self._para_from = (self._max_width, self._at_max, self._at_max_text, self._max_lead, self._long_seen)
            self._max_width, self._at_max, self._at_max_text = width, 1, text
            self._max_lead = self._lead_off
            self._recount()
        elif width == self._max_width and text != self._at_max_text:
            self._max_lead = min(self._max_lead, self._lead_off)
            self._at_max += 1
            self._at_max_text = text
            if self._at_max == 2:
                self._recount()

    def _recount(self) -> None:
        """The breaks seen so far judged again against the widest line (one wider than those before
        makes a line that looked as wide as the widest one that ended short)."""
        self._hard_seen = self._soft_seen = self._spaced_cuts = self._dropped_seen = 0
        self._cuts_seen.clear()
        for brk in self._breaks:
            self._judge(*brk)

    def _two_words(self, last: str, first: str) -> bool:
        """The end of ``last`` and the start of ``first`` are two words of vLLM's messages (the rules' own
        phrases) and together none: the space between them was there."""
        words = self._recase.words     # (vLLM's messages' words, as printed and in lower case)
        a = _WORD.findall(last)
        b = _WORD.findall(first)
        if not a or not b:
            return False
        a_, b_ = a[-1].lower(), b[0].lower()    # (a letter alone is no word: "1.10x", "x86")
        # together, a word only as vLLM prints it ("APIServer": "API server" is two)
        return len(a_) > 1 and len(b_) > 1 and a_ in words and b_ in words and a[-1] + b[0] not in words

    def _glued_word(self, last: str, first: str) -> bool:
        """The end of ``last`` and the start of ``first`` together are a word of vLLM's messages, and at
        least one of them alone is none: a word cut in two."""
        words = self._recase.words     # (vLLM's messages' words, as printed and in lower case)
        a = _WORD.findall(last)
        b = _WORD.findall(first)
        if not a or not b:
            return False
        return (a[-1] + b[0]).lower() in words and not (a[-1].lower() in words and b[0].lower() in words)

    def _judge(self, pw: int, first: int, word: str, junction: int, spaced: bool) -> None:
        """What a line ``pw`` wide, then one that may go on with it (``first``: its first word's length,
        ``word``: the last word before; ``junction``: :data:`_HYPHEN` after a hyphen, :data:`_PUNCT` where
        a space was: after a comma, semicolon or colon right before a letter, or between two words that are
        none together; ``spaced``: a space at the break, the end of the one or the start of the other), say of
        how the log was wrapped."""
        w = self._max_width
        last = len(word)
        if pw == w >= _WRAP_MIN:
            if junction == _PUNCT and not spaced:
                # text puts a space after a comma (and between words): a terminal cuts there only where the
                # text had none
                self._soft_seen += 1
                self._dropped_seen += 1
            elif (not (junction == _HYPHEN or last + first > w - self._max_lead) and self._at_max >= 2
                    and word not in self._cuts_seen):
                # a terminal's cut (or an editor's line that filled the width); lines that begin alike (one
                # process's prefix and header) are broken alike, after the same word, and say it once
                self._cuts_seen.add(word)
                self._hard_seen += 1
                self._spaced_cuts += spaced      # ... a terminal's: an editor drops the space it breaks at
        elif pw < w < pw + 1 + first and not spaced:
            self._soft_seen += 1         # the next word would not have fit: an editor broke there

    def _judge_break(self, before: str, width: int, line: str) -> tuple[str, str, bool]:
        """Note the break between the line ``before`` (``width`` wide as printed) and ``line``, which may go
        on with it (see :meth:`_judge`): the words on each side, and whether a hyphen ends the one."""
        first = line.split(None, 1)[0] if line.strip() else ""
        last = before.rsplit(None, 1)[-1] if before.strip() else ""
        hyphen = _hyphen_break(last, first)
        # (a bracket after a colon is a repr's ``: {``; a quote there may be compact JSON's ``":"``; what is
        # dropped at a break matters only where the line before is as wide as the widest: no wider one that
        # comes later makes it so)
        junction = (_HYPHEN if hyphen else _PUNCT if last[-1:] in (",", ";", ":")
                    and (first[:1].isalpha() or first[:1] in "([{") else 0)
        if not junction and width == self._max_width and (
                (last[-1:].isalpha() and first[:1].isalpha() and self._two_words(last, first))
                or ((first[:1].isdigit() or last[-1:].isdigit()) and _header_gap(before, line))):
            junction = _PUNCT
        brk = (width, len(first), last, junction, line[:1] in (" ", "\t") or before[-1:] in (" ", "\t"))
        if len(self._breaks) < _BREAKS_KEPT:
            self._breaks.append(brk)
        self._judge(*brk)
        return first, last, hyphen

    def _mode(self) -> str | None:
        """How the log is known to be wrapped: ``hard`` (a terminal: cut mid-word at one width, every
        piece but a record's last that wide), ``soft`` (an editor: at words, a line ending before the
        width when the next word would not fit), None while not known (or not wrapped: a line wider
        than any wrap was seen)."""
        if self._long_seen or self._max_width < _SOFT_MIN:
            return None
        hard, soft = self._hard_seen, self._soft_seen
        # lines as wide as the widest that go on: a terminal's, unless as many ended short; a space at a cut
        # (or at the end of a line as wide as the widest) is a terminal's, as an editor drops the space it
        # breaks at; else, beside one that ended short, two full lines may be an editor's that filled them
        if self._at_max >= 2 and hard >= 2 * soft and (self._spaced_cuts or self._spaced_end or hard >= 2 + bool(soft)):
            return "hard"
        # a line exactly as wide as the widest goes on in an editor's wrap too (it filled the line),
        # but a terminal rarely leaves one short that goes on: as many short as full ones is an editor's,
        # and so are two short beside at most one full, or more short than full where a full one dropped
        # the space after a comma or between two words (a terminal keeps it)
        if soft >= 3 and soft >= hard or soft >= 2 and 3 * soft >= 2 * hard + 4 or self._dropped_seen and soft > hard:
            return "soft"
        return None

    def _confirmed(self) -> bool:
        """The log is known to be wrapped."""
        return self._mode() is not None

    def _wrap(self, raw: str, width: int, carried: str | None, low: bool) -> None:
        """Re-join wrapped lines. A line with no header, process tag or carrier of its own may continue
        the line before it, in one of two ways, each a reading of the log until it says which it is
        (:meth:`_mode`):

        - a terminal's wrap (``hard``): the line before is as wide as the log's widest, cut there
          mid-word: the two are glued;
        - an editor's or a mail client's (``soft``: ``fold -s``, textwrap, format=flowed): the line before
          ended at a word because this line's first word would not have fit on it, and the space there
          was dropped: the two are joined with a space, or glued where the editor broke inside a word
          (after a hyphen, or a word longer than the width cut at it: the line before exactly as wide,
          the two halves together longer than the width). A word longer than the width left whole
          stands on a line of its own, wider than the width (:meth:`_note_width`).

        While the mode is not known, each line comes out as it is and each reading's record again as it
        grows (the likelier first); once known, a record comes out once, whole. The joined text is read
        as one line (its log header, cut by the wrap, is whole again)."""
        if self._long_seen:                  # not wrapped (a line wider than any wrap): each line a record
            if self._pending is not None:
                self._flush_pending()
            self._out.append(self._record(raw))
            return
        text, level, rank, proc = strip_header(self._recase.level(raw) if low and raw else raw)
        if (level == Level.RAW and raw[:1].isdigit() and len(text) < len(raw)
                and _LEVEL_ENDS.search(self._prev_raw[-12:])):
            text = raw      # a log header whose level the wrap left on the line before: the rest of that line
        if carried is None or 0 < len(carried) <= width:    # (a line a carrier's joining put together: its pieces were;
            # one no longer than drawn is a line, its block's indentation off)
            self._note_width(width, text, _one_word(carried or raw))
            if width == self._max_width >= _WRAP_MIN and self._at_max >= 2 and raw[-1:] in (" ", "\t"):
                self._spaced_end = True     # a terminal cut this line after a space (an editor drops it)
        maybe = not self._long_seen
        w = self._max_width
        out = self._out
        pending = self._pending
        hard: _Chain | None = None           # the record of each reading this line goes on
        soft: _Chain | None = None
        stripped = text.lstrip()
        if (maybe and stripped and self._prev_width and level == Level.RAW and proc is None and rank is None
                and carried is None and not _begins_record(stripped, low)
                # a log header begins a record of its own (its file and line cut off onto the next line),
                # unless it goes on with the process tag of vLLM's that the line before ended in; so does a
                # carrier's prefix the wrap cut short
                and not (stripped[:1] in "DIWECdiwec" and _HEADER_START.match(stripped)
                         and not _TAG_END.search(self._prev_raw[-120:]))
                and not (_may_be_prefix(stripped) and _CUT_PREFIX.match(stripped))):
            # maybe the rest of the line before: how it would have been cut there, and what that says
            pw = self._prev_width
            settled = self._hard_seen >= 32 and self._hard_seen >= 8 * self._soft_seen and self._mode() == "hard"
            if settled:
                # a terminal's wrap beyond doubt: only its cuts are read (the rest says nothing new)
                ph = pending[0] if pending is not None else None
                if ph is not None and pw == w and not _under_frame(text, ph[0]):
                    hard = self._joined(ph, raw, "", low, True)
            else:
                first, last, hyphen = self._judge_break(self._prev_raw, pw, raw)
            indented = raw[:1] in (" ", "\t")          # an editor drops the space it broke at
            if pending is not None and not settled:
                mode = self._mode()
                exact = pw == w >= _WRAP_MIN
                ph, ps = pending
                if ph is not None and exact and mode != "soft" and not _under_frame(text, ph[0]):
                    hard = self._joined(ph, raw, "", low, mode is not None)
                # (a word as long as the paste's own width: the lines' width less the indentation added after it)
                glue = _in_word(last, first, exact, w - self._max_lead, self._prev_raw.strip() == last)
                if ps is not None and not indented and mode != "hard":
                    # a log header alone on its line: its message was put on the next, after a space of
                    # any width (the message's indentation went with it: a traceback logged line by line)
                    # (a header ends in "]" or ":", a process tag in ")": anything else is no header alone)
                    tail = ps[0].rstrip()[-1:]
                    head = (strip_header(self._recase.level(ps[0]) if ps[3] else ps[0])
                            if len(ps[0]) < 200 and (not tail or tail in "]):") else None)
                    bare = head is not None and not head[0].strip()
                    if ((bare or pw + _gap(self._prev_raw) + len(first) > w) and not _under_frame(text, ps[0])
                            # after a whole frame only the rest of its function's name, cut at the width
                            and (not _whole_frame(ps[0]) or glue and _NAME_REST.fullmatch(first))):
                        # (after a carrier's prefix or a process tag alone, the space dropped was theirs)
                        header = bare and head is not None and head[1] != Level.RAW
                        sep = "" if glue else " " + _SOURCE_INDENT * (header and self._source_next(stripped))
                        soft = self._joined(ps, raw, sep, low, mode is not None)
        if pending is not None:
            # a record neither reading goes on with ends here
            for chain, goes in zip(pending, (hard, soft), strict=True):
                if chain is not None and goes is None and not chain[2]:
                    out.append(self._record(chain[0]))
            if pending[1] is not None and soft is None:
                self._soft_before = pending[1][0]
        mode = self._mode()
        confirmed = mode is not None
        joined_hard, joined_soft = hard is not None, soft is not None
        if mode == "soft":
            hard = None
        elif mode == "hard":
            soft = None
        if maybe:                            # this line may be the head of a wrapped record
            if hard is None and mode != "soft" and width == w >= _WRAP_MIN:
                hard = (raw, raw, not confirmed, low, carried)
            if soft is None and mode != "hard":
                soft = (raw, raw, not confirmed, low, carried)
        if not confirmed or (hard is None and soft is None):
            out.append(self._record(raw))
        if not confirmed:                    # maybe a continuation, maybe a record of its own: both ways
            ways = [chain[0] for chain, joined in ((hard, joined_hard), (soft, joined_soft))
                    if chain is not None and joined]
            if self._reads_soft():
                ways.reverse()
            for way in _both_ways(ways):
                out.append(self._record(way)._replace(joined=True))
        self._pending = (hard, soft) if hard is not None or soft is not None else None
        self._prev_width = width
        self._prev_raw = raw

    def _source_next(self, message: str) -> bool:
        """An editor put a record's ``message`` on the line after its log header, and the record before
        was a traceback's frame: unless it is the traceback's exception line, the message is that frame's
        source line, and its indentation went with the space the editor dropped."""
        if message[:4].lower() == "file" and message[4:6] in ("", ' "'):
            return False    # the next frame's (its path wrapped onto the line after)
        return not _RAISED_ANY_CASE.match(message) and _whole_frame(self._soft_before)

    def _joined(self, chain: _Chain, raw: str, sep: str, low: bool, confirmed: bool) -> _Chain:
        """``chain``, a record so far, gone on in the line ``raw``: glued to it (``sep`` ""), or with the
        space (and indentation) an editor dropped."""
        text, head, done, plow, line = chain
        if line:                 # the carrier's prefix itself may be what the wrap cut
            line = (line + raw if not sep else line.rstrip() + sep + raw.lstrip())[:_JOIN_CAP]
            joined = strip_carriers(line).text
            joined = self._learnt_off(joined) or joined
        else:
            joined = (text + raw if not sep else text.rstrip() + sep + raw.lstrip())[:_JOIN_CAP]
            if line is None and text is head and _may_be_prefix(text):
                # the first line was a carrier's prefix the wrap cut short (narrower than the prefix): whole
                # again, it is one
                p = strip_carriers(joined)
                if p.carriers:
                    self.carriers[p.carriers[0]] += 1
                    return (p.text, head, done and not confirmed, plow and low, joined)
        return (joined, head, done and not confirmed, plow and low, line)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            ph, ps = self._pending
            self._pending = None
            for chain in (ph, ps):
                if chain is not None and not chain[2]:
                    self._out.append(self._record(chain[0]))
            if ps is not None:
                self._soft_before = ps[0]
