"""The trial runner on small pytest projects written for the purpose in tmp_path (world size 1).

The helpers at the top (write_suite, racecheck, summary_counts, expected_failures) are shared by
tests/test_runner_*.py and tests/test_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys
import textwrap
from pathlib import Path

import pytest

from racecheck.runner.blocks import arm_order
from racecheck.runner.record import read_log

# A suite whose arms are told apart inside the process: test `case` of trial t fails when a
# draw seeded by the trial's seed falls below the arm's rate.
SEEDED_TEST = """
import os, random
import pytest

RATES = {"often": 0.6, "rarely": 0.2, "never": 0.0}

@pytest.mark.parametrize("case", ["x", "y"])
def test_draw(case, racecheck_arm, racecheck_seed):
    rate = float(os.environ.get("RATE", RATES.get(racecheck_arm, 0.0)))
    assert random.Random(f"{racecheck_seed}-{case}").random() >= rate, "unlucky draw"
"""
RATES = {"often": 0.6, "rarely": 0.2, "never": 0.0}
CASES = ("x", "y")


@pytest.fixture(autouse=True)
def _fast_sessions(monkeypatch):
    """Sessions start without third-party plugins (the runner loads its own with -p)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def write_suite(root: Path, *, arms: dict, tests: dict, suite: str = "") -> Path:
    """A pytest project at `root`: test files and a pyproject.toml with [tool.racecheck]."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["[tool.racecheck]", 'name = "tiny"', textwrap.dedent(suite).strip(), ""]
    for name, spec in arms.items():
        lines.append(f"[tool.racecheck.arms.{name}]")
        for key, value in spec.items():
            if isinstance(value, dict):
                value = "{ " + ", ".join(f'{k} = "{v}"' for k, v in value.items()) + " }"
            else:
                value = json.dumps(value)
            lines.append(f"{key} = {value}")
        lines.append("")
    (root / "pyproject.toml").write_text("\n".join(lines))
    for name, text in tests.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out[-800:]!r}, err={self.err[-800:]!r})"


def racecheck(*args, cwd: Path) -> Result:
    """`racecheck ARGS` in this process (the console entry point, exit-code policy included)."""
    from racecheck.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["racecheck", *map(str, args)]
    code = 0
    try:
        with _cwd(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return Result(code, out.getvalue(), err.getvalue())


def summary_counts(out: Path) -> dict:
    """{(arm, test or '*'): (failures, trials)} from OUT/summary.csv."""
    import pandas as pd

    df = pd.read_csv(out / "summary.csv", keep_default_na=False)
    return {(r.arm, r.test.rsplit("::", 1)[-1]): (int(r.failures), int(r.trials)) for r in df.itertuples()}


def expected_failures(rates: dict, trials, *, seed: int = 0) -> dict:
    """What SEEDED_TEST must give: {(arm, test or '*'): (failures, trials)}."""
    out = {}
    for arm, rate in rates.items():
        fails = {c: [random.Random(f"{seed + t}-{c}").random() < rate for t in trials] for c in CASES}
        for c in CASES:
            out[(arm, f"test_draw[{c}]")] = (sum(fails[c]), len(trials))
        out[(arm, "*")] = (sum(any(fails[c][i] for c in CASES) for i in range(len(trials))), len(trials))
    return out


def records(out: Path) -> list:
    return list(read_log(out / "trials.jsonl"))


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
        "run", "--trials", 3, "--timeout", 2, "--isolation", isolation, "--out", tmp_path / "out", "-q", cwd=root
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
    assert timeout.signature.startswith("timeout: no test finished within 2 s") and timeout.replay
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


ALWAYS = """
import time

def test_one(racecheck_arm):
    assert racecheck_arm != "bad"

def test_two():
    time.sleep(0.05)
"""


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
