"""The run says what the detector could not see: launches of kernels of unknown writes, summed
from the records' `unseen_kernels` over trials and ranks, and the tracker's own errors
(`detector_errors`), one line per arm each."""

from __future__ import annotations

import json

from racecheck.protocol.records import TrialRecord
from racecheck.results.detector_notes import detector_notes


def _record(trial: int, arm: str, unseen: dict | None, errors: list | None = None) -> TrialRecord:
    return TrialRecord.from_dict(
        {
            "run_id": "r",
            "scenario": "compiled",
            "arm": arm,
            "expect": "",
            "trial": trial,
            "seed": trial,
            "test": "tests/test_k.py::test_k",
            "params": "",
            "outcome": "passed",
            "detect": True,
            **({"unseen_kernels": unseen} if unseen is not None else {}),
            **({"detector_errors": errors} if errors is not None else {}),
        }
    )


def test_a_run_names_the_kernels_whose_writes_the_detector_could_not_tell():
    records = [
        _record(0, "fixed", {"add_kernel_0": 2}),
        _record(1, "fixed", {"add_kernel_0": 2, "scale": 1}),
        _record(0, "hold", None),
    ]
    (line,) = detector_notes(records)
    assert line.startswith(
        "compiled/fixed: --detect could not tell what 2 kernel(s) write (add_kernel_0, scale; 5 launch(es))"
    )
    assert detector_notes([_record(0, "hold", None)]) == []


def test_the_record_keeps_unseen_kernels_and_checks_their_type():
    import pytest

    line = _record(0, "fixed", {"k": 3}).to_json()
    assert TrialRecord.from_dict(json.loads(line)).unseen_kernels == {"k": 3}
    with pytest.raises(ValueError, match="unseen_kernels"):
        TrialRecord.from_dict({**json.loads(line), "unseen_kernels": "k"})


def test_a_run_says_where_the_tracker_failed_to_record():
    """A tracker's own errors (an operator call the native log could not read, a kernel launch
    the watch could not follow) reach the run's notes from every rank and trial, once each."""
    from racecheck.protocol.rank_events import TestOutcome
    from racecheck.runner.ranks import _detector_fields

    missed = "native log: 1 operator call(s) not recorded (a tensor without storage)"
    launch = "kernel launch: TypeError: no signature"
    ranks = [
        TestOutcome(rank=r, test="t", trial=0, arm="fixed", outcome="passed", detector_errors=e)
        for r, e in ((0, [missed]), (1, [missed, launch]), (2, None))
    ]
    assert _detector_fields(ranks) == {"detector_errors": [missed, launch]}
    records = [
        _record(0, "fixed", None, [missed, launch]),
        _record(1, "fixed", None, [missed]),
        _record(0, "hold", None),
    ]
    (line,) = detector_notes(records)
    assert line == (
        f"compiled/fixed: --detect's tracker failed to record in 2 test run(s) ({missed}; 1 other error(s)): "
        "a race in what it missed may go unreported"
    )
    assert TrialRecord.from_dict(json.loads(records[0].to_json())).detector_errors == [missed, launch]
