"""The pytest plugin on its own: options, markers, repeat steps mapped to blocks, the per-process
log (per xdist worker), the graceful stop, and exit statuses under the runner."""

from __future__ import annotations

import json

import pytest

from racecheck.protocol.schedule import Block, write_schedule
from racecheck.rank.plugin import strip_step

pytest_plugins = ["pytester"]

RECORDING = """
import pytest
from racecheck.rank.item_trial import ITEM_TRIAL

@pytest.mark.parametrize("n", [1, 2])
def test_p(n, racecheck_arm, racecheck_seed, racecheck_perturb, request):
    t = request.node.stash[ITEM_TRIAL]
    assert (t.arm, t.trial) == (racecheck_arm, racecheck_seed - 100)
    assert racecheck_perturb == ("sleep@before_reduce_scatter:1ms" if racecheck_arm == "b" else None)
    assert not (racecheck_arm == "b" and n == 2), "b fails n=2"
"""


def events(path, kind=None):
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    return [e for e in lines if kind is None or e["event"] == kind]


def test_options_are_grouped_and_markers_registered(pytester):
    help_text = pytester.runpytest("--help").stdout.str()
    group = help_text[help_text.index("racecheck: arms, trials, perturbation and outcome logging:") :]
    for option in (
        "--racecheck-steps",
        "--racecheck-schedule",
        "--racecheck-seed",
        "--racecheck-detect",
        "--racecheck-log",
        "--racecheck-stop-file",
        "--racecheck-patch",
        "--racecheck-handoffs",
    ):
        assert option in group
    # the runner passes the arms, their order and their profiles in the schedule, nothing else
    for gone in ("--racecheck-arms", "--racecheck-order", "--racecheck-perturb", "--racecheck-trial-start"):
        assert gone not in group
    assert (
        "racecheck_world(n): the test needs a process world of n ranks" in pytester.runpytest("--markers").stdout.str()
    )


