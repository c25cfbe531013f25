"""The run says which kernels the detector could not read: launches of unknown writes, summed
from the records' `unseen_kernels` over trials and ranks, one line per arm."""

from __future__ import annotations

from racecheck.protocol.records import TrialRecord
from racecheck.results.detector_notes import detector_notes


def _record(trial: int, arm: str, unseen: dict | None) -> TrialRecord:
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
    import json

    import pytest

    line = _record(0, "fixed", {"k": 3}).to_json()
    assert TrialRecord.from_dict(json.loads(line)).unseen_kernels == {"k": 3}
    with pytest.raises(ValueError, match="unseen_kernels"):
        TrialRecord.from_dict({**json.loads(line), "unseen_kernels": "k"})
