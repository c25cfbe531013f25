"""Git-revision arms: two commits of a tiny repository, each run in its own (reused) worktree."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from run_kit import racecheck, records, summary_counts, write_suite

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

TEST_CALC = """
from calc import add

def test_add():
    assert add(2, 3) == 5

def test_zero():
    assert add(0, 0) == 0
"""


pytestmark = pytest.mark.usefixtures("fast_sessions")


def git(*args, cwd):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path):
    """Commit 1 has a buggy add(); commit 2 (HEAD) fixes it. The suite lives in a subfolder."""
    root = tmp_path / "repo"
    project = write_suite(
        root / "proj",
        tests={"test_calc.py": TEST_CALC},
        arms={
            "old": {"git": "HEAD~1", "expect": "race"},
            "new": {"git": "HEAD", "expect": "safe"},
            "bogus": {"git": "no-such-branch"},
        },
        suite='default_arms = ["old", "new"]',
    )
    git("init", "-q", cwd=root)
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git("add", ".", cwd=root)
    git("commit", "-q", "-m", "buggy", cwd=root)
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git("commit", "-q", "-am", "fixed", cwd=root)
    (project / "calc.py").write_text("def add(a, b):\n    raise RuntimeError('uncommitted')\n")
    return project


def test_git_revision_arms_run_two_commits(repo, tmp_path):
    out = tmp_path / "out"
    res = racecheck("run", "--trials", 3, "--out", out, "-q", cwd=repo)
    assert res.code == 0, res
    counts = summary_counts(out)
    assert counts[("old", "*")] == (3, 3)  # the buggy commit, not the working tree's edit
    assert counts[("old", "test_zero")] == (0, 3)
    assert counts[("new", "*")] == (0, 3)
    failing = [r for r in records(out) if r.outcome == "failed"]
    assert {r.signature for r in failing} == {"AssertionError at test_calc.py:5 in test_add"}
    # Both arms' worktrees were removed at the end, and git forgot them.
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1 and not (out / "worktrees").exists()
    # One session per arm (3 trials fit one chunk): the worktree is reused, not re-made, per trial.
    assert len(list((out / "logs").iterdir())) == 2


def test_an_unknown_revision_is_a_usage_error(repo, tmp_path):
    res = racecheck("run", "--arms", "old,bogus", "--trials", 1, "--out", tmp_path / "out", cwd=repo)
    assert res.code == 2, res
    assert res.err.startswith("racecheck: error: unknown git revision 'no-such-branch' in ")
    assert res.err.count("\n") == 1 and "Traceback" not in res.err
