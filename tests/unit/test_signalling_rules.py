"""The process chokepoint's rules one by one, on real processes, each in well under a second.

Every test here starts real processes (``sleep``, a shell, a process forked from this one) and
reads what happened to them from the kernel, never from signalling.py itself:

- a child's end is read from its exit status: ``returncode == -N`` means signal N ended it (each
  child is reaped by a thread of its own the moment it ends, as asyncio reaps the guard's);
- a *recorder* is a ``sleep`` with every catchable signal blocked (the mask survives exec), so a
  signal sent to it stays pending, and ``/proc/<pid>/status`` (SigPnd, ShdPnd) says exactly which
  signals reached it, the moment ``kill`` returns; SIGTERM cannot end it, so it also stands in for a
  vLLM that ignores SIGTERM;
- the guard's own process gets handlers for SIGTERM and SIGUSR1 where a test could be wrong about
  it, so a signal that reached it is counted rather than fatal;
- where pidfds must be refused, a real seccomp filter refuses them, in a process forked from this
  one (the module is the same code there);
- a pid is made to be taken by another process for real (tests/fakes/pid_reuse.py).

tests/integration/test_signalling.py and test_procs.py hold the same promises end to end (a whole
launch, a guard, its orphan sweep); these are fast enough to run against each mutant of the module
(scripts/mutation supervisor.shell.signalling).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor.shell import signalling
from supervisor.shell.signalling import Proc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
import pid_reuse  # noqa: E402

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
              pytest.mark.timeout(30)]

SLEEP = shutil.which("sleep") or "/bin/sleep"
SH = shutil.which("sh") or "/bin/sh"
TICK = 1 / os.sysconf("SC_CLK_TCK")       # the kernel's start times are whole clock ticks
CATCHABLE = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
AT_ONCE = 3.0       # "at once": well under the 10 s and 30 s graces given, far above the few ms it takes


# --- reading the kernel (independently of signalling.py) -------------------------------------


def status_field(pid: int, name: str) -> str:
    """A field of ``/proc/<pid>/status`` (not the ``stat`` file signalling.py reads)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    raise KeyError(name)


