"""Patch mode for a project's own suite, through `racecheck run`, on the CPU: the recording twin
of the CUDA actions ($RACECHECK_PATCH_ACTIONS=recording) stands in for the GPU, and the suite
below hands work between the twin's host streams the way torch.cuda code does.

The suite plays a race that one delayed hand-off exposes: in arm `race` a copy stream's output is
used with no wait, so a delay on the copy stream right after the host entered it (stream_enter at
COPY_LINE) makes the test fail; arm `safe` waits for the copy's event and never fails.
"""

from __future__ import annotations

import json
import shlex

import pytest
from run_kit import racecheck, write_suite

from racecheck.runner.trial_log import read_log

pytestmark = pytest.mark.usefixtures("fast_sessions")

SUITE = """
from racecheck.perturb import recording as rs


def test_copy(racecheck_arm):
    side, copy = rs.HostStream("side"), rs.HostStream("copy")
    with rs.stream(side):
        pass
    rs.current_stream().wait_stream(side)
    with rs.stream(copy):  # COPY_LINE
        pass
    late = copy.delayed > 0  # the copy stream's work ran late
    done = copy.record_event()
    if racecheck_arm == "safe":
        rs.current_stream().wait_event(done)
    else:
        assert not late, "stale read: the copy ran late and nothing waited for it"
"""
COPY_LINE = 1 + next(i for i, line in enumerate(SUITE.split("\n")) if "COPY_LINE" in line)
COPY_KEY = f"stream_enter@test_copy.py:{COPY_LINE}/s2"


@pytest.fixture
def patch_project(tmp_path, monkeypatch):
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")
    return write_suite(
        tmp_path / "p", arms={"race": {"expect": "race"}, "safe": {"expect": "safe"}}, tests={"test_copy.py": SUITE}
    )


def records(out) -> dict:
    return {(r.arm, r.trial): r for r in read_log(out / "trials.jsonl")}


def test_each_arms_profile_reaches_the_rank_and_its_actions_are_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")
    root = write_suite(
        tmp_path / "p", arms={"race": {"perturb": "enter_delay"}, "safe": {}}, tests={"test_copy.py": SUITE}
    )
    res = racecheck(
        "run", "--trials", 2, "--perturb", "sleep@event_record:1ms", "--out", tmp_path / "out", "-q", cwd=root
    )
    assert res.code == 0, res
    (schedule,) = (tmp_path / "out" / "ranks").glob("*.schedule.json")  # the ranks' one source
    assert json.loads(schedule.read_text())["blocks"] == [
        [t, arm, spec]
        for t in (0, 1)
        for arm, spec in (("race", "sleep@stream_enter:5ms"), ("safe", "sleep@event_record:1ms"))
    ]
    got = records(tmp_path / "out")
    for trial in (0, 1):
        race, safe = got["race", trial], got["safe", trial]
        assert race.perturb == "sleep@stream_enter:5ms" and race.outcome == "failed"
        assert race.actions == {"sleep": 2, "pressure": 0, "poison": 0}  # both stream entries
        assert safe.perturb == "sleep@event_record:1ms" and safe.outcome == "passed"
        assert safe.actions == {"sleep": 1, "pressure": 0, "poison": 0}  # wait_stream's record is inner
    assert "--perturb sleep@stream_enter:5ms" in got["race", 0].replay
    assert "never acted" not in res.out


@pytest.mark.slow
def test_the_systematic_schedule_finds_the_race_within_its_bound_across_sessions(patch_project, tmp_path):
    out = tmp_path / "out"
    # Trials 0 (records the points) and 1 (delays the first) in one session ...
    res = racecheck(
        "run", "--trials", 2, "--perturb", "systematic:delay=1ms:pairs=0", "--out", out, "-q", cwd=patch_project
    )
    assert res.code == 0, res
    keys = json.loads(next((out / "handoffs").glob("*-rank0.json")).read_text())["points"]
    first = records(out)
    # both sides of each wait and record: enter s1, before/after the wait, enter s2, before/after the record
    assert first["race", 0].handoffs == 6 and first["safe", 0].handoffs == 8
    assert first["race", 1].delayed == [keys[0]] and first["race", 1].actions["sleep"] == 1
    # ... then trials 2..6 in a later session, from the enumeration in the run folder.
    res = racecheck("run", "--resume", out, "--trials", 7, "-q", cwd=patch_project)
    assert res.code == 0, res
    got = records(out)
    assert [t for t in range(7) if got["race", t].outcome == "failed"] == [4]
    assert got["race", 4].delayed == [COPY_KEY]
    assert all(got["safe", t].outcome == "passed" for t in range(7))
    assert (
        "tiny/race: systematic: k=6 points (before and after each hand-off), all singles covered in trials 1..6; "
        "first failure in trial 4" in res.out
    )
    # The replay line delays that point in a run of one trial, without recording first.
    argv = shlex.split(got["race", 4].replay)
    assert argv[:2] == ["racecheck", "run"] and f"systematic:delay=1ms:pairs=0:at={COPY_KEY}" in argv
    res = racecheck("run", "--out", tmp_path / "replay", *argv[2:], cwd=patch_project)
    assert res.code == 0, res
    replayed = records(tmp_path / "replay")["race", 0]
    assert replayed.outcome == "failed" and replayed.delayed == [COPY_KEY]


