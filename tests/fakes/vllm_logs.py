"""vLLM logs built from the catalogue (``tests/fixtures/catalogue``), the way each version prints them.

For one row of ``messages.tsv`` and one vLLM version, :func:`cases` gives short, realistic logs:
that version's start-up milestones up to where the message is printed (texts from the milestone
rows), then the message itself: a raise as a traceback through that version's call path for the
phase (``chains.tsv``) ending in the row's exception line, wrapped the way that version's processes
wrap a failure (the engine core's ``logger.exception``, the raw traceback of the process, the API
server's wrapper); a log call as a record with that version's log prefix. Each case carries the
verdict the classifier must reach. Nothing here is copied from real logs; the texts are the table's.

How each version prints (from vLLM's ``vllm/logger.py`` and the process entry points):

* log prefix ``LEVEL mm-dd hh:mm:ss file.py:N]`` up to 0.7, ``[file.py:N]`` from 0.8; the
  ``(Name pid=N)`` process tag added to a child's stdout/stderr from 0.10.1, and put inside the
  log format itself from 0.31;
* a start-up failure of the V1 engine core (0.8.5+): ``EngineCore failed to start.`` with the
  traceback (logger.exception), then ``Process EngineCore:`` and the raw traceback on stderr, then
  the API server's ``RuntimeError: Engine core initialization failed. See root cause above.``;
  0.8.0-0.8.4: ``EngineCore hit an exception:`` + ``Got fatal signal from worker processes`` and a
  SIGKILL of the tree (exit -9); V0 0.6.2-0.10.2: the MQ engine's error, ``Process SpawnProcess-1:``
  and ``Engine process failed to start``; 0.5.5-0.6.1: ``RPCServer process died before responding
  to readiness probe`` (exit 0);
* a failure while serving: ``EngineCore encountered a fatal error.`` + ``AsyncLLM output_handler
  failed.`` + ``EngineDeadError`` (V1 0.8.5+), the V0 engine loop's ``Engine background task failed``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parents[1] / "fixtures" / "catalogue"
SITE = "/usr/local/lib/python3.12/dist-packages/"
#: the newest vLLM the catalogue was read from
NEWEST = "0.34.0"
TS = "11-30 12:00:00"
PIDS = {"api": 2817, "engine": 3120, "worker": 3301}

PHASE_ORDER = ["config", "engine_init", "loading", "profiling", "kv_cache", "cudagraph", "warmup", "api_starting",
               "serving"]
#: call paths (chains.tsv) -> the start-up phase they belong to
PHASE_OF = {"kv_cache_alloc": "kv_cache", "profiling_sampler": "profiling", "warmup_sampler": "warmup",
            "loading_repack": "loading", "profiling_mm": "profiling", "kv_cache_final": "kv_cache",
            "kv_cache_refit": "kv_cache", "kv_cache_commit": "kv_cache"}
#: call paths that size the KV cache again after warm-up and capture (the extensible KV cache, 0.34+): the
#: start-up printed every milestone up to the end of warm-up before them
AFTER_WARMUP = ("kv_cache_final", "kv_cache_refit", "kv_cache_commit")
#: where an out-of-memory error in each phase sends the guard (see docs/failure-catalogue.md)
OOM_KIND = {"config": "oom_weights", "engine_init": "oom_weights", "loading": "oom_weights",
            "profiling": "oom_profile", "kv_cache": "oom_profile", "cudagraph": "oom_cudagraph",
            "warmup": "oom_profile", "api_starting": "oom_runtime", "serving": "oom_runtime"}
#: the phases an error printed anywhere ("any") is tried in
ANY = ["loading", "loading_repack", "profiling", "profiling_mm", "kv_cache_alloc", "cudagraph", "warmup", "serving"]
#: the packages beside vLLM whose texts are rows (their source is no vLLM file)
OTHER_PACKAGES = ("torch", "huggingface", "transformers", "uvicorn", "pydantic", "argparse", "socket", "ray")
#: versions tried for a third-party text that every version can print
REPRESENTATIVE = ["0.5.0", "0.5.5", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.10.2", "0.14.1", "0.20.2", "0.33.0",
                  "0.34.0"]
#: wrappers whose own text quotes their root cause (so a root cause printed before them is not the only one)
QUOTES_ROOT = {"worker_failed_with_error@0.8.4", "worker_failed_with_error@0.8.5.post1", "v0_engine_loop_dead@0.6.2b"}
#: a root cause no rule names, for the wrappers that say "see the root cause above"
UNKNOWN_ROOT = "KeyError: 'model.layers.0.self_attn.qkv_proj.weight'"
OOM_ROOT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.19 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.94 GiB "
            "memory in use. Of the allocated memory 76.00 GiB is allocated by PyTorch, and 1.20 GiB is reserved "
            "by PyTorch but unallocated.")


def vkey(version: str) -> tuple[int, ...]:
    """Order of vLLM versions: 0.5.3 < 0.5.3.post1 < 0.5.4; ``pre-0.5`` before all."""
    if version.startswith("pre-"):
        return (0, 4)
    out = []
    for part in version.split("."):
        if part.startswith("post"):
            out.append(int(part[4:] or 0))
        else:
            out.append(int(re.match(r"\d+", part).group(0)))
    return tuple(out)


def vge(v: str, w: str) -> bool:
    return vkey(v) >= vkey(w)


def is_v1(v: str) -> bool:
    return vge(v, "0.8.0")


def _unescape(s: str) -> str:
    return s.replace("\\n", "\n").replace("\\t", "\t")


@cache
def messages() -> tuple[dict, ...]:
    with open(CATALOGUE / "messages.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    for r in rows:
        r["base"] = r["id"].split("@", 1)[0]
        r["example"] = _unescape(r["example"])
    return tuple(rows)


@cache
def chains() -> tuple[dict, ...]:
    with open(CATALOGUE / "chains.tsv", encoding="utf-8", newline="") as fh:
        return tuple(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


@cache
def frames() -> tuple[dict, ...]:
    with open(CATALOGUE / "frames.tsv", encoding="utf-8", newline="") as fh:
        return tuple(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def in_range(row: dict, v: str) -> bool:
    first, last = row["first_version"], row["last_version"]
    return vkey(first) <= vkey(v) <= vkey(last)


def chain_for(v: str, name: str) -> list[tuple[str, str]]:
    for c in chains():
        if c["chain"] == name and in_range(c, v):
            return [tuple(part.rsplit(":", 1)) for part in c["frames"].split(" > ")]
    return []


def has_chain(v: str, name: str) -> bool:
    return bool(chain_for(v, name))


@dataclass
class Case:
    """One synthetic log and the verdict it must get."""

    name: str
    row: str
    version: str
    lines: list[str]
    exit_code: int | None
    kind: str
    phase: str | None            # None: any phase is acceptable (a verdict that names no failure)
    evidence: str = ""           # a substring the evidence must contain ("" = not checked)
    numbers: dict = field(default_factory=dict)
    start: int = 0               # the first line of the failure (the lines before it: the start-up's milestones)


# ------------------------------------------------------------------------------- formatting
def proc_prefix(v: str, proc: str) -> str:
    """The ``(Name pid=N)`` tag vLLM puts on a subprocess' stdout/stderr (0.10.1 to 0.30)."""
    if vge(v, "0.31.0"):
        return ""
    pid = PIDS[proc]
    if proc == "api":
        return f"(APIServer pid={pid}) " if vge(v, "0.10.1.1") else ""
    if proc == "engine":
        if not is_v1(v) or not vge(v, "0.10.1.1"):
            return ""
        if v == "0.10.1.1":
            return f"(EngineCore_0 pid={pid}) "
        return f"(EngineCore_DP0 pid={pid}) " if not vge(v, "0.18.0") else f"(EngineCore pid={pid}) "
    if not is_v1(v):
        return f"(VllmWorkerProcess pid={pid}) "
    if not vge(v, "0.10.1.1"):
        return f"(VllmWorker rank=1 pid={pid}) "
    return f"(VllmWorker TP1 pid={pid}) " if v == "0.10.1.1" else f"(Worker_TP1 pid={pid}) "


