"""The alert rules and the dashboard against the metrics real guards expose.

Real guards (against the fake vLLM) heal, hang and give up; their ``/metrics`` are scraped and
fed to ``promtool test rules``, and a real Prometheus scrapes a real guard with the rules loaded.
promtool and prometheus come from Debian's ``prometheus`` package (scripts/test installs it when
it can); without them these tests are skipped, except in CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import httpx
import pytest
import yaml
from guardrun import LLAMA8B, ROOT, GuardRun, free_port
from prometheus_client.parser import text_string_to_metric_families

RULES = ROOT / "configs" / "monitoring" / "vllm-guard-alerts.yaml"
DASHBOARD = ROOT / "configs" / "monitoring" / "vllm-guard-dashboard.json"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") or os.environ.get("VLLM_GUARD_REQUIRE_REAL"):
            pytest.fail(f"{name} is missing (Debian: apt-get install prometheus)")
        pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus)")
    return found


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    """/metrics of three real guards: one that healed by cutting the context, one stuck starting,
    and one started after a guard on its state dir gave up."""
    tmp = tmp_path_factory.mktemp("monitoring")
    for name in ("healed", "stuck"):
        (tmp / name).mkdir()
    out: dict[str, tuple[str, float]] = {}
    healed = GuardRun(tmp / "healed", {"version": "0.32.0", "model": LLAMA8B}).start()
    try:
        healed.wait_healthy(launches=2)
        out["healed"] = (httpx.get(f"http://127.0.0.1:{healed.status_port}/metrics").text, time.time())
    finally:
        healed.close()
    stuck = GuardRun(tmp / "stuck", {"version": "0.32.0", "model": LLAMA8B, "silent_hang_at_start": True},
                     guard_args=["--stall-timeout", "2", "--max-launches", "1"]).start()
    try:
        stuck.wait_for(lambda s: s["state"] == "starting" and s["pid"], 30, "a launch")
        out["stuck"] = (httpx.get(f"http://127.0.0.1:{stuck.status_port}/metrics").text, time.time())
        assert stuck.wait_exit(60) == 75                 # it gives up: the stall, with no launch left
    finally:
        stuck.close()
    after = GuardRun(tmp / "stuck", {"version": "0.32.0", "model": LLAMA8B}, vllm_args=["--max-model-len", "8192"],
                     state_dir=stuck.state_dir).start()
    try:
        after.wait_healthy(launches=1)
        out["after"] = (httpx.get(f"http://127.0.0.1:{after.status_port}/metrics").text, time.time())
    finally:
        after.close()
    return out


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _series(text: str, at: float, instance: str, shift_timestamps: float) -> list[dict[str, str]]:
    """promtool input series that hold one real scrape's values for 40 minutes (timestamps moved so
    that the scrape happened ``shift_timestamps`` seconds into the test)."""
    out = []
    for name, labels, value in samples(text):
        if name.endswith("_created") or value != value:       # NaN: not known yet
            continue
        if name.endswith("_timestamp_seconds") and value > 0:
            value = max(0.0, shift_timestamps - (at - value))
        labels = {**labels, "job": "vllm-guard", "instance": instance}
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        out.append({"series": f"{name}{{{body}}}", "values": f"{value:g}+0x40"})
    return out


def test_the_rules_fire_on_what_real_guards_expose(scrapes, tmp_path):
    promtool = _tool("promtool")
    assert subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True).returncode == 0
    # each scrape is taken to happen 10 minutes into the test
    series = (_series(*scrapes["healed"], "healed:8077", 600) + _series(*scrapes["stuck"], "stuck:8077", 600)
              + _series(*scrapes["after"], "after:8077", 600))
    series.append({"series": 'up{job="vllm-guard",instance="gone:8077"}', "values": "1 0x20"})
    served = next(v for n, _, v in samples(scrapes["healed"][0]) if n == "vllm_guard_context_served_tokens")
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "11m", "alertname": "VllmGuardContextCut",
             "exp_alerts": [{"exp_labels": {"severity": "info", "job": "vllm-guard", "instance": "healed:8077"},
                             "exp_annotations": _annotations("VllmGuardContextCut", "healed:8077", f"{served:g}")}]},
            {"eval_time": "16m", "alertname": "VllmGuardNotReady",
             "exp_alerts": [{"exp_labels": {"severity": "warning", "job": "vllm-guard", "instance": "stuck:8077"},
                             "exp_annotations": _annotations("VllmGuardNotReady", "stuck:8077")}]},
            {"eval_time": "11m", "alertname": "VllmGuardGaveUp",
             "exp_alerts": [{"exp_labels": {"severity": "critical", "job": "vllm-guard", "instance": "after:8077"},
                             "exp_annotations": _annotations("VllmGuardGaveUp", "after:8077")}]},
            {"eval_time": "10m", "alertname": "VllmGuardDown",
             "exp_alerts": [{"exp_labels": {"severity": "critical", "job": "vllm-guard", "instance": "gone:8077"},
                             "exp_annotations": _annotations("VllmGuardDown", "gone:8077")}]},
            {"eval_time": "10m", "alertname": "VllmGuardCrashLooping", "exp_alerts": []},
        ]}]}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _annotations(alert: str, instance: str, value: str = "") -> dict[str, str]:
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == alert)
    out = {}
    for key, text in rule["annotations"].items():
        text = text.replace("{{ $labels.instance }}", instance).replace("{{ $value }}", value)
        if "query" in text:      # a template that queries Prometheus: its evaluated value
            text = re.sub(r"\{\{ with .*?\{\{ end \}\}", "starting", text)
        out[key] = text
    return out


def test_the_dashboard_and_the_rules_use_only_metrics_the_guard_exports(scrapes):
    exported = {name for text, _ in scrapes.values() for name, _, _ in samples(text)}
    exported |= {n.rsplit("_", 1)[0] for n in exported if n.endswith(("_bucket", "_sum", "_count"))}
    used = set(re.findall(r"vllm_guard_\w+", RULES.read_text() + DASHBOARD.read_text()))
    assert used and used <= exported, used - exported
    dashboard = json.loads(DASHBOARD.read_text())
    assert all(t["expr"] for p in dashboard["panels"] for t in p["targets"])


def test_a_real_prometheus_scrapes_a_real_guard_with_the_rules(tmp_path):
    prometheus = _tool("prometheus")
    g = GuardRun(tmp_path, {"version": "0.32.0", "model": LLAMA8B}).start()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "vllm-guard",
                            "static_configs": [{"targets": [f"127.0.0.1:{g.status_port}"]}]}]}))
    prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        g.wait_healthy(launches=2)
        api = f"http://127.0.0.1:{port}/api/v1"
        deadline, relaunches, alerts = time.monotonic() + 60, [], []
        while time.monotonic() < deadline:
            try:
                relaunches = httpx.get(f"{api}/query", params={"query": "vllm_guard_relaunches_total"}).json()
                alerts = httpx.get(f"{api}/alerts").json()["data"]["alerts"]
            except (httpx.HTTPError, ValueError, KeyError):
                relaunches, alerts = [], []
            if relaunches and relaunches["data"]["result"] and any(
                    a["labels"]["alertname"] == "VllmGuardContextCut" for a in alerts):
                break
            time.sleep(0.5)
        (series,) = relaunches["data"]["result"]
        assert series["metric"]["reason"] == "kv_cache_insufficient" and series["value"][1] == "1"
        cut = next(a for a in alerts if a["labels"]["alertname"] == "VllmGuardContextCut")
        assert cut["state"] == "pending"                     # for: 10m has not passed yet
        rules = httpx.get(f"{api}/rules").json()["data"]["groups"][0]["rules"]
        assert len(rules) == 5 and all(r["health"] == "ok" for r in rules)
    finally:
        prom.send_signal(signal.SIGTERM)
        prom.wait(30)
        g.close()
