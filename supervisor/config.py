"""The guard's settings: one frozen dataclass tree, loaded from TOML, environment and CLI.

Precedence: CLI > environment > file > defaults. Unknown keys and bad values are clear errors
naming the key (:class:`ConfigError`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import shlex
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from supervisor.core.flags import Flags
from supervisor.errors import ConfigError
from supervisor.named_files import read_named_file

__all__ = ["ConfigError", "GuardConfig", "resolve"]



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
    """The relaunch rules as data (see supervisor.core.remedy)."""

    allowed: tuple[str, ...] = (
        "max_model_len",
        "kv_cache_fp8",
        "gpu_memory_utilization",
        "enforce_eager",
        "max_num_seqs",
        "max_num_batched_tokens",
        "restart",
        "cpu_offload",       # only where cpu_offload_gb > 0 says how much (off by default)
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
    utilization_margin: float = 0.005    # of the total, below the free memory vLLM can use (after its CUDA context)
    cpu_offload_gb: float = 0.0          # > 0 allows --cpu-offload-gb (slow; off by default)
    port_retries: int = 3                # a port in use is retried this many times with backoff
    min_max_num_seqs: int = 1
    min_max_num_batched_tokens: int = 512


@dataclass(frozen=True)
class PlanConfig:
    enabled: bool = True          # predict the first launch from config.json + GPU memory
    margin: float = 0.03          # fraction of the KV budget the plan holds back
    learn: bool = True            # store and reuse flags that became healthy
    auto_fit: bool = False        # always --max-model-len auto where vLLM has it (0.14+), not only for estimates


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
    log_level: str = "info"           # debug | info | warning | error
    log_format: str = "auto"          # auto (console on a terminal, else JSON lines) | json | console
    notify_url: str = ""              # POST a JSON event here on failures, relaunches, healthy, giving up
    health: HealthConfig = field(default_factory=HealthConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    remedies: RemedyConfig = field(default_factory=RemedyConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    # Not a setting: vLLM's own --config YAML as arguments, read when the config is resolved.
    vllm_file_args: tuple[str, ...] = ()

    def requested_flags(self) -> Flags:
        """The vLLM flags asked for: the command line's over those of vLLM's ``--config`` file."""
        base = Flags.parse(list(self.vllm_file_args)) if self.vllm_file_args else None
        return Flags.parse(list(self.vllm_args), base=base)

    @property
    def vllm_argv(self) -> list[str]:
        """``vllm_command`` as argv (it was checked to split when the config was loaded)."""
        return shlex.split(self.vllm_command)

    def endpoint(self) -> tuple[str, int]:
        """Where vLLM will listen: ``--host``/``--port`` among the vLLM args win over ``host``/``port``."""
        flags = self.requested_flags()
        port = flags.get("--port")
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"--port {port!r} in the vLLM arguments is not a port number")
        return flags.get("--host") or self.host, int(port) if port else self.port

    def launch_argv(self, flags: Flags) -> list[str]:
        """The whole vLLM command line for ``flags``: the command, the model, host and port, the rest."""
        host, port = self.endpoint()
        rest = flags
        for name in ("--host", "--port", "--model"):
            rest = rest.remove(name)
        cmd = self.vllm_argv
        model = [self.model] if cmd and cmd[-1] == "serve" else ["--model", self.model]
        return cmd + model + ["--host", host, "--port", str(port)] + rest.argv()


# --------------------------------------------------------------------------------------------
# Loading: file -> environment -> command line, each layer validated where it is read so the
# error can say where the bad value came from.
# --------------------------------------------------------------------------------------------


SYSTEM_CONFIG = "/etc/vllm-guard/config.toml"
MAX_CONFIG_BYTES = 1 << 20
ENV_PREFIX = "VLLM_GUARD_"
ENV_CONFIG = "VLLM_GUARD_CONFIG"

#: Remedy names the rules understand (``remedies.allowed`` / ``remedies.no_kv_order``).
REMEDY_NAMES = frozenset(RemedyConfig.allowed) | frozenset(RemedyConfig.no_kv_order)

_SECTIONS: dict[str, type] = {
    "health": HealthConfig,
    "status": StatusConfig,
    "backoff": BackoffConfig,
    "remedies": RemedyConfig,
    "plan": PlanConfig,
}

_INF = math.inf
# key -> (lowest, highest, lowest excluded); keys not listed only have their type checked.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "port": (1, 65535, False),
    "status.port": (0, 65535, False),
    "max_launches": (1, _INF, False),
    "startup_timeout": (0, _INF, True),
    "stall_timeout": (0, _INF, True),
    "stop_grace": (0, _INF, True),
    "collect_after_fatal": (0, _INF, False),
    "health.interval": (0, _INF, True),
    "health.timeout": (0, _INF, True),
    "health.failures": (1, _INF, False),
    "backoff.initial": (0, _INF, False),
    "backoff.maximum": (0, _INF, False),
    "backoff.multiplier": (1, _INF, False),
    "backoff.jitter": (0, _INF, False),
    "backoff.crash_loop_limit": (1, _INF, False),
    "backoff.crash_loop_window": (0, _INF, True),
    "remedies.min_model_len": (1, _INF, False),
    "remedies.kv_margin": (0, 0.5, False),
    "remedies.utilization_margin": (0, 0.5, False),
    "remedies.cpu_offload_gb": (0, _INF, False),
    "remedies.port_retries": (0, 100, False),
    "remedies.min_max_num_seqs": (1, _INF, False),
    "remedies.min_max_num_batched_tokens": (1, _INF, False),
    "plan.margin": (0, 0.5, False),
}
_NON_EMPTY = {"host", "vllm_command", "status.host"}
_CHOICES = {"log_level": ("debug", "info", "warning", "error"), "log_format": ("auto", "json", "console")}


@dataclass(frozen=True)
class _Spec:
    key: str          # dotted: "health.interval"
    kind: type        # str, int, float, bool or tuple
    default: Any


#: GuardConfig fields that are derived, not set by a file, a variable or an option.
_NOT_SETTINGS = frozenset({"vllm_file_args"})


def _specs() -> dict[str, _Spec]:
    out: dict[str, _Spec] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in _NOT_SETTINGS:
                continue
            if f.name in _SECTIONS and not prefix:
                walk(_SECTIONS[f.name], f.name + ".")
                continue
            hint = hints[f.name]
            kind = tuple if typing.get_origin(hint) is tuple else hint
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            out[prefix + f.name] = _Spec(prefix + f.name, kind, default)

    walk(GuardConfig, "")
    return out


SPECS: dict[str, _Spec] = _specs()


def env_name(key: str) -> str:
    """``health.interval`` -> ``VLLM_GUARD_HEALTH_INTERVAL``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def default_state_dir(environ: Mapping[str, str]) -> str:
    """$STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/vllm-guard, else ~/.local/state/vllm-guard."""
    systemd = environ.get("STATE_DIRECTORY", "")
    if systemd:
        return systemd.split(":")[0]  # systemd joins several StateDirectory= entries with ':'
    xdg = environ.get("XDG_STATE_HOME", "")
    if xdg:
        return str(Path(xdg) / "vllm-guard")
    home = environ.get("HOME") or str(Path.home())
    return str(Path(home) / ".local" / "state" / "vllm-guard")


