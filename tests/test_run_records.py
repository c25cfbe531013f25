"""A run folder's files are validated once, where they are read: a trial record whose field has
the wrong type or range, a log that cannot be read and a run.json setting that does not read back
are one line and exit 2 in `report`, `gate`, `merge` and `--resume`, never a traceback or a count."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from run_kit import SEEDED_TEST, racecheck, write_suite

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


def _one_line(res, code=2) -> str:
    assert res.code == code, res
    assert res.err.count("\n") == 1 and "Traceback" not in res.err, res
    return res.err.strip()


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
        err = _one_line(racecheck(*args, cwd=root))
        assert f"trials.jsonl:3: not a trial record: {message}" in err, (name, err)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/mem")
def test_a_log_that_cannot_be_read_is_one_line_and_exit_2(finished, tmp_path):
    root, out = _copy(finished, tmp_path)
    (out / "trials.jsonl").unlink()
    (out / "trials.jsonl").symlink_to("/proc/self/mem")  # opens, and every read fails (EIO), even for root
    for name, args in _commands(out).items():
        err = _one_line(racecheck(*args, cwd=root))
        assert "trials.jsonl: unreadable: Input/output error" in err, (name, err)
    (out / "trials.jsonl").unlink()
    (out / "trials.jsonl").mkdir()
    for name, args in _commands(out).items():
        err = _one_line(racecheck(*args, cwd=root))
        assert "trials.jsonl: unreadable: Is a directory" in err, (name, err)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("chunk", 0, "run.json: chunk: 0 is below 1"),
        ("trials", "x", "run.json: trials: 'x' is not a whole number"),
        ("isolation", "threads", "run.json: isolation: 'threads' is not one of session, process"),
        ("timeout", 0, "run.json: timeout: 0 is not a number of seconds from 1 to 604800 (a week)"),
        ("pytest_args", "-x", "run.json: pytest_args: '-x' is not a list of strings"),
        ("perturb", "sleep@nowhere", "run.json: perturb: unknown injection point 'nowhere'"),
    ],
)
def test_a_run_json_setting_that_does_not_read_back_is_one_line_and_exit_2(finished, tmp_path, setting, value, message):
    root, out = _copy(finished, tmp_path)
    run = json.loads((out / "run.json").read_text())
    run[setting] = value
    (out / "run.json").write_text(json.dumps(run))
    err = _one_line(racecheck("run", "--resume", out, "-q", cwd=root))
    assert message in err, err
    shutil.copytree(finished[1], tmp_path / "other")
    err = _one_line(racecheck("merge", tmp_path / "other", out, "--out", tmp_path / "m", cwd=root))
    assert message in err, err


def test_a_run_json_that_is_no_object_is_one_line_and_exit_2(finished, tmp_path):
    root, out = _copy(finished, tmp_path)
    (out / "run.json").write_text("[1, 2]")
    err = _one_line(racecheck("run", "--resume", out, "-q", cwd=root))
    assert "run.json: not a JSON object" in err, err
