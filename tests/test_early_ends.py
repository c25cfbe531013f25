"""Trials that end early: a crash or a hang ends a session inside a trial, and the run still runs
every test of every trial; a rank that dies takes the blame for its own test only."""

from __future__ import annotations

import json
import time

import pytest
from run_kit import racecheck, records, summary_counts, write_suite

pytestmark = pytest.mark.usefixtures("fast_sessions")

CRASH_THEN_HANG = """
import os, time

def test_a_ok():
    pass

def test_b_crash():
    os._exit(7)

def test_c_hang():
    time.sleep(600)

def test_d_ok():
    pass
"""


def test_a_crash_and_a_hang_leave_the_tests_after_them_to_the_next_session(tmp_path):
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": CRASH_THEN_HANG})
    res = racecheck("run", "--trials", 1, "--timeout", 1, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    outcomes = {r.test.split("::")[-1]: r.outcome for r in records(tmp_path / "out")}
    assert outcomes == {"test_a_ok": "passed", "test_b_crash": "crash", "test_c_hang": "timeout", "test_d_ok": "passed"}
    counts = summary_counts(tmp_path / "out")
    assert {t: counts[("a", t)] for t in outcomes} == {
        "test_a_ok": (0, 1),
        "test_b_crash": (1, 1),
        "test_c_hang": (1, 1),
        "test_d_ok": (0, 1),
    }
    assert counts[("a", "*")] == (1, 1)
    # One trial, finished once, with the worst of its tests, over the three sessions that ran it.
    done = [json.loads(ln) for ln in (tmp_path / "out" / "completed.jsonl").read_text().splitlines()]
    assert [(d["trial"], d["outcome"], d["records"]) for d in done] == [(0, "crash", 4)]
    assert len(list((tmp_path / "out" / "logs").iterdir())) == 3


# Both ranks meet in test_b before rank 1 exits, as ranks kept in step by their collectives would:
# test_a is over on both, whichever rank ran ahead (the ranks share no process group here).
RANK_EXIT = """
import os
import pathlib
import time

def test_a_ok():
    pass

def test_b_rank_exit():
    met = pathlib.Path(__file__).with_name("met_in_b")
    met.mkdir(exist_ok=True)
    (met / os.environ["RANK"]).touch()
    while len(list(met.iterdir())) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    if os.environ["RANK"] == "1":
        os._exit(7)

def test_c_ok():
    pass
"""


def test_a_rank_that_exits_in_one_test_is_that_tests_crash_not_the_next_ones(tmp_path):
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": RANK_EXIT})
    res = racecheck("run", "--trials", 1, "--world-size", 2, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    outcomes = sorted((r.trial, r.test.split("::")[-1], r.outcome) for r in records(tmp_path / "out"))
    assert outcomes == [
        (0, test, outcome)
        for test, outcome in (("test_a_ok", "passed"), ("test_b_rank_exit", "crash"), ("test_c_ok", "passed"))
    ]
    crash = next(r for r in records(tmp_path / "out") if r.outcome == "crash")
    assert crash.signature == "crash: rank 1 died without a report (exit code 7)", crash  # the rank that exited


def test_a_million_trials_are_planned_as_they_run_and_max_time_still_stops_them(tmp_path):
    from racecheck.runner import blocks

    plans = blocks.sessions(
        blocks.blocks(["a", "b"], range(10**9), seed=0, order="random"),
        groups=[("a", "b")],
        isolation="session",
        chunk=5,
        seed=0,
        order="random",
    )
    first = next(plans)  # at once: nothing is listed beyond the first session
    assert len(first.blocks) == blocks.SESSION_BLOCKS and first.blocks[-1].trial == blocks.SESSION_BLOCKS // 2 - 1
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": "def test_ok():\n    pass\n"})
    started = time.monotonic()
    # A million trials, and more than a range's len() can count.
    res = racecheck("run", "--trials", 10**20, "--max-time", 1, "--out", tmp_path / "out", cwd=root)
    assert res.code == 0 and "stopped early: --max-time was reached" in res.out, res
    assert time.monotonic() - started < 30, "the first session must not plan a million trials"
    assert res.err.splitlines()[0] == f"trials: {10**20} planned"
    _, trials = summary_counts(tmp_path / "out")[("a", "*")]
    assert 0 < trials < blocks.SESSION_BLOCKS * 10


def test_more_shards_than_trials_leave_empty_shards_that_exit_0_and_merge(tmp_path):
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": "def test_ok():\n    pass\n"})
    ran = {}
    for i in range(1, 6):  # 2 trials over 5 shards: shards 3 and 5 hold one trial each
        res = racecheck("run", "--trials", 2, "--shard", f"{i}/5", "--out", tmp_path / f"s{i}", "-q", cwd=root)
        assert res.code == 0, res
        ran[i] = "nothing to run" not in res.out
        if not ran[i]:
            assert res.out.splitlines()[-1].startswith(
                f"shard {i}/5: nothing to run (2 trial(s) split 5 ways leave this shard none)"
            ), res
    assert ran == {1: False, 2: False, 3: True, 4: False, 5: True}
    res = racecheck("merge", *(tmp_path / f"s{i}" for i in range(1, 6)), "--out", tmp_path / "all", cwd=root)
    assert res.code == 0, res
    assert summary_counts(tmp_path / "all")[("a", "*")] == (0, 2)


def test_a_console_closed_under_the_run_costs_its_lines_not_the_run(tmp_path):
    """`racecheck run ... 2>&1 | head -2`: the reader goes away after two lines."""
    import contextlib
    import io
    import os
    import sys

    from racecheck.cli import main

    root = write_suite(
        tmp_path / "p",
        arms={"a": {}},
        tests={"test_x.py": "def test_odd(racecheck_seed):\n    assert racecheck_seed % 2 == 0\n"},
    )
    read, write = os.pipe()
    os.close(read)  # head has read its two lines and exited
    console = io.TextIOWrapper(os.fdopen(write, "wb"), line_buffering=True)
    argv, cwd, code = sys.argv, os.getcwd(), None
    sys.argv = ["racecheck", "run", "--trials", "10", "--out", str(tmp_path / "out")]
    try:
        os.chdir(root)
        with contextlib.redirect_stdout(console), contextlib.redirect_stderr(console):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = argv
        os.chdir(cwd)
        with contextlib.suppress(OSError):
            console.close()
    assert code == 0
    assert summary_counts(tmp_path / "out")[("a", "*")] == (5, 10)  # every trial ran; summary.csv written


DAEMON_THEN_HANG = """
import subprocess, time

def test_daemon_then_hang():
    # A daemon of its own session (setsid forks, the parent exits): neither in the session's
    # process tree nor in its process group.
    subprocess.run(["setsid", "-f", "sh", "-c", "echo $$ > {pid_file}; exec sleep 600"], check=True)
    time.sleep(600)
"""


def test_a_hung_session_takes_the_daemon_its_test_started_with_it(tmp_path):
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    pid_file = tmp_path / "daemon.pid"
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_d.py": DAEMON_THEN_HANG.format(pid_file=pid_file)})
    res = racecheck("run", "--trials", 1, "--timeout", 1, "--out", tmp_path / "out", "-q", cwd=root)
    pid = int(pid_file.read_text())
    try:
        assert res.code == 0 and [r.outcome for r in records(tmp_path / "out")] == ["timeout"], res
        assert not running(pid), "the daemon outlived its session"
    finally:
        if running(pid):
            psutil.Process(pid).kill()


def test_a_crash_names_the_rank_torchrun_found_failing_first(tmp_path):
    from racecheck.runner.session import crash_signature

    log = tmp_path / "session.log"
    log.write_text(
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-05_03:10:00\n  host      : box\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 123)\n  error_file: <N/A>\n"
    )
    assert crash_signature(1, log) == "crash: rank 1 killed by SIGKILL"
    log.write_text(log.read_text().replace("-9 (pid", "3 (pid"))
    assert crash_signature(1, log) == "crash: rank 1 died without a report (exit code 3)"
    # torchrun's root cause may be a survivor it stopped (SIGTERM): the rank that failed is named
    log.write_text(
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 9)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 7 (pid: 8)\n"
    )
    assert crash_signature(1, log) == "crash: rank 1 died without a report (exit code 7)"
    # several ranks failing: the root cause, though torchrun lists the others first
    log.write_text(
        "Failures:\n[1]:\n  rank      : 2 (local_rank: 2)\n  exitcode  : 1 (pid: 9)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 8)\n"
    )
    assert crash_signature(1, log) == "crash: rank 1 killed by SIGKILL"
    log.write_text("")
    assert crash_signature(-9, log) == "crash: killed by SIGKILL"
