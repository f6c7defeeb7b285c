"""A launch's vLLM output as text, printed by the fake vLLM's own per-version code, without a server.

The fake (``tests/fakes/fake_vllm.py``) prints every message through a ``Log`` object; here that
object writes into a list instead of file descriptors, and the API-server and engine steps run in
this process with no sleeps. The lines that come out are what the real guard would read from the
child's pipes, so the classifier sees the real wording of each vLLM version.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from supervisor.core.flags import Flags
from supervisor.core.vllm_text import LineSplitter

_FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fakes")
if _FAKES not in sys.path:
    sys.path.insert(0, _FAKES)
import fake_vllm as fv  # noqa: E402  (the fake's own module, so its emulator types are ours)

emu = fv.emu

#: Memory vLLM's CUDA context takes before anything else (the emulator's default, GiB).
CONTEXT_GIB = 0.4
CUDAGRAPH_GIB = 0.5
BLOCK = 16
_ENV = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_USE_V1", "NO_COLOR", "VLLM_DISABLE_LOG_LOGO")


@dataclass
class Rendered:
    """One launch: the output lines (both streams, in order), its exit code and the emulator's truth."""

    lines: list[bytes]
    exit_code: int | None          # None: still serving
    outcome: Any                   # emulator.Outcome


class _Capture(fv.Log):
    """The fake's logger, writing into a list instead of a file descriptor."""

    def __init__(self, v: tuple, proc: str | None, pid: int, sink: list[tuple[int, str]]) -> None:
        super().__init__(v, proc, pid)
        self.sink = sink

    def write(self, fd: int, text: str) -> None:
        self.sink.append((fd, text))


def scenario(model: Any, gpu: Any, version: str) -> dict[str, Any]:
    """The fake's scenario dict for an emulator ModelSpec and GpuSpec."""
    m = asdict(model)
    m.pop("name")
    g = asdict(gpu)
    g["cc"] = list(g["cc"])
    return {"version": version, "speed": 0.0, "block_size": BLOCK, "model": m, "gpu": g,
            "cudagraph_gib": CUDAGRAPH_GIB, "context_gib": CONTEXT_GIB}


def simulate(model: Any, gpu: Any, version: str, flags: Flags) -> Any:
    """The emulator's verdict for one launch (the same call the fake makes)."""
    return emu.simulate(model, gpu, version, flags.as_dict(), block_size=BLOCK,
                        cudagraph_gib=CUDAGRAPH_GIB, context_gib=CONTEXT_GIB, env={})


def _lines(chunks: list[tuple[int, str]]) -> list[bytes]:
    splitters = {1: LineSplitter(), 2: LineSplitter()}
    out: list[bytes] = []
    for fd, text in chunks:
        out.extend(splitters[fd].feed(text.encode("utf-8", "replace")))
    for s in splitters.values():
        out.extend(s.close())
    return out


def render(model: Any, gpu: Any, version: str, flags: Flags) -> Rendered:
    """Print one launch of ``vllm serve MODEL FLAGS`` the way the fake vLLM would, and say how it ended."""
    sc_raw = scenario(model, gpu, version)
    sc = fv.Scenario(sc_raw)
    chunks: list[tuple[int, str]] = []
    outcome = simulate(model, gpu, version, flags)
    # The fake reads these from the environment; the matrix runs without them.
    saved = {k: os.environ.pop(k) for k in _ENV if k in os.environ}
    try:
        try:
            launch = fv.Launch(["serve", model.name] + flags.argv(), version)
        except SystemExit as e:      # argparse refused a flag (it printed the usage itself)
            return Rendered([f"vllm: error: unrecognized arguments: {flags.argv()}".encode()],
                            int(e.code or 2), outcome)
        api = fv.Api(launch, sc)
        api.log = _Capture(sc.v, fv.api_proc_name(sc.v), 4242, chunks)
        api.banner()
        try:
            api.config()
        except SystemExit as e:
            return Rendered(_lines(chunks), int(e.code or 1), outcome)
        proc = fv.engine_proc_name(sc.v, api.gen) if sc.fork_engine else None
        engine = fv.Engine({"scenario": sc_raw, "flags": launch.flags, "model": launch.model,
                            "served": launch.served, "version": version, "engine": api.gen},
                           _Capture(sc.v, proc, 4243, chunks))
        ready = engine.start()
        if ready is None:
            try:
                api.startup_failed(None)
            except SystemExit as e:
                return Rendered(_lines(chunks), int(e.code or 1), outcome)
        api.max_len = ready["max_model_len"]
        api.serving_lines()
        return Rendered(_lines(chunks), None, outcome)
    finally:
        os.environ.update(saved)
