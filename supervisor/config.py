"""The guard's settings: one frozen dataclass tree, loaded from TOML, environment and CLI.

Precedence: CLI > environment > file > defaults. Unknown keys and bad values are clear errors
naming the key (:class:`ConfigError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ConfigError(Exception):
    """A setting is missing, unknown or invalid; the message names the key."""


@dataclass(frozen=True)
class HealthConfig:
    interval: float = 10.0        # seconds between probes once healthy
    timeout: float = 30.0         # one probe's deadline
    failures: int = 3             # consecutive failed probes that make a live server "hung"


@dataclass(frozen=True)
class StatusConfig:
    host: str = "127.0.0.1"
    port: int = 8077              # 0 disables the status endpoint
    token_file: str = ""          # else VLLM_GUARD_TOKEN, else generated in the state dir


@dataclass(frozen=True)
class BackoffConfig:
    initial: float = 2.0          # first delay between relaunches (seconds)
    maximum: float = 120.0
    multiplier: float = 2.0
    jitter: float = 1.0           # up to this many seconds added at random
    crash_loop_limit: int = 5     # runtime deaths in a row (each after being healthy < window) -> failed
    crash_loop_window: float = 600.0


@dataclass(frozen=True)
class RemedyConfig:
    """The relaunch rules as data (see supervisor.remedy)."""

    allowed: tuple[str, ...] = (
        "max_model_len",
        "kv_cache_fp8",
        "gpu_memory_utilization",
        "enforce_eager",
        "max_num_seqs",
        "max_num_batched_tokens",
        "restart",
    )
    no_kv_order: tuple[str, ...] = (
        "gpu_memory_utilization",
        "enforce_eager",
        "max_num_batched_tokens",
        "max_num_seqs",
        "cpu_offload",
    )
    min_model_len: int = 2048
    kv_margin: float = 0.03              # held back when scaling by a GiB ratio (printed GiB are rounded)
    utilization_margin: float = 0.02     # below free/total
    cpu_offload_gb: float = 0.0          # > 0 allows --cpu-offload-gb (slow; off by default)
    port_retries: int = 3                # a port in use is retried this many times with backoff
    min_max_num_seqs: int = 1
    min_max_num_batched_tokens: int = 512


@dataclass(frozen=True)
class PlanConfig:
    enabled: bool = True          # predict the first launch from config.json + GPU memory
    margin: float = 0.05          # fraction of the KV budget the plan holds back
    learn: bool = True            # store and reuse flags that became healthy
    auto_fit: bool = False        # use --max-model-len auto where vLLM has it (0.14+)


@dataclass(frozen=True)
class GuardConfig:
    model: str = ""
    vllm_command: str = "vllm serve"
    vllm_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"       # vLLM's --host
    port: int = 8000              # vLLM's --port
    state_dir: str = ""           # default: $STATE_DIRECTORY, else ~/.local/state/vllm-guard
    max_launches: int = 6         # consecutive launches that never become healthy -> give up (75)
    startup_timeout: float = 1800.0   # a launch not healthy by then is a failure
    stall_timeout: float = 900.0      # no output and no health for this long during start-up
    stop_grace: float = 20.0          # SIGTERM -> SIGKILL of the process group
    collect_after_fatal: float = 2.0  # keep reading this long after the first fatal line
    quiet: bool = False
    health: HealthConfig = field(default_factory=HealthConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    remedies: RemedyConfig = field(default_factory=RemedyConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
