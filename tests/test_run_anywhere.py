"""`racecheck run` from any folder, and run folders kept safe: an env arm beside a git arm collects
only its own tests, never a run folder's copy of them."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from run_kit import racecheck, records, write_suite

from racecheck.runner import state

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
