#!/usr/bin/env python3
"""A fake vLLM OpenAI server: real-format logs, real process layout, real HTTP, no model.

Run it the way vLLM is run (``fake_vllm.py serve MODEL [flags]`` or ``fake_vllm.py --model MODEL``).
``FAKE_VLLM_SCENARIO`` (a JSON file path or inline JSON) sets the model, GPU, vLLM version and
misbehaviour; the memory arithmetic comes from :mod:`emulator`. The "current" output (0.32) is
copied from captures of the real CPU vLLM 0.32.0 (tests/fixtures/logs/real-0.32); older versions use
the per-version strings of docs/failure-catalogue.md (the table: tests/fixtures/catalogue). Stdlib only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulator as emu  # noqa: E402

# The paths of the real fixtures (tests/fixtures/logs/real-0.32): venv /opt/vllm, interpreter /usr.
SITE = "/opt/vllm/lib/python3.11/site-packages"
PYLIB = "/usr/lib/python3.11"
ENGINE_ARG = "--fake-vllm-engine-core"
WORKER_ARG = "--fake-vllm-worker"
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1

# ================================================================ scenario


class Scenario:
    """What this launch should be and do (all keys optional)."""

    def __init__(self, d: dict):
        self.raw = d
        self.version: str = str(d.get("version", "0.32.0"))
        self.v = emu.vtuple(self.version)
        self.speed: float = float(d.get("speed", 0.05))
        self.block_size: int = int(d.get("block_size", 16))
        m = dict(d.get("model") or {})
        self.model_overrides = m
        g = dict(d.get("gpu") or {})
        if "cc" in g:
            g["cc"] = tuple(g["cc"])
        self.gpu = emu.GpuSpec(**{"total_gib": 23.55, **g})
        self.activation_gib = d.get("activation_gib")
        self.cudagraph_gib = float(d.get("cudagraph_gib", 0.5))
        self.context_gib = float(d.get("context_gib", 0.4))
        self.replay = d.get("replay")
        self.heal_when = d.get("heal_when")
        self.replay_exit = int(d.get("replay_exit", 1))
        # a vLLM that waits after the replayed lines (for a Ray placement group, say), then prints
        # replay_tail (what it says when it gives up) before exiting with replay_exit
        self.replay_wait = float(d.get("replay_wait", 0))
        self.replay_tail = d.get("replay_tail")
        self.engine_death_after = d.get("engine_death_after")
        self.death_count = d.get("death_count")
        self.death_reason = d.get("death_reason", "error")   # error | oom | kill
        self.hang_after = d.get("hang_after")
        self.silent_hang_at_start = bool(d.get("silent_hang_at_start", False))
        self.ignore_sigterm = bool(d.get("ignore_sigterm", False))
        self.fork_engine = bool(d.get("fork_engine", self.v >= (0, 8, 0)))
        self.engine_survives_parent = bool(d.get("engine_survives_parent", True))
        self.orphan_timeout = float(d.get("orphan_timeout", 600))
        self.no_chat_template = bool(d.get("no_chat_template", False))
        self.pooling = bool(d.get("pooling", False))
        self.state_dir = os.environ.get("FAKE_VLLM_STATE") or d.get("state_dir")
        # "cpu": the CPU backend as captured in tests/fixtures/logs/real-0.32 (a VLLM::Worker grandchild,
        # KV space from VLLM_CPU_KVCACHE_SPACE, block size 128, no CUDA graphs).
        self.device = d.get("device", "cuda")
        if self.device == "cpu":
            self.block_size = int(d.get("block_size", 128))
        self.cpu_node_gib = float(d.get("cpu_node_gib", 9.59))
        self.cpu_free_gib = float(d.get("cpu_free_gib", 7.96))
        self.cpu_kv_limit_gib = float(d.get("cpu_kv_limit_gib", 8.21))

    def model(self, name: str) -> emu.ModelSpec:
        base = dict(name=name, weights_gib=0.93, kv_bytes_per_token=12288, num_kv_heads=2,
                    derived_max_model_len=32768, vocab=151936, hidden=896, intermediate=4864)
        base.update(self.model_overrides)
        base["name"] = name
        return emu.ModelSpec(**base)


def load_scenario() -> Scenario:
    text = os.environ.get("FAKE_VLLM_SCENARIO", "").strip()
    if not text:
        return Scenario({})
    if text.startswith("{"):
        return Scenario(json.loads(text))
    with open(text, encoding="utf-8") as f:
        return Scenario(json.load(f))


# ================================================================ command line

# (flag, first version, last version or None, takes a value), from vLLM's argument parser per version
# (vllm/engine/arg_utils.py); the guard's side of it: supervisor/core/vllm.py.
_ALWAYS_VALUE = """--host --port --api-key --dtype --tokenizer --revision --tokenizer-revision --download-dir
--load-format --seed --max-model-len --gpu-memory-utilization --kv-cache-dtype --tensor-parallel-size
--pipeline-parallel-size --block-size --max-num-seqs --max-num-batched-tokens --quantization
--num-gpu-blocks-override --uvicorn-log-level --chat-template --max-logprobs --distributed-executor-backend
--model --root-path --allowed-origins --allowed-methods --allowed-headers --ssl-keyfile --ssl-certfile
--ssl-ca-certs --response-role --tokenizer-mode --max-lora-rank --max-loras --lora-dtype --tool-call-parser
--max-parallel-loading-workers --code-revision --max-log-len --middleware --config-format
--ssl-cert-reqs --lora-extra-vocab-size --max-cpu-loras --long-lora-scaling-factors --ray-workers-use-nsight
--disable-log-stats-interval --data-parallel-size --hf-overrides --limit-mm-per-prompt --mm-processor-kwargs
--generation-config --override-generation-config --reasoning-parser --tool-parser-plugin --chat-template-content-format
--data-parallel-rank --data-parallel-address --data-parallel-rpc-port --data-parallel-size-local
--config --speculative-config --override-pooler-config --pooler-config --logits-processors --prefix-caching-hash-algo
--max-num-partial-prefills --max-long-partial-prefills --long-prefill-token-threshold --served-model-name
--lora-modules --prompt-adapters --max-seq-len-to-capture --swap-space --cpu-offload-gb --compilation-config
-O --optimization-level --cuda-graph-sizes --max-cudagraph-capture-size --kv-cache-memory-bytes --task
--runner --convert --api-server-count --kv-offloading-size --kv-offloading-backend --guided-decoding-backend
--rope-scaling --rope-theta --speculative-model --num-speculative-tokens --preemption-mode --num-scheduler-steps
--scheduler-delay-factor --enable-chunked-prefill --worker-use-ray --engine-use-ray --structured-outputs-config
--mm-encoder-tp-mode --async-scheduling --safetensors-load-strategy --attention-backend --dcp-comm-backend""".split()
_ALWAYS_BOOL = """--enforce-eager --trust-remote-code --disable-log-stats --enable-prefix-caching
--disable-custom-all-reduce --enable-lora --disable-sliding-window --skip-tokenizer-init --enable-auto-tool-choice
--disable-fastapi-docs --enable-sleep-mode --disable-hybrid-kv-cache-manager --enable-expert-parallel --headless
--enable-server-load-tracking --enable-prompt-tokens-details --enable-force-include-usage --fully-sharded-loras
--enable-eplb --return-tokens-as-token-ids --disable-frontend-multiprocessing --disable-log-requests
--enable-log-requests --use-v2-block-manager --calculate-kv-scales --fail-on-environ-validation
--enable-request-id-headers --disable-uvicorn-access-log --enable-log-outputs --log-error-stack""".split()
# first version that has it, first version that no longer has it (vLLM's arg_utils.py per version)
_RANGES = {
    "--cpu-offload-gb": ((0, 5, 5), None), "--compilation-config": ((0, 6, 5), None),
    "-O": ((0, 6, 5), None), "--optimization-level": ((0, 12, 0), None),
    "--cuda-graph-sizes": ((0, 9, 0), (0, 13, 0)), "--max-cudagraph-capture-size": ((0, 11, 1), None),
    "--max-seq-len-to-capture": ((0, 5, 0), (0, 11, 0)), "--swap-space": ((0, 5, 0), (0, 18, 0)),
    "--kv-cache-memory-bytes": ((0, 10, 2), None), "--disable-log-requests": ((0, 5, 0), (0, 17, 0)),
    "--enable-log-requests": ((0, 10, 1), None), "--preemption-mode": ((0, 5, 1), (0, 11, 0)),
    "--use-v2-block-manager": ((0, 5, 0), (0, 10, 0)), "--num-scheduler-steps": ((0, 5, 5), (0, 10, 1)),
    "--disable-frontend-multiprocessing": ((0, 5, 5), (0, 19, 0)),
    "--calculate-kv-scales": ((0, 7, 0), (0, 28, 0)), "--kv-offloading-size": ((0, 11, 1), None),
    "--kv-offloading-backend": ((0, 11, 1), None), "--api-server-count": ((0, 9, 1), None),
    "--fail-on-environ-validation": ((0, 17, 0), None), "--task": ((0, 6, 4), (0, 13, 0)),
    "--runner": ((0, 10, 1), None), "--convert": ((0, 10, 1), None),
    "--speculative-model": ((0, 5, 0), (0, 8, 3)), "--num-speculative-tokens": ((0, 5, 0), (0, 8, 3)),
    "--speculative-config": ((0, 8, 2), None), "--guided-decoding-backend": ((0, 5, 0), (0, 12, 0)),
    "--worker-use-ray": ((0, 5, 0), (0, 7, 0)), "--engine-use-ray": ((0, 5, 0), (0, 6, 3)),
    "--rope-scaling": ((0, 5, 0), (0, 11, 1)), "--rope-theta": ((0, 5, 0), (0, 11, 1)),
    "--structured-outputs-config": ((0, 10, 2), None), "--async-scheduling": ((0, 10, 1), None),
    "--hf-overrides": ((0, 7, 0), None), "--headless": ((0, 8, 5), None),
    "--disable-hybrid-kv-cache-manager": ((0, 9, 2), None), "--scheduler-delay-factor": ((0, 5, 0), (0, 11, 0)),
}
_BOOLEAN_OPTIONAL_FROM = (0, 9, 0)   # BooleanOptionalAction: --no-enforce-eager etc.


def _present(flag: str, v: tuple) -> bool:
    first, gone = _RANGES.get(flag, ((0, 0, 0), None))
    return v >= first and (gone is None or v < gone)


class _Parser(argparse.ArgumentParser):
    """argparse that reports like vLLM's FlexibleArgumentParser (prog and exit code 2)."""

    def __init__(self, *a, error_prog: str, **k):
        super().__init__(*a, **k)
        self.error_prog = error_prog

    def error(self, message):  # noqa: D102 - argparse API
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.error_prog}: error: {message}\n")
        sys.stderr.flush()
        raise SystemExit(2)