def proc_name(v: str, proc: str) -> str:
    return {"api": "APIServer", "engine": "EngineCore" if vge(v, "0.18.0") else "EngineCore_DP0",
            "worker": "Worker_TP1"}[proc]


def header(v: str, proc: str, level: str, fname: str, lineno: int) -> str:
    lvl = {"exception": "ERROR", "error": "ERROR", "warning": "WARNING", "info": "INFO", "critical": "CRITICAL",
           "debug": "DEBUG"}[level]
    base = fname.rsplit("/", 1)[-1]
    if vge(v, "0.31.0"):
        return f"({proc_name(v, proc)} pid={PIDS[proc]}) {lvl} {TS} [{base}:{lineno}] "
    if vge(v, "0.8.0"):
        return f"{proc_prefix(v, proc)}{lvl} {TS} [{base}:{lineno}] "
    return f"{lvl} {TS} {base}:{lineno}] "


def log(v: str, proc: str, level: str, fname: str, lineno: int, text: str) -> list[str]:
    """A log record; each line of a multi-line message gets the prefix (vLLM's NewLineFormatter)."""
    h = header(v, proc, level, fname, lineno)
    return [h + part for part in text.split("\n")]


def raw(v: str, proc: str, text: str) -> list[str]:
    """stderr text (tracebacks): tagged by the process prefix before 0.31, bare from 0.31."""
    p = proc_prefix(v, proc)
    return [p + part for part in text.split("\n")]


