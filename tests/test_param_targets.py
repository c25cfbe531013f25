"""A parametrized node id as the target of `racecheck run`: the session repeats every test per
step, so the id is widened to its test and only the parametrizations named run."""

from __future__ import annotations

from pathlib import Path

from run_kit import expected_failures, racecheck, summary_counts

from racecheck.rank.param_targets import widen


def test_widen_names_each_test_once_and_keeps_the_parametrizations_named(tmp_path):
    args, wanted = widen(
        ["-q", "t.py::test_x[1-False]", "t.py::test_x[3-True]", "t.py::TestC::test_y[a]", "u.py", "t.py::test_z"],
        tmp_path,
    )
    assert args == ["-q", "t.py::test_x", "t.py::TestC::test_y", "u.py", "t.py::test_z"]
    file = tmp_path / "t.py"
    assert wanted.keeps(file, "test_x[1-False]") and wanted.keeps(file, "test_x[3-True]")
    assert not wanted.keeps(file, "test_x[1-True]")
    assert wanted.keeps(file, "TestC::test_y[a]") and not wanted.keeps(file, "TestC::test_y[b]")
    assert wanted.keeps(file, "test_z[1]") and wanted.keeps(tmp_path / "u.py", "test_x[9]")


def test_a_parametrized_target_runs_that_parametrization_in_every_trial(project: Path, fast_sessions, tmp_path):
    out = tmp_path / "out"
    result = racecheck(
        "run", "--arms", "often,never", "--trials", "4", "--no-perturb", "--quiet", "--out", out,
        "--", "test_seeded.py::test_draw[x]", cwd=project,
    )  # fmt: skip
    assert result.code in (0, 1), result
    counts = {k: v for k, v in summary_counts(out).items() if k[1] != "*"}
    expected = expected_failures({"often": 0.6, "never": 0.0}, range(4))
    assert counts == {k: v for k, v in expected.items() if k[1] == "test_draw[x]"}
