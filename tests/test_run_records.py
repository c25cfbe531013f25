"""A run folder's files are validated once, where they are read: a trial record whose field has
the wrong type or range, a log that cannot be read and a run.json setting that does not read back
are one line and exit 2 in `report`, `gate`, `merge` and `--resume`, never a traceback or a count."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from run_kit import SEEDED_TEST, one_line_error, racecheck, summary_counts, write_suite

pytestmark = pytest.mark.usefixtures("fast_sessions")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished run of two trials (copied by each test that changes it) and its project."""
    base = tmp_path_factory.mktemp("finished")
    root = write_suite(base / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        res = racecheck("run", "--trials", 2, "--out", base / "out", "-q", cwd=root)
    assert res.code == 0, res
    return root, base / "out"


def _copy(finished, tmp_path):
    root, out = finished
    shutil.copytree(out, tmp_path / "out")
    return root, tmp_path / "out"


def _commands(out):
    return {
        "report": ("report", out),
        "gate": ("gate", out, "--fixed", "never", "--baseline", "often"),
        "resume": ("run", "--resume", out, "-q"),
    }


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("trial", "zero", "field trial is 'zero', not a whole number"),
        ("trial", True, "field trial is True, not a whole number"),
        ("trial", -1, "field trial is -1, not a trial index (0 or more)"),
        ("outcome", "weird", "unknown outcome 'weird' (known: passed, skipped, failed, error, timeout, crash)"),
        ("outcome", None, "field outcome is None, not a string"),
        ("arm", ["often"], "field arm is ['often'], not a string"),
        ("duration", "slow", "field duration is 'slow', not a number"),
        ("actions", [1], "field actions is [1], not an object or null"),
        ("expect", "maybe", "field expect is 'maybe', not 'race', 'safe' or ''"),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_is_one_line_and_exit_2(finished, tmp_path, field, value, message):
    root, out = _copy(finished, tmp_path)
    log = out / "trials.jsonl"
    lines = log.read_text().splitlines()
    bad = json.loads(lines[2])
    bad[field] = value
    log.write_text("\n".join(lines[:2] + [json.dumps(bad)] + lines[3:]) + "\n")
    for name, args in _commands(out).items():
        err = one_line_error(racecheck(*args, cwd=root))
        assert f"trials.jsonl:3: not a trial record: {message}" in err, (name, err)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/mem")
def test_a_log_that_cannot_be_read_is_one_line_and_exit_2(finished, tmp_path):
    root, out = _copy(finished, tmp_path)
    (out / "trials.jsonl").unlink()
    (out / "trials.jsonl").symlink_to("/proc/self/mem")  # opens, and every read fails (EIO), even for root
    for name, args in _commands(out).items():
        err = one_line_error(racecheck(*args, cwd=root))
        # --resume, which would append to the log, refuses the link before it reads anything.
        said = "trials.jsonl is a symbolic link" if name == "resume" else "trials.jsonl: unreadable: Input/output error"
        assert said in err, (name, err)
    (out / "trials.jsonl").unlink()
    (out / "trials.jsonl").mkdir()
    for name, args in _commands(out).items():
        err = one_line_error(racecheck(*args, cwd=root))
        assert "trials.jsonl: unreadable: Is a directory" in err, (name, err)


def _every_reader(out, tmp_path):
    """Each command that reads the run folder `out`: report, gate, --resume and merge (with `out`
    first, beside a copy of the finished run)."""
    other = tmp_path / "other"
    return {**_commands(out), "merge": ("merge", out, other, "--out", tmp_path / "m")}


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("chunk", 0, "run.json: chunk: 0 is below 1"),
        ("trials", "x", "run.json: trials: 'x' is not a whole number"),
        ("trials", -3, "run.json: trials: -3 is below 1"),
        ("isolation", "threads", "run.json: isolation: 'threads' is not one of session, process"),
        ("timeout", 0, "run.json: timeout: 0 is not a number of seconds from 1 to 604800 (a week)"),
        ("timeout", float("nan"), "run.json: timeout: nan is not a number of seconds"),  # a bare NaN in the file
        ("pytest_args", "-x", "run.json: pytest_args: '-x' is not a list of strings"),
        ("perturb", "sleep@nowhere", "run.json: perturb: unknown injection point 'nowhere'"),
        ("attempts", [{"trials": -1}], "run.json: attempts: trials -1 is not a whole number of at least 1"),
        ("skipped", {"s": 5}, "run.json: skipped: 's' is not described by its arms and why it was skipped"),
    ],
)
def test_a_run_json_setting_that_does_not_read_back_is_one_line_and_exit_2(finished, tmp_path, setting, value, message):
    root, out = _copy(finished, tmp_path)
    shutil.copytree(finished[1], tmp_path / "other")
    run = json.loads((out / "run.json").read_text())
    run[setting] = value
    (out / "run.json").write_text(json.dumps(run))
    for name, args in _every_reader(out, tmp_path).items():
        err = one_line_error(racecheck(*args, cwd=root))
        assert f"{out}: {message}" in err or f"{out / message}" in err, (name, err)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"[1, 2]", "run.json: not a JSON object"), (b"\x89PNG\r\n\x1a\n\x00\xff", "run.json: unreadable: ")],
)
def test_a_run_json_that_is_no_object_is_one_line_and_exit_2(finished, tmp_path, content, message):
    root, out = _copy(finished, tmp_path)
    shutil.copytree(finished[1], tmp_path / "other")
    (out / "run.json").write_bytes(content)
    for name, args in _every_reader(out, tmp_path).items():
        assert f"{out / message}" in one_line_error(racecheck(*args, cwd=root)), name


