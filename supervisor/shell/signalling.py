"""Every signal the guard sends goes through this module, and only to a process it has verified.

The threat: a pid names a process only while that process exists. Once vLLM's API server has
been reaped, its pid (and so its process-group id) can be given to any process on the machine,
and a ``kill(pid)`` or ``killpg(pgid)`` from a stale record hits that stranger. So:

- A process is a :class:`Proc`: its pid *and* the kernel's start time, read when it is spawned or
  first seen. The same pid with another start time is another process. This is the one identity
  rule of the guard (the kernel's start time in clock ticks since boot, as psutil itself tells
  processes apart; it never moves with the wall clock), plus the boot it was read in.
- A signal goes through a pidfd where the kernel has one: open the pidfd, *then* check the start
  time, then signal through the pidfd. A pidfd pins the process it was opened on, and the check
  after opening proves that process is the recorded one, so the signal cannot reach a successor.
  Where pidfds are refused (ENOSYS on old kernels, EPERM under a seccomp filter) psutil checks the
  identity and then calls ``kill`` (a window of microseconds, which the pidfd closes).
- A process group is signalled with ``killpg`` only while its leader (the process whose pid is
  the group id) is alive and verified: a group id cannot be reissued while its leader's pid is
  taken. Once the leader is gone, each member is signalled on its own, and only members the
  caller verified (by the launch marker or a recorded identity) are.
- A stopped process (state T: a SIGSTOP'd hang, a traced process) cannot act on SIGTERM, so it
  gets SIGKILL at once instead of a grace it cannot use.
- This process, its ancestors, pids 0 and 1 and our own process group are never signalled.

Nothing else in ``supervisor/`` calls ``os.kill``, ``os.killpg``, ``send_signal``, ``terminate``
or ``kill`` (``tests/unit/test_signal_chokepoint.py`` holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

_LINUX = sys.platform.startswith("linux")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

KILL_WAIT = 5.0      # after SIGKILL, how long to wait for the kernel to finish them
OWNER_GRACE = 0.5    # a zombie child is left this long for its owner (asyncio, Popen) to reap

#: Whether to try pidfds first; false where the kernel or a seccomp filter refused one (then
#: psutil's check-then-kill is used for the rest of the run).
pidfd_usable = _LINUX and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")

_STOPPED = frozenset("Tt")   # stopped by a signal, stopped by a tracer
_BOOT: str | None = None


def boot_id() -> str:
    """This boot's id (Linux), so a record from before a reboot never matches a process of this one."""
    global _BOOT
    if _BOOT is None:
        _BOOT = ""
        with contextlib.suppress(OSError):
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:   # procfs, not a state file
                _BOOT = f.read(64).decode("ascii", "replace").strip()
    return _BOOT


@dataclass(frozen=True, slots=True)
class _Stat:
    state: str       # R, S, D, T, t, Z, ...
    ppid: int
    pgid: int
    start: float     # seconds since boot at which the kernel created the process


def _stat(pid: int) -> _Stat | None:
    """The kernel's view of ``pid`` now, or None when there is no such process.

    Read from ``/proc/<pid>/stat`` by hand on Linux: psutil's public ``create_time()`` adds the boot
    time read now, so it moves when the clock is stepped, and it reads the file again for each of
    state, ppid and pgid (four reads that could each see another process)."""
    if pid <= 0:
        return None
    if _LINUX:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:   # procfs, not a state file
                raw = f.read(4096)
        except OSError:
            return None
        # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
        # stime cutime cstime priority nice threads itrealvalue starttime ..." (proc(5)); comm may
        # hold spaces and parentheses, so split after the last ')'.
        fields = raw[raw.rfind(b")") + 2:].split()
        try:
            return _Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]) / _TICKS)
        except (IndexError, ValueError):
            return None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            status = p.status()
            state = {"stopped": "T", "tracing-stop": "t", "zombie": "Z"}.get(status, "S")
            return _Stat(state, p.ppid(), os.getpgid(pid), p.create_time())
    except (psutil.Error, OSError):
        return None


