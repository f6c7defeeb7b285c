"""Metamorphic: a log keeps its verdict however it reached the guard or was pasted.

Every failure row's log of the catalogue (``tests/fakes/vllm_logs.py``, built from
``tests/fixtures/catalogue/*.tsv``) and every saved log of ``tests/fixtures/logs`` goes through the
ways people ship and paste logs, each a hypothesis strategy (:data:`TRANSFORMS`): the prefixes of the
carriers (journald's output modes, docker and compose, Kubernetes' CRI files and ``kubectl``, Ray,
cloud consoles and JSON log lines, rendered from those tools' documented formats, below, not from the
guard's code), a terminal's hard wrap at 60 to 160 columns (its copy padded to the width or not), an
editor's or a mail client's wrap at words at 40 to 300 (the standard library's textwrap: the space
dropped at each break, a word longer than the width cut or left whole, hyphenated words broken or not),
markdown quotes, indentation, lower case, a paste that starts late or stops early, a console that lists
newest first, a bug report around the log (the environment report, the command, ``nvidia-smi``, each in
its own code fence: ``tests/fixtures/report``), the medium it went through last (a page's character
references, a rich-text editor's markdown escapes, a forum's typographer, no-break and zero-width
spaces, CRLF line ends; or pasted without a fence into a markdown page and copied back from it, as
markdown-it renders it), and compositions of them. A failure keeps its kind and its numbers; a healthy
log stays healthy (or ``incomplete``, when the cut took its serving lines). A new way to paste is one
strategy here.
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
import re
import sys
import textwrap
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from supervisor.core.classifier import classify
from supervisor.core.diagnosis import PHASES
from supervisor.core.vllm_text import plain_chars

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import vllm_logs as cat  # noqa: E402

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
NOT_FAILURES = {"healthy", "incomplete", "no_vllm_output"}
CASES = cat.all_cases()
FAILURES = [c for c in CASES if c.kind not in NOT_FAILURES]
HEALTHY = [c for c in CASES if c.kind == "healthy"]
# colour as a terminal shows it (not at all), and the remnants of pastes that lost the ESC byte
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\^\[\[[0-9;?]*[A-Za-z]|\[\d{1,3}(?:;\d{1,3})*m")


def _fixtures() -> list[cat.Case]:
    """The saved logs of tests/fixtures/logs as cases (their expected.json is the verdict)."""
    expected = json.loads((LOGS / "expected.json").read_text())
    for sub in sorted(p for p in LOGS.iterdir() if p.is_dir() and (p / "expected.json").is_file()):
        expected.update({f"{sub.name}/{k}": v for k, v in json.loads((sub / "expected.json").read_text()).items()})
    out = []
    for rel, want in sorted(expected.items()):
        text = (LOGS / rel).read_bytes().decode("utf-8", "replace")
        lines = [_ANSI.sub("", ln) for ln in re.split(r"\r\n|\r|\n", text)]
        while lines and not lines[-1]:
            lines.pop()
        if want["kind"] in ("no_vllm_output",) or not lines:
            continue
        out.append(cat.Case(rel, rel, "", lines, want.get("exit_code"), want["kind"], want.get("phase"), "",
                            dict(want["numbers"]), 0))
    return out


FIXTURES = _fixtures()
#: saved logs that are pastes already (wrapped by a terminal, or with their line breaks lost): a carrier
#: ships whole lines, not a paste's pieces, and a terminal wraps lines, not a paste of them
PRE_WRAPPED = {c.name for c in FIXTURES if any(w in c.name for w in ("wrap", "single-line", "indented", "quote"))
               or c.name.startswith(("carriers/", "pastes/"))}   # (shipped already: a CRI file is not shipped in
#                                                                             a CRI file; a paste is not pasted again)
#: ... and pastes quoted or indented already (a quote of a quote is another paste)
PRE_QUOTED = {c.name for c in FIXTURES
              if any(w in c.name for w in ("indented", "quote")) or c.name.startswith("pastes/")}
FIXTURE_FAILURES = [c for c in FIXTURES if c.kind not in NOT_FAILURES]
FIXTURE_HEALTHY = [c for c in FIXTURES if c.kind == "healthy"]
#: ... and those of a start-up cut short before it served (by the log's end, or by a signal)
FIXTURE_CUT_SHORT = [c for c in FIXTURES if c.kind == "incomplete"]


# --------------------------------------------------------------------------- how each carrier prints a line
T0 = dt.datetime(2024, 8, 19, 18, 30, 11, 123456)


def _t(i: int) -> dt.datetime:
    return T0 + dt.timedelta(milliseconds=37 * i)


def _rfc3339nano(i: int) -> str:       # docker's and the kubelet's: UTC, nanoseconds
    return _t(i).strftime("%Y-%m-%dT%H:%M:%S.%f") + f"{i % 1000:03d}Z"


#: (name, render(message, line index)) -- the formats as each program documents them
CARRIER_LINES: dict[str, Callable[[str, int], str]] = {
    # journalctl(1), --output=: short (the default), short-precise, short-iso, short-iso-precise,
    # short-full, short-monotonic, short-unix; `journalctl -u vllm-guard` shows the unit's processes
    "journald-short": lambda m, i: f"{_t(i):%b %d %H:%M:%S} gpu-host vllm-guard[8707]: {m}",
    "journald-short-precise": lambda m, i: f"{_t(i):%b %d %H:%M:%S.%f} gpu-host vllm[8707]: {m}",
    "journald-short-iso": lambda m, i: f"{_t(i):%Y-%m-%dT%H:%M:%S}+0000 gpu-host vllm-guard[8707]: {m}",
    "journald-short-iso-precise": lambda m, i: f"{_t(i):%Y-%m-%dT%H:%M:%S.%f}+00:00 gpu-host python3[8707]: {m}",
    "journald-short-full": lambda m, i: f"{_t(i):%a %Y-%m-%d %H:%M:%S} UTC gpu-host vllm-guard[8707]: {m}",
    "journald-short-monotonic": lambda m, i: f"[{1234.567891 + 0.037 * i:12.6f}] gpu-host vllm-guard[8707]: {m}",
    "journald-short-unix": lambda m, i: f"{1724092211.123456 + 0.037 * i:.6f} gpu-host vllm-guard[8707]: {m}",
    # systemd-run --unit=vllm: a transient unit, read with journalctl -u vllm
    "systemd-run": lambda m, i: f"{_t(i):%b %d %H:%M:%S} gpu-host vllm[31337]: {m}",
    # a syslog file, or moreutils' `ts` (default format "%b %d %H:%M:%S")
    "ts": lambda m, i: f"{_t(i):%b %d %H:%M:%S} {m}",
    # docker logs --timestamps / kubectl logs --timestamps: RFC 3339 with nanoseconds, one space
    "docker-timestamps": lambda m, i: f"{_rfc3339nano(i)} {m}",
    # docker compose logs / up: "<service>-<n>" padded, " | " (compose v1: "<project>_<service>_<n>")
    "compose": lambda m, i: f"vllm-1  | {m}",
    "compose-v1": lambda m, i: f"vllm_openai_1  | {m}",
    "compose-timestamps": lambda m, i: f"vllm-1  | {_rfc3339nano(i)} {m}",
    # the kubelet's CRI container log file: time, stream, F (full line)
    "cri": lambda m, i: f"{_rfc3339nano(i)} {'stderr' if i % 3 else 'stdout'} F {m}",
    # kubectl logs --prefix [--timestamps]
    "kubectl-prefix": lambda m, i: f"[pod/vllm-7d9f8b6c5-x2x4z/vllm] {m}",
    "kubectl-prefix-timestamps": lambda m, i: f"[pod/vllm-7d9f8b6c5-x2x4z/vllm] {_rfc3339nano(i)} {m}",
    # Ray's log monitor: "(<task or actor> pid=N, ip=A)", bare "(pid=N)"
    "ray": lambda m, i: f"(RayWorkerWrapper pid=15645, ip=172.31.15.128) {m}",
    "ray-pid": lambda m, i: f"(pid=15645) {m}",
    # a wrapper that tags its child's lines
    "tag": lambda m, i: f"[vllm]: {m}",
    # gcloud logging read --format='value(timestamp,severity,textPayload)' (tab separated)
    "gcloud": lambda m, i: f"{_rfc3339nano(i)}\t{'ERROR' if i % 2 else 'INFO'}\t{m}",
    # a console that shows time, host and level per entry
    "console": lambda m, i: (f"{_t(i):%Y-%m-%d %H:%M:%S.%f}"[:-3]
                             + f" | gpu-worker-3 | {'ERROR' if i % 2 else 'INFO'} | {m}"),
    "console-zone": lambda m, i: f"{_t(i):%Y-%m-%d %H:%M:%S.%f}"[:-3] + f" CEST\t{m}",
    # a console's table copied with its level first ("SEVERITY TIMESTAMP SUMMARY"): the level padded to its
    # column, the columns two spaces apart; or tab separated
    "console-level-first": lambda m, i: (f"{'ERROR' if i % 2 else 'INFO':<8}" + f"{_t(i):%Y-%m-%d %H:%M:%S.%f}"[:-3]
                                         + f" UTC  {m}"),
    "console-level-first-tab": lambda m, i: f"{'ERROR' if i % 3 else 'DEFAULT'}\t{_rfc3339nano(i)}\t{m}",
    # docker's json-file log driver (one object per line, the line's newline kept in "log")
    "docker-json": lambda m, i: json.dumps({"log": m + "\n", "stream": "stderr", "time": _rfc3339nano(i)}),
    # journalctl -o json
    "journal-json": lambda m, i: json.dumps({"__REALTIME_TIMESTAMP": str(1724092211123456 + 37000 * i),
                                             "_HOSTNAME": "gpu-host", "SYSLOG_IDENTIFIER": "vllm-guard",
                                             "_PID": "8707", "PRIORITY": "6", "MESSAGE": m}),
    # Cloud Logging's LogEntry as JSON
    "cloud-logging-json": lambda m, i: json.dumps({"textPayload": m, "timestamp": _rfc3339nano(i),
                                                   "severity": "ERROR" if i % 2 else "INFO",
                                                   "resource": {"type": "k8s_container"}}),
    # a launcher that relays its child's lines through Python's logging ("%(asctime)s %(levelname)s %(message)s",
    # asctime's default format: milliseconds after a comma)
    "python-logging": lambda m, i: f"{_t(i):%Y-%m-%d %H:%M:%S},{_t(i).microsecond // 1000:03d} INFO {m}",
    # a journald-bound stream read raw: the syslog priority prefix
    "priority": lambda m, i: f"<{3 if i % 2 else 6}>{m}",
}
# --------------------------------------------------------------------------- carriers nobody listed
# Any other program that ships or shows a log puts a prefix of one shape on each line: grep -n (":" on a
# match, "-" around it), cat -n, less -N, srun --label, pdsh, stern, a job runner's tag, a viewer's clock.
# The fields such a prefix is made of, each rendered for line i; a prefix is one to three of them, each
# with a separator after it.
# (names: a host's, a pod's, a node's, a file's; words of such names joined as they are, cheap to draw)
_NAMES = st.builds(lambda words, joint, n: joint.join(words) + n,
                   st.lists(st.sampled_from(["gpu", "node", "vllm", "worker", "serve", "pod", "7d9f8b6c5", "x2x4z",
                                             "a100", "h100", "log", "prod", "us", "east1", "job"]),
                            min_size=1, max_size=3),
                   st.sampled_from(["-", "_", "."]), st.sampled_from(["", "0", "3", "12", ".log"]))
_FIELDS: dict[str, Callable[..., Callable[[int, str], str]]] = {
    "line number": lambda: lambda i, m: str(i + 1),
    "right-aligned line number": lambda: lambda i, m: f"{i + 1:6d}",
    "grep's line number": lambda: lambda i, m: f"{i + 1}{':' if 'ERROR' in m or 'Error' in m else '-'}",
    "clock": lambda: lambda i, m: f"{_t(i):%H:%M:%S}",
    "bracketed clock": lambda: lambda i, m: f"[{_t(i):%H:%M:%S}]",
    "rank": lambda: lambda i, m: str(i % 2),
}
_SEPARATORS = [": ", ":", " | ", "\t", " ", "  ", " > ", "] "]


@st.composite
def any_carrier(draw: st.DrawFn) -> Paste:
    """A prefix of a shape no list holds: names (a host, a pod, a file, constant for the paste), numbers
    that change from line to line, separators."""
    parts: list[Callable[[int, str], str]] = []
    shown: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.booleans()):
            name = draw(_NAMES, label="name")
            field: Callable[[int, str], str] = lambda i, m, name=name: name     # noqa: E731
            shown.append(name)
        else:
            kind = draw(st.sampled_from(sorted(_FIELDS)), label="field")
            field = _FIELDS[kind]()
            shown.append(f"<{kind}>")
        # (" | " after a number is compose's prefix for a service named by it: read as compose's)
        sep = draw(st.sampled_from([x for x in _SEPARATORS if x != " | " or shown[-1][:1] != "<"]), label="separator")
        parts.append(lambda i, m, field=field, sep=sep: field(i, m) + sep)
        shown.append(repr(sep))
    paste = Paste(f"carrier {''.join(shown)}", lambda lines: ["".join(f(i, m) for f in parts) + m
                                                             for i, m in enumerate(lines)], 2)
    paste.prefix = max(len("".join(f(i, "ERROR") for f in parts)) for i in (0, 9, 99, 999, 9999))
    return paste


#: carriers whose entries carry a time stamp (a console can list those newest first)
STAMPED = [n for n in CARRIER_LINES if n not in ("compose", "compose-v1", "kubectl-prefix", "ray", "ray-pid",
                                                 "tag", "priority")]


def _ray_repeated(m: str, i: int) -> str:
    """Ray's log deduplication marks a line it folded: "... [repeated 3x across cluster]"."""
    return f"(RayWorkerWrapper pid=15645, ip=172.31.15.128) {m}" + (" [repeated 3x across cluster]" if m and i % 4 == 1
                                                                     else "")


