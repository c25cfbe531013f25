"""The trial log on disk (`OUT/trials.jsonl`): the runner appends its records (TrialLog), every
command reads them (read_log), and a resumed run first removes its lines that are not JSON
(repair_log). The records' schema is protocol/records.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

from racecheck.protocol.durable import AppendFile
from racecheck.protocol.records import TrialRecord, show


class TrialLog:
    """Append-only JSONL log; every record is fsynced as it is written, whole or not at all, so an
    interrupted run (Ctrl-C, SIGKILL) loses no finished outcome and a full disk tears no line
    (durable.AppendFile, which `file` is: the run folder restores the log from it)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.file = AppendFile(self.path)

    def append(self, record: TrialRecord) -> None:
        """OSError where the file system refuses the record (the log is left as it was)."""
        self.file.append((record.to_json() + "\n").encode("utf-8"))

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> TrialLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class BadLine:
    """A line of the log that is not JSON: torn by a kill mid-write, or written by something else."""

    number: int
    text: str

    def describe(self) -> str:
        what = "a torn record" if self.text.lstrip().startswith("{") else "not JSON"
        return f"line {self.number} is {what} ({self.text[:40]!r})"


class LogError(ValueError):
    """A trial log that cannot be read or rewritten, or a line of it that is JSON but no valid
    trial record: one line naming the file (and the line)."""


def read_log(
    path: str | os.PathLike, *, bad_lines: list[BadLine] | None = None, trials: int | None = None
) -> Iterator[TrialRecord]:
    """Records of a log, each validated (TrialRecord.from_dict) and, given the run's planned
    `trials` (runner/run_folder.py), with a trial index below them. A line that is not JSON is
    skipped and, when `bad_lines` is given, added to it so that the caller can say so (repair_log
    removes such lines). LogError, naming the line, for JSON that is not a valid trial record of
    the run, and for a log that cannot be read (a folder in its place, an I/O error)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, record in _records(path, fh, bad_lines):
                if trials is not None and record.trial >= trials:
                    raise LogError(f"{path}:{number}: trial {show(record.trial)} {outside_plan(trials)}")
                yield record
    except OSError as exc:
        raise LogError(f"{path}: unreadable: {exc.strerror or exc}") from None


def outside_plan(trials: int) -> str:
    """What a trial index past the run's planned trials is, said the same by every reader."""
    return f"lies outside the run's {trials} planned trial(s) (0 to {trials - 1}, run.json)"


def _records(path, lines, bad_lines: list[BadLine] | None) -> Iterator[tuple[int, TrialRecord]]:
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if bad_lines is not None:
                bad_lines.append(BadLine(number, line))
            continue
        try:
            record = TrialRecord.from_dict(data)
        except ValueError as exc:
            raise LogError(f"{path}:{number}: not a trial record: {exc}") from None
        yield number, record


def repair_log(path: str | os.PathLike) -> list[BadLine]:
    """Rewrite the log without its lines that are not JSON, which go to `<log>.rejected`; returns
    them. A log left ending inside a line (a torn record) would glue the next appended record to
    that fragment, so this runs before anything is appended to a log that is resumed."""
    path = Path(path)
    bad: list[BadLine] = []
    if not path.exists():
        return bad
    list(read_log(path, bad_lines=bad))
    if not bad:
        return bad
    numbers = {b.number for b in bad}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            kept = [
                line if line.endswith("\n") else line + "\n"
                for number, line in enumerate(fh, 1)
                if number not in numbers
            ]
        with open(path.with_name(path.name + ".rejected"), "a", encoding="utf-8") as fh:
            fh.writelines(b.text + "\n" for b in bad)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise LogError(f"{path}: cannot be repaired: {exc.strerror or exc}") from None
    return bad
