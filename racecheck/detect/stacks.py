"""Compact call stacks for race reports: captured cheaply at every tracked access, formatted only
when a report is written.

A stack is captured with PyTorch's C++ traceback gatherer (`torch._C._profiler.gather_traceback`,
the one CUDA memory snapshots use for every allocation): it records code objects and bytecode
offsets, never frames, so it keeps no tensor alive, and costs well under a microsecond. Where it is
missing, a Python walk records `(code object, bytecode offset)` pairs instead (reading `f_lasti`,
not `f_lineno`, which CPython computes by scanning the line table). Either way, symbolization and
the filtering to *user* frames happen only in `frames()`: frames of the detector itself, of the
runtime's internals (racecheck.device), of installed packages (torch, pytest, pluggy, numpy) and of
the standard library are dropped, with the verdict cached per file.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from types import CodeType, FrameType

try:  # PyTorch's C++ stack capture (torch.utils._traceback.CapturedTraceback uses it)
    from torch._C._profiler import gather_traceback as _gather
    from torch._C._profiler import symbolize_tracebacks as _symbolize
except ImportError:  # pragma: no cover - older PyTorch
    _gather = _symbolize = None  # type: ignore[assignment]  # capturer() falls back to Python frames

MAX_FRAMES = 16  # user frames kept per stack, innermost first

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # .../racecheck
_INTERNAL = tuple(os.path.join(_PACKAGE_DIR, d) + os.sep for d in ("detect", "device", "rank"))


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    prefixes = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    prefixes.add(os.path.dirname(os.__file__))
    return tuple(sorted(os.path.realpath(p) + os.sep for p in prefixes if p))


_LIBRARY = _library_prefixes()
_is_user: dict[CodeType, bool] = {}
_user_file: dict[str, bool] = {}


def _classify(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False  # <frozen importlib._bootstrap>, <string>, ...
    path = os.path.realpath(os.path.abspath(filename))
    if path.startswith(_INTERNAL):
        return False
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True  # racecheck.fsdp and friends: the code under test, installed or not
    if "site-packages" in path or "dist-packages" in path:
        return False
    # The project's own tree may live inside a virtualenv's parent, never inside its lib/.
    return not path.startswith(_LIBRARY)


MAX_WALK = 96  # frames walked at most (pytest alone nests about 40 below a test)


def capture(skip: int = 0):
    """The caller's stack, in whichever compact form is available (see the module docstring)."""
    if _gather is not None:
        return _gather(python=True, script=False, cpp=False)
    return _capture_python(skip + 1)


def capturer():
    """A zero-argument `capture` for hot paths: PyTorch's gatherer bound to its arguments (no
    Python frame of its own), or the Python walk."""
    if _gather is not None:
        return functools.partial(_gather, True, False, False)  # python, script, cpp (positional: faster)
    return lambda: _capture_python(1)


def _capture_python(skip: int) -> tuple:
    frame: FrameType | None
    try:
        frame = sys._getframe(skip + 1)
    except ValueError:
        return ()
    out = []
    cache = _is_user
    walked = 0
    while frame is not None and walked < MAX_WALK:
        code = frame.f_code
        user = cache.get(code)
        if user is None:
            user = cache[code] = _classify(code.co_filename)
        if user:
            out.append((code, frame.f_lasti))
            if len(out) >= MAX_FRAMES:
                break
        frame = frame.f_back
        walked += 1
    return tuple(out)


class LazyStack:
    """A stack kept elsewhere in compact form (the native operator log's table), resolved to
    its user frames on demand."""

    __slots__ = ()

    def frames(self) -> list[tuple[str, int, str]]:
        raise NotImplementedError


def user_frames(chain) -> list[tuple[str, int, str]]:
    """The user frames, as (file, line, function), of a walked chain of (code object, bytecode
    offset) pairs, innermost first."""
    out = []
    cache = _is_user
    for code, lasti in chain:
        user = cache.get(code)
        if user is None:
            user = cache[code] = _classify(code.co_filename)
        if user:
            out.append((code.co_filename, line_of(code, lasti), code.co_name))
            if len(out) >= MAX_FRAMES:
                break
    return out


def frames(stack) -> list[tuple[str, int, str]]:
    """The user frames of a captured stack as (file, line, function), innermost first."""
    if stack is None or (isinstance(stack, tuple) and not stack):
        return []
    if isinstance(stack, LazyStack):
        return stack.frames()
    if isinstance(stack, tuple):
        return [(code.co_filename, line_of(code, lasti), code.co_name) for code, lasti in stack]
    out = []
    for f in _symbolize([stack])[0]:  # innermost first
        filename = f["filename"]
        user = _user_file.get(filename)
        if user is None:
            user = _user_file[filename] = _classify(filename)
        if user:
            out.append((filename, int(f["line"]), f["name"]))
            if len(out) >= MAX_FRAMES:
                break
    return out


def key(stack) -> tuple:
    """A hashable identity of the stack's user frames (to merge repeats of one race)."""
    return tuple(frames(stack))


def line_of(code: CodeType, lasti: int) -> int:
    """The source line of bytecode offset `lasti` in `code`."""
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= lasti < end:
            return lineno if lineno is not None else line
        if lineno is not None and start <= lasti:
            line = lineno
    return line


def _display_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith(".." + os.sep + "..") else rel


def format_stack(
    stack, *, indent: str = "    ", empty: str = "(no Python frames: issued from C++, e.g. by autograd's backward)"
) -> str:
    """Outermost call first, as Python's tracebacks print it."""
    user = frames(stack)
    if not user:
        return f"{indent}{empty}"
    lines = []
    for filename, lineno, name in reversed(user):
        lines.append(f'{indent}File "{_display_path(filename)}", line {lineno}, in {name}')
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"{indent}  {source}")
    return "\n".join(lines)


def innermost(stack) -> str:
    """`file.py:LINE in func` of the innermost user frame (for one-line summaries)."""
    user = frames(stack)
    if not user:
        return "C++ (no Python frame)"
    filename, lineno, name = user[0]
    return f"{os.path.basename(filename)}:{lineno} in {name}"
