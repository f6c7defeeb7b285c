"""One module signals every process: no other code in supervisor/ can send a signal.

Read from the source's syntax tree: any use of ``kill``, ``killpg``, ``send_signal``, ``terminate``,
``pidfd_send_signal``, ``pthread_kill``, ``sigqueue`` or ``raise_signal`` (called, imported, or
reached by ``getattr``) outside ``supervisor/shell/signalling.py`` fails, naming file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "supervisor"
CHOKEPOINT = ROOT / "shell" / "signalling.py"
SIGNALLING = frozenset({"kill", "killpg", "send_signal", "terminate", "pidfd_send_signal", "pthread_kill",
                        "sigqueue", "raise_signal"})


def uses(path: Path) -> list[str]:
    """Every place in ``path`` that can send a signal: ``file:line: what``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and node.attr in SIGNALLING:
            name = node.attr
        elif isinstance(node, ast.ImportFrom):
            name = next((a.name for a in node.names if a.name in SIGNALLING), None)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in SIGNALLING:
            name = f"getattr(..., {node.args[1].value!r})"
        if name is not None:
            found.append(f"{path.relative_to(ROOT.parent)}:{getattr(node, 'lineno', 0)}: {name}")
    return found


def test_no_code_outside_the_chokepoint_sends_a_signal():
    offenders = [u for path in sorted(ROOT.rglob("*.py")) if path != CHOKEPOINT for u in uses(path)]
    assert offenders == [], "signals must go through supervisor/shell/signalling.py:\n" + "\n".join(offenders)


def test_the_scan_sees_the_chokepoints_own_signals():
    # The scan is not vacuous: it finds what signalling.py itself sends.
    found = " ".join(uses(CHOKEPOINT))
    for name in ("killpg", "pidfd_send_signal", "send_signal", "kill"):
        assert f": {name}" in found