def test_frees_are_counted_and_a_profile_that_never_acted_is_called_out(tmp_path, monkeypatch):
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")
    frees = SUITE.replace(
        "    late = copy.delayed > 0",
        "    rs.release(rs.allocate(4096))\n    rs.release(rs.allocate(512))\n    rs.allocate(64)\n    late = False",
    )
    root = write_suite(
        tmp_path / "p",
        arms={"race": {"perturb": "pressure@free,poison@free"}, "safe": {"perturb": "sleep@before_all_gather:1ms"}},
        tests={"test_copy.py": frees},
    )
    res = racecheck("run", "--trials", 1, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    got = records(tmp_path / "out")
    assert got["race", 0].actions == {"sleep": 0, "pressure": 2, "poison": 2}
    assert got["safe", 0].actions == {"sleep": 0, "pressure": 0, "poison": 0}
    assert "tiny/safe: the perturbation 'sleep@before_all_gather:1ms' never acted in 1 trial(s)" in res.out
    assert "tiny/race: the perturbation" not in res.out


DETECT_SUITE = """
import torch
from racecheck.perturb import recording as rs


def test_read_on_side_stream(racecheck_arm):
    side = rs.HostStream("side")
    x = torch.ones(1024)
    x.mul_(2)  # written on the default stream
    done = rs.current_stream().record_event()
    with rs.stream(side):
        if racecheck_arm == "safe":
            side.wait_event(done)
        y = x + 1  # read on the side stream: ordered after the write only in arm safe
    rs.current_stream().wait_stream(side)  # both arms: the default stream reads y after side wrote it
    assert float(y[0]) == 3.0
"""


def test_detect_fails_the_racing_arm_with_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")
    root = write_suite(
        tmp_path / "p", arms={"race": {"expect": "race"}, "safe": {"expect": "safe"}}, tests={"test_d.py": DETECT_SUITE}
    )
    res = racecheck("run", "--trials", 1, "--detect", "--no-perturb", "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    got = records(tmp_path / "out")
    race, safe = got["race", 0], got["safe", 0]
    assert race.outcome == "failed" and race.detected == 1 and "test_d.py" in race.reports[0]
    assert race.message.startswith("racecheck detected a race: read-after-write")
    # named by the test that raced, not by pytest's frame that failed it
    assert race.signature == "Failed at test_d.py:6 in test_read_on_side_stream", race.signature
    assert safe.outcome == "passed" and safe.detected == 0 and safe.reports == []
    import pandas as pd

    summary = pd.read_csv(tmp_path / "out" / "summary.csv", keep_default_na=False)
    assert dict(zip(summary.arm + summary.test.str.rsplit("::").str[-1], summary.detected, strict=True)) == {
        "racetest_read_on_side_stream": 1,
        "race*": 1,
        "safetest_read_on_side_stream": 0,
        "safe*": 0,
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--perturb", "sleep@nowhere:1ms"], "unknown injection point 'nowhere'"),
        (["--perturb", "systematic:at=bogus@x.py:1/s1"], "unknown hand-off point 'bogus'"),
        (["--perturb", "reorder@stream_wait>end_of_backward:1ms"], "patch mode takes"),
        (["--perturb", "sleep@stream_wait:1ms/other"], "patch mode takes"),
    ],
)
def test_a_profile_patch_mode_cannot_carry_out_is_one_line_exit_2(patch_project, tmp_path, args, message):
    res = racecheck("run", "--trials", 1, *args, "--out", tmp_path / "out", "-q", cwd=patch_project)
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1, res


def test_without_cuda_a_project_profile_or_detect_is_a_usage_error(patch_project, tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the error is for machines without it")
    monkeypatch.delenv("RACECHECK_PATCH_ACTIONS")
    for args in (["--perturb", "sleep@stream_enter:1ms"], ["--detect", "--no-perturb"]):
        res = racecheck("run", "--trials", 1, *args, "--out", tmp_path / "out", "-q", cwd=patch_project)
        assert res.code == 2 and "no CUDA" in res.err or "needs CUDA" in res.err, res
        assert len(res.err.strip().splitlines()) == 1, res
    res = racecheck("run", "--trials", 1, "--no-perturb", "--out", tmp_path / "out", "-q", cwd=patch_project)
    assert res.code == 0, res  # unperturbed, the suite runs anywhere


def test_the_catalogue_refuses_patch_mode_profiles(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = racecheck(
        "run",
        "--scenario",
        "main_grad_reuse",
        "--perturb",
        "systematic",
        "--trials",
        1,
        "--out",
        tmp_path / "out",
        cwd=root,
    )
    assert res.code == 2 and "patch mode" in res.err, res
