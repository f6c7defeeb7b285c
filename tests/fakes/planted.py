"""What a hostile user or bad luck can leave at a state file's name, made for real: links, FIFOs,
sockets, directories, devices, another user's files, garbage; and a check that the guard left the
planted thing's target as it was."""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

#: Every state file of a state dir (and the generations and temporaries the guard makes beside them).
STATE_FILES = ("guard.lock", "guard.json", "token", "learned.json", "launch.json", "history.jsonl",
               "history.jsonl.1", "vllm.log", "vllm.log.1")

KINDS = ("symlink", "hardlink", "fifo", "socket", "directory", "device", "other_owner", "random", "empty",
         "over_cap")

#: Kinds that are not the guard's own file: what they point at, or they themselves, must stay untouched.
FOREIGN = ("symlink", "hardlink", "fifo", "socket", "directory", "device", "other_owner")

NOBODY = 65534
MAX_STATE_FILE = 16 << 20


def can_plant(kind: str) -> str:
    """"" when ``kind`` can be made here, else why not (a device node and a chown need root)."""
    if kind in ("device", "other_owner") and os.geteuid() != 0:
        return f"planting {kind} needs root (mknod / chown)"
    return ""


@dataclass
class Planted:
    path: Path
    kind: str
    victim: Path | None            # the file a link points at, or the foreign object's own content
    content: bytes | None
    identity: tuple[int, int, int, int] | None     # dev, inode, type, owner (an inode number is reused)

    def untouched(self) -> str:
        """"" when what was planted is as it was (its target not written, not truncated), else what changed."""
        if self.victim is not None:
            try:
                now = self.victim.read_bytes()
            except OSError as e:
                return f"{self.victim} cannot be read any more ({e})"
            if now != self.content:
                return f"{self.victim} (the target of the {self.kind} at {self.path.name}) was written"
        if self.kind in ("fifo", "socket", "device", "directory", "other_owner"):
            # The object itself may be set aside (renamed) but never replaced by writing into it.
            found = _find(self.path.parent, self.identity)
            if found is None:
                return ""           # removed (where it could not be moved aside): nothing was written into it
            if self.kind == "directory" and sorted(os.listdir(found)) != ["inside"]:
                return f"the planted directory {found} was written into"
            if self.kind == "other_owner" and Path(found).read_bytes() != self.content:
                return f"another user's file at {self.path.name} was written"
        return ""


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_uid


def _find(directory: Path, identity: tuple[int, int, int, int] | None) -> Path | None:
    if identity is None:
        return None
    for entry in os.scandir(directory):
        if _identity(entry.stat(follow_symlinks=False)) == identity:
            return Path(entry.path)
    return None


def plant(path: Path, kind: str, victims: Path) -> Planted:
    """Put a ``kind`` at ``path`` (its targets in ``victims``, on the same file system for a hard link)."""
    victims.mkdir(parents=True, exist_ok=True)
    victim: Path | None = None
    content: bytes | None = None
    if kind in ("symlink", "hardlink"):
        victim = victims / f"victim-{kind}-{path.name}"
        content = f"root's precious {path.name}\n".encode()
        victim.write_bytes(content)
        (path.symlink_to if kind == "symlink" else path.hardlink_to)(victim)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("a file in a planted directory\n")
    elif kind == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))      # /dev/null's numbers
    elif kind == "other_owner":
        content = b'{"planted": "by another user"}\n'
        path.write_bytes(content)
        os.chown(path, NOBODY, NOBODY)
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "over_cap":
        with open(path, "wb") as f:
            f.truncate(MAX_STATE_FILE + 1)            # sparse: no disk used
    else:
        raise ValueError(kind)
    return Planted(path, kind, victim, content, _identity(os.lstat(path)))
