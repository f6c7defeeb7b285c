"""The cost of the guard itself: supervising a healthy server, classifying a long log, reacting to a fatal line.

Everything here runs the real code: ``vllm-guard start`` as a process against the fake vLLM,
:class:`supervisor.core.classifier.Classifier` on a generated log, and :class:`supervisor.shell.launch.Watcher`
with :class:`supervisor.shell.child.Child` around a real child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import psutil

from benchmarks.matrix import ROOT
from supervisor.core.classifier import Classifier
from supervisor.shell.child import Child
from supervisor.shell.launch import LaunchHooks, LaunchTimers, Watcher
from supervisor.shell.output import VllmOutput
from supervisor.shell.probe import Prober
from supervisor.shell.report import Report

FAKE = os.path.join(ROOT, "tests", "fakes", "fake_vllm.py")
CHILD = os.path.join(ROOT, "benchmarks", "latency_child.py")
TOKEN = "bench-token"


def machine() -> dict[str, Any]:
    """CPU model, cores and Python version of this machine."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


# -- 1. supervising a healthy server -----------------------------------------------------------
def _cpu_seconds(pid: int) -> float:
    """A process's CPU time, all threads, from the scheduler's clock (CLOCK_PROCESS_CPUTIME of another
    pid: ``((~pid) << 3) | 2``), exact to the nanosecond. psutil's figure is sampled per tick (10 ms
    here), and a process that wakes briefly once a second is charged a whole tick or none, by luck."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:                      # not Linux, or the process is gone
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


def supervise(seconds: float = 60.0, health_interval: float = 10.0) -> dict[str, Any]:
    """Run ``vllm-guard start`` on the fake vLLM; measure the guard process alone while it serves."""
    with tempfile.TemporaryDirectory(prefix="vg-bench-") as tmp:
        status_port = _free_port()
        argv = [sys.executable, "-m", "supervisor", "start", "--model", "fake/model",
                "--vllm-command", f"{sys.executable} {FAKE} serve", "--port", str(_free_port()),
                "--status-port", str(status_port), "--state-dir", os.path.join(tmp, "state"),
                "--health-interval", f"{health_interval:g}"]
        env = {**os.environ, "VLLM_GUARD_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT,
               "FAKE_VLLM_SCENARIO": json.dumps({"speed": 0.02})}
        with open(os.path.join(tmp, "guard.log"), "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                started = time.monotonic()
                state = _wait_state(status_port, proc, "healthy", 60.0)
                to_healthy = time.monotonic() - started
                guard = psutil.Process(proc.pid)
                before = _cpu_seconds(proc.pid)
                t0 = time.monotonic()
                time.sleep(seconds)            # no polling while measuring: it would cost the guard CPU
                after = _cpu_seconds(proc.pid)
                wall = time.monotonic() - t0
                hwm = _vm_hwm_kib(proc.pid)
                rss = guard.memory_info().rss
                state = (_status(status_port) or {}).get("state")
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    cpu = after - before
    return {"seconds": round(wall, 1), "health_interval": health_interval,
            "cpu_s": round(cpu, 3), "cpu_percent": round(100 * cpu / wall, 3),
            "peak_rss_mib": round(hwm / 1024, 1), "rss_mib": round(rss / 2**20, 1),
            "start_to_healthy_s": round(to_healthy, 1), "state_after": state}


def _status(port: int) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/status", timeout=2,
                      headers={"Authorization": f"Bearer {TOKEN}"})
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def _wait_state(port: int, proc: subprocess.Popen, want: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = _status(port)
        if s is not None and s.get("state") == want:
            return s
        if proc.poll() is not None:
            raise RuntimeError(f"vllm-guard exited {proc.returncode} before it was {want}")
        time.sleep(0.2)
    raise RuntimeError(f"vllm-guard not {want} within {timeout:g} s")


# -- 2. classifier throughput --------------------------------------------------------------------
def realistic_log(n: int = 1_000_000) -> list[bytes]:
    """A day of a busy vLLM 0.32 server in ``n`` lines: start-up, access log, stats, warnings, a traceback."""
    from benchmarks.matrix import L4, L40S, MODELS, model_spec
    from benchmarks.render import render
    from supervisor.core.flags import Flags

    spec = model_spec(MODELS[0], "0.32.0")
    startup = render(spec, L40S.spec(), "0.32.0", Flags()).lines
    failure = render(spec, L4.spec(), "0.32.0", Flags()).lines     # 131072 tokens on 24 GB: the KV error
    at = next(i for i, ln in enumerate(failure) if b"EngineCore failed to start" in ln)
    tail = failure[at:]                     # the engine's traceback, raw again on stderr, the API server's
    paths = ("/v1/chat/completions", "/v1/completions", "/health", "/metrics", "/v1/models")
    body = n - len(startup) - len(tail)
    out = list(startup)
    for i in range(body):
        r = i % 20
        if r < 14:
            out.append(f'(APIServer pid=4242) INFO:     10.0.{i % 250}.{i % 199}:{40000 + i % 20000} - '
                       f'"{"POST" if r < 10 else "GET"} {paths[r % 5]} HTTP/1.1" 200 OK'.encode())
        elif r < 18:
            out.append(f"(APIServer pid=4242) INFO 11-29 17:{i // 60 % 60:02d}:{i % 60:02d} [loggers.py:123] "
                       f"Engine 000: Avg prompt throughput: {i % 977 / 3:.1f} tokens/s, Avg generation "
                       f"throughput: {i % 1513 / 7:.1f} tokens/s, Running: {i % 17} reqs, Waiting: {i % 3} reqs, "
                       f"GPU KV cache usage: {i % 100 / 1.3:.1f}%, Prefix cache hit rate: {i % 61:.1f}%".encode())
        elif r == 18:
            out.append(f"(APIServer pid=4242) WARNING 11-29 17:{i // 60 % 60:02d}:{i % 60:02d} "
                       f"[protocol.py:93] The following fields were present in the request but ignored: "
                       f"{{'stream_options{i % 7}'}}".encode())
        else:
            out.append(f"(APIServer pid=4242) INFO 11-29 17:{i // 60 % 60:02d}:{i % 60:02d} [logger.py:41] "
                       f"Received request chatcmpl-{i:032x}: prompt: '<|user|>hello {i}', params: "
                       f"SamplingParams(n=1, temperature=0.7, max_tokens={i % 512 + 1})".encode())
    out.extend(tail)
    return out


def classifier_throughput(n: int = 1_000_000) -> dict[str, Any]:
    """Lines per second through ``Classifier().feed`` on one core."""
    lines = realistic_log(n)
    old = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if old:
        os.sched_setaffinity(0, {min(old)})    # single core, as asked
    try:
        classifier = Classifier()
        feed = classifier.feed
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        for line in lines:
            feed(line)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - t0
    finally:
        if old:
            os.sched_setaffinity(0, old)
    verdict = classifier.diagnose(1)
    return {"lines": len(lines), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "lines_per_s": int(len(lines) / wall), "verdict": verdict.kind.value}


# -- 2b. the whole output path, as the daemon runs it ------------------------------------------------
#: The line the issue sizes the output path by: 120 bytes of vLLM's (an access-log line of the API server).
TYPICAL = (b'(APIServer pid=4242) INFO:     10.0.12.7:43210 - "POST /v1/chat/completions HTTP/1.1" 200 OK '
           b'req=chatcmpl-0123456789')


async def _pump_through_guard(source: str, state_dir: str) -> tuple[Watcher, VllmOutput]:
    """A real child (``cat``) writes ``source`` to its pipe; the guard's Child reads it in 64 KiB chunks,
    LineSplitter cuts lines, Watcher.line masks and classifies each and hands it to VllmOutput, which keeps
    it in ``vllm.log`` (rotating at 8 MiB) and passes it through to stdout: every step of the daemon's."""
    from supervisor.config import GuardConfig
    from supervisor.core.progress import Progress
    from supervisor.core.session import Facts, Session

    session = Session(GuardConfig(model="m", vllm_args=("--max-model-len", "8192")), Facts(vllm_version="0.32.0"),
                      rng=random.Random(0))
    session.first_launch()
    session.launching()
    output = VllmOutput(state_dir, secrets=["sk-bench-secret-not-in-the-log"])
    report = Report(session.cfg, state_dir)
    report.progress = progress = Progress(1, time.time())
    child = Child(["cat", source], dict(os.environ), lambda lines, stream: None)
    timers = LaunchTimers(startup_timeout=600, stall_timeout=600, collect_after_fatal=2, health_interval=10,
                          health_failures=3, stop_grace=5)
    def on_lines(lines: list[bytes], stream: str) -> None:     # as Guard._on_lines
        output.lines(lines, stream)
        report.vllm_lines(lines)

    # Wired as Guard._watch wires it: the output's mask cleans each read, the session holds the bounds.
    watcher = Watcher(child, None, timers, LaunchHooks(on_lines=on_lines), asyncio.Queue(),  # type: ignore[arg-type]
                      bounds=session.check_auto_fit if session.current.auto_length() else None,
                      clean=output.mask_lines, progress=progress)
    child.on_lines = watcher.lines
    await child.start()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    others = sorted(set(range(os.cpu_count() or 1)) - set(cores))
    if others:                          # the writer on another core: the guard's core is the guard's alone
        with contextlib.suppress(psutil.Error):
            psutil.Process(child.pid).cpu_affinity(others[:1])
    await child.wait()
    await child.drain(timeout=3600)     # every line read and handled
    output.close()
    return watcher, output