def build_parser(version: str, serve: bool) -> _Parser:
    v = emu.vtuple(version)
    prog = "vllm serve" if serve else "api_server.py"
    usage = "vllm serve [model_tag] [options]" if serve else None
    p = _Parser(prog=prog, usage=usage, add_help=True, error_prog=prog)

    def hint(kind):
        def conv(text):
            try:
                emu.parse_human_int(text, version)
            except ValueError:
                raise argparse.ArgumentTypeError(f"invalid {kind} value: {text!r}") from None
            return text
        conv.__name__ = kind
        return conv

    human = hint("human_readable_int" if v >= (0, 8, 4) else "int")
    human.__name__ = "human_readable_int" if v >= (0, 8, 4) else "int"
    kv_choices = [d for first, d in emu.KV_DTYPES_BY_VERSION if v >= first]
    p.add_argument("model_tag", nargs="?")   # api_server.py has it too: `--foo 3` eats the 3
    for flag in _ALWAYS_VALUE:
        if not _present(flag, v):
            continue
        names = [flag] + (["-tp"] if flag == "--tensor-parallel-size" else []) \
            + (["-pp"] if flag == "--pipeline-parallel-size" else []) + (["-q"] if flag == "--quantization" else [])
        kw: dict = {}
        if flag in ("--max-model-len", "--max-num-batched-tokens", "--kv-cache-memory-bytes"):
            kw["type"] = human
        elif flag == "--kv-cache-dtype":
            kw["choices"] = kv_choices
        elif flag in ("--port", "--tensor-parallel-size", "--pipeline-parallel-size", "--max-num-seqs",
                      "--block-size", "--num-gpu-blocks-override", "--seed"):
            kw["type"] = int
        elif flag in ("--gpu-memory-utilization", "--cpu-offload-gb", "--swap-space"):
            kw["type"] = float
        if flag in ("--served-model-name", "--lora-modules", "--middleware", "--allowed-origins") \
                or (flag == "--api-key" and v >= (0, 10, 1)):      # api_key: list[str] since 0.10.1
            kw["nargs"] = "+"
        if flag == "--enable-chunked-prefill":
            kw["nargs"] = "?"
            kw["const"] = "True"
        p.add_argument(*names, dest=flag, **kw)
    if v >= (0, 8, 0):       # hf_token: bool | str | None -> nargs="?" (alone: the cached login)
        p.add_argument("--hf-token", dest="--hf-token", nargs="?", const=True, default=None)
    for flag in _ALWAYS_BOOL:
        if not _present(flag, v):
            continue
        if v >= _BOOLEAN_OPTIONAL_FROM:
            p.add_argument(flag, dest=flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            p.add_argument(flag, dest=flag, action="store_true", default=None)
    return p


def _normalise(argv: list[str]) -> list[str]:
    """FlexibleArgumentParser: ``--max_model_len`` means ``--max-model-len``; ``-O3`` means ``-O 3``."""
    out = []
    for tok in argv:
        if tok.startswith("--"):
            name, eq, val = tok.partition("=")
            out.append(name.replace("_", "-") + eq + val)
        elif len(tok) > 2 and tok.startswith("-O") and tok[2:].isdigit():
            out += ["-O", tok[2:]]
        else:
            out.append(tok)
    return out


class Launch:
    """The parsed command line: model, served name, host/port and the vLLM flags as a dict."""

    def __init__(self, argv: list[str], version: str):
        self.serve = bool(argv) and argv[0] == "serve"
        args = _normalise(argv[1:] if self.serve else argv)
        parser = build_parser(version, self.serve)
        ns, extra = parser.parse_known_args(args)
        if extra:
            parser.print_usage(sys.stderr)
            prog = "vllm" if self.serve else "api_server.py"
            sys.stderr.write(f"{prog}: error: unrecognized arguments: {' '.join(extra)}\n")
            raise SystemExit(2)
        d = {k: v for k, v in vars(ns).items() if v is not None}
        tag = d.pop("model_tag", None)
        model = (tag if self.serve else None) or d.get("--model") or tag or "facebook/opt-125m"
        self.model = model
        self.flags: dict[str, str] = {}
        self.order: list[tuple[str, object]] = []
        for k, val in d.items():
            if k == "--model":
                continue
            if val is True:
                self.flags[k] = ""
            elif val is False:
                continue
            elif isinstance(val, list):
                self.flags[k] = " ".join(map(str, val))
            else:
                self.flags[k] = str(val)
            self.order.append((k, val))
        names = d.get("--served-model-name")
        self.served = names[0] if names else model
        self.host = d.get("--host")
        self.port = int(d.get("--port", 8000))
        keys = d.get("--api-key") or os.environ.get("VLLM_API_KEY")
        self.api_keys = [keys] if isinstance(keys, str) else list(keys or [])
        self.argv = argv

    def non_default_args(self) -> dict:
        out: dict = {}
        if self.serve:
            out["model_tag"] = self.model
        for k, val in self.order:
            key = k.lstrip("-").replace("-", "_")
            if key == "O":
                key = "optimization_level"
            if k in ("--max-model-len", "--max-num-batched-tokens") and isinstance(val, str):
                try:
                    val = int(val)
                except ValueError:
                    pass
            out[key] = val
            if k == "--port" and "model" not in out:
                out["model"] = self.model
        out.setdefault("model", self.model)
        return out


# ================================================================ output


class Log:
    """vLLM's logger and stream prefixes for one process, per version (docs/failure-catalogue.md,
    "How vLLM prints, per version")."""

    def __init__(self, v: tuple, proc: str | None, pid: int | None = None):
        self.v = v
        self.proc = proc
        self.pid = pid or os.getpid()
        self.lock = threading.RLock()   # re-entrant: the engine's SIGTERM handler logs

    def _proc_prefix(self) -> str:
        if not self.proc:
            return ""
        text = f"({self.proc} pid={self.pid})"
        if self.v < (0, 12, 0) or (self.v < (0, 16, 0) and not os.environ.get("NO_COLOR")):
            if self.v < (0, 31, 0):
                return f"\033[1;36m{text}\033[0;0m "
        return text + " "

    def _head(self, level: str, fileinfo: str, line: int) -> str:
        ts = time.strftime("%m-%d %H:%M:%S")
        loc = f"{fileinfo}:{line}]" if self.v < (0, 8, 0) else f"[{fileinfo}:{line}]"
        return f"{self._proc_prefix()}{level} {ts} {loc} "

    def write(self, fd: int, text: str) -> None:
        data = text.encode("utf-8", "replace")
        with self.lock:
            try:
                os.write(fd, data)
            except OSError:
                pass

    def log(self, level: str, where: str, msg: str) -> None:
        """One record on stdout; ``where`` is ``file.py:NNN``; newlines become ``\\r\\n`` + prefix."""
        fileinfo, _, line = where.rpartition(":")
        head = self._head(level, fileinfo, int(line))
        self.write(1, head + msg.replace("\n", "\r\n" + head) + "\n")

    info = lambda self, where, msg: self.log("INFO", where, msg)  # noqa: E731
    warning = lambda self, where, msg: self.log("WARNING", where, msg)  # noqa: E731
    error = lambda self, where, msg: self.log("ERROR", where, msg)  # noqa: E731

    def raw(self, text: str, fd: int = 2) -> None:
        """Text a process prints itself (tracebacks, uvicorn): prefixed per line in 0.10.1-0.30."""
        prefix = self._proc_prefix() if (0, 10, 1) <= self.v < (0, 31, 0) else ""
        lines = text.split("\n")
        self.write(fd, "".join(prefix + ln + "\n" for ln in lines))


_CARET_PREFIX = re.compile(r"^(return |[\w.]+(, [\w.]+)* = )")


def frames(*specs: tuple) -> str:
    """Render traceback frames: (path, line, func, code) with ``{S}``/``{P}`` for site/python.

    Python 3.11 underlines the called expression unless it is the whole line; for the frames
    vLLM shows that is the right-hand side of ``x = ...`` and ``return ...`` (as the captures show).
    """
    out = []
    for path, line, func, code in specs:
        path = path.replace("{S}", SITE).replace("{P}", PYLIB)
        out.append(f'  File "{path}", line {line}, in {func}')
        if code:
            out.append(f"    {code}")
            m = _CARET_PREFIX.match(code)
            if m:
                out.append(" " * (4 + m.end()) + "^" * (len(code) - m.end()))
    return "\n".join(out)


TB_HEAD = "Traceback (most recent call last):\n"
_BOOTSTRAP = frames(("{P}/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
                    ("{P}/multiprocessing/process.py", 108, "run", "self._target(*self._args, **self._kwargs)"),
                    ("{S}/vllm/v1/engine/core.py", 1514, "run_engine_core", "raise e"))


def process_traceback(tb: str) -> str:
    """multiprocessing's raw print of the engine's exception: the same traceback from ``_bootstrap``."""
    at = tb.rfind(TB_HEAD) + len(TB_HEAD)
    return tb[:at] + _BOOTSTRAP + "\n" + tb[at:]


def traceback_text(body: str, exc: str, cause: str | None = None) -> str:
    text = "Traceback (most recent call last):\n" + body + "\n" + exc
    if cause:
        text = cause + "\n\nThe above exception was the direct cause of the following exception:\n\n" + text
    return text


# ================================================================ messages per version

_CONSERVING = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def gib(x: float, v: tuple) -> str:
    """vLLM prints GiB with ``%.2f`` before 0.14 and ``round(x, 2)`` (``16.0``) from 0.14."""
    return f"{x:.2f}" if v < (0, 14, 0) else str(round(x, 2))


def torch_oom(n: dict, graphs: bool, v: tuple) -> str:
    cls = "torch.cuda.OutOfMemoryError" if v < (0, 6, 4) else "torch.OutOfMemoryError"
    total, free = n.get("total_gib", 0.0), n.get("free_gib", 0.0)
    used = max(total - free, 0.0)
    pools = f"with {min(used * 0.02, 1.2):.2f} GiB allocated in private pools (e.g., CUDA Graphs), " if graphs else ""
    return (f"{cls}: CUDA out of memory. Tried to allocate {n.get('tried_to_allocate_mib', 20.0):.2f} MiB. "
            f"GPU 0 has a total capacity of {total:.2f} GiB of which {free * 1024:.2f} MiB is free. "
            f"Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. Of the allocated "
            f"memory {used * 0.95:.2f} GiB is allocated by PyTorch, {pools}and {used * 0.01:.2f} GiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def kv_message(v: tuple, gen: str, n: dict) -> str:
    L = n["max_model_len"]
    if gen == "v0":
        return (f"ValueError: The model's max seq len ({L}) is larger than the maximum number of tokens that can "
                f"be stored in KV cache ({n['fit_max_model_len']}). Try increasing `gpu_memory_utilization` or "
                "decreasing `max_model_len` when initializing the engine.")
    unit = "GB" if v < (0, 8, 3) else "GiB"
    who = "model's" if v >= (0, 22, 0) else "models's"
    need, avail = gib(n["kv_needed_gib"], v), gib(n["kv_available_gib"], v)
    head = (f"ValueError: To serve at least one request with the {who} max seq len ({L}), ({need} {unit} KV cache "
            f"is needed, which is larger than the available KV cache memory ({avail} {unit}).")
    advice = "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    if v >= (0, 22, 0):
        advice = ("Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
                  "or decreasing `max_model_len` when initializing the engine.")
    if v >= (0, 13, 0):
        advice += " " + _CONSERVING
    est = n.get("fit_max_model_len")
    if (0, 8, 4) <= v < (0, 9, 1):
        return head + " Based on the available memory,  " + advice
    if v >= (0, 9, 1) and est:
        return head + f" Based on the available memory, the estimated maximum model length is {est}. " + advice
    return head + " " + advice


def no_kv_message(v: tuple) -> str:
    if v >= (0, 22, 0):
        return ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                "when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                "despite its name). " + _CONSERVING)
    tail = " " + _CONSERVING if v >= (0, 13, 0) else ""
    return ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine." + tail)


def free_memory_message(v: tuple, n: dict) -> str:
    free, total, util, req = n["free_gib"], n["total_gib"], n["requested_utilization"], n["requested_gib"]
    dev = " cuda:0" if v >= (0, 14, 0) else ""
    return (f"ValueError: Free memory on device{dev} ({round(free, 2)}/{round(total, 2)} GiB) on startup is less "
            f"than desired GPU memory utilization ({util}, {round(req, 2)} GiB). Decrease GPU memory utilization "
            "or reduce GPU memory used by other processes.")


def derived_message(v: tuple, n: dict) -> str:
    msg = (f"User-specified max_model_len ({n['max_model_len']}) is greater than the derived max_model_len "
           f"(max_position_embeddings={float(n['derived_max_model_len'])} or model_max_length=None in model's "
           "config.json).")
    if v >= (0, 10, 2):
        return msg + (" To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                      "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
                      "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
                      "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                      "array out-of-bounds error.")
    return msg + (" This may lead to incorrect model outputs or CUDA errors. To allow overriding this maximum, set "
                  "the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")


# Engine-side traceback frames, copied from real 0.32 captures (paths generalised).
_CORE = ("{S}/vllm/v1/engine/core.py", 1482, "run_engine_core",
         "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)")
_OTEL = ("{S}/vllm/tracing/otel.py", 175, "sync_wrapper", "return func(*args, **kwargs)")
_PROC_INIT = ("{S}/vllm/v1/engine/core.py", 1194, "__init__", "super().__init__(")
_F_KV = frames(_CORE, _OTEL, _PROC_INIT,
               ("{S}/vllm/v1/engine/core.py", 157, "__init__",
                "kv_cache_config = self._initialize_kv_caches(vllm_config)"), _OTEL,
               ("{S}/vllm/v1/engine/core.py", 326, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
               ("{S}/vllm/v1/core/kv_cache_utils.py", 2642, "get_kv_cache_configs", "_check_enough_kv_cache_memory("),
               ("{S}/vllm/v1/core/kv_cache_utils.py", 1030, "_check_enough_kv_cache_memory", "raise ValueError("))
_F_EXECUTOR = (_CORE, _OTEL, _PROC_INIT,
               ("{S}/vllm/v1/engine/core.py", 120, "__init__",
                "self.model_executor = executor_class(vllm_config)"),
               ("{S}/vllm/v1/executor/abstract.py", 103, "__init__", "self._init_executor()"),
               ("{S}/vllm/v1/executor/uniproc_executor.py", 52, "_init_executor",
                'self.driver_worker.init_device()'))
_F_FREE = frames(*_F_EXECUTOR,
                 ("{S}/vllm/v1/worker/worker_base.py", 326, "init_device", "self.worker.init_device()  # type: ignore"),
                 ("{S}/vllm/v1/worker/gpu_worker.py", 268, "init_device",
                  "self.requested_memory = request_memory(init_snapshot, self.cache_config)"),
                 ("{S}/vllm/v1/worker/utils.py", 412, "request_memory", "raise ValueError("))
_F_LOAD = frames(*_F_EXECUTOR[:-1],
                 ("{S}/vllm/v1/executor/uniproc_executor.py", 54, "_init_executor", 'self.driver_worker.load_model()'),
                 ("{S}/vllm/v1/worker/gpu_worker.py", 326, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
                 ("{S}/vllm/v1/worker/gpu_model_runner.py", 4512, "load_model", "self.model = model_loader.load_model("),
                 ("{S}/vllm/model_executor/model_loader/base_loader.py", 55, "load_model", "model = initialize_model("),
                 ("{S}/vllm/model_executor/layers/linear.py", 268, "create_weights", "torch.empty("),
                 ("{S}/torch/utils/_device.py", 104, "__torch_function__", "return func(*args, **kwargs)"))
_F_PROFILE = frames(_CORE, _OTEL, _PROC_INIT,
                    ("{S}/vllm/v1/engine/core.py", 157, "__init__",
                     "kv_cache_config = self._initialize_kv_caches(vllm_config)"), _OTEL,
                    ("{S}/vllm/v1/engine/core.py", 300, "_initialize_kv_caches",
                     "available_gpu_memory = self.model_executor.determine_available_memory()"),
                    ("{S}/vllm/v1/worker/gpu_worker.py", 402, "determine_available_memory",
                     "self.model_runner.profile_run()"),
                    ("{S}/vllm/v1/worker/gpu_model_runner.py", 6120, "profile_run",
                     "output = self._dummy_sampler_run(last_hidden_states)"))
_F_CAPTURE = frames(_CORE, _OTEL, _PROC_INIT,
                    ("{S}/vllm/v1/engine/core.py", 164, "__init__", "self.model_executor.initialize_from_config(kv_cache_config)"),
                    ("{S}/vllm/v1/worker/gpu_worker.py", 551, "compile_or_warm_up_model",
                     "cuda_graph_memory_bytes = self.model_runner.capture_model()"),
                    ("{S}/vllm/v1/worker/gpu_model_runner.py", 6402, "capture_model", "self._capture_cudagraphs("),
                    ("{S}/vllm/v1/worker/gpu_model_runner.py", 6501, "_capture_cudagraphs", "self._dummy_run("),
                    ("{S}/vllm/compilation/cuda_graph.py", 288, "__call__", "with torch.cuda.graph("),
                    ("{S}/torch/cuda/graphs.py", 186, "__exit__", "self.cuda_graph.capture_end()"))
# V0 (0.6.x, the multiprocessing engine) allocating its KV cache, one torch.zeros per layer (the
# wheel of 0.6.6.post1: engine/multiprocessing/engine.py, engine/llm_engine.py, worker/).
_F_V0_KV_ALLOC = frames(
    ("{S}/vllm/engine/multiprocessing/engine.py", 357, "run_mp_engine",
     "engine = MQLLMEngine.from_engine_args(engine_args=engine_args,"),
    ("{S}/vllm/engine/multiprocessing/engine.py", 119, "from_engine_args", "return cls(ipc_path=ipc_path,"),
    ("{S}/vllm/engine/multiprocessing/engine.py", 71, "__init__", "self.engine = LLMEngine(*args, **kwargs)"),
    ("{S}/vllm/engine/llm_engine.py", 276, "__init__", "self._initialize_kv_caches()"),
    ("{S}/vllm/engine/llm_engine.py", 429, "_initialize_kv_caches",
     "self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)"),
    ("{S}/vllm/executor/gpu_executor.py", 83, "initialize_cache",
     "self.driver_worker.initialize_cache(num_gpu_blocks, num_cpu_blocks)"),
    ("{S}/vllm/worker/worker.py", 274, "initialize_cache", "self._init_cache_engine()"),
    ("{S}/vllm/worker/worker.py", 280, "_init_cache_engine", "CacheEngine(self.cache_config, self.model_config,"),
    ("{S}/vllm/worker/cache_engine.py", 62, "__init__", "self.gpu_cache = self._allocate_kv_cache("),
    ("{S}/vllm/worker/cache_engine.py", 81, "_allocate_kv_cache", "torch.zeros(kv_cache_shape,"))
_F_BACKEND = frames(*_F_EXECUTOR[:-1],
                    ("{S}/vllm/v1/executor/uniproc_executor.py", 54, "_init_executor", 'self.driver_worker.load_model()'),
                    ("{S}/vllm/v1/worker/gpu_model_runner.py", 4512, "load_model", "self.model = model_loader.load_model("),
                    ("{S}/vllm/attention/selector.py", 91, "get_attn_backend", "return _cached_get_attn_backend("),
                    ("{S}/vllm/platforms/cuda.py", 402, "get_attn_backend_cls", "raise ValueError("))

# The API server's traceback, as the real captures show it. The head depends on how vLLM was started.
_HEAD_MODULE = frames(("<frozen runpy>", 198, "_run_module_as_main", ""), ("<frozen runpy>", 88, "_run_code", ""),
                      ("{S}/vllm/entrypoints/openai/api_server.py", 59, "<module>", "main()"),
                      ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 232, "main",
                       "uvloop.run(run_server(args))"))
_HEAD_CLI = frames(("/opt/vllm/bin/vllm", 10, "<module>", "sys.exit(main())"),
                   ("{S}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
                   ("{S}/vllm/entrypoints/cli/serve.py", 112, "cmd", "uvloop.run(run_server(args))"))
_RUN = frames(("{S}/uvloop/__init__.py", 92, "run", "return runner.run(wrapper())"),
              ("{P}/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
              ("uvloop/loop.pyx", 1515, "uvloop.loop.Loop.run_until_complete", ""),
              ("{S}/uvloop/__init__.py", 48, "wrapper", "return await main"))
_TO_ENGINE_ARGS = frames(
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 177, "run_server",
     "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 195, "run_server_worker",
     "async with build_async_engine_client("),
    ("{P}/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 61, "build_async_engine_client",
     "async with build_async_engine_client_from_engine_args("),
    ("{P}/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"))
_TAIL_CONFIG = frames(
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 83, "build_async_engine_client_from_engine_args",
     "vllm_config = engine_args.create_engine_config(usage_context=usage_context)"),
    ("{S}/vllm/engine/arg_utils.py", 2240, "create_engine_config", "model_config = self.create_model_config()"),
    ("{S}/vllm/engine/arg_utils.py", 1955, "create_model_config", "return ModelConfig("),
    ("{S}/pydantic/_internal/_dataclasses.py", 121, "__init__",
     "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"))
_TAIL_ENGINE = frames(
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 95, "build_async_engine_client_from_engine_args",
     "async_llm = AsyncLLM.from_vllm_config("),
    ("{S}/vllm/v1/engine/async_llm.py", 255, "from_vllm_config", "return cls("),
    ("{S}/vllm/v1/engine/async_llm.py", 184, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
    _OTEL, ("{S}/vllm/v1/engine/core_client.py", 167, "make_async_mp_client", "return AsyncMPClient("), _OTEL,
    ("{S}/vllm/v1/engine/core_client.py", 1120, "__init__", "super().__init__("),
    ("{S}/vllm/v1/engine/core_client.py", 682, "__init__", "with launch_core_engines("),
    ("{P}/contextlib.py", 144, "__exit__", "next(self.gen)"),
    ("{S}/vllm/v1/engine/utils.py", 1351, "launch_core_engines", "wait_for_engine_startup("),
    ("{S}/vllm/v1/engine/utils.py", 1431, "wait_for_engine_startup", "raise RuntimeError("))
_TAIL_BIND = frames(
    ("{S}/vllm/entrypoints/launchers/api_server/entry.py", 176, "run_server",
     "listen_address, sock = setup_server(args, reuse_port=False)"), _OTEL,
    ("{S}/vllm/entrypoints/launchers/launcher.py", 398, "setup_server",
     "sock = create_server_socket(sock_addr, reuse_port=reuse_port)"),
    ("{S}/vllm/entrypoints/launchers/launcher.py", 348, "create_server_socket", "sock.bind(addr)"))


def api_frames(serve: bool, where: str) -> str:
    """The API server's frames down to ``where``: ``config``, ``engine`` (start-up wait) or ``bind``."""
    head = (_HEAD_CLI if serve else _HEAD_MODULE) + "\n" + _RUN
    if where == "bind":
        return head + "\n" + _TAIL_BIND
    tail = _TAIL_CONFIG if where == "config" else _TAIL_ENGINE
    return head + "\n" + _TO_ENGINE_ARGS + "\n" + tail


def engine_failure(kind: str, v: tuple, gen: str, n: dict, flags: dict, phase: str = "") -> tuple[str, str]:
    """(traceback text, last line) that the engine raises for ``kind`` (in ``phase``)."""
    if kind == "kv_cache_insufficient":
        exc = kv_message(v, gen, n)
        return traceback_text(_F_KV, exc), exc
    if kind == "no_kv_cache_memory":
        if "auto_fit_max_model_len" in n or (flags.get("--max-model-len") in ("auto", "-1")):
            exc = ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
                   "single token. Try increasing `gpu_memory_utilization`.")
        else:
            exc = no_kv_message(v)
        return traceback_text(_F_KV, exc), exc
    if kind == "insufficient_free_memory":
        exc = free_memory_message(v, n)
        return traceback_text(_F_FREE, exc), exc
    if kind == "oom_weights":
        exc = torch_oom(n, False, v)
        return traceback_text(_F_LOAD, exc), exc
    if kind == "oom_profile" and phase == "kv_cache":
        oom = torch_oom(n, False, v)
        return traceback_text(_F_V0_KV_ALLOC, oom), oom
    if kind == "oom_profile":
        oom = torch_oom(n, False, v)
        if n.get("sampler_peak") and gen == "v1" and v >= (0, 8, 0):
            exc = (f"RuntimeError: CUDA out of memory occurred when warming up sampler with "
                   f"{n['num_dummy_requests']} dummy requests. Please try lowering `max_num_seqs` or "
                   "`gpu_memory_utilization` when initializing the engine.")
            inner = traceback_text(frames(("{S}/vllm/v1/worker/gpu_model_runner.py", 5880, "_dummy_sampler_run",
                                           "sampler_output = self.sampler(")), oom)
            body = _F_PROFILE + "\n" + frames(("{S}/vllm/v1/worker/gpu_model_runner.py", 5890,
                                               "_dummy_sampler_run", "raise RuntimeError("))
            return traceback_text(body, exc, cause=inner), exc
        return traceback_text(_F_PROFILE, oom), oom
    if kind == "oom_cudagraph":
        exc = torch_oom(n, True, v)
        return traceback_text(_F_CAPTURE, exc), exc
    if kind == "config_error":
        exc = ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=128, "
               f"dtype=torch.bfloat16, kv_cache_dtype={flags.get('--kv-cache-dtype', 'auto')}, block_size=16, "
               "use_mla=False, has_sink=False, use_sparse=False, attn_type=AttentionType.DECODER). Reasons: "
               "{FLASH_ATTN: [kv_cache_dtype not supported], FLASHINFER: [kv_cache_dtype not supported], "
               "TRITON_ATTN: [kv_cache_dtype not supported]}.")
        return traceback_text(_F_BACKEND, exc), exc
    exc = f"RuntimeError: {kind}"
    return traceback_text(_F_KV, exc), exc


def api_config_failure(kind: str, v: tuple, n: dict, serve: bool = True) -> str:
    """The traceback the API server prints for a config-time failure (before any engine)."""
    if kind == "max_len_exceeds_model":
        msg = derived_message(v, n)
        cls = "ModelConfig"
    else:
        msg = n.get("detail", "invalid configuration")
        if "world size" in msg:
            msg = (f"World size ({n['world_size']}) is larger than the number of available GPUs ({n['gpu_count']}) "
                   "in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend"
                   " ray'.\n- multiprocessing, set '--nnodes' appropriately.")
        cls = "ParallelConfig" if "World size" in msg else "VllmConfig"
    if v >= (0, 9, 1):
        exc = (f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}\n"
               f"  Value error, {msg} [type=value_error, input_value=ArgsKwargs((), {{'model': ...}}), "
               f"input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/"
               f"{'2.14' if v >= (0, 30, 0) else '2.11'}/v/value_error")
    else:
        exc = f"ValueError: {msg}"
    return traceback_text(api_frames(serve, "config"), exc)


# ================================================================ process names per version


def engine_proc_name(v: tuple, gen: str) -> str | None:
    """The engine's log prefix name (None: no prefix)."""
    if gen == "v0" or v < (0, 10, 1):
        return None
    if v < (0, 10, 2):
        return "EngineCore_0"
    return "EngineCore_DP0" if v < (0, 18, 0) else "EngineCore"


def engine_mp_name(v: tuple, gen: str) -> str:
    """multiprocessing's process name, shown as ``Process <name>:`` on a raw traceback."""
    if gen == "v0":
        return "SpawnProcess-1"
    if v < (0, 8, 3):
        return "EngineCore"
    if v < (0, 10, 2):
        return "EngineCore_0"
    return "EngineCore_DP0" if v < (0, 18, 0) else "EngineCore"


def api_proc_name(v: tuple) -> str | None:
    return "APIServer" if v >= (0, 10, 1) else None


# ================================================================ engine process


def _engine_config_line(v, gen, launch: dict, max_len: int) -> str:
    f = launch["flags"]
    eager = "--enforce-eager" in f
    head = "Initializing a V1 LLM engine" if gen == "v1" else \
        ("Initializing a V0 LLM engine" if v >= (0, 7, 3) else "Initializing an LLM engine")
    return (f"{head} (v{launch['version']}) with config: model='{launch['model']}', speculative_config=None, "
            f"tokenizer='{launch['model']}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"tokenizer_revision=None, trust_remote_code={'--trust-remote-code' in f}, dtype=torch.bfloat16, "
            f"max_seq_len={max_len}, download_dir=None, load_format=auto, "
            f"tensor_parallel_size={f.get('--tensor-parallel-size', '1')}, pipeline_parallel_size="
            f"{f.get('--pipeline-parallel-size', '1')}, data_parallel_size=1, disable_custom_all_reduce=False, "
            f"quantization={f.get('--quantization')}, enforce_eager={eager}, "
            f"kv_cache_dtype={f.get('--kv-cache-dtype', 'auto')}, device_config=cuda, seed=0, "
            f"served_model_name={launch['served']}, enable_prefix_caching=True, enable_chunked_prefill=True, "
            "pooler_config=None")


class Engine:
    """The engine's side of start-up: milestones, the emulator's verdict, and the runtime loop."""

    def __init__(self, spec: dict, log: Log):
        self.spec = spec
        self.sc = Scenario(spec["scenario"])
        self.v = self.sc.v
        self.log = log
        self.speed = self.sc.speed
        self.flags = spec["flags"]

    def pause(self, factor: float = 1.0) -> None:
        time.sleep(self.speed * factor)

    def start(self) -> dict | None:
        """Print start-up; return the READY payload, or None after printing the failure."""
        if self.sc.device == "cpu":
            return self.start_cpu()
        sc, v, log, f = self.sc, self.v, self.log, self.flags
        out = emu.simulate(sc.model(self.spec["model"]), sc.gpu, sc.version, f, block_size=sc.block_size,
                           activation_gib=sc.activation_gib, cudagraph_gib=sc.cudagraph_gib,
                           context_gib=sc.context_gib, env=dict(os.environ))
        n, gen = out.numbers, out.numbers["engine"]
        v1 = gen == "v1"
        core = "core.py" if v1 else "llm_engine.py"
        runner = "gpu_model_runner.py" if v1 else "model_runner.py"
        worker = "gpu_worker.py" if v1 else "worker.py"
        log.info(f"{core}:133", _engine_config_line(v, gen, self.spec, n.get("max_model_len", 0)))
        tp = int(f.get("--tensor-parallel-size", "1"))
        log.info("parallel_state.py:1906", f"world_size={tp} rank=0 local_rank=0 distributed_init_method="
                 f"tcp://127.0.0.1:{random.randint(30000, 60000)} backend=nccl")
        if sc.silent_hang_at_start:
            log.info(f"{runner}:4481", f"Starting to load model {self.spec['model']}...")
            while True:
                time.sleep(3600)
        self.pause()
        if out.kind == "insufficient_free_memory":
            return self.fail(out)
        log.info(f"{runner}:4481", f"Starting to load model {self.spec['model']}...")
        self.pause()
        log.raw("\rLoading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]", fd=2)
        self.pause()
        if out.kind not in ("oom_weights", "config_error"):
            log.raw("\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:02<00:00,  1.91it/s]\n", fd=2)
        if out.kind in ("oom_weights",) or (out.kind == "config_error" and out.phase == "loading"):
            if out.kind == "oom_weights" and v >= (0, 13, 0):
                log.error(f"{runner}:4530", "Failed to load model - not enough GPU memory. Try lowering "
                          "--gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, "
                          "or using --quantization. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
                          " for more tips. (original error: " + torch_oom(n, False, v).split(": ", 1)[1] + ")")
            return self.fail(out)
        w = n["weights_gib"]
        if v >= (0, 8, 0):
            log.info("default_loader.py:501", f"Loading weights took {self.speed * 2:.2f} seconds")
        if v >= (0, 14, 0):
            loaded = f"Model loading took {round(w, 2)} GiB memory and {self.speed * 2.5:.6f} seconds"
        elif v >= (0, 11, 1):
            loaded = f"Model loading took {w:.4f} GiB memory and {self.speed * 2.5:.6f} seconds"
        elif v >= (0, 8, 3):
            loaded = f"Model loading took {w:.4f} GiB and {self.speed * 2.5:.6f} seconds"
        elif v >= (0, 8, 0):
            loaded = f"Model loading took {w:.4f} GB and {self.speed * 2.5:.6f} seconds"
        else:
            loaded = f"Loading model weights took {w:.4f} GB"
        log.info(f"{runner}:4600", loaded)
        eager = "--enforce-eager" in f or f.get("-O") == "0" or f.get("--optimization-level") == "0"
        if v1 and v >= (0, 10, 0) and not eager:
            log.info("backends.py:548", f"Dynamo bytecode transform time: {self.speed * 3:.2f} s")
            log.info("backends.py:215", f"Compiling a graph for dynamic shape takes {self.speed * 8:.2f} s")
        self.pause(2)
        if out.kind == "oom_profile" and out.phase == "profiling":
            return self.fail(out)
        if v1 and v >= (0, 20, 0) and not eager:
            log.info(f"{worker}:424", f"Estimated CUDA graph memory: {sc.cudagraph_gib:.2f} GiB total")
        if v1 and v >= (0, 9, 1):
            log.info(f"{worker}:436", f"Available KV cache memory: {gib(n['kv_available_gib'], v)} GiB")
        elif not v1 and v >= (0, 6, 5):
            util = n["requested_utilization"]
            log.info(f"{worker}:262", (
                f"Memory profiling takes {self.speed:.2f} seconds\nthe current vLLM instance can use "
                f"total_gpu_memory ({n['total_gib']:.2f}GiB) x gpu_memory_utilization ({util:.2f}) = "
                f"{n['budget_gib']:.2f}GiB\nmodel weights take {w:.2f}GiB; "
                f"non_torch_memory takes {n.get('non_torch_gib', 0.1):.2f}GiB; "
                f"PyTorch activation peak memory takes {n['activation_gib']:.2f}GiB; the rest of the memory "
                f"reserved for KV Cache is {n['kv_available_gib']:.2f}GiB."))
        if out.kind == "no_kv_cache_memory":
            return self.fail(out)
        if not v1:
            label = "cuda" if v >= (0, 7, 0) else "GPU"
            log.info("executor_base.py:111", f"# {label} blocks: {n['num_blocks']}, # CPU blocks: 2048")
            if v >= (0, 6, 3):
                log.info("executor_base.py:116", f"Maximum concurrency for {n['max_model_len']} tokens per request: "
                         f"{n['num_blocks'] * sc.block_size / n['max_model_len']:.2f}x")
        if out.kind in ("kv_cache_insufficient", "oom_profile"):      # the latter: allocating the cache
            return self.fail(out)
        max_len = out.served_max_model_len or n["max_model_len"]
        if "auto_fit_max_model_len" in n:
            derived = n["derived_max_model_len"]
            what = "KV cache memory" if v >= (0, 32, 0) else "GPU memory"
            avail = f"{gib(n['kv_available_gib'], v)} GiB GPU" if v >= (0, 32, 0) else gib(n['kv_available_gib'], v)
            if max_len < derived:
                msg = f"Auto-fit max_model_len: reduced from {derived} to {max_len} to fit in available {what} ({avail})"
            else:
                msg = f"Auto-fit max_model_len: full model context length {derived} fits in available {what} ({avail})"
            if v < (0, 32, 0):
                msg = msg.replace(f"({avail})", f"({avail} GiB available for KV cache)")
            log.info("kv_cache_utils.py:2477", msg)
        if v1:
            tokens, conc = f"{n['kv_tokens']:,}", f"{n['num_blocks'] / -(-max_len // sc.block_size):.2f}x"
            if v >= (0, 28, 0):
                log.info("kv_cache_utils.py:2327", f"GPU KV cache size: {tokens} tokens, Maximum concurrency for "
                         f"{max_len:,} tokens per request: {conc}")
            elif v >= (0, 8, 0):
                log.info("kv_cache_utils.py:1087", f"GPU KV cache size: {tokens} tokens")
                log.info("kv_cache_utils.py:1091", f"Maximum concurrency for {max_len:,} tokens per request: {conc}")
            else:
                log.info("kv_cache_utils.py:540", f"# GPU blocks: {n['num_blocks']}")
        if not eager:
            self.capture(out, v1)
            if out.kind == "oom_cudagraph":
                return self.fail(out)
            msg = f"Graph capturing finished in {max(1, round(self.speed * 10))} secs"
            msg += f", took {sc.cudagraph_gib:.2f} GiB" if v >= (0, 6, 4) else "."
            log.info(f"{runner}:6432", msg)
        took = self.speed * 12
        if v >= (0, 20, 0):
            init = f"init engine (profile, create kv cache, warmup model) took {took:.2f} s"
            if v1 and not eager:
                init += f" (compilation: {self.speed * 8:.2f} s)"
        elif v >= (0, 6, 5):
            init = f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds"
        else:
            init = ""
        if init:
            log.info(f"{core}:402", init)
        return {"max_model_len": max_len, "numbers": n}

    def capture(self, out, v1: bool) -> None:
        v, log = self.v, self.log
        if not v1:
            if v >= (0, 6, 4):
                log.info("model_runner.py:1539", "Capturing cudagraphs for decoding. This may lead to unexpected "
                         "consequences if the model is not static. To run the model in eager mode, set "
                         "'enforce_eager=True' or use '--enforce-eager' in the CLI. If out-of-memory error occurs "
                         "during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to "
                         "eager mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.")
            else:
                log.info("model_runner.py:1067", "Capturing the model for CUDA graphs. This may lead to unexpected "
                         "consequences if the model is not static. To run the model in eager mode, set "
                         "'enforce_eager=True' or use '--enforce-eager' in the CLI.")
            bars = ["Capturing CUDA graph shapes"] if v >= (0, 6, 6) else []
        elif v >= (0, 10, 1):
            bars = ["Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "Capturing CUDA graphs (decode, FULL)"]
        elif v >= (0, 9, 2):
            bars = ["Capturing CUDA graph shapes"]
        else:
            bars = []
        total = 51
        for i, bar in enumerate(bars):
            stop = total // 3 if out.kind == "oom_cudagraph" and i == len(bars) - 1 else total
            log.raw(f"\r{bar}:   0%|          | 0/{total} [00:00<?, ?it/s]", fd=2)
            self.pause()
            pct = stop * 100 // total
            fill = "█" * (pct // 10) + " " * (10 - pct // 10)
            log.raw(f"\r{bar}: {pct:3d}%|{fill}| {stop}/{total} [00:0{1 + i}<00:00, 24.{i}0it/s]", fd=2)

    def fail(self, out) -> None:
        """The V1 / V0 start-up failure envelope printed by the engine process (docs/failure-catalogue.md)."""
        v, log = self.v, self.log
        gen = out.numbers["engine"]
        tb, last = engine_failure(out.kind, v, gen, out.numbers, self.flags, out.phase)
        if gen == "v1" and v >= (0, 8, 5):
            log.error("core.py:1510", "EngineCore failed to start.\n" + tb)
        elif gen == "v1" and v >= (0, 7, 0):
            log.error("core.py:387", "EngineCore hit an exception: " + tb)
            return None
        elif gen == "v0" and v >= (0, 6, 4):
            log.error("engine.py:389", last.split(": ", 1)[-1] + "\n" + tb)
        log.raw(f"Process {engine_mp_name(v, gen)}:\n" + process_traceback(tb), fd=2)
        return None


    # -- the CPU backend (real 0.32 CPU captures) ----------------------------------------------
    def start_cpu(self) -> dict | None:
        sc, v, log, f = self.sc, self.v, self.log, self.flags
        # vLLM's CPU platform applies VLLM_CPU_KVCACHE_SPACE over --kv-cache-memory-bytes
        try:
            flag_bytes = emu.parse_human_int(f.get("--kv-cache-memory-bytes") or "", sc.version)
        except ValueError:
            flag_bytes = None
        space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or (flag_bytes / emu.GIB if flag_bytes else 4))
        space = round(space, 2)
        sim_flags = dict(f, **{"--kv-cache-memory-bytes": str(int(space * emu.GIB))})
        out = emu.simulate(sc.model(self.spec["model"]), emu.GpuSpec(total_gib=1024.0), sc.version, sim_flags,
                           block_size=sc.block_size, activation_gib=0.0, cudagraph_gib=0.0, context_gib=0.0,
                           non_torch_gib=0.0, env=dict(os.environ))
        n = out.numbers
        self.worker = subprocess.Popen(["VLLM::Worker", os.path.abspath(__file__), WORKER_ARG, str(os.getpid())],
                                       executable=self.spec.get("python") or os.readlink("/proc/self/exe"),
                                       stdin=subprocess.DEVNULL)
        wlog = Log(v, "Worker", pid=self.worker.pid)
        log.info("core.py:133", _engine_config_line(v, "v1", self.spec, n.get("max_model_len", 0))
                 .replace("device_config=cuda", "device_config=cpu"))
        log.info("multiproc_executor.py:153", "DP group leader: node_rank=0, node_rank_within_dp=0, "
                 "master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1")
        wlog.info("parallel_state.py:1906", "world_size=1 rank=0 local_rank=0 distributed_init_method="
                  f"file:///tmp/vllm_dist_{uuid.uuid4().hex} backend=gloo")
        wlog.info("cpu_model_runner.py:68", f"Starting to load model {self.spec['model']}...")
        self.pause()
        wlog.info("base_loader.py:82", f"Initializing model took {self.speed * 4:.6f} seconds")
        log.raw("\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]", fd=2)
        log.raw("\rLoading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 34.76it/s]\n", fd=2)
        wlog.info("default_loader.py:501", f"Loading weights took {self.speed * 3:.2f} seconds")
        self.pause()
        log.info("utils.py:347", "Using LBHNC KV cache layout.")
        if space > sc.cpu_free_gib:
            exc = (f"ValueError: Available memory on node 0 ({sc.cpu_free_gib}/{sc.cpu_node_gib} GiB) on kv cache "
                   f"allocation is less than requested memory for kv ({space} GiB). Decrease "
                   "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.")
            wlog.error("multiproc_executor.py:953", "WorkerProc hit an exception.\n" + traceback_text(_F_KV, exc))
            detail = exc.split(": ", 1)[1]
            wrapped = (f"RuntimeError: Worker failed with error '{detail}', please check the stack trace above "
                       "for the root cause")
            return self.fail_cpu(traceback_text(_F_KV, wrapped), wrapped, {"EngineCore": 1})
        wlog.info("cpu_worker.py:260", f"Explicitly set ({space}/{sc.cpu_kv_limit_gib}) GiB for KV cache on node 0.")
        if out.kind in ("kv_cache_insufficient", "no_kv_cache_memory"):
            tb, last = engine_failure(out.kind, v, "v1", n, f)
            return self.fail_cpu(tb, last, {})
        max_len = out.served_max_model_len
        if "auto_fit_max_model_len" in n:
            derived = n["derived_max_model_len"]
            avail = f"{gib(n['kv_available_gib'], v)} GiB CPU"
            if max_len < derived:
                msg = f"Auto-fit max_model_len: reduced from {derived} to {max_len} to fit in available KV cache memory ({avail})"
            else:
                msg = f"Auto-fit max_model_len: full model context length {derived} fits in available KV cache memory ({avail})"
            log.info("kv_cache_utils.py:2477", msg)
        conc = n["num_blocks"] / -(-max_len // sc.block_size)
        log.info("kv_cache_utils.py:2327", f"CPU KV cache size: {n['kv_tokens']:,} tokens, Maximum concurrency for "
                 f"{max_len:,} tokens per request: {conc:.2f}x")
        log.info("core.py:402", f"init engine (profile, create kv cache, warmup model) took {self.speed * 6:.2f} s")
        return {"max_model_len": max_len, "numbers": n}

    def fail_cpu(self, tb: str, last: str, procs: dict) -> None:
        log = self.log
        log.error("core.py:1510", "EngineCore failed to start.\n" + tb)
        self.worker.kill()
        self.worker.wait()
        log.error("multiproc_executor.py:315", "Worker proc VllmWorker-0 died unexpectedly (exit code: None), "
                  "shutting down executor.")
        log.info("multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
        log.raw("Process EngineCore:\n" + process_traceback(tb), fd=2)
        self.failed_procs = procs
        return None

    # -- runtime ------------------------------------------------------------------------------
    def die(self) -> None:
        """A runtime engine death, printed the way EngineCore prints it; then the process exits."""
        reason, v = self.sc.death_reason, self.v
        if reason == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if reason == "oom":
            exc = torch_oom({"total_gib": self.sc.gpu.total_gib, "free_gib": 0.01, "tried_to_allocate_mib": 1024.0},
                            False, v)
        else:
            exc = "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be " \
                  "asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n" \
                  "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to " \
                  "enable device-side assertions.\n"
        body = frames(("{S}/vllm/v1/engine/core.py", 1499, "run_engine_core", "engine_core.run_busy_loop()"),
                      ("{S}/vllm/v1/engine/core.py", 1540, "run_busy_loop", "self._process_engine_step()"),
                      ("{S}/vllm/v1/engine/core.py", 1575, "_process_engine_step",
                       "outputs, model_executed = self.step_fn()"),
                      ("{S}/vllm/v1/engine/core.py", 460, "step", "model_output = self.model_executor.execute_model("),
                      ("{S}/vllm/v1/worker/gpu_model_runner.py", 3310, "execute_model",
                       "model_output = self._model_forward("))
        tb = traceback_text(body, exc.rstrip("\n"))
        if v >= (0, 8, 5):
            self.log.error("core.py:1519", "EngineCore encountered a fatal error.\n" + tb)
            # run_engine_core re-raises: multiprocessing prints it raw, and the process exits 1
            self.log.raw(f"Process {engine_mp_name(v, 'v1')}:\n" + process_traceback(tb), fd=2)
        else:
            self.log.error("core.py:387", "EngineCore hit an exception: " + tb)
        os._exit(1)


def worker_child_main(parent_pid: str) -> None:
    """Entry of the CPU backend's ``VLLM::Worker`` (a child of EngineCore): idles, leaves with its parent."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, b"VLLM::Worker", 0, 0, 0)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = int(parent_pid)   # from the engine: it may be gone before this interpreter is up
    while os.getppid() == parent:
        time.sleep(0.05)
    Log(Scenario(json.loads(os.environ["FAKE_VLLM_ENGINE_SPEC"])["scenario"]).v, "Worker").info(
        "multiproc_executor.py:843", "Parent process exited, terminating worker queues")


def engine_child_main() -> None:
    """Entry of the forked ``VLLM::EngineCore`` process."""
    spec = json.loads(os.environ["FAKE_VLLM_ENGINE_SPEC"])
    sc = Scenario(spec["scenario"])
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, b"VLLM::EngineCore", 0, 0, 0)
    except (OSError, AttributeError):
        pass
    gen = spec["engine"]
    log = Log(sc.v, engine_proc_name(sc.v, gen))
    ready_fd = int(spec["ready_fd"])
    parent = int(spec.get("api_pid") or os.getppid())   # the API server may be gone before we are up
    holder: dict = {}

    def on_term(signum, frame):
        if sc.v >= (0, 30, 0):
            log.info("core.py:1454", "[shutdown] EngineCore: trigger received signal=SIGTERM")
            log.info("core.py:1635", "[shutdown] EngineCore: start mode=abort timeout=0s")
            log.info("core.py:1666", "[shutdown] EngineCore: request processing complete; starting resource teardown")
            log.info("core.py:1499", "[shutdown] EngineCore: exiting busy loop")
        worker = getattr(holder.get("engine"), "worker", None)
        if worker is not None and worker.poll() is None:
            log.info("multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
            worker.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if sc.ignore_sigterm else on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = holder["engine"] = Engine(spec, log)
    ready = engine.start()
    if ready is None and getattr(engine, "failed_procs", None):
        os.write(ready_fd, (json.dumps({"failed": engine.failed_procs}) + "\n").encode())
    if ready is None:
        if gen == "v1" and (0, 7, 0) <= sc.v < (0, 8, 5):
            os.kill(parent, signal.SIGUSR1)   # the 0.7-0.8.4 fatal-signal path (docs/failure-catalogue.md)
            os._exit(0)
        os._exit(1)
    os.write(ready_fd, (json.dumps(ready) + "\n").encode())
    dies_at = None
    if spec.get("die"):
        dies_at = time.monotonic() + float(sc.engine_death_after)
    orphaned_at = None
    while True:
        time.sleep(min(0.05, sc.speed))
        if dies_at is not None and time.monotonic() >= dies_at:
            engine.die()
        if os.getppid() != parent:  # the API server is gone: real engines linger as orphans
            orphaned_at = orphaned_at or time.monotonic()
            if time.monotonic() - orphaned_at > sc.orphan_timeout:
                os._exit(0)


# ================================================================ API server


def _state_bump(state_dir: str | None, name: str) -> int:
    """Increment a counter file in the scenario's state dir; returns the value before."""
    if not state_dir:
        return 0
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, name)
    try:
        with open(path, encoding="utf-8") as fh:
            before = int(fh.read().strip() or 0)
    except FileNotFoundError:
        before = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(str(before + 1))
    return before


def healed(cond: dict | None, launch: Launch, version: str) -> bool:
    """Whether the flags satisfy the scenario's ``heal_when`` (every key must hold)."""
    if not cond:
        return False
    f = launch.flags

    def num(flag, conv=float):
        raw = f.get(flag)
        if raw is None:
            return None
        try:
            return conv(raw) if conv is float else emu.parse_human_int(raw, version)
        except ValueError:
            return None

    for key, want in cond.items():
        if key == "max_model_len_le":
            got = num("--max-model-len", int)
            if got is None or got > want:
                return False
        elif key == "gpu_memory_utilization_le":
            got = num("--gpu-memory-utilization")
            if got is None or got > want:
                return False
        elif key == "max_num_seqs_le":
            got = num("--max-num-seqs")
            if got is None or got > want:
                return False
        elif key == "max_num_batched_tokens_le":
            got = num("--max-num-batched-tokens", int)
            if got is None or got > want:
                return False
        elif key == "flag":
            for name in [want] if isinstance(want, str) else want:
                if name not in f:
                    return False
        elif key == "flag_value":
            if any(f.get(k) != str(val) for k, val in want.items()):
                return False
        elif key == "env":
            if any(os.environ.get(k) != str(val) for k, val in want.items()):
                return False
        else:
            raise SystemExit(f"fake_vllm: unknown heal_when key {key!r}")
    return True


def replay(path: str, speed: float) -> None:
    """Print a captured log: log records and access lines to stdout, everything else to stderr."""
    import re

    record = re.compile(rb"^(\x1b\[[0-9;]*m)?(\([\w\-]+ pid=\d+\)\s*(\x1b\[[0-9;]*m)?\s*)?"
                        rb"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d |^INFO:     \d+\.\d+\.\d+\.\d+:")
    with open(path, "rb") as fh:
        lines = fh.read().splitlines(keepends=True)
    for i, line in enumerate(lines):
        os.write(1 if record.match(line.lstrip(b"\r")) else 2, line)
        if i % 25 == 24:
            time.sleep(speed / 5)


class Api:
    """The API-server process: banner, config checks, engine launch, HTTP, shutdown."""

    def __init__(self, launch: Launch, sc: Scenario):
        self.launch, self.sc, self.v = launch, sc, sc.v
        self.log = Log(self.v, api_proc_name(self.v))
        self.model = sc.model(launch.model)
        self.engine: subprocess.Popen | None = None
        self.dead = threading.Event()
        self.hung = threading.Event()
        self.stopping = threading.Event()   # set by threads (engine watch)
        self.signalled = False              # set by signal handlers: they must never take a lock
        self.max_len = 0
        self.httpd: ThreadingHTTPServer | None = None
        self.sock: socket.socket | None = None
        self.gen = emu.engine_generation(sc.version, launch.flags, sc.gpu, os.environ)

    # -- start-up ---------------------------------------------------------------------------
    def banner(self) -> None:
        v, log, launch = self.v, self.log, self.launch
        if v >= (0, 15, 0):
            if os.environ.get("VLLM_DISABLE_LOG_LOGO", "").lower() in ("1", "true"):
                log.info("api_utils.py:347", f"vLLM server version {self.sc.version}, serving model {launch.model}")
            else:
                log.info("api_utils.py:347", (
                    "\n       █     █     █▄   ▄█\n"
                    f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {self.sc.version}\n"
                    f"  █▄█▀ █     █     █     █  model   {launch.model}\n"
                    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n"))
        else:
            log.info("api_server.py:712", f"vLLM API server version {self.sc.version}")
        if v >= (0, 10, 2):
            log.info("api_utils.py:286", f"non-default args: {launch.non_default_args()}")
        else:
            log.info("api_server.py:713", f"args: Namespace({', '.join(f'{k}={val!r}' for k, val in launch.non_default_args().items())})")

    def bind(self) -> None:
        # Real vLLM binds after its imports (seconds); "bind_after" holds the socket back that long.
        time.sleep(float(self.sc.raw.get("bind_after", 0)))
        host = self.launch.host or "0.0.0.0"
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if (0, 7, 3) <= self.v < (0, 25, 0) and hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # real 0.7.3-0.24 behaviour
        try:
            sock.bind((host, self.launch.port))
        except OSError as exc:
            sock.close()
            self.log.raw(traceback_text(api_frames(self.launch.serve, "bind"), f"OSError: [Errno {exc.errno}] {os.strerror(exc.errno or 98)}"))
            raise SystemExit(1) from None
        self.sock = sock

    def config(self) -> emu.Outcome:
        sc, v, log, f = self.sc, self.v, self.log, self.launch.flags
        out = emu.simulate(self.model, sc.gpu, sc.version, f, block_size=sc.block_size,
                           activation_gib=sc.activation_gib, cudagraph_gib=sc.cudagraph_gib,
                           context_gib=sc.context_gib, env=dict(os.environ))
        if v >= (0, 10, 0):
            log.info("model.py:733", "Resolved architecture: LlamaForCausalLM")
        if out.kind in ("max_len_exceeds_model",) or (out.kind == "config_error" and out.phase == "config"):
            self.log.raw(api_config_failure(out.kind, v, out.numbers, self.launch.serve))
            raise SystemExit(1)
        if v >= (0, 9, 2):
            log.info("model.py:2152", f"Using max model len {out.numbers.get('max_model_len')}")
        if "--enforce-eager" in f and v >= (0, 12, 0):
            if v >= (0, 28, 0):
                log.warning("vllm.py:1703", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel "
                            "warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                            "--kernel_config.enable_jit_warmup=False")
            else:
                log.warning("vllm.py:503", "Enforce eager set, overriding optimization level to -O0")
        if self.gen == "v0" and (0, 8, 0) <= v < (0, 11, 0):
            log.warning("arg_utils.py:1750", "--kv-cache-dtype is not supported by the V1 Engine. Falling back to V0. ")
        return out

    def spawn_engine(self) -> int:
        """Start ``VLLM::EngineCore``; returns the read end of its ready pipe."""
        r, w = os.pipe()
        dies = False
        if self.sc.engine_death_after is not None:
            before = _state_bump(self.sc.state_dir, "deaths")
            dies = self.sc.death_count is None or before < int(self.sc.death_count)
        spec = {"scenario": self.sc.raw, "flags": self.launch.flags, "model": self.launch.model,
                "served": self.launch.served, "version": self.sc.version, "ready_fd": w, "engine": self.gen,
                "die": dies, "python": sys.executable, "api_pid": os.getpid()}
        env = dict(os.environ, FAKE_VLLM_ENGINE_SPEC=json.dumps(spec))
        preexec = None
        if not self.sc.engine_survives_parent:
            def preexec():  # noqa: D401 - die with the API server (opt-in; real engines do not)
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        self.engine = subprocess.Popen(["VLLM::EngineCore", os.path.abspath(__file__), ENGINE_ARG],
                                       executable=sys.executable, env=env, pass_fds=(w,), preexec_fn=preexec,
                                       stdin=subprocess.DEVNULL)
        os.close(w)
        if self.gen == "v0" and (0, 6, 4) <= self.v < (0, 11, 0):
            self.log.info("api_server.py:231", f"Started engine process with PID {self.engine.pid}")
        return r

    def wait_ready(self, r: int) -> dict | None:
        buf = b""
        while True:
            ready, _, _ = select.select([r], [], [], 0.05)
            if ready:
                chunk = os.read(r, 65536)
                buf += chunk
                if b"\n" in buf:
                    return json.loads(buf.split(b"\n", 1)[0])
                if not chunk and self.engine.poll() is not None:
                    return None
            elif self.engine.poll() is not None:
                return None

    def startup_failed(self, procs: dict | None = None) -> None:
        """The API server's last words after the engine failed to start (docs/failure-catalogue.md)."""
        v = self.v
        if self.engine is not None:
            self.engine.wait()
        time.sleep(self.sc.speed)
        if self.gen == "v0":
            if v >= (0, 6, 4):
                exc = "RuntimeError: Engine process failed to start. See stack trace for the root cause."
            else:
                exc = "RuntimeError: Engine process failed to start"
        elif v >= (0, 9, 0):
            exc = f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {procs or {}}"
        elif v >= (0, 8, 4):
            exc = "RuntimeError: Engine core initialization failed. See root cause above."
        else:
            exc = "RuntimeError: EngineCore initialization failed. See root cause above."
        self.log.raw(traceback_text(api_frames(self.launch.serve, "engine"), exc))
        raise SystemExit(1)

    def serving_lines(self) -> None:
        v, log = self.v, self.log
        host = self.launch.host or "0.0.0.0"
        url = f"http://{host}:{self.launch.port}"
        if v >= (0, 10, 0):
            log.info("entry.py:136", f"Supported tasks: {['embed'] if self.sc.pooling else ['generate']}")
        if v >= (0, 18, 0):
            log.info("entry.py:140", f"Starting vLLM server on {url}")
        elif v >= (0, 9, 1):
            log.info("api_server.py:1880", f"Starting vLLM API server 0 on {url}")
        else:
            log.info("api_server.py:1024", f"Starting vLLM API server on {url}")
        log.info("launcher.py:186", "Available routes are:")
        for path, methods in (("/health", "GET"), ("/version", "GET"), ("/v1/models", "GET"), ("/ping", "GET"),
                              ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                              ("/v1/embeddings", "POST"), ("/metrics", "GET")):
            log.info("launcher.py:195", f"Route: {path}, Methods: {methods}")
        uv = self.uvicorn
        uv(f"Started server process [{os.getpid()}]")
        uv("Waiting for application startup.")
        uv("Application startup complete.")
        if v < (0, 7, 3):
            uv(f"Uvicorn running on {url} (Press CTRL+C to quit)")

    def on_signal(self, signum, frame) -> None:
        # Only a flag: Event.set() here could deadlock on the lock the main thread holds in wait().
        self.signalled = True

    def should_stop(self) -> bool:
        """Sleep a tick; True once a signal or the engine watch asks to stop."""
        time.sleep(0.05)
        return self.signalled or self.stopping.is_set()

    def uvicorn(self, msg: str, fd: int = 2) -> None:
        self.log.raw(f"INFO:     {msg}", fd=fd)

    # -- serving ----------------------------------------------------------------------------
    def serve(self) -> None:
        api = self

        class Handler(_Handler):
            pass
        Handler.api = api
        httpd = ThreadingHTTPServer(self.sock.getsockname()[:2], Handler, bind_and_activate=False)
        httpd.socket.close()
        httpd.socket = self.sock
        httpd.daemon_threads = True
        httpd.server_activate()
        self.httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def engine_watch(self) -> None:
        """Notice the engine's exit while serving (0.10.1+ promptly; older V1 never: docs/failure-catalogue.md)."""
        self.engine.wait()
        if self.stopping.is_set():
            return
        v, log = self.v, self.log
        if self.gen == "v1" and v < (0, 10, 1) and self.engine.returncode == -signal.SIGKILL:
            return  # hard-killed engine: the API server hangs looking healthy
        if v >= (0, 30, 0):   # the real 0.32 sequence after kill -9 of VLLM::EngineCore
            log.info("utils.py:628", "[shutdown] Process manager: send sigterm to process EngineCore")
            log.warning("core_client.py:817", "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
            log.info("core_client.py:770", "[shutdown] MPClient: start timeout=default")
            log.info("core_client.py:772", "[shutdown] MPClient: stopping engine manager")
            log.info("core_client.py:774", "[shutdown] MPClient: engine manager stopped")
            log.info("core_client.py:775", "[shutdown] MPClient: cleaning up background resources")
            log.info("core_client.py:777", "[shutdown] MPClient: complete")
        elif (0, 10, 1) <= v < (0, 20, 0):
            log.error("core_client.py:564", f"Engine core proc {engine_mp_name(v, self.gen)} died unexpectedly, "
                      "shutting down client.")
        if v >= (0, 8, 5) and self.gen == "v1":
            log.error("async_llm.py:906", "AsyncLLM output_handler failed.\n" + traceback_text(frames(
                ("{S}/vllm/v1/engine/async_llm.py", 849, "output_handler",
                 "outputs = await engine_core.get_output_async()"),
                ("{S}/vllm/v1/engine/core_client.py", 1235, "get_output_async",
                 "raise self._format_exception(outputs) from None")),
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause."))
        self.dead.set()
        time.sleep(max(0.2, self.sc.speed * 4))   # the watchdog notices within a moment
        self.stopping.set()

    def shutdown(self, graceful_engine: bool) -> None:
        """uvicorn's shutdown and the engine's end (the real 0.32 SIGTERM sequence); the caller exits 0."""
        v, log = self.v, self.log
        new = v >= (0, 30, 0)
        if graceful_engine and new:
            log.info("launcher.py:254", "[shutdown] API server: shutdown triggered")
            log.info("launcher.py:270", "[shutdown] API server: stopping engine client mode=abort timeout=0s")
            log.info("core_client.py:770", "[shutdown] MPClient: start timeout=0s")
            log.info("core_client.py:772", "[shutdown] MPClient: stopping engine manager")
            log.info("utils.py:628", "[shutdown] Process manager: send sigterm to process EngineCore")
        if self.engine and self.engine.poll() is None:
            self.engine.terminate()
            try:
                self.engine.wait(2)
            except subprocess.TimeoutExpired:
                if new:
                    log.warning("utils.py:648", "[shutdown] Process manager: force killing remaining processes count=1")
                    log.warning("utils.py:653", "[shutdown] Process manager: force killing remaining process "
                                f"EngineCore pid {self.engine.pid}")
                self.engine.kill()
                self.engine.wait()
        if graceful_engine and new:
            log.info("core_client.py:774", "[shutdown] MPClient: engine manager stopped")
            log.info("core_client.py:775", "[shutdown] MPClient: cleaning up background resources")
            log.info("core_client.py:777", "[shutdown] MPClient: complete")
            log.info("launcher.py:279", "[shutdown] API server: engine client stopped")
            log.info("launcher.py:282", "[shutdown] API server: signalling HTTP server shutdown")
            log.info("launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server")
        self.uvicorn("Shutting down")
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.uvicorn("Waiting for application shutdown.")
        self.uvicorn("Application shutdown complete.")
        if not (graceful_engine and new):   # 0.32 prints it after an engine death, not after SIGTERM
            self.uvicorn(f"Finished server process [{os.getpid()}]")

    def run(self) -> int:
        sc = self.sc
        self.banner()
        self.bind()
        self.config()
        if sc.silent_hang_at_start and not sc.fork_engine:
            while True:
                time.sleep(3600)
        r = self.spawn_engine()
        usr1 = threading.Event()
        if self.gen == "v1" and (0, 7, 0) <= self.v < (0, 8, 5):
            signal.signal(signal.SIGUSR1, lambda s, fr: usr1.set())
        ready = self.wait_ready(r)
        if usr1.is_set() or (ready is None and self.gen == "v1" and (0, 7, 0) <= self.v < (0, 8, 5)):
            self.log.log("CRITICAL", "api_server.py:168", "Got fatal signal from worker processes, shutting down. "
                         "See stack trace above for root cause issue.")
            if self.engine.poll() is None:
                self.engine.kill()
            os.kill(os.getpid(), signal.SIGKILL)
        if ready is None or "failed" in ready:
            self.startup_failed((ready or {}).get("failed"))
        self.max_len = ready["max_model_len"]
        if sc.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.serve()
        self.serving_lines()
        threading.Thread(target=self.engine_watch, daemon=True).start()
        hang_at = None if sc.hang_after is None else time.monotonic() + float(sc.hang_after)
        while not self.should_stop():
            if hang_at is not None and time.monotonic() >= hang_at:
                self.hung.set()
        self.shutdown(graceful_engine=not self.dead.is_set())
        return 0


class _Handler(BaseHTTPRequestHandler):
    """vLLM's OpenAI routes, answered from the scenario; access log on stdout like uvicorn."""

    api: Api
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler API
        pass

    def _send(self, code: int, body: object | None = None, ctype="application/json") -> None:
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        import http
        phrase = http.HTTPStatus(code).phrase
        if os.environ.get("FAKE_VLLM_ACCESS_LOG", "1") != "0":
            host, port = self.client_address[:2]
            self.api.log.raw(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}', fd=1)

    def _error(self, code: int, message: str, etype: str, param: str | None = None) -> None:
        if self.api.v >= (0, 20, 0):
            self._send(code, {"error": {"message": message, "type": etype, "param": param, "code": code}})
        else:
            self._send(code, {"object": "error", "message": message, "type": etype, "param": param, "code": code})

    def _hold(self) -> bool:
        if self.api.hung.is_set():
            threading.Event().wait()   # accept, never answer
        return False

    def _authorised(self) -> bool:
        keys = self.api.launch.api_keys
        if not keys or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization", "") in {f"Bearer {key}" for key in keys}:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _dead_health(self) -> int:
        v = self.api.v
        if v >= (0, 11, 0):
            return 503
        if v >= (0, 9, 2):
            return 500
        return 200

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler API
        self._hold()
        path = self.path.split("?")[0]
        api = self.api
        if path in ("/health", "/ping"):
            self._send(self._dead_health() if api.dead.is_set() else 200, None)
        elif path == "/version":
            self._send(200, {"version": api.sc.version})
        elif path == "/v1/models":
            if not self._authorised():
                return
            now = int(time.time())
            self._send(200, {"object": "list", "data": [{
                "id": api.launch.served, "object": "model", "created": now, "owned_by": "vllm",
                "root": api.launch.model, "parent": None, "max_model_len": api.max_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                                "created": now, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}]})
        elif path == "/metrics":
            self._send(200, b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                       b"vllm:num_requests_running 0.0\n", ctype="text/plain; version=0.0.4")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802 - BaseHTTPRequestHandler API
        self._hold()
        path = self.path.split("?")[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/ping"):
            self._send(404, {"detail": "Not Found"})
            return
        if path == "/ping":
            self._send(self._dead_health() if self.api.dead.is_set() else 200, None)
            return
        if not self._authorised():
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send(400, {"error": {"message": f"JSON decode error: {exc}", "type": "BadRequestError",
                                       "param": None, "code": 400}})
            return
        self.answer(path, body)

    def answer(self, path: str, body: dict) -> None:
        api = self.api
        if api.dead.is_set():
            self._error(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError")
            return
        kind = {"/v1/chat/completions": "Chat Completions", "/v1/completions": "Completions"}.get(path)
        if api.sc.pooling and kind:
            self._error(501, f"The model does not support {kind} API", "NotImplementedError")
            return
        if not api.sc.pooling and path == "/v1/embeddings":
            self._send(404, {"detail": "Not Found"})
            return
        model = body.get("model")
        if model and model != api.launch.served:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
            return
        if path == "/v1/chat/completions" and api.sc.no_chat_template:
            self._error(400, "As of transformers v4.44, default chat template is no longer allowed, so you must "
                        "provide a chat template if the tokenizer does not define one.", "BadRequestError")
            return
        if path == "/v1/embeddings":
            inputs = body.get("input", "")
            items = inputs if isinstance(inputs, list) else [inputs]
            ntok = sum(len(str(x).split()) + 1 for x in items)
            self._send(200, {"id": f"embd-{uuid.uuid4().hex[:16]}", "object": "list", "created": int(time.time()),
                             "model": api.launch.served,
                             "data": [{"index": i, "object": "embedding",
                                       "embedding": [round(0.01 * ((i + j) % 7), 4) for j in range(8)]}
                                      for i in range(len(items))],
                             "usage": {"prompt_tokens": ntok, "total_tokens": ntok, "completion_tokens": 0,
                                       "prompt_tokens_details": None}})
            return
        if path == "/v1/chat/completions":
            text_in = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
            prompt_tokens = len(text_in.split()) + 6 * len(body.get("messages") or [])
        else:
            text_in = str(body.get("prompt", ""))
            prompt_tokens = len(text_in.split()) + 1
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        room = api.max_len - prompt_tokens
        if limit is not None and int(limit) > room:
            self._error(400, f"'max_tokens' or 'max_completion_tokens' is too large: {limit}. This model's maximum "
                        f"context length is {api.max_len} tokens and your request has {prompt_tokens} input tokens "
                        f"({limit} > {api.max_len} - {prompt_tokens}).", "BadRequestError", "max_tokens")
            return
        n_out = min(int(limit) if limit is not None else 16, 64)
        words = ["hello", " world", " from", " the", " fake", " vllm", " server", "."]
        content = "".join(words[i % len(words)] for i in range(n_out))
        finish = "length" if limit is not None and n_out >= int(limit) else "stop"
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n_out,
                 "completion_tokens": n_out, "prompt_tokens_details": None}
        now = int(time.time())
        if path == "/v1/chat/completions":
            choice = {"index": 0, "message": {"role": "assistant", "content": content, "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None,
                                              "tool_calls": [], "reasoning": None},
                      "logprobs": None, "finish_reason": finish, "stop_reason": None, "token_ids": None}
            resp = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": now,
                    "model": api.launch.served, "choices": [choice], "service_tier": None,
                    "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
                    "prompt_token_ids": None, "kv_transfer_params": None}
        else:
            resp = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": now,
                    "model": api.launch.served,
                    "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": finish,
                                 "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                 "prompt_token_ids": None}],
                    "service_tier": None, "system_fingerprint": None, "usage": usage, "kv_transfer_params": None}
        if body.get("stream"):
            self.stream(resp, content)
        else:
            self._send(200, resp)

    def stream(self, resp: dict, content: str) -> None:
        chunks = []
        chat = resp["object"] == "chat.completion"
        for piece in [content[i:i + 8] for i in range(0, len(content), 8)] or [""]:
            delta = {"choices": [{"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}]}
            chunks.append({"id": resp["id"], "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": resp["created"], "model": resp["model"], **delta})
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self._send(200, data, ctype="text/event-stream; charset=utf-8")


# ================================================================ single-process (V0 / fork_engine false)


def run_inline(api: Api) -> int:
    """Everything in one process (vLLM < 0.8 style, or ``fork_engine: false``)."""
    sc = api.sc
    api.banner()
    api.bind()
    api.config()
    spec = {"scenario": sc.raw, "flags": api.launch.flags, "model": api.launch.model,
            "served": api.launch.served, "version": sc.version, "engine": api.gen}
    engine = Engine(spec, Log(sc.v, None))
    ready = engine.start()
    if ready is None:
        if (0, 5, 5) <= sc.v < (0, 6, 3):
            api.log.error("api_server.py:121", "RPCServer process died before responding to readiness probe")
            return 0
        api.startup_failed()
    api.max_len = ready["max_model_len"]
    signal.signal(signal.SIGTERM, signal.SIG_IGN if sc.ignore_sigterm else api.on_signal)
    api.serve()
    api.serving_lines()
    hang_at = None if sc.hang_after is None else time.monotonic() + float(sc.hang_after)
    while not api.should_stop():
        if hang_at is not None and time.monotonic() >= hang_at:
            api.hung.set()
    api.shutdown(graceful_engine=True)
    return 0


# ================================================================ main


def main(argv: list[str]) -> int:
    if argv[:1] == [ENGINE_ARG]:
        engine_child_main()
        return 0
    if argv[:1] == [WORKER_ARG]:
        worker_child_main(argv[1])
        return 0
    sc = load_scenario()
    if argv[:1] in (["--version"], ["-v"]) and sc.v >= (0, 6, 5):
        print(sc.version)
        return 0
    launch = Launch(argv, sc.version)
    if sc.state_dir:
        _state_bump(sc.state_dir, "launches")
        with open(os.path.join(sc.state_dir, "launches.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"argv": argv, "pid": os.getpid()}) + "\n")
    if sc.replay and not healed(sc.heal_when, launch, sc.version):
        replay(sc.replay, sc.speed)
        time.sleep(sc.replay_wait)
        if sc.replay_tail:
            replay(sc.replay_tail, sc.speed)
        return sc.replay_exit
    api = Api(launch, sc)

    def interrupted(signum, frame):  # vLLM's start-up SIGTERM handler (entry.py:172)
        raise KeyboardInterrupt("terminated")

    signal.signal(signal.SIGTERM, signal.SIG_IGN if sc.ignore_sigterm else interrupted)
    try:
        return api.run() if sc.fork_engine else run_inline(api)
    except KeyboardInterrupt as exc:
        if api.engine and api.engine.poll() is None:
            api.engine.terminate()
            api.engine.wait()
        api.log.raw(traceback_text(api_frames(launch.serve, "engine").rsplit("\n", 4)[0],
                                   f"KeyboardInterrupt: {exc}"))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)   # an uncaught KeyboardInterrupt ends Python by SIGINT
        return 130


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        os._exit(1)
