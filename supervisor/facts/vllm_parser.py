"""Print the options of vLLM's own ``vllm serve`` parser as one JSON line (``VLLM_GUARD_FLAGS {...}``).

A standalone script, never imported by the guard: it runs under *vLLM's* interpreter, which has no
vllm-guard installed, so it uses the standard library only (and Python 3.8's syntax, vLLM 0.5's
oldest). Two callers:

* :func:`supervisor.facts.vllm_install.parser_options` runs it under the installed vLLM when its
  version is not in the guard's table (``supervisor/core/vllm_flags_data.py``): the real parser,
  imported for real;
* ``scripts/vllm-flags`` runs it over the unpacked ``.py`` files of every vLLM release to build that
  table (``VLLM_GUARD_STUB=1``): a module vLLM imports without a ``try`` that is missing from the
  interpreter running it, and vLLM's native extensions, become permissive stand-ins. A module vLLM
  imports inside a ``try`` is left missing, as it is on a host without it (vLLM's optional imports
  decide its platform and its parser's defaults that way).

Hand-written on purpose: the only way to know vLLM's parser exactly (its dataclass-derived flags,
``--no-`` forms, ``--enable-x``/``--disable-x`` pairs, aliases) is to build it. ``parse_args`` is
intercepted so that vLLM's CLI builds its parsers and hands them over instead of parsing; its own
preprocessing (underscores, dotted JSON keys, ``-O3``) is probed the same way, with sample args.
"""

import argparse
import importlib
import json
import os
import runpy
import sys
import types

MARKER = "VLLM_GUARD_FLAGS "


class _Captured(BaseException):
    """Raised instead of parsing: carries the parser and the arguments it was handed."""

    def __init__(self, parser, args):
        BaseException.__init__(self)
        self.parser = parser
        self.argv = list(args) if args is not None else None


def _grab(self, args=None, namespace=None):
    raise _Captured(self, args)


def _install_stubs(version):
    """Stand-ins for vLLM's native extensions and for hard imports this interpreter lacks (generator)."""
    import dis
    import importlib.abc
    import importlib.machinery
    import importlib.metadata as metadata

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return _Stub

        def __call__(cls, *a, **k):
            return _Stub

        def __getitem__(cls, k):
            return _Stub

        def __or__(cls, o):
            return _Stub

        def __ror__(cls, o):
            return _Stub

        def __iter__(cls):
            return iter(())

        def __bool__(cls):
            return False

        def __int__(cls):
            return 0

        def __index__(cls):
            return 0

        def __float__(cls):
            return 0.0

        def __len__(cls):
            return 0

        def __mro_entries__(cls, bases):
            return (object,)

        def __lt__(cls, o):
            return False

        def __gt__(cls, o):
            return False

        def __le__(cls, o):
            return True

        def __ge__(cls, o):
            return True

        def __contains__(cls, o):
            return False

        def __enter__(cls):
            return _Stub

        def __exit__(cls, *a):
            return False

        def __add__(cls, o):
            return _Stub

        def __mul__(cls, o):
            return _Stub

        def __truediv__(cls, o):
            return _Stub

        def __hash__(cls):
            return 0

    class _Stub(metaclass=_Meta):
        def __init_subclass__(cls, **kw):
            pass

    class _StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return _Stub

    native = set(filter(None, os.environ.get("VLLM_GUARD_NATIVE", "").split(",")))

    def guarded(frame):
        """The import runs inside a ``try`` that handles the error (not a ``with``)."""
        code, at = frame.f_code, frame.f_lasti
        try:
            table = list(dis._parse_exception_table(code))
        except Exception:  # noqa: BLE001 - no table: not guarded
            return False
        ops = list(dis.get_instructions(code))
        for entry in table:
            if entry.start <= at < entry.end:
                handler = [i.opname for i in ops if i.offset >= entry.target][:12]
                if "WITH_EXCEPT_START" not in handler and "CLEANUP_THROW" not in handler:
                    return True
        return False

    def hard_import_by_vllm():
        """The import statement running is vLLM's own, outside a ``try``."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<frozen"):
                if os.sep + "vllm" + os.sep not in name or "site-packages" in name:
                    return False
                ops = {i.offset: i.opname for i in dis.get_instructions(frame.f_code)}
                return ops.get(frame.f_lasti) == "IMPORT_NAME" and not guarded(frame)
            frame = frame.f_back
        return False

    hidden = set(filter(None, os.environ.get("VLLM_GUARD_HIDE", "").split(",")))

    class _Hider(importlib.abc.MetaPathFinder):
        """In place of the path finder: installed packages whose API drifted from an old release's are
        not found (or, imported by vLLM without a ``try``, are stand-ins)."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in hidden:
                parent = sys.modules.get(name.rpartition(".")[0]) if "." in name else None
                if isinstance(parent, _StubModule) or hard_import_by_vllm():
                    return importlib.machinery.ModuleSpec(name, _Finder(), is_package=True)
                return None
            return importlib.machinery.PathFinder.find_spec(name, path, target)

        def invalidate_caches(self):
            importlib.machinery.PathFinder.invalidate_caches()

        def find_distributions(self, *args, **kwargs):
            return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top.startswith("_"):
                return None
            parent = sys.modules.get(name.rpartition(".")[0]) if "." in name else None
            if top == "vllm" and name not in native:
                return None           # every .py of the release is there: a missing one is missing
            if not (isinstance(parent, _StubModule) or hard_import_by_vllm()):
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = _StubModule(spec.name)
            module.__path__ = []
            module.__version__ = "99.0.0"
            return module

        def exec_module(self, module):
            pass

    try:   # an old release registers configs newer transformers has built in ("aimv2" in 0.9): let it
        from transformers import AutoConfig

        register = AutoConfig.register

        def register_again(*args, **kwargs):
            kwargs["exist_ok"] = True
            return register(*args, **kwargs)

        AutoConfig.register = staticmethod(register_again)
    except Exception:  # noqa: BLE001 - no transformers here: nothing to let
        pass
    try:   # 0.17 asks torch's CPU backend a question newer torch builds no longer answer
        import torch

        if not hasattr(torch._C._cpu, "_is_avx512_supported"):
            torch._C._cpu._is_avx512_supported = lambda: False
    except Exception:  # noqa: BLE001 - no torch here
        pass
    sys.meta_path[:] = [_Hider() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    sys.meta_path.append(_Finder())
    real_version = metadata.version

    def version_of(name):
        return version if name == "vllm" else real_version(name)

    metadata.version = version_of


def _kind(action):
    name = type(action).__name__
    if "BooleanOptional" in name or "EnableDisable" in name:
        return "b"
    if action.nargs == 0 or name in ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction",
                                     "_CountAction", "_HelpAction", "_VersionAction"):
        return "0"
    if action.nargs in (None, 1):
        return "1"
    if action.nargs in ("?", "*", "+", argparse.REMAINDER):
        return str(action.nargs)
    return "1"