def test_a_completed_log_that_is_a_folder_is_one_line_and_exit_2(finished, tmp_path):
    root, out = _copy(finished, tmp_path)
    shutil.copytree(finished[1], tmp_path / "other")
    (out / "completed.jsonl").unlink()
    (out / "completed.jsonl").mkdir()
    for name, args in _every_reader(out, tmp_path).items():
        err = one_line_error(racecheck(*args, cwd=root))
        assert f"{out / 'completed.jsonl'}: " in err and ("not a file" in err or "Is a directory" in err), (name, err)


@pytest.mark.parametrize("where", ["trials.jsonl", "completed.jsonl"])
def test_a_trial_past_the_runs_plan_is_one_line_and_exit_2(finished, tmp_path, where):
    # `"trial": 10**30` was tallied as a trial of its own: "often 2/3 failed" beside test rows of 2.
    root, out = _copy(finished, tmp_path)
    shutil.copytree(finished[1], tmp_path / "other")
    lines = (out / where).read_text().splitlines()
    phantom = json.loads(lines[0])
    phantom["trial"] = 10**30
    (out / where).write_text("\n".join([*lines, json.dumps(phantom)]) + "\n")
    attempts = len(json.loads((out / "run.json").read_text())["attempts"])
    for name, args in _every_reader(out, tmp_path).items():
        err = one_line_error(racecheck(*args, cwd=root))
        expected = f"{out / where}:{len(lines) + 1}: trial {10**30} lies outside the run's 2 planned trial(s) (0 to 1"
        assert expected in err, (name, err)
    assert len(json.loads((out / "run.json").read_text())["attempts"]) == attempts  # the refused resume wrote nothing


def test_a_resume_to_fewer_trials_keeps_the_trials_it_ran_within_the_plan(finished, tmp_path):
    root, out = _copy(finished, tmp_path)
    assert racecheck("run", "--resume", out, "--trials", 1, "-q", cwd=root).code == 0
    assert json.loads((out / "run.json").read_text())["trials"] == 1
    for args in _commands(out).values():  # trial 1, from the first attempt, is no phantom
        assert racecheck(*args, cwd=root).code == 0, args
    assert summary_counts(out)[("often", "*")][1] == 2
