"""The one door to the disk: every file the guard or its clients open in a state dir is opened here
(``tests/unit/test_chokepoints.py`` keeps it so).

The threat (docs/threat-model.md, "The disk"): the guard runs as root; its state dir may have been
writable by others before it was made private, and anything can sit at a state file's name: a
symbolic or hard link to a file of root's, a FIFO (an ``open`` waits for a writer forever), a socket,
a device, a directory, another user's file, random bytes, a file too large to read. And the disk
itself fails: it fills up, it returns I/O errors, it is remounted read-only.

The rules:

* :func:`open_state` is the door. It looks (``lstat``) before it opens, so a FIFO or a device is not
  even opened; it opens with ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC``, so a link is never followed, a
  FIFO swapped in meanwhile never blocks, and vLLM never inherits the descriptor; then it checks what
  it opened (``fstat``): only a **regular file with one link, owned by the guard's user or root,
  within the size cap** is used. ``O_TRUNC`` is refused: a file is cut only after that check.
* Whatever else is found at a name the guard writes is **set aside** (renamed
  ``<name>.corrupt-<time>``: nothing is lost, a person can see what was there), a hard link is
  **removed** instead (unlinking drops only that name; keeping it would keep a second name of someone
  else's file in the state dir), and the file is made anew with ``O_EXCL``. A reader is told
  (:class:`StateError`) and the file is left as it is.
* Files are replaced atomically (:func:`atomic_write`): a temporary file with an unpredictable name
  made with ``O_EXCL``, then ``rename``, which replaces a link itself, never its target.
* A state dir is the guard's alone (:func:`ensure_dir`): one another user owns or can write is
  refused; one of ours that others could write is made 0700 and every entry in it that is not ours
  is set aside.
* A fault of the disk (a full disk, an I/O error, a read-only remount) is an ``OSError`` from here,
  with the old file intact; the callers treat it as best effort
  (:data:`supervisor.shell.diskfaults.FAULTS`) so that it never ends supervision.

Built on the door, elsewhere: the kept logs (:mod:`supervisor.shell.statelog`), the record of disk
faults (:mod:`supervisor.shell.diskfaults`); files a person names are the other door, with their own
rule (:mod:`supervisor.named_files`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from supervisor.errors import StateError, UnsafeDir
from supervisor.named_files import kind_of, read_at_most

log = structlog.get_logger("vllm-guard")

MAX_STATE_FILE = 16 << 20        # a state file larger than this is not the guard's: it is set aside, not read
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TRIES = 3                       # a name that keeps being replaced under the guard is refused after this


def owner_ok(uid: int) -> bool:
    """Whether a file of ``uid`` may be trusted: the guard's own user, or root."""
    return uid in (os.geteuid(), 0)


def _now_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _problem(st: os.stat_result, *, shared: bool, cap: int) -> str:
    """Why the object ``st`` describes is not a state file the guard may use ("" when it is)."""
    if not stat.S_ISREG(st.st_mode):
        return kind_of(st)
    if st.st_nlink != 1:
        return f"a hard link ({st.st_nlink} names for one file)"
    if not shared and not owner_ok(st.st_uid):
        return f"a file of uid {st.st_uid}"
    if st.st_size > cap:
        return f"larger than {cap >> 20} MiB" if cap >= 1 << 20 else f"larger than {cap} bytes"
    return ""


class Untrusted(StateError):
    """What was found at a state file's name is not a file to use; ``stat`` describes it (when known)."""

    def __init__(self, path: Path, found: str, st: os.stat_result | None) -> None:
        super().__init__(f"{path} is {found}; not using it")
        self.path, self.found, self.stat = path, found, st


# --- directories ----------------------------------------------------------------------------


