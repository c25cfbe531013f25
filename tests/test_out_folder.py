"""A run's folder stays its own: `--out` takes no folder that holds someone else's files (nor one
behind a symbolic link)."""

from __future__ import annotations

import os

import pytest
from test_runner import SEEDED_TEST, racecheck, records, write_suite

from racecheck.runner import state


@pytest.fixture(autouse=True)
def _fast_sessions(monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def project(tmp_path):
    return write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})


def _one_line(res, code=2) -> str:
    assert res.code == code, res
    assert res.err.count("\n") == 1 and "Traceback" not in res.err, res
    return res.err.strip()


def test_out_refuses_a_folder_of_someone_elses_files_and_a_link_to_one(project, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.csv").write_text("precious\n")
    err = _one_line(racecheck("run", "--trials", 1, "--out", mine, "-q", cwd=project))
    assert err.startswith(f"racecheck: error: Invalid value for --out: {mine} holds files and no racecheck run;"), err
    (tmp_path / "link").symlink_to(mine)
    err = _one_line(racecheck("run", "--trials", 1, "--out", tmp_path / "link", "-q", cwd=project))
    assert f"{tmp_path / 'link'} (a link to {mine}) holds files and no racecheck run" in err
    assert os.listdir(mine) == ["summary.csv"] and (mine / "summary.csv").read_text() == "precious\n"


def test_an_empty_folder_is_taken_and_a_run_folder_resumed(project, tmp_path):
    (tmp_path / "empty").mkdir()
    assert racecheck("run", "--trials", 1, "--out", tmp_path / "empty", "-q", cwd=project).code == 0
    assert state.is_run_folder(tmp_path / "empty")
    res = racecheck("run", "--resume", tmp_path / "empty", "--trials", 2, "-q", cwd=project)
    assert res.code == 0 and len(records(tmp_path / "empty")) == 8, res