def config_candidates(environ: Mapping[str, str]) -> list[str]:
    """Files read when no --config is given, first present wins (user before system)."""
    xdg = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return [str(Path(xdg) / "vllm-guard" / "config.toml"), SYSTEM_CONFIG]


def find_config_file(args: argparse.Namespace | None, environ: Mapping[str, str]) -> str | None:
    """The file resolve() reads: --config, else $VLLM_GUARD_CONFIG, else the first candidate present."""
    explicit = getattr(args, "config", None) or environ.get(ENV_CONFIG) or None
    if explicit:
        return os.path.expanduser(explicit)
    return next((p for p in config_candidates(environ) if os.path.isfile(p)), None)


# -- values ----------------------------------------------------------------------------------

def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(SPECS) + list(_SECTIONS), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check(key: str, value: Any, where: str) -> Any:
    """Type- and range-check one value; returns it normalised (int -> float, list -> tuple)."""
    spec = SPECS[key]
    shown = f"{key} = {value!r} ({where})"
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{shown}: must be true or false")
    elif spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{shown}: must be an integer")
    elif spec.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"{shown}: must be a number")
        value = float(value)
    elif spec.kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{shown}: must be a string")
        if "\x00" in value:
            raise ConfigError(f"{shown}: contains a NUL character")
        if key in _NON_EMPTY and not value.strip():
            raise ConfigError(f"{shown}: must not be empty")
        if key in _CHOICES and value.lower() not in _CHOICES[key]:
            raise ConfigError(f"{shown}: must be one of {', '.join(_CHOICES[key])}")
        if key in _CHOICES:
            value = value.lower()
        if key == "notify_url" and value and not value.startswith(("http://", "https://")):
            raise ConfigError(f"{shown}: must be an http:// or https:// URL")
        if key == "vllm_command":
            try:
                shlex.split(value)
            except ValueError as exc:
                raise ConfigError(f"{shown}: {exc}") from None
    elif spec.kind is tuple:
        if key == "vllm_args" and isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:
                raise ConfigError(f"{shown}: {exc}") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{shown}: must be a list of strings")
        if any("\x00" in v for v in value):
            raise ConfigError(f"{shown}: contains a NUL character")
        value = tuple(value)
        if key.startswith("remedies."):
            bad = [v for v in value if v not in REMEDY_NAMES]
            if bad:
                raise ConfigError(
                    f"{shown}: unknown remedy {bad[0]!r}; known: {', '.join(sorted(REMEDY_NAMES))}"
                )
    if key in _RANGES:
        lo, hi, lo_open = _RANGES[key]
        if value < lo or value > hi or (lo_open and value == lo):
            if hi == _INF:
                rule = f"must be greater than {lo:g}" if lo_open else f"must be at least {lo:g}"
            else:
                rule = f"must be between {lo:g} and {hi:g}"
            raise ConfigError(f"{shown}: {rule}")
    return value