@dataclass(frozen=True, slots=True)
class Proc:
    """One process, pinned: never a later process that reused its pid."""

    pid: int
    start: float            # the kernel's start time, seconds since boot (see the module docstring)
    boot: str = ""          # the boot it was read in ("" where unknown)

    @classmethod
    def live(cls, pid: int) -> Proc | None:
        """The process that has ``pid`` now (a zombie included), or None."""
        st = _stat(pid) if isinstance(pid, int) and not isinstance(pid, bool) else None
        return None if st is None else cls(pid, st.start, boot_id())

    @classmethod
    def recorded(cls, pid: object, start: object, boot: object = None) -> Proc | None:
        """A record's process (``launch.json``) if it is still running as that very process, else None."""
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, (int, float)) \
                or isinstance(start, bool):
            return None
        if isinstance(boot, str) and boot and boot_id() and boot != boot_id():
            return None      # recorded in another boot: whatever has the pid now is not it
        p = cls(pid, float(start), boot_id())
        return p if p.is_alive() else None

    def _current(self) -> _Stat | None:
        st = _stat(self.pid)
        return st if st is not None and self.same_start(st.start) else None

    def same_start(self, start: float) -> bool:
        """THE identity rule: the same kernel start time (to a clock tick; the value is exact in ticks)."""
        return abs(start - self.start) < 0.5 / _TICKS

    def is_alive(self) -> bool:
        """Still this process, and not a zombie."""
        st = self._current()
        return st is not None and st.state != "Z"

    def stopped(self) -> bool:
        """Still this process, and stopped (SIGSTOP, a tracer): it cannot act on SIGTERM."""
        st = self._current()
        return st is not None and st.state in _STOPPED

    def pgid(self) -> int | None:
        st = self._current()
        return None if st is None else st.pgid

    def ppid(self) -> int | None:
        st = self._current()
        return None if st is None else st.ppid

    def psutil(self) -> psutil.Process | None:
        """A psutil handle on this process (to read its name, environment ...), or None when it is gone."""
        try:
            p = psutil.Process(self.pid)
        except psutil.Error:
            return None
        return p if self._current() is not None else None

    def record(self) -> dict[str, object]:
        """What a launch record keeps of it (``create_time`` is for people: it moves with the clock)."""
        created = None
        with contextlib.suppress(psutil.Error, RuntimeError):
            created = psutil.boot_time() + self.start
        return {"pid": self.pid, "start": self.start, "boot": self.boot, "create_time": created}


def protected() -> frozenset[int]:
    """This process and its ancestors, and 0 and 1: never signalled, whatever their environment says."""
    pids = {os.getpid(), 0, 1}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return frozenset(pids)


# --- sending ---------------------------------------------------------------------------------


def send(proc: Proc, sig: int) -> bool:
    """Send ``sig`` to ``proc`` if it is still that process; True when it was delivered."""
    global pidfd_usable
    if proc.pid in protected():
        return False
    if pidfd_usable:
        try:
            fd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            return False
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EPERM):
                return False
            pidfd_usable = False      # no pidfds here (old kernel, seccomp): psutil from now on
        else:
            try:
                if proc._current() is None:   # checked after opening: the pidfd holds the recorded process
                    return False
                signal.pidfd_send_signal(fd, sig)
                return True
            except ProcessLookupError:
                return False
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EPERM):
                    return False      # else: refused here (seccomp); psutil's way may still be allowed
            finally:
                os.close(fd)
    try:
        p = psutil.Process(proc.pid)
        if proc._current() is None:
            return False
        p.send_signal(sig)    # psutil checks the pid was not reused since it made ``p``, then kill()s
        return True
    except psutil.Error:
        return False


