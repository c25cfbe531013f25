"""Suites that misbehave against the run itself: a test that ends its process with a clean exit
code, one that removes racecheck's own run folder, one that prints without end, and a disk that
refuses the run's writes. Each run loses no finished trial and ends with its documented code."""

from __future__ import annotations

import pytest
from run_kit import racecheck, records, write_suite

pytestmark = pytest.mark.usefixtures("fast_sessions")

EXIT_0 = """
import os

def test_a_ok():
    pass

def test_b_exits_0():
    os._exit(0)  # a clean exit code, as a forked child returning into pytest can give

def test_c_ok():
    pass
"""


def test_a_test_that_exits_0_is_a_crash_and_the_tests_after_it_still_run(tmp_path):
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": EXIT_0})
    res = racecheck("run", "--trials", 1, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    got = {r.test.split("::")[-1]: (r.outcome, r.signature) for r in records(tmp_path / "out")}
    assert got == {
        "test_a_ok": ("passed", ""),
        "test_b_exits_0": ("crash", "crash: the process died without a report (exit code 0)"),
        "test_c_ok": ("passed", ""),
    }