def _options(parser):
    out = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        names = list(action.option_strings)
        for extra in sorted(getattr(action, "negative_option_strings", None) or ()):
            if extra not in names:
                names.append(extra)
        out.append({"names": names, "kind": _kind(action), "hidden": action.help == argparse.SUPPRESS})
    return out


def _behaviour(parser):
    """What vLLM's own preprocessing does to sample arguments before argparse sees them."""

    def processed(args):
        try:
            type(parser).parse_args(parser, list(args))
        except _Captured as c:
            return c.argv
        except BaseException:  # noqa: BLE001 - a probe vLLM refuses: say nothing about it
            return None
        return None

    dotted = processed(["--vg-probe.key", "3"]) or []
    dash_o = processed(["-O3"])
    return {
        "allow_abbrev": bool(getattr(parser, "allow_abbrev", True)),
        "underscores": (processed(["--vg_probe_x", "1"]) or [""])[0] == "--vg-probe-x",
        "dotted": "--vg-probe" in dotted and "--vg-probe.key" not in dotted,
        "dash_o": None if dash_o in (None, ["-O3"]) else dash_o,
    }


def _serve_parser():
    sys.argv = ["vllm", "serve", "model"]
    for name in ("vllm.entrypoints.cli.main", "vllm.scripts"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (e.name == name or name.startswith(e.name + ".")):
                continue
            raise
        try:
            module.main()
        except _Captured as c:
            for action in c.parser._actions:
                if isinstance(action, argparse._SubParsersAction) and "serve" in action.choices:
                    return action.choices["serve"]
        raise RuntimeError(name + " built no `serve` parser")
    return None               # no `vllm serve` in this release (0.5.0)


def _api_server_parser():
    sys.argv = ["api_server", "--model", "model"]
    try:
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
    except _Captured as c:
        return c.parser
    return None


def main():
    if os.environ.get("VLLM_GUARD_STUB") == "1":
        _install_stubs(os.environ.get("VLLM_GUARD_VERSION", "0.0.0"))
    argparse.ArgumentParser.parse_args = _grab
    argparse.ArgumentParser.parse_known_args = _grab
    result = {}
    for key, build in (("serve", _serve_parser), ("api_server", _api_server_parser)):
        try:
            parser = build()
        except BaseException as e:  # noqa: BLE001 - reported, the other entry point may still work
            if os.environ.get("VLLM_GUARD_TRACE") == "1":
                import traceback
                traceback.print_exc()
            result[key + "_error"] = type(e).__name__ + ": " + str(e)[:500]
            continue
        if parser is not None:
            result[key] = _options(parser)
            result[key + "_behaviour"] = _behaviour(parser)
    sys.stdout.write("\n" + MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
