"""The texts vLLM prints, as data: the failure rules, the start-up milestones, the traceback frames
that place a failure, and the extractors that read numbers out of a message.

Pure, and separate from the classifier's mechanics (:mod:`supervisor.core.classifier`) so the table of
what vLLM says reads on its own. Where each text comes from in vLLM's source, and for which versions,
is in ``docs/failure-catalogue.md``; ``tests/fixtures/catalogue/`` holds the table every rule here is
tested against (every failure message of vLLM 0.5 to 0.33, recognised and placed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from supervisor.core.diagnosis import Kind
from supervisor.core.flags import parse_int

# --------------------------------------------------------------------------- numbers
_F = r"(-?\d+(?:\.\d+)?)"


def _num(text: str) -> int | float:
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value


_SCALE = {"b": 1 / 2**20, "bytes": 1 / 2**20, "kib": 1 / 1024, "kb": 1 / 1024, "mib": 1.0, "mb": 1.0,
          "gib": 1024.0, "gb": 1024.0, "tib": 2**20}


def _mib(value: str, unit: str) -> float:
    return round(float(value) * _SCALE[unit.lower()], 4)


def _gib(value: str, unit: str) -> float:
    return round(_mib(value, unit) / 1024, 4) if unit.lower() not in ("gib", "gb") else float(value)


_RX_KV_V0 = re.compile(r"max seq len \((\d+)\) is larger than the maximum number of tokens that "
                       r"can be stored in KV cache \((\d+)\)")
_RX_KV_V1 = re.compile(r"max seq len \((\d+)\), \(" + _F + r" Gi?B KV cache is needed, which is "
                       r"larger than the available KV cache memory \(" + _F + r" Gi?B\)")
_RX_KV_EST = re.compile(r"estimated maximum model length is (\d+)")
_RX_FREE = re.compile(r"(?:Free memory on device(?: \S+)?|Available memory on node \d+) \(" + _F + "/" + _F
                      + r" GiB\) on startup is less than (?:desired [GC]PU memory utilization|the engine's "
                      r"budget[^(]*?)\s*\(" + _F + ", " + _F + r" GiB\)")
_RX_NODE = re.compile(r"Available memory on node \d+ \(" + _F + "/" + _F + r" GiB\) on kv cache allocation is "
                      r"less than requested memory for kv \(" + _F + r"(/" + _F + r")? GiB\)")
_RX_EXT = re.compile(r"exceed the desired GPU memory utilization \(" + _F + ", " + _F + r" GiB\)")
_RX_PROF = re.compile(r"Initial free memory " + _F + r" ?GiB, current free memory " + _F + " ?GiB")
_UNIT = r" ?(GiB|MiB|KiB|bytes|B|GB|MB)"
_RX_TRIED = re.compile(r"Tried to allocate " + _F + _UNIT)
_RX_TOTAL_NEW = re.compile(r"total capac(?:i)?ty of " + _F + _UNIT + " of which " + _F + _UNIT + " is free")
_RX_TOTAL_OLD = re.compile(r"; " + _F + _UNIT + r" total capacity;[^;]*; " + _F + _UNIT + " free")
_RX_DUMMY = re.compile(r"warming up (?:sampler|pooler)(?: \([^)]*\))? with (\d+) dummy requests")
_RX_DERIVED = re.compile(r"User-specified max_model_len \((\d+)\) is greater than the derived "
                         r"max_model_len \((?:(\w+)=)?" + _F + r"(?: or model_max_length=(\w+|[\d.]+))?")
_RX_BATCHED = re.compile(r"max_num_batched_tokens \((\d+)\) is smaller than max_model_len \((\d+)\)")
_RX_WORLD = re.compile(r"(?:World|Tensor parallel) size \((\d+)\) (?:is|cannot be) larger than the "
                       r"number of available GPUs \((\d+)\)")
# GPUs asked for and found: the multiprocessing executor's and the worker's checks, Ray's placement group
_RX_GPUS = (
    re.compile(r"(?:Tensor parallel size|World size) \((\d+)\) exceeds available GPUs \((\d+)\)"),
    re.compile(r"Required number of devices: (\d+)\. Total number of devices: (\d+)"),
    re.compile(r"(?:tensor_parallel_size|world_size) \((\d+)\) (?:to |is )?less than (?:than )?"
               r"max local gpu count \((\d+)\)"),
    re.compile(r"local_world_size \((\d+)\) must be less than or equal to the number of visible devices \((\d+)\)"),
    re.compile(r"local_world_size \((\d+)\) exceeds assigned_physical_gpu_ids count \(\[([\d, ]*)\]\)"),
)
_RX_PG_REQUIRING = re.compile(r"placement group requiring (\d+)(?:\.0)? [GHXT]PUs")
_RX_PG_SPECS = re.compile(r"specs=\[([^\]]*)\]")
_RX_PG_GROUPS = re.compile(r"Not enough resources to allocate (\d+) placement groups, only created (\d+)")
#: Seconds to wait on a placement-group shortage vLLM only warns about: Ray may still be joining nodes.
PLACEMENT_GROUP_GRACE_S = 60
_RX_TP = re.compile(r"(?<![\w])['\"]?tensor_parallel_size['\"]?\s*[=:]\s*(\d+)")
_RX_PP = re.compile(r"(?<![\w])['\"]?pipeline_parallel_size['\"]?\s*[=:]\s*(\d+)")

_RX_VERSION = (
    re.compile(r"vLLM (?:API )?server version v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v(\d+\.\d+[\w.+-]*)\)"),
    re.compile(r"^vLLM Version: v?(\d+\.\d+[\w.+-]*)"),
)
_RX_LOGO = re.compile(r"(?:^|\s)version\s+v?(\d+\.\d+[\w.+-]*)")
_RX_BLOCK = re.compile(r"(?<![\w])block_size['\"]?\s*[=:]\s*(\d+)")
_RX_MAXSEQ = re.compile(r"(?<![\w])max_seq_len=(\d+)")
_RX_ARG_LEN = re.compile(r"['\"]?max_model_len['\"]?\s*[=:]\s*(\d+)")
_RX_CMD_LEN = re.compile(r"--max[-_]model[-_]len[= ]+['\"]?([\w.]+)")
_RX_CMD_UTIL = re.compile(r"--gpu[-_]memory[-_]utilization[= ]+['\"]?(\d*\.?\d+)")
_COMMANDS = ("vllm serve", "$ vllm", "$ python", "python -m vllm", "python3 -m vllm", "+ vllm", "docker run",
             "CUDA_VISIBLE_DEVICES=", "VLLM_")
_RX_ARG_UTIL = re.compile(r"['\"]?gpu_memory_utilization['\"]?\s*[=:]\s*" + _F)
#: vLLM's --max-model-len auto choice, in each wording (0.14-0.33 "Auto-fit max_model_len: ...", 0.34's final fit
#: after warm-up and its "--max-model-len auto reduced ..."): the last number group that matched is the length
_RX_AUTOFIT = re.compile(r"Auto-fit max_model_len: (?:reduced from \d+ to (\d+)|full model context length (\d+)"
                         r"|(?:attention-free model, )?using (?:derived )?max_model_len=(\d+))"
                         r"|--max-model-len auto reduced max_model_len from \d+ to (\d+)")
_RX_KVTOK = re.compile(r"KV cache size: ([\d,]+) tokens")
_RX_BLOCKS = re.compile(r"# (?:GPU|cuda|npu|xpu|hpu) blocks: (\d+)")
_RX_LOADED = re.compile(r"(?:Model loading|Loading model weights) took " + _F + r" ?(GiB|GB)")
# the KV cache's memory: V1's profile, V0 0.6.4-0.7's results, and 0.34's extensible KV cache committed after
# warm-up ("Extended KV cache to N blocks (X GiB)", after the profile's tentative figure: the last one stands)
_RX_AVAIL = re.compile(r"(?:Available KV cache memory: |the rest of the memory reserved for KV Cache is "
                       r"|Memory profiling results: .*?\bkv_cache_size=|Extended KV cache to \d+ blocks \()"
                       + _F + r" ?GiB")
_RX_SERVED = re.compile(r"Using max model len (\d+)")
# the memory CUDA graphs took, as vLLM measured it: capture_model's "Graph capturing finished in 12 secs,
# took 0.56 GiB" (0.6.4+), then _compile_or_warm_up_model's "CUDA graph pool memory: 0.56 GiB (actual),
# ..." (0.18+, printed after it: the pool's own figure stands)
_RX_GRAPHS = re.compile(r"(?:Graph capturing finished in [\d.]+ secs, took|CUDA graph pool memory:) "
                        + _F + r" ?GiB")


# The numbers are read whatever the case of the words around them (a message retyped in lower case).
for _name, _value in list(globals().items()):
    if _name.startswith("_RX_"):
        globals()[_name] = (tuple(re.compile(rx.pattern, re.I) for rx in _value) if isinstance(_value, tuple)
                            else re.compile(_value.pattern, re.I))


def _info_numbers(text: str) -> dict[str, Any]:
    """Numbers stated by milestone and configuration lines (not failures)."""
    out: dict[str, Any] = {}
    if "version" in text or "engine (v" in text:
        for rx in _RX_VERSION:
            m = rx.search(text)
            if m:
                out["vllm_version"] = m.group(1).rstrip(".,")
                break
    if "block_size" in text:
        m = _RX_BLOCK.search(text)
        if m:
            out["block_size"] = int(m.group(1))
    if "max_seq_len=" in text:
        m = _RX_MAXSEQ.search(text)
        if m:
            out["config_max_seq_len"] = int(m.group(1))
    if "parallel_size" in text:    # the engine's config line, args, non-default args, a pasted command
        m = _RX_TP.search(text)
        if m:
            out["config_tensor_parallel_size"] = int(m.group(1))
        m = _RX_PP.search(text)
        if m:
            out["config_pipeline_parallel_size"] = int(m.group(1))
    if text.startswith(("non-default args", "args: Namespace", "args:")):
        m = _RX_ARG_LEN.search(text)
        if m:
            out["max_model_len"] = int(m.group(1))
        m = _RX_ARG_UTIL.search(text)
        if m:
            out["requested_utilization"] = float(m.group(1))
    if text.startswith(_COMMANDS):   # the command line an issue report pastes above the log
        m = _RX_CMD_LEN.search(text)
        if m and parse_int(m.group(1)):
            out["max_model_len"] = parse_int(m.group(1))
        m = _RX_CMD_UTIL.search(text)
        if m:
            out["requested_utilization"] = float(m.group(1))
    for rx, key, conv in (
        (_RX_KVTOK, "kv_cache_tokens", lambda m: int(m.group(1).replace(",", ""))),
        (_RX_BLOCKS, "num_gpu_blocks", lambda m: int(m.group(1))),
        (_RX_LOADED, "model_loading_gib", lambda m: float(m.group(1))),
        (_RX_AVAIL, "kv_available_gib", lambda m: float(m.group(1))),
        (_RX_SERVED, "served_max_model_len", lambda m: int(m.group(1))),
        (_RX_GRAPHS, "cudagraph_gib", lambda m: float(m.group(1))),
    ):
        m = rx.search(text)
        if m:
            out[key] = conv(m)
    m = _RX_AUTOFIT.search(text)
    if m:
        out["auto_fit_max_model_len"] = int(next(g for g in m.groups() if g))
    return out


def _oom_numbers(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _RX_TRIED.search(text)
    if m:
        out["tried_to_allocate_mib"] = _mib(m.group(1), m.group(2))
    m = _RX_TOTAL_NEW.search(text) or _RX_TOTAL_OLD.search(text)
    if m:
        out["total_gib"] = _gib(m.group(1), m.group(2))
        out["free_gib"] = _gib(m.group(3), m.group(4))
    m = _RX_DUMMY.search(text)
    if m:
        out["num_dummy_requests"] = int(m.group(1))
    return out


def _kv_numbers(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _RX_KV_V0.search(text)
    if m:
        out["max_model_len"], out["fit_max_model_len"] = int(m.group(1)), int(m.group(2))
    m = _RX_KV_V1.search(text)
    if m:
        out["max_model_len"] = int(m.group(1))
        out["kv_needed_gib"], out["kv_available_gib"] = float(m.group(2)), float(m.group(3))
    m = _RX_KV_EST.search(text)
    if m:
        out["fit_max_model_len"] = int(m.group(1))
    return out


def _free_numbers(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _RX_FREE.search(text)
    if m:
        out["free_gib"], out["total_gib"] = float(m.group(1)), float(m.group(2))
        out["requested_utilization"], out["requested_gib"] = float(m.group(3)), float(m.group(4))
        if "Available memory on node" in text:
            out["cpu_node"] = True      # the CPU backend's share of the node's memory
        return out
    m = _RX_NODE.search(text)   # the CPU backend: KV space asked for vs. the NUMA node's free memory
    if m:
        out["free_gib"], out["total_gib"] = float(m.group(1)), float(m.group(2))
        out["requested_gib"] = float(m.group(3))
        # "(64.0 GiB)": a size given (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes); "(X/Y GiB)": the
        # utilization share less the worker's memory
        out["cpu_kv_gib" if m.group(4) is None else "cpu_kv_auto_gib"] = float(m.group(3))
        if m.group(5):
            out["cpu_share_gib"] = float(m.group(5))
        return out
    m = _RX_EXT.search(text)
    if m:
        out["requested_utilization"], out["requested_gib"] = float(m.group(1)), float(m.group(2))
    m = _RX_PROF.search(text)
    if m:
        out["initial_free_gib"], out["free_gib"] = float(m.group(1)), float(m.group(2))
    return out


def _len_numbers(text: str) -> dict[str, Any]:
    m = _RX_DERIVED.search(text)
    if not m:
        return {}
    out: dict[str, Any] = {"max_model_len": int(m.group(1)), "derived_max_model_len": int(float(m.group(3)))}
    if m.group(2):
        out["derived_max_model_len_key"] = m.group(2)
    return out


# one of vLLM's environment variables named with its bad value (envs.py's get_vllm_port)
_RX_ENV_VALUE = re.compile(r"\b(VLLM_[A-Z0-9_]+) '[^']*' (?:appears to be a URI|must be a valid integer)", re.I)


def _config_numbers(text: str) -> dict[str, Any]:
    m = _RX_ENV_VALUE.search(text)
    if m:
        return {"env_var": m.group(1).upper()}    # (a paste retyped in lower case: the variable's name)
    m = _RX_BATCHED.search(text)
    if m:
        return {"max_num_batched_tokens": int(m.group(1)), "max_model_len": int(m.group(2))}
    m = _RX_WORLD.search(text)
    if m:
        return {"tensor_parallel_size": int(m.group(1)), "available_gpus": int(m.group(2)),
                "required_gpus": int(m.group(1))}
    if "GPU" in text or "gpu" in text or "device" in text or "placement group" in text:
        return _gpu_numbers(text)
    return {}


def _gpu_numbers(text: str) -> dict[str, Any]:
    """GPUs asked for and found (``required_gpus``, ``available_gpus``) where the message states them."""
    for rx in _RX_GPUS:
        m = rx.search(text)
        if m:
            found = m.group(2)
            available = len([x for x in found.split(",") if x.strip()]) if "assigned_physical" in rx.pattern \
                else int(found)
            return {"required_gpus": int(m.group(1)), "available_gpus": available}
    m = _RX_PG_REQUIRING.search(text)
    if m:
        return {"required_gpus": int(m.group(1))}
    m = _RX_PG_SPECS.search(text)
    if m:
        # without blanks: a hard wrap re-joined with a space may have split a key ('GPU ': 1.0) or a number
        count = len(re.findall(r"'[A-Z]PU':1(?:\.0)?", re.sub(r"\s+", "", m.group(1))))
        if count:
            return {"required_gpus": count}
    m = _RX_PG_GROUPS.search(text)
    if m:
        return {"required_placement_groups": int(m.group(1)), "created_placement_groups": int(m.group(2))}
    return {}


def _placement_numbers(text: str) -> dict[str, Any]:
    """A placement-group shortage vLLM only warns about (and then waits for, up to 30 minutes)."""
    return {**_gpu_numbers(text), "grace_s": PLACEMENT_GROUP_GRACE_S}


#: Errors vLLM reports for one request while it serves (HTTP 400/500): never a start-up failure.
REQUEST_ERRORS = ("maximum context length is", "Please reduce the length of the messages",
                  "Error in preprocessing prompt inputs", "is not a valid", "does not exist.\"",
                  "is longer than the maximum model length of", "VLLMValidationError")
#: Texts vLLM prints both as a WARNING (the start-up goes on) and raised (it stops): without a log
#: header, only the raised form (``ValueError: ...``, pydantic's ``Value error, ...``) is the failure.
RAISED_ONLY = ("Unknown vLLM environment variable detected", "is greater than the derived max_model_len")
#: What the API server logs while it handles one request: it serves, and the traceback that follows
#: (however much of it was pasted) is that request's (answered 4xx/5xx).
REQUEST_LOGS = ("Error in preprocessing prompt inputs", "Error in chat completion stream generator",
                "Error in completion stream generator", "Error serializing chat completion stream",
                "Error trying to handle streaming tool call", "Error in extracting tool call from response",
                "Exception in ASGI application")
#: An exception raised in a vLLM plugin's own code (an out-of-tree platform or model package, such as
#: vllm_ascend or vllm_gaudi) that no rule names: a plugin built for another vLLM release.
PLUGIN_FILE = re.compile(r"[/\\](?:site|dist)-packages[/\\](vllm[_-](?!flash_attn)[A-Za-z0-9_]+)[/\\]")
#: Frames of the API server handling one request: an exception no rule names in such a traceback is
#: that request's error (answered 4xx/5xx), not the engine's.
REQUEST_FRAMES = frozenset({
    "create_chat_completion", "create_completion", "create_embedding", "create_pooling", "create_score",
    "create_responses", "create_transcription", "create_translation", "create_classify", "create_rerank",
    "chat_completion_stream_generator", "chat_completion_full_generator", "completion_stream_generator",
    "completion_full_generator", "_preprocess_chat", "_preprocess_completion", "_validate_input",
    "_tokenize_prompt_input_async", "_normalize_prompt_text_to_input", "render_chat_request"})

#: A worker's death the executor caused: ended by SIGTERM (V0's monitor: "Worker ... died, exit code: -15") after
#: a failure of its own, to clean up. Only a wrapper of that failure; a worker killed otherwise (-9) is a cause.
ENDED_BY_EXECUTOR = re.compile(r"died, exit code:? -15\b")

#: Exceptions a process raises because its peer died (a closed pipe or socket, a cancelled task):
#: the echo of a failure, never its cause.
COLLATERAL_ERRORS = ("BrokenPipeError", "ConnectionResetError", "ConnectionRefusedError", "EOFError",
                     "asyncio.exceptions.CancelledError", "CancelledError", "zmq.error.", "SystemExit")

# --------------------------------------------------------------------------- rules
# Priorities: a specific root cause (30) beats collateral failures such as NCCL or a dead Ray
# actor (25), which beat a traceback's `raise` source line whose exception line is cut off (20, the
# same kind as the line would have been) and the config errors that only wrap another message (20),
# which beat the generic wrappers that only say "see above" (10).
_OOM, _CAPTURE, _CUDA, _FATAL = "oom", "capture", "cuda", "fatal"   # kinds resolved from where it happened
_TERM = "term"

# (substrings, kind, priority, number extractor)
_RULES: tuple[tuple[tuple[str, ...], Any, int, Any], ...] = (
    (("stored in KV cache (", "KV cache is needed, which is larger than the available KV cache"),
     Kind.KV_CACHE_INSUFFICIENT, 30, _kv_numbers),
    (("Cannot auto-fit max_model_len", "No available memory for the cache blocks",
      "leaving none for the KV cache"),
     Kind.NO_KV_CACHE_MEMORY, 30, None),
    (("on startup is less than", "Externally held weights on device", "Error in memory profiling",
      "on kv cache allocation is less than requested memory"),
     Kind.INSUFFICIENT_FREE_MEMORY, 30, _free_numbers),
    # Ray's *host* memory monitor killed a task: not a GPU remedy's business (restart with backoff).
    (("node running low on memory",), Kind.ENGINE_DEAD, 30, None),
    (("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory", "HIP out of memory",
      "XPU out of memory", "not enough GPU memory", "insufficient memory to allocate the weight",
      "CUBLAS_STATUS_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation",
      "DefaultCPUAllocator: can't allocate memory", "Tried to allocate", "hipErrorOutOfMemory",
      "PT_DEVMEM Allocation failed", "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
      "GPU driver error 2: out of memory"),   # the extensible KV cache's VMM commit (0.34+), past PyTorch
     _OOM, 30, _oom_numbers),
    (("is greater than the derived max_model_len",), Kind.MAX_LEN_EXCEEDS_MODEL, 30, _len_numbers),
    (("unrecognized arguments:", "error: argument ", "invalid choice:", "the following arguments are required",
      "Invalid repository ID or local directory", "is not a local folder and is not a valid model identifier",
      "Repository Not Found for url", "Could not detect config format", "does not appear to have a file named",
      "Repo id must be in the form", "HFValidationError", "LocalEntryNotFoundError", "GatedRepoError",
      "RepositoryNotFoundError", "RevisionNotFoundError", "be authenticated to access it",
      "is restricted and you are not in the authorized list", "Can't load tokenizer", "Can't load the configuration of",
      "Unrecognized model in", "does not recognize this architecture", "Cannot find the config file for",
      "is not supported for quantization method", "does not match the quantization method",
      "Cannot re-initialize CUDA in forked subprocess", "no kernel image is available",
      "hipErrorNoBinaryForGpu", "Unable to find code object for all current devices",
      "NVIDIA driver on your system is too old", "Torch not compiled with CUDA enabled",
      "Ray does not allocate any GPUs", "is not supported by PagedAttention", "only supports Ampere GPUs or newer",
      "must be divisible by pipeline parallel size",
      "Cannot find an appropriate cached snapshot folder",
      "Cannot access gated repo", "You are trying to access a gated repo", "You must be authenticated to access it",
      "Please enable access to public gated repositories", "401 Client Error", "403 Client Error",
      "are not supported for now", "Cannot find model module", "No model architectures are specified",
      "Address already in use", "address already in use",
      # a broken installation: no relaunch can fix it
      "ModuleNotFoundError: No module named", "cannot open shared object file", "undefined symbol:",
      "DLL load failed", "model runner requires Triton", "Model Runner V2 requires Triton",
      "enable_extensible_kv_cache: ",   # 0.34: the extensible KV cache refused with another option
      # packages installed at versions that do not go together (a framework's pin on vLLM, a name that
      # moved between releases): transformers' require_version, pkg_resources, an import of a missing name
      "is required for a normal functioning of this module", "distribution was not found and is required by",
      "VersionConflict", "ImportError: cannot import name", "No package metadata was found for",
      "is not loaded in the current process", "Failed to load NCCL library", "DeepGEMM backend is",
      "kv-cache on this device", "does not support FP8 KV cache", "does not yet support fp8 KV cache",
      "No valid attention backend found", "is not supported with --kv-cache-dtype", "Unknown kv cache dtype",
      "FP8 KV cache not yet supported", "with FP8 KV cache not yet supported", "FP8 KV cache is not supported by",
      "FP8 KV cache requires", "Triton reshape-and-cache cannot store",
      "not supported in this architecture", "is not valid for this configuration",
      "is not supported for the current GPU", "Quantization scheme is not supported", "Unknown quantization method",
      "Invalid quantization method", "Unknown dtype: ",
      # more GPUs than there are: the executors' checks and Ray's placement groups
      "is larger than the number of available GPUs", "cannot be larger than the number of available GPUs",
      "than max local gpu count", "must be less than or equal to the number of visible devices",
      "exceeds assigned_physical_gpu_ids count",
      "Unable to load Ray", "exceeds the total number of available", "Cannot provide a placement group",
      "placement groups, only created", "is not included in a placement group",
      "Placement group bundle cannot have more than 1", "vLLM engine cannot start without",
      "must be divisible by tensor parallel size", "Bfloat16 is only supported on GPUs",
      "V0 attention backends have been removed", "Too large swap space", "GPU memory utilization must be",
      "is smaller than max_model_len", "No CUDA GPUs are available", "Found no NVIDIA driver",
      "CUDA driver version is insufficient", "Failed to infer device type",
      # a custom op missing from vLLM's compiled kernels (0.5-0.6 logs this after the op's AttributeError)
      "Possibly you have built or installed an obsolete version of vllm",
      "No memory should be allocated for the cache blocks for an attention-free model",
      "Failed to load the model config.", "Unknown vLLM environment variable detected",
      "requires you to execute the configuration file", "contains custom code which must be executed",
      "We couldn't connect to 'https://huggingface.co'", "Input should be less than or equal to",
      # a value vLLM parses at start-up (often one of its VLLM_* environment variables) is not a number
      "invalid literal for int() with base 10", "could not convert string to float",
      # Ray cannot install a job's runtime environment on a node, or place a worker at all
      "RuntimeEnvSetupError", "Failed to set up runtime environment", "The actor is not schedulable",
      # VLLM_PORT not a port (a Kubernetes service named vllm sets it to tcp://ip:port); a data-parallel
      # rank's devices beyond those the device variable lists
      "appears to be a URI", "' must be a valid integer", "local range: ["),
     Kind.CONFIG_ERROR, 30, _config_numbers),
    (("BackendCompilerFailed", "InductorError", "torch._dynamo.exc", "torch._inductor.exc",
      "stream is capturing", "cudaErrorStreamCaptureUnsupported", "CUDA graph capture failed",
      "CUDA graph capturing detected at an inappropriate time", "vLLM failed to compile the model"),
     _CAPTURE, 30, None),
    (("illegal memory access", "CUDA error:", "device-side assert", "CUBLAS_STATUS_",
      "CUDA kernel errors might be asynchronously reported"),
     _CUDA, 30, None),
    # the interpreter died on a signal (faulthandler's report, PyTorch's "!!!!!!! Segfault encountered
    # !!!!!!!" and C++ stack, the shell's): the capture when the crashing thread's frames say so
    (("Fatal Python error", "Segmentation fault", "core dumped", "Segfault encountered"), _FATAL, 30, None),
    (("NCCL error", "DistBackendError", "ncclUnhandledCudaError", "ncclInternalError", "ncclSystemError",
      "RayActorError", "ActorDiedError", "The actor died unexpectedly", "A worker died or was killed",
      "RaySystemError", "ActorUnavailableError", "The task may or maynot have been executed on the actor",
      "WorkerCrashedError", "The worker died unexpectedly while executing this task", "LocalRayletDiedError",
      "local raylet died", "collective operation timeout", "DistStoreError",
      "terminate called after throwing",
      "Timed out waiting for engine", "No heartbeat received", "Engine iteration timed out",
      # V1's executor gave up waiting for its workers' answer to a call ("RPC call to {method} timed out."): a
      # hung worker, or one in a collective its peers never joined
      "RPC call to",
      # the engine or a worker is gone, and nothing else says why
      "Input socket thread died", "Did not receive response from front-end process", "Engine process (pid",
      "Engine is dead.", "died, exit code", "died unexpectedly"),
     Kind.ENGINE_DEAD, 25, None),
    # pydantic's wrapper, and the model-inspection subprocess vLLM runs to read a model's code (the
    # registry's _run_in_subprocess: it fails when the model's code, or a package it needs, cannot load)
    (("validation error for", "failed to be inspected", "Error in inspecting model architecture",
      "Error raised in subprocess", "vllm.model_executor.models.registry']' returned non-zero exit status"),
     Kind.CONFIG_ERROR, 20, None),
    (("Engine core initialization failed", "EngineCore initialization failed",
      "EngineCore_0 initialization failed", "EngineCore failed to start", "EngineCore encountered",
      "EngineCore hit an exception", "Got fatal signal from worker processes", "EngineDeadError",
      "Engine process failed to start", "RPCServer process died", "EngineCoreProc failed to start",
      "Frontend process failed during engine core initialization",
      "terminating server process", "Engine loop is not running", "Background loop has errored",
      "Background loop is not running", "Background loop is stopped", "WorkerProc initialization failed",
      "WorkerProc failed", "WorkerProc hit an exception", "Executor failed", "died.')",
      "Worker failed with error", "Task finished unexpectedly", "output_handler failed", "output handler hit an error",
      "Engine background task failed", "engine core exited unexpectedly", "while processing method",
      "This might cause deadlock in distributed execution", "JIT kernel warmup failed after",
      # a Ray worker's exception re-raised in the driver: the worker's own exception follows it
      "RayTaskError"),
     Kind.ENGINE_DEAD, 10, None),
)
_KEYS = tuple((key, i) for i, rule in enumerate(_RULES) for key in rule[0])
_WORD = re.compile(r"\w+")


def _key_index(keys: tuple[tuple[str, int], ...]) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """The keys by a word inside each (not at its ends, which may be part of a longer word in a line): a line
    can hold a key only if it holds that word whole. Keys with no such word are always tried."""
    by_word: dict[str, list[int]] = {}
    always: list[int] = []
    for at, (key, _index) in enumerate(keys):
        inner = [m.group() for m in _WORD.finditer(key) if m.start() > 0 and m.end() < len(key)]
        if inner:
            by_word.setdefault(max(inner, key=len), []).append(at)
        else:
            always.append(at)
    return {w: tuple(v) for w, v in by_word.items()}, tuple(always)


_KEYS_BY_WORD, _KEYS_ALWAYS = _key_index(_KEYS)


def first_key(text: str) -> tuple[str, int] | None:
    """The first of the rules' keys (in their order) that ``text`` holds, and its rule's index: the same as
    trying every key in turn, read through the words of the line (a log's lines hold a key rarely)."""
    tried = list(_KEYS_ALWAYS)
    for word in set(_WORD.findall(text)):
        tried.extend(_KEYS_BY_WORD.get(word, ()))
    for at in sorted(tried):
        key, index = _KEYS[at]
        if key in text:
            return key, index
    return None

# Fatal although logged at WARNING or INFO. A placement-group shortage is only warned about from 0.6.5
# (before, vLLM raised); vLLM then waits up to 30 minutes for Ray. Such a verdict is provisional
# (``grace_s`` in its numbers): a start-up that goes on to load the model withdraws it.
_WARN_RULES: tuple[tuple[tuple[str, ...], Any, int, Any, bool], ...] = (
    (("exceeds the total number of available", "This may result in Ray placement group allocation failures"),
     Kind.CONFIG_ERROR, 30, _placement_numbers, True),
    (("engine core exited unexpectedly",), Kind.ENGINE_DEAD, 10, None, False),
)
_WARN_KEYS = tuple((key, i) for i, rule in enumerate(_WARN_RULES) for key in rule[0])
_INFO_RULES: tuple[tuple[tuple[str, ...], Any, int, Any, bool], ...] = (
    (("Waiting for creating a placement group of specs for",), Kind.CONFIG_ERROR, 30, _placement_numbers, True),
)
_INFO_PREFIXES = tuple(key for rule in _INFO_RULES for key in rule[0])

#: Lines that say the engine was running when it died (vLLM's serving-time wrappers): an
#: out-of-memory error without frames that place it happened while serving.
RUNTIME_MARKERS = ("EngineCore encountered a fatal error", "output_handler failed", "output handler hit an error",
                   "Engine background task failed", "has failed, terminating server process",
                   "is already dead, terminating server process", "MQEngineDeadError", "AsyncEngineDeadError",
                   "EngineDeadError", "Engine loop is not running", "Background loop has errored",
                   "engine core exited unexpectedly")

# Start-up milestones, matched at the start of the message (docs/failure-catalogue.md, "Milestones").
_MILESTONES: tuple[tuple[str, str], ...] = (
    ("vLLM API server version", "config"), ("vLLM server version", "config"),
    ("non-default args", "config"), ("args: Namespace", "config"), ("Using max model len", "config"),
    ("Resolved architecture", "config"), ("Automatically detected platform", "config"),
    ("Initializing a V1 LLM engine", "engine_init"), ("Initializing a V0 LLM engine", "engine_init"),
    ("Initializing an LLM engine", "engine_init"), ("Started engine process", "engine_init"),
    ("Waiting for init message from front-end", "engine_init"),
    ("Starting to load model", "loading"), ("Loading safetensors checkpoint shards", "loading"),
    ("Loading pt checkpoint shards", "loading"), ("Loading weights took", "loading"),
    ("Loading model from scratch", "loading"), ("Using model weights format", "loading"),
    # "Model loading took" ends loading: what follows is the profile run
    ("Loading model weights took", "profiling"), ("Model loading took", "profiling"),
    ("Memory profiling takes", "profiling"), ("Memory profiling results", "profiling"),
    ("Dynamo bytecode transform time", "profiling"), ("Using cache directory", "profiling"),
    ("Starting torch.compile", "profiling"), ("Compiling a graph for shape", "warmup"),
    ("Compiling a graph for", "profiling"), ("torch.compile takes", "profiling"),
    ("Encoder cache will be initialized", "profiling"), ("Profiling CUDA graph memory", "profiling"),
    ("CUDA graph memory profiling is enabled", "profiling"),
    ("Estimated CUDA graph memory", "profiling"), ("the current vLLM instance can use", "profiling"),
    ("model weights take", "kv_cache"), ("Available KV cache memory", "kv_cache"),
    ("Initial free memory", "kv_cache"), ("Explicitly set (", "kv_cache"), ("Auto set (", "kv_cache"),
    ("# GPU blocks", "kv_cache"), ("# cuda blocks", "kv_cache"), ("# CUDA blocks", "kv_cache"),
    ("# CPU blocks", "kv_cache"),
    ("GPU KV cache size", "kv_cache"), ("GPU + host KV cache size", "kv_cache"),
    ("CPU KV cache size", "kv_cache"), ("Maximum concurrency for", "kv_cache"),
    ("Auto-fit max_model_len", "kv_cache"), ("--max-model-len auto reduced max_model_len from", "kv_cache"),
    # the extensible KV cache (0.34+) commits its pages after warm-up and capture
    ("Extended KV cache to", "kv_cache"),
    ("Capturing the model for CUDA graphs", "cudagraph"), ("Capturing cudagraphs", "cudagraph"),
    ("Capturing CUDA graph", "cudagraph"), ("CUDA graphs can take additional", "cudagraph"),
    ("If out-of-memory error occurs during cudagraph capture", "cudagraph"),
    # V1 warms kernels up before it captures (compile sizes, JIT kernels, DeepGEMM, FlashInfer autotune)
    ("Compile and warming up model for size", "warmup"), ("JIT kernel warmup", "warmup"),
    ("Running FlashInfer", "warmup"), ("DeepGEMM warmup", "warmup"), ("Skipping CUDA graph capture", "warmup"),
    ("Skipping encoder and decoder CUDA graph capture", "warmup"), ("Memory after warmup", "warmup"),
    ("Graph capturing finished", "warmup"), ("CUDA graph pool memory", "warmup"),
    ("init engine (profile", "api_starting"), ("Started server process", "api_starting"),
    ("Waiting for application startup", "api_starting"), ("Available routes are", "api_starting"),
    # the API server starts uvicorn right after it says so
    ("Starting vLLM API server", "serving"), ("Starting vLLM server on", "serving"),
    ("Application startup complete", "serving"), ("Uvicorn running on", "serving"),
)
#: The API server saying it got SIGTERM/SIGINT (0.23+): what its engine prints while stopping is no failure.
STOP_PREFIXES = ("[shutdown] API server: shutdown triggered",)
#: vLLM found no GPU platform, or its compiled kernels would not load (built for another torch: an undefined
#: symbol; no CUDA driver in the container: libcuda.so.1 missing). Printed at import, at INFO, DEBUG or WARNING,
#: and not fatal there; a failure no rule names after it follows from it: a broken installation. (A build with
#: no ``vllm._C`` at all, "No module named", is a TPU's or a source tree's: no sign of anything.)
BROKEN_PLATFORM = ("No platform detected", "Failed to import from vllm._C")
BROKEN_KERNELS = ("undefined symbol", "cannot open shared object file")
_MILESTONE_PREFIXES = (tuple(p for p, _ in _MILESTONES) + ("Auto-fit", "args:", "vLLM Version:") + _COMMANDS
                       + _INFO_PREFIXES + STOP_PREFIXES + BROKEN_PLATFORM)
#: Lines only a serving vLLM prints (its stats, a request's record, and V0's scheduler warnings about a
#: running request: preempted for KV space, a prompt over the limit, a request failed for want of blocks):
#: serving, even when the log's "Application startup complete." was not kept. Read at INFO and WARNING.
_SERVING_PREFIXES = ("Engine 000:", "Avg prompt throughput", "Received request", "Added request", "Finished request",
                     "Sequence group ", "Input prompt (", "Failing the request ")
#: The progress bars of an offline run (`LLM.generate`/`chat`/`encode`, tqdm, no log prefix): the engine is up and
#: generating, the offline run's serving.
OFFLINE_PROGRESS = ("Processed prompts:", "Adding requests:")

# Traceback frame names -> the start-up phase the failure happened in (tests/fixtures/catalogue/frames.tsv:
# every function vLLM 0.5-0.34 defines for a phase). The deepest known frame wins, except the *weak*
# frames, which place a failure only when nothing above them in the same traceback did: the serving
# loop's frames (V0's profile_run calls execute_model) and the sampler warm-up (run by profile_run
# while profiling and by compile_or_warm_up_model after capture). Frames every start-up traceback
# passes through (run_engine_core, _init_executor, _initialize_kv_caches, the API server's waits),
# torch.compile's (compile, __call__, bytecode_hook: the first compile runs inside profile_run, later
# ones inside capture and warm-up) and _dummy_run (profiling, capture and warm-up alike) place nothing.
_FRAME_PHASE = {
    **dict.fromkeys(("init_device", "init_worker_distributed_environment", "init_distributed_environment",
                     "ensure_model_parallel_initialized", "initialize_model_parallel", "_check_if_gpu_supports_dtype",
                     "check_if_supports_dtype", "request_memory", "initialize_ray_cluster", "_wait_until_pg_ready",
                     "_verify_bundles", "_init_workers_ray"), "engine_init"),
    **dict.fromkeys(("load_model", "load_weights", "get_model", "initialize_model", "_initialize_model",
                     "create_weights", "_load_weights", "load_checkpoint", "_get_all_weights", "_get_weights_iterator",
                     "_load_module", "_load_param", "_prepare_weights", "process_weights_after_loading",
                     "_process_weights_after_loading", "awq_marlin_repack", "gptq_marlin_repack",
                     "gptq_marlin_moe_repack", "default_weight_loader", "download_model", "download_weights_from_hf",
                     "pt_weights_iterator", "safetensors_weights_iterator", "weight_loader", "weight_loader_v2"),
                    "loading"),
    **dict.fromkeys(("profile_run", "determine_available_memory", "determine_num_available_blocks",
                     "profile_num_available_blocks",          # vLLM <= 0.3
                     "determine_available_kv_cache_memory", "profile", "memory_profiling",
                     # multimodal dummy data for the profile run
                     "_dummy_mm_kwargs", "_get_mm_dummy_batch", "_get_dummy_mm_inputs", "dummy_data_for_profiling",
                     "get_decoder_dummy_data", "get_dummy_data", "get_dummy_processor_inputs",
                     "get_encoder_dummy_data", "get_and_validate_mm_inputs"), "profiling"),
    **dict.fromkeys(("initialize_kv_cache", "_allocate_kv_cache_tensors", "initialize_from_config",
                     "initialize_cache", "_init_cache_engine", "_allocate_kv_cache", "allocate_kv_cache",
                     "initialize_kv_cache_tensors", "_reshape_kv_cache_tensors", "may_reinitialize_input_batch",
                     "raise_if_cache_size_invalid", "get_kv_cache_config", "get_kv_cache_configs",
                     "get_kv_cache_config_from_groups", "_get_kv_cache_config_uniform_type",
                     "_get_kv_cache_config_uniform_page_size", "check_enough_kv_cache_memory",
                     "_check_enough_kv_cache_memory", "estimate_max_model_len", "_auto_fit_max_model_len",
                     "update_kv_cache_capacity", "init_cache_engine", "init_kv_cache",
                     # the extensible KV cache (0.34+): sized again and committed after warm-up and capture
                     "finalize_extensible_kv_cache", "shrink_kv_cache_configs", "extend_kv_cache"), "kv_cache"),
    # capture; profile_cudagraph_memory (0.18+) captures graphs to measure them while profiling
    **dict.fromkeys(("capture_model", "_capture_cudagraphs", "capture", "capture_graph", "_capture_graph",
                     "capture_begin", "capture_end", "profile_cudagraph_memory"), "cudagraph"),
    **dict.fromkeys(("compile_or_warm_up_model", "_compile_or_warm_up_model", "_warm_up_model", "warm_up_model",
                     "kernel_warmup", "deep_gemm_warmup", "_deepgemm_fp8_gemm_nt_warmup",
                     "_deepgemm_grouped_fp8_gemm_nt_contiguous_warmup", "flashinfer_autotune",
                     "_run_flashinfer_autotune_dummy_runs", "_warmup_bf16x3_router_gemm",
                     "run_kv_cache_sizing_warmup", "warmup_kernels"), "warmup"),
    **dict.fromkeys(("_dummy_sampler_run", "_dummy_pooler_run", "_dummy_pooler_run_task"), "profiling"),
    **dict.fromkeys(("execute_model", "step", "run_busy_loop", "_process_engine_step", "step_with_batch_queue",
                     "engine_step", "run_engine_loop", "execute_model_async", "_process_input_queue", "sample_tokens",
                     "_driver_execute_model", "_execute_model_spmd", "_run_workers", "step_async", "output_handler",
                     "_run_output_handler", "process_outputs_socket", "get_output_async", "process_input_sockets",
                     "run_output_handler_loop", "run_heartbeat_loop", "_set_errored", "check_health", "generate",
                     "_log_task_completion"), "serving"),
}
#: Frames of a vLLM that serves (``frames.tsv``'s serving loops that start only once start-up is
#: done: the engine core's busy loop, V0's engine loops, the API server's output handler), the API
#: server handling a request, and attention run on a prompt's already computed context (a chunked
#: prefill's later chunk, a cached prefix: never in the profile's dummy batch). A traceback through one
#: of them is the running engine's, whatever it called: the failure is a serving failure. (Their names
#: are read in vLLM's own files only: torch._dynamo has a ``step`` too.)
SERVING_FRAMES = frozenset({
    "run_busy_loop", "_process_engine_step", "_process_input_queue", "process_input_sockets", "step",
    "step_with_batch_queue", "run_engine_loop", "engine_step", "step_async", "_log_task_completion",
    "run_heartbeat_loop", "run_output_handler_loop", "_set_errored", "check_health", "output_handler",
    "_run_output_handler", "process_outputs_socket", "get_output_async", "generate",
    "_compute_prefill_context", "run_prefill_context_chunk", "_context_parallel_compute_prefill_context",
}) | REQUEST_FRAMES
#: torch.cuda.graphs' functions that capture (the graph context, CUDAGraph.capture_begin/_end,
#: make_graphed_callables); its CUDAGraph.replay runs a captured graph: serving, or a warm-up's run.
TORCH_CAPTURE_FRAMES = frozenset({"capture_begin", "capture_end", "__enter__", "__exit__", "make_graphed_callables"})
#: What shows the engine generation in a log whose version is unknown (a wrapper, a stand-in, a build
#: that hides it), read in vLLM's source: its own banner, the process tags of its processes, its files,
#: the words only one generation prints (V0's block count and memory profile summary, V1's KV cache
#: size and engine-core wrappers).
ENGINE_BANNERS = (("Initializing a V1 LLM engine", "v1"), ("Initializing a V0 LLM engine", "v0"))
ENGINE_WORDS = (
    ("GPU KV cache size", "v1"), ("Available KV cache memory", "v1"), ("EngineCore failed to start", "v1"),
    ("EngineCore encountered", "v1"), ("AsyncLLM output_handler failed", "v1"),
    ("Engine core initialization failed", "v1"),
    ("# GPU blocks", "v0"), ("# cuda blocks", "v0"), ("Memory profiling takes", "v0"),
    ("the current vLLM instance can use", "v0"), ("Capturing cudagraphs for decoding", "v0"),
    ("Capturing the model for CUDA graphs", "v0"), ("Loading model weights took", "v0"),
    ("Started engine process with PID", "v0"), ("Engine background task failed", "v0"),
    ("AsyncLLMEngine has failed", "v0"), ("Engine process failed to start", "v0"))
ENGINE_PROCS = (("EngineCore", "v1"), ("VllmWorker rank=", "v1"), ("VllmWorker TP", "v1"), ("Worker_", "v1"),
                ("VllmWorkerProcess", "v0"))
ENGINE_FILES = (("/vllm/v1/", "v1"), ("/vllm/worker/worker.py", "v0"), ("/vllm/worker/model_runner.py", "v0"),
                ("/vllm/engine/async_llm_engine.py", "v0"), ("/vllm/engine/llm_engine.py", "v0"),
                ("/vllm/engine/multiprocessing/", "v0"), ("/vllm/worker/cache_engine.py", "v0"))
#: Frames that place a failure only when no frame above them in the traceback did.
#: the sampler's (pooler's) warm-up with dummy requests: run while profiling and again after capture
SAMPLER_FRAMES = frozenset({"_dummy_sampler_run", "_dummy_pooler_run", "_dummy_pooler_run_task"})
_WEAK_FRAMES = frozenset(k for k, v in _FRAME_PHASE.items() if v == "serving") | SAMPLER_FRAMES
#: Frames whose call runs other phases of the start-up than the one it is named for: the function, the part of its
#: file's path that says which (a name other files use too), the earliest phase it can be in and the latest (none:
#: any, before serving). V0's worker ``initialize_cache`` allocates the KV cache, then warms the model up and
#: captures its graphs, as V1's executor ``initialize_from_config`` has its workers do; V0's worker
#: ``_warm_up_model`` captures the graphs (then seeds the sampler), and V1's ``compile_or_warm_up_model`` (the
#: worker's, and the executor's that has its workers run it) warms up (compile sizes, kernels), captures and warms
#: the sampler up; V0's model runner's ``execute_model`` runs the
#: profile's and the capture's batches as well as the server's (V1's start-up runs its own, ``_dummy_run``); V0's
#: executors' ``_run_workers`` runs any worker method. A traceback whose deepest known frame is one of these, with no
#: sign of serving, lost its deeper frames: the milestones place it, within the phases its call can be in (a
#: milestone logged after the call began says no more than its last phase: 0.9's "init engine ... took" before the
#: sampler's warm-up) (``classifier._frames_place``).
ENCLOSING_FRAMES = {"initialize_cache": ("/vllm/worker/", "kv_cache", "warmup"),
                    "initialize_from_config": ("/vllm/v1/executor/", "kv_cache", "warmup"),
                    "_warm_up_model": ("/vllm/worker/", "cudagraph", "warmup"),
                    "compile_or_warm_up_model": ("/vllm/v1/", "cudagraph", "warmup"),
                    "execute_model": ("/vllm/worker/", "profiling", ""),
                    "_run_workers": ("/vllm/executor/", "engine_init", "")}

#: Phrases as vLLM (and PyTorch, Python) case them: a line retyped in lower case gets their case back
#: (``vllm_text.Recaser``) before the rules, written in vLLM's case, read it.
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(
    [k for rule in _RULES for k in rule[0]] + [k for rule in _WARN_RULES for k in rule[0]]
    + [k for rule in _INFO_RULES for k in rule[0]] + [p for p, _ in _MILESTONES] + list(STOP_PREFIXES)
    + list(RUNTIME_MARKERS) + list(REQUEST_ERRORS) + list(COLLATERAL_ERRORS) + list(_SERVING_PREFIXES)
    + list(OFFLINE_PROGRESS) + list(BROKEN_PLATFORM) + list(BROKEN_KERNELS)
    + [  # the phrases the number extractors and the traceback reader look for
        "Traceback (most recent call last)", "During handling of the above exception", "The above exception",
        "(most recent call first)", "Current thread", "Thread 0x", "Fatal Python error", "KeyboardInterrupt",
        "Killed", "Process ", "Error executing method", "Exception in worker", "Free memory on device",
        "Available memory on node", "Desired GPU memory utilization", "desired GPU memory utilization",
        "GPU memory utilization", "Tried to allocate", "GPU 0 has a total capacity", "total capacity",
        "Initial free memory", "current free memory", "KV cache", "GPU KV cache size", "# GPU blocks",
        "# CPU blocks", "# cuda blocks", "Available KV cache memory", "the rest of the memory reserved for KV Cache",
        "Based on the available memory", "User-specified max_model_len", "derived max_model_len",
        "Required number of devices", "Total number of devices", "World size", "Tensor parallel size",
        "Auto-fit max_model_len", "Model loading took", "Loading model weights took", "Using max model len",
        "vLLM API server version", "vLLM server version", "Initializing a V1 LLM engine",
        "Initializing a V0 LLM engine", "Initializing an LLM engine", "ValueError", "RuntimeError", "KeyError",
        "AssertionError", "TypeError", "OSError", "ImportError", "ModuleNotFoundError", "NotImplementedError",
        "AttributeError", "EngineCore", "EngineCore_DP0", "APIServer", "Worker_TP", "VllmWorker"]))


