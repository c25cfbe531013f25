"""What racecheck says on its console, whatever the console and the names it quotes: one line for
a folder whose name holds a line break (and a command line a shell reads back), exit 2 in a
current folder removed under the shell, a console closed before the command starts, a console on
a disk that refuses what a command prints (exit 3), and an arm whose environment no process can
take (exit 2). Each case was found by bench/hostile_inputs.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from run_kit import racecheck, write_suite

from racecheck.protocol.printable import shell_join

pytestmark = pytest.mark.usefixtures("fast_sessions")


@pytest.mark.parametrize("word", ["a\nb", "it's", "back\\slash\n", "caf\udcff.txt", "tab\there", "\x01z", "é\u2028"])
def test_a_command_line_is_one_line_that_bash_reads_back_word_for_word(word):
    line = shell_join(["printf", "%s", word])
    assert "\n" not in line and "\r" not in line
    out = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30).stdout
    assert out == word.encode("utf-8", "surrogateescape")


def test_an_error_about_a_folder_named_with_a_line_break_is_one_line(tmp_path):
    res = racecheck("report", tmp_path / "no\nwhere", cwd=tmp_path)
    assert res.code == 2 and res.err.count("\n") == 1, res
    assert res.err.startswith("racecheck: error: ") and "no\\nwhere: no such directory" in res.err


def test_a_run_folder_named_with_a_line_break_is_refused_in_one_line_with_a_resume_line_bash_reads(project, tmp_path):
    out = tmp_path / "a\nb"
    assert racecheck("run", "--trials", "1", "--out", out, "-q", cwd=project).code == 0
    res = racecheck("run", "--trials", "1", "--out", out, cwd=project)
    assert res.code == 2 and res.err.count("\n") == 1, res
    hint = res.err.rstrip("\n").split("continue it: ", 1)[1]
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {hint}"], capture_output=True, text=True, timeout=30)
    assert words.stdout.split("\0")[:-1] == ["racecheck", "run", "--resume", str(out)]


def test_a_command_in_a_current_folder_removed_under_the_shell_is_one_line_and_exit_2(tmp_path):
    from racecheck.cli import main

    gone, here = tmp_path / "gone", os.getcwd()
    gone.mkdir()
    os.chdir(gone)
    try:
        gone.rmdir()
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        os.chdir(here)
    assert exc.value.code == 2


def _racecheck(*args: str, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "racecheck", *args], text=True, timeout=60, **popen)


def test_a_console_closed_before_the_command_starts_costs_its_output_only():
    """`racecheck list >&- 2>&-`: Python starts without sys.stdout; the descriptors are /dev/null's."""
    proc = _racecheck("list", preexec_fn=lambda: (os.close(1), os.close(2)))
    assert proc.returncode == 0


def test_a_console_on_a_disk_that_refuses_the_output_makes_a_command_that_succeeded_exit_3():
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        proc = _racecheck("list", stdout=full, stderr=subprocess.PIPE)
    assert (proc.returncode, proc.stderr) == (
        3,
        "racecheck: infrastructure error: cannot write standard output: No space left on device; "
        "what the command printed is incomplete\n",
    )


def test_an_arm_whose_environment_no_process_takes_is_a_usage_error(tmp_path):
    root = write_suite(
        tmp_path / "p", arms={"a": {"env": {"X": "x" * 200_000}}}, tests={"test_x.py": "def test_ok():\n    pass\n"}
    )
    res = racecheck("run", "--trials", "1", "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 2 and res.err.count("\n") == 1, res
    assert "more than a process takes (Argument list too long)" in res.err
