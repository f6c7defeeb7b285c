"""Exit codes and the errors that carry them; the one place both are defined.

The tree::

    GuardError               exit_code on the instance
    ├── ConfigError          78  a setting, file or argument a person must change
    │   └── UnsafeDir        78  a directory the guard would write in is another user's, or others can write it
    └── Refused              the guard cannot start or go on (another guard, the GPUs, a timeout)
        ├── AlreadyRunning   78  another guard holds the state dir
        └── StateError       78  a state file cannot be trusted and could not be set aside

A fault of the disk (a full disk, an I/O error, a read-only file system) is none of these: the
guard's state writes are best effort and supervision goes on from memory; where a start cannot go
on without the disk (the state dir's lock cannot be made), the exit is 75, not 78.

Decisions that end the guard (the session's ``GiveUp``) carry one of the codes below too; only
the CLI turns them into a process exit status. The codes follow ``sysexits.h`` so systemd's
``RestartPreventExitStatus=`` can tell "a person must act" (78) from "try again later" (75).
"""

from __future__ import annotations

from typing import Any

EX_OK = 0             # stopped on request (signal, POST /stop, `vllm-guard stop`)
EX_FAILURE = 1        # a client command failed (`status`, `restart`, `stop`: no guard answers)
EX_USAGE = 2          # bad command line (argparse)
EX_UNFIT = 3          # `plan`: the model does not fit the GPUs given (the verdict says what would)
EX_SOFTWARE = 70      # a bug in vllm-guard (it still stopped vLLM and left nothing behind)
EX_TEMPFAIL = 75      # remedies or the launch budget exhausted; may work later (GPU freed, more memory)
EX_CONFIG = 78        # vLLM or the guard refused the configuration; changing flags will not help


class GuardError(Exception):
    """An error that ends a vllm-guard command with ``exit_code``; its message says what to do."""

    exit_code = EX_SOFTWARE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(GuardError):
    """A setting is missing, unknown or invalid; the message names the key or file."""

    exit_code = EX_CONFIG


class Refused(GuardError):
    """The guard cannot start or go on (another guard holds the state dir, too few GPUs ...)."""

    exit_code = EX_CONFIG


class UnsafeDir(ConfigError):
    """A directory the guard would write in belongs to someone else or is writable by others."""


class AlreadyRunning(Refused):
    """Another guard holds the state dir; ``holder`` has its pid, start time and status port."""

    def __init__(self, state_dir: str, holder: dict[str, Any]) -> None:
        self.holder = holder
        parts = [f"pid {holder.get('pid', 'unknown')}"]
        if holder.get("started"):
            parts.append(f"started {holder['started']}")
        if holder.get("status_port"):
            parts.append(f"status port {holder['status_port']}")
        super().__init__(
            f"another vllm-guard is already running on state dir {state_dir} ({', '.join(parts)}); "
            "stop it or give this one its own state dir (--state-dir or VLLM_GUARD_STATE_DIR)"
        )


class StateError(Refused):
    """A state file cannot be trusted (a link, a FIFO, another user's ...) or read; the message names the
    file and what was found. The guard's own writers set such a file aside and make it anew, so this
    reaches a person only when that failed too."""