def source_of(row: dict) -> tuple[str, str]:
    """(file, function) of the row's source."""
    path, _, where = row["source"].partition(":")
    return path, where.rsplit(".", 1)[-1]


def lineno(row: dict) -> int:
    return 100 + sum(map(ord, row["id"])) % 900


# ------------------------------------------------------------------------------- milestones
_VERSIONED = ("m_api_version", "m_server_version", "m_init_engine_v0", "m_init_engine_v1", "m_logo")
_CONFIG_DUMP = ("model='Qwen/Qwen2.5-7B-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-7B-Instruct', "
                "dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=4, pipeline_parallel_size=1, "
                "quantization=None, enforce_eager=False, kv_cache_dtype=auto, seed=0")


def milestone_row(base: str, v: str, want: str | None = None) -> dict | None:
    for r in messages():
        if r["base"] == base and r["kind"].startswith("milestone:") and in_range(r, v) \
                and (want is None or re.search(want, r["template"])):
            return r
    return None


def milestone_text(r: dict, v: str) -> str:
    text = r["example"]
    if r["base"] in _VERSIONED:
        text = re.sub(r"\d+\.\d+\.\d+(?:\.post\d+|\.\d+)?", v, text, count=1)
    if text.endswith("with config: "):
        text += _CONFIG_DUMP
    return text


def milestone(base: str, v: str, proc: str, want: str | None = None) -> list[str]:
    r = milestone_row(base, v, want)
    if r is None:
        return []
    text = milestone_text(r, v)
    if r["level"] == "progress":
        bar = (f"{text}:  45%|████▌     | 30/67 [00:02<00:02, 14.8it/s]" if "Capturing" in text
               else f"{text}:  50% Completed | 2/4 [00:01<00:01,  1.22it/s]")
        return raw(v, proc, bar) if not vge(v, "0.31.0") else [bar]
    if base.startswith("m_uvicorn"):
        return raw(v, "api", "INFO:     " + text)
    path, _ = source_of(r)
    return log(v, proc, r["level"] if r["level"] in ("info", "warning") else "info", path, lineno(r), text)


