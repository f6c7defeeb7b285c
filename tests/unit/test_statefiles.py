"""supervisor.shell.statefiles, the one door to the disk, against real files: atomic writes, the checks
of open_state, the bounded logs kept open, the files a person names, and a real full disk."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import named_files
from supervisor.errors import ConfigError, StateError
from supervisor.shell import diskfaults, statelog
from supervisor.shell import statefiles as sf
from tests.fakes.planted import FOREIGN, KINDS, can_plant, plant

# --- atomic writes --------------------------------------------------------------------------


def test_atomic_write_replaces_whole_with_mode_and_no_leftovers(tmp_path):
    target = tmp_path / "f.json"
    sf.atomic_write(target, "old", mode=0o644)
    sf.atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_atomic_write_failure_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "f"
    sf.atomic_write(target, "old")
    with pytest.raises(TypeError):
        sf.atomic_write(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_readers_never_see_a_partial_write(tmp_path):
    target = tmp_path / "f"
    a, b = b"a" * 300_000, b"b" * 200_000
    sf.atomic_write(target, a)
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(target.read_bytes())

    t = threading.Thread(target=reader)
    t.start()
    for i in range(100):
        sf.atomic_write(target, a if i % 2 else b)
    stop.set()
    t.join()
    assert seen <= {a, b} and seen


def test_read_json_missing_is_none_and_broken_is_a_clear_error(tmp_path):
    assert sf.read_json(tmp_path / "nope.json") is None
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(StateError, match="bad.json is not valid JSON"):
        sf.read_json(tmp_path / "bad.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StateError, match="deep.json is not valid JSON"):
        sf.read_json(tmp_path / "deep.json")


def test_temporary_files_have_names_nobody_can_plant_at(tmp_path):
    # The token's temporary file was .token.<pid>.tmp: a link planted there for every pid is now never used.
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    for pid in range(max(1, os.getpid() - 50), os.getpid() + 50):
        (d / f".token.{pid}.tmp").symlink_to(victim)
    before = set(os.listdir(d))
    sf.write_secret_file(d / "token", "s3cret-token\n")
    assert victim.read_text() == "root's file\n"
    assert (d / "token").read_text() == "s3cret-token\n" and stat.S_IMODE((d / "token").stat().st_mode) == 0o600
    assert set(os.listdir(d)) - before == {"token"}            # no temporary left behind


def test_the_door_never_truncates_and_exclusive_means_exclusive(tmp_path):
    path = tmp_path / "f"
    path.write_text("keep")
    with pytest.raises(ValueError):
        sf.open_state(path, os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(FileExistsError):
        sf.open_state(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert path.read_text() == "keep"
    fd = sf.open_state(path, os.O_RDONLY)
    try:
        assert os.get_inheritable(fd) is False            # O_CLOEXEC: vLLM never inherits a state file
        assert os.read(fd, 10) == b"keep"
    finally:
        os.close(fd)


# --- the door, as a class: every planted object -----------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_is_told_at_once_and_changes_nothing(tmp_path, kind):
    if can_plant(kind):
        pytest.skip(can_plant(kind))
    p = plant(tmp_path / "state.json", kind, tmp_path / "victims")
    t0 = time.monotonic()
    if kind in FOREIGN or kind == "over_cap":
        with pytest.raises(StateError):
            sf.read_bytes(p.path)
        assert statelog.open_follow(p.path) is None
        assert list(statelog.read_lines(p.path)) == []
    else:
        assert sf.read_bytes(p.path) is not None
    assert time.monotonic() - t0 < 1
    assert os.path.lexists(p.path) and p.untouched() == ""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_sets_aside_what_is_not_its_file_and_makes_it_anew(tmp_path, kind):
    if can_plant(kind):
        pytest.skip(can_plant(kind))
    p = plant(tmp_path / "vllm.log", kind, tmp_path / "victims")
    log = statelog.AppendLog(p.path, 1 << 20)
    log.write(b"INFO a line the guard keeps")
    assert log.flush()
    log.close()
    st_ = os.lstat(p.path)
    assert stat.S_ISREG(st_.st_mode) and st_.st_nlink == 1 and st_.st_uid == os.geteuid()
    assert p.path.read_bytes().endswith(b"INFO a line the guard keeps\n")
    assert p.untouched() == ""
    if kind in FOREIGN and kind != "hardlink":
        assert list(tmp_path.glob("vllm.log.corrupt-*"))         # set aside, not lost
    if kind == "hardlink":
        assert not list(tmp_path.glob("vllm.log.corrupt-*"))     # that name only is removed


def test_tightening_a_dir_others_could_write_sets_aside_what_they_left(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make files owned by another user")
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    (d / "vllm.log").write_text("planted\n")
    os.chown(d / "vllm.log", 65534, 65534)
    (d / "history.jsonl").write_text("ours\n")
    sf.ensure_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert not (d / "vllm.log").exists() and [p.read_text() for p in d.glob("vllm.log.corrupt-*")] == ["planted\n"]
    assert (d / "history.jsonl").read_text() == "ours\n"


# --- bounded logs ---------------------------------------------------------------------------


def test_a_kept_log_rotates_at_its_size_and_reads_back_whole(tmp_path):
    path = tmp_path / "vllm.log"
    log = statelog.AppendLog(path, 1000)
    lines = [f"line {i:04d} {'x' * 40}".encode() for i in range(200)]
    for line in lines:
        log.write(line)
        if len(line) % 3 == 0:
            log.flush()
    log.close()
    assert path.stat().st_size <= 1000 and (tmp_path / "vllm.log.1").stat().st_size <= 1000
    kept = list(statelog.read_lines(path))
    assert kept == lines[-len(kept):] and len(kept) >= 1000 // 50       # the newest, whole, in order


def test_a_kept_log_follows_its_name_when_someone_moves_the_file(tmp_path):
    path = tmp_path / "vllm.log"
    log = statelog.AppendLog(path, 1 << 20)
    log.write(b"first")
    log.flush()
    path.rename(tmp_path / "moved")                # e.g. logrotate, or a person
    path.symlink_to(tmp_path / "moved")            # and a link in its place
    log.write(b"second")
    log.flush()
    log.close()
    assert (tmp_path / "moved").read_bytes() == b"first\n"
    assert path.read_bytes() == b"second\n" and not path.is_symlink()


def test_disk_faults_are_logged_once_per_file():
    from structlog.testing import capture_logs

    faults = diskfaults.Faults()
    with capture_logs() as logs:
        for _ in range(5):
            faults.failed("/state/vllm.log", OSError(errno.ENOSPC, "No space left on device"))
        faults.failed("/state/history.jsonl", OSError(errno.EIO, "Input/output error"))
        faults.ok("/state/vllm.log")
        faults.ok("/state/vllm.log")
    texts = [e["event"] for e in logs]
    assert texts == ["cannot write /state/vllm.log (No space left on device); the guard goes on without it and tries "
                     "again later",
                     "cannot write /state/history.jsonl (Input/output error); the guard goes on without it and tries "
                     "again later",
                     "/state/vllm.log can be written again"]
    assert faults.failing() == {"/state/history.jsonl": "Input/output error"}


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (root only: mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_keeps_the_newest_lines_and_the_log_comes_back_once_it_has_room(small_disk):
    path = small_disk / "vllm.log"
    log = statelog.AppendLog(path, 8 << 20, retry_s=0.0, keep_while_failing=4096)
    log.write(b"before the disk filled")
    assert log.flush()
    filler = _fill(small_disk)
    for i in range(2000):
        log.write(f"while full {i:05d} {'y' * 60}".encode())
        log.flush()                                # refused: kept in memory (bounded), never raises
    assert log.pending <= 4096 + 100
    assert str(path) in diskfaults.FAULTS.failing()
    filler.unlink()
    log.write(b"after the disk had room again")
    assert log.flush()
    log.close()
    kept = path.read_bytes().splitlines()
    assert kept[0] == b"before the disk filled" and kept[-1] == b"after the disk had room again"
    assert any(b"bytes were not kept here" in line for line in kept)
    assert kept[-2].startswith(b"while full 01999")      # the newest of what the disk refused, kept
    assert all(line.startswith((b"before", b"while full", b"after", b"===")) for line in kept), kept[:5]
    assert str(path) not in diskfaults.FAULTS.failing()


def test_a_full_disk_is_an_oserror_for_an_atomic_write_and_the_old_file_stays(small_disk):
    target = small_disk / "guard.json"
    sf.atomic_write(target, b'{"pid": 1}')
    _fill(small_disk)
    with pytest.raises(OSError) as e:
        sf.atomic_write(target, b"x" * 100_000)
    assert e.value.errno == errno.ENOSPC
    assert target.read_bytes() == b'{"pid": 1}'
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "guard.json"]


# --- files a person names ---------------------------------------------------------------------


def test_a_named_file_may_be_a_link_but_only_to_a_bounded_regular_file(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("model = 'm'\n")
    (tmp_path / "link.toml").symlink_to(real)
    assert named_files.read_named_file(str(tmp_path / "link.toml"), "config file", 100, "100 bytes") == b"model = 'm'\n"
    os.mkfifo(tmp_path / "fifo")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="fifo is not a regular file"):
        named_files.read_named_file(str(tmp_path / "fifo"), "config file", 100, "100 bytes")
    assert time.monotonic() - t0 < 1
    with pytest.raises(ConfigError, match="is not a regular file"):
        named_files.read_named_file("/dev/zero", "token file", 100, "100 bytes")
    with pytest.raises(ConfigError, match="larger than 4 bytes"):
        named_files.read_named_file(str(real), "token file", 4, "4 bytes")
    with pytest.raises(ConfigError, match="does not exist"):
        named_files.read_named_file(str(tmp_path / "nope"), "config file", 100, "100 bytes")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=3000), limit=st.integers(0, 2000))
def test_a_named_file_is_read_whole_or_refused_never_cut(tmp_path, data, limit):
    path = tmp_path / "named"
    path.write_bytes(data)
    try:
        got = named_files.read_named_file(str(path), "config file", limit, f"{limit} bytes")
    except ConfigError as e:
        assert len(data) > limit and "larger than" in str(e)
    else:
        assert got == data and len(data) <= limit
