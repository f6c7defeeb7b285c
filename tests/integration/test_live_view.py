"""On a TTY, what a person sees of a real `vllm-guard start` healing the fake vLLM: read off the screen a
terminal emulator (pyte) draws from the pty, at 80, 120 and 250 columns, not searched for in the bytes."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pyte
import pytest
from guardrun import LLAMA8B, ROOT, GuardRun

ROWS = 3000      # tall enough that nothing scrolls away: every row the guard wrote stays readable


class PtyGuard(GuardRun):
    """A GuardRun on a pty of ``columns`` columns, its screen drawn by pyte."""

    def __init__(self, tmp: Path, columns: int, **kw) -> None:
        super().__init__(tmp, **kw)
        self.columns = columns
        self.screen = pyte.Screen(columns, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""

    def start(self) -> PtyGuard:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, self.columns, 0, 0))
        self.master = master
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=slave, stdout=slave, stderr=slave,
                                     cwd=str(ROOT), start_new_session=True)
        os.close(slave)
        return self

    def pump(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n" + "\n".join(self.rows()[-60:]))
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:      # the guard exited and closed the pty
                    data = b""
                if not data and self.proc.poll() is not None:
                    if not until():
                        raise AssertionError(f"guard exited before {what}; screen:\n" + "\n".join(self.rows()[-60:]))
                    return
                self.raw += data
                self.stream.feed(data)

    def drain(self) -> None:
        """Read what the exited guard left on the pty, to its end (a read hands over a piece of it)."""
        assert self.proc.poll() is not None
        while select.select([self.master], [], [], 5)[0]:     # (5 s: a stray holder of the pty cannot hang it)
            try:
                data = os.read(self.master, 65536)
            except OSError:      # the pty's end: EIO once the other side is closed and read empty
                return
            if not data:
                return
            self.raw += data
            self.stream.feed(data)

    def rows(self) -> list[str]:
        rows = [r.rstrip() for r in self.screen.display]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def text(self) -> str:
        """The screen read as a person reads it: rows in order, wrapped lines joined, spaces collapsed."""
        return " ".join("".join(self.screen.display).split())

    def shows(self, line: str) -> bool:
        return " ".join(line.split()) in self.text()

    def output(self) -> str:
        return "\n".join(self.rows())

    def close(self) -> None:
        super().close()
        try:
            os.close(self.master)
        except OSError:
            pass


@pytest.fixture
def tty_run(tmp_path):
    runs: list[PtyGuard] = []

    def make(columns: int, **kw) -> PtyGuard:
        (tmp_path / f"c{columns}").mkdir(exist_ok=True)
        g = PtyGuard(tmp_path / f"c{columns}", columns, **kw)
        runs.append(g)
        return g.start()

    yield make
    for g in runs:
        g.close()


@pytest.mark.parametrize("columns", [80, 120, 250])
def test_the_heal_is_on_the_screen_and_the_live_line_below_it(tty_run, columns):
    g = tty_run(columns, scenario={"version": "0.32.0", "model": LLAMA8B, "speed": 0.1},
                guard_args=["--stop-grace", "5"], env={"NO_COLOR": "1"} if columns == 120 else {})
    g.pump(lambda: "healthy: a chat completion succeeded" in g.text(), 90, "the healthy line")
    s = g.wait_healthy(launches=2)
    first, _ = s["launches"]
    new = s["changed_flags"]["--max-model-len"]["value"]
    why = s["changed_flags"]["--max-model-len"]["why"]
    # the product's main moment, whole on the screen: the diagnosis, the relaunch and why, the healthy line
    # (read until each is whole: a pty hands the bytes over in pieces of its own)
    for line in (f"launch 1 failed: kv_cache_insufficient: {first['evidence'][:300]}",
                 f"relaunch 2: --max-model-len (unset) -> {new} because {why}",
                 f"changed flags: --max-model-len {new}",
                 "Application startup complete."):                     # vLLM's own lines, passed through
        g.pump(lambda line=line: g.shows(line), 10, f"{line!r} whole on the screen")
    # the live line: one row, at the bottom, following the state
    g.pump(lambda: g.rows()[-1].startswith("vllm-guard: launch 2 · healthy"), 10, "the live line saying healthy")
    assert sum(r.startswith("vllm-guard: launch") for r in g.rows()) == 1
    live = g.screen.buffer[len(g.rows()) - 1][0]
    assert live.reverse is (columns != 120)                            # NO_COLOR: no reverse video
    if columns == 120:
        assert b"\x1b[" not in g.raw.replace(b"\x1b[K", b"")          # NO_COLOR: no colour, no attributes at all

    # Ctrl-C: it says it is stopping, for how long, and that a second one kills now; then a final line
    os.kill(g.proc.pid, signal.SIGINT)
    g.pump(lambda: g.shows("stopping vLLM (up to 5 s; Ctrl-C again to kill now)"), 10, "the stopping line")
    assert g.wait_exit(30) == 0
    g.drain()
    rows = g.rows()
    last = max(i for i, r in enumerate(rows) if "vllm-guard exits with code 0" in r)
    assert g.shows("vllm-guard exits with code 0: stopped on request")
    assert not any("vllm-guard: launch" in r for r in rows[last:]), rows[last - 2:]   # the live line is gone
    artifacts = os.environ.get("VLLM_GUARD_ARTIFACTS")       # the screen as a person saw it, to look at
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / f"terminal-{columns}-columns.txt").write_text("\n".join(rows) + "\n")