def ensure_dir(path: str | Path, mode: int = 0o700) -> Path:
    """Create ``path`` (and parents) when missing and make sure the guard alone can write in it.

    Raises :class:`UnsafeDir` for a directory (or a symbolic link to one) that another user owns or
    that others can write; a directory of ours that others can write is made 0700, and every entry
    in it that is not ours is set aside (it may have been planted while others could write there).
    """
    p = Path(path).expanduser()
    try:
        link = os.lstat(p)
    except FileNotFoundError:
        p.mkdir(parents=True, exist_ok=True, mode=mode)
        link = os.lstat(p)
    if stat.S_ISLNK(link.st_mode) and not owner_ok(link.st_uid):
        raise UnsafeDir(f"the state dir {p} is a symbolic link made by uid {link.st_uid}; refusing to follow it "
                        "(give the guard a directory of its own)")
    st = os.stat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"the state dir {p} is not a directory")
    if st.st_uid != os.geteuid():
        if st.st_uid != 0 or st.st_mode & 0o022:
            others = " and others can write it" if st.st_mode & 0o022 else ""
            raise UnsafeDir(f"the state dir {p} belongs to uid {st.st_uid}{others}; another user could plant "
                            "links there that this guard would follow: give it a directory of its own (chown it, "
                            "or --state-dir)")
    elif st.st_mode & 0o022:
        os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o077)
        log.warning(f"the state dir {p} was writable by other users; made it private (0700)")
        with os.scandir(p) as entries:
            foreign = [e.name for e in entries if not owner_ok(e.stat(follow_symlinks=False).st_uid)]
        for name in foreign:
            set_aside(p / name, f"{p / name} was made by another user while others could write {p}")
    return p


def temp_root() -> Path:
    """The machine's directory for temporary files (``$TMPDIR``, else ``/tmp`` ...)."""
    return Path(tempfile.gettempdir())


