"""Mistakes a real guard refuses before any launch, and serve's own options, as a person meets them.

The fake vLLM is installed as vLLM 0.32.0 would be (a dist-info on its PYTHONPATH), so the guard
reads its version as from a real install and checks the flags against that release's parser. Each
refusal exits 78 with the message on the terminal, and the fake vLLM never starts (its launch log
stays empty).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from guardrun import FAKE, ROOT, argv_flag, free_port


def installed_as(tmp: Path, version: str) -> str:
    site = tmp / "site"
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return f"{ROOT}{os.pathsep}{site}"


def fake_launches(tmp: Path) -> list[dict]:
    path = tmp / "fake-state" / "launches.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_flag_typo_is_refused_with_did_you_mean_and_nothing_is_launched(run, tmp_path):
    g = run({"version": "0.32.0"}, vllm_args=["--max-model-length", "8192", "--enforce-eager"],
            env={"PYTHONPATH": installed_as(tmp_path, "0.32.0")})
    assert g.wait_exit(60) == 78
    out = g.output()
    assert "vLLM 0.32.0 has no option --max-model-length; did you mean --max-model-len?" in out
    assert "no launch was made" in out
    assert fake_launches(tmp_path) == []


def test_a_local_model_path_that_does_not_exist_is_refused_naming_it(run, tmp_path):
    missing = tmp_path / "models" / "Llama-3.1-8B"
    g = run({"version": "0.32.0"}, model=str(missing), env={"PYTHONPATH": installed_as(tmp_path, "0.32.0")})
    assert g.wait_exit(60) == 78
    assert f"model {missing} does not exist" in g.output()
    assert fake_launches(tmp_path) == []


def test_serve_takes_the_guards_own_options_and_passes_the_rest_to_vllm(tmp_path):
    state, status_port, port = tmp_path / "served-state", free_port(), free_port()
    (tmp_path / "fake-state").mkdir()
    env = {**os.environ, "PYTHONPATH": installed_as(tmp_path, "0.32.0"), "HF_HUB_OFFLINE": "1",
           "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.32.0"}), "FAKE_VLLM_STATE": str(tmp_path / "fake-state"),
           "VLLM_GUARD_TOKEN": "test-token", "VLLM_GUARD_VLLM_COMMAND": f"{sys.executable} {FAKE} serve",
           "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "supervisor", "serve", "fake/model", "--max-model-len", "8192",
            "--state-dir", str(state), "--status-port", str(status_port), "--port", str(port),
            "--health-interval", "0.3"]
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not fake_launches(tmp_path):
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.1)
        [launch] = fake_launches(tmp_path)
        assert argv_flag(launch["argv"], "--max-model-len") == "8192"
        assert argv_flag(launch["argv"], "--port") == str(port)
        assert not any(a in launch["argv"] for a in ("--state-dir", "--status-port", "--health-interval"))
        guard = json.loads((state / "guard.json").read_text())           # the state dir given to serve
        assert guard.get("status_port") == status_port
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