def _from_text(key: str, text: str, where: str) -> Any:
    """Convert an environment string to the key's type (then _check it)."""
    kind = SPECS[key].kind
    value: Any = text
    try:
        if kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                value = True
            elif low in ("0", "false", "no", "off"):
                value = False
        elif kind is int:
            value = int(text.strip())
        elif kind is float:
            value = float(text.strip())
        elif kind is tuple and key != "vllm_args":
            value = [v for v in text.replace(",", " ").split() if v]
    except ValueError:
        pass  # left as text; _check names the expected type
    return _check(key, value, where)


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML config: a flat ``{"health.interval": 5.0, ...}`` of checked values."""
    path = str(path)
    raw = read_named_file(path, "config file", MAX_CONFIG_BYTES, f"{MAX_CONFIG_BYTES >> 10} KiB")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): a TOML file must be") from None
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if name in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{name!r} in {path} must be a table ([{name}])")
            items = [(f"{name}.{k}", v) for k, v in value.items()]
        else:
            items = [(name, value)]
        for key, val in items:
            if key not in SPECS:
                shown = key if not isinstance(val, dict) else f"[{key}]"
                raise ConfigError(f"unknown key {shown!r} in {path}{_suggest(key)}")
            flat[key] = _check(key, val, path)
    return flat


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    # Unknown VLLM_GUARD_* names are not errors: VLLM_GUARD_TOKEN and test switches share the prefix.
    out: dict[str, Any] = {}
    for key in SPECS:
        name = env_name(key)
        text = environ.get(name, "")
        if text != "":
            out[key] = _from_text(key, text, f"environment {name}")
    return out


# -- command line ----------------------------------------------------------------------------

# option -> (dest, config key, argparse type or a constant for switches, metavar, help)
_OPTIONS: list[tuple[str, str, Any, str | None, str]] = [
    ("--model", "model", str, "MODEL", "model to serve (vLLM's positional MODEL)"),
    ("--host", "host", str, "HOST", "vLLM's --host (default 127.0.0.1)"),
    ("--port", "port", int, "PORT", "vLLM's --port (default 8000)"),
    ("--vllm-command", "vllm_command", str, "CMD", "how to start vLLM (default 'vllm serve')"),
    ("--status-host", "status.host", str, "HOST", "status endpoint address (default 127.0.0.1)"),
    ("--status-port", "status.port", int, "PORT", "status endpoint port; 0 disables it (default 8077)"),
    ("--state-dir", "state_dir", str, "DIR", "where the guard keeps its token, endpoint and learnt flags"),
    ("--token-file", "status.token_file", str, "FILE", "bearer token for the status endpoint"),
    ("--min-model-len", "remedies.min_model_len", int, "N", "never shrink --max-model-len below this"),
    ("--max-launches", "max_launches", int, "N", "give up after this many launches that never become healthy"),
    ("--health-interval", "health.interval", float, "S", "seconds between health probes"),
    ("--health-timeout", "health.timeout", float, "S", "one probe's deadline in seconds"),
    ("--health-failures", "health.failures", int, "N", "failed probes in a row that mean 'hung'"),
    ("--startup-timeout", "startup_timeout", float, "S", "a launch not healthy by then has failed"),
    ("--stall-timeout", "stall_timeout", float, "S", "no output and no health this long during start-up"),
    ("--stop-grace", "stop_grace", float, "S", "SIGTERM to SIGKILL grace for vLLM"),
    ("--no-plan", "plan.enabled", False, None, "do not predict the first launch's flags"),
    ("--no-learn", "plan.learn", False, None, "do not store or reuse flags that became healthy"),
    ("--auto-fit", "plan.auto_fit", True, None, "always use --max-model-len auto where vLLM has it (0.14+)"),
    ("--quiet", "quiet", True, None, "do not echo vLLM's output"),
    ("--log-level", "log_level", str, "LEVEL", "debug, info (default), warning or error"),
    ("--log-format", "log_format", str, "FORMAT", "json, console, or auto (console on a terminal)"),
    ("--notify-url", "notify_url", str, "URL", "POST a JSON event here on failures, relaunches, healthy, giving up"),
]


#: Every option of the guard's own (``start``'s): ``serve`` takes those vLLM has none of, and a vLLM
#: flag check names them as the guard's.
GUARD_OPTIONS = frozenset(["--config", "--dry-run", *(o[0] for o in _OPTIONS)])
#: Each guard option's environment variable.
GUARD_OPTION_VARS = {"--config": ENV_CONFIG, "--dry-run": "VLLM_GUARD_DRY_RUN",
                     **{o[0]: env_name(o[1]) for o in _OPTIONS}}
#: Guard options that mean the same to vLLM (its model, host and port): vLLM's, as they stand.
_SAME_FOR_VLLM = frozenset({"--model", "--host", "--port"})
_SWITCHES = frozenset(["--dry-run", *(o[0] for o in _OPTIONS if isinstance(o[2], bool))])


def split_serve_args(argv: list[str], vllm_has: typing.Callable[[str], bool]) -> tuple[list[str], list[str], list[str]]:
    """``vllm-guard serve``'s arguments: (the guard's own options, vLLM's arguments, notes).

    ``serve`` is ``vllm serve``'s command line, so an option vLLM has (``vllm_has``) stays vLLM's. The
    guard's own options that vLLM has none of (``--dry-run``, ``--state-dir``, ``--status-port``,
    ``--notify-url`` ...) are taken by the guard, as ``start`` would take them, never passed to vLLM;
    ``--config FILE.toml`` is the guard's config file (vLLM reads only YAML). One that both have (such
    as ``--log-level``) goes to vLLM, and a note points to the guard's ``VLLM_GUARD_*`` variable.
    """
    guard: list[str] = []
    rest: list[str] = []
    notes: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest += argv[i:]
            break
        name, eq, value = token.partition("=")
        takes_value = name not in _SWITCHES
        if not eq and takes_value and i + 1 < len(argv):
            value = argv[i + 1]
        ours = name in GUARD_OPTIONS and name not in _SAME_FOR_VLLM and (
            not vllm_has(name) or (name == "--config" and value.endswith(".toml")))
        if name in GUARD_OPTIONS and not ours and name not in _SAME_FOR_VLLM and name != "--config":
            notes.append(f"{name} is vLLM's option too, so it goes to vLLM; the guard's own is "
                         f"{GUARD_OPTION_VARS[name]}")
        n = 2 if ours and takes_value and not eq else 1
        (guard if ours else rest).extend(argv[i:i + n])
        i += n
    return guard, rest, notes


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")  # argparse's own dest: --health-interval -> health_interval


def add_start_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``start`` options; every default is None so unset options fall through."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"TOML config (default: $XDG_CONFIG_HOME/vllm-guard/config.toml or {SYSTEM_CONFIG})")
    for option, _key, kind, metavar, text in _OPTIONS:
        if isinstance(kind, bool):
            parser.add_argument(option, action="store_true", default=None, help=text)
        else:
            parser.add_argument(option, type=kind, metavar=metavar, default=None, help=text)
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER,
                        help="arguments for vLLM, after '--'")


def _from_cli(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for option, key, kind, _m, _h in _OPTIONS:
        value = getattr(args, _dest(option), None)
        if value is None:
            continue
        if isinstance(kind, bool):  # a switch: present means the constant (--no-plan -> False)
            value = kind if value else None
            if value is None:
                continue
        out[key] = _check(key, value, f"command line {option}")
    extra = list(getattr(args, "vllm_args", None) or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if extra:
        out["vllm_args"] = tuple(extra)
    return out


def _overlay_args(lower: tuple[str, ...], upper: tuple[str, ...]) -> tuple[str, ...]:
    """A higher layer's vLLM flags replace the same flags below; the rest of ``lower`` stays."""
    up = Flags.parse(list(upper))
    base = Flags.parse(list(lower))
    for name in up.names():
        base = base.remove(name)
    if up.positionals():  # the model given positionally again: the higher layer's wins
        base = Flags.parse(_drop_leading_positional(base.argv()))
    return tuple(base.argv()) + tuple(upper)