CARRIER_LINES["ray-repeated"] = _ray_repeated


def _cri_partial(lines: list[str]) -> list[str]:
    """The kubelet splits a long line into partial entries ("P") closed by a full one ("F")."""
    out = []
    for i, m in enumerate(lines):
        ts = _rfc3339nano(i)
        parts = [m[k:k + 50] for k in range(0, len(m), 50)] or [""]
        out += [f"{ts} stdout P {p}" for p in parts[:-1]] + [f"{ts} stdout F {parts[-1]}"]
    return out


# --------------------------------------------------------------------------- the transformations
class Paste:
    """A function over the log's lines, named for the failure message."""

    def __init__(self, name: str, fn: Callable[[list[str]], list[str]], order: float, drops: str = "",
                 width: int = 0) -> None:
        self.name, self.fn, self.order, self.drops = name, fn, order, drops
        self.width = width      # a wrap's
        self.prefix = 0         # a carrier's prefix, at its widest (of those drawn from a grammar)

    def __repr__(self) -> str:
        return self.name


def _csv_row(fields: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="").writerow(fields)
    return out.getvalue()


def _carrier(name: str) -> Paste:
    render = CARRIER_LINES[name]
    return Paste(f"carrier {name}", lambda lines: [render(m, i) for i, m in enumerate(lines)], 2)


