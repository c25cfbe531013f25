"""The command lines a run gives back: the one that replays a failing trial (replay_command, in
its record and its progress line) and the one that resumes the run (resume_command), and the
split of pytest's arguments into targets and options that they and the sessions share.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from racecheck.protocol.printable import shell_join
from racecheck.runner import option_table
from racecheck.suites.catalogue import SuiteKind

if TYPE_CHECKING:
    from racecheck.perturb.profiles import Profile
    from racecheck.protocol.records import TrialRecord
    from racecheck.runner.run_config import RunConfig
    from racecheck.suites.catalogue import Suite


# pytest options whose value may follow as the next argument (so it is no target).
_VALUE_OPTIONS = {
    "-k",
    "-m",
    "-p",
    "-n",
    "-c",
    "-o",
    "-W",
    "--deselect",
    "--ignore",
    "--ignore-glob",
    "--rootdir",
    "--confcutdir",
    "--basetemp",
    "--maxfail",
    "--dist",
    "--timeout",
    "--count",
    "--numprocesses",
    "--import-mode",
    "--tb",
    "--durations",
    "-r",
}


def split_targets(args, root: Path) -> tuple[list[str], list[str]]:
    """(targets, options) of pytest arguments: targets name tests (paths, node ids)."""
    targets, options = [], []
    takes_value = False
    for arg in args:
        if takes_value:
            options.append(arg)
            takes_value = False
            continue
        if arg.startswith("-"):
            options.append(arg)
            takes_value = arg in _VALUE_OPTIONS
            continue
        path = arg.split("::", 1)[0]
        if "::" in arg or path.endswith(".py") or (root / path).exists() or Path(path).exists():
            targets.append(arg)
        else:
            options.append(arg)
    return targets, options


def replay_spec(record: TrialRecord, profile: Profile) -> str:
    """The profile that replays the record's trial in a run of one trial: its own, or for a
    systematic trial (`profile`, the one its arm ran) the schedule with the points it delayed
    named (`at=`), since trial 0 of a new run would only record them."""
    spec = record.perturb or "off"
    if not record.delayed or profile.systematic is None:
        return spec
    return dataclasses.replace(profile.systematic, at=tuple(record.delayed)).to_spec()


def resume_command(out: Path | str) -> str:
    """The command line that continues the run in `out`, quoted for a shell on one line."""
    return shell_join(["racecheck", "run", "--resume", str(out)])


def replay_command(record: TrialRecord, *, suite: Suite, config: RunConfig) -> str:
    """One command line that reruns exactly this test of this trial under this arm."""
    if suite.kind is SuiteKind.PROJECT:
        assert suite.config_file is not None
        try:
            where = os.path.relpath(suite.config_file)
        except ValueError:
            where = str(suite.config_file)
        parts = ["racecheck", "run", "--config", where]
    else:
        parts = ["racecheck", "run", "--scenario", suite.name]
    # The run's settings, with the trial's own: its arm, its seed and the spec that replays it.
    spec = replay_spec(record, config.profile_for(suite, record.arm))
    values = {name: getattr(config, name) for name in option_table.REPLAYED}
    parts += option_table.replay_args({**values, "arms": record.arm, "trials": 1, "seed": record.seed, "perturb": spec})
    _, pytest_options = split_targets(config.pytest_args, suite.run_root)
    parts += ["--", *pytest_options, record.test]
    return shell_join(parts)
