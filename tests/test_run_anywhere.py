"""`racecheck run` from any folder, and run folders kept safe: a session finds every file the
runner gives it whatever folder it runs in (a git arm's worktree, the project's root); the default
`--out` lies in the project's root and is a new folder for every run, even two in one second; an
env arm beside a git arm collects only its own tests; shards of one suite from two checkouts
merge and a moved project resumes; no report replaces a run's own file and no run or merge writes
through a link out of its folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from run_kit import SEEDED_TEST, one_line_error, racecheck, records, write_suite

from racecheck.runner import run_location, state
from racecheck.runner.blocks import Shard

pytestmark = pytest.mark.usefixtures("fast_sessions")

TEST_CALC = """
from calc import add

def test_add():
    assert add(2, 3) == 5

def test_zero():
    assert add(0, 0) == 0
"""
CALC_TESTS = {"test_calc.py::test_add", "test_calc.py::test_zero"}


def git(*args, cwd):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def calc_repo(tmp_path):
    """A project in git, tagged v1, with an env arm `off`, no `tests =` key (pytest collects from
    the root), and the README's example arm `before` (git = "v1") added to its config."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    arms = {"off": {"env": {"CALC_MODE": "off"}}}
    project = write_suite(tmp_path / "p", arms=arms, tests={"test_calc.py": TEST_CALC})
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git("init", "-q", cwd=project)
    git("add", ".", cwd=project)
    git("commit", "-q", "-m", "calc", cwd=project)
    git("tag", "v1", cwd=project)
    with open(project / "pyproject.toml", "a") as fh:
        fh.write('[tool.racecheck.arms.before]\ngit = "v1"\n')
    return project


def _tests_per_arm(out) -> dict:
    tests: dict = {}
    for r in records(out):
        tests.setdefault(r.arm, set()).add(r.test)
    return tests


def test_a_git_arm_runs_with_the_default_out_from_the_projects_root(calc_repo):
    # The README's example: its git arm's session runs in a worktree, not in the runner's folder.
    res = racecheck("run", "--arms", "before,off", "--trials", 1, "-q", cwd=calc_repo)
    assert res.code == 0, res
    (out,) = (calc_repo / "racecheck-out").iterdir()
    assert _tests_per_arm(out) == {"before": CALC_TESTS, "off": CALC_TESTS}
    assert not (out / "worktrees").exists()


def test_an_env_arm_beside_a_git_arm_collects_no_run_folder(calc_repo):
    # A run killed before it removed its worktree left a copy of the project's tests behind.
    left = calc_repo / "old-run"
    (left / "worktrees" / "0123456789ab").mkdir(parents=True)
    (left / state.LOCK_NAME).touch()
    shutil.copy(calc_repo / "test_calc.py", left / "worktrees" / "0123456789ab" / "test_calc.py")
    out = calc_repo / "checks" / "out"  # absolute, inside the project
    res = racecheck("run", "--arms", "before,off", "--trials", 1, "--out", out, "-q", cwd=calc_repo)
    assert res.code == 0, res
    assert _tests_per_arm(out) == {"before": CALC_TESTS, "off": CALC_TESTS}


def test_a_project_suite_runs_from_a_subfolder_and_from_another_folder(tmp_path, monkeypatch):
    project = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    (project / "sub").mkdir()
    monkeypatch.setattr(run_location, "run_name", lambda: "run-20250101-120000")  # every run in one second
    res = racecheck("run", "--trials", 1, "-q", cwd=project / "sub")
    assert res.code == 0, res
    first = project / "racecheck-out" / "run-20250101-120000"  # at the project's root, not in sub/
    assert len(records(first)) == 4 and not (project / "sub" / "racecheck-out").exists()
    # A second run started in the same second, while the first still holds its folder.
    held = state.Lock(first)
    held.acquire()
    try:
        res = racecheck("run", "--config", "p/pyproject.toml", "--trials", 1, "-q", cwd=tmp_path)
    finally:
        held.release()
    assert res.code == 0, res
    assert len(records(project / "racecheck-out" / "run-20250101-120000-2")) == 4
    assert not (tmp_path / "racecheck-out").exists()
    # An explicit relative --out is relative to the current folder.
    res = racecheck("run", "--config", "../pyproject.toml", "--trials", 1, "--out", "o", "-q", cwd=project / "sub")
    assert res.code == 0 and len(records(project / "sub" / "o")) == 4, res


