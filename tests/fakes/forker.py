"""A tiny stand-in for vLLM's process tree: an API-server child and a ``VLLM::EngineCore`` grandchild.

    forker.py [--engine] [--ignore-term] [--engine-ignore-term]   # the "API server"
    forker.py --role engine [--ignore-term]                       # the "engine" (spawned by the above)

The child prints ``pids <child> [<engine>]`` once everything is set up (signal dispositions
included), then sleeps until killed. The engine is started the way vLLM starts it (fork + exec of
Python, inheriting the environment, same process group) and is named like vLLM names it: argv[0]
is the title and ``prctl(PR_SET_NAME)`` sets ``/proc/<pid>/comm``. Stdlib only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys

ENGINE_NAME = "VLLM::EngineCore"
_PR_SET_NAME = 15


def _set_comm(name: str) -> None:
    # comm holds 15 bytes; psutil completes a 15-character name from argv[0].
    ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _sleep_forever() -> None:
    while True:
        signal.pause()


def _engine(args: argparse.Namespace) -> None:
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _set_comm(ENGINE_NAME)
    print("ready", flush=True)
    _sleep_forever()


def _api_server(args: argparse.Namespace) -> None:
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid()]
    if args.engine:
        cmd = [ENGINE_NAME, os.path.abspath(__file__), "--role", "engine"]
        if args.engine_ignore_term:
            cmd.append("--ignore-term")
        engine = subprocess.Popen(cmd, executable=sys.executable, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  text=True)
        if engine.stdout is None or engine.stdout.readline().strip() != "ready":
            sys.exit("engine did not start")
        pids.append(engine.pid)
    print("pids", *pids, flush=True)
    _sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=("api", "engine"), default="api")
    parser.add_argument("--engine", action="store_true", help="start a VLLM::EngineCore grandchild")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM in this process")
    parser.add_argument("--engine-ignore-term", action="store_true", help="the engine ignores SIGTERM")
    args = parser.parse_args()
    (_engine if args.role == "engine" else _api_server)(args)


if __name__ == "__main__":
    main()
