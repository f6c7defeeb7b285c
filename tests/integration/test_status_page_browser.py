"""The status page in a real headless Chromium, following a real guard heal the fake vLLM.

Debian's ``chromium`` driven through its own ``chromium-driver`` by Selenium (scripts/setup-browser
installs both): the driver is built for that very browser, so nothing is downloaded and no version
can drift; Selenium's client is pure Python. The page is loaded once; everything after that is the
page's own script following the guard (no reload from the test). A screenshot is kept (its path is
printed, and copied under ``$VLLM_GUARD_ARTIFACTS`` when that is set).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from guardrun import FAKE, LLAMA8B, ROOT, free_port, kill_marked

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("headless Chromium is not installed here (scripts/setup-browser installs Debian's chromium and "
                "chromium-driver; it needs root and apt-get)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "Llama-3.1-8B-Instruct"
TOKEN = "browser-test-token-0123456789"
#: vLLM echoes the served model name in its own lines: untrusted text that must stay text.
HOSTILE = """</pre><script>window.pwned=1</script><img src=x onerror="window.pwned=2">'quoted' & "double\""""


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
                "--window-size=1400,2200"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class GpuGuard:
    """A real guard process (tests/integration/gpu_guard.py: an L4 from the fake NVML) on the fake vLLM."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.port, self.status_port = tmp, free_port(), free_port()
        self.state_dir = tmp / "state"
        (tmp / "fake").mkdir(exist_ok=True)
        site = tmp / "site" / "vllm-0.32.0.dist-info"      # the vLLM version, as its package says it
        site.mkdir(parents=True)
        (site / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
        settings = {"model": str(MODEL), "vllm_command": f"{sys.executable} {FAKE} serve", "port": self.port,
                    "vllm_args": ["--served-model-name", HOSTILE], "state_dir": str(self.state_dir),
                    "status.port": self.status_port, "health.interval": 5.0, "health.timeout": 5.0,
                    "startup_timeout": 120.0, "stop_grace": 3.0, "plan.enabled": False,
                    "backoff.initial": 0.1, "backoff.jitter": 0.1}
        env = {**os.environ, "PYTHONPATH": f"{site.parent}:{ROOT}", "HF_HUB_OFFLINE": "1", "VLLM_GUARD_TOKEN": TOKEN,
               "FAKE_VLLM_STATE": str(tmp / "fake"),
               # slow enough that the page, polling every 2 s, sees the failed launch before the healthy one
               "FAKE_VLLM_SCENARIO": json.dumps({"version": "0.32.0", "model": LLAMA8B, "speed": 1.5})}
        self.log = open(tmp / "guard.log", "wb")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "integration" / "gpu_guard.py"),
                                      json.dumps(settings)], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=str(ROOT))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.status_port}"

    def status(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(self.url + "/status", timeout=3)
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def output(self) -> str:
        return (self.tmp / "guard.log").read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_marked(self.state_dir)
        self.log.close()


@pytest.fixture
def guard(tmp_path):
    g = GpuGuard(tmp_path)
    yield g
    g.close()


def until(pred: Callable[[], Any], timeout: float, what: str, guard: GpuGuard) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if guard.proc.poll() is not None:
            raise AssertionError(f"guard exited {guard.proc.returncode} while waiting for {what}\n{guard.output()}")
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}\n{guard.output()}")


def text(driver, css: str) -> str:
    """An element's visible text, read in one step in the page (its script swaps the elements every 2 s,
    so a handle found first may be stale by the time it is read)."""
    return driver.execute_script("var e = document.querySelector(arguments[0]);"
                                 "return e ? e.innerText.replace(/[ \\t]+/g, ' ') : '';", css)


def rows(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#launches tbody tr')).map(function (r) {"
        "  return Array.from(r.cells).map(function (c) { return c.innerText.replace(/\\s+/g, ' '); }).join(' '); });")


def keep(driver, tmp_path: Path, name: str, capsys) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    artifacts = os.environ.get("VLLM_GUARD_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    with capsys.disabled():
        print(f"\nstatus page screenshot: {path}")
    return path


def test_the_page_follows_a_heal_and_its_buttons_ask_for_the_token(browser, guard, tmp_path, capsys):
    until(guard.status, 30, "the status endpoint", guard)
    browser.get(guard.url + "/")                      # loaded once: from here on, the page follows by itself
    assert "vllm-guard" in browser.title

    # the failure, on the page before the heal is done; then the healthy launch
    seen: list[tuple[str, tuple[str, ...]]] = []

    def healthy() -> bool:
        seen.append((text(browser, "#state"), tuple(rows(browser))))
        return seen[-1][0] == "healthy" and any(r.startswith("2 ") and " healthy " in f" {r} " for r in seen[-1][1])

    until(healthy, 120, "the page to show the healed launch", guard)
    failed_first = [(state, r) for state, r in seen if state != "healthy"
                    and any(row.startswith("1 ") and "failed" in row and "kv_cache_insufficient" in row for row in r)]
    assert failed_first, seen                          # launch 1's diagnosis was shown while launch 2 started
    assert browser.execute_script("return document.body.getAttribute('data-refreshed')")   # its script did it

    s = guard.status()
    assert s is not None and s["state"] == "healthy"
    served, fit = s["context"]["served"], s["context"]["fit"]
    assert text(browser, "#context-served") == str(served) and text(browser, "#context-fit") == str(fit)
    assert text(browser, "#context-asked") == "131072"
    flags = text(browser, "#flags")
    assert f"--max-model-len (unset) {served}" in flags and s["changed_flags"]["--max-model-len"]["why"] in flags
    now = text(browser, "#now")
    assert "kv_cache_insufficient (healed)" in now and f"http://127.0.0.1:{guard.port}" in now
    # the GPU memory: as planned (the L4's 23.55 GiB, the model's config) and as vLLM printed it
    plan, printed = text(browser, "#memory-plan"), text(browser, "#memory-vllm")
    assert "23.55 GiB" in plan and "weights" in plan and "KV cache" in plan and "non-torch" in plan
    assert f"weights {LLAMA8B['weights_gib']:.2f} GiB" in printed and "KV cache" in printed
    assert browser.execute_script("return document.querySelectorAll('#memory-plan svg rect').length") >= 4

    # vLLM's lines, hostile ones included, are text: no element, no script ran
    assert HOSTILE in text(browser, "#output")
    assert browser.execute_script("return document.querySelectorAll('#output *').length") == 0
    assert browser.execute_script("return window.pwned === undefined")
    # self-contained: nothing was fetched from anywhere but this endpoint
    origins = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith(guard.url) or u.startswith("data:") for u in origins), origins
    shot = keep(browser, tmp_path, "status-page-healthy.png", capsys)
    assert shot.stat().st_size > 10_000

    # the buttons ask for the token, refuse a wrong one, and work with the right one
    launches = len(s["launches"])
    browser.find_element(By.ID, "restart").click()
    until(lambda: "token first" in text(browser, "#message"), 10, "the page to ask for the token", guard)
    browser.find_element(By.ID, "token").send_keys("wrong-token")
    browser.find_element(By.ID, "restart").click()
    until(lambda: "refused the token (HTTP 403)" in text(browser, "#message"), 10, "the refusal", guard)
    assert len(guard.status()["launches"]) == launches and guard.status()["restarts"] == 0
    box = browser.find_element(By.ID, "token")
    box.clear()
    box.send_keys(TOKEN)
    browser.find_element(By.ID, "restart").click()
    until(lambda: "Restart requested" in text(browser, "#message"), 10, "the restart to be accepted", guard)
    until(lambda: (guard.status() or {}).get("restarts") == 1, 30, "the guard to restart vLLM", guard)
    until(lambda: text(browser, "#state") == "healthy" and any(r.startswith(f"{launches + 1} ") for r in rows(browser)),
          120, "the page to show the restarted launch serving", guard)
    assert TOKEN not in browser.page_source            # typed into the box, never put in the page
    browser.find_element(By.ID, "stop").click()
    until(lambda: "Stop requested" in text(browser, "#message"), 10, "the stop to be accepted", guard)
    assert guard.proc.wait(timeout=30) == 0