def _drop_leading_positional(argv: list[str]) -> list[str]:
    return argv[1:] if argv and not argv[0].startswith("-") else argv


def _expand(path: str, home: str) -> str:
    """``~`` or ``~/x`` -> under ``home`` (from the environment given, not the process's)."""
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path


def _take_model(model: str, args: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """Move the model out of the vLLM args (``MODEL ...`` or ``--model MODEL``) into ``model``."""
    flags = Flags.parse(list(args))
    found: list[str] = []
    if flags.has("--model"):
        found.append(flags.get("--model") or "")
        flags = flags.remove("--model")
    argv = flags.argv()
    if argv and not argv[0].startswith("-"):
        found.append(argv[0])
        argv = argv[1:]
    for other in found:
        if not other:
            raise ConfigError("vllm_args: --model needs a value")
        if model and other != model:
            raise ConfigError(f"model given twice: {model!r} (model) and {other!r} (vLLM args)")
        model = other
    return model, tuple(argv)


# -- the whole ---------------------------------------------------------------------------------

#: How deep vLLM's --config YAML may nest (a flag: value mapping, a list or mapping as a value, and
#: what that holds: a handful of levels in any real file).
MAX_YAML_DEPTH = 32


class _BoundedYaml(yaml.SafeLoader):
    """PyYAML's safe loader with what makes a small file expensive refused: aliases and anchors (an
    alias bomb of 1 KiB expands to gigabytes), and nesting deeper than :data:`MAX_YAML_DEPTH` (the
    composer recurses once per level: a deep file is a RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (&, *) are refused",
                                              event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 (PyYAML's name)
        # refused as the scanner meets it: PyYAML's scanner keeps a possible key per open bracket and
        # rescans them all per token (a file of 200 000 '[' took a second before the composer saw it)
        if self.flow_level >= MAX_YAML_DEPTH:
            raise yaml.scanner.ScannerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                            self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


def _load_yaml(raw: bytes, path: str) -> Any:
    """vLLM's --config YAML, parsed within bounds; every failure a ConfigError naming the file."""
    try:
        loader = _BoundedYaml(raw.decode("utf-8"))
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"vLLM's --config file {path} is not UTF-8 text (byte {exc.start})") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        raise ConfigError(f"vLLM's --config file {path} is not valid YAML: {str(exc)[:500]}") from None


