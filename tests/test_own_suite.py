"""A project's own suite through `racecheck run` as a user writes it: a one-rank session that looks
like torchrun's, the failures' messages after the table, the world checked against the GPUs."""

from __future__ import annotations

import json

import pytest
from run_kit import racecheck, records, summary_counts, write_suite

pytestmark = pytest.mark.usefixtures("fast_sessions")

# The common conftest idiom: join the world when a launcher started one, with torch's defaults.
TORCHRUN_CONFTEST = """
import os
import pytest
import torch.distributed as dist

@pytest.fixture(scope="session", autouse=True)
def world():
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        yield
        dist.destroy_process_group()
    else:
        yield
"""
ALL_REDUCE = """
import torch
import torch.distributed as dist

def test_all_reduce():
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(dist.get_world_size())] * 3
"""


def test_a_one_rank_session_is_a_world_that_init_process_group_joins_with_its_defaults(tmp_path):
    root = write_suite(
        tmp_path / "p", arms={"a": {}}, tests={"conftest.py": TORCHRUN_CONFTEST, "test_world.py": ALL_REDUCE}
    )
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    assert [r.outcome for r in records(tmp_path / "out")] == ["passed", "passed"], records(tmp_path / "out")[0]
    assert summary_counts(tmp_path / "out")[("a", "*")] == (0, 2)


BROKEN_CONFTEST = """
import pytest

@pytest.fixture(autouse=True)
def world():
    raise ValueError("environment variable MASTER_ADDR expected, but not set")
"""
TWO_TESTS = """
def test_one(racecheck_arm):
    assert racecheck_arm != "before", "the race, in arm before only"

def test_two():
    pass
"""
MESSAGE = "environment variable MASTER_ADDR expected, but not set"


def test_the_failures_message_is_shown_once_per_kind_and_a_suite_failing_in_every_arm_is_named(tmp_path):
    arms = {"before": {"expect": "race"}, "after": {"expect": "safe"}}
    root = write_suite(tmp_path / "p", arms=arms, tests={"conftest.py": BROKEN_CONFTEST, "test_a.py": TWO_TESTS})
    res = racecheck("run", "--trials", 3, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    # While it runs: one line per kind of failure and arm (not one per test and trial), with the message.
    lines = [ln for ln in res.err.splitlines() if ln.startswith("error: ")]
    assert [ln.split()[1] for ln in lines] == ["before", "after"], res.err
    assert all(f"(ValueError at conftest.py:6 in world: {MESSAGE}); replay: " in ln for ln in lines), lines
    # After the table: each kind once, with its message, its trials per arm, and what it means.
    table, _, after = res.out.partition("failures, each kind once")
    assert "before (race)  3/3 failed" in table and MESSAGE not in table
    assert f"ValueError at conftest.py:6 in world: {MESSAGE}\n    6 trial(s): before 3, after 3; 2 test(s)" in after
    assert "tiny: every arm fails alike, in every trial: this is the suite failing, not the race" in after
    assert "should plain pytest pass it while the run repeated its tests in one session (session isolation)" in after
    for fmt, alike in (("terminal", "every arm fails alike"), ("markdown", "every arm fails alike"), ("html", "")):
        text = racecheck("report", tmp_path / "out", "--format", fmt, cwd=root).out
        assert MESSAGE in text and "ValueError at conftest.py:6 in world" in text and alike in text, (fmt, text[-600:])
    data = json.loads(racecheck("report", tmp_path / "out", "--format", "json", cwd=root).out)
    assert data["failures"] == [
        {
            "scenario": "tiny",
            "signature": "ValueError at conftest.py:6 in world",
            "outcome": "error",
            "message": MESSAGE,
            "trials": {"before": 3, "after": 3},
            "tests": 2,
            "total_trials": 6,
        }
    ]
    assert data["suite_failing"] == ["tiny"]


def test_a_failure_in_one_arm_only_is_listed_without_blaming_the_suite(tmp_path):
    arms = {"before": {"expect": "race"}, "after": {"expect": "safe"}}
    root = write_suite(tmp_path / "p", arms=arms, tests={"test_a.py": TWO_TESTS})
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    assert [ln.split()[:2] for ln in res.err.splitlines() if ln.startswith("failed: ")] == [["failed:", "before"]]
    after = res.out.partition("failures, each kind once")[2]
    assert "AssertionError at test_a.py:3 in test_one: the race, in arm before only" in after
    assert "2 trial(s): before 2; 1 test(s)" in after and "fails alike" not in after


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "2"], "tiny would run 2 ranks on this machine, which has 1 GPU (one rank per GPU)"),
        (
            [
                "--world-size",
                "4",
                "--nnodes",
                "2",
                "--rdzv-endpoint",
                "127.0.0.1:29999",
                "--rdzv-conf",
                "join_timeout=5",
            ],
            "tiny would run 2 ranks on each node, which has 1 GPU (one rank per GPU): give at most --world-size 2",
        ),
    ],
)
def test_a_world_size_beyond_the_gpus_is_a_usage_error(tmp_path, monkeypatch, args, message):
    from racecheck.runner import config_build

    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_world.py": ALL_REDUCE})
    monkeypatch.setattr(config_build, "cuda_devices", lambda backend: None if backend == "sim" else 1)
    res = racecheck("run", *args, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 2 and res.err.count("\n") == 1 and message in res.err, res


def test_hand_off_points_name_code_by_its_path_below_its_sys_path_entry_or_the_project_root(tmp_path, monkeypatch):
    from racecheck.perturb.systematic import short_path

    target = tmp_path / "elsewhere" / "site"  # `pip install --target`, put on PYTHONPATH
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setattr("sys.path", [str(project / "tests"), str(target), str(target / "megatron_fsdp")])
    clear = getattr(short_path, "cache_clear", lambda: None)  # cached per file name
    clear()
    try:
        assert (
            short_path(str(target / "megatron_fsdp/experimental/module.py")) == "megatron_fsdp/experimental/module.py"
        )
        assert short_path(str(project / "tests/test_train.py")) == "tests/test_train.py"  # the project root first
        assert short_path("/venv/lib/python3.11/site-packages/torch/nn/x.py") == "torch/nn/x.py"
        assert short_path("/usr/lib/python3/dist-packages/apex/y.py") == "apex/y.py"
        assert short_path("/nowhere/z.py") == "/nowhere/z.py"
    finally:
        clear()
