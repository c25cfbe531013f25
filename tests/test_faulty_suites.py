"""Suites that misbehave against the run itself: a test that ends its process with a clean exit
code, one that removes racecheck's own run folder, one that prints without end, and a disk that
refuses the run's writes. Each run loses no finished trial and ends with its documented code."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys

import pytest
from run_kit import racecheck, records, summary_counts, write_suite

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


LOUD = """
def test_loud():
    print("x" * 6_000_000)  # pytest shows it with the failure
    assert False, "the end"
"""


def test_a_test_that_prints_without_end_leaves_a_bounded_log_that_says_what_it_cut(tmp_path):
    from racecheck.runner.session_log import HEAD_BYTES, TAIL_BYTES

    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": LOUD})
    res = racecheck("run", "--trials", 1, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0 and [r.outcome for r in records(tmp_path / "out")] == ["failed"], res
    (log,) = (tmp_path / "out" / "logs").iterdir()
    text = log.read_bytes()
    assert len(text) <= HEAD_BYTES + TAIL_BYTES + 100
    cut = re.findall(rb"\n\[\.\.\. (\d+\.\d) MB cut \.\.\.\]\n", text)
    assert len(cut) == 1 and 1.5 < float(cut[0]) < 2.5, cut  # 6 MB printed, 4 MiB kept
    assert text.startswith(b"F") and b"AssertionError: the end" in text[:HEAD_BYTES]  # the traceback
    assert text.count(b"x" * 1000) > 1000  # and the print, cut in two
    assert re.search(rb"\n1 failed[^\n]* in [\d.]+s\n$", text[-TAIL_BYTES:])  # pytest's last line
    folder = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert folder < len(text) + 100_000  # the output is kept once


def test_a_session_log_is_complete_when_its_session_ends_though_a_leftover_holds_the_pipe(tmp_path):
    from racecheck.runner.session_log import SessionLog

    log = SessionLog(tmp_path / "s.log", head=10, tail=8)
    leftover = os.dup(log.writer)  # a process that outlived its session holds its output's pipe
    log.release_writer()
    try:
        os.write(leftover, b"0123456789" + b"abc\n" * 10)
        log.close(grace=0)
    finally:
        os.close(leftover)
    assert (tmp_path / "s.log").read_bytes() == b"0123456789\n[... 32 bytes cut ...]\nabc\nabc\n"


REMOVES_ITS_RUN_FOLDER = """
import shutil

def test_a_ok():
    pass

def test_b_cleans_up():
    shutil.rmtree("racecheck-out", ignore_errors=True)  # racecheck's own run folder among them

def test_c_ok():
    pass
"""


def test_a_test_that_removes_the_run_folder_has_it_written_again_and_the_run_goes_on(tmp_path):
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests={"test_x.py": REMOVES_ITS_RUN_FOLDER})
    out = root / "racecheck-out" / "run"
    res = racecheck("run", "--trials", 2, "--out", out, "-q", cwd=root)
    assert res.code == 0, res
    assert "removed from" in res.err and "written again from what the runner holds; the run goes on" in res.err
    assert sorted((r.trial, r.test.split("::")[-1], r.outcome) for r in records(out)) == [
        (t, test, "passed") for t in (0, 1) for test in ("test_a_ok", "test_b_cleans_up", "test_c_ok")
    ]
    assert summary_counts(out)[("a", "*")] == (0, 2)  # summary.csv, in the folder written again
    assert len((out / "completed.jsonl").read_text().splitlines()) == 2
    res = racecheck("run", "--resume", out, "-q", cwd=root)  # run.json and completed.jsonl are whole
    assert res.code == 0 and summary_counts(out)[("a", "*")] == (0, 2), res


def _file_size_limit(limit: int):
    def limited() -> None:  # in the child: its files, and its children's, stop at `limit` bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limited


def test_a_disk_that_refuses_the_run_stops_it_in_one_line_with_exit_3_and_resume_finishes_it(tmp_path):
    """A file-size limit refuses the trial log's fourth record (EFBIG, as a full disk gives ENOSPC),
    in a runner of its own; Python ignores SIGXFSZ, so the write fails instead of the process."""
    tests = {"test_x.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n"}
    root = write_suite(tmp_path / "p", arms={"a": {}}, tests=tests)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "racecheck", "run", "--trials", "4", "--out", str(out), "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit(2048),  # run.json fits, and three records of the log
        timeout=120,
    )
    assert proc.returncode == 3, proc
    assert proc.stderr.startswith(f"racecheck: infrastructure error: cannot write {out / 'trials.jsonl'}: ")
    assert proc.stderr.count("\n") == 1 and f"continue with: racecheck run --resume {out}" in proc.stderr
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert 0 < len(lines) < 8 and all(json.loads(line)["outcome"] == "passed" for line in lines)  # none torn
    res = racecheck("run", "--resume", out, "-q", cwd=root)
    assert res.code == 0 and summary_counts(out)[("a", "*")] == (0, 4), res
    (out / "summary.csv").unlink()
    (out / "summary.csv").mkdir()  # the last write of a run refused too (as root: no read-only file)
    res = racecheck("run", "--resume", out, "-q", cwd=root)
    assert res.code == 3 and res.err == (
        f"racecheck: infrastructure error: cannot write {out / 'summary.csv'}: Is a directory; every trial is "
        f"kept in {out / 'trials.jsonl'} ('racecheck report {out} --format csv' gives the summary)\n"
    ), res
