"""Which happens-before engine runs: the mypyc-compiled build of engine.py and the modules it is
made of (clocks.py, allocations.py, shadow.py) with feed_apply.py (the native recording path's loop
over the engine), or the pure-Python modules themselves.

setup.py compiles them when it can (on one H200 that cut racecheck's cost above the
dispatch floor from 3.34 to 1.80 ms per training step, reports/gpu/README.md) and records the
SHA-256 of the sources it compiled. At import of racecheck.detect, before anything imports the
engine, the compiled modules are kept only when that record matches the sources on disk;
otherwise (an edited engine.py in an editable install) the pure-Python modules are loaded in their
place, with a warning to reinstall. RACECHECK_PURE_PYTHON=1 forces the pure-Python modules (to
compare the two, or to step through the engine in a debugger). `KIND` says which one runs:
"compiled" or "python".
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# In import order (each imports only those before it); setup.py's NATIVE.
_MODULES = ("clocks", "allocations", "shadow", "engine", "feed_apply")


def _compiled(name: str) -> bool:
    return any((_HERE / f"{name}{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _built_from_these_sources() -> bool:
    """Every module has its extension, built from the source now on disk."""
    try:  # written by setup.py when it compiles the engine (not in git); absent: nothing compiled
        SOURCE_SHA256 = importlib.import_module("racecheck.detect._native_build").SOURCE_SHA256
    except ImportError:
        return False
    return all(
        _compiled(name) and hashlib.sha256((_HERE / f"{name}.py").read_bytes()).hexdigest() == SOURCE_SHA256.get(name)
        for name in _MODULES
    )


def _load_python_modules() -> None:
    """Import the engine's modules from source under their own names, ahead of the extensions."""
    package = sys.modules[__name__.rpartition(".")[0]]
    for name in _MODULES:
        fullname = f"{package.__name__}.{name}"
        spec = importlib.util.spec_from_file_location(fullname, _HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None, f"{name}.py is a source file next to this one"
        module = importlib.util.module_from_spec(spec)
        sys.modules[fullname] = module
        spec.loader.exec_module(module)
        setattr(package, name, module)


def _select() -> str:
    if not any(_compiled(name) for name in _MODULES):
        return "python"  # nothing to shadow: the import system finds the sources
    if os.environ.get("RACECHECK_PURE_PYTHON"):
        _load_python_modules()
        return "python"
    if not _built_from_these_sources():  # an edited source, or a build that stopped half-way
        warnings.warn(
            "racecheck: the compiled detector engine was not built from "
            "racecheck/detect/engine.py, clocks.py, allocations.py and shadow.py as they are now; running those "
            "sources in Python (reinstall racecheck to compile them)",
            stacklevel=2,
        )
        _load_python_modules()
        return "python"
    return "compiled"


KIND = _select()
