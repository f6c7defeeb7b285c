"""Make an unrelated process take a given pid, for real: the pid reuse a guard must survive.

Two ways, tried in order:

- ``pid_at.c`` (beside this file), compiled with the system C compiler at first use: clone3() with
  ``set_tid`` puts the new process at exactly that pid, or fails (EEXIST) if the pid is in use.
- writing ``pid - 1`` to ``/proc/sys/kernel/ns_last_pid`` and forking at once, retried until the
  fork lands on the pid (another process on the host may fork in between).

Both need root (CAP_SYS_ADMIN over the pid namespace). Where neither works, :class:`Unavailable`
says why, and the tests skip with that reason.

The process that takes the pid is a new session leader (so its process-group id is that pid too:
the worst case, a ``killpg`` of a stale group id would hit it) and an :data:`IMPOSTOR`: it writes
every catchable signal it receives to a file, so "it got no signal" is read, not inferred.

Orphans are reparented to PID 1, which may never reap them in a container (their pids then stay
taken forever): :func:`subreaper` makes the test process their reaper for the length of a test.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
_PR_SET_CHILD_SUBREAPER = 36

IMPOSTOR = r"""
import signal, sys
log = sys.argv[1]
def note(sig, frame):
    with open(log, "a") as f:
        f.write(f"{sig}\n")
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
          signal.SIGALRM, signal.SIGCONT, signal.SIGPIPE):
    signal.signal(s, note)
print("ready", flush=True)
while True:
    signal.pause()
"""


class Unavailable(Exception):
    """No way to choose a pid here (not root, no compiler and no ns_last_pid, not Linux)."""


def _read_line(stream, timeout: float = 15.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise AssertionError(f"no output within {timeout} s")
    return stream.readline().strip()


class Impostor:
    """An unrelated process that holds ``pid``; ``signals()`` lists what it received."""

    def __init__(self, pid: int, log: Path, popen: subprocess.Popen[str], own: bool) -> None:
        self.pid, self.log, self._popen, self._own = pid, log, popen, own

    def signals(self) -> list[int]:
        try:
            return [int(x) for x in self.log.read_text().split()]
        except FileNotFoundError:
            return []

    def alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except OSError:
            return False

    def pgid(self) -> int:
        return os.getpgid(self.pid)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)   # the test's own cleanup of the process it made
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=10)


def _compiled(build_dir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = build_dir / "pid_at"
    if not out.exists():
        r = subprocess.run([cc, "-O", "-o", str(out), str(HERE / "pid_at.c")], capture_output=True, text=True)
        if r.returncode != 0:
            return None
    return out


def take_pid(pid: int, log: Path, build_dir: Path, env: dict[str, str] | None = None) -> Impostor:
    """Start an :data:`IMPOSTOR` whose pid is ``pid`` (and whose process group is ``pid``)."""
    if not sys.platform.startswith("linux"):
        raise Unavailable("choosing a pid needs Linux")
    if os.geteuid() != 0:
        raise Unavailable("choosing a pid needs root (clone3 set_tid or ns_last_pid)")
    argv = [sys.executable, "-c", IMPOSTOR, str(log)]
    helper = _compiled(build_dir)
    why = "no C compiler for pid_at.c"
    if helper is not None:
        p = subprocess.Popen([str(helper), str(pid), *argv], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = _read_line(p.stdout)
        if first == str(pid):
            if _read_line(p.stdout) != "ready":
                raise AssertionError("the impostor did not start")
            return Impostor(pid, log, p, own=False)
        p.wait(timeout=10)
        why = f"clone3 set_tid refused ({p.stderr.read().strip() or p.returncode})"
        if p.returncode == 17:
            raise AssertionError(f"pid {pid} is still in use: it was not free to take")
    try:
        for _ in range(200):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
            if p.pid == pid:
                if _read_line(p.stdout) != "ready":
                    raise AssertionError("the impostor did not start")
                return Impostor(pid, log, p, own=True)
            p.kill()
            p.wait()
            time.sleep(0.001)
    except OSError as e:
        why += f"; ns_last_pid not writable ({e.strerror})"
        raise Unavailable(why) from None
    raise Unavailable(why + "; ns_last_pid: another process kept taking the pid")


@contextlib.contextmanager
def impostors(build_dir: Path, env: dict[str, str] | None = None) -> Iterator[Callable[[int], Impostor]]:
    """``take(pid)``: an unrelated process (an :data:`IMPOSTOR`, a session leader of its own) now holds
    ``pid``; each one taken is closed at the end. ``take`` raises :class:`Unavailable` where no pid can be
    chosen (a test skips with its reason)."""
    made: list[Impostor] = []

    def take(pid: int) -> Impostor:
        imp = take_pid(pid, build_dir / f"signals-{pid}-{len(made)}", build_dir, env=env)
        made.append(imp)
        return imp

    try:
        yield take
    finally:
        for imp in made:
            imp.close()


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Orphans of our descendants are reparented to this process (to be reaped) while inside."""
    if not sys.platform.startswith("linux"):
        raise Unavailable("PR_SET_CHILD_SUBREAPER is Linux only")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise Unavailable(f"PR_SET_CHILD_SUBREAPER refused: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(pid: int, timeout: float = 10.0) -> None:
    """Wait for ``pid`` (our child, or an orphan reparented to us) to exit, and reap it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            if not os.path.exists(f"/proc/{pid}"):
                return           # reaped by its own parent
            done = 0
        if done:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} was not reaped within {timeout} s")
        time.sleep(0.01)