def _wrap(width: int) -> Paste:
    def fn(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            out += [line[k:k + width] for k in range(0, len(line), width)] or [""]
        return out
    return Paste(f"hard wrap at {width}", fn, 4, width=width)


def _padded_wrap(width: int) -> Paste:
    """A terminal's copy that keeps the screen's cells: each row padded with spaces to the width (a legacy
    Windows console, a block selection)."""
    wrap = _wrap(width).fn
    return Paste(f"hard wrap at {width}, padded", lambda lines: [ln.ljust(width) for ln in wrap(lines)], 4,
                 width=width)


def _word_wrap(width: int, break_long_words: bool, break_on_hyphens: bool) -> Paste:
    """An editor's or a mail client's wrap (``fold -s``, vim's ``gq``, format=flowed): each line longer than
    the width broken at its last space that fits, the space dropped at the break (a word longer than the
    width cut at the width, or left whole on a line of its own, longer than the width; optionally broken
    after a hyphen). The standard library's textwrap is that wrapper; lines that fit are left as typed."""
    wrapper = textwrap.TextWrapper(width=width, break_long_words=break_long_words,
                                   break_on_hyphens=break_on_hyphens, expand_tabs=False, replace_whitespace=False)

    def fn(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            out += (wrapper.wrap(line) or [""]) if len(line) > width else [line]
        return out
    how = ("long words cut" if break_long_words else "long words whole") + (", at hyphens" if break_on_hyphens else "")
    return Paste(f"word wrap at {width} ({how})", fn, 4, width=width)


def _quote(marker: str) -> Paste:
    return Paste(f"quoted with {marker!r}", lambda lines: [marker + ln if ln else marker.rstrip() for ln in lines], 5)


def _indent(pad: str) -> Paste:
    return Paste(f"indented by {pad!r}", lambda lines: [pad + ln for ln in lines], 6)


def _indent_first(pad: str) -> Paste:
    """Indented before it was wrapped (a list item's paste an editor then wrapped, a terminal showing an
    indented file): the wrap's pieces of a line carry no indentation, those that begin with spaces the text's."""
    return Paste(f"indented by {pad!r}, then wrapped", lambda lines: [pad + ln for ln in lines], 3)


# --------------------------------------------------------------------------- what a medium does to the characters
# markdown-it-py is the CommonMark renderer (GitHub's and Discourse's dialects are CommonMark); its
# typographer is the one those forums enable: quotes curled, "--" and "..." replaced, (c) and +- made signs
_TYPOGRAPHER = MarkdownIt("zero", {"typographer": True}).enable(["replacements", "smartquotes"])
_RENDERER = MarkdownIt("commonmark", {"typographer": True, "breaks": True}).enable(["replacements", "smartquotes"])
_BLOCKS = {"p", "br", "li", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "hr", "ul", "ol", "div"}


class _PageText(HTMLParser):
    """The text a copy of a rendered page gives, as far as the characters go: the page's text, a line
    break per block (a browser's innerText, approximated: no layout, which a copy of a log's lines needs
    none of)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in _BLOCKS:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        self.out.append(data)


def _page_text(markup: str) -> list[str]:
    parser = _PageText()
    parser.feed(markup)
    parser.close()
    # (as a browser's innerText: a block's margins a blank line, never more than one)
    return re.sub(r"\n{3,}", "\n\n", "".join(parser.out)).strip("\n").split("\n")


def _typographer(line: str) -> str:
    return html.unescape(_TYPOGRAPHER.renderInline(line))


def _markdown_escaped(line: str) -> str:
    """A rich-text editor's markdown (Reddit's, turndown's): CommonMark's backslash escapes before the
    characters that would start emphasis (and the backslash itself)."""
    return re.sub(r"([\\_*])", r"\\\1", line)


MEDIA: dict[str, Callable[[str], str]] = {
    # a page's source copied, or a scraper that kept the character references
    "html-escaped": lambda ln: html.escape(ln, quote=True),
    "markdown-escaped": _markdown_escaped,
    "typographer": _typographer,
    # a rendered page's spaces: each one a no-break space, or a run kept by alternating them
    "no-break-spaces": lambda ln: ln.replace(" ", "\u00a0"),
    "no-break-runs": lambda ln: ln.replace("  ", " \u00a0"),
    # a renderer's break opportunities in long paths and names (<wbr>, copied as a zero-width space)
    "zero-width-breaks": lambda ln: re.sub(r"([/_.])(?=\w)", "\\1\u200b", ln),
    # a Windows editor's line ends, read by a tool that splits at LF
    "crlf": lambda ln: ln + "\r",
}


def _medium(name: str) -> Paste:
    fn = MEDIA[name]
    return Paste(f"through {name}", lambda lines: [fn(ln) for ln in lines], 8)


def _rendered(lines: list[str]) -> list[str]:
    """Pasted without a code fence into a page that renders markdown (line breaks kept, as GitHub's
    comments keep them), then copied from the page: markup taken as markdown and gone, typography."""
    return _page_text(_RENDERER.render("\n".join(lines)))


# --------------------------------------------------------------------------- what a bug report puts around a log
_REPORT = Path(__file__).resolve().parents[1] / "fixtures" / "report"
_FENCES = ["```", "```text", "```log", "```shell", "```console", "~~~"]


_COLLECT_ENV = (_REPORT / "collect-env.txt").read_text().splitlines()
_NVIDIA_SMI = (_REPORT / "nvidia-smi.txt").read_text().splitlines()


def _collect_env(version: str) -> list[str]:
    return [ln.replace("{version}", version) for ln in _COLLECT_ENV if version or "{version}" not in ln]


_SECTIONS: dict[str, Callable[[str], list[str]]] = {
    "environment": lambda v: ["### Your current environment", "", "<details>",
                              "<summary>The output of <code>python collect_env.py</code></summary>", "", "```text",
                              *_collect_env(v), "```", "", "</details>", ""],
    "command": lambda v: ["I'm running the server with:", "", "```bash",
                          "docker run --runtime nvidia --gpus all -v ~/.cache/huggingface:/root/.cache/huggingface "
                          "-p 8000:8000 --ipc=host vllm/vllm-openai:latest --model Qwen/Qwen2.5-7B-Instruct "
                          "--gpu-memory-utilization 0.9", "```", ""],
    "nvidia-smi": lambda v: ["nvidia-smi shows:", "", "```",
                             *_NVIDIA_SMI, "```", ""],
    "prose": lambda v: ["### \U0001f41b Describe the bug", "",
                        "The server crashes at start-up every time. I tried a smaller --max-model-len and "
                        "--enforce-eager; the same error. Full log below.", ""],
}
_CLOSING = ["", "### Before submitting a new issue...", "",
            "- [x] Make sure you already searched for relevant issues, and asked the chatbot living at the bottom "
            "right corner of the [documentation page](https://docs.vllm.ai/en/latest/)."]


def _report(case: cat.Case, sections: list[str], fence: str) -> Paste:
    version = case.version or (m.group(0) if (m := re.search(r"\d+\.\d+\.\d+", case.name)) else "")
    head = [ln for name in sections for ln in _SECTIONS[name](version)]
    close = "~~~" if fence == "~~~" else "```"
    return Paste(f"in a bug report ({', '.join(sections) or 'the log alone'}, {fence})",
                 lambda lines: [*head, fence, *lines, close, *_CLOSING], 7)


LOWER = Paste("lower case", lambda lines: [ln.lower() for ln in lines], 0)

_PY_FRAME = re.compile(r'  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def _ipython(lines: list[str], before_8: bool = False) -> list[str]:
    """An offline run in a notebook: each traceback Python printed (no log header: not a record of vLLM's
    logger) as IPython renders it (a rule, the exception's name before "Traceback (most recent call last)",
    each frame after a blank line, "File path:N, in name(args)" (IPython 8) or "path in name(args)" (before),
    its source line numbered behind an arrow)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i] != "Traceback (most recent call last):":
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        name = lines[end].split(":", 1)[0].rsplit(".", 1)[-1] if end < len(lines) else "Exception"
        out += ["-" * 75, f"{name:<42}Traceback (most recent call last)"]
        number = "1"
        for line in lines[i + 1:end]:
            m = _PY_FRAME.fullmatch(line)
            if m:
                number = m.group("line")
                at = (f"{m.group('path')} in" if before_8 else f"File {m.group('path')}:{number}, in")
                out += ["", f"{at} {m.group('name')}(self, *args, **kwargs)"]
            else:
                out.append(f"--> {number:>4} {line.strip()}")
        out.append("")
        i = end
    return out


# (after a cut of the head or the tail, which counts the lines Python printed)
IPYTHON = [Paste("IPython's tracebacks", _ipython, 1.2),
           Paste("IPython 7's tracebacks", lambda lines: _ipython(lines, before_8=True), 1.2)]
NEWEST_FIRST = Paste("newest first", lambda lines: lines[::-1], 3)


def _newest_first(name: str) -> list[Paste]:
    return [_carrier(name), NEWEST_FIRST]


QUOTES = ["> ", ">", "> > "]                  # a markdown quote, as people type it
INDENTS = ["    ", "  ", "\t", "        "]      # a code block, a list item's paste

TRANSFORMS: dict[str, st.SearchStrategy[list[Paste]]] = {
    "wrap": st.integers(min_value=60, max_value=160).map(lambda w: [_wrap(w)]),
    "padded-wrap": st.integers(min_value=60, max_value=160).map(lambda w: [_padded_wrap(w)]),
    "word-wrap": st.builds(_word_wrap, st.integers(min_value=40, max_value=300), st.booleans(),
                           st.booleans()).map(lambda p: [p]),
    "carrier": st.sampled_from(sorted(CARRIER_LINES)).map(lambda n: [_carrier(n)]),
    "any-carrier": any_carrier().map(lambda p: [p]),
    "cri-partial": st.just([Paste("CRI partial lines", _cri_partial, 2)]),
    "quote": st.sampled_from(QUOTES).map(lambda q: [_quote(q)]),
    "indent": st.sampled_from(INDENTS).map(lambda p: [_indent(p)]),
    "indent-first": st.sampled_from(INDENTS).map(lambda p: [_indent_first(p)]),
    "lower": st.just([LOWER]),
    "ipython": st.sampled_from(IPYTHON).map(lambda p: [p]),
    "newest-first": st.sampled_from(STAMPED).map(_newest_first),
    "medium": st.sampled_from(sorted(MEDIA)).map(lambda n: [_medium(n)]),
    "rendered": st.just([Paste("rendered and copied", _rendered, 8)]),
}


#: how much of a line vLLM's header and process tag take ("(EngineCore_DP0 pid=3120) ERROR 11-30 12:00:00 ")
_HEADER_ROOM = 50
#: the ways a paste is wrapped (once: by a terminal or by an editor)
_WRAPS = ("wrap", "padded-wrap", "word-wrap")
#: the transformations that take the case (where its failure starts, its version), beside :data:`TRANSFORMS`
EXTRAS = ["head", "tail", "report", "elide", "repr"]


def _cut_head(case: cat.Case, k: int) -> Paste:
    return Paste(f"head cut ({k} lines)", lambda lines: lines[k:], 1, "head")


def _cut_tail(case: cat.Case, k: int) -> Paste | None:
    first = next((i for i, ln in enumerate(case.lines) if case.evidence and case.evidence.lower() in ln.lower()), None)
    if first is None:
        return None
    keep = first + 2 + k
    return Paste(f"tail cut after line {keep}", lambda lines: lines[:keep], 1, "tail")


#: what people put where they left lines out of a paste
_ELISIONS = ["...", "[...]", "<snip>", "(truncated)", "… 120 lines omitted …", "# ... (many lines) ...", "", "....",
             "[ truncated ]", "<...>", "---"]
#: vLLM's words that it serves (its HTTP server up, its traffic): a paste that leaves them out says nothing of it
_SERVES = ("Application startup complete", "Starting vLLM API server", "Uvicorn running on", "Started server process",
           "Avg prompt throughput", ' HTTP/1.1"', "Route: ")


@st.composite
def _elide(draw: st.DrawFn, case: cat.Case) -> Paste | None:
    """A run of lines left out between the paste's first line and the failure's, a marker in their place (the
    middle of a long traceback, the start-up's lines between its banner and the crash): never the failure's
    line, nor one that says vLLM was serving. Left out in an editor, after the copy (a terminal's wrap comes
    after it here only because the pieces of a line are left out with it)."""
    first = next((i for i, ln in enumerate(case.lines) if case.evidence and case.evidence.lower() in ln.lower()), None)
    if first is None or first < 2:
        return None
    a = draw(st.integers(min_value=1, max_value=first - 1))
    b = draw(st.integers(min_value=a + 1, max_value=first))
    if any(w in ln for ln in case.lines[a:b] for w in _SERVES):
        return None
    mark = draw(st.sampled_from(_ELISIONS))
    gone = {ln.lower() for ln in case.lines[a:b]}

    def fn(lines: list[str]) -> list[str]:
        # in an editor, after the copy: the lines (behind their carrier's prefixes, in the order listed) that
        # hold those left out, the marker where the first was (typed, with no prefix; wrapped as the rest)
        out: list[str] = []
        for ln in lines:
            low = ln.lower()
            if any(g in low for g in gone):
                if not out or out[-1] != mark:
                    out.append(mark)
            else:
                out.append(ln)
        return out
    return Paste(f"lines {a}:{b} left out ({mark!r})", fn, 3.5, "middle")


def _repr(case: cat.Case) -> Paste:
    """The failure pasted as a string's repr (an exception's text, a JSON field copied raw): its lines, from
    where the failure starts, one line, each break written ``\\n``."""
    start = case.lines[case.start].lower()

    def fn(lines: list[str]) -> list[str]:
        i = next((k for k, ln in enumerate(lines) if ln.lower() == start), None)     # (after a cut, in lower case)
        return lines if i is None else [*lines[:i], "\\n".join(lines[i:])]
    return Paste("the failure as a repr", fn, 1.5)


#: the carriers whose lines are JSON objects
_JSON_CARRIED = {f"carrier {n}" for n in ("docker-json", "journal-json", "cloud-logging-json")}


def _apply(case: cat.Case, pastes: list[Paste]) -> list[str]:
    lines = list(case.lines)
    for p in sorted(pastes, key=lambda p: p.order):
        lines = p.fn(lines)
    return lines


@st.composite
def pastes(draw: st.DrawFn, case: cat.Case, names: tuple[str, ...] | None = None) -> list[Paste]:
    """One or more transformations (compositions are applied in the order a log travels: typed,
    cut, shipped, listed, wrapped by the terminal, quoted, indented)."""
    chosen = names or tuple(draw(st.lists(st.sampled_from(sorted(TRANSFORMS) + EXTRAS), min_size=1,
                                          max_size=4, unique=True)))
    out: list[Paste] = []
    carried = wrapped = indented = False
    medium = ""
    for name in chosen:
        if name == "head":
            out.append(_cut_head(case, draw(st.integers(min_value=0, max_value=max(0, case.start)))))
        elif name == "tail":
            cut = _cut_tail(case, draw(st.integers(min_value=0, max_value=3)))
            if cut is not None:
                out.append(cut)
        elif name == "repr":
            # (the catalogue's logs, where the failure's start is known: a saved log's is not, and its whole text,
            # a journal's prefixes and all, is no exception's; nor is a notebook's rendering of it)
            if case.start > 0 and "ipython" not in chosen:
                out.append(_repr(case))
        elif name == "elide":
            # (lines left out of the middle or the head cut: one, the lines' places are the log's; a repr's lines
            # are one)
            cut = draw(_elide(case)) if "head" not in chosen and "repr" not in chosen else None
            if cut is not None:
                out.append(cut)
        elif name == "report":
            sections = draw(st.lists(st.sampled_from(sorted(_SECTIONS)), max_size=4, unique=True))
            out.append(_report(case, sections, draw(st.sampled_from(_FENCES))))
        elif name in ("medium", "rendered"):     # the last thing a paste goes through: one page, chat or editor
            if not medium:
                medium = name
        elif case.name in PRE_WRAPPED and name in ("carrier", "any-carrier", "cri-partial", "newest-first", *_WRAPS):
            continue
        elif "ipython" in chosen and name in ("carrier", "any-carrier", "cri-partial", "newest-first", *_WRAPS):
            # a notebook's output is copied from the page, not shipped by a carrier; its tracebacks are read back
            # where their header and frames are whole lines (docs/failure-catalogue.md, "A notebook's traceback")
            continue
        elif case.name in PRE_QUOTED and name in ("quote", "indent", "indent-first"):
            continue
        elif name == "cri-partial" and ("indent-first" in chosen or "word-wrap" in chosen):
            # a CRI file's partial entries under an editor's wrap, or indented before a wrap: a kubelet's cut that
            # fell on a space the editor then dropped leaves two words glued or one split, which only the rules'
            # vocabulary tells apart. The kubelet cuts at 16 KiB, these tests every 50 characters: in a real
            # file one such break in 16 KiB, here one in 50 (the hard wraps of partial entries stay drawn)
            continue
        elif name == "cri-partial" and "padded-wrap" in chosen:
            # a padded copy of a CRI file's partial entries: the kubelet cuts an entry after a count of bytes, in
            # a run of spaces as often as not, and those spaces and a terminal's padding are the same characters
            continue
        elif name in ("carrier", "any-carrier", "cri-partial", "newest-first"):
            if not carried:
                out += draw(TRANSFORMS[name])
                carried = True
        elif name in _WRAPS:       # a paste is wrapped once: by a terminal or by an editor
            if not wrapped:
                out += draw(TRANSFORMS[name])
                wrapped = True
        elif name in ("indent", "indent-first"):
            # indented once: before the wrap or after it (a block indented twice, its lines after the wrap and
            # again before it, shows a first line's indentation that no other line has, read as the block's)
            if not indented:
                out += draw(TRANSFORMS[name])
                indented = True
        else:
            out += draw(TRANSFORMS[name])
    learnt = max((p.prefix for p in out), default=0)
    if learnt and any(p.width and p.width < learnt + _HEADER_ROOM for p in out):
        # a prefix nobody listed is learnt from the lines that show vLLM's header behind it: a wrap narrower
        # than the two cuts both (a listed carrier's prefix is read whole again from its known shape)
        out = [p for p in out if not p.width]
    json_lines = any(p.name in _JSON_CARRIED for p in out)
    if medium == "medium" or (medium and not wrapped and case.name not in PRE_WRAPPED and "cri-partial" not in chosen
                              and not json_lines):
        # (a renderer takes characters out of the lines, and how a paste was wrapped is read from their widths;
        # it drops the spaces a line ends in, and the kubelet cuts a partial entry in a run of spaces as often
        # as not; it takes the backslash off a JSON line's escaped quote, and the message's end is gone with it)
        out += draw(TRANSFORMS[medium])
    return out


def _same(got, want: dict, pastes: list[Paste], lines: list[str]) -> None:
    lowered = any(p is LOWER for p in pastes)
    text = "\n".join(lines)
    for key, value in want.items():
        if any(p.drops for p in pastes) and not re.search(rf"(?<![\d.]){re.escape(str(value))}(?![\d])", text):
            continue     # the cut took the line that stated it (the engine's config line above the failure)
        have = got.numbers.get(key)
        if lowered and isinstance(value, str) and isinstance(have, str):
            have, value = have.lower(), value.lower()
        assert have == value, f"numbers[{key!r}] = {have!r}, want {value!r} (evidence {got.evidence!r})"


def _check_failure(case: cat.Case, ps: list[Paste]) -> None:
    lines = _apply(case, ps)
    got = classify(lines, case.exit_code)
    where = f"{case.name} {ps}: {got.kind} ({got.phase}) from {got.evidence!r}"
    cut = any(p.drops for p in ps)
    if cut and got.phase == "unknown" and case.kind.startswith("oom_") and got.kind.value.startswith("oom_"):
        return   # the cut took every line that placed the OOM (its frames, the milestones): its phase is unknown
    if (any(p.drops == "middle" for p in ps) and case.kind.startswith("oom_") and got.kind.value.startswith("oom_")
            and PHASES.index(got.phase) <= PHASES.index(case.phase or "serving")):
        return   # the lines left out placed it (its frames, the later milestones): an earlier milestone does
    assert got.kind.value == case.kind, where
    if not any("\\n" in ln for ln in case.lines):     # the evidence is one record: no break written out in it
        assert "\\n" not in got.evidence, where
    if case.phase is not None and not cut:
        assert got.phase == case.phase, where
    # (whether a cut took the line that stated a number is read in the log as cut, not in what a carrier, a
    # report or a medium put around or into it: a line number is no number of the log's)
    _same(got, case.numbers, ps, _apply(case, [p for p in ps if p.drops]))


def _check_healthy(case: cat.Case, ps: list[Paste]) -> None:
    got = classify(_apply(case, ps), case.exit_code)
    # a paste never makes a start-up that stopped short serve
    want = ("healthy", "incomplete") if case.kind == "healthy" else ("incomplete",)
    assert got.kind.value in want, f"{case.name} {ps}: {got.kind} from {got.evidence!r}"


# the failing case and its pastes are in the message; shrinking a draw per log of hundreds is slow
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
#: a draw per log of hundreds is big and slow by design
BIG = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]


