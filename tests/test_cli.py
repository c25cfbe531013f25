"""The command line: bad input gets one line and exit 2 (3 for infrastructure), never a traceback;
`list`, `--trials auto`, `--gate`, replay lines and pytest-xdist (the motivating scenario is run
with the whole catalogue, test_readme_promises.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from run_kit import ALWAYS, expected_failures, one_line_error, racecheck, records, summary_counts, write_suite

CHECKOUT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fast_sessions")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "often,nope"], "unknown arm 'nope' for suite 'tiny'; known: often, never"),
        (["--trials", "0"], "Invalid value for '--trials': must be at least 1"),
        (["--trials", "many"], "Invalid value for '--trials': 'many' is not a whole number or 'auto'"),
        (["--shard", "3/2"], "Invalid value for '--shard': '3/2': need 1 <= i <= N"),
        (["--shard", "half"], "Invalid value for '--shard': 'half' is not of the form i/N"),
        (["--stop-when", "often:fails>=2"], "Invalid value for '--stop-when': bad rule 'often:fails>=2'"),
        (["--config", "missing.toml"], "missing.toml: no such config file"),
        (["--scenario", "main_grad_reuse", "--config", "pyproject.toml"], "--scenario and --config exclude each other"),
        (["--gate", "--fixed", "never"], "--gate needs --fixed ARM and --baseline ARM"),
        (["--fixed", "never"], "--fixed needs --gate"),
        (["--gate", "--fixed", "never", "--baseline", "gone"], "Invalid value for --baseline: arm 'gone' is not one"),
        (["--resume", "nowhere"], "Invalid value for --resume: cannot resume it: nowhere: no run.json"),
        (
            ["--stop-when", "gone:failures>=1"],
            "Invalid value for --stop-when: rule 'gone:failures>=1' names arm 'gone'",
        ),
        (["--out", "pyproject.toml/o"], "Invalid value for --out: cannot create pyproject.toml/o: Not a directory"),
        (["--perturb", "sleep@nowhere"], "Invalid value for --perturb: unknown injection point 'nowhere'"),
        (["--perturb", "rs_delay", "--no-perturb"], "--perturb and --no-perturb exclude each other"),
        (["--perturb", "reorder@stream_enter>stream_wait"], "Invalid value for --perturb: patch mode takes sleep@"),
        (
            ["--perturb", "sleep@stream_enter:5ms/side", "--delay-ms", "1"],
            "rules only, not sleep@stream_enter:1ms/side",
        ),
        # Numbers: nan passes every comparison-based range, and a bare NaN in run.json reads back as none.
        (["--timeout", "nan"], "Invalid value for '--timeout': nan is not a number of seconds from 1 to 604800"),
        (["--timeout", "inf"], "Invalid value for '--timeout': inf is not a number of seconds from 1 to 604800"),
        (["--timeout", "1e9"], "Invalid value for '--timeout': 1e9 is not a number of seconds from 1 to 604800"),
        (["--timeout", "0.5"], "Invalid value for '--timeout': 0.5 is not a number of seconds"),
        (["--max-time", "nan"], "Invalid value for '--max-time': nan is not a number of seconds from 1 to 604800"),
        (["--delay-ms", "nan"], "'--delay-ms': nan is not a number of milliseconds from 0 to 3600000 (an hour)"),
        (["--delay-ms", "inf"], "Invalid value for '--delay-ms': inf is not a number of milliseconds"),
        (["--delay-ms", "1e12"], "Invalid value for '--delay-ms': 1e12 is not a number of milliseconds"),
        (["--delay-ms", "-1"], "Invalid value for '--delay-ms': -1 is not a number of milliseconds"),
        (["--delay-ms", "soon"], "Invalid value for '--delay-ms': 'soon' is not a number"),
        (["--perturb", ""], "Invalid value for --perturb: '' is no profile; write 'off' for none"),
        (["--perturb", ",,,"], "Invalid value for --perturb: ',,,' names no perturbation rule; write 'off' for none"),
        (["--perturb", "sleep@stream_enter:2h"], "Invalid value for --perturb: bad perturbation rule"),
        (["--perturb", "sleep@stream_enter:7200s"], "7200s is longer than an hour, the longest delay racecheck takes"),
        (["--world-size", "100000"], "tiny would run 100000 ranks on this machine, and a run on the CPU takes"),
    ],
)
def test_bad_options_get_one_line_and_exit_2(project, args, message):
    assert message in one_line_error(racecheck("run", "-q", *args, cwd=project))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--bound", "nan"], "Invalid value for '--bound': nan is not a rate in [0, 1]"),
        (["plan", "--baseline-rate", "0.5", "--alpha", "inf"], "'--alpha': inf is not strictly between 0 and 1"),
        (["gate", ".", "--fixed", "a", "--baseline", "b", "--max-rate", "nan"], "'--max-rate': nan is not a rate"),
        (["gate", ".", "--fixed", "a", "--baseline", "b", "--confidence", "1"], "1 is not strictly between 0 and 1"),
    ],
)
def test_every_number_option_refuses_nan_and_out_of_range_in_one_line(tmp_path, args, message):
    assert message in one_line_error(racecheck(*args, cwd=tmp_path))


def test_backend_cuda_without_a_gpu_is_a_usage_error(project):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = one_line_error(racecheck("run", "-q", "--backend", "cuda", "--out", "o", cwd=project))
    assert "Invalid value for --backend: cuda: no CUDA device is available" in err
    assert not (project / "o").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"arm": "a"}', "trials.jsonl:2: not a trial record: missing field(s) run_id"),
        ("[1, 2]", "trials.jsonl:2: not a trial record: not a JSON object"),
    ],
)
def test_a_log_line_that_is_no_record_is_a_usage_error(tmp_path, line, message):
    record = (
        '{"run_id": "r", "scenario": "s", "arm": "a", "expect": "", "trial": 0, "seed": 0, '
        '"test": "t", "params": "", "outcome": "passed"}'
    )
    (tmp_path / "trials.jsonl").write_text(f"{record}\n{line}\n")
    (tmp_path / "run.json").write_text("{}")
    for args in (
        ["report", tmp_path],
        ["gate", tmp_path, "--fixed", "a", "--baseline", "b"],
        ["merge", tmp_path, tmp_path / "other", "--out", tmp_path / "m"],
    ):
        if args[0] == "merge":
            (tmp_path / "other").mkdir(exist_ok=True)
            (tmp_path / "other" / "trials.jsonl").write_text(f"{record}\n")
            (tmp_path / "other" / "run.json").write_text("{}")
        assert message in one_line_error(racecheck(*args, cwd=tmp_path)), args


def test_report_output_that_cannot_be_written_and_a_folder_merged_twice(tmp_path):
    record = (
        '{"run_id": "r", "scenario": "s", "arm": "a", "expect": "", "trial": 0, "seed": 0, '
        '"test": "t", "params": "", "outcome": "passed"}'
    )
    (tmp_path / "trials.jsonl").write_text(record + "\n")
    (tmp_path / "run.json").write_text("{}")
    err = one_line_error(racecheck("report", tmp_path, "--output", tmp_path / "no" / "r.txt", cwd=tmp_path))
    assert "Invalid value for --output: cannot write" in err
    err = one_line_error(racecheck("merge", tmp_path, tmp_path / ".", "--out", tmp_path / "m", cwd=tmp_path))
    assert "are the same run folder" in err


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[tool.racecheck\n", "not valid TOML"),
        ("[tool.other]\n", "no [tool.racecheck] table"),
        ("[tool.racecheck]\ncolour = 1\n[tool.racecheck.arms.a]\n", "unknown key(s) colour"),
        ("[tool.racecheck]\n", "needs at least one [arms.NAME] table"),
        ("[tool.racecheck.arms.a]\nenv = 'X=1'\n", "arm 'a': env must be a table"),
        ("[tool.racecheck.arms.a]\nexpect = 'maybe'\n", "arm 'a': expect must be one of race, safe"),
        ("[tool.racecheck.arms.a]\ngit = 3\n", "arm 'a': git must be a non-empty string"),
        ("[tool.racecheck]\nworld_size = 0\n[tool.racecheck.arms.a]\n", "world_size must be a positive integer"),
        (
            "[tool.racecheck]\nworld_size = 2\nmin_world_size = 3\n[tool.racecheck.arms.a]\n",
            "min_world_size 3 is larger than world_size 2",
        ),
        ("[tool.racecheck]\ndefault_arms = ['b']\n[tool.racecheck.arms.a]\n", "default arm 'b' is not defined"),
        ("[tool.racecheck]\ndefault_arms = []\n[tool.racecheck.arms.a]\n", "default_arms is empty; name at least one"),
        # Names the command line cannot give back (--arms splits at commas, reads 'all' as every arm).
        ('[tool.racecheck.arms."on,off"]\n', "arm name 'on,off' cannot be given on the command line"),
        ('[tool.racecheck.arms.""]\n', "arm name '' cannot be given on the command line"),
        ("[tool.racecheck.arms.all]\n", "arm name 'all' cannot be given on the command line"),
        ('[tool.racecheck.arms."a b"]\n', "arm name 'a b' cannot be given"),
        ('[tool.racecheck.arms."a:b"]\n', "arm name 'a:b' cannot be given"),
        # What no process environment takes.
        ('[tool.racecheck.arms.a]\nenv = { "X=1" = "2" }\n', "arm 'a': env: 'X=1' is no variable name"),
        ('[tool.racecheck.arms.a]\nenv = { X = "a\\u0000b" }\n', "arm 'a': env: the value of X holds NUL"),
    ],
)
@pytest.mark.parametrize("command", ["run", "list"])
def test_an_invalid_config_is_a_usage_error(tmp_path, toml, message, command):
    (tmp_path / "pyproject.toml").write_text(toml)
    assert message in one_line_error(racecheck(command, "--config", "pyproject.toml", cwd=tmp_path))


def test_an_unreadable_config_is_a_usage_error(tmp_path):
    (tmp_path / "c.toml").write_bytes(b"\xff\xfe[")
    assert "c.toml: cannot read it" in one_line_error(racecheck("run", "--config", "c.toml", cwd=tmp_path))


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        ({"test_bad.py": "def test_f(:\n    pass\n"}, [], "pytest could not collect test_bad.py: SyntaxError"),
        ({}, ["--", "--no-such-option"], "pytest rejected its arguments: unrecognized arguments: --no-such-option"),
        ({}, ["--", "-k", "nothing_matches"], "pytest collected no tests (pytest -k nothing_matches)"),
        ({"conftest.py": "import no_such_module\n"}, [], "conftest.py: ModuleNotFoundError: No module named"),
    ],
)
def test_suites_pytest_cannot_run_are_usage_errors(project, files, args, message):
    for name, text in files.items():
        (project / name).write_text(text)
    assert message in one_line_error(racecheck("run", "--trials", 2, "--out", "o", "-q", *args, cwd=project))


def test_what_one_arms_session_cannot_run_is_named_by_its_arm(tmp_path):
    root = write_suite(
        tmp_path / "p",
        arms={"good": {}, "odd": {"pytest_args": ["--no-such-option"]}},
        tests={"test_x.py": ALWAYS},
    )
    res = racecheck("run", "--trials", 1, "--out", "o", cwd=root)
    assert res.code == 2 and "Traceback" not in res.err, res
    # `good` ran first (the arms' order) and its trial is kept, summary.csv too
    assert res.err.strip().splitlines()[-1] == (
        "racecheck: error: arm 'odd': pytest rejected its arguments: unrecognized arguments: --no-such-option; "
        f"the trials that finished are in {root / 'o'}"
    )
    assert (root / "o" / "summary.csv").is_file() and {r.arm for r in records(root / "o")} == {"good"}


def test_a_session_that_dies_before_collecting_is_an_infrastructure_error(project):
    (project / "conftest.py").write_text("import os\nos._exit(7)\n")
    err = one_line_error(racecheck("run", "--trials", 2, "--out", "o", "-q", cwd=project), code=3)
    assert err.startswith("racecheck: infrastructure error: the pytest session ended (crashed, exit code 7)")


def test_list_shows_the_project_suite_and_the_catalogue(project):
    res = racecheck("list", "--scenarios", CHECKOUT / "scenarios", cwd=project)
    assert res.code == 0, res
    assert "tiny  (config " in res.out and " *often  race" in res.out and " *never  safe" in res.out
    assert "main_grad_reuse  (scenario main_grad_reuse/; world size 2; default perturb rs_window)" in res.out
    assert " *baseline         race" in res.out and "  record_stream    safe" in res.out


def test_trials_auto_and_the_gate(tmp_path):
    root = write_suite(tmp_path / "p", arms={"bad": {}, "good": {}}, tests={"test_x.py": ALWAYS})
    res = racecheck(
        "run",
        "--trials",
        "auto",
        "--gate",
        "--fixed",
        "good",
        "--baseline",
        "bad",
        "--out",
        tmp_path / "pass",
        "-q",
        cwd=root,
    )
    assert res.code == 0, res
    assert "--trials auto: 9 trials per arm" in res.err and res.out.rstrip().endswith("gate: PASS")
    assert summary_counts(tmp_path / "pass")[("good", "*")] == (0, 9)
    res = racecheck(
        "run",
        "--trials",
        2,
        "--gate",
        "--fixed",
        "bad",
        "--baseline",
        "good",
        "--out",
        tmp_path / "fail",
        "-q",
        cwd=root,
    )
    assert res.code == 1 and res.out.rstrip().endswith("gate: FAIL"), res
    res = racecheck(
        "run",
        "--trials",
        2,
        "--gate",
        "--fixed",
        "good",
        "--baseline",
        "bad",
        "--max-rate",
        0.2,
        "--confidence",
        0.95,
        "--out",
        tmp_path / "undecided",
        "-q",
        cwd=root,
    )
    assert res.code == 4 and res.out.rstrip().endswith("gate: UNDECIDED"), res


def test_a_replay_line_reruns_the_failing_trial(project, tmp_path):
    assert racecheck("run", "--trials", 4, "--seed", 2, "--out", tmp_path / "out", "-q", cwd=project).code == 0
    failing = next(r for r in records(tmp_path / "out") if r.outcome == "failed")
    argv = shlex.split(failing.replay)
    assert argv[:2] == ["racecheck", "run"]
    cut = argv.index("--")
    res = racecheck(*argv[1:cut], "--out", tmp_path / "replay", "-q", *argv[cut:], cwd=project)
    assert res.code == 0, res
    (again,) = records(tmp_path / "replay")
    assert (again.test, again.arm, again.seed, again.outcome, again.signature) == (
        failing.test,
        failing.arm,
        failing.seed,
        "failed",
        failing.signature,
    )


def test_pytest_xdist_workers_are_merged_into_one_outcome_per_test(project, tmp_path):
    """And in a one-rank session each worker is a world of its own: under `-n 2` both workers init
    the default process group from the session's environment, which with one MASTER_PORT would
    each host their store on it (EADDRINUSE)."""
    pytest.importorskip("xdist")
    (project / "conftest.py").write_text(XDIST_WORLD_CONFTEST)
    (project / "test_world.py").write_text(XDIST_WORLD_TEST)
    res = racecheck("run", "--trials", 3, "--out", tmp_path / "out", "-q", "--", "-p", "xdist", "-n", "2", cwd=project)
    assert res.code == 0, res
    recs = records(tmp_path / "out")
    assert len(recs) == len({(r.arm, r.trial, r.test) for r in recs}) == 24
    counts, expected = summary_counts(tmp_path / "out"), expected_failures({"often": 0.6, "never": 0.0}, range(3))
    assert {k: counts[k] for k in expected} == expected
    assert [counts[(arm, t)] for arm in ("often", "never") for t in ("test_a", "test_b")] == [(0, 3)] * 4


def test_a_unittest_suite_is_refused_by_session_isolation_and_runs_every_trial_in_process(tmp_path):
    suite = write_suite(
        tmp_path / "u",
        arms={"main": {"expect": "safe"}},
        tests={
            "test_u.py": "import unittest\n\nclass TestU(unittest.TestCase):\n    def test_u(self):\n        pass\n"
        },
    )
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "s", cwd=suite)
    assert res.code == 2 and "Traceback" not in res.err, res
    line = res.err.strip().splitlines()[-1]  # after the progress's first line
    assert "test_u.py::TestU::test_u: a unittest.TestCase method runs once per pytest session" in line
    assert "--isolation process" in line
    res = racecheck("run", "--trials", 2, "--isolation", "process", "--out", tmp_path / "p", cwd=suite)
    assert res.code == 0, res
    assert sorted((r.trial, r.test) for r in records(tmp_path / "p")) == [
        (0, "test_u.py::TestU::test_u"),
        (1, "test_u.py::TestU::test_u"),
    ]


XDIST_WORLD_CONFTEST = """
import os

import pytest
import torch.distributed as dist


@pytest.fixture(scope="session", autouse=True)
def world():
    if "RANK" in os.environ:  # the common idiom: join the launcher's world with torch's defaults
        dist.init_process_group("gloo")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
"""

XDIST_WORLD_TEST = """
import torch
import torch.distributed as dist


def test_a():
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_b():
    assert dist.get_world_size() == 1
"""
