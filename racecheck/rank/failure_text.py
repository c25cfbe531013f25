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


def failure_signature(excinfo: pytest.ExceptionInfo, rootpath: Path) -> str:
    """`ExcType at file.py:LINE in func`, naming the innermost frame in the user's own code."""
    package_dir = str(Path(__file__).resolve().parents[1])  # racecheck's own frames
    frame = None
    for entry in excinfo.traceback:
        path = str(entry.path)
        if "site-packages" in path or path.startswith(package_dir):
            continue  # library frames: not where the user's failure is
        frame = entry
    if frame is None and len(excinfo.traceback):
        frame = excinfo.traceback[-1]
    where = ""
    if frame is not None:
        file = Path(str(frame.path))
        rel = file.relative_to(rootpath) if file.is_relative_to(rootpath) else file.name
        where = f" at {rel}:{frame.lineno + 1} in {frame.name}"
    return f"{excinfo.typename}{where}"


def message_line(excinfo: pytest.ExceptionInfo, limit: int = 300) -> str:
    """The first line of the failure's message (its exception type's name when it has none)."""
    return first_line(str(excinfo.value), limit) or excinfo.typename


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
