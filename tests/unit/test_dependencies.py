"""Every third-party module the package imports is declared in pyproject.toml, and vLLM never is.

The class, not the instance: h11 was used by the status server but arrived only through httpx ->
httpcore, so an httpx that dropped it would have broken the guard at import. This walks every
import statement of ``supervisor/`` (top level, inside functions, ``from x import y``), keeps the
top-level names that are neither the standard library nor the package itself, maps each to the
distribution installed for it, and checks that distribution is among ``[project].dependencies``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "supervisor"
#: Scripts the package ships but runs under *vLLM's* interpreter (by path, never imported): what they
#: import is vLLM's environment (torch, transformers), not the guard's.
VLLM_SIDE = {"supervisor/facts/vllm_parser.py"}


def normalise(name: str) -> str:
    """PEP 503: ``prometheus_client`` and ``Prometheus-Client`` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level_names() -> dict[str, set[str]]:
    """Top-level module name -> the package files that import it (relative imports skipped)."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path.relative_to(ROOT)) in VLLM_SIDE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def third_party() -> dict[str, set[str]]:
    return {name: where for name, where in imported_top_level_names().items()
            if name not in sys.stdlib_module_names and name not in ("supervisor", "__future__")}


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {normalise(Requirement(r).name) for r in project["dependencies"]}


def test_the_walk_sees_the_imports_it_must():
    """The walk itself: it finds imports at the top of a module and inside functions alike."""
    names = imported_top_level_names()
    assert "h11" in names and "supervisor/shell/status_server.py" in names["h11"]
    assert {"httpx", "structlog", "tenacity", "psutil", "yaml"} <= set(names)
    assert "pynvml" in names                     # imported inside a function (NVML is optional at run time)


def test_every_third_party_module_the_package_imports_is_declared():
    distributions = importlib.metadata.packages_distributions()
    wanted = declared()
    missing = {}
    for name, where in sorted(third_party().items()):
        dists = {normalise(d) for d in distributions.get(name, [name])}
        if not dists & wanted:
            missing[name] = (sorted(dists), sorted(where))
    assert missing == {}, f"imported but not in [project].dependencies: {missing}"


def test_the_package_never_imports_vllm():
    """vLLM is launched as a child, never imported (it would pull torch and CUDA into the guard)."""
    assert "vllm" not in imported_top_level_names()


def test_every_declared_dependency_is_used():
    """A dependency nothing imports is dead weight in every install (and hides a missing one)."""
    distributions = importlib.metadata.packages_distributions()
    used = {normalise(d) for name in third_party() for d in distributions.get(name, [name])}
    assert declared() - used == set()


def test_the_scripts_run_under_vllms_interpreter_are_never_imported_by_the_guard():
    """What VLLM_SIDE leaves out of the walk above stays out of the guard's process."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for side in VLLM_SIDE:
                dotted = side.removesuffix(".py").replace("/", ".")
                assert dotted not in modules, f"{path} imports {dotted}, which runs under vLLM's interpreter"
