"""The records of a run: the trial log's (one JSON object per test outcome per trial,
`OUT/trials.jsonl`) and the rank events the plugin appends to each process's log
(`OUT/ranks/SID-rank-R[-WORKER].jsonl`), which the runner merges into trial records.

This module is the single definition of both schemas; writers and readers both use it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import time
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from racecheck.protocol.durable import AppendFile
from racecheck.protocol.printable import printable


class Outcome(enum.StrEnum):
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
    # The detector (project suites): launches of kernels whose writes it could not tell, by kernel
    # name, summed over ranks (detect/kernel_launches.py); None where there were none.
    unseen_kernels: dict | None = None
    detect: bool = False
    detected: int = 0  # detector reports in this test (0 when the detector is off)
    reports: list = dataclasses.field(default_factory=list)  # detector report texts
    replay: str = ""  # one command line that replays this trial
    versions: dict = dataclasses.field(default_factory=dict)
    time: str = ""

    def __post_init__(self) -> None:
        # Every record is made here, by the runner and by each reader of a log (old logs too):
        # escaped here once, its text is writable as UTF-8 in every format (protocol/printable.py).
        for name in _TEXT_FIELDS:
            if isinstance(getattr(self, name), str):
                setattr(self, name, printable(getattr(self, name)))
        self.reports = [printable(r) if isinstance(r, str) else r for r in self.reports]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> TrialRecord:
        """The record of one parsed log line (unknown keys ignored), every field of its declared
        type and `outcome`, `expect` and `trial` in their range; ValueError naming the first field
        that is not. This is where every reader of the log (tally, merge, --resume) gets its
        records, so no reader checks them again."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {str(data)[:60]!r}")
        fields = dataclasses.fields(cls)
        missing = [
            f.name
            for f in fields
            if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        hints = _record_types()
        for f in fields:
            if f.name in data and not _is_of(data[f.name], hints[f.name]):
                raise ValueError(f"field {f.name} is {_show(data[f.name])}, not {_type_name(hints[f.name])}")
        if data["outcome"] not in _OUTCOMES:
            raise ValueError(f"unknown outcome {_show(data['outcome'])} (known: {', '.join(_OUTCOMES)})")
        if data["expect"] not in _EXPECTS:
            raise ValueError(f"field expect is {_show(data['expect'])}, not 'race', 'safe' or ''")
        if data["trial"] < 0:
            raise ValueError(f"field trial is {data['trial']}, not a trial index (0 or more)")
        return cls(**{f.name: data[f.name] for f in fields if f.name in data})


_TEXT_FIELDS = ("test", "params", "signature", "message", "replay")
_OUTCOMES = tuple(o.value for o in Outcome)
_EXPECTS = ("race", "safe", "")


@functools.cache
def _record_types() -> dict[str, object]:
    """TrialRecord's field types, resolved from its annotations (strings under `annotations`)."""
    return typing.get_type_hints(TrialRecord)


def _is_of(value, hint) -> bool:
    """Whether a JSON value is of a field's declared type: str, int, float, bool, dict, list, or a
    union of them with None. A JSON number is a float where one is declared; a bool is no int."""
    if isinstance(hint, types.UnionType):
        return any(_is_of(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typing.get_origin(hint) or hint)


def _type_name(hint) -> str:
    names = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}
    names.update({dict: "an object", list: "a list", type(None): "null"})
    if isinstance(hint, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    return names.get(typing.get_origin(hint) or hint, str(hint))


def _show(value) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


class RankEventKind(enum.StrEnum):
    """The `event` tag of a rank event: what happened in one pytest process."""

    COLLECTED = "collected"
    COLLECT_ERROR = "collecterror"
    START = "start"
    OUTCOME = "outcome"
    FINISH = "finish"


@dataclasses.dataclass(kw_only=True)
class RankEvent:
    """One line of a process's rank log: the process (`rank`, xdist `worker`), the wall time, and
    the fields of its kind. Subclasses add the fields; `from_dict` picks the class by the tag."""

    KIND: ClassVar[RankEventKind]
    OPTIONAL: ClassVar[tuple[str, ...]] = ()  # fields left out of the line while None
    rank: int = 0
    worker: str = ""
    time: float = 0.0

    def to_dict(self) -> dict:
        data = {"rank": self.rank, "worker": self.worker, "time": self.time, "event": self.KIND.value}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in data and not (f.name in self.OPTIONAL and value is None):
                data[f.name] = value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @staticmethod
    def from_dict(data: dict) -> RankEvent:
        """The event of one parsed line; ValueError for an unknown tag or missing fields."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {str(data)[:60]!r}")
        try:
            cls = _RANK_EVENTS[RankEventKind(data.get("event", ""))]
        except ValueError:
            raise ValueError(f"unknown rank event {data.get('event')!r}") from None
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise ValueError(f"{cls.KIND.value} event: {exc}") from None


@dataclasses.dataclass(kw_only=True)
class Collected(RankEvent):
    KIND = RankEventKind.COLLECTED
    count: int


@dataclasses.dataclass(kw_only=True)
class CollectError(RankEvent):
    KIND = RankEventKind.COLLECT_ERROR
    nodeid: str
    message: str


@dataclasses.dataclass(kw_only=True)
class Started(RankEvent):
    """A test of one block started in this process."""

    KIND = RankEventKind.START
    test: str
    trial: int
    arm: str


@dataclasses.dataclass(kw_only=True)
class TestOutcome(RankEvent):
    """A test of one block finished in this process (the merge of every rank's, rank_merge)."""

    __test__ = False  # not a pytest test class, whatever its name
    KIND = RankEventKind.OUTCOME
    OPTIONAL = ("perturb", "actions", "delayed", "handoffs", "unseen_kernels")
    test: str
    params: str = ""
    trial: int
    arm: str
    seed: int = 0
    outcome: str  # an Outcome value
    signature: str = ""
    message: str = ""
    duration: float = 0.0
    device: str = "cpu"
    detected: int = 0
    reports: list = dataclasses.field(default_factory=list)
    # Patch mode's (project suites), as TrialRecord's; None where nothing counted them.
    perturb: str | None = None
    actions: dict | None = None
    delayed: list | None = None
    handoffs: int | None = None
    unseen_kernels: dict | None = None

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.trial, self.arm, self.test)


@dataclasses.dataclass(kw_only=True)
class Finished(RankEvent):
    KIND = RankEventKind.FINISH
    status: int
    stopped: bool = False


_RANK_EVENTS: dict[RankEventKind, type[RankEvent]] = {
    cls.KIND: cls for cls in (Collected, CollectError, Started, TestOutcome, Finished)
}


class RankLog:
    """One pytest process's rank log: one RankEvent per line, stamped with the process (`RANK`,
    the xdist worker) and the time, written at once. `{rank}` in the pattern becomes the rank; an
    xdist worker adds its id to the name. The file is opened at the first write, so an xdist
    controller, which runs no test, leaves none. Should its name be removed under the session (a
    test deleting the run folder), the next write puts the whole file back under it first
    (durable.AppendFile.restore), and the runner reads on there (ranks.RankTail)."""

    def __init__(self, pattern: str) -> None:
        rank = os.environ.get("RANK", "0")
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        path = Path(pattern.replace("{rank}", rank))
        if self.worker:  # every xdist worker writes its own file; a worker is not a rank
            path = path.with_name(f"{path.stem}-{self.worker}{path.suffix}")
        self.path = path
        self.rank = int(rank)
        self._file: AppendFile | None = None  # opened at the first event

    def write(self, event: RankEvent) -> None:
        if self._file is None:
            self._file = AppendFile(self.path, sync=False)
        elif self._file.gone():  # a test removed the run folder: the runner reads on (RankTail)
            self._file.restore()
        event.rank, event.worker = self.rank, self.worker
        event.time = time.time()
        self._file.append((event.to_json() + "\n").encode("utf-8"))


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
                    raise LogError(f"{path}:{number}: trial {_show(record.trial)} {outside_plan(trials)}")
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