def output_throughput(n: int = 1_000_000, journal: bool = False, typical: bool = False) -> dict[str, Any]:
    """Lines per second through the whole output path on one core (read, split, mask, classify, keep,
    pass through). ``journal``: the guard's stdout is the journal (each line gets its priority prefix).
    ``typical``: ``n`` copies of the issue's 120-byte line instead of the realistic day of a server."""
    lines = [TYPICAL] * n if typical else realistic_log(n)
    nbytes = sum(len(line) + 1 for line in lines)
    old = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    saved_fd = os.dup(1)
    env_before = os.environ.get("JOURNAL_STREAM")
    with tempfile.TemporaryDirectory(prefix="vg-out-") as tmp:
        source = os.path.join(tmp, "vllm-output.txt")
        with open(source, "wb") as fh:
            fh.write(b"\n".join(lines) + b"\n")
        state_dir = os.path.join(tmp, "state")
        os.mkdir(state_dir, 0o700)
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)            # passed through to stdout, as the guard does; here /dev/null
        os.close(devnull)
        if journal:
            st = os.fstat(1)
            os.environ["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        if old:
            os.sched_setaffinity(0, {min(old)})
        try:
            t0, cpu0 = time.perf_counter(), time.process_time()
            watcher, output = asyncio.run(_pump_through_guard(source, state_dir))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            kept = [line for line in open(os.path.join(state_dir, "vllm.log"), "rb").read().splitlines()]
        finally:
            if old:
                os.sched_setaffinity(0, old)
            sys.stdout.flush()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
            if env_before is None:
                os.environ.pop("JOURNAL_STREAM", None)
            else:
                os.environ["JOURNAL_STREAM"] = env_before
    assert kept and kept[-1] == lines[-1], "the output path lost the last line"
    return {"lines": n, "bytes": nbytes, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "lines_per_s": int(n / wall), "lines_per_cpu_s": int(n / max(cpu, 1e-9)),
            "mb_per_s": round(nbytes / wall / 1e6, 1), "journal": journal, "journal_prefix": output._journal["stdout"],
            "verdict": watcher.classifier.diagnose(1).kind.value, "typical": typical}


# -- 3. fatal line -> SIGTERM ----------------------------------------------------------------------
async def _one_reaction(collect: float, tmp: str, i: int) -> float:
    out = os.path.join(tmp, f"stamps-{collect:g}-{i}")
    child = Child([sys.executable, CHILD, out], dict(os.environ), lambda lines, stream: None)
    prober = Prober("127.0.0.1", _free_port(), "m", timeout=1.0)
    timers = LaunchTimers(startup_timeout=60, stall_timeout=60, collect_after_fatal=collect,
                          health_interval=10, health_failures=3, stop_grace=5)
    watcher = Watcher(child, prober, timers, LaunchHooks(), asyncio.Queue())
    child.on_lines = watcher.lines
    try:
        await child.start()
        await watcher.run()
    finally:
        await prober.aclose()
    stamps = {}
    with open(out, encoding="utf-8") as fh:
        for line in fh:
            what, value = line.split()
            stamps[what] = float(value)
    return stamps["term"] - stamps["fatal"]


async def _reactions(collect: float, runs: int, parallel: int) -> list[float]:
    out: list[float] = []
    with tempfile.TemporaryDirectory(prefix="vg-lat-") as tmp:
        for start in range(0, runs, parallel):
            batch = range(start, min(runs, start + parallel))
            out += await asyncio.gather(*(_one_reaction(collect, tmp, i) for i in batch))
    return out


def reaction_latency(collect: float, runs: int = 100, parallel: int = 1) -> dict[str, Any]:
    """Seconds from the fatal line on the child's stderr to its SIGTERM handler (median, p99)."""
    xs = sorted(asyncio.run(_reactions(collect, runs, parallel)))
    p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
    return {"collect_after_fatal": collect, "runs": len(xs), "parallel": parallel,
            "median_ms": round(statistics.median(xs) * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "max_ms": round(xs[-1] * 1000, 1), "min_ms": round(xs[0] * 1000, 1)}
