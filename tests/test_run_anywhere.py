"""`racecheck run` from any folder, and run folders kept safe: a session finds every file the
runner gives it whatever folder it runs in (a git arm's worktree, the project's root); the default
`--out` lies in the project's root and is a new folder for every run, even two in one second; an
env arm beside a git arm collects only its own tests, never a run folder's copy of them."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from run_kit import SEEDED_TEST, racecheck, records, write_suite

from racecheck.runner import run_folder, state

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
    monkeypatch.setattr(run_folder, "run_name", lambda: "run-20250101-120000")  # every run in one second
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