# --------------------------------------------------------------------------- every row, each transformation
#: the catalogue's failures in parts: one example draws each case's paste, and a thousand cases' draws outgrow what
#: one example may draw (hypothesis then drops it, overrun, and tries another: minutes spent, nothing checked)
PARTS = 4


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("name", [n for n in sorted(TRANSFORMS) if n != "any-carrier"] + EXTRAS)
@settings(max_examples=3, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_every_catalogue_failure_keeps_its_kind_and_numbers_under_each_paste(name: str, part: int,
                                                                             data: st.DataObject) -> None:
    for case in FAILURES[part::PARTS]:
        _check_failure(case, data.draw(pastes(case, (name,)), label=case.name))


@pytest.mark.parametrize("name", sorted(TRANSFORMS) + ["head", "report"])
@settings(max_examples=3, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_every_healthy_log_stays_healthy_under_each_paste(name: str, data: st.DataObject) -> None:
    for case in HEALTHY + FIXTURE_HEALTHY + FIXTURE_CUT_SHORT:
        _check_healthy(case, data.draw(pastes(case, (name,)), label=case.name))


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@settings(max_examples=3, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_every_saved_failure_log_keeps_its_kind_and_numbers_under_each_paste(name: str, data: st.DataObject) -> None:
    for case in FIXTURE_FAILURES:
        _check_failure(case, data.draw(pastes(case, (name,)), label=case.name))


# --------------------------------------------------------------------------- compositions
@settings(max_examples=400, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_compositions_of_pastes_keep_a_failures_kind_and_numbers(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(FAILURES + FIXTURE_FAILURES), label="case")
    _check_failure(case, data.draw(pastes(case), label="pastes"))


@settings(max_examples=200, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_compositions_of_pastes_keep_a_healthy_log_healthy(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(HEALTHY + FIXTURE_HEALTHY + FIXTURE_CUT_SHORT), label="case")
    ps = [p for p in data.draw(pastes(case), label="pastes") if p.drops != "tail"]
    _check_healthy(case, ps)


# --------------------------------------------------------------------------- wrapped at words, composed
#: what else a paste wrapped at words went through (any of them, in the order a log travels)
_WITH_WORD_WRAP = st.lists(st.sampled_from([n for n in sorted(TRANSFORMS) + EXTRAS if n not in
                                            (*_WRAPS, "cri-partial")]), max_size=3, unique=True)


@settings(max_examples=200, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_compositions_with_a_paste_wrapped_at_words_keep_a_failures_kind_and_numbers(data: st.DataObject) -> None:
    # every composition holds an editor's wrap: behind a carrier's prefix (cut short by a narrow wrap, or its
    # JSON line broken at words), quoted, indented, lower case, cut, newest first
    case = data.draw(st.sampled_from(FAILURES + FIXTURE_FAILURES), label="case")
    names = ("word-wrap", *data.draw(_WITH_WORD_WRAP, label="with"))
    _check_failure(case, data.draw(pastes(case, names), label="pastes"))


@settings(max_examples=100, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_compositions_with_a_paste_wrapped_at_words_keep_a_healthy_log_healthy(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(HEALTHY + FIXTURE_HEALTHY + FIXTURE_CUT_SHORT), label="case")
    names = ("word-wrap", *data.draw(_WITH_WORD_WRAP, label="with"))
    _check_healthy(case, [p for p in data.draw(pastes(case, names), label="pastes") if p.drops != "tail"])


@pytest.mark.parametrize("carrier", sorted(CARRIER_LINES))
@settings(max_examples=2, deadline=None, suppress_health_check=BIG,
          phases=NO_SHRINK)
@given(data=st.data())
def test_every_carrier_with_a_paste_wrapped_at_words_keeps_the_messages(carrier: str, data: st.DataObject) -> None:
    # a prefix wider than a narrow wrap is cut (at its spaces, or inside it), and the time stamp that orders
    # a console's entries is on a line of its own: each carrier, a share of the catalogue's messages
    k = sorted(CARRIER_LINES).index(carrier)
    ww = data.draw(TRANSFORMS["word-wrap"], label="word wrap")
    for cases in list(_BY_ROW.values())[k % 8::8]:
        _check_failure(cases[k % len(cases)], [_carrier(carrier), *ww])


@settings(max_examples=12, deadline=None, suppress_health_check=BIG, phases=NO_SHRINK)
@given(carrier=any_carrier())
def test_a_carrier_nobody_listed_is_learnt_from_the_log_under_every_catalogue_failure(carrier: Paste) -> None:
    # one prefix of a shape no list holds, over every row (a draw per row, as above, is slow to make)
    for case in FAILURES:
        _check_failure(case, [carrier])


@pytest.mark.parametrize("width", [40, 300])
def test_every_catalogue_message_wrapped_at_words_at_the_narrowest_and_widest_width_keeps_its_kind_and_numbers(
        width: int) -> None:
    """The class's edges, each way textwrap has (a word longer than the width cut or left whole on a line of its
    own, wider than the width; hyphenated words broken or not): at 40 a log header and a traceback's path take
    lines of their own, at 300 only a few lines are broken at all (little to tell an editor's wrap by)."""
    for cases in _BY_ROW.values():
        for long_words in (False, True):
            for hyphens in (False, True):
                _check_failure(cases[0], [_word_wrap(width, long_words, hyphens)])


def _dash_widths(lines: list[str]) -> list[int]:
    """The widths (40-240) at which textwrap, breaking at hyphens, ends a line after a flag's dashes
    (``'--`` / ``nnodes'``) in one of ``lines``, that line as wide as the width (where a break says the most
    of the wrap: as wide as the widest)."""
    dashed = [line for line in lines if "--" in line]
    out = []
    for width in range(40, 241):
        wrapper = textwrap.TextWrapper(width=width, break_on_hyphens=True, expand_tabs=False,
                                       replace_whitespace=False)
        if any(len(p) == width and p.endswith("--") for line in dashed if len(line) > width
               for p in wrapper.wrap(line)[:-1]):
            out.append(width)
    return out


_DASHED = [c for c in FIXTURES + FAILURES if c.kind not in NOT_FAILURES and any("--" in line for line in c.lines)]


@pytest.mark.parametrize("case", _DASHED, ids=lambda c: c.name)
def test_an_editors_break_after_a_flags_dashes_is_no_terminals_cut(case: cat.Case) -> None:
    """textwrap (and a browser) breaks after a dash of two hyphens as after a hyphenated word's: the break
    dropped no space and says nothing of a terminal (found: two such lines as wide as the widest, behind
    a journal's JSON fields of one width, read as a terminal's cuts, and the space after ``World size (8)``
    lost). Every failure that shows a flag, at widths where the wrap breaks after its dashes a line as wide
    as the widest, plain and as a journal's JSON lines printed newest first."""
    for carried in ([], [_carrier("journal-json"), NEWEST_FIRST]):
        widths = _dash_widths(_apply(case, carried))
        for width in sorted(set(widths[:1] + widths[-1:])):     # (the narrowest and the widest)
            _check_failure(case, [*carried, _word_wrap(width, True, True)])


def test_a_newest_first_console_of_one_second_is_put_back_in_order_at_every_wrap_width() -> None:
    # every entry stamped the same second: only the text says the order (a traceback's header comes before
    # its frames); the header's line wrapped onto the next or whole, it is one vote (hypothesis found the
    # whole-line header at a line's end was never counted, and the record came out cut)
    case = next(c for c in _fixtures() if c.name == "current/0.12.0-issue-paste-engine-sigkill.log")
    for width in range(60, 161):
        _check_failure(case, [_wrap(width), *_newest_first("journald-short-iso")])


def test_a_wrapped_json_line_is_whole_only_when_it_parses() -> None:
    # a wrap piece that ends with a brace of vLLM's own text ("{'GPU': 1.0}") is no end of the JSON object
    case = next(c for c in FAILURES if c.name.startswith("pg_waiting@0.7.2"))
    for width in range(60, 161):
        _check_failure(case, [_wrap(width), _carrier("cloud-logging-json")])


def test_a_json_line_that_never_closes_is_given_up_and_what_follows_is_read() -> None:
    lines = ['{"textPayload": "INFO 11-30 12:00:00 x.py:1] no end', *[f"junk {i} " * 10 for i in range(900)],
             "ERROR 11-30 12:00:01 [core.py:1] ValueError: To serve at least one request with the models's max "
             "seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache "
             "memory (4.00 GiB). Based on the available memory, the estimated maximum model length is 32768."]
    got = classify(lines, 1)
    assert got.kind.value == "kv_cache_insufficient" and got.numbers.get("fit_max_model_len") == 32768, got


# --------------------------------------------------------------------------- every carrier x every message
#: the catalogue's failure logs by message (row): each row has a log per vLLM version that prints it
_BY_ROW: dict[str, list[cat.Case]] = {}
for _case in FAILURES:
    _BY_ROW.setdefault(_case.row, []).append(_case)


@pytest.mark.parametrize("carrier", sorted(CARRIER_LINES))
def test_every_carrier_with_every_catalogue_message_keeps_its_kind_phase_and_numbers(carrier: str) -> None:
    """Not sampled: each carrier ships a log of every failure message of the catalogue (the version's log
    taken in turn, so the carriers between them go through the versions), and every healthy log."""
    k = sorted(CARRIER_LINES).index(carrier)
    for cases in _BY_ROW.values():
        _check_failure(cases[k % len(cases)], [_carrier(carrier)])
    for case in HEALTHY:
        _check_healthy(case, [_carrier(carrier)])


# --------------------------------------------------------------------------- a wrap piece of only spaces
#: how a paste's lines may be set off: as they are, indented (a code block, a list item's), quoted
_SET_OFF: list[Callable[[], list[Paste]]] = [lambda: [], *[lambda p=p: [_indent(p)] for p in INDENTS],
                                            *[lambda q=q: [_quote(q)] for q in QUOTES]]
_CRI_PARTIAL = Paste("CRI partial lines", _cri_partial, 2)


def test_a_wrapped_cri_partial_line_keeps_its_words_apart_at_every_width_and_indentation() -> None:
    # the kubelet cut "... world_size (4) " after its space; at 89 columns the terminal left that space on
    # a line of its own, which was read as a blank line: "(4)is less than" lost the GPU count (hypothesis)
    case = next(c for c in FAILURES if c.name.startswith("tp_gt_local_gpus_mp@0.5.3.post1b@0.5.3.post1"))
    for width in range(60, 161):
        for set_off in _SET_OFF:
            _check_failure(case, [_CRI_PARTIAL, _wrap(width), *set_off()])


def test_a_wrap_piece_of_only_spaces_is_the_text_of_the_partial_line_it_continues() -> None:
    """Every message of the catalogue and every saved failure log, shipped as CRI partial lines and wrapped
    at the width that leaves a partial line's last space on a line of its own (as it is, indented or quoted,
    in turn): the space is the text's, not a blank line."""
    tried = 0
    cases = [cases[0] for cases in _BY_ROW.values()] + [c for c in FIXTURE_FAILURES if c.name not in PRE_WRAPPED]
    for k, case in enumerate(cases):
        shipped = _apply(case, [_CRI_PARTIAL])
        # a partial line "<stamp> stdout P ...word " as wide as the terminal and one more column
        widths = sorted({len(ln) - 1 for ln in shipped if ln.endswith(" ") and " stdout P " in ln}
                        & set(range(60, 161)))
        if widths:
            tried += 1
            _check_failure(case, [_CRI_PARTIAL, _wrap(widths[0]), *_SET_OFF[k % len(_SET_OFF)]()])
    assert tried >= 100, tried      # the catalogue's messages give that many partial lines ending in a space


def test_the_shells_note_is_its_own_line_after_one_exactly_as_wide_as_the_wrap() -> None:
    # bash's job report ("Killed", "Segmentation fault (core dumped)" ...) after a tqdm line that filled the
    # terminal's width exactly: in a hard-wrapped paste it could be that line's wrap, but it never is one
    from supervisor.core.vllm_text import SHELL_NOTES, Normalizer
    head = ["INFO 08-01 12:00:00 [gpu_model_runner.py:1] Starting to load model Qwen/Qwen2.5-72B-Instruct "
            "with a name long enough to be wrapped here"]
    for width in range(60, 161):
        bar = ("Loading safetensors checkpoint shards:  35% Completed | 13/37 [01:02<01:51,  4.81s/it]"
               + " " * 80)[:width]
        for note in sorted(SHELL_NOTES):
            lines = [*_wrap(width).fn(head), bar, note]
            n = Normalizer()
            texts = [r.text for line in lines for r in n.feed(line)] + [r.text for r in n.flush()]
            assert note in texts, (width, note, texts[-3:])
    case = next(c for c in FIXTURE_FAILURES if "host-oom-killed" in c.name)
    for width in range(60, 161):
        _check_failure(case, [_wrap(width)])


# --------------------------------------------------------------------------- the medium, undone
#: every line of every catalogue log and saved log (vLLM's own text, tqdm's bars, the shell's notes, ...)
# (what vLLM prints: not the pastes written blind, whose prose a person typed)
_ALL_LINES = sorted({ln for case in CASES + FIXTURES if not case.name.startswith("pastes/") for ln in case.lines})


def _typographer_loses(line: str) -> str:
    """What markdown-it's typographer cannot give back (its ``replacements`` rule, as documented): a run of
    dots is one ellipsis, "!!!!" is "!!!", "?????" is "???", ",," is ",", and "--" and "---" are dashes
    (read back as one hyphen, or as a flag's "--" before a letter)."""
    line = re.sub(r"\.{2,}(?!/)", "...", line)
    line = re.sub(r"([?!]){4,}", r"\1\1\1", line)
    line = re.sub(r",{2,}", ",", line)
    return re.sub(r"(?<![-\w])-{2,3}(?=\s|$)|(?<=\s)-{2,3}(?![-\w])", "-", line)


def test_nothing_vllm_prints_is_changed_by_undoing_a_medium() -> None:
    # the characters a medium puts in are none that vLLM, its libraries or the shell print: undoing them is
    # the identity on every line of every log the guard knows
    changed = [ln for ln in _ALL_LINES if plain_chars(ln) != ln]
    assert not changed, changed[:5]


@pytest.mark.parametrize("medium", sorted(MEDIA))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_each_medium_is_undone_line_by_line(medium: str, data: st.DataObject) -> None:
    line = data.draw(st.sampled_from(_ALL_LINES), label="line")
    through = MEDIA[medium](line)
    if medium == "crlf":
        through = through[:-1]        # (the line splitter's: a CR before the LF ends the line)
    want = line
    if medium == "typographer":
        want = _typographer_loses(line)
    elif medium == "markdown-escaped" and "_" not in line and "*" not in line:
        want = through                # only a backslash escaped: nothing says an editor escaped it
    assert plain_chars(through) == want


@pytest.mark.parametrize(("through", "typed"), [
    ("The model\u2019s max seq len (32768)", "The model's max seq len (32768)"),
    ("model=\u201cQwen/Qwen2.5-7B\u201d", 'model="Qwen/Qwen2.5-7B"'),
    ("vllm serve m \u2014max-model-len 4096 \u2013enforce-eager", "vllm serve m --max-model-len 4096 --enforce-eager"),
    ("reserved for KV Cache is \u22121.05GiB", "reserved for KV Cache is -1.05GiB"),
    ("Loading model\u2026", "Loading model..."),
    ("File \"\u2026/torch/csrc/Module.cpp\"", "File \"../torch/csrc/Module.cpp\""),
    ("INFO\u00a011-30\u00a012:00:00", "INFO 11-30 12:00:00"),
    ("gpu_\u200bmemory_\u200butilization\ufeff", "gpu_memory_utilization"),
    ("ValueError\uff1a bad\uff08x\uff09", "ValueError: bad(x)"),
    ("args: {&#39;model&#39;: &quot;x&quot;} &lt;module&gt; &amp;", "args: {'model': \"x\"} <module> &"),
    ("a & b; R&D", "a & b; R&D"),                                   # no reference: left as it is
    ("max\\_model\\_len \\*args", "max_model_len *args"),
    ("C:\\Users\\me\\model", "C:\\Users\\me\\model"),                # no escape before _ or *: left as it is
    ("(c) 2024 +- 1", "(c) 2024 +- 1"),
    ("\u00a9 2024 \u00b1 1", "(c) 2024 +- 1"),
])
def test_what_each_medium_put_in_is_read_back(through: str, typed: str) -> None:
    assert plain_chars(through) == typed


@pytest.mark.parametrize("carrier", sorted(CARRIER_LINES))
def test_a_wrap_that_cuts_vllms_header_anywhere_behind_a_carrier_keeps_the_record_whole(carrier: str) -> None:
    """The wrap falls at every character of vLLM's process tag and log header behind the carrier's prefix: the
    rest of the tag begins the next line ("(APIServer pid=28" / "17) INFO 11-30 ..."), and what stands before the header
    there is the line before's, not a prefix nobody listed (hypothesis found journald's cut in the pid's
    digits read as a learnt prefix: records of no process, a phase read from the wrong milestones)."""
    case = next(c for c in FAILURES if c.name.startswith("ray_tp_exceeds_gpus_warning@0.11.1"))
    first = case.lines[0]
    prefix = len(CARRIER_LINES[carrier](first, 0)) - len(first)
    header = first.index("] ") + 2
    for width in range(max(40, prefix + 1), prefix + header + 1):     # (40: the narrowest wrap read as one)
        _check_failure(case, [_carrier(carrier), _wrap(width)])


@pytest.mark.parametrize("carrier", STAMPED)
def test_an_editors_wrap_that_breaks_vllms_header_at_its_spaces_behind_a_carrier_is_read_as_an_editors(
        carrier: str) -> None:
    """An editor's wrap breaks at the spaces of vLLM's log header behind the carrier's prefix (``INFO 07-23`` /
    ``10:00:00 api_server.py:177] ...``), the space dropped: the header's grammar says a space was there, as a
    terminal keeps it (hypothesis found two such breaks exactly as wide, a V0 log's first lines behind
    compose's stamps wrapped at 53, read as a terminal's cuts: "version0.5.0", the version lost)."""
    headed = [c for c in FIXTURE_FAILURES if c.name not in PRE_WRAPPED
              and re.match(r"(?:INFO|WARNING|ERROR) \d\d-\d\d ", c.lines[0])]
    for case in headed[::3]:
        first = case.lines[0]
        prefix = len(CARRIER_LINES[carrier](first, 0)) - len(first)
        spaces = [j for j, ch in enumerate(first[:first.index("] ")]) if ch == " "]
        for width in {prefix + j + k for j in spaces for k in (0, 1) if prefix + j >= 40}:   # (at each space)
            _check_failure(case, [_carrier(carrier), _word_wrap(width, True, True)])


#: viewers that number lines right-aligned: each line's prefix begins with spaces (as many as the number leaves)
_NUMBERED = {"cat -n": lambda i: f"{i + 1:6d}\t", "less -N": lambda i: f"{i + 1:7d} ",
             "nl -s ' '": lambda i: f"{i + 1:6d} ", "numbered with ':'": lambda i: f"{i + 1:6d}:",
             "numbered with ']'": lambda i: f"{i + 1:6d}] ", "bat": lambda i: f"{i + 1:4d} │ "}


@pytest.mark.parametrize("viewer", [*sorted(_NUMBERED), "grep -n ''"])
def test_every_saved_log_numbered_by_a_viewer_reads_as_it_does_plain(viewer: str) -> None:
    """Lines numbered one after another say the viewer's prefix though no line shows vLLM's header behind it
    (an argparse error, a usage text: found with the number's spaces read as a traceback's source line)."""
    number = _NUMBERED.get(viewer, lambda i: f"{i + 1}:")
    numbered = Paste(f"carrier {viewer}", lambda lines: [number(i) + m for i, m in enumerate(lines)], 2)
    for case in FIXTURE_FAILURES + FIXTURE_HEALTHY:
        if case.name not in PRE_WRAPPED:
            (_check_healthy if case.kind == "healthy" else _check_failure)(case, [numbered])


@pytest.mark.parametrize("viewer", sorted(_NUMBERED))
def test_a_right_aligned_line_number_wrapped_by_the_terminal_is_a_prefix_not_an_indentation(viewer: str) -> None:
    """The terminal wrapped the numbered line whole, its number's spaces with it: they are no indented block's
    (hypothesis found the first line's spaces taken for a code block's, its width short by them, and every
    wrap of a healthy log read as an editor's, with spaces put into its words: a warning called fatal; then the
    tenth line's number, a column shorter, kept its spaces and lost the prefix learnt)."""
    number = _NUMBERED[viewer]
    numbered = Paste(f"carrier {viewer}", lambda lines: [number(i) + m for i, m in enumerate(lines)], 2)
    healthy = next(c for c in FIXTURE_HEALTHY if c.name == "current/0.11.0-healthy-c10d-bind-warnings.log")
    failure = next(c for c in FAILURES if c.name == "kv_v1_needed@0.14.0@0.21.0/kv_cache")
    for width in range(60, 161, 5):
        # as copied, indented after the wrap (a code block), indented before it (the numbers' column wider)
        for set_off in ([], [_indent("    ")], [_indent_first("  ")]):
            _check_healthy(healthy, [numbered, _wrap(width), *set_off])
            _check_failure(failure, [numbered, _wrap(width), *set_off])


@pytest.mark.parametrize("carrier", STAMPED)
def test_a_command_pasted_above_an_indented_log_is_read_with_the_prefix_its_lines_show(carrier: str) -> None:
    """The saved logs that begin with the command that was run, each line behind a listed carrier's stamp and
    a tag nobody listed (nomad's ``[INFO]``), the whole indented (a code block): the command is held until a
    line shows the prefix, and read as that line is, its indentation off (found: the prefix learnt with the
    block's indentation and the stamp, which the lines read after it no longer had; the command's
    --max-model-len lost; in a bug report's fence, the command read before the prefix was learnt; quoted, the
    prefix learnt with the quote's markers)."""
    tagged = Paste(f"carrier {carrier} and a tag", lambda lines: [CARRIER_LINES[carrier]("[INFO]  " + m, i)
                                                                for i, m in enumerate(lines)], 2)
    for case in FIXTURE_FAILURES:
        if re.search(r"vllm serve|python3? -m vllm|docker run", case.lines[0]) and case.name not in PRE_WRAPPED:
            _check_failure(case, [tagged, _indent("    ")])
            # ... and in a bug report's fence, below the report's other blocks (a fence begins a paste of its own);
            # quoted (the command held is read for the prefix as it is read after: its markers off)
            _check_failure(case, [tagged, _report(case, ["prose", "environment"], "```log")])
            for marker in QUOTES:
                _check_failure(case, [tagged, _quote(marker)])


def test_a_paste_indented_before_its_wrap_goes_on_after_a_blank_line() -> None:
    """Lines indented before the wrap (each line's first piece indented, its other pieces not), a blank line
    among them: the block goes on after it, its indentation the same (found: the line after the blank, a
    frame's first piece, its own two spaces with the block's four, set the block's at six, and the exception
    line, indented four, kept them: read as a source line)."""
    for cases in _BY_ROW.values():
        case = cases[0]
        frame = next((i for i, ln in enumerate(case.lines) if ln.startswith('  File "')), None)
        if frame is None:
            continue
        blank = Paste("a blank line before a frame", lambda lines, i=frame: [*lines[:i], "", *lines[i:]], 1, "middle")
        for wrap in (_wrap(74), _word_wrap(74, True, False)):
            _check_failure(case, [_indent_first("    "), wrap, blank])


@pytest.mark.parametrize("name", ["kv_v1_needed@0.14.0@0.21.0/kv_cache", "torch_cublas_alloc@0.7.3/kv_cache_alloc",
                                  "workerproc_failed_to_start@0.6.5@0.8.4/loading/alone"])
def test_a_wrapped_repr_is_read_a_record_a_line_wherever_the_wrap_cuts_a_written_out_break(name: str) -> None:
    """An exception's text pasted as one string (its breaks written ``\\n``), wrapped by a terminal or an editor
    at every width from 40 to 200: the cuts fall at every character of the breaks and the headers after them
    (found: a piece "ine 107, in __init__\\n(EngineCore pid=3120) ERROR ..." read as behind a prefix nobody
    listed, the frame's rest lost; "...\\nERROR 11-30 12:00:00" / " [core.py:242]   File" and "...\\nER" /
    "ROR 11-30 ..." the same; a header's level left on the line before; a piece ending in the break or in the
    header after it, read while the wrap was not yet known; in lower case, the pieces' levels; the repr alone,
    a few lines, the wrap never known: a piece with no record after its breaks read whole, not a record a line)."""
    case = next(c for c in FAILURES if c.name == name)
    for width in range(40, 201):
        typed = [LOWER] if width % 3 == 0 else [_cut_head(case, case.start)] if width % 3 == 1 else []
        _check_failure(case, [_repr(case), _wrap(width), *typed])
        _check_failure(case, [_repr(case), _word_wrap(width, width % 2 == 0, True), *typed])


@pytest.mark.parametrize("marker", QUOTES)
def test_a_quote_of_a_paste_indented_before_its_wrap_keeps_the_indentation_apart_from_its_markers(marker: str) -> None:
    """A markdown quote of lines indented before the wrap (a tab or spaces on each line's first piece): the quote's
    marker is what every line begins with, the indentation after it the text's (found: ``>`` then a tab read as
    ``>`` and its space on the first pieces, ``>`` alone on the others: widths a character apart, a terminal's
    padded wrap read as an editor's, a space put into a word)."""
    case = next(c for c in FAILURES if c.name == "torch_cublas_alloc@0.8.5.post1/warmup")
    for pad in INDENTS:
        for width in (60, 71, 97, 130):
            for wrap in (_wrap(width), _padded_wrap(width), _word_wrap(width, True, False)):
                _check_failure(case, [_indent_first(pad), wrap, _quote(marker)])


@pytest.mark.parametrize("pad", INDENTS)
def test_an_indented_block_of_left_aligned_line_numbers_keeps_its_prefix_as_the_numbers_grow_a_digit(pad: str) -> None:
    """Lines numbered left-aligned (``1  ``, ``10  ``), with a name or other numbers after the number or none, the
    block indented before or after the wrap: the indentation and the number look like a right-aligned number's
    column, but from 9 to 10 the number grows after as many spaces, and the prefix is the same, a digit longer
    for each number in it (found: line 10's prefix kept, its traceback's exception line lost: "a traceback cut
    off before its exception line")."""
    case = next(c for c in FAILURES if c.name == "ray_missing@0.5.1@0.9.2/config")
    assert len(case.lines) > 10
    # (the last: three numbers, two of them left-aligned, each a digit longer from line 10 on)
    for number in (lambda i: f"{i}  ", lambda i: f"{i}  host-7 | app] ", lambda i: f"{i}: ",
                   lambda i: f"{i}- > {i:6d}] {i}: "):
        numbered = Paste(f"numbered {number(1)!r}", lambda lines, n=number: [n(i + 1) + m for i, m in
                                                                             enumerate(lines)], 2)
        for width in (97, 155):
            _check_failure(case, [numbered, _wrap(width), _indent_first(pad)])
            _check_failure(case, [numbered, _wrap(width), _indent(pad)])


@pytest.mark.parametrize("shape", ["{i:6d} > prod.log > {i}: ", "{i:4d}\t[{i}] "], ids=["names", "bracket"])
def test_a_right_aligned_number_before_a_left_aligned_one_keeps_its_prefix_where_the_second_grows_a_digit(
        shape: str) -> None:
    """A right-aligned line number's column, then a number that grows (``     9 > f > 9: ``, ``    10 > f > 10: ``):
    the column ends where it ended, its spaces one fewer, and the prefix is a digit longer (found: a traceback's
    exception line, with no log header to find the prefix by, kept it: "a traceback cut off before its exception
    line"). The number grows on each line of a share of the catalogue's failures in turn."""
    for cases in list(_BY_ROW.values())[::8]:
        case = cases[0]
        for k in range(len(case.lines)):
            first = 10 - k       # (line k numbered 10)
            numbered = Paste(f"numbered {shape!r} from {first}", lambda lines, f=first: [
                shape.format(i=max(1, i + f)) + m for i, m in enumerate(lines)], 2)
            _check_failure(case, [numbered])


@pytest.mark.parametrize("pad", INDENTS)
def test_a_word_an_editor_cut_at_its_width_is_glued_back_in_a_block_indented_after_the_wrap(pad: str) -> None:
    """An editor cuts a word longer than its width (a long path or function name) at the width; the block is
    indented after (a code block): the halves together are longer than the paste's own width, though not than
    its lines', which the indentation widened (found: ``build_async_engine_`` / ``client_from_engine_args`` read
    apart, ``engine.py" , line 128`` no frame, the exception line read into it)."""
    case = next(c for c in FAILURES if c.name == "v0_engine_is_dead@0.6.0/serving")
    for width in range(40, 81, 4):
        _check_failure(case, [_word_wrap(width, True, width % 8 == 0), _indent(pad)])


def test_a_piece_that_begins_with_a_space_keeps_it_in_a_block_indented_with_tabs_before_its_wrap() -> None:
    """Lines indented with a tab before the terminal wrapped them: a piece the wrap began with the text's space is
    no line of the tab-indented block, and keeps its space (found: ``must be`` / `` less than ...`` read as
    ``must beless``, the tab's one character taken off the piece's one space)."""
    for cases in _BY_ROW.values():
        case = cases[0]
        for width in (60, 67, 74, 81):
            _check_failure(case, [_indent_first("\t"), _wrap(width)])


def test_a_cri_files_partial_entries_put_together_are_no_line_as_wide_as_printed() -> None:
    """A long line the kubelet cut into partial entries (a repr: the failure's text as one string), each entry's
    line wrapped by the terminal: the line put together is long, but no line was printed that wide, so the paste
    is still read as wrapped and the wrap of its last entry goes on with it (found: the entry's wrap read as a
    record of its own, the failure's evidence cut at the kubelet's cut)."""
    for cases in _BY_ROW.values():
        case = cases[0]
        if case.start > 0 and case.name not in PRE_WRAPPED:
            for width in (60, 83):
                _check_failure(case, [_repr(case), _CRI_PARTIAL, _wrap(width)])


@pytest.mark.parametrize("width", [60, 75])
def test_every_saved_log_as_a_cri_file_a_terminal_wrapped_reads_as_it_does_plain(width: int) -> None:
    """A CRI file's partial entries, each entry's line wrapped by a terminal (a space at a wrap's cut kept at the
    end of the piece): where the kubelet cut an entry that ends in that space, no space was lost (found, the
    first partial entry of a paste, its length not yet known: ``vLLM API `` / ``server version`` read as two
    spaces, the version lost)."""
    for case in FIXTURE_FAILURES + FIXTURE_HEALTHY:
        if case.name not in PRE_WRAPPED:
            (_check_healthy if case.kind == "healthy" else _check_failure)(case, [_CRI_PARTIAL, _wrap(width)])


@pytest.mark.parametrize("carrier", sorted(n.removeprefix("carrier ") for n in _JSON_CARRIED))
def test_a_json_line_an_editor_cut_inside_an_escape_is_read_whole(carrier: str) -> None:
    """JSON lines an editor wrapped, cutting a word longer than its width (a frame's quoted path: ``\\"/usr/...``)
    between an escape's backslash and its character: the space an editor drops at its other breaks was never
    there (found: the spaced reading no JSON, the glued one every word of the message run together)."""
    case = next(c for c in FAILURES if c.name == "torch_cuda_oom@0.8.5.post1/profiling")
    for width in range(40, 71, 3):
        _check_failure(case, [_word_wrap(width, True, width % 2 == 0), _carrier(carrier)])
        _check_failure(case, [_word_wrap(width, True, width % 2 == 0), _carrier(carrier), _repr(case)])


@pytest.mark.parametrize("carrier", sorted(n.removeprefix("carrier ") for n in _JSON_CARRIED))
def test_a_wrapped_paste_a_rich_text_editor_escaped_is_read_back_on_every_piece(carrier: str) -> None:
    """A rich-text editor escaped the whole paste (``\\_``, ``\\*``, ``\\\\``), then it was wrapped: a wrap's piece of
    a line shows an escape before ``_`` or ``*`` or not, and the paste's JSON lines hold backslashes of their own
    (found: a JSON line's pieces with no ``\\_`` kept their doubled backslashes, the object no JSON)."""
    case = next(c for c in FAILURES if c.name == "quant_scheme_capability@0.29.0@0.34.0/loading")
    for wrap in (_wrap(60), _padded_wrap(73), _word_wrap(66, True, True)):
        _check_failure(case, [wrap, _carrier(carrier), _medium("markdown-escaped")])


#: where a wrap's piece may begin with the text's space and what a record begins with too: a carrier's prefix (a
#: progress bar's " Completed | 2/4" reads like compose's), an exception's name, a traceback's lines
_RECORD_LIKE = [re.compile(r" (?=Completed \| )"),
                re.compile(r"(?<=\S) (?=(?:[A-Za-z_.]+(?:Error|Exception)|Traceback \(|File \"))")]


@pytest.mark.parametrize("pad", INDENTS)
def test_a_wrap_piece_that_begins_like_a_record_leaves_its_blocks_indentation_as_it_is(pad: str) -> None:
    """Lines indented before the terminal wrapped them, one cut just before what a record begins with (a progress
    bar's `` Completed | 2/4``, an exception's name behind vLLM's process tag: ``(EngineCore pid=3120)`` /
    `` ValueError: ...``): the piece begins with the text's own space, after a line as wide as the wrap, whose rest
    it is; and a carrier's line has no indentation of its own to be less than the block's (found, each: the
    block's indentation set at the piece's one space, every line after it kept the rest of the block's)."""
    for cases in _BY_ROW.values():
        case = cases[0]
        for word in _RECORD_LIKE:
            cut = next((m.start() for ln in case.lines for m in [word.search(ln, 40)] if m), None)
            if cut is not None:
                _check_failure(case, [_indent_first(pad), _wrap(len(pad) + cut)])


@pytest.mark.parametrize("marker", QUOTES)
def test_a_quoted_log_behind_a_prefix_nobody_listed_is_unquoted_in_a_bug_reports_fence(marker: str) -> None:
    """A bug report's log block quoted line by line, each line behind a prefix nobody listed (a viewer's clock): a
    bare ``>`` before it begins no record anyone knows, but every line of the block so far was quoted, as at a
    paste's start (found: the quote read as the text's after the fence, a wrap's piece ``>y", line 156`` glued into
    the frame before it)."""
    clocked = Paste("a clock", lambda lines: [f"[{_t(i):%H:%M:%S}]: {m}" for i, m in enumerate(lines)], 2)
    for cases in list(_BY_ROW.values())[::4]:
        case = cases[0]
        if case.name not in PRE_WRAPPED:
            for wrap in ([], [_wrap(128)]):
                _check_failure(case, [clocked, _report(case, ["command"], "```text"), _quote(marker), *wrap])


@pytest.mark.parametrize("carrier", sorted(n.removeprefix("carrier ") for n in _JSON_CARRIED))
def test_every_healthy_log_as_json_lines_indented_before_a_terminals_wrap_stays_healthy(carrier: str) -> None:
    """JSON lines indented before the terminal wrapped them: a piece that begins with the text's space and a level
    (`` warning: numa binding ...``) follows a JSON line's piece as wide as the wrap, however that line was read
    (found: the line before a JSON piece, its width not noted, the block's indentation set at one space, every
    JSON line after it no JSON: a request's error read as the engine's death)."""
    for case in FIXTURE_HEALTHY:
        if case.name not in PRE_WRAPPED:
            _check_healthy(case, [_wrap(60), _carrier(carrier), _indent_first("    "), LOWER])


@pytest.mark.parametrize("carrier", STAMPED)
def test_a_carriers_lines_indented_before_a_wrap_narrower_than_its_prefix_and_vllms_header_keep_their_block(
        carrier: str) -> None:
    """A listed carrier's lines indented before a terminal's wrap at 60 columns, the prefix and the block's spaces
    all but filling each line's first piece: a frame's piece `` File "..."`` after such a piece is its line's rest,
    though no wrapped record had said the paste's width yet (found: the block's indentation set at one space, every
    line after kept three of its four, the carrier's prefix no longer read)."""
    case = next(c for c in FAILURES if c.name == "v0_task_finished@0.5.0@0.5.0/serving/unknown-root")
    _check_failure(case, [_indent_first("    "), _carrier(carrier), _wrap(60)])


@pytest.mark.parametrize("pad", ["        ", "\t"])
def test_every_saved_log_indented_before_a_terminals_wrap_reads_as_it_does_plain(pad: str) -> None:
    """Every saved log indented before the terminal wrapped it at 65 columns (in lower case too): one that begins
    mid-line with a number (``896] vLLM API server version ...``, its header's file and line cut off) looks like a
    right-aligned line number's column, but the next line is a record of the block's with none (found: the
    block read as numbered, its indentation taken from the wrap's pieces, none, and kept on every line); and a
    wrapper's line cut by the wrap, read on its own first, is no root cause beside the wrapper (found: "Engine core
    initialization fail" / "ed. See root cause above ..." read as an exception no rule knows)."""
    for case in FIXTURE_FAILURES + FIXTURE_HEALTHY:
        if case.name not in PRE_WRAPPED:
            for typed in ([], [LOWER]):
                (_check_healthy if case.kind == "healthy" else _check_failure)(
                    case, [_indent_first(pad), _wrap(65), *typed])


def _vllm_headed(line: str) -> bool:
    """The line shows vLLM's log header (behind its process tag or not)."""
    return re.match(r"(?:\([^)]*pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ", line) is not None


@pytest.mark.parametrize("viewer", sorted(_NUMBERED))
def test_a_numbered_block_whose_indentation_shows_after_its_first_line_keeps_the_prefix_learnt_there(
        viewer: str) -> None:
    """Numbered lines in a code block (indented after the numbering), the lines between the first and the failure's
    left out for a marker typed in the editor: the block's indentation is known only from the marker's line, after
    the prefix was learnt from the first line read with none off; the prefix moves with it, for the failure's line
    that shows no header of vLLM's behind it (found: line 6's number a column off the one learnt, its exception line
    read behind a prefix, the failure lost)."""
    number = _NUMBERED[viewer]
    numbered = Paste(f"carrier {viewer}", lambda lines: [number(i) + m for i, m in enumerate(lines)], 2)
    for case in FIXTURE_FAILURES + CASES[::7]:
        first = next((i for i, ln in enumerate(case.lines) if case.evidence and case.evidence.lower() in ln.lower()),
                     None)
        if (case.name in PRE_WRAPPED or first is None or first < 2 or _vllm_headed(case.lines[first])
                or not _vllm_headed(case.lines[0])):
            continue
        marker = Paste("the lines before the failure's left out", lambda lines, k=first: [lines[0], "...",
                                                                                         *lines[k:]], 3.5, "middle")
        _check_failure(case, [numbered, marker, _indent("        ")])


# --------------------------------------------------------------------------- what is around the log
def _prose(text: str) -> Paste:
    """The reporter's words above the log, a blank line between (a bug report's, a forum post's)."""
    return Paste("prose above", lambda lines: [text, "", *lines], 9)


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "from-the-failure"])
def test_prose_that_names_the_failure_above_the_log_leaves_the_verdict_to_the_logs_own_record(cut: bool) -> None:
    """A reporter names the failure in a sentence above the log ("it fails with <the error> and I don't know
    why"): a line that is neither vLLM's record nor a traceback's matched the rule first, and its place and
    its words were the verdict's (found: an engine crash read from the prose, during "launching", the log's own
    record, while serving, second). The log's own record of the same weight or more says it: its place, its
    numbers, its evidence. Every catalogue failure, whole and cut to where it fails (no banner to start a
    launch at)."""
    for case in FAILURES:
        if not case.evidence:
            continue
        sentence = _prose(f"After a while the server fails with {case.evidence} and I don't know why.")
        ps = [sentence, _cut_head(case, case.start)] if cut else [sentence]
        _check_failure(case, ps)
        got = classify(_apply(case, ps), case.exit_code)
        # (cut to a failure line that is no record either, pydantic's "Value error, ...": either says it)
        assert cut or "know why" not in got.evidence, f"{case.name}: {got.evidence!r}"


@pytest.mark.parametrize("width", [64, 80, 100, 132])
def test_prose_wider_than_the_wrap_around_a_wrapped_log_leaves_the_wrap_its_width(width: int) -> None:
    """A paragraph of the reporter's, typed on one line wider than the log's wrap (a forum's text box wraps it for
    the eye only), above the log a terminal wrapped: the widest line was the prose's, no line of the log was
    as wide, and the wrap was never found (found: the numbers of a KV cache error cut in two, "max_seq_len=81",
    the evidence a piece). A paragraph none of whose lines begins a record is no wrap's: its widths are taken
    back at the blank line that ends it. Every saved failure, a terminal's wrap and an editor's."""
    prose = _prose("Running the model on two GPUs in the official container; copied from tmux so the lines are "
                   "wrapped, sorry. The same happens with the latest release and with --enforce-eager, " * 2)
    for case in FIXTURE_FAILURES:
        if case.name not in PRE_WRAPPED:
            _check_failure(case, [_wrap(width), prose])
            _check_failure(case, [_word_wrap(width, True, False), prose])


def _launches(first: cat.Case, then: list[str]) -> Paste:
    return Paste(f"after {first.name}", lambda lines: [*first.lines, *then, *lines], 9)


#: the failures whose log begins with vLLM's banner (one medium for both launches: no log a paste had wrapped)
_BANNERED = [c for c in FIXTURE_FAILURES + FAILURES if c.lines and c.name not in PRE_WRAPPED
             and "server version" in c.lines[0] and re.match(r"(\(APIServer pid=\d+\) )?INFO ", c.lines[0])]
_PLAIN_HEALTHY = [c for c in FIXTURE_HEALTHY if c.name.startswith(("current/", "real-0.32/"))]


@pytest.mark.parametrize("k", range(4))
def test_a_log_of_several_launches_is_read_for_the_last(k: int) -> None:
    """A journal of the guard's relaunches, a paste of two attempts ("my bad, a typo; the second try"): each
    launch's banner starts what is known over, and the verdict is the last launch's (found: an argparse error
    of the first attempt called the paste's failure, the second attempt's KV cache error not read). A last
    launch cut before it fails or serves, or after its banner (found: a console's entries of one second, newest
    first, the banner read after the failure), leaves the failure of the one before. Pairs of the catalogue's
    failures with a banner, and a healthy last launch."""
    # (the first launch's failure from its text: an exit status is the last process's)
    firsts = [c for c in _BANNERED[k::4] if classify(c.lines).kind.value == c.kind]
    for i, first in enumerate(firsts):
        last = _BANNERED[(7 * i + k + 1) % len(_BANNERED)]
        _check_failure(last, [_launches(first, ["", "$ vllm serve again"])])
        healthy = _PLAIN_HEALTHY[i % len(_PLAIN_HEALTHY)]
        got = classify([*first.lines, *healthy.lines])
        assert got.kind.value == "healthy", f"{first.name} then {healthy.name}: {got.kind} from {got.evidence!r}"
        for exit_code in (None, 1):     # (a banner alone says nothing of what ended it: an exit status neither)
            got = classify([*first.lines, "", last.lines[0]], exit_code)
            assert got.kind.value == first.kind, f"{first.name} then a banner: {got.kind} from {got.evidence!r}"


#: the failures whose lines show no vLLM header (none behind a carrier's prefix either)
_HEADERLESS = [c for c in FIXTURE_FAILURES + FAILURES
               if not c.name.startswith("carriers/") and not any(_vllm_headed(ln) for ln in c.lines)]


@pytest.mark.parametrize("shape", ["{i} {i:6d} prod_prod.log  ", "{i}: host-7 | ", "{i:4d}] app.log > "])
def test_a_prefix_of_fields_after_a_line_number_before_lines_with_no_header_is_learnt_whole(shape: str) -> None:
    """A line number, then fields of a prefix nobody listed (a right-aligned number, a file's name), before lines
    that show no vLLM header to find the prefix by (argparse's usage and error, a traceback alone): the line
    numbers, one after another, are learnt with the fields every numbered line shows alike (found: ``1      1
    prod_prod.log  usage: ...``, the number alone taken off, the rest's spaces read as a traceback's source
    line and the error never read). Every failure whose lines have no header."""
    numbered = Paste(f"numbered {shape!r}", lambda lines: [shape.format(i=i + 1) + m for i, m in enumerate(lines)], 2)
    for case in _HEADERLESS:
        _check_failure(case, [numbered])


@pytest.mark.parametrize("marker", QUOTES)
def test_a_quote_of_a_paste_wrapped_at_the_widest_wrap_is_read_as_wrapped(marker: str) -> None:
    """An editor's wrap at 300 columns (the widest a wrap is taken to be), quoted after: the markers, and an
    indentation before the wrap, make a line wider than 300 as drawn, but none of them is the wrap's (found: a
    repr wrapped at 300, indented with a tab and quoted, read as no wrap, the evidence cut at a piece's end).
    A share of the rows, as their failure's repr and as they print."""
    for cases in list(_BY_ROW.values())[::6]:
        case = cases[0]
        for typed in ([], [_repr(case)]):
            _check_failure(case, [_word_wrap(300, True, False), _quote(marker), *typed])
            _check_failure(case, [_word_wrap(300, True, False), _quote(marker), _indent_first("\t"), *typed])


def _csv_export(newest_first: bool) -> Paste:
    """A log console's export as CSV (CloudWatch Logs Insights: @timestamp, @message, @logStream; quotes doubled;
    its header row first), in the order listed, newest first or not."""
    def fn(lines: list[str]) -> list[str]:
        rows = [_csv_row([f"{_t(i):%Y-%m-%d %H:%M:%S.%f}"[:-3], m, "ecs/vllm/4a1f0d7e2b9c4d61"])
                for i, m in enumerate(lines)]
        return ['"@timestamp","@message","@logStream"', *(rows[::-1] if newest_first else rows)]
    return Paste(f"a CSV export{', newest first' if newest_first else ''}", fn, 2)


@pytest.mark.parametrize("newest_first", [False, True])
def test_a_csv_export_of_a_log_console_is_read_as_its_messages_in_time_order(newest_first: bool) -> None:
    """A log console's CSV export (quoted fields: the time stamp, the message with its quotes doubled, the stream's
    name), listed newest first as such consoles list: each row's message is the line, ordered by its stamp
    (found: rows read whole, the stream's name left on the evidence, a console's newest-first order kept and the
    failure placed before vLLM's banner). Every catalogue failure. (A CSV export wrapped by a terminal or an
    editor, its quoted field left open on a line, is not read back whole: docs/failure-catalogue.md.)"""
    for case in FAILURES + FIXTURE_FAILURES:
        if not case.name.startswith("carriers/") and case.name not in PRE_WRAPPED:
            _check_failure(case, [_csv_export(newest_first)])
            got = classify(_apply(case, [_csv_export(newest_first)]), case.exit_code)
            assert "ecs/vllm" not in got.evidence, f"{case.name}: {got.evidence!r}"
