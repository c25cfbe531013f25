"""The trial runner on small pytest projects written for the purpose in tmp_path (world size 1).

The helpers (write_suite, racecheck, summary_counts, expected_failures) are in run_kit.py, the
fixtures in conftest.py.
"""

from __future__ import annotations

import json

import pytest
from run_kit import ALWAYS, RATES, SEEDED_TEST, expected_failures, racecheck, records, summary_counts, write_suite

from racecheck.runner.blocks import arm_order

pytestmark = pytest.mark.usefixtures("fast_sessions")


# -- tests ----------------------------------------------------------------------------------------
def test_seeded_failure_probabilities_give_the_expected_counts(tmp_path):
    root = write_suite(
        tmp_path / "p",
        arms={"often": {"expect": "race"}, "never": {"expect": "safe"}},
        tests={"test_seeded.py": SEEDED_TEST},
    )
    res = racecheck("run", "--trials", 20, "--seed", 7, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    assert summary_counts(tmp_path / "out") == expected_failures(
        {"often": RATES["often"], "never": 0.0}, range(20), seed=7
    )
    # The arms alternate trial by trial inside the one session (A B A B).
    recs = records(tmp_path / "out")
    assert [(r.trial, r.arm) for r in recs[::2]] == [(t, a) for t in range(20) for a in ("often", "never")]
    assert len(list((tmp_path / "out" / "logs").iterdir())) == 1
    failing = [r for r in recs if r.outcome == "failed"]
    assert failing and all(r.signature == "AssertionError at test_seeded.py:10 in test_draw" for r in failing)
    assert all("--arms often" in r.replay and f"--seed {r.seed}" in r.replay for r in failing)
    assert {r.seed - r.trial for r in recs} == {7}
    assert all(r.versions.get("pytest") and r.device == "cpu" for r in recs)


def test_env_arms_run_in_alternating_chunks_and_agree_with_process_isolation(tmp_path):
    root = write_suite(
        tmp_path / "p",
        arms={"often": {"env": {"RATE": "0.6"}}, "never": {"env": {"RATE": "0"}}},
        tests={"test_seeded.py": SEEDED_TEST},
    )
    session = racecheck("run", "--trials", 4, "--chunk", 2, "--out", tmp_path / "s", "-q", cwd=root)
    process = racecheck("run", "--trials", 4, "--isolation", "process", "--out", tmp_path / "p1", "-q", cwd=root)
    assert session.code == process.code == 0, (session, process)
    expected = expected_failures({"often": 0.6, "never": 0.0}, range(4))
    assert summary_counts(tmp_path / "s") == summary_counts(tmp_path / "p1") == expected
    # session: one session per arm per chunk of 2 trials, the arms alternating: 4 sessions.
    order = [(r.trial, r.arm) for r in records(tmp_path / "s")][::2]
    assert order == [
        (0, "often"),
        (1, "often"),
        (0, "never"),
        (1, "never"),
        (2, "often"),
        (3, "often"),
        (2, "never"),
        (3, "never"),
    ]
    assert len(list((tmp_path / "s" / "logs").iterdir())) == 4
    assert len(list((tmp_path / "p1" / "logs").iterdir())) == 8  # process: one per trial and arm


def test_random_order_is_a_seeded_permutation_per_trial(tmp_path):
    arms = ("often", "rarely", "never")
    root = write_suite(tmp_path / "p", arms={a: {} for a in arms}, tests={"test_seeded.py": SEEDED_TEST})
    res = racecheck("run", "--trials", 5, "--order", "random", "--seed", 3, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    order = [(r.trial, r.arm) for r in records(tmp_path / "out")][::2]
    assert order == [(t, a) for t in range(5) for a in arm_order(arms, t, seed=3, order="random")]
    assert len({tuple(a for t2, a in order if t2 == t) for t in range(5)}) > 1  # not all the same
    assert summary_counts(tmp_path / "out") == expected_failures({a: RATES[a] for a in arms}, range(5), seed=3)


HANG_OR_DIE = """
import os, signal, time

def test_first(racecheck_arm, racecheck_seed):
    if racecheck_seed == 1 and racecheck_arm == "bad":
        if os.environ.get("MODE") == "hang":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)

def test_second():
    pass
"""


@pytest.mark.parametrize("isolation", ["session", "process"])
def test_a_hanging_test_becomes_timeout_and_the_run_goes_on(tmp_path, monkeypatch, isolation):
    monkeypatch.setenv("MODE", "hang")
    root = write_suite(tmp_path / "p", arms={"bad": {}, "good": {}}, tests={"test_x.py": HANG_OR_DIE})
    res = racecheck(
        "run", "--trials", 3, "--timeout", 1, "--isolation", isolation, "--out", tmp_path / "out", "-q", cwd=root
    )
    assert res.code == 0, res
    outcomes = {(r.trial, r.arm, r.test.split("::")[-1]): r.outcome for r in records(tmp_path / "out")}
    assert outcomes.pop((1, "bad", "test_first")) == "timeout"
    # The next session runs the hung block's tests after the hang, then every other trial in full.
    assert outcomes == {
        (t, a, n): "passed"
        for t in range(3)
        for a in ("bad", "good")
        for n in ("test_first", "test_second")
        if (t, a, n) != (1, "bad", "test_first")
    }
    timeout = next(r for r in records(tmp_path / "out") if r.outcome == "timeout")
    assert timeout.signature.startswith("timeout: no test finished within 1 s") and timeout.replay
    assert summary_counts(tmp_path / "out")[("bad", "*")] == (1, 3)


def test_a_test_that_kills_its_process_becomes_crash(tmp_path):
    root = write_suite(tmp_path / "p", arms={"bad": {}, "good": {}}, tests={"test_x.py": HANG_OR_DIE})
    res = racecheck("run", "--trials", 3, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    recs = records(tmp_path / "out")
    crash = [r for r in recs if r.outcome == "crash"]
    assert [(r.trial, r.arm, r.test.split("::")[-1]) for r in crash] == [(1, "bad", "test_first")]
    assert crash[0].signature == "crash: killed by SIGKILL"
    # The session restarted after the crashed test: test_second of trial 1 of `bad`, then trial 1
    # of `good`, then trial 2, all complete.
    assert sum(1 for r in recs if (r.trial, r.arm) == (1, "bad")) == 2
    assert summary_counts(tmp_path / "out")[("good", "*")] == (0, 3)
    assert summary_counts(tmp_path / "out")[("bad", "*")] == (1, 3)
    assert len(list((tmp_path / "out" / "logs").iterdir())) == 2
    done = [json.loads(ln) for ln in (tmp_path / "out" / "completed.jsonl").read_text().splitlines()]
    assert sorted((d["trial"], d["arm"], d["outcome"]) for d in done) == sorted(
        [(t, a, "crash" if (t, a) == (1, "bad") else "passed") for t in range(3) for a in ("bad", "good")]
    )


def test_stop_rules_end_the_run_at_a_trial_boundary(tmp_path):
    root = write_suite(tmp_path / "p", arms={"bad": {}, "good": {}}, tests={"test_x.py": ALWAYS})
    res = racecheck(
        "run",
        "--trials",
        200,
        "--stop-when",
        "bad:failures>=2,good:clean>=3",
        "--out",
        tmp_path / "out",
        "-q",
        cwd=root,
    )
    assert res.code == 0, res
    assert "stopped early: the stop rules held" in res.out
    counts = summary_counts(tmp_path / "out")
    failures, trials = counts[("bad", "*")]
    assert failures == trials and 3 <= trials < 200
    # Every logged trial is whole: both tests of both arms.
    assert counts[("good", "*")] == (0, trials)
    assert counts[("bad", "test_two")] == (0, trials)


def test_max_time_stops_gracefully_and_resume_continues(tmp_path):
    slow = ALWAYS + "\n\ndef test_three():\n    time.sleep(0.3)\n"
    root = write_suite(tmp_path / "p", arms={"bad": {}, "good": {}}, tests={"test_x.py": slow})
    res = racecheck("run", "--trials", 100, "--max-time", 2, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    assert "--max-time was reached" in res.out
    _, trials = summary_counts(tmp_path / "out")[("good", "*")]
    assert 1 <= trials < 100
    assert summary_counts(tmp_path / "out")[("bad", "*")][1] == trials
    res = racecheck("run", "--resume", tmp_path / "out", "--trials", trials + 2, "-q", cwd=root)
    assert res.code == 0, res
    assert summary_counts(tmp_path / "out")[("good", "*")] == (0, trials + 2)


RANKED = """
import os

def test_ranks(racecheck_seed):
    assert os.environ["WORLD_SIZE"] == "2"
    assert not (os.environ["RANK"] == "1" and racecheck_seed % 2), "rank 1 disagrees"

def test_fine():
    pass
"""


def test_a_two_rank_suite_under_torchrun_merges_the_ranks_into_one_outcome(tmp_path):
    root = write_suite(tmp_path / "p", arms={"only": {}}, tests={"test_ranks.py": RANKED}, suite="world_size = 2")
    res = racecheck("run", "--trials", 4, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    recs = records(tmp_path / "out")
    assert [(r.trial, r.test.split("::")[-1], r.outcome) for r in recs] == [
        (t, n, "failed" if n == "test_ranks" and t % 2 else "passed")
        for t in range(4)
        for n in ("test_ranks", "test_fine")
    ]
    assert {r.message for r in recs if r.outcome == "failed"} == {"rank 1 disagrees"}
