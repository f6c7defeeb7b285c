"""The systemd units: `systemd-analyze verify` accepts them, and they say what the guard relies on."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from supervisor.config import GuardConfig

ROOT = Path(__file__).resolve().parents[2]
UNITS = [ROOT / "systemd" / "vllm-guard.service", ROOT / "systemd" / "vllm-guard@.service"]
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")


def settings(path: Path) -> dict[str, list[str]]:
    """Service-section key -> values (keys may repeat, as in DeviceAllow=)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def verify(tmp_path: Path, unit: Path, name: str | None = None) -> subprocess.CompletedProcess:
    """Run verify on a copy whose ExecStart points at a binary that exists here."""
    text = unit.read_text().replace("/usr/local/bin/vllm-guard", "/bin/true")
    copy = tmp_path / (name or unit.name)
    copy.write_text(text)
    return subprocess.run([ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60)


@needs_analyze
@pytest.mark.parametrize("unit, name", [(UNITS[0], None), (UNITS[1], "vllm-guard@llama8b.service"),
                                        (UNITS[1], None)], ids=["service", "instance", "template"])
def test_systemd_analyze_verify_accepts_the_units(tmp_path, unit, name):
    result = verify(tmp_path, unit, name)
    assert result.returncode == 0, result.stderr
    ours = [line for line in (result.stdout + result.stderr).splitlines() if str(tmp_path) in line]
    assert ours == []   # verify only warns (rc 0) about unknown keys and bad values


@needs_analyze
def test_verify_would_catch_a_bad_unit(tmp_path):
    bad = tmp_path / "bad.service"
    bad.write_text(UNITS[0].read_text().replace("KillMode=mixed", "KillMode=mixd\nFooBar=1"))
    result = verify(tmp_path, bad)
    out = result.stdout + result.stderr
    assert "FooBar" in out and "kill mode" in out.lower()


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_units_say_what_the_guard_relies_on(unit):
    s = settings(unit)
    assert s["Service.Type"] == ["notify"]
    assert s["Service.NotifyAccess"] == ["main"]
    assert s["Service.KillMode"] == ["mixed"]
    assert s["Service.Restart"] == ["on-failure"]
    assert s["Service.RestartPreventExitStatus"] == ["78"]
    assert "Service.WatchdogSec" in s
    assert "Service.StateDirectory" in s
    assert s["Service.PrivateDevices"] == ["no"]
    assert any("nvidia" in v for v in s["Service.DeviceAllow"])
    assert "Service.MemoryDenyWriteExecute" not in s     # CUDA and Triton JIT need W+X pages
    assert re.match(r"^/\S+/vllm-guard start --config /etc/vllm-guard/\S+\.toml$", s["Service.ExecStart"][0])


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_stop_timeout_exceeds_the_guards_grace(unit):
    stop = int(settings(unit)["Service.TimeoutStopSec"][0])
    assert stop >= GuardConfig().stop_grace + 15   # room for the guard's own shutdown after vLLM's


def test_template_is_per_instance():
    s = settings(UNITS[1])
    assert s["Service.ExecStart"][0].endswith("--config /etc/vllm-guard/%i.toml")
    assert s["Service.StateDirectory"] == ["vllm-guard/%i"]


def test_units_parse_as_ini():
    for unit in UNITS:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(unit.read_text())
        assert {"Unit", "Service", "Install"} <= set(parser.sections())


@pytest.mark.parametrize("unit", UNITS, ids=["service", "template"])
def test_every_cache_vllm_writes_is_writable_under_dynamic_user(unit):
    s = settings(unit)
    assert s["Service.DynamicUser"] == ["yes"] and s["Service.ProtectHome"] == ["yes"]
    env = dict(e.split("=", 1) for e in s["Service.Environment"])
    writable = ["/var/cache/" + d for d in s["Service.CacheDirectory"]] + \
               ["/var/lib/" + d for d in s["Service.StateDirectory"]]
    for name in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR",
                 "TORCHINDUCTOR_CACHE_DIR"):
        assert any(env[name].startswith(w) for w in writable), f"{name}={env[name]} is not writable there"