def _group_ok(pgid: int | None, leader: Proc | None) -> bool:
    """Whether ``killpg(pgid)`` reaches only our launch: its leader lives, verified, and leads it."""
    if pgid is None or pgid <= 1 or leader is None or leader.pid != pgid:
        return False
    with contextlib.suppress(OSError):
        if pgid == os.getpgrp():
            return False      # the child shares our group: signalling it would end the guard
    return leader.is_alive() and leader.pgid() == pgid


def send_group(pgid: int, sig: int, leader: Proc | None) -> bool:
    """``killpg(pgid, sig)`` only while ``leader`` (pid == pgid) lives and leads the group; True if sent."""
    if not _group_ok(pgid, leader):
        return False
    members = group_members(pgid)
    if any(m.pid in protected() for m in members):
        return False          # an ancestor of ours is in that group: only listed processes are signalled
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_members(pgid: int) -> list[Proc]:
    """The processes in group ``pgid`` now (meaningful only while its leader is verified alive)."""
    found = []
    for p in psutil.process_iter():
        st = _stat(p.pid)
        if st is not None and st.pgid == pgid:
            found.append(Proc(p.pid, st.start, boot_id()))
    return found


# --- finding a tree --------------------------------------------------------------------------


def snapshot_tree(root: Proc) -> list[Proc]:
    """``root`` and all its descendants now; [] when ``root`` is gone (a process that took its pid
    and that one's children are never in it)."""
    if not root.is_alive():
        return []
    try:
        candidates = [c.pid for c in psutil.Process(root.pid).children(recursive=True)]
    except psutil.Error:
        candidates = []
    stats = {pid: st for pid in candidates if (st := _stat(pid)) is not None}
    tree = {root.pid: root}
    grew = True
    while grew:             # accept a process only as the child of one already accepted
        grew = False
        for pid, st in stats.items():
            if pid not in tree and st.ppid in tree:
                tree[pid] = Proc(pid, st.start, boot_id())
                grew = True
    if not root.is_alive():  # the root changed during the scan: its "children" may be another's
        return []
    return list(tree.values())


def lost(procs: Iterable[Proc]) -> list[int]:
    """Pids of ``procs`` that are gone: exited (a zombie included) or replaced by another process."""
    return [p.pid for p in procs if not p.is_alive()]


def kill_child(popen: subprocess.Popen[Any]) -> None:
    """SIGKILL a child this process started with ``subprocess`` and has not reaped (so its pid is
    still its own), e.g. a helper that ran past its time."""
    if popen.poll() is None and (proc := Proc.live(popen.pid)) is not None:
        send(proc, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether any process has ``pid`` (EPERM counts: it is someone else's). For clients that name a
    guard by its pid; it never decides a signal."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- ending processes ------------------------------------------------------------------------


def _kill_stopped(procs: Iterable[Proc], done: set[int]) -> None:
    for p in procs:
        if p.pid not in done and p.stopped():
            send(p, signal.SIGKILL)
            done.add(p.pid)


def _wait(procs: list[Proc], deadline: float, hurry: threading.Event | None = None,
          killed: set[int] | None = None) -> list[Proc]:
    delay = 0.01
    while True:
        alive = [p for p in procs if p.is_alive()]
        if killed is not None:
            _kill_stopped(alive, killed)     # stopped during the grace: no use waiting for it
        if not alive or time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            return alive
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.1)


def _reap(procs: Iterable[Proc]) -> None:
    """Reap zombies that are our own children, once their owner had the chance to."""
    me = os.getpid()
    ours = []
    for p in procs:
        st = _stat(p.pid)
        if st is not None and p.same_start(st.start) and st.state == "Z" and st.ppid == me:
            ours.append(p)
    deadline = time.monotonic() + OWNER_GRACE
    while ours:
        ours = [p for p in ours if p._current() is not None]
        if not ours or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for p in ours:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)


