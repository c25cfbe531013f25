"""A run's folder stays its own: `--out` takes no folder that holds someone else's files (nor one
behind a symbolic link), `--resume` refuses a suite that changed since the run started unless
asked, its hints quote the folder for the shell, and a forged runner.json gets no foreign process
killed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import psutil
import pytest
from run_kit import one_line_error, racecheck, records

from racecheck.runner import state

pytestmark = pytest.mark.usefixtures("fast_sessions")


def test_out_refuses_a_folder_of_someone_elses_files_and_a_link_to_one(project, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.csv").write_text("precious\n")
    err = one_line_error(racecheck("run", "--trials", 1, "--out", mine, "-q", cwd=project))
    assert err.startswith(f"racecheck: error: Invalid value for --out: {mine} holds files and no racecheck run;"), err
    (tmp_path / "link").symlink_to(mine)
    err = one_line_error(racecheck("run", "--trials", 1, "--out", tmp_path / "link", "-q", cwd=project))
    assert f"{tmp_path / 'link'} (a link to {mine}) holds files and no racecheck run" in err
    assert os.listdir(mine) == ["summary.csv"] and (mine / "summary.csv").read_text() == "precious\n"


def test_a_folder_name_longer_than_the_file_system_allows_is_one_line_and_exit_2(project, tmp_path):
    long = "x" * 300  # past NAME_MAX (255 on Linux's file systems): every lookup fails with ENAMETOOLONG
    said = f"{long[:40]}...{long[-12:]}: a name of 300 bytes, longer than the file system allows (255)"
    for args in (
        ("run", "--trials", 1, "--out", long, "-q"),
        ("run", "--resume", tmp_path / long, "-q"),
        ("report", long),
        ("gate", long, "--fixed", "often", "--baseline", "never"),
        ("merge", "--out", tmp_path / "m", long, tmp_path / "other"),
        ("merge", "--out", f"a/{long}/b", tmp_path / "one", tmp_path / "other"),
    ):
        err = one_line_error(racecheck(*args, cwd=project))
        assert "a name of 300 bytes, longer than the file system allows (255)" in err, (args, err)
    assert said in one_line_error(racecheck("report", long, cwd=project))
    assert not any(p.name.startswith("xxx") for p in project.iterdir())


def test_a_folder_holding_only_follower_nodes_folders_is_taken(tmp_path):
    # On a shared file system node 1 creates OUT/nodes/node-1 before node 0 takes OUT.
    (tmp_path / "out" / "nodes" / "node-1").mkdir(parents=True)
    state.check_out_folder(tmp_path / "out")
    (tmp_path / "out" / "nodes" / "notes.txt").write_text("mine\n")
    with pytest.raises(state.ForeignFolder, match="holds files and no racecheck run"):
        state.check_out_folder(tmp_path / "out")


def test_an_empty_folder_is_taken_and_a_run_folder_resumed(project, tmp_path):
    (tmp_path / "empty").mkdir()
    assert racecheck("run", "--trials", 1, "--out", tmp_path / "empty", "-q", cwd=project).code == 0
    assert state.is_run_folder(tmp_path / "empty")
    res = racecheck("run", "--resume", tmp_path / "empty", "--trials", 2, "-q", cwd=project)
    assert res.code == 0 and len(records(tmp_path / "empty")) == 8, res


def test_resume_refuses_a_changed_suite_unless_asked_and_names_its_options_as_spelled(project, tmp_path):
    out = tmp_path / "out"
    assert racecheck("run", "--trials", 1, "--out", out, "-q", cwd=project).code == 0
    with open(project / "test_seeded.py", "a") as fh:
        fh.write("\n\ndef test_added():\n    pass\n")
    (project / "test_other.py").write_text("def test_more():\n    pass\n")
    err = one_line_error(racecheck("run", "--resume", out, "--trials", 2, "-q", cwd=project))
    assert (
        f"cannot resume {out}: the suite changed since the run started (tiny: test_other.py added, "
        "test_seeded.py changed)" in err
    ), err
    assert "--allow-changed-suite" in err and len(records(out)) == 4  # nothing ran
    res = racecheck("run", "--resume", out, "--trials", 2, "--allow-changed-suite", "-q", cwd=project)
    assert res.code == 0 and "warning: the suite changed since the run started" in res.err, res
    assert len(records(out)) == 4 + 2 * 4  # two arms of trial 1, each of its four tests
    assert racecheck("run", "--resume", out, "--trials", 2, "-q", cwd=project).code == 0  # now the kept state
    for option in ("--config", "--out", "--scenarios"):
        err = one_line_error(racecheck("run", "--resume", out, option, "x", cwd=project))
        assert f"error: {option} cannot be given with --resume" in err, err
    err = one_line_error(racecheck("run", "--allow-changed-suite", "--out", tmp_path / "new", cwd=project))
    assert "--allow-changed-suite needs --resume" in err


def test_the_resume_hints_quote_the_folder_for_the_shell(project, tmp_path):
    out = tmp_path / "it's $(touch gotcha)"
    # One session per block, so the rules are judged before trial 1 starts (in one session the
    # ranks can finish both trials before the runner reads trial 0's outcome).
    res = racecheck(
        "run", "--trials", 2, "--stop-when", "never:clean>=1", "--isolation", "process", "--out", out, "-q", cwd=project
    )
    assert res.code == 0, res
    hint = next(line for line in res.out.splitlines() if line.startswith("stopped early"))
    assert shlex.split(hint.split("continue with: ", 1)[1]) == ["racecheck", "run", "--resume", str(out)], hint
    err = one_line_error(racecheck("run", "--trials", 1, "--out", out, cwd=project))
    assert shlex.split(err.split("continue it: ", 1)[1]) == ["racecheck", "run", "--resume", str(out)], err
    assert not (project / "gotcha").exists()


def _acquire(folder, session) -> list[int]:
    """What a new runner's lock kills, given the session that runner.json names."""
    (folder / "runner.json").write_text(json.dumps({"runner": None, "session": session}))
    lock = state.Lock(folder)
    try:
        return lock.acquire()
    finally:
        lock.release()


def _identity(proc) -> dict:
    return {"pid": proc.pid, "started": psutil.Process(proc.pid).create_time(), "cmdline": ["sleep", "60"]}


def test_a_left_over_session_is_killed_only_when_its_identity_and_token_prove_it(tmp_path):
    runner = state.Lock(tmp_path)  # the runner that started `ours`
    ours = subprocess.Popen(["sleep", "60"], env={**os.environ, **runner.session_env()})
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        # A forged runner.json: the foreign process's pid, start time and command line, and a token.
        assert _acquire(tmp_path, {**_identity(foreign), "token": runner.token}) == []
        for wrong in (
            {**_identity(ours), "cmdline": ["python", "-m", "pytest"], "token": runner.token},
            {**_identity(ours), "started": 1.0, "token": runner.token},
            {**_identity(ours), "token": "0" * 32},
            _identity(ours),  # written without a token
        ):
            assert _acquire(tmp_path, wrong) == [], wrong
        assert foreign.poll() is None and ours.poll() is None
        assert _acquire(tmp_path, {**_identity(ours), "token": runner.token}) == [ours.pid]
        assert ours.wait(timeout=10) is not None and foreign.poll() is None
    finally:
        ours.kill()
        foreign.kill()
