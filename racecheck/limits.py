"""The bounds racecheck puts on the numbers a user gives it, in one place, so that the command
line, a suite's config, a perturbation spec and run.json's reader refuse the same values (the
README's "Commands" states them):

- seconds (`--timeout`, `--max-time`): from 1 s to a week;
- a perturbation delay (a rule's sleep or hold, the random schedule's `max`, the systematic
  schedule's `delay`, `--delay-ms`): from 0 to an hour;
- the ranks one node runs on the CPU (the catalogue on the CPU emulation, a project's suite over
  gloo): at most 64, each a process of its own that loads torch (on CUDA the bound is one rank
  per GPU: runner/config_checks.py).

A range written `low <= x <= high` with finite ends also refuses nan (no comparison with it holds)
and the infinities, so no reader needs a check of its own for them.
"""

MIN_SECONDS = 1.0
MAX_SECONDS = 7 * 24 * 3600.0  # a week
SECONDS_RANGE = f"a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g} (a week)"

MAX_DELAY_S = 3600.0  # an hour: a longer delay only makes every trial a timeout
DELAY_MS_RANGE = f"a number of milliseconds from 0 to {MAX_DELAY_S * 1e3:.0f} (an hour)"

MAX_CPU_RANKS = 64


def is_seconds(value: float) -> bool:
    """Whether `value` is a number of seconds racecheck takes (False for nan and infinities)."""
    return MIN_SECONDS <= value <= MAX_SECONDS


def is_delay(seconds: float) -> bool:
    """Whether a perturbation delay of `seconds` is one racecheck takes (False for nan, inf)."""
    return 0.0 <= seconds <= MAX_DELAY_S
