"""Interrupted runs resumed, and shards merged, end with the counts of one uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from run_kit import SEEDED_TEST, expected_failures, racecheck, records, summary_counts, write_suite

from racecheck.runner import interrupts

# test_slow keeps an interrupted run busy until the interrupt lands; SLOW_S=0 once nothing is.
SLOW_SEEDED = (
    SEEDED_TEST + "\nimport time\n\ndef test_slow():\n    time.sleep(float(os.environ.get('SLOW_S', '0.15')))\n"
)


pytestmark = pytest.mark.usefixtures("fast_sessions")


def _wait_for_records(path, count, proc, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} records in {path} after {limit} s")


def _wait_gone(pid, limit=20.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs {limit} s after its runner was killed")


def test_sigkill_in_the_middle_then_resume_gives_the_uninterrupted_counts(tmp_path, monkeypatch):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SLOW_SEEDED})
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "racecheck", "run", "--trials", "8", "--seed", "11", "--out", str(out), "-q"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_records(out / "trials.jsonl", 10, proc)  # inside trial 1 (6 tests per trial)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(records(out))
    assert 10 <= before < 48  # interrupted mid-run; every finished outcome is on disk
    runner = json.loads((out / "runner.json").read_text())
    session = runner["session"]["pid"]
    _wait_gone(session)  # the session died with its runner: no orphan holds the folder's ranks

    monkeypatch.setenv("SLOW_S", "0")  # the resume and the uninterrupted run are not interrupted
    res = racecheck("run", "--resume", out, "-q", cwd=root)
    assert res.code == 0, res
    full = racecheck("run", "--trials", 8, "--seed", 11, "--out", tmp_path / "full", "-q", cwd=root)
    assert full.code == 0, full
    assert summary_counts(out) == summary_counts(tmp_path / "full")
    assert summary_counts(out)[("often", "*")] == expected_failures({"often": 0.6}, range(8), seed=11)[("often", "*")]
    assert len(json.loads((out / "run.json").read_text())["attempts"]) == 2
    done = {
        (json.loads(ln)["arm"], json.loads(ln)["trial"]) for ln in (out / "completed.jsonl").read_text().splitlines()
    }
    assert done == {(a, t) for a in ("often", "never") for t in range(8)}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_session_keeps_the_outcomes_and_says_how_to_resume(tmp_path, sig):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SLOW_SEEDED})
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "racecheck", "run", "--trials", "50", "--out", str(out), "-q"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_records(out / "trials.jsonl", 4, proc)
    session = json.loads((out / "runner.json").read_text())["session"]["pid"]
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"continue with: racecheck run --resume {out}" in stderr
    with pytest.raises(ProcessLookupError):
        os.kill(session, 0)
    assert not (out / "runner.json").exists() and (out / "summary.csv").exists()
    assert len(records(out)) >= 4


def test_a_sigterm_while_the_run_writes_its_table_exits_130_and_leaves_summary_csv_whole(tmp_path):
    """The signal comes when the run has finished its trials and tallies them (signal_at.py)."""
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    out = tmp_path / "out"
    late = [sys.executable, str(Path(__file__).with_name("signal_at.py")), "racecheck.results.tally.write_summary"]
    proc = subprocess.run(
        [*late, "before", "--", "run", "--trials", "3", "--out", str(out), "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc
    last = proc.stderr.splitlines()[-1]  # after the lines of the first failures
    assert last == f"racecheck: interrupted; finished trials are in {out}; continue with: racecheck run --resume {out}"
    assert summary_counts(out) == expected_failures({"often": 0.6, "never": 0.0}, range(3))
    assert (out / "summary.csv").read_text() == racecheck("report", out, "--format", "csv", cwd=root).out


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_lost_in_a_finalizer_still_stops_the_run_at_the_next_poll():
    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # handled in here: its KeyboardInterrupt is "ignored"

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs under nohup or `cmd &`
    with interrupts.handled():
        Finalized()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()  # what the session loop calls at every poll
    interrupts.check()  # nothing left pending once the run is over
    assert signal.getsignal(signal.SIGINT) is before


def test_resume_continues_to_a_larger_trial_count_and_refuses_new_settings(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    out = tmp_path / "out"
    assert racecheck("run", "--trials", 3, "--out", out, "-q", cwd=root).code == 0
    res = racecheck("run", "--resume", out, "--trials", 6, "-q", cwd=root)
    assert res.code == 0, res
    assert summary_counts(out) == expected_failures({"often": 0.6, "never": 0.0}, range(6))
    assert [r.trial for r in records(out)][-1] == 5 and len(records(out)) == 24  # nothing rerun
    res = racecheck("run", "--resume", out, "--seed", 3, cwd=root)
    assert res.code == 2 and res.err.strip() == (
        "racecheck: error: --seed cannot be given with --resume: the "
        "run's settings come from its run.json (see 'racecheck run --help')"
    )
    res = racecheck("run", "--arms", "often", "--out", out, cwd=root)
    assert res.code == 2 and "already holds a run" in res.err


def test_two_shards_merged_equal_one_unsharded_run(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "rarely": {}}, tests={"test_seeded.py": SEEDED_TEST})
    for shard in ("1/2", "2/2"):
        res = racecheck("run", "--trials", 7, "--shard", shard, "--out", tmp_path / f"s{shard[0]}", "-q", cwd=root)
        assert res.code == 0, res
    assert {r.trial for r in records(tmp_path / "s1")} == {0, 1, 2}
    assert {r.trial for r in records(tmp_path / "s2")} == {3, 4, 5, 6}
    res = racecheck("merge", tmp_path / "s1", tmp_path / "s2", "--out", tmp_path / "merged", cwd=root)
    assert res.code == 0, res
    assert "28 records from 2 runs merged" in res.out  # 7 trials x 2 arms x 2 tests
    assert racecheck("run", "--trials", 7, "--out", tmp_path / "whole", "-q", cwd=root).code == 0
    assert (
        summary_counts(tmp_path / "merged")
        == summary_counts(tmp_path / "whole")
        == expected_failures({"often": 0.6, "rarely": 0.2}, range(7))
    )
    # The merged folder describes the whole run: resuming it has nothing left to do.
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["shard"] == "1/1"
    res = racecheck("run", "--resume", tmp_path / "merged", "-q", cwd=root)
    assert res.code == 0 and len(records(tmp_path / "merged")) == 28, res


def test_merge_refuses_overlapping_or_different_runs(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    assert racecheck("run", "--trials", 2, "--out", tmp_path / "a", "-q", cwd=root).code == 0
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    res = racecheck("merge", tmp_path / "a", tmp_path / "copy", "--out", tmp_path / "m", cwd=root)
    assert res.code == 2 and "both hold trial 0 of arm 'often'" in res.err and res.err.count("\n") == 1
    assert racecheck("run", "--trials", 2, "--seed", 5, "--out", tmp_path / "b", "-q", cwd=root).code == 0
    res = racecheck("merge", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "m", cwd=root)
    assert res.code == 2 and "their seed differs (0 vs 5)" in res.err
    res = racecheck("merge", tmp_path / "a", tmp_path / "nothing", "--out", tmp_path / "m", cwd=root)
    assert res.code == 2 and "no trials.jsonl" in res.err