# --------------------------------------------------------------------------- a message retyped with typos
def _message_words() -> dict[str, str]:
    """The words of vLLM's messages the rules read (the phrases of :data:`VOCABULARY` and the literal words of
    the number extractors' patterns), by their lower case: four letters or more."""
    texts = list(VOCABULARY) + [v.pattern for v in globals().values() if isinstance(v, re.Pattern)]
    words: dict[str, str] = {}
    for text in texts:
        for w in re.findall(r"(?<![\\A-Za-z])[A-Za-z]{4,}", text):
            # (a plain spelling, "failed" or "Failed", over a shout's "FAILED": a typed word's case is put on it)
            if w.lower() not in words or w[1:].islower() and not words[w.lower()][1:].islower():
                words[w.lower()] = w
    return words


_MESSAGE_WORDS = _message_words()
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TYPED_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{4,24}(?![A-Za-z])")   # (a word of vLLM's is no longer)
_RESPELL_MAX = 2000       # characters of a line read for typos: a message is shorter
_RESPELLINGS = 16         # the readings of one line tried at most


def _one_edit(word: str) -> set[str]:
    """Every string one edit from ``word`` (a letter dropped, doubled or swapped with the next, one
    changed, one added): the typos a person makes retyping a line."""
    cuts = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return ({a + b[1:] for a, b in cuts if b}
            | {a + b[1] + b[0] + b[2:] for a, b in cuts if len(b) > 1}
            | {a + c + b[1:] for a, b in cuts if b for c in _LETTERS}
            | {a + c + b for a, b in cuts for c in _LETTERS})