def pending(pid: int) -> set[int]:
    """The signals sent to ``pid`` that it has not taken (all of them, for a recorder)."""
    mask = int(status_field(pid, "SigPnd"), 16) | int(status_field(pid, "ShdPnd"), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` ("gone" when there is no such process)."""
    try:
        return status_field(pid, "State")[0]
    except (OSError, KeyError):
        return "gone"


def children(pid: int) -> set[int]:
    """``pid``'s children, from the kernel's own list (``/proc/<pid>/task/<pid>/children``)."""
    try:
        return {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for c in children(todo.pop()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def wait_until(pred, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.002)
    return value


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def free_pid() -> int:
    """A pid no process holds now (that of a child just reaped)."""
    p = subprocess.Popen([SLEEP, "0"])
    p.wait()
    return p.pid


# --- real children ---------------------------------------------------------------------------


_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2


def _dies_with_us(record: bool):
    def preexec() -> None:
        # The test's own hygiene (not signalling.die_with_parent, which is under test): a child
        # never outlives a test process that dies, whatever the code under test did to it.
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if record:
            signal.pthread_sigmask(signal.SIG_BLOCK, CATCHABLE)
    return preexec


class Kid:
    """A child of this process: ``sleep 60`` (a recorder with ``record=True``), in the process group
    ``group`` (0: its own; None: ours), reaped the moment it ends unless ``reaped=False``."""

    def __init__(self, *, record: bool = False, group: int | None = 0, reaped: bool = True,
                 argv: list[str] | None = None) -> None:
        self.popen = subprocess.Popen(argv or [SLEEP, "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, process_group=group,
                                      preexec_fn=_dies_with_us(record))
        self.pid = self.popen.pid
        self._waiter: threading.Thread | None = None
        if reaped:
            self._waiter = threading.Thread(target=self.popen.wait, daemon=True)
            self._waiter.start()
        try:
            proc = Proc.live(self.pid)
            assert proc is not None
        except BaseException:
            self.close()
            raise
        self.proc = proc

    def close(self) -> None:
        """The test's cleanup: SIGKILL it (and what it started) and reap it."""
        for pid in [*descendants(self.pid), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.popen.wait(10)

    def ended_by(self, timeout: float = 5.0) -> int | None:
        """The signal that ended it; None while it still runs (after ``timeout``)."""
        if self._waiter is not None:
            self._waiter.join(timeout)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        rc = self.popen.returncode
        return None if rc is None else -rc

    def runs(self) -> bool:
        return state(self.pid) not in ("Z", "X", "gone")

    def pending(self) -> set[int]:
        return pending(self.pid)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)      # the test's own act on its child
        wait_until(lambda: state(self.pid) == "T", "SIGSTOP taking effect")


@pytest.fixture
def kids():
    """``kids(...)`` starts a :class:`Kid`; whatever still runs at the end is SIGKILLed and reaped."""
    made: list[Kid] = []

    def make(**kw) -> Kid:
        k = Kid(**kw)
        made.append(k)
        return k

    yield make
    for k in made:
        k.close()



class Caught:
    """Signals that reached this (the test's, the guard's) process, counted by handlers."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, sig, frame) -> None:
        self.got.append(sig)


@pytest.fixture(autouse=True)
def caught():
    """In every test, this process (the guard's) counts SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 instead
    of dying of them, and none may have reached it by the end."""
    c = Caught()
    old = {s: signal.signal(s, c) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)}
    try:
        yield c
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert c.got == [], f"signals {c.got} reached the test's own process"


@pytest.fixture(scope="module")
def pid_build(tmp_path_factory):
    return tmp_path_factory.mktemp("pid_at")


@pytest.fixture
def impostor(pid_build):
    """``impostor(pid)``: an unrelated process (a session leader of its own) now holds ``pid``."""
    with pid_reuse.impostors(pid_build) as take_pid:
        def take(pid: int, after: float = 0.0) -> pid_reuse.Impostor:
            # A start time is a whole clock tick: a process that took the pid within the tick of the
            # one it replaces would carry the same start (here that needs clone3's set_tid, as root;
            # on a machine, the pid space wrapping within 10 ms), so the impostor starts a tick later.
            wait_until(lambda: boottime() >= after + 2 * TICK, "a clock tick to pass")
            try:
                return take_pid(pid)
            except pid_reuse.Unavailable as e:
                pytest.skip(str(e))

        yield take


def zombie(kids) -> Kid:
    """A child that has exited (SIGKILL) and that nobody has reaped yet."""
    k = kids(reaped=False)
    os.kill(k.pid, signal.SIGKILL)
    os.waitid(os.P_PID, k.pid, os.WEXITED | os.WNOWAIT)      # exited, still unreaped
    assert state(k.pid) == "Z"
    return k


def reaped(kids) -> Kid:
    """A child that has exited and been reaped: its pid is free."""
    k = kids()
    os.kill(k.pid, signal.SIGKILL)
    assert k.ended_by() == signal.SIGKILL
    return k


def ancestors() -> set[int]:
    """This process's ancestors, walked by hand through ``/proc/<pid>/status``'s PPid."""
    found, pid = set(), os.getppid()
    while pid > 0:
        found.add(pid)
        pid = int(status_field(pid, "PPid"))
    return found


# --- identity: a process is its pid and its kernel start time ----------------------------------


def test_a_process_is_its_pid_its_kernel_start_time_and_this_boot(kids):
    before = boottime()
    k = kids()
    after = boottime()
    p = Proc.live(k.pid)
    assert p is not None and p.pid == k.pid
    # the kernel's start time, seconds since boot, truncated to a tick
    assert before - TICK <= p.start <= after + TICK
    assert p.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert p == k.proc and Proc.live(k.pid) == p        # read again: the same process


def test_the_kernels_view_names_the_parent_and_the_group(kids):
    leader = kids(group=0)
    member = kids(group=leader.pid)
    ours = kids(group=None)
    assert leader.proc.ppid() == member.proc.ppid() == ours.proc.ppid() == os.getpid()
    assert leader.proc.pgid() == leader.pid
    assert member.proc.pgid() == leader.pid
    assert ours.proc.pgid() == os.getpgrp()
    assert leader.proc.is_alive() and not leader.proc.stopped()


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_kernels_fields(kids, tmp_path):
    # /proc/<pid>/stat is "pid (comm) state ppid pgrp ...": comm is the executable's name, and may
    # hold ") " itself.
    odd = tmp_path / "a) R 1 (b"
    odd.symlink_to(SLEEP)
    before = boottime()
    k = kids(argv=[str(odd), "60"], group=0)
    wait_until(lambda: status_field(k.pid, "Name") == "a) R 1 (b", "the exec of the oddly named program")
    p = Proc.live(k.pid)
    assert p is not None and before - TICK <= p.start <= boottime() + TICK
    assert p.ppid() == os.getpid() and p.pgid() == k.pid
    assert p.is_alive() and not p.stopped()
    k.stop()
    assert p.stopped()


def test_no_pid_below_one_and_no_non_integer_names_a_process():
    init = Proc.live(1)
    assert init is not None and init.pid == 1 and init.is_alive()
    for pid in (0, -1, -os.getpid()):
        assert Proc.live(pid) is None
    for pid in (True, "1", 1.0, None, str(os.getpid())):
        assert Proc.live(pid) is None       # type: ignore[arg-type]


def test_the_same_start_is_the_same_process_to_the_tick(kids):
    p = kids().proc
    assert p.same_start(p.start)
    assert p.same_start(p.start + 0.4 * TICK) and p.same_start(p.start - 0.4 * TICK)
    assert not p.same_start(p.start + TICK)            # one tick later: another process
    assert not p.same_start(p.start - TICK)
    assert not p.same_start(p.start + 1000.0)


def test_the_same_pid_with_another_start_is_another_process_and_is_not_reached(kids, way):
    k = kids(record=True)
    for other in (Proc(k.pid, k.proc.start + TICK, k.proc.boot), Proc(k.pid, k.proc.start - TICK, k.proc.boot)):
        assert not other.is_alive()
        assert other.pgid() is None and other.ppid() is None and other.psutil() is None
        assert signalling.lost([other, k.proc]) == [k.pid]
        assert signalling.snapshot_tree(other) == []
        assert signalling.send(other, signal.SIGUSR1) is False
        assert signalling.send_group(k.pid, signal.SIGUSR1, other) is False
    k.stop()
    assert not Proc(k.pid, k.proc.start + TICK).stopped()
    assert k.proc.stopped()
    assert k.pending() == set(), "the process that has the pid now got a signal meant for another"


def test_a_zombie_is_the_same_process_but_no_longer_alive(kids):
    z = zombie(kids)
    again = Proc.live(z.pid)
    assert again == z.proc                        # still the same process (a zombie included)
    assert not z.proc.is_alive() and not z.proc.stopped()
    assert z.proc.ppid() == os.getpid()
    assert signalling.lost([z.proc]) == [z.pid]
    assert Proc.recorded(z.pid, z.proc.start, z.proc.boot) is None
    assert signalling.snapshot_tree(z.proc) == []


def test_a_reaped_process_is_gone_everywhere(kids, way):
    r = reaped(kids)
    assert Proc.live(r.pid) is None
    assert not r.proc.is_alive() and not r.proc.stopped()
    assert r.proc.pgid() is None and r.proc.ppid() is None and r.proc.psutil() is None
    assert signalling.lost([r.proc]) == [r.pid]
    assert signalling.send(r.proc, signal.SIGTERM) is False
    assert signalling.send_group(r.pid, signal.SIGTERM, r.proc) is False
    assert signalling.snapshot_tree(r.proc) == []
    assert signalling.end([r.proc], r.pid, grace=5.0) == []


def test_lost_names_exactly_the_processes_that_are_gone(kids):
    alive, stopped = kids(), kids()
    stopped.stop()
    z, r = zombie(kids), reaped(kids)
    other = Proc(alive.pid, alive.proc.start + 1.0)
    assert signalling.lost([alive.proc, z.proc, stopped.proc, r.proc, other]) == [z.pid, r.pid, alive.pid]
    assert signalling.lost([]) == []


def test_a_record_names_its_process_only_while_it_runs_in_this_boot(kids):
    k = kids()
    me = k.proc
    assert Proc.recorded(me.pid, me.start, me.boot) == me
    assert Proc.recorded(me.pid, me.start) == me                   # an old record without a boot
    assert Proc.recorded(me.pid, me.start, "") == me
    got = Proc.recorded(me.pid, me.start, 7)                     # a boot that is no string: unknown
    assert got == me and got is not None and got.boot == signalling.boot_id()
    assert Proc.recorded(me.pid, me.start + TICK, me.boot) is None
    assert Proc.recorded(me.pid, me.start, "another-boot") is None
    for bad in [("1", me.start), (me.pid, "x"), (True, me.start), (me.pid, True), (me.pid, None), (None, None),
                (float(me.pid), me.start)]:
        assert Proc.recorded(*bad) is None
    assert Proc.recorded(reaped(kids).pid, me.start) is None


def test_where_this_machines_boot_id_is_unknown_any_recorded_boot_is_accepted(kids, monkeypatch):
    k = kids()
    monkeypatch.setattr(signalling, "_BOOT", "")
    assert Proc.recorded(k.pid, k.proc.start, "another-boot") == Proc(k.pid, k.proc.start, "")
    assert Proc.live(k.pid) == Proc(k.pid, k.proc.start, "")


def test_the_boot_id_is_the_kernels_and_is_read_once(monkeypatch):
    monkeypatch.setattr(signalling, "_BOOT", None)
    want = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert len(want) == 36
    assert signalling.boot_id() == want
    assert signalling._BOOT == want and signalling.boot_id() == want


CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 1 << 18


def test_where_the_boot_id_cannot_be_read_it_is_unknown_and_refuses_no_record(kids, monkeypatch):
    # A kernel without /proc/sys/kernel/random/boot_id (or a procfs that hides it): shown for real
    # by mounting an empty tmpfs over that directory, in a private mount namespace of a forked process.
    k = kids()
    monkeypatch.setattr(signalling, "_BOOT", None)
    assert signalling.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def hidden() -> int:
        if _LIBC.unshare(CLONE_NEWNS) != 0 or _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            return 10
        if _LIBC.mount(b"tmpfs", b"/proc/sys/kernel/random", b"tmpfs", 0, None) != 0:
            return 11
        if os.path.exists("/proc/sys/kernel/random/boot_id"):
            return 12
        signalling._BOOT = None
        code = 0 if signalling.boot_id() == "" else 1
        code |= 0 if signalling.boot_id() == "" else 2          # read once, remembered as unknown
        got = Proc.recorded(k.pid, k.proc.start, "a-boot-nobody-can-check")
        return code | (0 if got == Proc(k.pid, k.proc.start, "") else 4)

    code = _forked(hidden)
    if code in (10, 11, 12):
        pytest.skip(f"no private mount namespace here to hide the boot id in (step {code - 9})")
    assert code == 0


MS_BIND = 4096


def _over(path: str, content: bytes, tmp: Path) -> bool:
    """In this (forked) process only: ``path`` reads ``content`` (a file bind-mounted over it in a
    private mount namespace, as LXCFS does for a container's /proc)."""
    f = tmp / f"over-{os.getpid()}-{Path(path).name}"
    f.write_bytes(content)
    return (_LIBC.unshare(CLONE_NEWNS) == 0 and _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
            and _LIBC.mount(str(f).encode(), path.encode(), None, MS_BIND, None) == 0)


def test_a_garbled_boot_id_is_read_bounded_and_never_crashes(monkeypatch, tmp_path):
    # What /proc gives is read at most 64 bytes, and a byte that is no ASCII becomes U+FFFD.
    monkeypatch.setattr(signalling, "_BOOT", None)
    assert len(signalling.boot_id()) == 36
    garbled = b"\xff" + b"b" * 70 + b"\n"

    def read() -> int:
        if not _over("/proc/sys/kernel/random/boot_id", garbled, tmp_path):
            return 10
        signalling._BOOT = None
        return 0 if signalling.boot_id() == "\ufffd" + "b" * 63 else 1

    code = _forked(read)
    if code == 10:
        pytest.skip("no private mount namespace here")
    assert code == 0


def test_a_record_is_kept_when_the_boot_time_cannot_be_read(kids, tmp_path):
    # create_time is for people (the boot time plus the start); the record stands without it.
    k = kids()
    assert k.proc.record()["create_time"] == pytest.approx(psutil.Process(k.pid).create_time(), abs=TICK)

    def record() -> int:
        if not _over("/proc/stat", b"cpu  1 2 3 4\n", tmp_path):
            return 10
        with contextlib.suppress(RuntimeError):
            psutil.boot_time()
            return 11                    # psutil still knows it: nothing to show here
        rec = k.proc.record()
        return 0 if rec == {"pid": k.pid, "start": k.proc.start, "boot": k.proc.boot, "create_time": None} else 1

    code = _forked(record)
    if code in (10, 11):
        pytest.skip("cannot hide the boot time here" + (" (no private mount namespace)" if code == 10 else ""))
    assert code == 0


def test_a_launch_record_keeps_pid_start_boot_and_a_create_time_for_people(kids):
    k = kids()
    rec = k.proc.record()
    assert set(rec) == {"pid", "start", "boot", "create_time"}
    assert rec["pid"] == k.pid and rec["start"] == k.proc.start and rec["boot"] == k.proc.boot
    assert rec["create_time"] == pytest.approx(psutil.Process(k.pid).create_time(), abs=TICK)
    assert Proc.recorded(rec["pid"], rec["start"], rec["boot"]) == k.proc


def test_a_psutil_handle_is_for_this_very_process(kids):
    k = kids()
    h = k.proc.psutil()
    assert h is not None and h.pid == k.pid and h.name() == "sleep"
    assert Proc(free_pid(), 1.0).psutil() is None


def test_the_protected_are_this_process_its_ancestors_and_pids_0_and_1():
    assert signalling.protected() == {os.getpid(), 0, 1} | ancestors()


def test_off_linux_the_same_facts_come_from_psutil(kids, monkeypatch):
    # The psutil way of reading the kernel (macOS, the BSDs) run here, on the same real processes.
    monkeypatch.setattr(signalling, "_LINUX", False)
    leader, member = kids(group=0), kids(group=None)
    before = time.time()
    fresh = kids(group=0)
    p = Proc.live(fresh.pid)
    assert p is not None and before - 1.0 <= p.start <= time.time() + 1.0      # psutil: seconds since the epoch
    assert p.start == pytest.approx(psutil.Process(fresh.pid).create_time())
    assert p.is_alive() and not p.stopped() and p.ppid() == os.getpid() and p.pgid() == fresh.pid
    lp = Proc.live(leader.pid)
    mp = Proc.live(member.pid)
    assert lp is not None and mp is not None and mp.pgid() == os.getpgrp() and lp.pgid() == leader.pid
    fresh.stop()
    assert p.stopped() and p.is_alive()
    z = zombie(kids)
    zp = Proc.live(z.pid)
    assert zp is not None and not zp.is_alive() and not zp.stopped()
    assert Proc.live(free_pid()) is None and Proc.live(0) is None


# --- sending: only to the verified process -----------------------------------------------------


def test_a_signal_reaches_the_verified_process_and_no_other(kids, way):
    a, b = kids(record=True), kids(record=True)
    assert signalling.send(a.proc, signal.SIGUSR1) is True
    assert a.pending() == {signal.SIGUSR1}
    assert b.pending() == set()
    assert signalling.send(a.proc, signal.SIGHUP) is True
    assert a.pending() == {signal.SIGUSR1, signal.SIGHUP}
    assert signalling.send(b.proc, signal.SIGKILL) is True
    assert b.ended_by() == signal.SIGKILL and a.runs()


def test_a_sent_signal_leaves_no_descriptor_open(kids, way):
    k = kids(record=True)
    fds = set(os.listdir("/proc/self/fd"))
    assert signalling.send(k.proc, signal.SIGUSR2) is True
    assert signalling.send(Proc(k.pid, k.proc.start + TICK), signal.SIGUSR2) is False
    assert set(os.listdir("/proc/self/fd")) == fds
    assert k.pending() == {signal.SIGUSR2}


def test_this_process_its_ancestors_and_pid_1_are_never_signalled(caught, way):
    me = Proc.live(os.getpid())
    assert me is not None
    assert signalling.send(me, signal.SIGUSR1) is False
    for pid in [os.getppid(), 1]:
        p = Proc.live(pid)
        assert p is not None
        assert signalling.send(p, 0) is False         # signal 0: nothing is delivered either way
    assert signalling.end([me], None, grace=5.0) == []
    assert caught.got == []


def test_a_process_whose_pid_was_taken_is_never_signalled(kids, way, impostor):
    k = kids(group=0)
    old = k.proc
    os.kill(k.pid, signal.SIGKILL)
    assert k.ended_by() == signal.SIGKILL
    imp = impostor(old.pid, after=old.start)
    now = Proc.live(old.pid)
    assert now is not None and now != old and imp.pgid() == old.pid    # it leads a group with the old id
    assert signalling.send(old, signal.SIGTERM) is False
    assert signalling.send_group(old.pid, signal.SIGTERM, old) is False
    assert signalling.end([old], old.pid, grace=5.0) == []
    assert signalling.snapshot_tree(old) == [] and signalling.lost([old]) == [old.pid]
    assert imp.signals() == [] and imp.alive()


def _become_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def test_a_process_this_user_may_not_signal_is_reported_as_not_signalled(kids, way):
    # A guard that is not root meets other users' processes: the kernel refuses (EPERM), at the
    # pidfd and then at kill(); nothing is delivered and the refusal is no success.
    if os.geteuid() != 0:
        pytest.skip("becoming another user needs root")
    leader = kids(record=True, group=0)
    member = kids(record=True, group=leader.pid)

    def as_nobody() -> int:
        _become_nobody()
        code = 0 if signalling.send(leader.proc, signal.SIGUSR2) is False else 1
        return code | (0 if signalling.send_group(leader.pid, signal.SIGUSR2, leader.proc) is False else 2)

    assert _forked(as_nobody) == 0
    assert leader.pending() == set() and member.pending() == set()
    # the same calls, as root
    assert signalling.send(member.proc, signal.SIGUSR2) is True
    assert signalling.send_group(leader.pid, signal.SIGUSR1, leader.proc) is True
    assert leader.pending() == {signal.SIGUSR1} and member.pending() == {signal.SIGUSR1, signal.SIGUSR2}


# --- pidfds refused: a real seccomp filter, in a process forked from this one --------------------

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(platform.machine())
_NR = {"pidfd_send_signal": 424, "pidfd_open": 434,      # the same number on every architecture
       "wait4": {"x86_64": 61, "aarch64": 260}.get(platform.machine(), -1)}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _refuse(syscall: str, err: int) -> None:
    """From now on, in this process, ``syscall`` fails with ``err`` (a seccomp filter, as a container
    runtime installs one)."""
    ld, jeq, ret = 0x20, 0x15, 0x06                   # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, fail = 0x7FFF0000, 0x00050000 | err        # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH), (ret, 0, 0, allow),     # another ABI: allow
            (ld, 0, 0, 0), (jeq, 0, 1, _NR[syscall]), (ret, 0, 0, fail), (ret, 0, 0, allow)]
    filters = (_SockFilter * len(prog))(*prog)
    fprog = _SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # NO_NEW_PRIVS, SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp")


def _forked(fn, timeout: float = 20.0) -> int:
    """Run ``fn`` in a process forked from this one; its exit code (``fn``'s int, 99 on an error,
    -9 if it had to be killed after ``timeout``)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)        # the test's cleanup of its own fork
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.005)


@pytest.mark.skipif(_AUDIT_ARCH is None, reason="seccomp filter written for x86_64 and aarch64")
@pytest.mark.parametrize("syscall", ["pidfd_open", "pidfd_send_signal"])
@pytest.mark.parametrize("err", [errno.EPERM, errno.ENOSYS])
def test_where_pidfds_are_refused_the_signal_goes_by_psutils_check_then_kill(kids, pidfds, syscall, err):
    plain, target = kids(record=True), kids(record=True)
    # Here, unfiltered, the signal goes through a pidfd and pidfds stay in use.
    assert signalling.send(plain.proc, signal.SIGUSR1) is True and signalling.pidfd_usable is True
    stale = Proc(target.pid, target.proc.start + TICK)

    def refused() -> int:
        _refuse(syscall, err)
        with pytest.raises(OSError) as e:
            (os.pidfd_open(target.pid) if syscall == "pidfd_open"
             else signal.pidfd_send_signal(os.pidfd_open(target.pid), 0))
        assert e.value.errno == err
        code = 0
        if signalling.send(stale, signal.SIGUSR1) is not False:
            code |= 1
        if signalling.send(target.proc, signal.SIGUSR2) is not True:
            code |= 2
        # refused at pidfd_open: no pidfds for the rest of the run; refused only at the send: kept
        if bool(signalling.pidfd_usable) != (syscall == "pidfd_send_signal"):
            code |= 4
        return code

    assert _forked(refused) == 0
    assert target.pending() == {signal.SIGUSR2}
    assert plain.pending() == {signal.SIGUSR1}


@pytest.mark.skipif(_AUDIT_ARCH is None, reason="seccomp filter written for x86_64 and aarch64")
@pytest.mark.parametrize("syscall", ["pidfd_open", "pidfd_send_signal"])
@pytest.mark.parametrize("err", [errno.EACCES, errno.ESRCH])
def test_a_pidfd_failure_that_is_no_refusal_sends_nothing(kids, pidfds, syscall, err):
    # Only ENOSYS (no pidfds in this kernel) and EPERM (a seccomp filter) mean "signal another
    # way"; any other failure of a pidfd is no licence to signal by bare pid. ESRCH is the
    # kernel's answer when the process ended between the check and the signal.
    target = kids(record=True)
    assert signalling.send(target.proc, signal.SIGHUP) is True

    def failing() -> int:
        _refuse(syscall, err)
        code = 0
        if signalling.send(target.proc, signal.SIGUSR2) is not False:
            code |= 1
        if signalling.pidfd_usable is not True:
            code |= 2
        return code

    assert _forked(failing) == 0
    assert target.pending() == {signal.SIGHUP}


@pytest.mark.skipif(_AUDIT_ARCH is None or _NR["wait4"] < 0, reason="seccomp filter written for x86_64 and aarch64")
def test_a_zombie_its_owner_reaped_at_the_last_moment_ends_the_stop_quietly(kids):
    # The owner (asyncio, Popen) may reap the zombie just before the stop does: the kernel then
    # answers ECHILD. Shown by a filter that answers every wait with ECHILD, in a forked process.
    k = kids()
    assert signalling.end([k.proc], None, grace=5.0) == [k.pid]

    def owner_was_first() -> int:
        child = subprocess.Popen([SLEEP, "60"])
        p = Proc.live(child.pid)
        _refuse("wait4", errno.ECHILD)
        return 0 if p is not None and signalling.end([p], None, grace=5.0) == [child.pid] else 1

    assert _forked(owner_was_first) == 0


# --- process groups: killpg only through a live, verified leader ---------------------------------


def test_a_group_is_signalled_while_its_verified_leader_leads_it(kids, way):
    leader = kids(record=True, group=0)
    members = [kids(record=True, group=leader.pid) for _ in range(2)]
    outsider = kids(record=True, group=0)
    assert signalling.send_group(leader.pid, signal.SIGUSR1, leader.proc) is True
    for k in [leader, *members]:
        assert k.pending() == {signal.SIGUSR1}
    assert outsider.pending() == set()
    assert len(signalling.group_members(leader.pid)) == 3
    assert set(signalling.group_members(leader.pid)) == {leader.proc, *(m.proc for m in members)}


def test_no_killpg_without_the_groups_own_verified_leader(kids, way):
    leader = kids(record=True, group=0)
    member = kids(record=True, group=leader.pid)
    for pgid, claimed in [(leader.pid, None), (leader.pid, member.proc),
                          (leader.pid, Proc(leader.pid, leader.proc.start + TICK, leader.proc.boot)),
                          (member.pid, member.proc), (0, leader.proc), (1, leader.proc), (-leader.pid, leader.proc)]:
        assert signalling.send_group(pgid, signal.SIGUSR1, claimed) is False, (pgid, claimed)
    assert leader.pending() == set() and member.pending() == set()


CLONE_NEWPID = 0x20000000


def test_in_a_container_a_launch_that_is_pid_2_is_ended_through_its_group(kids):
    # In a container the guard is often pid 1 and vLLM, its first child, pid 2: group 2 is vLLM's
    # like any other. Shown in a real pid namespace (with its own /proc), in a forked process.
    here = kids(record=True, group=0)
    assert signalling.send_group(here.pid, signal.SIGUSR1, here.proc) is True     # the same call, out here
    assert here.pending() == {signal.SIGUSR1}

    def container() -> int:
        if _LIBC.unshare(CLONE_NEWPID | CLONE_NEWNS) != 0:
            return 10
        init = os.fork()                    # pid 1 of the new namespace: the guard
        if init == 0:
            code = 98
            try:
                if _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0 \
                        or _LIBC.mount(b"proc", b"/proc", b"proc", 0, None) != 0:
                    code = 11
                else:
                    vllm = subprocess.Popen([SLEEP, "60"], process_group=0, preexec_fn=_dies_with_us(record=True))
                    p = Proc.live(vllm.pid)
                    code = 0 if (os.getpid(), vllm.pid, p is not None and p.pgid()) == (1, 2, 2) else 12
                    if code == 0 and p is not None:
                        code = 0 if signalling.send_group(2, signal.SIGUSR1, p) is True else 1
                        code |= 0 if pending(2) == {signal.SIGUSR1} else 2
                        code |= 0 if signalling.end([p], 2, grace=0.05) == [2] else 4
                        code |= 0 if state(2) == "gone" else 8          # ended, and reaped by the stop
            finally:
                os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])

    code = _forked(container)
    if code in (10, 11, 12):
        pytest.skip(f"no pid namespace with its own /proc here (step {code - 9})")
    assert code == 0


def test_no_killpg_once_the_leader_is_gone(kids, way):
    leader = kids(group=0)
    members = [kids(record=True, group=leader.pid) for _ in range(2)]
    os.kill(leader.pid, signal.SIGKILL)
    assert leader.ended_by() == signal.SIGKILL
    assert os.getpgid(members[0].pid) == leader.pid        # the group outlives its leader
    assert signalling.send_group(leader.pid, signal.SIGUSR1, leader.proc) is False
    assert [m.pending() for m in members] == [set(), set()]


MOVER = ("import os, sys; sys.stdin.readline(); os.setpgid(0, int(sys.argv[1])); print('moved', flush=True); "
         "sys.stdin.readline()")


def test_no_killpg_when_the_leader_has_left_its_group(kids, way):
    # A leader can join another group of its session; its old group lives on without it, and a
    # killpg of it would reach only processes the leader no longer vouches for.
    elsewhere = kids(record=True, group=0)
    leader = subprocess.Popen([sys.executable, "-c", MOVER, str(elsewhere.pid)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, process_group=0)
    try:
        left = kids(record=True, group=leader.pid)
        assert leader.stdin is not None and leader.stdout is not None
        leader.stdin.write("go\n")
        leader.stdin.flush()
        assert leader.stdout.readline().strip() == "moved"
        lp = Proc.live(leader.pid)
        assert lp is not None and lp.is_alive() and lp.pgid() == elsewhere.pid
        assert signalling.send_group(leader.pid, signal.SIGUSR1, lp) is False
        assert left.pending() == set() and elsewhere.pending() == set()
        assert signalling.end([left.proc], leader.pid, grace=0.05) == [left.pid]
        assert left.ended_by() == signal.SIGKILL
        assert elsewhere.pending() == set()
    finally:
        leader.kill()
        leader.wait(10)


@contextlib.contextmanager
def in_group_of(leader: Kid):
    """This process joins ``leader``'s group for a while (as a guard sharing vLLM's group would)."""
    home = os.getpgrp()
    try:
        os.setpgid(0, leader.pid)
    except PermissionError:
        pytest.skip("this process leads a session: it cannot join another group")
    try:
        yield
    finally:
        os.setpgid(0, home if home != os.getpid() else 0)
    assert os.getpgrp() == home


def test_a_group_that_holds_this_process_or_an_ancestor_is_never_killpgd(kids, caught, way):
    mine = kids(group=0)
    mine_member = kids(record=True, group=mine.pid)
    with in_group_of(mine):
        assert signalling.send_group(mine.pid, signal.SIGUSR1, mine.proc) is False
        assert signalling.end([mine.proc], mine.pid, grace=5.0) == [mine.pid]
    assert mine.ended_by() == signal.SIGTERM and mine_member.pending() == set()

    theirs = kids(group=0)
    theirs_member = kids(record=True, group=theirs.pid)

    def guard_below() -> int:
        # a process forked from this one, in a group of its own: this process is its ancestor
        os.setpgid(0, 0)
        code = 0 if signalling.send_group(theirs.pid, signal.SIGUSR1, theirs.proc) is False else 1
        return code | (0 if signalling.end([theirs.proc], theirs.pid, grace=5.0) == [theirs.pid] else 2)

    with in_group_of(theirs):
        assert _forked(guard_below) == 0
    assert theirs.ended_by() == signal.SIGTERM and theirs_member.pending() == set()
    assert caught.got == [], "a signal reached the guard's own process"


# --- a tree: the root and what descends from it now --------------------------------------------


TREE = 'sleep 60 & sh -c "sleep 60 & wait" & wait'


def test_a_tree_is_its_root_then_every_descendant_and_nothing_else(kids):
    root = kids(argv=[SH, "-c", TREE], group=0)
    below = wait_until(lambda: len(d := descendants(root.pid)) == 3 and d, "the tree to be built")
    unrelated = kids()
    tree = signalling.snapshot_tree(root.proc)
    assert tree[0] == root.proc
    assert set(tree) == {root.proc} | {Proc.live(pid) for pid in below}
    assert len(tree) == 4 and unrelated.proc not in tree
    assert all(p.boot == signalling.boot_id() for p in tree)
    assert signalling.snapshot_tree(unrelated.proc) == [unrelated.proc]


def test_the_tree_of_a_process_that_is_not_ours_is_read_too(kids):
    # As the next guard reads what a previous one left: a process reparented away from us.
    out = subprocess.run([SH, "-c", 'sh -c "sleep 60 & wait" >/dev/null 2>&1 & echo $!'], capture_output=True,
                         text=True, timeout=10)
    orphan = int(out.stdout)
    try:
        (sleeper,) = wait_until(lambda: children(orphan), "the orphan's child")
        root = Proc.live(orphan)
        assert root is not None and orphan not in descendants(os.getpid())
        assert signalling.snapshot_tree(root) == [root, Proc.live(sleeper)]
    finally:
        for pid in [*children(orphan), orphan]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)        # the test's cleanup; their new parent reaps them


def test_a_tree_of_a_process_that_is_not_the_recorded_one_is_empty(kids):
    root = kids(argv=[SH, "-c", TREE], group=0)
    wait_until(lambda: len(descendants(root.pid)) == 3, "the tree to be built")
    assert signalling.snapshot_tree(Proc(root.pid, root.proc.start + TICK)) == []
    assert signalling.snapshot_tree(Proc(free_pid(), 1.0)) == []


# --- ending processes: SIGTERM, a grace, SIGKILL --------------------------------------------------


def test_a_process_that_obeys_sigterm_is_ended_by_it_without_waiting_the_grace(kids, way):
    k = kids()
    t0 = time.monotonic()
    assert signalling.end([k.proc], None, grace=10.0) == [k.pid]
    assert time.monotonic() - t0 < AT_ONCE
    assert k.ended_by() == signal.SIGTERM


def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace(kids, way):
    k, obeys = kids(record=True), kids()
    grace = 0.4
    t0 = time.monotonic()
    assert signalling.end([k.proc, obeys.proc], None, grace=grace) == sorted([k.pid, obeys.pid])
    took = time.monotonic() - t0
    assert grace <= took < grace + AT_ONCE
    assert k.ended_by() == signal.SIGKILL and obeys.ended_by() == signal.SIGTERM


def test_sigterm_comes_first_and_sigkill_only_once_the_grace_is_over(kids):
    k = kids(record=True)
    done: list[list[int]] = []
    t0 = time.monotonic()
    worker = threading.Thread(target=lambda: done.append(signalling.end([k.proc], None, grace=0.6)))
    worker.start()
    wait_until(lambda: signal.SIGTERM in k.pending(), "the SIGTERM")
    assert k.pending() == {signal.SIGTERM} and k.runs()         # no SIGKILL yet
    worker.join(10)
    assert done == [[k.pid]] and k.ended_by() == signal.SIGKILL
    assert time.monotonic() - t0 >= 0.6


def test_a_second_stop_request_ends_the_grace_at_once(kids, way):
    k = kids(record=True)
    hurry = threading.Event()
    done: list[list[int]] = []
    worker = threading.Thread(target=lambda: done.append(signalling.end([k.proc], None, grace=30.0, hurry=hurry)))
    worker.start()
    wait_until(lambda: signal.SIGTERM in k.pending(), "the SIGTERM")
    t0 = time.monotonic()
    hurry.set()
    worker.join(10)
    assert done == [[k.pid]] and time.monotonic() - t0 < AT_ONCE
    assert k.ended_by() == signal.SIGKILL
    # asked twice before the stop began: no grace at all
    again = kids(record=True)
    t0 = time.monotonic()
    assert signalling.end([again.proc], None, grace=30.0, hurry=hurry) == [again.pid]
    assert time.monotonic() - t0 < AT_ONCE and again.ended_by() == signal.SIGKILL


def test_an_unset_second_request_changes_nothing(kids):
    k = kids(record=True)
    t0 = time.monotonic()
    assert signalling.end([k.proc], None, grace=0.3, hurry=threading.Event()) == [k.pid]
    assert time.monotonic() - t0 >= 0.3 and k.ended_by() == signal.SIGKILL


def test_a_stopped_process_gets_sigkill_at_once_not_a_grace_it_cannot_use(kids, way):
    stopped, obeys = kids(record=True), kids()
    stopped.stop()
    t0 = time.monotonic()
    assert signalling.end([stopped.proc, obeys.proc], None, grace=30.0) == sorted([stopped.pid, obeys.pid])
    assert time.monotonic() - t0 < AT_ONCE
    assert stopped.ended_by() == signal.SIGKILL and obeys.ended_by() == signal.SIGTERM


PTRACE_ATTACH = 16


@pytest.mark.parametrize("reader", ["procfs", "psutil"])
def test_a_traced_process_is_stopped_and_gets_sigkill_at_once(kids, monkeypatch, reader):
    # A process stopped by its tracer (state t: a debugger holds it) cannot act on SIGTERM either.
    # ``psutil`` reads the kernel the way signalling.py does off Linux.
    k = kids(record=True, reaped=False)
    if _LIBC.ptrace(PTRACE_ATTACH, k.pid, None, None) != 0:
        pytest.skip(f"ptrace refused here: {os.strerror(ctypes.get_errno())}")
    wait_until(lambda: state(k.pid) == "t", "the tracing stop")
    monkeypatch.setattr(signalling, "_LINUX", reader == "procfs")
    p = Proc.live(k.pid)
    assert p is not None and p.stopped() and p.is_alive()
    t0 = time.monotonic()
    assert signalling.end([p], None, grace=30.0) == [k.pid]
    assert time.monotonic() - t0 < signalling.OWNER_GRACE + AT_ONCE
    assert state(k.pid) == "gone"


def test_a_process_stopped_during_the_grace_gets_sigkill_then(kids):
    k = kids(record=True)
    done: list[list[int]] = []
    worker = threading.Thread(target=lambda: done.append(signalling.end([k.proc], None, grace=30.0)))
    worker.start()
    wait_until(lambda: signal.SIGTERM in k.pending(), "the SIGTERM")
    t0 = time.monotonic()
    k.stop()
    worker.join(10)
    assert done == [[k.pid]] and time.monotonic() - t0 < AT_ONCE
    assert k.ended_by() == signal.SIGKILL


def test_the_group_of_a_live_leader_is_ended_members_not_listed_included(kids, way):
    leader = kids(group=0)
    listed = kids(group=leader.pid)
    unlisted = kids(group=leader.pid)
    elsewhere = kids(group=0)                       # listed too, in a group of its own
    outsider = kids(record=True, group=0)
    t0 = time.monotonic()
    assert signalling.end([leader.proc, listed.proc, elsewhere.proc], leader.pid, grace=10.0) == sorted(
        [leader.pid, listed.pid, unlisted.pid, elsewhere.pid])
    assert time.monotonic() - t0 < AT_ONCE
    assert [k.ended_by() for k in (leader, listed, unlisted, elsewhere)] == [signal.SIGTERM] * 4
    assert outsider.pending() == set()


def test_a_stubborn_group_gets_sigkill_members_not_listed_included(kids):
    leader = kids(record=True, group=0)
    unlisted = kids(record=True, group=leader.pid)
    obeys = kids(group=leader.pid)
    t0 = time.monotonic()
    assert signalling.end([leader.proc], leader.pid, grace=0.3) == sorted([leader.pid, unlisted.pid, obeys.pid])
    assert 0.3 <= time.monotonic() - t0 < 0.3 + AT_ONCE
    assert [k.ended_by() for k in (leader, unlisted, obeys)] == [signal.SIGKILL, signal.SIGKILL, signal.SIGTERM]


def test_a_member_that_joins_the_group_during_the_grace_is_ended_too(kids):
    leader = kids(record=True, group=0)
    done: list[list[int]] = []
    worker = threading.Thread(target=lambda: done.append(signalling.end([leader.proc], leader.pid, grace=0.5)))
    worker.start()
    wait_until(lambda: signal.SIGTERM in leader.pending(), "the SIGTERM")
    late = kids(record=True, group=leader.pid)        # forked after the stop looked at the group
    worker.join(10)
    assert done == [sorted([leader.pid, late.pid])]
    assert leader.ended_by() == signal.SIGKILL and late.ended_by() == signal.SIGKILL


def test_a_member_forked_after_every_scan_is_ended_by_the_groups_sigkill(kids):
    # vLLM may start a worker while the stop is looking for processes (the marker scan is slow:
    # it reads every process's environment); the group's SIGKILL reaches it all the same.
    leader = kids(record=True, group=0)
    forked: list[Kid] = []

    def slow_scan() -> list[Proc]:
        forked.append(kids(record=True, group=leader.pid))     # after the group's last scan
        return []

    assert signalling.end([leader.proc], leader.pid, grace=0.2, find=slow_scan) == [leader.pid]
    assert leader.ended_by() == signal.SIGKILL
    assert [k.ended_by() for k in forked] == [signal.SIGKILL]


def test_late_members_and_what_find_names_are_ended_reaped_and_reported_together(kids):
    leader = kids(record=True, group=0)
    extra = kids(record=True, reaped=False)          # ours, and nobody waits for it
    late: list[Kid] = []
    done: list[list[int]] = []
    worker = threading.Thread(target=lambda: done.append(signalling.end(
        [leader.proc], leader.pid, grace=0.5, find=lambda: [extra.proc])), daemon=True)
    worker.start()
    wait_until(lambda: signal.SIGTERM in leader.pending(), "the SIGTERM")
    late.append(kids(record=True, group=leader.pid))
    worker.join(10)
    assert done == [sorted([leader.pid, late[0].pid, extra.pid])]
    assert leader.ended_by() == signal.SIGKILL and late[0].ended_by() == signal.SIGKILL
    assert state(extra.pid) == "gone", "a process named by find was left a zombie"


def test_a_group_whose_leader_is_gone_is_ended_only_through_the_listed_members(kids):
    leader = kids(group=0)
    listed = kids(group=leader.pid)
    stubborn = kids(record=True, group=leader.pid)
    unlisted = kids(record=True, group=leader.pid)
    os.kill(leader.pid, signal.SIGKILL)
    assert leader.ended_by() == signal.SIGKILL
    t0 = time.monotonic()
    assert signalling.end([leader.proc, listed.proc, stubborn.proc], leader.pid, grace=0.3) == sorted(
        [listed.pid, stubborn.pid])
    assert time.monotonic() - t0 < 0.3 + AT_ONCE
    assert listed.ended_by() == signal.SIGTERM and stubborn.ended_by() == signal.SIGKILL
    assert unlisted.runs() and unlisted.pending() == set(), "an unverified member was signalled"


def test_a_group_is_opened_only_by_its_leader_among_the_listed(kids):
    leader = kids(record=True, group=0)
    listed = kids(group=leader.pid)
    unlisted = kids(record=True, group=leader.pid)
    assert signalling.end([listed.proc], leader.pid, grace=10.0) == [listed.pid]
    assert listed.ended_by() == signal.SIGTERM
    assert leader.pending() == set() and unlisted.pending() == set()


def test_find_names_more_processes_just_before_the_sigkill(kids, caught):
    stubborn, extra = kids(record=True), kids(record=True)
    me = Proc.live(os.getpid())
    seen: list[set[int]] = []

    def find():
        seen.append(extra.pending())        # what ``extra`` had got when the stop looked for more
        return [extra.proc, stubborn.proc, me]

    t0 = time.monotonic()
    assert signalling.end([stubborn.proc], None, grace=0.3, find=find) == sorted([stubborn.pid, extra.pid])
    assert 0.3 <= time.monotonic() - t0 < 0.3 + AT_ONCE
    assert seen == [set()], "find is asked once, after the grace, and what it names got no SIGTERM"
    assert stubborn.ended_by() == signal.SIGKILL and extra.ended_by() == signal.SIGKILL
    assert caught.got == []


def test_what_find_names_is_killed_even_when_the_listed_all_obeyed_sigterm(kids):
    obeys, extra = kids(), kids(record=True)
    t0 = time.monotonic()
    assert signalling.end([obeys.proc], None, grace=10.0, find=lambda: [extra.proc]) == sorted([obeys.pid, extra.pid])
    assert time.monotonic() - t0 < AT_ONCE
    assert obeys.ended_by() == signal.SIGTERM and extra.ended_by() == signal.SIGKILL


def test_what_find_names_that_is_already_gone_is_not_waited_for(kids):
    obeys = kids()
    z = zombie(kids)
    t0 = time.monotonic()
    assert signalling.end([obeys.proc], None, grace=10.0, find=lambda: [z.proc]) == sorted([obeys.pid, z.pid])
    assert time.monotonic() - t0 < AT_ONCE + signalling.OWNER_GRACE
    assert obeys.ended_by() == signal.SIGTERM


def test_an_unreaped_child_is_reaped_once_its_owner_had_the_chance(kids):
    k = kids(reaped=False)          # nobody waits for it: the stop must not leave a zombie behind
    t0 = time.monotonic()
    assert signalling.end([k.proc], None, grace=10.0) == [k.pid]
    took = time.monotonic() - t0
    assert signalling.OWNER_GRACE <= took < signalling.OWNER_GRACE + AT_ONCE
    assert state(k.pid) == "gone"
    with pytest.raises(ChildProcessError):
        os.waitpid(k.pid, os.WNOHANG)


def test_a_childs_exit_status_is_left_to_its_owner_within_the_owners_grace(kids):
    k = kids(reaped=False)
    got: list[int] = []

    def owner() -> None:        # a slow owner: sees the exit, reaps a little later (asyncio's loop)
        os.waitid(os.P_PID, k.pid, os.WEXITED | os.WNOWAIT)
        time.sleep(signalling.OWNER_GRACE / 5)
        got.append(os.waitstatus_to_exitcode(os.waitpid(k.pid, 0)[1]))

    t = threading.Thread(target=owner, daemon=True)
    t.start()
    t0 = time.monotonic()
    assert signalling.end([k.proc], None, grace=10.0) == [k.pid]
    took = time.monotonic() - t0
    t.join(10)
    assert got == [-signal.SIGTERM], "the owner got the exit status, not ECHILD"
    assert took < signalling.OWNER_GRACE, "the stop did not wait the whole grace once the owner had reaped"


def test_a_zombie_of_another_parent_is_neither_reaped_nor_waited_for(kids):
    parent = kids(argv=[SH, "-c", "sleep 60 & wait"], group=0)
    (grandchild,) = wait_until(lambda: children(parent.pid), "the grandchild")
    g = Proc.live(grandchild)
    assert g is not None
    os.kill(parent.pid, signal.SIGSTOP)          # its parent will not reap it for now
    try:
        t0 = time.monotonic()
        assert signalling.end([g], None, grace=10.0) == [grandchild]
        assert time.monotonic() - t0 < signalling.OWNER_GRACE, "waited for a zombie that is not ours to reap"
        assert state(grandchild) == "Z", "a zombie of another parent was reaped by the guard"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)
        os.kill(parent.pid, signal.SIGCONT)       # its shell reaps it and ends
    parent.ended_by()
    assert parent.popen.returncode == 0, "the shell ended on its own once it could reap"


def test_gone_processes_end_at_once_and_quietly(kids, way):
    r, z = reaped(kids), zombie(kids)
    stale = Proc(kids().pid, 1.0)
    t0 = time.monotonic()
    assert signalling.end([r.proc, stale], r.pid, grace=10.0) == []
    assert signalling.end([], None, grace=10.0) == []
    assert time.monotonic() - t0 < AT_ONCE
    assert signalling.end([z.proc], None, grace=10.0) == []        # a zombie is no target
    k = kids()
    assert signalling.end(iter([k.proc]), None, grace=10.0) == [k.pid]


# --- the stop in its own thread -----------------------------------------------------------------


def test_the_async_stop_runs_in_a_thread_of_its_own_and_returns_what_end_returns(kids):
    k, obeys = kids(record=True), kids()

    async def main():
        ticks = 0
        stop = asyncio.create_task(signalling.end_async(iter([k.proc, obeys.proc]), None, 0.3))
        threads: list[threading.Thread] = []
        while not stop.done():
            ticks += 1
            threads += [t for t in threading.enumerate() if t.name == "vllm-guard-stop"]
            await asyncio.sleep(0.01)
        return await stop, ticks, threads

    ended, ticks, threads = asyncio.run(asyncio.wait_for(main(), 20))
    assert ended == sorted([k.pid, obeys.pid])
    assert ticks >= 10, "the event loop kept running during the grace"
    assert threads and not any(t.daemon for t in threads), "the stop must not die with the guard's main thread"
    assert k.ended_by() == signal.SIGKILL and obeys.ended_by() == signal.SIGTERM


def test_an_async_stop_hands_its_failure_to_the_awaiting_coroutine():
    async def main():
        return await signalling.end_async([object()], None, 0.1)     # type: ignore[list-item]

    with pytest.raises(AttributeError):
        asyncio.run(asyncio.wait_for(main(), 20))


def test_an_async_stop_of_nothing_is_an_empty_list():
    assert asyncio.run(asyncio.wait_for(signalling.end_async([], None, 5.0), 20)) == []


def test_the_async_stop_takes_the_group_the_second_request_and_the_marker_scan(kids):
    leader = kids(record=True, group=0)
    unlisted = kids(group=leader.pid)              # reached only through the group
    extra = kids(record=True)                       # named only by the marker scan
    hurry = threading.Event()
    hurry.set()                                     # a second stop request: no grace

    async def main():
        return await signalling.end_async([leader.proc], leader.pid, 10.0, hurry, lambda: [extra.proc])

    t0 = time.monotonic()
    assert asyncio.run(asyncio.wait_for(main(), 5)) == sorted([leader.pid, unlisted.pid, extra.pid])
    assert time.monotonic() - t0 < AT_ONCE
    assert leader.ended_by() == signal.SIGKILL and extra.ended_by() == signal.SIGKILL
    assert unlisted.ended_by() == signal.SIGTERM


def test_a_stop_whose_event_loop_is_gone_still_ends_its_processes_quietly(kids, monkeypatch):
    # The guard's loop may end (an error, a second signal) while a stop runs: the stop finishes,
    # and its thread ends without an error of its own.
    k = kids(record=True)
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))

    async def main():
        asyncio.ensure_future(signalling.end_async([k.proc], None, 0.2))
        await asyncio.sleep(0.05)            # the stop is under way; the loop then closes

    asyncio.run(main())
    for t in threading.enumerate():
        if t.name == "vllm-guard-stop":
            t.join(10)
    assert k.ended_by() == signal.SIGKILL
    assert errors == []


def test_a_process_that_ends_late_in_a_long_grace_is_noticed_within_a_tenth_of_a_second(kids):
    k = kids(record=True)
    done: list[float] = []
    worker = threading.Thread(target=lambda: (signalling.end([k.proc], None, grace=30.0), done.append(
        time.monotonic())), daemon=True)
    worker.start()
    wait_until(lambda: signal.SIGTERM in k.pending(), "the SIGTERM")
    time.sleep(1.3)                    # well into the grace (the polls have reached their longest period)
    os.kill(k.pid, signal.SIGKILL)     # it ends (here by the test's hand)
    died = time.monotonic()
    worker.join(10)
    assert done and done[0] - died < 0.9, "the stop kept polling slowly or waited out the grace"


# --- a helper child, and clients that name a pid --------------------------------------------------


def test_a_helper_child_that_ran_past_its_time_gets_sigkill():
    p = subprocess.Popen([SLEEP, "60"], preexec_fn=_dies_with_us(record=True))
    try:
        signalling.kill_child(p)
        assert p.wait(10) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait(10)


def test_a_helper_child_already_reaped_is_left_alone_even_when_its_pid_was_taken(impostor):
    p = subprocess.Popen([SLEEP, "60"])
    p.kill()
    assert p.wait(10) == -signal.SIGKILL
    imp = impostor(p.pid, after=boottime())
    signalling.kill_child(p)
    assert imp.alive() and imp.signals() == []


def test_any_process_with_the_pid_counts_as_alive_for_a_client(kids, caught):
    # (As root, only processes of this test are asked: a probe that sent a real signal by mistake
    # must not reach anything else on the machine.)
    z = zombie(kids)
    assert signalling.pid_alive(os.getpid()) is True
    assert signalling.pid_alive(z.pid) is True
    for pid in (0, -1, free_pid()):
        assert signalling.pid_alive(pid) is False
    assert caught.got == []

    def as_nobody() -> int:
        _become_nobody()
        # another user's process answers kill(pid, 0) with EPERM: it exists (nobody can deliver
        # anything to root's processes, so asking pid 1 is safe here)
        code = 0 if signalling.pid_alive(os.getppid()) is True else 1
        code |= 0 if signalling.pid_alive(1) is True else 2
        return code | (0 if signalling.pid_alive(free_pid()) is False else 4)

    if os.geteuid() != 0:
        pytest.skip("becoming another user needs root")
    assert _forked(as_nobody) == 0


# --- dying with the guard -------------------------------------------------------------------------


def _deathsig() -> int:
    sig = ctypes.c_int(-1)
    assert _LIBC.prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) == 0
    return sig.value


def test_a_child_dies_with_the_thread_that_started_it():
    # The kernel sends the parent-death signal when the *thread* that forked the child ends.
    started: list[subprocess.Popen[bytes]] = []
    t = threading.Thread(target=lambda: started.append(
        subprocess.Popen([SLEEP, "60"], preexec_fn=signalling.die_with_parent)))
    t.start()
    t.join(10)
    try:
        assert started[0].wait(10) == -signal.SIGKILL
    finally:
        for p in started:
            p.kill()
            p.wait(10)


def test_die_with_parent_asks_the_kernel_for_sigkill_and_dies_at_once_if_the_parent_is_gone(monkeypatch):
    assert _deathsig() == 0
    try:
        for forker in (os.getppid(), 0):       # the pid that forked us, or none remembered
            monkeypatch.setattr(signalling, "_forking_pid", forker)
            signalling.die_with_parent()
            assert _deathsig() == signal.SIGKILL
            _LIBC.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
        monkeypatch.setattr(signalling, "_LIBC", None)
        signalling.die_with_parent()               # no prctl (not Linux): nothing asked, nothing done
        assert _deathsig() == 0
    finally:
        _LIBC.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    monkeypatch.undo()

    # A child whose parent died before it could ask: it ends itself, as the parent's death would.
    r, w = os.pipe()

    def middle() -> int:
        me = os.getpid()
        grandchild = os.fork()            # remembers this process as the one that forked it
        if grandchild == 0:
            code = 97
            try:
                deadline = time.monotonic() + 10
                while os.getppid() == me and time.monotonic() < deadline:
                    time.sleep(0.002)      # until the middle process is gone
                signalling.die_with_parent()
                code = 0
            finally:
                os._exit(code)
        os.write(w, str(grandchild).encode())
        return 0

    try:
        with pid_reuse.subreaper():        # the orphan comes to this process, which reads how it ended
            assert _forked(middle) == 0
            grandchild = int(os.read(r, 64).decode())
            ended = os.waitstatus_to_exitcode(os.waitpid(grandchild, 0)[1])
    except pid_reuse.Unavailable as e:
        pytest.skip(str(e))
    finally:
        os.close(r)
        os.close(w)
    assert ended == -signal.SIGKILL
