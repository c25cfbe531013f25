"""The click parameter types the commands share, each refusing bad input in one line (exit 2):

- Number, for every number option: a number within a range (racecheck.limits), never nan or
  infinite. click's own FloatRange lets nan through (it compares false with every bound) and,
  without an upper bound, the infinities; a range checked as `low <= x <= high` with finite ends
  refuses both.
- Folder, for every run folder argument: a path the file system can look up.
"""

from __future__ import annotations

from pathlib import Path

import click

from racecheck import limits


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
SECONDS = Number(limits.MIN_SECONDS, limits.MAX_SECONDS, within=limits.SECONDS_RANGE, metavar="SECONDS")
PROBABILITY = Number(0.0, 1.0, within="strictly between 0 and 1", open_ends=True, metavar="P")


class Folder(click.Path):
    """click.Path for a run folder (`--out`, `--resume`, OUT) that also refuses, in one line, a
    path the file system cannot even look up: a name longer than it allows, a folder on the way
    that cannot be searched (runner/run_folder.path_problem). Whether the folder exists, or may
    be written, is the command's to say."""

    def __init__(self, **kwargs) -> None:
        super().__init__(path_type=Path, **kwargs)

    def convert(self, value, param, ctx):
        from racecheck.runner.run_folder import path_problem

        path = super().convert(value, param, ctx)
        problem = path_problem(Path(path))
        if problem:
            self.fail(problem, param, ctx)
        return path