def respelled(text: str, matches: Callable[[str], object] | None = None) -> str | None:
    """``text`` with each word one typo away from vLLM's message words (and none of them itself) spelled as vLLM
    spells it, or None where no word changed. A word one typo from several is tried as each (at most
    :data:`_RESPELLINGS` readings in all), the first reading ``matches`` accepts kept (by default any). Tried only
    on lines a person may have typed (a message retyped from a screenshot: "is larger then the maximum ...
    stored in KV cashe"), and kept only where a rule's key then matches, so a word of the reporter's own is
    never what decides."""
    if len(text) > _RESPELL_MAX:
        return None
    pieces: list[str | list[str]] = []
    last = 0
    choices = 1
    for m in _TYPED_WORD.finditer(text):
        low = m.group(0).lower()
        if low in _MESSAGE_WORDS:
            continue
        near = sorted(_one_edit(low) & _MESSAGE_WORDS.keys())
        if near and choices * len(near) <= _RESPELLINGS:
            choices *= len(near)
            pieces += [text[last:m.start()], [_as_typed(m.group(0), _MESSAGE_WORDS[w]) for w in near]]
            last = m.end()
    if not pieces:
        return None
    pieces.append(text[last:])
    readings = [""]
    for piece in pieces:
        readings = [r + p for r in readings for p in ([piece] if isinstance(piece, str) else piece)]
    return next((r for r in readings if matches is None or matches(r)), None)


def _as_typed(typed: str, word: str) -> str:
    """``word`` in the case ``typed`` was typed in (lower, capitalised, all capitals) where vLLM writes it in one
    of those; a word vLLM writes otherwise ("EngineCore", "CUDA") as vLLM writes it."""
    if not (word[1:].islower() or word.isupper() and len(word) > 1 and typed.isupper()):
        return word
    if typed.isupper():
        return word.upper()
    return word.capitalize() if typed[0].isupper() else word.lower()
