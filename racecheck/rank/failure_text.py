"""What a failing test is called in the trial log: its signature (`ExcType at file.py:LINE in func`,
the innermost frame in the user's own code) and the first line of its message. Used by the pytest
plugin for test failures and collection errors; and the failure text of a test its detector
found races in (race_failure, the harness's).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from racecheck.protocol.printable import first_line

if TYPE_CHECKING:
    from racecheck.detect.report import RaceReport


def failure_signature(excinfo: pytest.ExceptionInfo, rootpath: Path, item: pytest.Item | None = None) -> str:
    """`ExcType at file.py:LINE in func`, naming the innermost frame in the user's own code; where
    the traceback has none: for pytest's own failure (a race the test's harness found fails the
    test from pytest's frames) the test `item` itself, else the innermost frame (a library's)."""
    package_dir = str(Path(__file__).resolve().parents[1])  # racecheck's own frames
    frame = None
    for entry in excinfo.traceback:
        path = str(entry.path)
        if "site-packages" in path or path.startswith(package_dir):
            continue  # library frames: not where the user's failure is
        frame = entry
    if frame is None and item is not None and excinfo.errisinstance(pytest.fail.Exception):
        test_file, line, _ = item.location  # relative to the root; line 0-based, as a frame's
        if line is not None:
            return f"{excinfo.typename} at {test_file}:{line + 1} in {getattr(item, 'originalname', item.name)}"
    if frame is None and len(excinfo.traceback):
        frame = excinfo.traceback[-1]
    where = ""
    if frame is not None:
        file = Path(str(frame.path))
        rel = file.relative_to(rootpath) if file.is_relative_to(rootpath) else file.name
        where = f" at {rel}:{frame.lineno + 1} in {frame.name}"
    return f"{excinfo.typename}{where}"


def message_line(excinfo: pytest.ExceptionInfo, limit: int = 300) -> str:
    """The informative line of the failure's message: its first line, joined with the next where
    it only announces them (`backend='inductor' raised:`, `Tensor-likes are not close!`), and,
    for an exception raised from another (`raise ... from exc`), the cause it names (its type's
    name where it has no message)."""
    exc = excinfo.value
    line = _informative(str(exc)) or excinfo.typename
    cause = _root_cause(exc)
    if cause is not None:
        said = _informative(str(cause))
        named = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
        if said not in line:
            line = f"{line} (caused by {named})"
    return first_line(line, limit)


def _informative(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    line, rest = lines[0], lines[1:]
    while line.endswith((":", "!")) and rest:  # a header: what it announces follows
        line = f"{line} {rest.pop(0)}"
    return line


def _root_cause(exc: BaseException) -> BaseException | None:
    """The innermost exception `exc` was raised from (`__cause__`), None where it names none."""
    cause, seen = exc.__cause__, {id(exc)}
    while cause is not None and cause.__cause__ is not None and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__
    return cause


# racecheck's instruments, which run inside the program under test (its wrappers and hooks).
_INSTRUMENTS = tuple(str(Path(__file__).resolve().parents[1] / part) for part in ("perturb", "detect"))


def racecheck_frame(excinfo: pytest.ExceptionInfo) -> str:
    """`racecheck/perturb/patch.py:140 in wrapper` where the failure was raised inside racecheck's
    own instruments (the innermost frame of its innermost cause, in perturb/ or detect/): a wrapper
    of racecheck's broke the program, not the program itself. "" otherwise: a frame of racecheck's
    that the error only passed through (a wrapped call that raised below it) blames nothing."""
    exc = _root_cause(excinfo.value) or excinfo.value
    tb, last = exc.__traceback__, None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    path = str(Path(last.tb_frame.f_code.co_filename).resolve())
    if not path.startswith(_INSTRUMENTS):
        return ""
    rel = Path(path).relative_to(Path(__file__).resolve().parents[2])
    return f"{rel}:{last.tb_lineno} in {last.tb_frame.f_code.co_name}"


def error_line(text: str, limit: int = 300) -> str:
    """The most telling line of a collection error: its last `E   ...` line, else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    marked = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (marked[-1] if marked else lines[-1] if lines else "collection error")[:limit]


def race_failure(reports: list[RaceReport], failure: BaseException | None) -> str:
    """The failure text of a test in which the detector found `reports` (the detector's render:
    its first line names the first race); `failure`, what the test's body raised too, is noted."""
    from racecheck.detect.report import render

    text = render(reports)
    if failure is not None:
        name = type(failure).__name__
        text += f"\n\nThe test body failed too: {name}: {first_line(str(failure)) or name}"
    return text
