"""Whose failure it is when a suite fails alike in every arm, or racecheck's own code raised: the
suite's, or racecheck's. A red result must mean a race, and a suite that fails only under
racecheck must not be told to fix itself.

- A failure raised inside racecheck's instruments (a record's `racecheck_frame`: the innermost
  frame of its innermost cause is in racecheck/perturb or racecheck/detect) is racecheck's.
- A suite in which every arm failed every trial alike (failures.suites_failing) under a
  perturbation or the detector is checked against a control: one trial of each arm with neither,
  which `racecheck run` makes in OUT/control (runner/control.py). The control passing means
  racecheck broke the suite; failing alike, the suite fails by itself. Without a control (a run
  that perturbed nothing, or an older run folder) the line says what it cannot tell.
"""

from __future__ import annotations

import json
from pathlib import Path

from racecheck.protocol.records import Outcome, TrialRecord

CONTROL_FOLDER = "control"  # OUT/control: the control trials' own run folder


def instrumented(records, scenario: str) -> bool:
    """Whether `scenario`'s records ran under a perturbation or the detector."""
    rows = records[records["scenario"] == scenario]
    return bool(((rows["perturb"] != "off") & (rows["perturb"] != "")).any() or rows["detect"].any())


def controls(out_dir: Path | str) -> dict[str, bool]:
    """Per suite, whether its control trials in OUT/control all passed (no file: {})."""
    log = Path(out_dir) / CONTROL_FOLDER / "trials.jsonl"
    passed: dict[str, bool] = {}
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return passed
    for line in lines:
        try:
            r = TrialRecord.from_dict(json.loads(line))  # the one check of a record, as every reader's
        except ValueError:
            continue  # a torn line: the control tells what its whole records tell
        passed[r.scenario] = passed.get(r.scenario, True) and not Outcome(r.outcome).is_failure
    return passed


def suite_line(scenario: str, records, *, logs: str = "OUT/logs", control: dict[str, bool] | None = None) -> str:
    """What the failure list says of a suite whose every arm fails alike in every trial."""
    outcome = (control or {}).get(scenario)
    if outcome is True:
        return (
            f"{scenario}: racecheck broke the suite: every arm fails alike in every trial under its perturbation "
            f"or detector, and a control trial of each arm without them passed (OUT/{CONTROL_FOLDER}); the "
            f"failure above is racecheck's, not the suite's nor the race's"
        )
    suffix = ""
    if outcome is False:
        suffix = f"; it fails without racecheck's perturbation and detector too (OUT/{CONTROL_FOLDER})"
    elif instrumented(records, scenario):
        suffix = "; to tell whether it fails without racecheck, run it with --no-perturb and without --detect"
    else:  # what is left of racecheck: its session, which repeats the tests in one process
        suffix = (
            "; should plain pytest pass it while the run repeated its tests in one session (session "
            "isolation), it fails when they repeat in one process: --isolation process runs each trial "
            "in a session of its own"
        )
    return (
        f"{scenario}: every arm fails alike, in every trial: this is the suite failing, not the race; "
        f"fix the suite first (the messages above, the session logs in {logs}){suffix}"
    )


def raised_in_racecheck(records) -> list[str]:
    """A line per (suite, frame) where racecheck's own instruments raised a failure."""
    if records is None or not len(records) or "racecheck_frame" not in records:
        return []
    rows = records[records["racecheck_frame"].fillna("") != ""]
    lines = []
    for (scenario, frame), group in rows.groupby(["scenario", "racecheck_frame"], sort=True):
        arms = ", ".join(sorted(set(group["arm"])))
        lines.append(
            f"{scenario}: racecheck broke the suite: a failure was raised inside racecheck's own code "
            f"({frame}), in {len(set(zip(group['arm'], group['trial'], strict=True)))} trial(s) of {arms}"
        )
    return lines