def milestones(v: str, upto: str) -> list[str]:
    """The milestone lines of a start-up that reached ``upto`` (a failure happens while in it)."""
    if upto in AFTER_WARMUP:
        # warmed up (V1 warms up before it captures), captured, then measured what is left for the KV cache
        return (milestones(v, "cudagraph") + milestone("m_capture_done", v, "engine")
                + milestone("m_memory_after_warmup", v, "worker"))
    ph = PHASE_OF.get(upto, upto)
    k = PHASE_ORDER.index(ph)
    out: list[str] = []
    eng = "engine"
    out += milestone("m_server_version", v, "api") if vge(v, "0.15.0") else milestone("m_api_version", v, "api")
    out += milestone("m_non_default_args", v, "api") or milestone("m_args", v, "api")
    if k == 0:
        return out
    out += milestone("m_resolved_arch", v, "api")
    out += milestone("m_using_max_model_len", v, "api")
    if not is_v1(v):
        out += milestone("m_started_engine_process", v, "api")
        out += milestone("m_init_engine_v0", v, eng)
    else:
        out += milestone("m_init_engine_v1", v, eng, want="V1")
        out += milestone("m_world_size_rank", v, eng)
    if k == 1:
        return out
    out += milestone("m_start_load", v, eng) or milestone("m_loading_from_scratch", v, eng)
    out += milestone("m_load_shards", v, eng, want="safetensors")
    if k == 2:
        return out
    out += milestone("m_loading_weights_took", v, eng)
    out += milestone("m_model_loading_took", v, eng, want="Model loading took" if is_v1(v) else None)
    if is_v1(v):
        out += milestone("m_compile_cache_dir", v, eng)
        out += milestone("m_dynamo_transform", v, eng)
    if k == 3:
        if is_v1(v):
            out += milestone("m_compile_graph", v, eng)
        return out
    if is_v1(v):
        out += milestone("m_compile_graph", v, eng)
        out += milestone("m_compile_total", v, eng)
        out += milestone("m_available_kv_memory", v, eng)
    else:
        out += milestone("m_v0_memory_profiling", v, eng)
    if upto == "kv_cache":
        return out      # the KV sizing check fails before the size is logged
    if is_v1(v):
        out += milestone("m_kv_cache_size", v, eng) or milestone("m_gpu_blocks_v1", v, eng)
        out += milestone("m_max_concurrency", v, eng)
    else:
        out += milestone("m_gpu_blocks_v0", v, eng)
        out += milestone("m_max_concurrency", v, eng)
    if ph == "kv_cache":
        return out
    if upto == "warmup" and is_v1(v):
        # V1 warms kernels up (compile sizes, DeepGEMM, FlashInfer autotune) before it captures
        out += milestone("m_compile_warmup_size", v, eng)
        out += milestone("m_jit_warmup", v, eng, want="starting")
        return out
    if is_v1(v):
        out += milestone("m_capture_progress", v, eng, want=r"\(|shapes")
    else:
        out += milestone("m_capture_start_v0", v, eng)
    if ph == "cudagraph":
        return out
    out += milestone("m_capture_done", v, eng)
    if ph == "warmup":
        return out
    out += milestone("m_init_engine_took", v, eng, want=r"took \{elapsed:%\.2f\} s$|seconds")
    out += milestone("m_starting_api_server", v, "api")
    out += milestone("m_available_routes", v, "api")
    out += milestone("m_uvicorn_started", v, "api")
    out += milestone("m_uvicorn_waiting", v, "api")
    if ph == "api_starting":
        return out
    out += milestone("m_uvicorn_complete", v, "api")
    return out


def serving_traffic(v: str) -> list[str]:
    """What a serving vLLM prints between requests: access lines and the engine's stats."""
    out = raw(v, "api", 'INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    out += log(v, "api", "info", "loggers.py", 123, "Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation "
               "throughput: 95.1 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 61.2%")
    return out


# ------------------------------------------------------------------------------- tracebacks
def traceback(v: str, chain: str, final: tuple[str, str] | None = None) -> list[str]:
    calls = chain_for(v, chain)
    if final and (not calls or calls[-1] != final):
        calls = calls[: calls.index(final) + 1] if final in calls else calls + [final]
    lines = ["Traceback (most recent call last):"]
    for i, (f, func) in enumerate(calls):
        lines.append(f'  File "{SITE}{f}", line {100 + 7 * i}, in {func}')
    return lines


