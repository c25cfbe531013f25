"""Deprecated: the trial modules moved to suites/, runner/, results/ and cli/ (racecheck.compat)."""

from racecheck.compat import warn_moved

warn_moved("racecheck.trials", "racecheck.suites, racecheck.runner, racecheck.results and racecheck.cli")