def test_world_marker_fails_at_setup_in_a_world_of_another_size(pytester, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.racecheck_world(4)
        def test_needs_four():
            pass

        @pytest.mark.racecheck_world(1)
        def test_needs_one():
            pass
    """)
    result = pytester.runpytest("-p", "racecheck")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_needs_four needs a process world of 4 ranks, this one has 1*"])


def test_a_schedule_maps_repeat_steps_to_blocks_and_the_log_says_so(pytester, tmp_path):
    pytester.makepyfile(test_rec=RECORDING)
    write_schedule(
        tmp_path / "s.json", (Block(3, "b", "sleep@before_reduce_scatter:1ms"), Block(3, "a"), Block(4, "a"))
    )
    log = tmp_path / "log-{rank}.jsonl"
    result = pytester.runpytest(
        "-p",
        "racecheck",
        "--racecheck-steps=3",
        f"--racecheck-schedule={tmp_path / 's.json'}",
        "--racecheck-seed=100",
        f"--racecheck-log={log}",
    )
    assert result.ret == 0  # failing tests are data under the runner
    outcomes = events(tmp_path / "log-0.jsonl", "outcome")
    assert [(e["trial"], e["arm"], e["test"], e["outcome"]) for e in outcomes] == [
        (3, "b", "test_rec.py::test_p[1]", "passed"),
        (3, "b", "test_rec.py::test_p[2]", "failed"),
        (3, "a", "test_rec.py::test_p[1]", "passed"),
        (3, "a", "test_rec.py::test_p[2]", "passed"),
        (4, "a", "test_rec.py::test_p[1]", "passed"),
        (4, "a", "test_rec.py::test_p[2]", "passed"),
    ]
    bad = outcomes[1]
    assert (bad["seed"], bad["params"]) == (103, "2")
    assert bad["signature"] == "AssertionError at test_rec.py:9 in test_p" and bad["message"] == "b fails n=2"
    assert events(tmp_path / "log-0.jsonl", "collected")[0]["count"] == 6
    assert events(tmp_path / "log-0.jsonl", "finish")[0]["stopped"] is False


def test_without_a_schedule_step_k_is_trial_k_of_no_arm(pytester, tmp_path):
    pytester.makepyfile(test_rec=RECORDING.replace("racecheck_seed - 100", "racecheck_seed - 7"))
    log = tmp_path / "log.jsonl"
    pytester.runpytest("-p", "racecheck", "--racecheck-steps=3", "--racecheck-seed=7", f"--racecheck-log={log}")
    got = [(e["trial"], e["arm"], e["seed"]) for e in events(log, "outcome")][::2]
    assert got == [(0, "", 7), (1, "", 8), (2, "", 9)]


def _arms_schedule(path, arms: str, trials: int):
    """A session schedule of `trials` trials of `arms`, as the runner writes it."""
    write_schedule(path, tuple(Block(t, a) for t in range(trials) for a in arms.split(",")))
    return f"--racecheck-schedule={path}"


def test_a_stop_file_ends_the_session_at_the_next_trial_boundary(pytester, tmp_path):
    pytester.makepyfile(test_rec=RECORDING)
    (tmp_path / "stop").write_text("1\n")
    log = tmp_path / "log.jsonl"
    result = pytester.runpytest(
        "-p",
        "racecheck",
        "--racecheck-steps=6",
        _arms_schedule(tmp_path / "s.json", "a,c", 3),
        "--racecheck-seed=100",
        f"--racecheck-log={log}",
        f"--racecheck-stop-file={tmp_path / 'stop'}",
    )
    assert result.ret == 0
    assert {(e["trial"], e["arm"]) for e in events(log, "outcome")} == {(0, "a"), (0, "c")}
    assert events(log, "finish")[0]["stopped"] is True


def test_exit_status_is_pytests_own_without_the_runner_log(pytester):
    pytester.makepyfile(test_rec="def test_f():\n    assert False\n")
    assert pytester.runpytest("-p", "racecheck").ret == 1


def test_collection_errors_are_logged(pytester, tmp_path):
    pytester.makepyfile(test_bad="def test_f(:\n    pass\n")
    log = tmp_path / "log.jsonl"
    pytester.runpytest("-p", "racecheck", f"--racecheck-log={log}")
    (error,) = events(log, "collecterror")
    assert error["nodeid"] == "test_bad.py" and "SyntaxError" in error["message"]


def test_bad_plugin_options_are_usage_errors(pytester, tmp_path):
    write_schedule(tmp_path / "bad.json", (Block(0, "a", "nonsense@x"),))
    result = pytester.runpytest("-p", "racecheck", f"--racecheck-schedule={tmp_path / 'bad.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ERROR: --racecheck-schedule: " in result.stderr.str() and "nonsense" in result.stderr.str()
    result = pytester.runpytest("-p", "racecheck", f"--racecheck-schedule={tmp_path / 'missing.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "cannot read the schedule" in result.stderr.str()


def test_a_project_profile_without_cuda_is_a_usage_error(pytester, monkeypatch, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the error is for machines without it")
    monkeypatch.delenv("RACECHECK_PATCH_ACTIONS", raising=False)
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    write_schedule(tmp_path / "s.json", (Block(0, "a", "sleep@stream_enter:1ms"),))
    for option in (f"--racecheck-schedule={tmp_path / 's.json'}", "--racecheck-detect"):
        result = pytester.runpytest("-p", "racecheck", "--racecheck-patch", option)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, option
        assert "CUDA" in result.stderr.str(), option
    write_schedule(tmp_path / "off.json", (Block(0, "a", "off"),))
    result = pytester.runpytest("-p", "racecheck", "--racecheck-patch", f"--racecheck-schedule={tmp_path / 'off.json'}")
    assert result.ret == 0


def test_xdist_workers_write_one_file_each_and_report_each_test_once(pytester, tmp_path):
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_many="import pytest\n\n@pytest.mark.parametrize('i', range(8))\ndef test_i(i):\n    pass\n"
    )
    log = tmp_path / "log-{rank}.jsonl"
    result = pytester.runpytest_subprocess(
        "-p",
        "racecheck",
        "-p",
        "xdist",
        "-n",
        "2",
        "--racecheck-steps=2",
        _arms_schedule(tmp_path / "s.json", "a", 2),
        f"--racecheck-log={log}",
    )
    assert result.ret == 0
    files = sorted(p.name for p in tmp_path.glob("log-*.jsonl"))
    assert files == ["log-0-gw0.jsonl", "log-0-gw1.jsonl", "log-0.jsonl"]
    assert [e["event"] for e in events(tmp_path / "log-0.jsonl")] == ["finish"]  # the controller runs no test
    outcomes = [e for f in tmp_path.glob("log-0-gw*.jsonl") for e in events(f, "outcome")]
    assert sorted((e["trial"], e["test"]) for e in outcomes) == sorted(
        (t, f"test_many.py::test_i[{i}]") for t in range(2) for i in range(8)
    )
    assert {e["worker"] for e in outcomes} == {"gw0", "gw1"}


@pytest.mark.parametrize(
    ("nodeid", "step", "count", "stripped"),
    [
        ("t.py::test_x[1-True-3-10]", 2, 10, "t.py::test_x[1-True]"),
        ("t.py::test_x[3-10]", 2, 10, "t.py::test_x"),
        ("t.py::test_x[3-10]", 0, 1, "t.py::test_x[3-10]"),
        ("t.py::test_x[a-3-12]", 2, 10, "t.py::test_x[a-3-12]"),
        ("t.py::test_x[2-10]", 2, 10, "t.py::test_x[2-10]"),  # a parameter that looks like a step id
        ("t.py::T::test_u", 0, 4, "t.py::T::test_u"),  # a unittest case: not parametrized
    ],
)
def test_strip_step_removes_exactly_the_steps_id(nodeid, step, count, stripped):
    assert strip_step(nodeid, step, count) == stripped


STEPS = """
import pytest

@pytest.mark.parametrize("n", [1, 2])
def test_p(n):
    pass

def test_q():
    pass
"""


def test_the_plugin_repeats_tests_itself_with_pytest_repeats_ids(pytester):
    """--racecheck-steps needs no other plugin and gives the ids, and the step-major order, that
    pytest-repeat's --count with --repeat-scope=session gave, so records and reports keep them."""
    pytester.makepyfile(test_steps=STEPS)
    ids = pytester.runpytest(
        "-p", "racecheck", "-p", "no:repeat", "--racecheck-steps=3", "--collect-only", "-q"
    ).stdout.lines
    ids = [line for line in ids if "::" in line]
    assert ids == [
        f"test_steps.py::{t}" for k in range(1, 4) for t in (f"test_p[1-{k}-3]", f"test_p[2-{k}-3]", f"test_q[{k}-3]")
    ]
    pytest.importorskip("pytest_repeat")
    theirs = pytester.runpytest(
        "-p", "racecheck", "-p", "repeat", "--count=3", "--repeat-scope=session", "--collect-only", "-q"
    ).stdout.lines
    assert [line for line in theirs if "::" in line] == ids


def test_steps_map_to_blocks_without_pytest_repeat(pytester, tmp_path):
    pytester.makepyfile(test_steps=STEPS)
    log = tmp_path / "log.jsonl"
    schedule = _arms_schedule(tmp_path / "s.json", "a,b", 2)
    result = pytester.runpytest(
        "-p", "racecheck", "-p", "no:repeat", "--racecheck-steps=4", schedule, f"--racecheck-log={log}"
    )
    assert result.ret == 0
    got = [(e["trial"], e["arm"], e["test"]) for e in events(log, "outcome")]
    tests = ["test_steps.py::test_p[1]", "test_steps.py::test_p[2]", "test_steps.py::test_q"]
    assert got == [(t, a, test) for t in (0, 1) for a in "ab" for test in tests]


def test_pytest_repeats_count_with_racecheck_steps_is_a_usage_error(pytester):
    pytest.importorskip("pytest_repeat")
    pytester.makepyfile(test_steps=STEPS)
    result = pytester.runpytest("-p", "racecheck", "-p", "repeat", "--count=2", "--racecheck-steps=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "use --racecheck-steps" in result.stderr.str()
    result = pytester.runpytest("-p", "racecheck", "--racecheck-steps=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "--racecheck-steps must be >= 1" in result.stderr.str()


OWN_NAMES = """
import json, os
import pytest

def seen(request):
    callspec = getattr(request.node, "callspec", None)
    view = [request.node.name, callspec and callspec.id, callspec and sorted(callspec.params), request.node.nodeid]
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps(view) + "\\n")

@pytest.fixture(scope="module", params=["m1", "m2"])
def shared(request):
    return request.param

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_p(dtype, shared, request):
    seen(request)

def test_q(request):
    seen(request)
"""


def test_a_repeated_test_sees_its_own_name_and_parametrization(pytester, tmp_path, monkeypatch):
    """The step's id is in the node id only: a test that names files or goldens from
    request.node.name or callspec.id sees what plain pytest gives it, whatever the step; and the
    steps still run in order (every test of a step before any of the next, module-scoped
    parameters or not)."""
    pytester.makepyfile(test_own=OWN_NAMES)
    views = {}
    for steps in (1, 3):
        monkeypatch.setenv("SEEN", str(tmp_path / f"seen{steps}"))
        result = pytester.runpytest("-p", "racecheck", "-p", "no:randomly", f"--racecheck-steps={steps}")
        result.assert_outcomes(passed=steps * 5)
        views[steps] = [json.loads(line) for line in (tmp_path / f"seen{steps}").read_text().splitlines()]
    assert [v[:3] for v in views[3]] == [v[:3] for v in views[1]] * 3
    assert [v[3] for v in views[3]] == [with_step_id(v[3], k) for k in (1, 2, 3) for v in views[1]]


def with_step_id(nodeid, step):
    """The node id of a test under --racecheck-steps=3 at `step` (1-based) from its plain one."""
    return f"{nodeid[:-1]}-{step}-3]" if nodeid.endswith("]") else f"{nodeid}[{step}-3]"


UNREPEATABLE = """
import unittest

class TestU(unittest.TestCase):
    def test_counts(self):
        pass

def test_plain():
    pass
"""


def test_a_test_the_steps_cannot_repeat_is_refused_not_run_once(pytester, tmp_path):
    """A unittest.TestCase method is no pytest function: no parametrization repeats it, and it ran
    in the session's first step alone while every step's trial counted it clean. Refused, naming it
    and the isolation that runs it in every trial; one step runs it as pytest does."""
    pytester.makepyfile(test_ut=UNREPEATABLE)
    log = tmp_path / "log.jsonl"
    result = pytester.runpytest("-p", "racecheck", "--racecheck-steps=3", f"--racecheck-log={log}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_ut.py::TestU::test_counts" in result.stderr.str()
    [error] = events(log, "collecterror")
    assert error["nodeid"] == "test_ut.py::TestU::test_counts"
    assert "--isolation process" in error["message"] and "unittest.TestCase" in error["message"]
    pytester.runpytest("-p", "racecheck", "--racecheck-steps=1").assert_outcomes(passed=2)


def test_the_steps_keep_their_order_under_failed_first_and_new_first(pytester):
    """--ff and --nf (pytest's cache) reorder the items in a wrapper around every other collection
    hook: a failed step-2 test ran before step 1."""
    pytester.makepyfile(test_ff="def test_a():\n    assert 0\n\ndef test_b():\n    pass\n")
    pytester.runpytest("-p", "racecheck", "--racecheck-steps=2")  # test_a fails: --ff's first
    for option in ("--ff", "--nf"):
        lines = pytester.runpytest(
            "-p", "racecheck", "--racecheck-steps=2", option, "--collect-only", "-q"
        ).stdout.lines
        ids = [line for line in lines if "::" in line]
        assert ids == [f"test_ff.py::test_{t}[{k}-2]" for k in (1, 2) for t in "ab"], (option, ids)