def final_lines(r: dict, v: str) -> list[str]:
    """The exception line(s) a raise row ends its traceback with at version ``v``."""
    example = r["example"]
    exc = r["level"].split(":", 1)[1]
    if example.startswith("torch.OutOfMemoryError") and not vge(v, "0.5.4"):
        example = "torch.cuda." + example[len("torch."):]      # torch <= 2.3 (vLLM <= 0.5.3)
    if r["pydantic"] and vge(v, "0.9.1"):
        text = example.split(": ", 1)[1] if ": " in example else example
        kind = "Assertion failed" if exc.endswith("AssertionError") else "Value error"
        return [f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {r['pydantic']}",
                f"  {kind}, {text} [type={'assertion_error' if kind.startswith('A') else 'value_error'}, "
                "input_value=ArgsKwargs((), {'model': 'Qwen/Qwen2.5-7B-Instruct'}), input_type=ArgsKwargs]",
                "    For further information visit https://errors.pydantic.dev/2.11/v/value_error"]
    return example.split("\n")


def envelope_raise(r: dict | None, v: str, chain: str, proc: str, final: list[str] | None = None,
                   site: tuple[str, str] | None = None) -> tuple[list[str], int]:
    """A raise at version ``v`` in ``chain``, wrapped the way that version's processes do."""
    final = final if final is not None else final_lines(r, v)
    if site is None and r is not None and not r["source"].startswith(OTHER_PACKAGES):
        site = source_of(r)
    ph = PHASE_OF.get(chain, chain)
    tb = traceback(v, chain, site) + final
    if proc == "api" or ph == "config":
        return raw(v, "api", "\n".join(traceback(v, "config", site) + final)), 1
    if ph == "serving":
        if vge(v, "0.8.5.post1"):
            out = log(v, "engine", "exception", "core.py", 720, "EngineCore encountered a fatal error.\n" + "\n".join(tb))
            out += log(v, "api", "exception", "async_llm.py", 480, "AsyncLLM output_handler failed.")
            out += raw(v, "api", "\n".join([
                "Traceback (most recent call last):",
                f'  File "{SITE}vllm/v1/engine/async_llm.py", line 439, in output_handler',
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
                "for the root cause."]))
            return out, 0
        if is_v1(v):
            out = log(v, "engine", "error", "core.py", 200, "EngineCore hit an exception: " + "\n".join(tb))
            out += log(v, "api", "critical", "core_client.py", 60, "Got fatal signal from worker processes, shutting "
                       "down. See stack trace above for root cause issue.")
            return out, -9
        out = log(v, "engine", "error", "async_llm_engine.py", 65, "Engine background task failed")
        out += raw(v, "engine", "\n".join(tb))
        if vge(v, "0.5.5"):
            out += log(v, "api", "critical", "launcher.py", 98, "AsyncLLMEngine has failed, terminating server process")
        return out, 0
    out: list[str] = []
    if proc == "worker" and vge(v, "0.8.5.post1"):
        body = tb[1:-len(final)]
        k = next((i for i, ln in enumerate(body) if "/vllm/v1/worker/" in ln), 0)
        mp = f'  File "{SITE}vllm/v1/executor/multiproc_executor.py", line '
        early = ph in ("engine_init", "loading")
        wtb = (["Traceback (most recent call last):", mp + "640, in worker_main",
                mp + ("512, in __init__" if early else "702, in worker_busy_loop")] + body[k:] + final)
        out += log(v, "worker", "exception", "multiproc_executor.py", 540,
                   ("WorkerProc failed to start." if early else "WorkerProc hit an exception.") + "\n" + "\n".join(wtb))
        if early:
            tb = traceback(v, "engine_init")[:-3] + [
                mp + "120, in _init_executor", mp + "560, in wait_for_ready",
                "Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
                "trace for root cause."]
        else:
            head = [ln for ln in tb[:1 + k] if "uniproc_executor" not in ln and "run_method" not in ln]
            tb = head + [mp + "250, in collective_rpc", mp + "290, in get_response",
                         f"RuntimeError: Worker failed with error '{final[-1].split(': ', 1)[-1]}', please check the "
                         "stack trace above for the root cause"]
    elif proc == "worker" and not is_v1(v):
        out += log(v, "worker", "exception", "multiproc_worker_utils.py", 233,
                   "Exception in worker VllmWorkerProcess while processing method load_model.\n" + "\n".join(tb))
    if vge(v, "0.8.5.post1"):
        out += log(v, "engine", "exception", "core.py", 718, "EngineCore failed to start.\n" + "\n".join(tb))
        name = "EngineCore" if vge(v, "0.18.0") else "EngineCore_DP0" if vge(v, "0.10.2") else "EngineCore_0"
        out += [f"Process {name}:"]
        out += raw(v, "engine", "\n".join(tb[:1] + ['  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, '
                                                   "in _bootstrap"] + tb[1:]))
        wrap = "RuntimeError: Engine core initialization failed. See root cause above."
        if vge(v, "0.9.0"):
            wrap += " Failed core proc(s): {}"
        out += raw(v, "api", "\n".join([
            "Traceback (most recent call last):",
            f'  File "{SITE}vllm/entrypoints/openai/api_server.py", line 1850, in run_server',
            f'  File "{SITE}vllm/entrypoints/openai/api_server.py", line 178, in build_async_engine_client_from_engine_args',
            f'  File "{SITE}vllm/v1/engine/utils.py", line 760, in wait_for_engine_startup', wrap]))
        return out, 1
    if is_v1(v):   # 0.8.0-0.8.4: logged, then SIGUSR1 makes the API server kill its tree
        out += log(v, "engine", "error", "core.py", 242, "EngineCore hit an exception: " + "\n".join(tb))
        out += log(v, "api", "critical", "core_client.py", 98, "Got fatal signal from worker processes, shutting down. "
                   "See stack trace above for root cause issue.")
        out += ["Killed"]
        return out, -9
    if vge(v, "0.6.2"):
        if vge(v, "0.6.4"):
            out += log(v, "engine", "error", "engine.py", 366, final[0].split(": ", 1)[-1] + "\n" + "\n".join(tb))
        out += ["Process SpawnProcess-1:"] + raw(v, "engine", "\n".join(tb))
        wrap = ("RuntimeError: Engine process failed to start. See stack trace for the root cause." if vge(v, "0.6.4")
                else "RuntimeError: Engine process failed to start")
        out += ["Traceback (most recent call last):",
                f'  File "{SITE}vllm/entrypoints/openai/api_server.py", line 585, in run_server',
                f'  File "{SITE}vllm/entrypoints/openai/api_server.py", line 107, in build_async_engine_client',
                f'  File "{SITE}vllm/entrypoints/openai/api_server.py", line 194, in build_async_engine_client_from_engine_args',
                wrap]
        return out, 1
    if vge(v, "0.5.5"):
        out += ["Process Process-1:"] + tb
        out += log(v, "api", "error", "api_server.py", 151, "RPCServer process died before responding to readiness probe")
        return out, 0
    return out + tb, 1


