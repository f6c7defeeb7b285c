"""The door for files a person names: the guard's config file, vLLM's ``--config``, a token file, a
model's ``config.json`` and safetensors index, the shebang of vLLM's command.

The threat differs from the state dir's (:mod:`supervisor.shell.statefiles`): the person chose the
path, so a symbolic link is followed and any owner is accepted; but what is there may still be a FIFO
(an ``open`` waits for a writer forever), a device (``/dev/zero`` never ends), a directory, or a file
far larger than it should be. So a named file is opened without blocking (``O_NONBLOCK``: a FIFO is
refused, never waited on), read only when it is a regular file, and never read past its bound.
"""

from __future__ import annotations

import os
import stat

from supervisor.errors import ConfigError


def kind_of(st: os.stat_result) -> str:
    """What the object ``st`` describes is, in words, when it is not a regular file."""
    mode = st.st_mode
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_named_file(path: str, what: str, limit: int, limit_text: str,
                    error: type[ConfigError] = ConfigError) -> bytes:
    """The bytes of a file a person named (``what``: "config file", "token file" ...): a link is followed
    (the person chose the path), but only a regular file of at most ``limit`` bytes is read, opened
    without blocking (a FIFO is refused, never waited on) and never read past the bound (``/dev/zero``, a
    log file); else ``error`` naming the file and the reason."""
    got = read_named_optional(path, what, limit, limit_text, error)
    if got is None:
        raise error(f"{what} {path} does not exist")
    return got


def read_named_optional(path: str, what: str, limit: int, limit_text: str,
                        error: type[ConfigError] = ConfigError, *, head: bool = False) -> bytes | None:
    """:func:`read_named_file` for a file that may well be absent (a model's side files, the Hugging Face
    cache's ref): None when nothing is at ``path``. ``head``: the first ``limit`` bytes are what is wanted
    (the shebang of a command), so a longer file is not an error; it is still never read past them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is not a regular file ({kind_of(st)})")
        data = read_at_most(fd, limit if head else limit + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what} {path} is larger than {limit_text}")
    return data


def read_at_most(fd: int, want: int) -> bytes:
    """At most ``want`` bytes from ``fd``, read in chunks of 1 MiB (both doors read a file this way: one
    byte more than their cap tells a file that grew past it)."""
    chunks, size = [], 0
    while size < want:
        chunk = os.read(fd, min(1 << 20, want - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