def test_shards_from_two_checkouts_merge_and_a_moved_project_resumes(tmp_path):
    project = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    config = (project / "pyproject.toml").read_text().replace('name = "tiny"\n', "")
    (project / "pyproject.toml").write_text('[project]\nname = "tiny"\nversion = "0"\n\n' + config)
    shutil.copytree(project, tmp_path / "p2")  # a second checkout, in a folder of another name
    assert racecheck("run", "--trials", 2, "--shard", "1/2", "--out", "s1", "-q", cwd=project).code == 0
    assert racecheck("run", "--trials", 2, "--shard", "2/2", "--out", "s2", "-q", cwd=tmp_path / "p2").code == 0
    # No merge writes through a link out of its folder.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / state.LOCK_NAME).touch()
    (tmp_path / "precious.csv").write_text("precious\n")
    (tmp_path / "bad" / "summary.csv").symlink_to(tmp_path / "precious.csv")
    err = one_line_error(racecheck("merge", "p/s1", "p2/s2", "--out", "bad", cwd=tmp_path))
    assert "bad/summary.csv is a symbolic link (to " in err and (tmp_path / "precious.csv").read_text() == "precious\n"
    res = racecheck("merge", "p/s1", "p2/s2", "--out", "m", cwd=tmp_path)
    assert res.code == 0 and "8 records from 2 runs merged" in res.out, res
    assert {r.scenario for r in records(tmp_path / "m")} == {"tiny"}
    # A shard whose tests differ is another suite, wherever it lies.
    shutil.copytree(tmp_path / "p2" / "s2", tmp_path / "edited")
    run = json.loads((tmp_path / "edited" / "run.json").read_text())
    run["fingerprints"]["tiny"]["test_seeded.py"] = "0" * 16
    (tmp_path / "edited" / "run.json").write_text(json.dumps(run))
    err = one_line_error(racecheck("merge", "p/s1", "edited", "--out", "m2", cwd=tmp_path))
    assert "p/s1 and edited are different runs: their suites differ (tiny: test_seeded.py changed)" in err
    # The second checkout moves, its run folder with it: the run resumes from where it lies now.
    shutil.move(tmp_path / "p2", tmp_path / "moved")
    res = racecheck("run", "--resume", "moved/s2", "--trials", 4, "-q", cwd=tmp_path)
    assert res.code == 0, res
    ran = {(r.arm, r.trial) for r in records(tmp_path / "moved" / "s2")}
    assert ran == {(a, t) for a in ("often", "never") for t in [1, *Shard(2, 2).trials(4)]}
    source = json.loads((tmp_path / "moved" / "s2" / "run.json").read_text())["source"]
    assert (source["path"], source["from_out"]) == (str(tmp_path / "moved" / "pyproject.toml"), "../pyproject.toml")


def test_no_report_replaces_a_runs_own_file_and_no_resume_writes_through_a_link(project, tmp_path):
    out = tmp_path / "out"
    assert racecheck("run", "--trials", 1, "--out", out, "-q", cwd=project).code == 0
    log = (out / "trials.jsonl").read_text()
    (tmp_path / "link.csv").symlink_to(out / "completed.jsonl")
    os.link(out / "run.json", tmp_path / "hard.json")
    own = ("out/trials.jsonl", "out/../out/run.json", "link.csv", "hard.json", "out/ranks/table.csv", "out/summary.csv")
    for target in own:
        err = one_line_error(racecheck("report", "out", "--format", "csv", "-o", target, cwd=tmp_path))
        assert f"Invalid value for --output: {target} is " in err and "a report never replaces" in err, err
    assert (out / "trials.jsonl").read_text() == log
    assert racecheck("report", "out", "--format", "csv", "-o", "out/table.csv", cwd=tmp_path).code == 0
    # A trials.jsonl that links out of the folder is never appended to, nor a folder of the run.
    foreign = tmp_path / "foreign.jsonl"
    shutil.move(out / "trials.jsonl", foreign)
    (out / "trials.jsonl").symlink_to(foreign)
    err = one_line_error(racecheck("run", "--resume", out, "--trials", 2, "-q", cwd=project))
    assert f"cannot run in {out}: {out / 'trials.jsonl'} is a symbolic link (to {foreign})" in err, err
    assert foreign.read_text() == log
    (out / "trials.jsonl").unlink()
    shutil.move(foreign, out / "trials.jsonl")
    shutil.move(out / "logs", tmp_path / "logs")
    (out / "logs").symlink_to(tmp_path / "logs")
    err = one_line_error(racecheck("run", "--resume", out, "--trials", 2, "-q", cwd=project))
    assert f"{out / 'logs'} is a symbolic link" in err and len(list((tmp_path / "logs").iterdir())) == 1, err
