"""What a child's exit status means, in words: a code, or the signal that ended it.

Pure. asyncio reports a death by signal N as ``-N``; a shell in between (``bash -c``, a container
entry point) reports it as ``128 + N``. A SIGKILL the guard did not send is worth a hint: on a
GPU host it is most often the kernel's OOM killer (host memory), which prints nothing to vLLM's
output (gunicorn says "Perhaps out of memory?" for the same reason).
"""

from __future__ import annotations

import signal


def signal_of(code: int | None) -> int | None:
    """The signal that ended the child: ``-N`` from asyncio, or ``128+N`` from a shell; else None."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def signal_name(number: int) -> str:
    """``9`` -> ``SIGKILL``; an unknown number -> ``signal 42``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe(code: int | None) -> str:
    """``vLLM exited with code 1`` / ``vLLM was killed by SIGSEGV`` / ``vLLM is still running``."""
    if code is None:
        return "vLLM is still running"
    sig = signal_of(code)
    if sig is None:
        return f"vLLM exited with code {code}"
    via = f" (exit status {code}, as a shell reports it)" if code > 0 else ""
    return f"vLLM was killed by {signal_name(sig)}{via}"


def hint(code: int | None) -> str:
    """What a death by this status usually means, when it says something; else ``""``."""
    sig = signal_of(code)
    if sig == signal.SIGKILL:
        return ("a SIGKILL vllm-guard did not send: the kernel's OOM killer (host memory) is the likely "
                "cause; `journalctl -k | grep -i oom` or `dmesg` shows it")
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL):
        return "a crash in native code (a CUDA kernel, a driver or a library mismatch)"
    if sig == signal.SIGABRT:
        return "an abort in native code (often an uncaught C++ exception or a failed assertion)"
    return ""
