"""quick_exit.py, the way each session process (torchrun's agent, a rank's pytest) ends: as
`python -m MODULE` would, less the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from racecheck.runner.launch import QUICK_EXIT

MODULE = """
import atexit, pathlib, sys, threading, time

here = pathlib.Path(sys.argv[1])
atexit.register(lambda: (here / "atexit").write_text("ran"))

def late():
    time.sleep(0.3)
    (here / "thread").write_text("done")

threading.Thread(target=late).start()  # not a daemon: the exit waits for it
sys.stdout.write("no newline, still buffered")
{end}
"""


@pytest.mark.parametrize(
    ("end", "code", "err"),
    [("", 0, ""), ("sys.exit(3)", 3, ""), ("sys.exit('bye')", 1, "bye\n"), ("raise SystemExit(None)", 0, "")],
)
def test_a_module_ends_with_its_status_its_threads_its_atexit_handlers_and_its_output(tmp_path, end, code, err):
    (tmp_path / "ending.py").write_text(MODULE.format(end=end))
    res = subprocess.run(
        [sys.executable, "-m", QUICK_EXIT, "ending", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode == code, res
    assert res.stdout == "no newline, still buffered" and res.stderr == err, res
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"


def test_an_exception_takes_pythons_own_way_out(tmp_path):
    (tmp_path / "ending.py").write_text(MODULE.format(end="raise RuntimeError('broken')"))
    res = subprocess.run(
        [sys.executable, "-m", QUICK_EXIT, "ending", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stderr.rstrip().endswith("RuntimeError: broken"), res
    assert (tmp_path / "atexit").read_text() == "ran"