def _vllm_config_file(vllm_args: tuple[str, ...]) -> tuple[str, ...]:
    """vLLM's ``--config`` YAML as the arguments vLLM makes of it (``load_config_file``): a flag per
    key, ``true`` a switch, a list its items, a mapping JSON. The guard reads it only to know the
    values; vLLM still reads the file, and a flag the guard changes goes on the command line, which
    wins over the file."""
    path = Flags.parse(list(vllm_args)).get("--config")
    if not path:
        return ()
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(f"vLLM's --config {path}: vLLM reads only .yaml/.yml files")
    raw = read_named_file(path, "vLLM's --config file", MAX_CONFIG_BYTES, f"{MAX_CONFIG_BYTES >> 10} KiB")
    data = _load_yaml(raw, path)
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise ConfigError(f"vLLM's --config file {path} must hold a mapping of flag: value")
    out: list[str] = []
    try:
        for key, value in data.items():
            flag = "--" + str(key)
            if isinstance(value, bool):
                out += [flag] if value else []
            elif isinstance(value, list):
                out += [flag, *map(str, value)] if value else []
            elif isinstance(value, dict):
                out += [flag, json.dumps(value)]
            else:
                out += [flag, str(value)]
    except (TypeError, ValueError) as exc:        # a mapping JSON cannot hold (a date as a key ...)
        raise ConfigError(f"vLLM's --config file {path} holds a value vLLM cannot take as a flag: {exc}") from None
    if any("\x00" in token for token in out):
        raise ConfigError(f"vLLM's --config file {path} contains a NUL character")
    return tuple(out)