def envelope_log(r: dict, v: str, chain: str, proc: str, root: str = UNKNOWN_ROOT) -> tuple[list[str], int | None]:
    """A log-call row: the record itself (a logger.exception record carries the traceback of ``root``)."""
    text = r["example"]
    lvl = r["level"]
    path, _ = source_of(r)
    if r["source"].startswith(("uvicorn", "argparse")) or r["id"].startswith("argparse"):
        if r["id"].startswith("argparse"):
            return ["usage: vllm serve [model_tag] [options]", r["example"]], 2
        return raw(v, "api", "ERROR:    " + text), 1
    level = lvl if lvl in ("info", "warning", "error", "critical", "exception") else "error"
    out = log(v, proc, level, path, lineno(r), text)
    if lvl == "exception":
        out += log(v, proc, "exception", path, lineno(r), "\n".join(traceback(v, chain) + [root]))
    if lvl in ("warning", "info"):
        return out, None
    return out, 1


# ------------------------------------------------------------------------------- cases
def versions_of(r: dict) -> list[str]:
    first, last = r["first_version"], r["last_version"]
    if first.startswith("pre-"):
        return ["0.5.0"]
    if first == "0.5.0" and last == NEWEST and r["source"].startswith(OTHER_PACKAGES):
        return REPRESENTATIVE
    return sorted({first, last}, key=vkey)


