"""`--shard auto`: the shard from the job's environment (RACECHECK_SHARD, Slurm arrays), recorded
in the run folder; and merge's refusal of a split with a shard missing or given twice."""

from __future__ import annotations

import json
import shutil

import pytest
from run_kit import racecheck, summary_counts

from racecheck.runner import shard_env
from racecheck.runner.blocks import Shard
from racecheck.runner.shard_env import from_environment


@pytest.fixture(autouse=True)
def _no_shard_of_this_job(fast_sessions, monkeypatch):
    for name in shard_env.VARIABLES:  # this machine's own job must not pick the shard
        monkeypatch.delenv(name, raising=False)


def slurm(task, **array) -> dict:
    return {"SLURM_ARRAY_TASK_ID": str(task), **{f"SLURM_ARRAY_TASK_{k.upper()}": str(v) for k, v in array.items()}}


@pytest.mark.parametrize(
    ("env", "shard", "source"),
    [
        (slurm(0, count=2), Shard(1, 2), "SLURM_ARRAY_TASK_ID=0 (tasks 0-1)"),
        (slurm(1, count=2), Shard(2, 2), "SLURM_ARRAY_TASK_ID=1 (tasks 0-1)"),
        (slurm(7, min=3, max=7), Shard(5, 5), "SLURM_ARRAY_TASK_ID=7 (tasks 3-7)"),
        (slurm(3, min=3, max=7, count=5), Shard(1, 5), "SLURM_ARRAY_TASK_ID=3 (tasks 3-7)"),
        (slurm(8, min=0, max=12, step=4, count=4), Shard(3, 4), "SLURM_ARRAY_TASK_ID=8 (tasks 0-12:4)"),
        ({"RACECHECK_SHARD": "2/3"}, Shard(2, 3), "RACECHECK_SHARD=2/3"),
        ({"RACECHECK_SHARD": " 1 / 4 ", **slurm(1, count=2)}, Shard(1, 4), "RACECHECK_SHARD=1 / 4"),  # explicit wins
    ],
)
def test_the_shard_comes_from_the_job_environment(env, shard, source):
    job = from_environment(env)
    assert (job.shard, job.source) == (shard, source)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no job environment names a shard: set RACECHECK_SHARD=i/N"),
        ({"RACECHECK_SHARD": "3/2"}, "RACECHECK_SHARD: '3/2': need 1 <= i <= N"),
        (slurm(5), "SLURM_ARRAY_TASK_ID without SLURM_ARRAY_TASK_COUNT or SLURM_ARRAY_TASK_MIN/MAX"),
        (slurm(2, count=2), "SLURM_ARRAY_TASK_ID=2 is not a task of the array 0-1"),
        (slurm(4, min=1, max=9, count=3), "the Slurm array (tasks 1-9, step 1, 3 tasks) is not an even range"),
        (slurm("x", count=2), "SLURM_ARRAY_TASK_ID='x' is not a whole number"),
    ],
)
def test_an_environment_that_names_no_shard_is_refused(env, message):
    with pytest.raises(ValueError) as info:
        from_environment(env)
    assert message in str(info.value)


def test_slurm_array_tasks_with_shard_auto_merge_into_the_unsharded_run(project, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    for task in (0, 1):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        res = racecheck(
            "run", "--trials", 7, "--seed", 5, "--shard", "auto", "--out", tmp_path / f"task-{task}", "-q", cwd=project
        )
        assert res.code == 0, res
        run = json.loads((tmp_path / f"task-{task}" / "run.json").read_text())
        assert (run["shard"], run["shard_source"]) == (f"{task + 1}/2", f"SLURM_ARRAY_TASK_ID={task} (tasks 0-1)")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    res = racecheck("merge", str(tmp_path / "task-*"), "--out", tmp_path / "merged", cwd=project)
    assert res.code == 0 and "28 records from 2 runs merged" in res.out, res
    assert racecheck("run", "--trials", 7, "--seed", 5, "--out", tmp_path / "whole", "-q", cwd=project).code == 0
    assert summary_counts(tmp_path / "merged") == summary_counts(tmp_path / "whole")
    # A resumed shard keeps its shard even where the environment changed.
    monkeypatch.setenv("RACECHECK_SHARD", "1/2")
    res = racecheck("run", "--resume", tmp_path / "task-1", "-q", cwd=project)
    assert res.code == 0 and json.loads((tmp_path / "task-1" / "run.json").read_text())["shard"] == "2/2", res


def test_merge_refuses_a_split_with_a_shard_missing_or_given_twice(project, tmp_path, monkeypatch):
    for i in (1, 2, 3):
        monkeypatch.setenv("RACECHECK_SHARD", f"{i}/3")
        res = racecheck(
            "run", "--trials", 3, "--shard", "auto", "--out", tmp_path / "s" / f"shard-{i}", "-q", cwd=project
        )
        assert res.code == 0, res
    shutil.move(tmp_path / "s" / "shard-2", tmp_path / "aside")
    res = racecheck("merge", str(tmp_path / "s" / "shard-*"), "--out", tmp_path / "m", cwd=project)
    assert res.code == 2 and res.err.count("\n") == 1 and "shard 2/3 missing (given: 1/3, 3/3)" in res.err, res
    shutil.copytree(tmp_path / "s" / "shard-1", tmp_path / "s" / "shard-1-again")
    shutil.move(tmp_path / "aside", tmp_path / "s" / "shard-2")
    res = racecheck("merge", str(tmp_path / "s" / "shard-*"), "--out", tmp_path / "m", cwd=project)
    assert res.code == 2 and "shard 1/3 is given twice" in res.err and "shard-1-again" in res.err, res
    shutil.rmtree(tmp_path / "s" / "shard-1-again")
    res = racecheck("merge", str(tmp_path / "s" / "shard-1"), "--out", tmp_path / "m", cwd=project)
    assert res.code == 2 and "is shard 1/3; missing: 2/3, 3/3" in res.err, res
    res = racecheck("merge", str(tmp_path / "nothing-*"), "--out", tmp_path / "m", cwd=project)
    assert res.code == 2 and "nothing-*: no run folder matches" in res.err, res
    res = racecheck("merge", str(tmp_path / "s" / "shard-*"), "--out", tmp_path / "m", cwd=project)
    assert res.code == 0 and "from 3 runs merged" in res.out, res


def test_shard_auto_without_a_job_environment_is_a_usage_error(project):
    res = racecheck("run", "--shard", "auto", "-q", "--out", "o", cwd=project)
    assert res.code == 2 and res.err.count("\n") == 1, res
    assert "Invalid value for --shard: auto: no job environment names a shard" in res.err
