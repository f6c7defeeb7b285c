"""A tiny stand-in for vLLM: a few start-up lines, then one fatal line on stderr, then it waits.

``python latency_child.py OUT``: writes ``fatal <monotonic>`` to OUT just before the fatal line
and ``term <monotonic>`` when its SIGTERM handler runs, then exits. CLOCK_MONOTONIC is one clock
for every process on the machine, so the two stamps measure the guard's reaction.
"""

import os
import signal
import sys
import time

FATAL = ("(EngineCore pid={pid}) ERROR 11-29 16:34:20 [core.py:1510] ValueError: To serve at least one "
         "request with the model's max seq len (131072), (2.0 GiB KV cache is needed, which is larger than "
         "the available KV cache memory (1.0 GiB). Based on the available memory, the estimated maximum model "
         "length is 65408. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
         "initializing the engine.\n")


def main() -> None:
    out = sys.argv[1]

    def on_term(signum, frame):
        stamp = time.monotonic()
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(f"term {stamp!r}\n")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    pid = os.getpid()
    os.write(1, (f"(APIServer pid={pid}) INFO 11-29 16:34:08 [model.py:2152] Using max model len 131072\n"
                 f"(EngineCore pid={pid}) INFO 11-29 16:34:12 [gpu_model_runner.py:4481] Starting to load "
                 "model /models/m...\n").encode())
    # SIGTERM waits until the stamp is on disk (a reaction within microseconds would otherwise race it).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    stamp = time.monotonic()
    os.write(2, FATAL.format(pid=pid).encode())
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(f"fatal {stamp!r}\n")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
