"""What racecheck's tests of the runner and the CLI share: a pytest project written for the purpose
(write_suite, and SEEDED_TEST, whose arms fail at known rates), `racecheck ARGS` run in this
process (racecheck, one_line_error), trial logs written by hand (trial_record, write_log), and
readers of a run folder (records, record_frame, run_summary, summary_counts, expected_failures).
Their fixtures are in conftest.py.
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

from racecheck.protocol.one_rank import free_port  # noqa: F401 - the tests take it from here
from racecheck.protocol.records import TrialRecord
from racecheck.runner.trial_log import TrialLog, read_log

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
# A suite with one test that fails in arm `bad` only, and one that always passes.
ALWAYS = """
import time

def test_one(racecheck_arm):
    assert racecheck_arm != "bad"

def test_two():
    time.sleep(0.05)
"""


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


def trial_record(**fields) -> TrialRecord:
    """A trial record with `fields`, the rest of the required ones a passed test of one trial
    (run `r`, scenario main_grad_reuse, trial and seed 0, test `t.py::t`, no arm expectation)."""
    defaults = {"run_id": "r", "scenario": "main_grad_reuse", "arm": "a", "expect": "", "trial": 0, "seed": 0}
    defaults.update(test="t.py::t", params="", outcome="passed")
    return TrialRecord(**{**defaults, **fields})


def write_log(out: Path, records) -> Path:
    """OUT/trials.jsonl holding `records`, in order, as the runner appends them; OUT."""
    with TrialLog(out / "trials.jsonl") as log:
        for record in records:
            log.append(record)
    return out


def records(out: Path) -> list:
    return list(read_log(out / "trials.jsonl"))


def record_frame(out: Path):
    """OUT's records as `racecheck report` reads them: tally.load_records of the opened folder."""
    from racecheck.results import tally
    from racecheck.runner.run_folder import open_run_folder

    return tally.load_records(open_run_folder(out, need_run=False))


def run_summary(out: Path):
    """OUT/summary.csv written as `racecheck run` writes it at its end; the summary."""
    from racecheck.results import tally
    from racecheck.runner.run_folder import open_run_folder

    folder = open_run_folder(out, need_run=False)
    return tally.write_summary(folder, tally.load_records(folder))


def one_line_error(res: Result, code: int = 2) -> str:
    """The one line a command that failed with `code` said on stderr (no traceback)."""
    assert res.code == code, res
    assert res.err.count("\n") == 1 and "Traceback" not in res.err, res
    return res.err.strip()