def chains_of(r: dict, v: str) -> list[str]:
    where = r["where"].split()
    if where == ["any"]:
        where = ANY
    out = []
    for w in where:
        if w in ("config", "engine_init", "api_starting", "serving") or has_chain(v, w):
            out.append(w)
    return out


def expected_kind(kind: str, chain: str) -> str:
    ph = PHASE_OF.get(chain, chain)
    if kind == "oom":
        return OOM_KIND[ph]
    if kind == "cuda_error":
        return "oom_cudagraph" if ph == "cudagraph" else "engine_dead"
    return kind


def _numbers(r: dict) -> dict:
    out = {}
    for item in filter(None, (r.get("guard_numbers") or "").split(";")):
        key, _, value = item.strip().partition("=")
        value = value.strip()
        try:
            out[key.strip()] = int(value)
        except ValueError:
            try:
                out[key.strip()] = float(value)
            except ValueError:
                out[key.strip()] = {"true": True, "false": False}.get(value, value)
    return out


def cases(r: dict) -> list[Case]:
    """The logs a failure row is checked with, and the verdict of each."""
    if r["kind"].startswith("milestone:"):
        return []
    if r["role"] == "lookalike":
        return [c for v in versions_of(r) if (c := lookalike_case(r, v))]
    out: list[Case] = []
    procs = r["process"].split()
    for v in versions_of(r):
        for chain in chains_of(r, v):
            for proc in procs:
                if proc == "worker" and r["process"] != "worker" and (chain == "serving" or v not in ("0.6.6.post1", "0.10.2",
                                                                                                      NEWEST)):
                    continue   # the TP-worker variants of the rows printed by any process: three versions
                out += _cases_at(r, v, chain, proc)
    return out


def _cases_at(r: dict, v: str, chain: str, proc: str) -> list[Case]:
    head = len(milestones(v, chain)) + (len(serving_traffic(v)) if PHASE_OF.get(chain, chain) == "serving" else 0)
    out = _cases_at_(r, v, chain, proc)
    for c in out:
        c.start = head
    return out


def _cases_at_(r: dict, v: str, chain: str, proc: str) -> list[Case]:
    ph = PHASE_OF.get(chain, chain)
    name = f"{r['id']}@{v}/{chain}" + ("/tp2" if proc == "worker" and r["process"] != "worker" else "")
    head = milestones(v, chain)
    if ph == "serving":
        head += serving_traffic(v)
    raises = r["level"].startswith("raise:")
    if r["role"] == "wrapper":
        cases = []
        if raises:
            tail, code = envelope_raise(r, v, chain, proc)
            cases.append(Case(name + "/alone", r["id"], v, head + tail, code, "engine_dead", ph))
            if r["id"] in QUOTES_ROOT:
                return cases
            root, _ = envelope_raise(None, v, chain, proc, final=[UNKNOWN_ROOT], site=None)
            cases.append(Case(name + "/unknown-root", r["id"], v, head + root + tail, code, "unknown_failure", ph,
                              UNKNOWN_ROOT))
        else:
            tail, code = envelope_log(r, v, chain, proc)
            if r["level"] == "exception":
                cases.append(Case(name + "/unknown-root", r["id"], v, head + tail, code, "unknown_failure", ph,
                                  UNKNOWN_ROOT))
                # the paste cut inside the root cause's traceback, before its exception line: nothing names what
                # failed (while serving, the engine died all the same)
                at = next(i for i, line in enumerate(tail) if line.endswith(UNKNOWN_ROOT))
                cases.append(Case(name + "/cut-root", r["id"], v, head + tail[:at], None,
                                  "engine_dead" if ph == "serving" else "unknown_failure", ph,
                                  "" if ph == "serving" else "a traceback cut off before its exception line"))
                tail, code = envelope_log(r, v, chain, proc, root=OOM_ROOT)
                cases.append(Case(name + "/oom-root", r["id"], v, head + tail, code, OOM_KIND[ph], ph, "CUDA out of memory",
                                  {"tried_to_allocate_mib": 2048.0}))
            else:
                cases.append(Case(name + "/alone", r["id"], v, head + tail, code, "engine_dead", reached(head, ph)))
        return cases
    if raises:
        tail, code = envelope_raise(r, v, chain, proc)
    else:
        tail, code = envelope_log(r, v, chain, proc)
        if code is None and r["kind"] == "config_error" and not r["base"].startswith("pg_waiting"):
            w = milestone_row_any("pg_waiting", v)
            if w is not None:   # vLLM waits for the placement group, saying so now and then
                tail += log(v, "api", "info", "ray_utils.py", 178, w["example"])
    kind = expected_kind(r["kind"], chain)
    phase = "cudagraph" if kind == "oom_cudagraph" and r["kind"] == "cuda_error" else ph
    if not raises and r["level"] != "exception":
        phase = reached(head, phase)     # a log record has no frames: the milestones say where it was
    return [Case(name, r["id"], v, head + tail, code, kind, phase, r["match"], _numbers(r))]


