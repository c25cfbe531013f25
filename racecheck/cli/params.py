"""The click parameter type every number option of the commands shares: a number within a range
(racecheck.limits), never nan or infinite, refused in one line that says the range (exit 2).

click's own FloatRange lets nan through (it compares false with every bound) and, without an
upper bound, the infinities; a range checked as `low <= x <= high` with finite ends refuses both.
"""

from __future__ import annotations

import click


class Number(click.ParamType):
    """A float from `low` to `high` (both excluded with `open_ends`); `within` says the range in
    the error, e.g. "a rate in [0, 1]", and `metavar` names the value in --help."""

    name = "number"

    def __init__(self, low: float, high: float, *, within: str, open_ends: bool = False, metavar: str = "") -> None:
        self.low, self.high, self.within, self.open_ends = low, high, within, open_ends
        self.metavar = metavar or "NUMBER"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.metavar

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        inside = self.low < number < self.high if self.open_ends else self.low <= number <= self.high
        if not inside:  # also nan and the infinities (see the module docstring)
            self.fail(f"{value} is not {self.within}", param, ctx)
        return number


RATE = Number(0.0, 1.0, within="a rate in [0, 1]", metavar="RATE")
PROBABILITY = Number(0.0, 1.0, within="strictly between 0 and 1", open_ends=True, metavar="P")