def build(values: Mapping[str, Any]) -> GuardConfig:
    """Make a GuardConfig from checked flat values (missing keys keep their defaults)."""
    top = {k: v for k, v in values.items() if "." not in k}
    sections = {
        name: cls(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(name + ".")})
        for name, cls in _SECTIONS.items()
    }
    return GuardConfig(**top, **sections)


def flatten(cfg: GuardConfig) -> dict[str, Any]:
    """The flat ``{"health.interval": ...}`` view of a config (the inverse of build)."""
    out: dict[str, Any] = {}
    for key in SPECS:
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = obj
    return out


def _cross_checks(cfg: GuardConfig) -> None:
    if cfg.backoff.maximum < cfg.backoff.initial:
        raise ConfigError(
            f"backoff.maximum ({cfg.backoff.maximum:g}) must not be below backoff.initial ({cfg.backoff.initial:g})"
        )
    if cfg.status.port and cfg.status.port == cfg.port and cfg.status.host == cfg.host:
        raise ConfigError(f"status.port and port are both {cfg.port}; give the status endpoint its own port")


def resolve(
    args: argparse.Namespace | None,
    environ: Mapping[str, str],
    *,
    require_model: bool = True,
) -> GuardConfig:
    """Merge defaults < config file < VLLM_GUARD_* environment < command line into a GuardConfig.

    ``state_dir`` comes back filled in; the model may be given inside the vLLM args (``MODEL``
    first, or ``--model``) and is moved into ``model``. Raises ConfigError naming the bad key.
    """
    args = args if args is not None else argparse.Namespace()
    path = find_config_file(args, environ)
    layers = [load_file(path) if path else {}, _from_env(environ), _from_cli(args)]
    values: dict[str, Any] = {}
    vargs: tuple[str, ...] = ()
    for layer in layers:
        layer = dict(layer)
        if "vllm_args" in layer:
            vargs = _overlay_args(vargs, layer.pop("vllm_args"))
        values.update(layer)
    model, vargs = _take_model(values.get("model", ""), vargs)
    file_args = _vllm_config_file(vargs)
    if not model:
        model = Flags.parse(list(file_args)).get("--model") or ""
    values["model"], values["vllm_args"], values["vllm_file_args"] = model, vargs, file_args
    home = environ.get("HOME") or str(Path.home())
    values["model"] = _expand(values["model"], home)  # a local checkpoint directory
    values["state_dir"] = _expand(values.get("state_dir") or default_state_dir(environ), home)
    if values.get("status.token_file"):
        values["status.token_file"] = _expand(values["status.token_file"], home)
    if "vllm_command" in values:
        words = shlex.split(values["vllm_command"])
        words[0] = _expand(words[0], home)  # "~/venv/bin/vllm serve" works as written
        values["vllm_command"] = shlex.join(words)
    cfg = build(values)
    _cross_checks(cfg)
    if require_model and not cfg.model:
        raise ConfigError(
            "no model: pass --model MODEL, put 'model = \"...\"' in the config file, or set VLLM_GUARD_MODEL"
        )
    return cfg
