"""The trial log's record (`OUT/trials.jsonl`: one JSON object per test outcome per trial) and
the outcomes it holds: the single definition of the schema, which the runner writes and every
reader (tally, merge, --resume) validates its lines against (TrialRecord.from_dict).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing

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
    # where racecheck's own instruments (perturb/, detect/) raised the failure; "" where they did not
    racecheck_frame: str = ""
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
    # The tracker's own failures (project suites, detect/torch_tracker.py's `errors`): what it could
    # not record, so a race there may go unreported; distinct messages over ranks, None where none.
    detector_errors: list | None = None
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
                raise ValueError(f"field {f.name} is {show(data[f.name])}, not {_type_name(hints[f.name])}")
        if data["outcome"] not in _OUTCOMES:
            raise ValueError(f"unknown outcome {show(data['outcome'])} (known: {', '.join(_OUTCOMES)})")
        if data["expect"] not in _EXPECTS:
            raise ValueError(f"field expect is {show(data['expect'])}, not 'race', 'safe' or ''")
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


def show(value) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
