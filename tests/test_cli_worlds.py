"""The catalogue through the command line: its scenarios found from any folder, the world and the
mesh a run gives them (one rank, a world below a scenario's least, a mesh that does not fit), and
every arm with --arms all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from run_kit import SEEDED_TEST, one_line_error, racecheck, records, summary_counts, trial_record, write_suite

CHECKOUT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fast_sessions")


def test_an_unknown_scenario_is_a_usage_error(project):
    res = racecheck("run", "--scenario", "nope", "--scenarios", CHECKOUT / "scenarios", cwd=project)
    err = one_line_error(res)
    assert "unknown scenario 'nope'; known: " in err and "main_grad_reuse" in err


@pytest.mark.slow
def test_a_scenario_runs_at_the_world_size_given_which_reaches_its_ranks_as_world_size(tmp_path):
    args = ["--scenario", "pingpong_bucket_reuse", "--arms", "flip", "--world-size", 1, "--trials", 1]
    res = racecheck("run", *args, "--out", tmp_path / "out", "-q", cwd=CHECKOUT)
    assert res.code == 0 and "pingpong_bucket_reuse: 1 rank on " in res.out, res
    outcomes = [r.outcome for r in records(tmp_path / "out")]
    assert outcomes and set(outcomes) == {"passed"}, outcomes


def test_too_few_ranks_for_a_scenario_is_a_usage_error(project):
    res = racecheck(
        "run",
        "--scenario",
        "hsdp_allreduce_reuse",
        "--world-size",
        "1",
        "--out",
        "o",
        "--scenarios",
        CHECKOUT / "scenarios",
        cwd=project,
    )
    assert (
        "Invalid value for --world-size: hsdp_allreduce_reuse needs at least 2 ranks (its min_world_size), got 1"
    ) in one_line_error(res)
    assert not (project / "o").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mesh", "2by2"], "Invalid value for '--mesh': '2by2' is not of the form SHARDxREPLICATE"),
        (["--mesh", "0x4"], "Invalid value for '--mesh': '0x4' is not of the form SHARDxREPLICATE"),
        (["--mesh", "2x4"], "Invalid value for --mesh: mesh 2x4 has 8 ranks, main_grad_reuse runs on 2"),
    ],
)
def test_a_mesh_that_does_not_fit_is_a_usage_error(project, args, message):
    res = racecheck(
        "run", "--scenario", "main_grad_reuse", *args, "--out", "o", "--scenarios", CHECKOUT / "scenarios", cwd=project
    )
    assert message in one_line_error(res)


def test_the_catalogue_runs_from_any_folder_and_keeps_its_mesh_for_resume_and_replays(tmp_path):
    import json

    from racecheck.protocol.mesh import MeshConfig
    from racecheck.runner.command_lines import replay_command
    from racecheck.runner.run_config import RunConfig
    from racecheck.suites.catalogue import find_catalogue, load_catalogue

    (tmp_path / "elsewhere").mkdir()  # no catalogue here: the checkout's, whose root its sessions run in
    res = racecheck(
        "run",
        "--arms",
        "fixed",
        "--trials",
        1,
        "--world-size",
        2,
        "--mesh",
        "1x2",
        "-q",
        "--",
        "-k",
        "1-False",
        cwd=tmp_path / "elsewhere",
    )
    assert res.code == 0, res
    (out,) = (tmp_path / "elsewhere" / "racecheck-out").iterdir()  # the default --out, in the current folder
    assert json.loads((out / "run.json").read_text())["mesh"] == "1x2"
    assert [r.outcome for r in records(out)] == ["passed"]
    suite = load_catalogue(find_catalogue(str(CHECKOUT / "scenarios")))["main_grad_reuse"]
    config = RunConfig(scenarios=(suite,), arms=None, trials=1, out=tmp_path, world_size=8, mesh=MeshConfig(4, 2))
    record = trial_record(
        scenario=suite.name, arm="baseline", expect="race", seed=3, test="t.py::test[1]", params="1", outcome="failed"
    )
    record.perturb = "rs_delay"
    assert replay_command(record, suite=suite, config=config).startswith(
        "racecheck run --scenario main_grad_reuse --arms baseline --trials 1 --seed 3 --perturb rs_delay "
        "--world-size 8 --mesh 4x2 -- "
    )


def test_a_min_world_size_above_the_world_size_is_rejected(tmp_path):
    from racecheck.suites.catalogue import CatalogueError, load_scenario

    (tmp_path / "scenario.toml").write_text("world_size = 2\nmin_world_size = 4\n[arms.a]\n")
    with pytest.raises(CatalogueError, match="min_world_size 4 is larger than world_size 2"):
        load_scenario(tmp_path)


def test_a_power_of_two_world_must_be_true_or_false(tmp_path):
    from racecheck.suites.catalogue import CatalogueError, load_scenario

    (tmp_path / "scenario.toml").write_text('world_size = 2\npower_of_two_world = "yes"\n[arms.a]\n')
    with pytest.raises(CatalogueError, match="power_of_two_world must be true or false"):
        load_scenario(tmp_path)


def test_a_multi_rank_scenario_runs_in_one_process_on_a_one_rank_group(tmp_path):
    """--world-size 1 (one GPU): no launcher, a one-rank process group, and the suite runs: every
    test passes or fails on its numbers, the fix never fails. (How often the race shows on one rank
    is measured by racecheck run itself, not asserted here: one rank changes the allocation pattern.)"""
    res = racecheck(
        "run",
        "--arms",
        "fixed,baseline",
        "--trials",
        1,
        "--world-size",
        1,
        "--out",
        tmp_path / "out",
        "-q",
        cwd=CHECKOUT,
    )
    assert res.code == 0, res
    recs = records(tmp_path / "out")
    assert len(recs) == 8 and {r.outcome for r in recs} <= {"passed", "failed"}
    assert all(r.outcome == "passed" for r in recs if r.arm == "fixed")
    assert all(r.signature.startswith("AssertionError") for r in recs if r.outcome == "failed")


def test_arms_all_runs_every_arm_not_only_the_defaults(tmp_path):
    root = write_suite(
        tmp_path / "p",
        arms={"a": {"expect": "race"}, "b": {"expect": "safe"}, "c": {"expect": "safe"}},
        tests={"test_seeded.py": SEEDED_TEST},
        suite='default_arms = ["a", "b"]',
    )
    assert racecheck("run", "-q", "--trials", 1, "--out", "d", cwd=root).code == 0
    assert {arm for arm, test in summary_counts(root / "d") if test == "*"} == {"a", "b"}
    assert racecheck("run", "-q", "--arms", "all", "--trials", 1, "--out", "all", cwd=root).code == 0
    assert {arm for arm, test in summary_counts(root / "all") if test == "*"} == {"a", "b", "c"}


def test_a_catalogue_profile_that_never_acts_is_said_to_prove_nothing(tmp_path):
    """The injector's actions reach the catalogue's records: a rule on a stream the scenario never
    uses is said to have never acted (it ran silently); test_catalogue_promise.py checks that a
    scenario's own profile acted."""
    args = ("run", "--scenario", "cross_stream_copy", "--arms", "record_stream", "--trials", 1, "-q")
    scenarios = ("--scenarios", CHECKOUT / "scenarios")
    res = racecheck(
        *args, "--perturb", "sleep@before_copy:3ms/nosuch", "--out", tmp_path / "a", *scenarios, cwd=tmp_path
    )
    assert res.code == 0, res
    assert "cross_stream_copy/record_stream: the perturbation 'sleep@before_copy:3ms/nosuch' never acted" in res.out
    assert all(r.actions == {} for r in records(tmp_path / "a"))