def reached(head: list[str], phase: str) -> str:
    """The phase the milestones in ``head`` show, when that is earlier than ``phase`` (a version that
    does not print the milestone of the phase it fails in: 0.5.0-0.5.3 say nothing when loading starts)."""
    last = "config"
    for line in head:
        for text, ph in _REACHES:
            if text in line and PHASE_ORDER.index(ph) > PHASE_ORDER.index(last):
                last = ph
    return phase if PHASE_ORDER.index(phase) <= PHASE_ORDER.index(last) else last


# the milestone texts of milestones() and the phase each begins (as the classifier reads them)
_REACHES = (("LLM engine (v", "engine_init"), ("Started engine process", "engine_init"),
            ("Starting to load model", "loading"), ("checkpoint shards", "loading"), ("Loading weights took", "loading"),
            ("Loading model weights took", "profiling"), ("Model loading took", "profiling"),
            ("Available KV cache memory", "kv_cache"), ("# GPU blocks", "kv_cache"), ("# cuda blocks", "kv_cache"),
            ("GPU KV cache size", "kv_cache"), ("Capturing", "cudagraph"), ("Compile and warming up", "warmup"),
            ("Graph capturing finished", "warmup"), ("init engine (profile", "api_starting"),
            ("Started server process", "api_starting"), ("Waiting for application startup", "api_starting"),
            ("Available routes are", "api_starting"), ("Starting vLLM API server", "serving"),
            ("Starting vLLM server on", "serving"),
            ("Application startup complete", "serving"))


def milestone_row_any(base: str, v: str) -> dict | None:
    for r in messages():
        if r["base"] == base and in_range(r, v):
            return r
    return None


def lookalike_case(r: dict, v: str) -> Case | None:
    """A healthy start-up with the look-alike printed before the server comes up: still healthy."""
    full = milestones(v, "serving")
    cut = next((i for i, ln in enumerate(full) if "init engine (profile" in ln or "Starting vLLM" in ln
                or "Available routes" in ln), len(full))
    lines = full[:cut]
    if r["level"].startswith("raise:"):   # a request's error while serving
        lines = full + log(v, "api", "error", "serving_chat.py", 240, "Error in preprocessing prompt inputs")
        lines += raw(v, "api", "\n".join(["Traceback (most recent call last):",
                                          f'  File "{SITE}vllm/entrypoints/openai/serving_chat.py", line 230, in '
                                          "create_chat_completion", r["example"]]))
        lines += raw(v, "api", 'INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request')
        return Case(f"{r['id']}@{v}/serving", r["id"], v, lines, None, "healthy", None)
    path, _ = source_of(r)
    lines += log(v, "api" if r["process"] == "api" else "engine", r["level"], path, lineno(r), r["example"])
    lines += full[cut:]
    return Case(f"{r['id']}@{v}/startup", r["id"], v, lines, None, "healthy", None)


def all_cases() -> list[Case]:
    return [c for r in messages() for c in cases(r)]
