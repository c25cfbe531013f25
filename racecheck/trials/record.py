"""The trial log's record: one JSON object per test outcome per trial (`OUT/trials.jsonl`).

This module is the single definition of the log's fields; writers and readers both use it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Iterator
from pathlib import Path


class Outcome(str, enum.Enum):
    """A test's result in one trial, ordered from best to worst (a trial takes the worst)."""

    PASSED = "passed"
    SKIPPED = "skipped"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def is_failure(self) -> bool:
        """Whether the outcome counts as a failing trial in tallies and gates."""
        return self not in (Outcome.PASSED, Outcome.SKIPPED)


_SEVERITY = {o: i for i, o in enumerate(Outcome)}


def worst(outcomes) -> Outcome:
    """The worst of several outcomes (the outcome of a trial, or of a test merged over ranks)."""
    return max((Outcome(o) for o in outcomes), key=lambda o: o.severity, default=Outcome.PASSED)


@dataclasses.dataclass
class TrialRecord:
    """One line of `trials.jsonl`."""

    run_id: str
    scenario: str
    arm: str
    expect: str  # "race", "safe", or "" for arms that are not a scenario's
    trial: int  # 0-based trial index within the arm
    seed: int
    test: str  # pytest node id with parametrization; trial-repeat and arm suffixes stripped
    params: str  # the parametrization alone, e.g. "1-True" ("" when not parametrized)
    outcome: str  # an Outcome value
    signature: str = ""  # "ExcType at file.py:LINE in func" for failures
    message: str = ""  # first line of the failure, shortened
    duration: float = 0.0
    device: str = "cpu"
    perturb: str = "off"  # the canonical spec that ran (racecheck.perturb.profiles)
    # Project suites (patch mode): the actions taken, summed over ranks ({"sleep": N, "pressure": N,
    # "poison": N}); None where nothing counted them (the catalogue's injector).
    actions: dict | None = None
    delayed: list = dataclasses.field(default_factory=list)  # systematic: the hand-off keys delayed
    handoffs: int | None = None  # systematic trial 0: the hand-off points recorded (most over ranks)
    detect: bool = False
    detected: int = 0  # detector reports in this test (0 when the detector is off)
    reports: list = dataclasses.field(default_factory=list)  # detector report texts
    replay: str = ""  # one command line that replays this trial
    versions: dict = dataclasses.field(default_factory=dict)
    time: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "TrialRecord":
        """The record of one parsed log line (unknown keys ignored); ValueError when it is none."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {str(data)[:60]!r}")
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.name not in data
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        names = {f.name for f in fields}
        return cls(**{k: v for k, v in data.items() if k in names})


class TrialLog:
    """Append-only JSONL log; every record is flushed and fsynced as it is written,
    so an interrupted run (Ctrl-C, SIGKILL) loses no finished outcome."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: TrialRecord) -> None:
        self._fh.write(record.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "TrialLog":
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


def read_log(path: str | os.PathLike, *, bad_lines: list[BadLine] | None = None) -> Iterator[TrialRecord]:
    """Records of a log. A line that is not JSON is skipped and, when `bad_lines` is given, added
    to it so that the caller can say so (repair_log removes such lines). ValueError, naming the
    line, for JSON that is not a trial record."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
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
                raise ValueError(f"{path}:{number}: not a trial record: {exc}") from None
            yield record


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
    with open(path, encoding="utf-8", errors="replace") as fh:
        kept = [line if line.endswith("\n") else line + "\n"
                for number, line in enumerate(fh, 1) if number not in numbers]
    with open(path.with_name(path.name + ".rejected"), "a", encoding="utf-8") as fh:
        fh.writelines(b.text + "\n" for b in bad)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)
    return bad