def fsync_dir(directory: str | Path) -> None:
    """Make a rename in ``directory`` durable (where the file system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


# --- the door -------------------------------------------------------------------------------


def open_state(path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o600, *, shared: bool = False,
               cap: int = MAX_STATE_FILE) -> int:
    """THE door: a descriptor of the state file ``path``, never of anything else put at its name.

    ``flags`` without ``O_CREAT`` (a reader): FileNotFoundError when absent, :class:`StateError` when
    what is there is not a file to use (it is left as it is). With ``O_CREAT`` (a writer): what is
    there and is not a file to use is set aside (a hard link removed) and the file is made anew with
    ``O_EXCL``; an existing file is opened without ``O_CREAT`` (so ``fs.protected_regular`` does not
    refuse another user's lock file in a sticky dir). ``O_EXCL`` in ``flags``: FileExistsError when the
    name is taken. ``shared``: a lock file in a machine-wide dir, any owner accepted, nothing set aside
    (another user's file there cannot be renamed): a :class:`StateError` instead.
    """
    if flags & os.O_TRUNC:
        raise ValueError("open_state never truncates before it has checked the file: ftruncate after")
    path = Path(path)
    create, exclusive = bool(flags & os.O_CREAT), bool(flags & os.O_EXCL)
    flags &= ~(os.O_CREAT | os.O_EXCL)
    for _ in range(_TRIES):
        try:
            try:
                st: os.stat_result | None = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is None:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
                try:
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _OPEN, mode)
                except FileExistsError:
                    if exclusive:
                        raise
                    continue                        # made meanwhile: look again
            else:
                if exclusive:
                    raise FileExistsError(errno.EEXIST, "file exists", str(path))
                problem = _problem(st, shared=shared, cap=cap)
                if problem:
                    raise Untrusted(path, problem, st)
                try:
                    fd = os.open(path, flags | _OPEN)
                except FileNotFoundError:
                    continue                        # gone meanwhile: look again
                except OSError as e:
                    found = {errno.ELOOP: "a symbolic link", errno.ENXIO: "a FIFO or a socket",
                             errno.EISDIR: "a directory"}.get(e.errno or 0)
                    if found is None:
                        raise
                    raise Untrusted(path, found, None) from None
            try:
                opened = os.fstat(fd)
                problem = _problem(opened, shared=shared, cap=cap)
            except OSError:
                os.close(fd)
                raise
            if problem:
                os.close(fd)
                raise Untrusted(path, problem, opened)
            return fd
        except Untrusted as e:
            if not create or shared:
                raise
            _replace_untrusted(e)
    raise StateError(f"{path} keeps being replaced while the guard opens it; refusing to use it")


def _replace_untrusted(e: Untrusted) -> None:
    """Make room at ``e.path`` for a new file: set aside what is there (remove a hard link)."""
    if e.stat is not None and stat.S_ISREG(e.stat.st_mode) and e.stat.st_nlink > 1:
        if _same(e.path, e.stat):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
            log.warning(f"{e.path} was {e.found}; removed that name (the file it also names is untouched)")
        return
    if e.stat is None or _same(e.path, e.stat):
        set_aside(e.path, f"{e.path} was {e.found}")


def _make_room(target: Path) -> None:
    """Before a rename onto ``target``: what is there and is not the guard's own file (a link, another
    user's file, a directory ...) is set aside rather than silently replaced (nothing is lost)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    problem = _problem(st, shared=False, cap=MAX_STATE_FILE)
    if problem:
        _replace_untrusted(Untrusted(target, problem, st))


def _same(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` still names the object ``st`` described (so the guard moves only what it judged)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def set_aside(path: str | Path, why: str, warn: Callable[[str], None] | None = None) -> Path | None:
    """Move what is at ``path`` (a corrupt file, a link, a FIFO, a directory ...) out of the way, saying so:
    renamed ``<name>.corrupt-<time>``; removed when it cannot be renamed. None when nothing was moved."""
    warn = warn or log.warning
    path = Path(path)
    aside = path.with_name(f"{path.name}.corrupt-{_now_stamp()}")
    for n in range(1, 100):
        if not os.path.lexists(aside):
            break
        aside = path.with_name(f"{path.name}.corrupt-{_now_stamp()}-{n}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    except OSError as e:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError:
            warn(f"{why}; could not move it aside ({e.strerror}) nor remove it")
            raise StateError(f"{why}; could not move it aside ({e.strerror}): move it away") from None
        warn(f"{why}; could not move it aside ({e.strerror}); removed it")
        return None
    warn(f"{why}; moved it to {aside}")
    return aside


def remove(path: str | Path) -> None:
    """Remove the state file ``path`` (the name only: a link's target is untouched); absent is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# --- whole files ----------------------------------------------------------------------------


def read_bytes(path: str | Path, limit: int = MAX_STATE_FILE) -> bytes | None:
    """The bytes of the state file ``path``: None when absent; :class:`StateError` when what is there
    is not a file to use, cannot be read, or is larger than ``limit``."""
    try:
        fd = open_state(path, os.O_RDONLY, cap=limit)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = read_at_most(fd, limit + 1)
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise StateError(f"{path} is larger than {limit} bytes")
    return data


def read_json(path: str | Path) -> Any:
    """A JSON state file: None when absent, :class:`StateError` when it cannot be trusted (not a file
    to use, too large, not UTF-8, not JSON)."""
    raw = read_bytes(path)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:      # UnicodeDecodeError is a ValueError too
        raise StateError(f"{path} is not valid JSON ({str(e)[:200]})") from None


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that readers and crashes see the old or the new file, whole.

    The temporary file has an unpredictable name and is made with ``O_EXCL`` (nothing planted can be
    opened in its place); ``rename`` replaces a link itself, never its target; a directory in the
    way is set aside first. Raises OSError (a full disk ...) with the old file intact.
    """
    target = Path(path)
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"atomic_write takes bytes or str, not {type(data).__name__}")
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = open_state(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)         # O_CREAT's mode passed the umask; be exact
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        for _ in range(_TRIES):
            _make_room(target)
            try:
                os.rename(tmp, target)
                break
            except OSError as e:
                if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
        else:
            raise StateError(f"{target} keeps being replaced by a directory; refusing to write it")
    except BaseException:
        remove(tmp)
        raise
    fsync_dir(target.parent)      # the rename itself is durable only once the directory is


def write_json(path: str | Path, obj: Any, mode: int = 0o600) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


def write_secret_file(path: str | Path, text: str) -> None:
    """Write a secret (the status token) atomically, mode 0600 from its first byte: the temporary file is
    made 0600 with ``O_EXCL`` under an unpredictable name, in a directory that is the guard's alone."""
    target = Path(path)
    ensure_dir(target.parent)
    atomic_write(target, text.encode("utf-8"), 0o600)
