"""The native operator log (op_log.cpp) and the native engine in its extension (hb_*.cpp): how
that extension is built, found and loaded.

The extension is compiled against the torch it runs with (a C++ extension must match torch's
headers and ABI), so it is built where torch is installed: once per torch version, Python version
and source, with torch.utils.cpp_extension, into a cache directory ($RACECHECK_NATIVE_CACHE, by
default ~/.cache/racecheck/native): by the first process that needs it (processes that need it at
the same time wait for that one, torch.utils.cpp_extension's lock), or ahead of time by
`racecheck build-native`. Without a C++ compiler (or ninja, which
torch.utils.cpp_extension needs) the build fails once, says why in one line, and the tracker runs
its Python path, with the same reports.

RACECHECK_DETECT_PATH picks the path: `native` (fail if it cannot be built), `python`, or `auto`
(the default: native where it builds).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent
SOURCE = _HERE / "op_log.cpp"
# The extension's sources: the log (op_log.cpp) and the native engine beside it (hb_*.cpp, its
# Python types in hb_module.cpp and hb_alone.cpp), with the headers they share; a change to any one
# rebuilds it.
_ENGINE_PARTS = ("allocations", "shadow", "engine", "tracker", "module", "alone")
SOURCES = (SOURCE, *(_HERE / f"hb_{part}.cpp" for part in _ENGINE_PARTS))
HEADERS = tuple(
    _HERE / name
    for name in (
        "op_log.h",
        "hb_clocks.h",
        "hb_allocations.h",
        "hb_shadow.h",
        "hb_engine.h",
        "hb_tracker.h",
        "hb_module.h",
    )
)
MODULE = "_op_log"  # PyInit__op_log in op_log.cpp
PATH_ENV = "RACECHECK_DETECT_PATH"
CACHE_ENV = "RACECHECK_NATIVE_CACHE"


class NativeUnavailable(RuntimeError):
    """The native operator log cannot be built or loaded here (the message says why)."""


def wanted() -> str:
    """`native`, `python` or `auto`, from $RACECHECK_DETECT_PATH."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "native", "python"):
        raise NativeUnavailable(f"{PATH_ENV}={value!r}: expected auto, native or python")
    return value


def build_dir() -> Path:
    import torch

    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "racecheck" / "native")
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))).hexdigest()[:12]
    tag = f"torch{torch.__version__}-{sys.implementation.cache_tag}-{digest}".replace("+", "_")
    return root / tag


def _built(directory: Path) -> Path | None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for candidate in (directory / f"{MODULE}{suffix}", directory / f"{MODULE}.so"):
        if candidate.exists():
            return candidate
    return None


def build(*, verbose: bool = False) -> Path:
    """Compile the extension into build_dir() (once; concurrent builders wait for the first).
    Raises NativeUnavailable with a one-line reason."""
    directory = build_dir()
    found = _built(directory)
    if found is not None:
        return found
    try:
        from torch.utils import cpp_extension
    except ImportError as exc:  # pragma: no cover - torch without its extension builder
        raise NativeUnavailable(f"torch.utils.cpp_extension is missing ({exc})") from exc
    if not cpp_extension.is_ninja_available():
        _ninja_on_path()
    if not cpp_extension.is_ninja_available():
        raise NativeUnavailable("ninja is not installed (torch.utils.cpp_extension needs it: pip install ninja)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(
            name=MODULE,
            sources=[str(path) for path in SOURCES],
            build_directory=str(directory),
            extra_cflags=["-O2", "-DNDEBUG"],  # NDEBUG: torch is built with it, and its headers differ without,
            with_cuda=False,  # device-generic: CUDA's streams are read through c10's device guard
            verbose=verbose,
            is_python_module=True,
        )
    except Exception as exc:  # a compiler error, no compiler
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NativeUnavailable(f"building op_log.cpp failed: {first}") from exc
    found = _built(directory)
    if found is None:
        raise NativeUnavailable(f"building op_log.cpp left no {MODULE} in {directory}")
    return found


def _ninja_on_path() -> None:
    """The ninja that pip installed (the `ninja` package, a dependency) where a venv that is not
    activated keeps it off PATH."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and os.path.isdir(bin_dir):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise NativeUnavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_failed: list[str] = []  # why the one attempt of this process failed


@functools.cache
def _module() -> ModuleType:
    import torch  # noqa: F401  (the extension links against torch's libraries, loaded by it)

    if _failed:
        raise NativeUnavailable(_failed[0])
    try:
        return _import(build())
    except NativeUnavailable as exc:
        _failed.append(str(exc))
        raise


def load_required() -> ModuleType:
    """The extension module, built if need be; NativeUnavailable says why it cannot be had."""
    return _module()


def load_available() -> ModuleType | None:
    """The extension module where it can be built, else None (`why_not()` says why)."""
    try:
        return _module()
    except NativeUnavailable:
        return None


def why_not() -> str:
    """Why the native log could not be had in this process ("" if it could, or was not tried)."""
    return _failed[0] if _failed else ""
