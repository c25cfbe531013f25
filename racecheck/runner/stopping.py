"""Live per-arm counts of failing and clean trials, and the early-stop rules judged on them.

A rule is `ARM:failures>=K` (the arm reproduced in K trials) or `ARM:clean>=N` (N trials of the arm
finished without a failing test); `--stop-when` joins rules with commas and stops a suite once all
of them hold, e.g. `baseline:failures>=3,fixed:clean>=20`. A trial counts as failing as soon as
one of its tests fails, and as clean once all of its tests finished.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

from racecheck.protocol.records import Outcome

MEASURES = ("failures", "clean")
_RULE = re.compile(r"^\s*(?P<arm>[^:,\s]+)\s*:\s*(?P<measure>\w+)\s*>=\s*(?P<n>\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class StopRule:
    arm: str
    measure: str  # one of MEASURES
    threshold: int

    def __str__(self) -> str:
        return f"{self.arm}:{self.measure}>={self.threshold}"


def parse_rules(text: str) -> tuple[StopRule, ...]:
    """Rules from `ARM:failures>=K,ARM:clean>=N`; ValueError with a one-line reason."""
    rules = []
    for part in filter(str.strip, (text or "").split(",")):
        m = _RULE.match(part)
        if not m or m["measure"] not in MEASURES:
            raise ValueError(f"bad rule {part.strip()!r}: expected ARM:failures>=K or ARM:clean>=N")
        if int(m["n"]) < 1:
            raise ValueError(f"bad rule {part.strip()!r}: the count must be at least 1")
        rules.append(StopRule(m["arm"], m["measure"], int(m["n"])))
    if not rules:
        raise ValueError("no rule given")
    return tuple(rules)


class LiveCounts:
    """Failing and clean trials per (suite, arm), fed with records and finished blocks."""

    def __init__(self) -> None:
        self._failing: dict[tuple[str, str], set[int]] = defaultdict(set)
        self._finished: dict[tuple[str, str], dict[int, bool]] = defaultdict(dict)  # trial -> failed

    def record(self, suite: str, arm: str, trial: int, outcome: str) -> None:
        if Outcome(outcome).is_failure:
            self._failing[(suite, arm)].add(trial)

    def block(self, suite: str, arm: str, trial: int, outcome: str) -> None:
        failed = Outcome(outcome).is_failure
        self._finished[(suite, arm)][trial] = failed
        if failed:
            self._failing[(suite, arm)].add(trial)

    def failures(self, suite: str, arm: str) -> int:
        return len(self._failing[(suite, arm)])

    def clean(self, suite: str, arm: str) -> int:
        return sum(
            1
            for t, failed in self._finished[(suite, arm)].items()
            if not failed and t not in self._failing[(suite, arm)]
        )

    def finished(self, suite: str, arm: str) -> int:
        return len(self._finished[(suite, arm)])

    def seen(self, suite: str, arm: str) -> int:
        """Trials finished or already failing (what a progress line shows as the denominator)."""
        return len(set(self._finished[(suite, arm)]) | self._failing[(suite, arm)])

    def met(self, suite: str, rules: tuple[StopRule, ...]) -> bool:
        """Whether every rule holds for `suite` (False without rules)."""
        return bool(rules) and all(getattr(self, r.measure)(suite, r.arm) >= r.threshold for r in rules)
