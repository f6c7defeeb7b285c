"""Data shared by the pure core and the shell: failure kinds and the diagnosis of a launch.

Nothing here does I/O. The names of :class:`Kind` are part of the interface (``diagnose --json``,
``/status``, metrics labels), so they never change.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Kind(str, enum.Enum):
    """What ended (or did not end) a vLLM launch."""

    KV_CACHE_INSUFFICIENT = "kv_cache_insufficient"
    AUTO_FIT_ABOVE_REQUEST = "auto_fit_above_request"   # the guard's own check, not a vLLM failure
    NO_KV_CACHE_MEMORY = "no_kv_cache_memory"
    INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"
    OOM_WEIGHTS = "oom_weights"
    OOM_PROFILE = "oom_profile"
    OOM_CUDAGRAPH = "oom_cudagraph"
    OOM_RUNTIME = "oom_runtime"
    ENGINE_DEAD = "engine_dead"
    MAX_LEN_EXCEEDS_MODEL = "max_len_exceeds_model"
    CONFIG_ERROR = "config_error"
    UNKNOWN_FAILURE = "unknown_failure"     # a fatal line, traceback or exit that matches no rule
    HEALTHY = "healthy"                     # vLLM reached serving and nothing fatal followed
    # `vllm-guard diagnose` only (a live launch always ends one of the ways above):
    NO_VLLM_OUTPUT = "no_vllm_output"       # nothing vLLM printed (an empty file, binary data, another program)
    INCOMPLETE = "incomplete"               # a start-up that stops before serving, with no failure in it

    def __str__(self) -> str:  # so f-strings and JSON show the interface name
        return self.value


#: The verdicts that name no failure.
NO_FAILURE = frozenset({Kind.HEALTHY, Kind.INCOMPLETE, Kind.NO_VLLM_OUTPUT})

#: Where a start-up was when it stopped, from vLLM's own milestones (oldest first).
PHASES = (
    "launching",      # nothing from vLLM yet
    "config",         # API server parsing args / model config
    "engine_init",    # "Initializing a V1 LLM engine" / device init
    "loading",        # "Starting to load model"
    "profiling",      # "Model loading took" seen
    "kv_cache",       # "GPU KV cache size" / "# GPU blocks" seen
    "cudagraph",      # "Capturing CUDA graph" seen
    "warmup",         # "Graph capturing finished" seen
    "api_starting",   # "init engine ... took" / "Starting vLLM API server"
    "serving",        # "Application startup complete."
)
#: The phase of a failure nothing in the log places (an out-of-memory error with no frames, no start-up
#: or serving line before it): the daemon reads it as the phase its live stream last reached.
UNKNOWN_PHASE = "unknown"
#: Every phase a diagnosis can name.
VERDICT_PHASES = PHASES + (UNKNOWN_PHASE,)


@dataclass(frozen=True)
class Diagnosis:
    """The classification of one launch's output.

    ``numbers`` holds what the log states, under the interface names: ``max_model_len``,
    ``fit_max_model_len``, ``derived_max_model_len``, ``free_gib``, ``total_gib``,
    ``requested_utilization``, ``kv_needed_gib``, ``kv_available_gib``,
    ``tried_to_allocate_mib``, ``vllm_version``, ``required_gpus`` / ``available_gpus`` (more GPUs asked
    for than found), ``grace_s`` (a failure vLLM only warned about and waits on, such as a Ray placement
    group: how long to give it before acting), and helpers such as ``num_dummy_requests``,
    ``auto_fit_max_model_len``, ``block_size``, ``rank``. What each kind means and what vLLM prints
    for it: ``docs/failure-catalogue.md``.
    """

    kind: Kind
    evidence: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    phase: str = "launching"
    detail: str = ""

    @property
    def names_a_failure(self) -> bool:
        """False for the verdicts that name none (healthy, incomplete, no vLLM output): a launch that
        ended with one of them ended for a reason the log does not hold (an exit, a hang)."""
        return self.kind not in NO_FAILURE

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "evidence": self.evidence,
            "numbers": dict(self.numbers),
            "phase": self.phase,
            "detail": self.detail,
        }
