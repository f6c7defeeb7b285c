"""The report of a mutmut run (run by scripts/mutation inside its scratch copy; markdown on stdout).

Reads mutmut's own results (``mutants/<path>.meta``) and the diff of each mutant through mutmut's
API, groups the survivors by function, and sets aside the ones listed as equivalent in
``<module>.equivalent.toml`` (each entry: ``function``, the ``mutated`` line as mutmut writes it,
and ``why``), matched by the function and the mutated line, so a renumbering of mutants after an
edit does not detach a reason from its mutant. An entry that matches nothing is reported as stale.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

KILLED = ("killed", "timeout", "caught by type check", "segfault")


def function_of(key: str, module: str) -> str:
    """``supervisor.core.session.xǁSessionǁ_choose__mutmut_12`` -> ``Session._choose``."""
    local = key[len(module) + 1:].rsplit("__mutmut_", 1)[0]
    if local.startswith("xǁ"):
        return ".".join(part for part in local[2:].split("ǁ") if part)
    return local[2:] if local.startswith("x_") else local


def changed_lines(diff: str) -> tuple[list[str], list[str]]:
    minus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return minus, plus


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--commit", default="")
    ap.add_argument("--equivalent", type=Path)
    ap.add_argument("--tests", nargs="*", default=[])
    a = ap.parse_args()

    data = SourceFileMutationData(path=Path(a.path))
    data.load()
    statuses = {key: status_by_exit_code[code] for key, code in data.exit_code_by_key.items()}
    counts = Counter(statuses.values())
    total = len(statuses)

    entries = []
    if a.equivalent is not None and a.equivalent.exists():
        entries = tomllib.loads(a.equivalent.read_text(encoding="utf-8")).get("equivalent", [])
    used = [False] * len(entries)

    survivors: dict[str, list[tuple[str, str]]] = defaultdict(list)
    equivalent: list[tuple[str, str, str]] = []
    for key in sorted(k for k, s in statuses.items() if s not in KILLED):
        fn = function_of(key, a.module)
        diff = get_diff_for_mutant(key, path=a.path)
        _minus, plus = changed_lines(diff)
        reason = None
        for i, e in enumerate(entries):
            if e.get("function") == fn and e.get("mutated", "").strip() in plus:
                reason, used[i] = e.get("why", ""), True
                break
        body = "\n".join(ln for ln in diff.splitlines()[2:] if ln.startswith(("-", "+")))
        if reason is None:
            survivors[fn].append((f"{key.rsplit('__mutmut_', 1)[1]} ({statuses[key]})", body))
        else:
            equivalent.append((fn, body, reason))

    killed = sum(counts[s] for s in KILLED)
    live = sum(len(v) for v in survivors.values())
    out = [f"# Mutation testing: `{a.path}`", "",
           f"mutmut {importlib.metadata.version('mutmut')}, {datetime.date.today().isoformat()}, "
           f"commit {a.commit}, {a.seconds // 60} min {a.seconds % 60} s on this machine (one worker, nice 19). "
           f"Tests run against each mutant: {', '.join(f'`{t}`' for t in a.tests)}. "
           "Made by `scripts/mutation`; equivalent mutants are listed with their reason in "
           f"`benchmarks/mutation/{a.module}.equivalent.toml`.", "",
           f"**score: {killed} of {total} mutants killed ({100 * killed / max(total, 1):.1f}%); "
           f"{len(equivalent)} equivalent; {live} survive "
           f"({100 * (killed + len(equivalent)) / max(total, 1):.1f}% killed or equivalent)**", "",
           "| status | mutants |", "|---|---|"]
    out += [f"| {status} | {n} |" for status, n in counts.most_common()]
    out += ["", f"## Survivors ({live})", ""]
    if not live:
        out.append("None: every mutant is killed by a test or listed as equivalent below.")
    for fn in sorted(survivors):
        out += [f"### `{fn}` ({len(survivors[fn])})", ""]
        for name, body in survivors[fn]:
            out += [f"mutant {name}:", "```diff", body, "```"]
        out.append("")
    out += ["", f"## Equivalent ({len(equivalent)})", "",
            "Mutants no test can tell from the original: the behaviour is the same.", ""]
    for fn, body, why in equivalent:
        out += [f"- `{fn}`: {why}", "  ```diff", *("  " + ln for ln in body.splitlines()), "  ```"]
    stale = [e for e, u in zip(entries, used, strict=True) if not u]
    if stale:
        out += ["", f"## Stale equivalence entries ({len(stale)})", "",
                "Listed as equivalent but no surviving mutant matches them any more (killed now, or the "
                "code changed): remove or update them.", ""]
        out += [f"- `{e.get('function')}`: `{e.get('mutated')}`" for e in stale]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
