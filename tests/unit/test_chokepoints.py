"""One chokepoint per trust boundary, held structurally: the disk has one door (and files a person
names have theirs).

Every open of a state file, every temporary file, every rename or removal in ``supervisor/`` happens in
``supervisor/shell/statefiles.py``, where the threat model is (docs/threat-model.md, "The disk"); a
file a person names is opened in ``supervisor/named_files.py`` (its own rule: a link is followed,
only a bounded regular file is read, without blocking). A new ``open()`` elsewhere is a new door nobody
checked for FIFOs, links and other owners, so it fails here unless it is added to ALLOWED with the
reason it is safe (and, for a module built on the door, exactly which calls it makes itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "supervisor"
DOOR = "supervisor/shell/statefiles.py"
NAMED = "supervisor/named_files.py"

#: Files that open files themselves, each with why that is not a state file. A value that is a pair holds the
#: only calls that file may make itself (anything else in it is a stray like any other).
ALLOWED: dict[str, str | tuple[frozenset[str], str]] = {
    DOOR: "the door itself",
    NAMED: "the door for files a person names (config, token, model config.json, vLLM's shebang)",
    "supervisor/cli/diagnose.py": "reads a log a person names or pipes in: stdin, a pipe or a FIFO is valid "
                                  "input there, and nothing is written",
    "supervisor/cli/__init__.py": "opens /dev/null to silence stdout after a broken pipe (`vllm-guard logs | head`)",
    "supervisor/shell/signalling.py": "reads procfs (/proc/<pid>/stat, the boot id): files the kernel makes, "
                                      "read-only, never a state file (a process's identity, before a signal)",
    "supervisor/shell/statelog.py": (frozenset({"os.rename()", "os.fdopen()"}),
                                     "every descriptor comes from open_state; it renames its own log to its older "
                                     "generation (<name> -> <name>.1) and wraps a door's descriptor for reading"),
}

_OS_CALLS = {"open", "fdopen", "replace", "rename", "renames", "unlink", "remove", "mkfifo", "mknod", "link",
             "symlink", "truncate"}
_METHODS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "rename", "touch",
            "symlink_to", "hardlink_to"}
_SHUTIL = {"copy", "copy2", "copyfile", "copyfileobj", "copytree", "move", "rmtree"}
_MODULES = {"tempfile"}


def _doors(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [(node.lineno, f"import {n}") for n in names if n.split(".")[0] in _MODULES]
            if isinstance(node, ast.ImportFrom) and node.module in ("os", "io", "shutil", "builtins"):
                found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                          if a.name in _OS_CALLS | _SHUTIL | {"open"}]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            found.append((node.lineno, "open()"))
        elif isinstance(f, ast.Attribute):
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if owner == "os" and f.attr in _OS_CALLS:
                found.append((node.lineno, f"os.{f.attr}()"))
            elif owner == "io" and f.attr == "open":
                found.append((node.lineno, "io.open()"))
            elif owner == "shutil" and f.attr in _SHUTIL:
                found.append((node.lineno, f"shutil.{f.attr}()"))
            elif owner not in ("os", "io", "shutil") and f.attr in _METHODS:
                found.append((node.lineno, f".{f.attr}()"))
    return sorted(found)


def _strays(name: str, tree: ast.AST) -> list[tuple[int, str]]:
    allowed = ALLOWED.get(name)
    if isinstance(allowed, str):
        return []
    kinds = allowed[0] if allowed else frozenset()
    return [(n, what) for n, what in _doors(tree) if what not in kinds]


def _sources() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"), str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_file_the_guard_opens_is_opened_through_the_one_door():
    strays = {name: doors for name, tree in _sources().items() if (doors := _strays(name, tree))}
    assert strays == {}, "open these through supervisor.shell.statefiles (or say in ALLOWED why not): " + \
        "; ".join(f"{name}: " + ", ".join(f"line {n} {what}" for n, what in doors) for name, doors in strays.items())


def test_the_allowed_list_holds_only_files_that_still_need_it():
    sources = _sources()
    stale = [name for name in ALLOWED
             if name not in (DOOR, NAMED) and (name not in sources or not _doors(sources[name]))]
    assert stale == [], f"no longer open files themselves; drop them from ALLOWED: {stale}"


def test_the_door_is_the_module_that_reads_as_the_threat_model():
    doc = ast.get_docstring(_sources()[DOOR]) or ""
    for promise in ("O_NOFOLLOW", "O_NONBLOCK", "O_CLOEXEC", "one link", "owned by the guard's user or root",
                    "set aside", "O_EXCL", "unpredictable name", "fault"):
        assert promise in doc, f"statefiles' docstring no longer says {promise!r}"


def test_the_door_for_named_files_says_its_own_rule():
    doc = ast.get_docstring(_sources()[NAMED]) or ""
    for promise in ("link is followed", "O_NONBLOCK", "FIFO", "regular file", "bound"):
        assert promise in doc, f"named_files' docstring no longer says {promise!r}"


def test_a_module_built_on_the_door_may_make_only_the_calls_it_is_allowed():
    # statelog may rename and fdopen; an os.open() there would be a second door, and is a stray.
    code = "os.rename('a', 'b')\nos.fdopen(3, 'rb')\nos.open('x', 0)\n"
    assert _strays("supervisor/shell/statelog.py", ast.parse(code)) == [(3, "os.open()")]


def test_the_scan_sees_each_kind_of_door():
    # The scan itself, on code written out here: each of these must be found.
    code = ("import tempfile\nfrom os import fdopen\nopen('x')\nos.open('x', 0)\nio.open('x')\n"
            "Path('x').read_text()\np.write_bytes(b'')\nshutil.move('a', 'b')\nos.replace('a', 'b')\n")
    kinds = [what for _, what in _doors(ast.parse(code))]
    assert kinds == ["import tempfile", "from os import fdopen", "open()", "os.open()", "io.open()", ".read_text()",
                     ".write_bytes()", "shutil.move()", "os.replace()"]
