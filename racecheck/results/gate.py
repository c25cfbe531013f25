"""The CI gate: decide from a summary whether a fix is proven and its baseline still reproduces.

Two conditions per scenario, both on the `*` rows (a trial fails if any of its tests failed):

- the fixed arm fails rarely enough: its observed rate is at most `max_rate`, or with a
  `confidence` C, its Wilson upper bound at C is at most `max_rate`;
- the baseline arm still reproduces: by default at least one failing trial (a perturbation that
  lost its power fails the gate just as a fix that regressed does); with `min_rate`, its observed
  rate, or with C its Wilson lower bound at C, is at least `min_rate`.

With a confidence a condition is three-valued: it passes when the interval clears the threshold,
fails when the interval lies wholly on the wrong side, and is UNDECIDED in between, with the number
of further trials that would decide it (clean trials for the fixed arm; trials failing at the
observed rate for the baseline). The gate takes the worst: FAIL over UNDECIDED over PASS.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

from racecheck.exitcodes import ExitCode
from racecheck.results import stats
from racecheck.results.rows import ALL_TESTS


class Decision(enum.Enum):
    """A gate's (or one condition's) verdict, ordered PASS < UNDECIDED < FAIL for combining."""

    PASS = "PASS"
    UNDECIDED = "UNDECIDED"
    FAIL = "FAIL"

    @property
    def exit_code(self) -> ExitCode:
        return {
            Decision.PASS: ExitCode.OK,
            Decision.FAIL: ExitCode.GATE_FAILED,
            Decision.UNDECIDED: ExitCode.UNDECIDED,
        }[self]


_ORDER = {Decision.PASS: 0, Decision.UNDECIDED: 1, Decision.FAIL: 2}


@dataclasses.dataclass(frozen=True)
class Condition:
    """One condition's verdict and the human line that states it with its numbers."""

    decision: Decision
    line: str
    more_trials: int | None = None  # trials that would decide an UNDECIDED condition, if any


@dataclasses.dataclass(frozen=True)
class GateResult:
    decision: Decision
    conditions: tuple[Condition, ...]

    @property
    def lines(self) -> list[str]:
        return [c.line for c in self.conditions]

    @property
    def exit_code(self) -> ExitCode:
        return self.decision.exit_code

    def printout(self) -> str:
        """What `racecheck gate` and `racecheck run --gate` print: one line per condition, then
        `gate: PASS|FAIL|UNDECIDED`."""
        return "\n".join([*self.lines, f"gate: {self.decision.value}"])


def _pct(rate: float) -> str:
    return f"{rate * 100:.4g}%"


def _fixed_condition(k: int, n: int, *, max_rate: float, confidence: float | None) -> Condition:
    said = stats.describe_rate(k, n, confidence=confidence or 0.95)
    if confidence is None:
        ok = k / n <= max_rate
        op = "<=" if ok else ">"
        return Condition(
            Decision.PASS if ok else Decision.FAIL,
            f"{said}; observed rate {_pct(k / n)} {op} max-rate {_pct(max_rate)}",
        )
    low, high = stats.wilson_interval(k, n, confidence=confidence)
    c = f"{confidence * 100:g}%"
    if high <= max_rate:
        return Condition(Decision.PASS, f"{said}; {c} upper bound {_pct(high)} <= max-rate {_pct(max_rate)}")
    if low > max_rate:
        return Condition(Decision.FAIL, f"{said}; {c} lower bound {_pct(low)} > max-rate {_pct(max_rate)}")
    more = stats.more_trials_needed(k, n, bound=max_rate, confidence=confidence, side="upper")
    return Condition(
        Decision.UNDECIDED,
        f"{said}; {c} upper bound {_pct(high)} > max-rate {_pct(max_rate)}; "
        f"{more} more trials without failure would pass it",
        more,
    )


