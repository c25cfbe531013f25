"""The control trials of a run: when every arm of a suite failed in every trial under racecheck's
perturbation or detector, one trial of each of its arms with neither, in the run's own folder
(OUT/control, a run folder of its own), so that the failure list can say whether the suite fails
by itself or racecheck broke it (results/blame.py reads what this writes).
"""

from __future__ import annotations

import shutil

from racecheck.runner import state
from racecheck.runner.run_config import RunConfig
from racecheck.runner.trial_runner import Runner

FOLDER = "control"  # results/blame.py's CONTROL_FOLDER


def run_control(config: RunConfig, suites: set[str]) -> None:
    """Run the control of `suites` (RunConfig.control) quietly, to the end; what it finds is in
    OUT/control/trials.jsonl, replacing an earlier control's (a resumed run's). A control that
    cannot run leaves no records: the verdict then says what it cannot tell."""
    control = config.control(suites, FOLDER)
    if state.is_run_folder(control.out):
        shutil.rmtree(control.out)
    Runner(control).run()
