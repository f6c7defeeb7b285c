"""The door's rules, one by one, each with the exact words and values it promises (the threat and the
rule are in supervisor/shell/statefiles.py's docstring): what it says about what it found, the modes
it makes files and dirs with, the bounds, the names it sets things aside under, and what happens when
the name changes between its look (``lstat``) and its open, the race the door exists for.

The race is made by the test's own ``lstat`` for one name, which reports what was there a moment ago
(the machine's state changes between the look and the open); everything else is real files as root."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from supervisor.errors import StateError, UnsafeDir
from supervisor.shell import statefiles as sf

NOBODY = 65534
STAMP = r"\d{8}T\d{12}Z"            # the set-aside time: UTC, %Y%m%dT%H%M%S%fZ

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files owned by another user")


def _stale_lstat(monkeypatch, path: Path, seen):
    """The door's first look at ``path`` reports ``seen`` (a stat result, or FileNotFoundError) — what was
    there a moment before — and every later look sees the real object."""
    real = os.lstat
    left = [1]

    def lstat(p, *a, **kw):
        if Path(p) == path and left[0]:
            left[0] -= 1
            if isinstance(seen, BaseException):
                raise seen
            return seen
        return real(p, *a, **kw)

    monkeypatch.setattr(sf.os, "lstat", lstat)


def _regular_of_ours(tmp_path: Path) -> os.stat_result:
    f = tmp_path / "a-regular-file"
    f.write_bytes(b"x")
    return os.stat(f)


# --- what the door says -----------------------------------------------------------------------


@pytest.mark.parametrize(("cap", "size", "words"), [
    (100, 101, "larger than 100 bytes"),
    ((1 << 20) - 1, 1 << 20, "larger than 1048575 bytes"),
    (1 << 20, (1 << 20) + 1, "larger than 1 MiB"),
    (3 << 20, (3 << 20) + 1, "larger than 3 MiB"),
])
def test_a_file_over_the_cap_is_refused_in_words_and_one_at_the_cap_is_read(tmp_path, cap, size, words):
    p = tmp_path / "state.json"
    with open(p, "wb") as f:
        f.truncate(cap)
    fd = sf.open_state(p, cap=cap)
    os.close(fd)
    with open(p, "wb") as f:
        f.truncate(size)
    with pytest.raises(StateError) as e:
        sf.open_state(p, cap=cap)
    assert str(e.value) == f"{p} is {words}; not using it"


def test_what_a_reader_finds_is_named_exactly(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one = tmp_path / "one"
    one.write_text("x")
    two = tmp_path / "two"
    os.link(one, two)
    link = tmp_path / "link"
    link.symlink_to(one)
    for path, words in ((d, "a directory"), (fifo, "a FIFO"), (two, "a hard link (2 names for one file)"),
                        (link, "a symbolic link")):
        with pytest.raises(StateError) as e:
            sf.open_state(path)
        assert str(e.value) == f"{path} is {words}; not using it"


@needs_root
def test_another_users_file_is_named_by_its_uid(tmp_path):
    p = tmp_path / "learned.json"
    p.write_text("{}")
    os.chown(p, NOBODY, NOBODY)
    with pytest.raises(StateError) as e:
        sf.read_json(p)
    assert str(e.value) == f"{p} is a file of uid {NOBODY}; not using it"


def test_an_absent_file_is_the_oss_own_file_not_found(tmp_path):
    p = tmp_path / "absent"
    with pytest.raises(FileNotFoundError) as e:
        sf.open_state(p)
    assert (e.value.errno, e.value.strerror, e.value.filename) == (errno.ENOENT, "no such file", str(p))


def test_a_taken_name_is_the_oss_own_file_exists(tmp_path):
    p = tmp_path / "taken"
    p.write_text("x")
    with pytest.raises(FileExistsError) as e:
        sf.open_state(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert (e.value.errno, e.value.strerror, e.value.filename) == (errno.EEXIST, "file exists", str(p))


def test_truncating_through_the_door_is_refused_saying_how_to_cut(tmp_path):
    with pytest.raises(ValueError) as e:
        sf.open_state(tmp_path / "x", os.O_WRONLY | os.O_TRUNC)
    assert str(e.value) == "open_state never truncates before it has checked the file: ftruncate after"


def test_a_file_the_door_makes_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        fd = sf.open_state(tmp_path / "made", os.O_WRONLY | os.O_CREAT)
        os.close(fd)
        fd = sf.open_state(tmp_path / "made-0640", os.O_WRONLY | os.O_CREAT, 0o640)
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "made").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "made-0640").st_mode) == 0o640


def test_a_fifo_is_never_opened_so_a_writer_waiting_on_it_stays_waiting(tmp_path):
    # "It looks before it opens, so a FIFO is not even opened": opening its read end would let a writer
    # blocked in open(2) go on. The writer here must still be waiting after the door has refused it.
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_WRONLY)       # blocks until someone opens the read end
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(0.05)      # the writer is usually in its open by now; if not, the door is only checked less sharply
    with pytest.raises(StateError):
        sf.open_state(fifo)
    assert not opened.wait(0.3), "the door opened the FIFO"
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # release the writer
    assert opened.wait(5)
    os.close(fd)


# --- the race between the look and the open ---------------------------------------------------


def test_a_fifo_swapped_in_after_the_look_is_refused_by_what_was_opened(tmp_path, monkeypatch):
    fifo = tmp_path / "history.jsonl"
    os.mkfifo(fifo)
    _stale_lstat(monkeypatch, fifo, _regular_of_ours(tmp_path))
    with pytest.raises(StateError) as e:
        sf.open_state(fifo)
    assert str(e.value) == f"{fifo} is a FIFO; not using it"


@pytest.mark.parametrize(("kind", "flags", "words"), [
    ("symlink", os.O_RDONLY, "a symbolic link"),
    ("fifo", os.O_WRONLY, "a FIFO or a socket"),
    ("directory", os.O_WRONLY, "a directory"),
])
def test_what_is_swapped_in_after_the_look_is_named_from_the_open_itself(tmp_path, monkeypatch, kind, flags, words):
    p = tmp_path / "launch.json"
    if kind == "symlink":
        (tmp_path / "victim").write_text("root's")
        p.symlink_to(tmp_path / "victim")
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    _stale_lstat(monkeypatch, p, _regular_of_ours(tmp_path))
    with pytest.raises(StateError) as e:
        sf.open_state(p, flags)
    assert str(e.value) == f"{p} is {words}; not using it"


def test_a_file_made_meanwhile_is_opened_not_refused(tmp_path, monkeypatch):
    p = tmp_path / "guard.json"
    p.write_text("made by the other opener")
    _stale_lstat(monkeypatch, p, FileNotFoundError(errno.ENOENT, "gone"))
    fd = sf.open_state(p, os.O_RDWR | os.O_CREAT)
    try:
        assert os.read(fd, 100) == b"made by the other opener"
    finally:
        os.close(fd)


def test_a_symlink_planted_after_a_look_that_saw_nothing_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("root's precious file")
    p = tmp_path / "vllm.log"
    p.symlink_to(victim)
    _stale_lstat(monkeypatch, p, FileNotFoundError(errno.ENOENT, "not yet"))
    fd = sf.open_state(p, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"the guard's line\n")
    os.close(fd)
    assert victim.read_text() == "root's precious file"
    assert p.read_text() == "the guard's line\n" and not p.is_symlink()


def test_a_file_gone_after_the_look_is_absent_for_a_reader(tmp_path, monkeypatch):
    p = tmp_path / "absent"
    _stale_lstat(monkeypatch, p, _regular_of_ours(tmp_path))
    with pytest.raises(FileNotFoundError):
        sf.open_state(p)


def test_a_name_that_keeps_changing_is_refused_after_three_looks(tmp_path, monkeypatch):
    p = tmp_path / "absent"
    seen = _regular_of_ours(tmp_path)
    monkeypatch.setattr(sf.os, "lstat", lambda q, *a, **kw: seen if Path(q) == p else os.stat(q, follow_symlinks=False))
    with pytest.raises(StateError) as e:
        sf.open_state(p)
    assert str(e.value) == f"{p} keeps being replaced while the guard opens it; refusing to use it"


# --- setting aside ----------------------------------------------------------------------------


def test_what_is_set_aside_is_renamed_with_the_utc_time_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "America/Los_Angeles")      # the stamp is UTC whatever the local zone
    time.tzset()
    try:
        p = tmp_path / "learned.json"
        p.write_text("corrupt")
        said: list[str] = []
        before = time.time()
        aside = sf.set_aside(p, f"{p} was not JSON", said.append)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert aside is not None and re.fullmatch(r"learned\.json\.corrupt-" + STAMP, aside.name)
    stamp = time.strptime(aside.name.rsplit("-", 1)[1][:15], "%Y%m%dT%H%M%S")
    assert abs((time.mktime(stamp) - time.timezone) - before) < 5        # UTC, not Los Angeles' time
    assert aside.read_text() == "corrupt" and not p.exists()
    assert said == [f"{p} was not JSON; moved it to {aside}"]


def test_setting_aside_twice_in_one_instant_keeps_both(tmp_path, monkeypatch):
    monkeypatch.setattr(sf, "_now_stamp", lambda: "20261201T120000000000Z")    # the clock stands still
    p = tmp_path / "launch.json"
    names = []
    for n in range(3):
        p.write_text(f"copy {n}")
        aside = sf.set_aside(p, "corrupt", lambda _m: None)
        assert aside is not None
        names.append(aside.name)
    assert names == ["launch.json.corrupt-20261201T120000000000Z", "launch.json.corrupt-20261201T120000000000Z-1",
                     "launch.json.corrupt-20261201T120000000000Z-2"]
    assert [(tmp_path / n).read_text() for n in names] == ["copy 0", "copy 1", "copy 2"]


def test_setting_aside_nothing_moves_nothing(tmp_path):
    assert sf.set_aside(tmp_path / "absent", "x", lambda _m: None) is None


def test_a_hard_link_found_by_a_writer_loses_that_name_only_and_says_so(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("someone's")
    p = tmp_path / "history.jsonl"
    os.link(victim, p)
    with capture_logs() as logs:
        fd = sf.open_state(p, os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    assert victim.read_text() == "someone's" and os.stat(victim).st_nlink == 1
    assert [e["event"] for e in logs] == [
        f"{p} was a hard link (2 names for one file); removed that name (the file it also names is untouched)"]


def test_a_writer_says_what_it_set_aside(tmp_path):
    p = tmp_path / "vllm.log"
    os.mkfifo(p)
    with capture_logs() as logs:
        fd = sf.open_state(p, os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    [aside] = tmp_path.glob("vllm.log.corrupt-*")
    assert [e["event"] for e in logs] == [f"{p} was a FIFO; moved it to {aside}"]


# --- atomic writes ----------------------------------------------------------------------------


def test_an_atomic_write_onto_a_link_sets_the_link_aside_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's")
    p = tmp_path / "guard.json"
    p.symlink_to(victim)
    with capture_logs() as logs:
        sf.atomic_write(p, "new")
    [aside] = tmp_path.glob("guard.json.corrupt-*")
    assert aside.is_symlink() and os.readlink(aside) == str(victim)
    assert victim.read_text() == "root's" and p.read_text() == "new" and not p.is_symlink()
    assert [e["event"] for e in logs] == [f"{p} was a symbolic link; moved it to {aside}"]


@needs_root
def test_an_atomic_write_onto_another_users_file_keeps_that_file_aside(tmp_path):
    p = tmp_path / "learned.json"
    p.write_text("theirs")
    os.chown(p, NOBODY, NOBODY)
    sf.atomic_write(p, "ours")
    [aside] = tmp_path.glob("learned.json.corrupt-*")
    assert aside.read_text() == "theirs" and os.stat(aside).st_uid == NOBODY
    assert p.read_text() == "ours" and os.stat(p).st_uid == os.geteuid()


def test_an_atomic_write_is_0600_by_default(tmp_path):
    sf.atomic_write(tmp_path / "f", b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o600


def test_an_atomic_write_of_something_else_says_what_it_takes(tmp_path):
    with pytest.raises(TypeError, match=r"^atomic_write takes bytes or str, not int$"):
        sf.atomic_write(tmp_path / "f", 12345)  # type: ignore[arg-type]


def test_write_json_writes_sorted_indented_json_with_a_final_newline(tmp_path):
    p = tmp_path / "learned.json"
    sf.write_json(p, {"b": 1, "a": [1, "é"]})
    assert p.read_bytes() == b'{\n  "a": [\n    1,\n    "\\u00e9"\n  ],\n  "b": 1\n}\n'
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    sf.write_json(p, [], 0o644)
    assert p.read_bytes() == b"[]\n" and stat.S_IMODE(os.stat(p).st_mode) == 0o644


def test_a_secret_file_is_written_0600_in_a_dir_made_0700(tmp_path):
    p = tmp_path / "state" / "token"
    sf.write_secret_file(p, "s3cr\u00e9t")
    assert p.read_bytes() == "s3cr\u00e9t".encode()
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(p.parent).st_mode) == 0o700


# --- reading whole files ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3 << 20])
def test_a_file_exactly_at_its_limit_is_read_whole(tmp_path, size):
    p = tmp_path / "f"
    data = os.urandom(size)
    p.write_bytes(data)
    assert sf.read_bytes(p, limit=size) == data
    assert sf.read_bytes(p) == data


def test_read_json_reads_what_write_json_wrote_and_names_a_broken_file(tmp_path):
    p = tmp_path / "launch.json"
    p.write_text('{"argv": ["vllm", "serve"], "n": 1}')
    assert sf.read_json(p) == {"argv": ["vllm", "serve"], "n": 1}
    p.write_text("x" * 300)
    with pytest.raises(StateError) as e:
        sf.read_json(p)
    assert str(e.value) == f"{p} is not valid JSON (Expecting value: line 1 column 1 (char 0))"


def test_reading_something_the_door_cannot_open_names_the_file_and_why(tmp_path):
    (tmp_path / "f").write_text("x")
    p = tmp_path / "f" / "inside"                   # a file as a directory: ENOTDIR, even for root
    with pytest.raises(StateError) as e:
        sf.read_bytes(p)
    assert str(e.value) == f"cannot read {p}: Not a directory"


def test_removing_an_absent_file_is_fine_and_a_link_loses_only_its_name(tmp_path):
    sf.remove(tmp_path / "absent")
    (tmp_path / "victim").write_text("kept")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    sf.remove(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and (tmp_path / "victim").read_text() == "kept"


def test_the_temp_root_is_the_machines_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert sf.temp_root() == tmp_path


# --- the state dir ----------------------------------------------------------------------------


def test_a_missing_state_dir_is_made_with_its_parents_0700(tmp_path):
    old = os.umask(0o022)
    try:
        got = sf.ensure_dir(tmp_path / "a" / "b" / "state")
    finally:
        os.umask(old)
    assert got == tmp_path / "a" / "b" / "state"
    assert stat.S_IMODE(os.stat(got).st_mode) == 0o700


def test_a_state_dir_of_ours_that_only_others_may_enter_is_left_as_it_is(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o711)                       # others may enter, not write: nothing to tighten
    (d / "f").write_text("x")
    sf.ensure_dir(d)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o711 and (d / "f").exists()


def test_a_state_dir_through_our_own_symlink_is_used(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    assert sf.ensure_dir(tmp_path / "via") == tmp_path / "via"


def test_a_state_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UnsafeDir) as e:
        sf.ensure_dir(tmp_path / "f")
    assert str(e.value) == f"the state dir {tmp_path / 'f'} is not a directory"


@needs_root
def test_a_symlink_another_user_made_as_the_state_dir_is_never_followed(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    link = tmp_path / "via"
    link.symlink_to(tmp_path / "real")
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UnsafeDir) as e:
        sf.ensure_dir(link)
    assert str(e.value) == (f"the state dir {link} is a symbolic link made by uid {NOBODY}; refusing to follow it "
                            "(give the guard a directory of its own)")


@needs_root
@pytest.mark.parametrize(("mode", "others"), [(0o755, ""), (0o700, ""), (0o777, " and others can write it"),
                                              (0o720, " and others can write it")])
def test_another_users_state_dir_is_refused_saying_why(tmp_path, mode, others):
    d = tmp_path / "theirs"
    d.mkdir()
    d.chmod(mode)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(UnsafeDir) as e:
        sf.ensure_dir(d)
    assert str(e.value) == (f"the state dir {d} belongs to uid {NOBODY}{others}; another user could plant links "
                            "there that this guard would follow: give it a directory of its own (chown it, or "
                            "--state-dir)")


@needs_root
def test_tightening_a_dir_judges_each_entry_by_its_own_owner_not_its_target(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    (d / "theirs").write_text("their file")
    os.chown(d / "theirs", NOBODY, NOBODY)
    (d / "our-link-to-theirs").symlink_to(d / "theirs")           # ours, though what it names is not
    (tmp_path / "ours").write_text("x")
    (d / "their-link").symlink_to(tmp_path / "ours")
    os.chown(d / "their-link", NOBODY, NOBODY, follow_symlinks=False)
    with capture_logs() as logs:
        sf.ensure_dir(d)
    left = sorted(p.name for p in d.iterdir())
    assert "our-link-to-theirs" in left and "theirs" not in left and "their-link" not in left
    assert len([n for n in left if n.startswith("theirs.corrupt-")]) == 1
    assert len([n for n in left if n.startswith("their-link.corrupt-")]) == 1
    events = [e["event"] for e in logs]
    assert events[0] == f"the state dir {d} was writable by other users; made it private (0700)"
    assert any(e.startswith(f"{d / 'theirs'} was made by another user while others could write {d}; moved it to ")
               for e in events), events


@needs_root
def test_only_the_guards_user_or_root_is_trusted_not_any_system_user(tmp_path):
    p = tmp_path / "guard.json"
    p.write_text("{}")
    os.chown(p, 1, 1)                             # uid 1 (daemon on most systems): neither us nor root
    with pytest.raises(StateError) as e:
        sf.read_json(p)
    assert str(e.value) == f"{p} is a file of uid 1; not using it"


def test_a_file_whose_size_the_kernel_does_not_say_is_read_no_further_than_its_limit():
    # /proc/self/status is a regular file of one link, root's, that fstat calls 0 bytes long, yet it reads
    # as ~1 KiB: like a state file that grows after the door's check, the read itself must stop at the limit.
    if os.geteuid() != 0:
        pytest.skip("needs root: /proc/self/status is root's only for root")
    with pytest.raises(StateError) as e:
        sf.read_bytes("/proc/self/status", limit=100)
    assert str(e.value) == "/proc/self/status is larger than 100 bytes"
    assert sf.read_bytes("/proc/self/status", limit=1 << 20).startswith(b"Name:")


def test_what_cannot_be_renamed_aside_is_removed_and_said(tmp_path):
    # A name so long that "<name>.corrupt-<time>" passes NAME_MAX (255): the rename fails (ENAMETOOLONG).
    p = tmp_path / ("x" * 240)
    p.write_text("corrupt")
    said: list[str] = []
    assert sf.set_aside(p, "it was corrupt", said.append) is None
    assert not os.path.lexists(p)
    assert said == ["it was corrupt; could not move it aside (File name too long); removed it"]


def test_what_can_be_neither_renamed_nor_removed_is_refused_saying_so(tmp_path):
    p = tmp_path / ("d" * 240)
    p.mkdir()
    (p / "inside").write_text("x")                # a directory: unlink(2) refuses it
    said: list[str] = []
    with pytest.raises(StateError) as e:
        sf.set_aside(p, "it was a directory", said.append)
    assert str(e.value) == "it was a directory; could not move it aside (File name too long): move it away"
    assert said == ["it was a directory; could not move it aside (File name too long) nor remove it"]
    assert (p / "inside").read_text() == "x"


@needs_root
def test_a_state_dir_of_a_system_user_is_refused_like_anyone_elses(tmp_path):
    d = tmp_path / "daemons"
    d.mkdir()
    d.chmod(0o755)
    os.chown(d, 1, 1)                             # uid 1: not the guard's user, not root
    with pytest.raises(UnsafeDir, match=r"belongs to uid 1; another user could plant links"):
        sf.ensure_dir(d)


# --- issue 24: what the door does where only one of its checks tells (each kills a surviving mutant) ----


def test_an_atomic_write_onto_a_hard_link_drops_that_name_and_leaves_no_second_one(tmp_path):
    # The door's rule for a hard link holds for a rename too: unlink the name (the other file loses only
    # this name), never set it aside, which would keep a second name of someone else's file in the dir.
    victim = tmp_path / "elsewhere"
    victim.write_text("someone's")
    p = tmp_path / "guard.json"
    os.link(victim, p)
    with capture_logs() as logs:
        sf.atomic_write(p, "ours")
    assert p.read_text() == "ours" and os.stat(p).st_nlink == 1
    assert victim.read_text() == "someone's" and os.stat(victim).st_nlink == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == ["elsewhere", "guard.json"]
    assert [e["event"] for e in logs] == [
        f"{p} was a hard link (2 names for one file); removed that name (the file it also names is untouched)"]


def test_a_hard_link_made_between_the_look_and_the_open_loses_that_name_only(tmp_path, monkeypatch):
    # The look saw one file of one name; by the open someone has linked it elsewhere: what was opened says
    # two names, and a writer removes this one (the file itself, under its other name, is untouched).
    victim = tmp_path / "elsewhere"
    victim.write_text("someone's")
    p = tmp_path / "history.jsonl"
    os.link(victim, p)
    _stale_lstat(monkeypatch, p, _regular_of_ours(tmp_path))
    with capture_logs() as logs:
        fd = sf.open_state(p, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"the guard's line\n")
    os.close(fd)
    assert p.read_text() == "the guard's line\n" and os.stat(p).st_nlink == 1
    assert victim.read_text() == "someone's" and os.stat(victim).st_nlink == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a-regular-file", "elsewhere", "history.jsonl"]
    assert [e["event"] for e in logs] == [
        f"{p} was a hard link (2 names for one file); removed that name (the file it also names is untouched)"]


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_disk_error_on_the_look_at_what_was_opened_is_an_oserror_and_leaks_no_descriptor(tmp_path, monkeypatch):
    # A fault of the disk is an OSError from the door (the callers' best effort, diskfaults.FAULTS, catches
    # OSError) and the descriptor it had opened is closed. fstat failing (EIO on a failing disk) is made by
    # the test: the machine's disk does not fail on cue.
    p = tmp_path / "guard.json"
    p.write_text("{}")
    real = os.fstat

    def fstat(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == str(p):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    before = _fds()
    monkeypatch.setattr(sf.os, "fstat", fstat)
    with pytest.raises(OSError) as e:
        sf.open_state(p)
    monkeypatch.undo()
    assert type(e.value) is OSError and e.value.errno == errno.EIO
    assert _fds() == before


def test_a_file_that_fails_while_it_is_read_is_named_with_the_systems_reason():
    # /proc/self/mem is a regular file of one link, the reader's own (root's for root), 0 bytes by fstat:
    # the door lets it through, and reading it at offset 0 (unmapped) fails with EIO, as a failing disk does.
    with pytest.raises(StateError) as e:
        sf.read_bytes("/proc/self/mem")
    assert str(e.value) == "cannot read /proc/self/mem: Input/output error"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 3000), limit=st.integers(0, 2000))
def test_a_file_over_the_limit_it_is_read_with_is_refused_by_the_door_in_its_words(tmp_path, size, limit):
    # The limit is the door's cap: the file is judged by its size before a byte is read, in the door's words.
    p = tmp_path / "state.json"
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    p.write_bytes(data)
    if size <= limit:
        assert sf.read_bytes(p, limit=limit) == data
    else:
        with pytest.raises(StateError) as e:
            sf.read_bytes(p, limit=limit)
        assert str(e.value) == f"{p} is larger than {limit} bytes; not using it"


def test_a_limit_above_the_default_cap_reads_a_file_that_large(tmp_path):
    p = tmp_path / "big"
    data = os.urandom((16 << 20) + 1)              # one byte over the 16 MiB default cap
    p.write_bytes(data)
    assert sf.read_bytes(p, limit=17 << 20) == data
    with pytest.raises(StateError) as e:
        sf.read_bytes(p)
    assert str(e.value) == f"{p} is larger than 16 MiB; not using it"


def _ensure_dir_as(uid: int, path: Path) -> str:
    """ensure_dir(path) in a child process running as ``uid`` (a guard started by that user): "ok", or the
    UnsafeDir's message."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: never back into pytest
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            try:
                sf.ensure_dir(path)
                out = "ok"
            except UnsafeDir as e:
                out = str(e)
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@needs_root
@pytest.mark.parametrize(("mode", "others"), [(0o755, None), (0o711, None), (0o700, None),
                                              (0o775, " and others can write it"), (0o757, " and others can write it")])
def test_a_guard_not_run_as_root_uses_roots_state_dir_only_when_no_one_else_can_write_it(mode, others):
    # Root is trusted like the guard's own user: a dir of root's that group and others cannot write holds
    # nothing another user planted, so a guard of NOBODY's may use it; one they can write is refused.
    base = Path(tempfile.mkdtemp(prefix="vg-rootdir-"))
    try:
        base.chmod(0o755)                           # NOBODY can reach the state dir inside
        d = base / "state"
        d.mkdir()
        d.chmod(mode)
        assert os.stat(d).st_uid == 0
        if others is None:                          # root's own guard uses it as it is (and the call is seen
            assert sf.ensure_dir(d) == d            # here, not only in the child, by mutmut's coverage)
        got = _ensure_dir_as(NOBODY, d)
        if others is None:
            assert got == "ok"
        else:
            assert got == (f"the state dir {d} belongs to uid 0{others}; another user could plant links there that "
                           "this guard would follow: give it a directory of its own (chown it, or --state-dir)")
        assert stat.S_IMODE(os.stat(d).st_mode) == mode        # another user's dir is never chmodded
    finally:
        shutil.rmtree(base)
