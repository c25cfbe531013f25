"""The events a test process (a rank) appends to its rank log (`OUT/ranks/SID-rank-R[-WORKER].jsonl`),
one JSON object a line, which the runner reads as they come and merges over the ranks into trial
records: the single definition of their schema, for the plugin that writes them and the runner
that reads them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import ClassVar


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
    OPTIONAL = ("perturb", "actions", "delayed", "handoffs", "unseen_kernels", "detector_errors", "racecheck_frame")
    test: str
    params: str = ""
    trial: int
    arm: str
    seed: int = 0
    outcome: str  # an Outcome value
    signature: str = ""
    message: str = ""
    racecheck_frame: str | None = None  # the failure was raised inside racecheck's instruments, here
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
    detector_errors: list | None = None

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