def _baseline_condition(k: int, n: int, *, min_rate: float | None, confidence: float | None) -> Condition:
    said = stats.describe_rate(k, n, confidence=confidence or 0.95)
    if min_rate is None:  # the default: the baseline must reproduce at least once
        if k > 0:
            return Condition(Decision.PASS, f"{said}; reproduced (at least 1 failing trial)")
        return Condition(
            Decision.FAIL,
            f"{said}; did not reproduce (needs at least 1 failing trial): the race or its perturbation lost its power",
        )
    if confidence is None:
        ok = k / n >= min_rate
        op = ">=" if ok else "<"
        return Condition(
            Decision.PASS if ok else Decision.FAIL,
            f"{said}; observed rate {_pct(k / n)} {op} min-rate {_pct(min_rate)}",
        )
    low, high = stats.wilson_interval(k, n, confidence=confidence)
    c = f"{confidence * 100:g}%"
    if low >= min_rate:
        return Condition(Decision.PASS, f"{said}; {c} lower bound {_pct(low)} >= min-rate {_pct(min_rate)}")
    if high < min_rate:
        return Condition(Decision.FAIL, f"{said}; {c} upper bound {_pct(high)} < min-rate {_pct(min_rate)}")
    more = stats.more_trials_needed(k, n, bound=min_rate, confidence=confidence, side="lower")
    tail = (
        f"about {more} more trials failing at the observed {_pct(k / n)} would pass it"
        if more is not None
        else f"more trials at the observed {_pct(k / n)} would not pass it"
    )
    return Condition(
        Decision.UNDECIDED, f"{said}; {c} lower bound {_pct(low)} < min-rate {_pct(min_rate)}; {tail}", more
    )


def evaluate_gate(
    summary,
    *,
    fixed: str,
    baseline: str,
    max_rate: float = 0.0,
    min_rate: float | None = None,
    confidence: float | None = None,
    scenario: str | None = None,
) -> GateResult:
    """Decide the gate over every scenario of `summary` (a tally.summarize frame) that holds both
    arms, or over `scenario` alone. Raises ValueError for unknown arms or scenario, equal arms,
    rates outside [0, 1], or a confidence with max_rate 0 (no finite evidence bounds a rate at 0).
    """
    stats.check_rate("max_rate", max_rate)
    stats.check_rate("min_rate", min_rate)
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if confidence is not None and max_rate <= 0.0:
        raise ValueError("--confidence needs --max-rate above 0: no number of trials bounds a rate at 0")
    if fixed == baseline:
        raise ValueError(f"the fixed and baseline arms are the same arm {fixed!r}")
    rows = summary[summary["test"] == ALL_TESTS]
    if scenario is not None:
        known = list(dict.fromkeys(rows["scenario"]))
        if scenario not in known:
            raise ValueError(f"unknown scenario {scenario!r}; scenarios: {', '.join(known)}")
        rows = rows[rows["scenario"] == scenario]
    arms = list(dict.fromkeys(rows["arm"]))
    for role, arm in (("fixed", fixed), ("baseline", baseline)):
        if arm not in arms:
            raise ValueError(f"unknown {role} arm {arm!r}; arms: {', '.join(arms)}")
    by_key = {(r.scenario, r.arm): (int(r.failures), int(r.trials)) for r in rows.itertuples()}
    scenarios = [s for s in dict.fromkeys(rows["scenario"]) if (s, fixed) in by_key and (s, baseline) in by_key]
    if not scenarios:
        raise ValueError(f"no scenario ran both arms {fixed!r} and {baseline!r}")

    judges = (
        ("fixed", fixed, functools.partial(_fixed_condition, max_rate=max_rate, confidence=confidence)),
        ("baseline", baseline, functools.partial(_baseline_condition, min_rate=min_rate, confidence=confidence)),
    )
    conditions = []
    for name in scenarios:
        for role, arm, judge in judges:
            k, n = by_key[(name, arm)]
            # An arm whose every trial skipped every test has given no evidence either way.
            c = judge(k, n) if n else Condition(Decision.UNDECIDED, "no trial ran (all skipped)")
            conditions.append(dataclasses.replace(c, line=f"{name} {role} arm {arm!r}: {c.line} -> {c.decision.value}"))
    decision = max((c.decision for c in conditions), key=_ORDER.__getitem__)
    return GateResult(decision=decision, conditions=tuple(conditions))
