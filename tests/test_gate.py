"""racecheck.results.gate and the `gate`/`plan` commands: decisions, their lines, and exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from run_kit import record_frame, trial_record, write_log

from racecheck.cli.commands import gate_command, plan_command
from racecheck.exitcodes import ExitCode
from racecheck.results import tally
from racecheck.results.gate import Decision, evaluate_gate
from racecheck.results.stats import trials_for_auto

TEST = "scenarios/main_grad_reuse/test_main_grad_reuse.py::test_hsdp_losses_match_baseline[{}]"
PARAMS = ("1-True", "1-False", "3-True", "3-False")


def write_arms(out, arms, *, scenario="main_grad_reuse"):
    """arms: {arm: (expect, trials, failing trial indices)}; a failing trial fails `[1-True]`."""
    return write_log(
        out,
        (
            trial_record(
                scenario=scenario,
                arm=arm,
                expect=expect,
                trial=t,
                seed=t,
                test=TEST.format(p),
                params=p,
                outcome="failed" if t in failing and p == "1-True" else "passed",
            )
            for arm, (expect, trials, failing) in arms.items()
            for t in range(trials)
            for p in PARAMS
        ),
    )


def summary_of(tmp_path, arms):
    return tally.summarize(record_frame(write_arms(tmp_path, arms)))


@pytest.fixture
def proven(tmp_path):
    return write_arms(tmp_path, {"baseline": ("race", 10, range(10)), "fixed": ("safe", 10, ())})


def test_pass(proven):
    result = evaluate_gate(tally.summarize(record_frame(proven)), fixed="fixed", baseline="baseline")
    assert result.decision is Decision.PASS and result.exit_code == ExitCode.OK
    fixed_line, baseline_line = result.lines
    assert "fixed arm 'fixed'" in fixed_line and "no failure in 10 trials" in fixed_line
    assert "observed rate 0% <= max-rate 0%" in fixed_line and fixed_line.endswith("-> PASS")
    assert "10 of 10 trials failed" in baseline_line and baseline_line.endswith("-> PASS")


def test_fail_when_arms_swapped(proven):
    result = evaluate_gate(tally.summarize(record_frame(proven)), fixed="baseline", baseline="fixed")
    assert result.decision is Decision.FAIL and result.exit_code == ExitCode.GATE_FAILED
    assert all(c.decision is Decision.FAIL for c in result.conditions)
    assert "observed rate 100% > max-rate 0%" in result.lines[0]


def test_fail_when_baseline_does_not_reproduce(tmp_path):
    summary = summary_of(tmp_path, {"baseline": ("race", 10, ()), "fixed": ("safe", 10, ())})
    result = evaluate_gate(summary, fixed="fixed", baseline="baseline")
    assert result.decision is Decision.FAIL
    assert [c.decision for c in result.conditions] == [Decision.PASS, Decision.FAIL]
    assert "did not reproduce" in result.lines[1]


def test_max_and_min_rate_without_confidence(tmp_path):
    summary = summary_of(tmp_path, {"baseline": ("race", 10, range(4)), "fixed": ("safe", 10, [3])})
    assert evaluate_gate(summary, fixed="fixed", baseline="baseline").decision is Decision.FAIL
    ok = evaluate_gate(summary, fixed="fixed", baseline="baseline", max_rate=0.1, min_rate=0.4)
    assert ok.decision is Decision.PASS
    low = evaluate_gate(summary, fixed="fixed", baseline="baseline", max_rate=0.1, min_rate=0.5)
    assert low.decision is Decision.FAIL and "observed rate 40% < min-rate 50%" in low.lines[1]


def test_undecided_with_confidence_says_how_many_more(tmp_path):
    summary = summary_of(tmp_path, {"baseline": ("race", 5, range(5)), "fixed": ("safe", 5, ())})
    result = evaluate_gate(summary, fixed="fixed", baseline="baseline", max_rate=0.3, confidence=0.95)
    assert result.decision is Decision.UNDECIDED and result.exit_code == ExitCode.UNDECIDED
    fixed = result.conditions[0]
    assert fixed.more_trials == 4  # 0/9 is the first clean count bounded at 30% (Wilson 95%)
    assert "95% upper bound 43.45% > max-rate 30%" in fixed.line
    assert "4 more trials without failure would pass it" in fixed.line


def test_four_more_clean_trials_do_pass(tmp_path):
    summary = summary_of(tmp_path, {"baseline": ("race", 9, range(9)), "fixed": ("safe", 9, ())})
    result = evaluate_gate(summary, fixed="fixed", baseline="baseline", max_rate=0.3, confidence=0.95)
    assert result.decision is Decision.PASS
    assert "95% upper bound 29.91% <= max-rate 30%" in result.lines[0]


def test_confident_failure_and_undecided_baseline(tmp_path):
    summary = summary_of(tmp_path, {"baseline": ("race", 5, range(3)), "fixed": ("safe", 10, range(5))})
    result = evaluate_gate(summary, fixed="fixed", baseline="baseline", max_rate=0.1, min_rate=0.5, confidence=0.95)
    fixed, baseline = result.conditions
    assert fixed.decision is Decision.FAIL and "lower bound 23.66% > max-rate 10%" in fixed.line
    assert baseline.decision is Decision.UNDECIDED and baseline.more_trials > 0
    assert f"about {baseline.more_trials} more trials failing at the observed 60%" in baseline.line
    assert result.decision is Decision.FAIL


def test_scenarios_and_errors(tmp_path):
    (tmp_path / "a").mkdir()
    write_arms(tmp_path / "a", {"baseline": ("race", 3, range(3)), "fixed": ("safe", 3, ())}, scenario="s1")
    regressed = [  # a second scenario, whose fix regressed
        trial_record(scenario="s2", arm="fixed", expect="safe", outcome="failed"),
        trial_record(scenario="s2", arm="baseline", expect="race", outcome="failed"),
    ]
    write_log(tmp_path / "a", regressed)
    summary = tally.summarize(record_frame(tmp_path / "a"))
    both = evaluate_gate(summary, fixed="fixed", baseline="baseline")
    assert both.decision is Decision.FAIL and len(both.conditions) == 4
    assert evaluate_gate(summary, fixed="fixed", baseline="baseline", scenario="s1").decision is Decision.PASS
    for kwargs, match in [
        (dict(fixed="nope", baseline="baseline"), "unknown fixed arm 'nope'"),
        (dict(fixed="fixed", baseline="fixed"), "same arm"),
        (dict(fixed="fixed", baseline="baseline", scenario="s9"), "unknown scen"),
        (dict(fixed="fixed", baseline="baseline", confidence=0.95), "above 0"),
        (dict(fixed="fixed", baseline="baseline", max_rate=2.0), r"\[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            evaluate_gate(summary, **kwargs)


@pytest.mark.parametrize(
    "args, code, last",
    [
        (["--fixed", "fixed", "--baseline", "baseline"], 0, "gate: PASS"),
        (["--fixed", "baseline", "--baseline", "fixed"], 1, "gate: FAIL"),
        (
            ["--fixed", "fixed", "--baseline", "baseline", "--max-rate", "0.1", "--confidence", "0.95"],
            4,
            "gate: UNDECIDED",
        ),
    ],
)
def test_gate_command_exit_codes(proven, args, code, last):
    result = CliRunner().invoke(gate_command, [str(proven), *args])
    assert result.exit_code == code, result.output
    lines = result.output.splitlines()
    assert len(lines) == 3 and lines[-1] == last


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fixed", "nope", "--baseline", "baseline"], "Invalid value for --fixed: unknown arm 'nope'"),
        (["--fixed", "fixed", "--baseline", "baseline", "--max-rate", "1.5"], "not a rate in [0, 1]"),
        (["--fixed", "fixed", "--baseline", "baseline", "--confidence", "1"], "strictly between"),
        (
            ["--fixed", "fixed", "--baseline", "baseline", "--confidence", "0.9"],
            "--confidence needs --max-rate above 0",
        ),
        (["--fixed", "fixed"], "Missing option '--baseline'"),
    ],
)
def test_gate_command_usage_errors(proven, args, message):
    result = CliRunner().invoke(gate_command, [str(proven), *args])
    assert result.exit_code == ExitCode.USAGE and message in result.output
    assert "Traceback" not in result.output


def test_gate_command_bad_out_dir(tmp_path):
    args = ["--fixed", "fixed", "--baseline", "baseline"]
    for out in (tmp_path / "missing", tmp_path):
        result = CliRunner().invoke(gate_command, [str(out), *args])
        assert result.exit_code == ExitCode.USAGE and "Invalid value for 'OUT'" in result.output
    (tmp_path / "trials.jsonl").write_text("\n")
    result = CliRunner().invoke(gate_command, [str(tmp_path), *args])
    assert result.exit_code == ExitCode.USAGE and "holds no records" in result.output


def test_plan_command():
    runner = CliRunner()
    bound = runner.invoke(plan_command, ["--bound", "0.3", "--confidence", "0.95"])
    assert bound.exit_code == 0 and bound.output.startswith("9 trials without a failure")
    sep = runner.invoke(
        plan_command, ["--baseline-rate", "0.9", "--fixed-rate", "0", "--alpha", "0.05", "--power", "0.9"]
    )
    assert sep.exit_code == 0 and sep.output.startswith("5 trials per arm")
    for args in (
        [],
        ["--bound", "0.3", "--baseline-rate", "0.9"],
        ["--bound", "0"],
        ["--baseline-rate", "0.2", "--fixed-rate", "0.2"],
        ["--bound", "-1"],
    ):
        result = runner.invoke(plan_command, args)
        assert result.exit_code == ExitCode.USAGE, (args, result.output)


def test_trials_for_auto():
    assert trials_for_auto() == 9
    assert trials_for_auto(bound=0.1) == 35


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"], ["gate", "--help"]])
def test_help_imports_no_heavy_library(argv):
    """`racecheck --help` and each command's help load the command line only (cli/ is lazy)."""
    code = (
        "import contextlib, io, sys\n"
        f"sys.argv = ['racecheck', *{argv!r}]\n"
        "from racecheck.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main()\n"
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib', 'torch', 'numpy', 'tqdm', 'psutil') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_arm_that_only_skipped_is_undecided(tmp_path):
    write_log(
        tmp_path,
        [trial_record(scenario="s", arm=a, outcome=o) for a, o in (("baseline", "failed"), ("fixed", "skipped"))],
    )
    result = evaluate_gate(tally.summarize(record_frame(tmp_path)), fixed="fixed", baseline="baseline")
    assert result.decision is Decision.UNDECIDED
    assert result.lines[0] == "s fixed arm 'fixed': no trial ran (all skipped) -> UNDECIDED"
    assert result.lines[1].endswith("reproduced (at least 1 failing trial) -> PASS")
