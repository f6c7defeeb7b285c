import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


import pytest  # noqa: E402
from guardrun import GuardRun  # noqa: E402


@pytest.fixture
def run(tmp_path):
    """``run(scenario, ...)`` starts a guard against the fake vLLM; every one started is closed after the test."""
    runs: list[GuardRun] = []

    def make(*args, **kw) -> GuardRun:
        g = GuardRun(tmp_path, *args, **kw).start()
        runs.append(g)
        return g

    yield make
    for g in runs:
        g.close()