def end(procs: Iterable[Proc], pgid: int | None, grace: float, hurry: threading.Event | None = None,
        find: Callable[[], Iterable[Proc]] | None = None) -> list[int]:
    """End ``procs`` (and the group ``pgid`` while its leader, among ``procs``, lives): SIGTERM, then
    SIGKILL what is left after ``grace`` (at once when ``hurry`` is set: a second stop request; at
    once for a stopped process). ``find`` names more processes of ours (the marker scan) just before
    the SIGKILL. Returns the pids ended.

    Never signals this process or its ancestors, nor our own process group. Zombies count as
    ended; those that are our children are reaped.
    """
    keep_out = protected()
    targets = {p.pid: p for p in procs if p.pid not in keep_out and p.is_alive()}
    leader = targets.get(pgid) if pgid is not None else None
    in_group: set[int] = set()
    if _group_ok(pgid, leader):
        assert pgid is not None
        members = group_members(pgid)
        if any(m.pid in keep_out for m in members):
            leader = None      # an ancestor of ours is in that group: signal only the listed processes
        else:
            for m in members:
                targets.setdefault(m.pid, m)
                in_group.add(m.pid)
    else:
        leader = None
    started = list(targets.values())
    killed: set[int] = set()
    _kill_stopped(started, killed)
    grouped = leader is not None and send_group(pgid or 0, signal.SIGTERM, leader)
    for p in started:
        if p.pid not in killed and not (grouped and p.pid in in_group):
            send(p, signal.SIGTERM)
    alive = _wait(started, time.monotonic() + grace, hurry, killed)
    late: list[Proc] = []
    if leader is not None and _group_ok(pgid, leader):   # a member forked after our scan
        late += [m for m in group_members(pgid or 0) if m.pid not in targets and m.pid not in keep_out]
    if find is not None:
        late += [p for p in find() if p.pid not in targets and p.pid not in keep_out]
    for p in late:
        targets.setdefault(p.pid, p)
    alive += [p for p in late if p.is_alive()]
    if alive:
        send_group(pgid or 0, signal.SIGKILL, leader)
        for p in alive:
            send(p, signal.SIGKILL)
        alive = _wait(alive, time.monotonic() + KILL_WAIT)
    _reap(targets.values())
    left = {p.pid for p in alive}
    return sorted(p.pid for p in [*started, *late] if p.pid not in left)


async def end_async(procs: Iterable[Proc], pgid: int | None, grace: float, hurry: threading.Event | None = None,
                    find: Callable[[], Iterable[Proc]] | None = None) -> list[int]:
    """:func:`end` without blocking the event loop. It runs in a thread of its own, not in asyncio's
    shared executor, so a stop never queues behind other work there (a webhook's DNS lookups); the
    thread is not a daemon, so the guard does not exit before vLLM is ended."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[int]] = loop.create_future()
    targets = list(procs)

    def deliver(result: list[int] | None, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result or [])

    def work() -> None:
        try:
            result, error = end(targets, pgid, grace, hurry, find), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):      # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=work, name="vllm-guard-stop").start()
    return await future


# --- dying with the guard --------------------------------------------------------------------

# Loaded now, not in the forked child: dlopen after fork can deadlock on the loader lock.
_LIBC = ctypes.CDLL(None, use_errno=True) if _LINUX else None
_PR_SET_PDEATHSIG = 1
_forking_pid = 0


def _remember_forking_pid() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


# Runs in the parent just before every fork that can run Python in the child (os.fork, and
# subprocess with a preexec_fn), so the child knows who its parent was even if it is gone.
os.register_at_fork(before=_remember_forking_pid)


def die_with_parent() -> None:
    """subprocess ``preexec_fn``: the child gets SIGKILL when the guard dies (Linux; else no-op).

    The kernel sends it when the *thread* that forked exits, so the guard must spawn vLLM from
    its main thread (asyncio's subprocess functions fork in the event loop's thread: run the loop
    in the main thread). Grandchildren do not inherit it; the marker finds those.
    """
    if _LIBC is None:
        return
    parent = _forking_pid or os.getppid()
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the guard died before prctl took effect: die now, as it would
        os.kill(os.getpid(), signal.SIGKILL)
