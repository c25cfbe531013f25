"""The front door under ordinary mishaps: two runs on one folder, an unwritable folder, invalid
TOML, torn and foreign log lines, shards that are not one experiment, test ids matplotlib would
read as mathtext, and a console that is no terminal. Each case checks its exit code and its
one-line message. (A rank that fails at setup: test_readme_promises.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from run_kit import SEEDED_TEST, racecheck, record_frame, records, summary_counts, write_suite

from racecheck.cli.run import describe_worlds
from racecheck.exitcodes import InputError
from racecheck.runner import config_build

pytestmark = pytest.mark.usefixtures("fast_sessions")


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_two_runs_started_together_on_one_folder_one_runs_the_other_exits_3(tmp_path):
    # The winner holds the folder for a second at least, so both always overlap. Two tries here;
    # bench/folder_races.py makes twenty (reports/folder_races.md).
    slow = "import time\n\ndef test_hold():\n    time.sleep(1.0)\n"
    root = write_suite(tmp_path / "p", arms={"only": {}}, tests={"test_hold.py": slow})
    command = [sys.executable, "-m", "racecheck", "run", "--trials", "1", "-q", "--out"]
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        procs = [
            subprocess.Popen(command + [str(out)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 3], (attempt, results)
        loser = next(err for code, _, err in results if code == 3)
        assert _one_line(loser).startswith(
            f"racecheck: infrastructure error: {out} is in use by another racecheck run (pid "
        )
        assert [r.outcome for r in records(out)] == ["passed"]  # the winner's run, whole and alone


def test_an_unwritable_run_folder_is_a_usage_error(tmp_path):
    root = write_suite(tmp_path / "p", arms={"never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    res = racecheck("run", "--trials", 1, "--out", "/proc/self/out", "-q", cwd=root)  # not even root writes there
    assert res.code == 2, res
    assert _one_line(res.err).startswith("racecheck: error: Invalid value for --out: cannot create /proc/self/out: ")
    res = racecheck("run", "--trials", 1, "--out", "/proc/self", "-q", cwd=root)  # a folder of the kernel's files
    assert res.code == 2, res
    assert "/proc/self (a link to /proc/" in _one_line(res.err) and "holds files and no racecheck run" in res.err


@pytest.mark.parametrize("command", [("run", "--trials", "1"), ("list",)], ids=["run", "list"])
def test_a_pyproject_that_is_not_toml_is_never_ignored(tmp_path, command):
    (tmp_path / "pyproject.toml").write_text("[tool.racecheck\narms = 1\n")
    res = racecheck(*command, cwd=tmp_path)
    assert res.code == 2, res
    assert f"{tmp_path / 'pyproject.toml'}: not valid TOML: Expected ']'" in _one_line(res.err)


def _completed(out):
    return [json.loads(line) for line in (out / "completed.jsonl").read_text().splitlines()]


def test_torn_and_foreign_log_lines_are_reported_removed_and_their_block_runs_again(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    out = tmp_path / "out"
    assert racecheck("run", "--trials", 3, "--out", out, "-q", cwd=root).code == 0
    whole = summary_counts(out)
    log = out / "trials.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    lost = json.loads(lines[-1])  # the last record of the last block, torn by a kill mid-write
    log.write_text("".join(lines[:2]) + "# a note someone pasted in\n" + "".join(lines[2:-1]) + lines[-1][:25])
    res = racecheck("report", out, cwd=root)  # report skips and names them
    assert res.code == 0 and "line 3 is not JSON" in res.err and "is a torn record" in res.err, res

    res = racecheck("run", "--resume", out, "-q", cwd=root)
    assert res.code == 0, res
    assert "line 3 is not JSON ('# a note someone pasted in'): removed" in res.err
    assert f"trial {lost['trial']} of arm {lost['arm']!r} lost 1 of its 2 records; it runs again" in res.err
    assert summary_counts(out) == whole
    assert all(line.startswith("{") and line.endswith("}") for line in log.read_text().splitlines())
    assert len((out / "trials.jsonl.rejected").read_text().splitlines()) == 2
    reruns = [c for c in _completed(out) if (c["arm"], c["trial"]) == (lost["arm"], lost["trial"])]
    assert len(reruns) == 2  # done before the tear, and once more after it


def test_merge_refuses_shards_that_differ_in_what_a_trial_means_and_accepts_arms_as_resolved(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    assert racecheck("run", "--trials", 2, "--shard", "1/2", "--out", tmp_path / "a", "-q", cwd=root).code == 0
    for name, extra in (
        ("timeout", ["--timeout", "77"]),
        ("isolation", ["--isolation", "process"]),
        ("chunk", ["--chunk", "2"]),
    ):
        res = racecheck("run", "--trials", 2, "--shard", "2/2", *extra, "--out", tmp_path / name, "-q", cwd=root)
        assert res.code == 0, res
        res = racecheck("merge", tmp_path / "a", tmp_path / name, "--out", tmp_path / f"m-{name}", cwd=root)
        assert res.code == 2 and f"their {name} differs" in _one_line(res.err), res
    # The same arms, once by default and once spelled out, are one experiment.
    res = racecheck(
        "run", "--trials", 2, "--shard", "2/2", "--arms", "often,never", "--out", tmp_path / "b", "-q", cwd=root
    )
    assert res.code == 0, res
    res = racecheck("merge", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "m", cwd=root)
    assert res.code == 0, res
    # So is the suite's own profile (off), once by default and once given.
    res = racecheck("run", "--trials", 2, "--shard", "2/2", "--no-perturb", "--out", tmp_path / "d", "-q", cwd=root)
    assert res.code == 0, res
    res = racecheck("merge", tmp_path / "a", tmp_path / "d", "--out", tmp_path / "m3", cwd=root)
    assert res.code == 0, res
    # Different arms are not.
    res = racecheck("run", "--trials", 2, "--shard", "2/2", "--arms", "often", "--out", tmp_path / "c", "-q", cwd=root)
    res = racecheck("merge", tmp_path / "a", tmp_path / "c", "--out", tmp_path / "m2", cwd=root)
    assert res.code == 2 and "their scenarios differs" in _one_line(res.err), res


def test_the_html_report_takes_a_test_id_that_looks_like_mathtext(tmp_path):
    root = write_suite(
        tmp_path / "p",
        arms={"often": {}},
        tests={
            "test_money.py": """
        import pytest

        @pytest.mark.parametrize("price", ["$x^2$", "$_{unclosed", "a$b"])
        def test_price(price, racecheck_seed):
            assert racecheck_seed % 2 == 0
        """
        },
    )
    assert racecheck("run", "--trials", 2, "--out", tmp_path / "out", "-q", cwd=root).code == 0
    res = racecheck("report", tmp_path / "out", "--format", "html", "-o", tmp_path / "r.html", cwd=root)
    assert res.code == 0, res
    assert "test_price[$_{unclosed]" in (tmp_path / "r.html").read_text()


def test_a_console_that_is_no_terminal_gets_status_lines_not_a_bar(tmp_path):
    root = write_suite(tmp_path / "p", arms={"often": {}, "never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    res = racecheck("run", "--trials", 3, "--out", tmp_path / "out", cwd=root)
    assert res.code == 0, res
    assert "\r" not in res.err and "it/s" not in res.err and "trial/s" not in res.err
    assert res.err.splitlines()[0] == "trials: 6 planned"
    assert res.err.splitlines()[-1].startswith("trials: 6/6 done; often ")
    failures = [ln for ln in res.err.splitlines() if ln.startswith("failed: often trial ")]
    assert summary_counts(tmp_path / "out")[("often", "*")][0] > 1
    assert len(failures) == 1  # one line per kind of failure and arm, not one per failing trial


def _suite(name, world_size, min_world_size=1, config_file=None):
    """A suite of two arms, `race` and `safe`, for RunConfig.fitted_to."""
    from pathlib import Path

    from racecheck.suites.catalogue import Arm, Suite

    arms = {"race": Arm("race", "race"), "safe": Arm("safe", "safe")}
    file = Path(config_file) if config_file else None
    return Suite(
        name, Path(name), "", world_size, "off", ("race", "safe"), arms, config_file=file, min_world_size=min_world_size
    )


def _config(*suites, world_size=None):
    from pathlib import Path

    from racecheck.runner.run_config import RunConfig

    return RunConfig(scenarios=tuple(suites), arms=None, trials=1, out=Path("unused"), world_size=world_size)


def test_on_one_gpu_worlds_are_capped_floored_or_skipped_and_named(monkeypatch):
    monkeypatch.setattr(config_build, "cuda_devices", lambda backend: 1)  # describe_worlds names the backend
    config = _config(_suite("wide", 4), _suite("pair", 2, min_world_size=2), _suite("solo", 1)).fitted_to(1)
    assert [s.name for s in config.scenarios] == ["wide", "solo"]
    assert config.worlds == {"wide": 1}
    assert config.skipped["pair"]["why"] == "needs at least 2 ranks (min_world_size), this machine has 1 GPU"
    assert describe_worlds(config) == [
        "wide: 1 rank on cuda",
        "solo: 1 rank on cuda",
        "pair: skipped, needs at least 2 ranks (min_world_size), this machine has 1 GPU",
    ]
    assert _config(_suite("wide", 4), world_size=4).fitted_to(1).worlds == {}  # --world-size wins
    with pytest.raises(InputError, match="has world_size 2, and this machine has 1 GPU: give --world-size 1"):
        _config(_suite("project", 2, config_file="pyproject.toml")).fitted_to(1)
    with pytest.raises(InputError, match="no suite of the run fits this machine"):
        _config(_suite("pair", 2, min_world_size=2)).fitted_to(1)


def test_a_power_of_two_scenario_runs_on_the_most_gpus_it_takes_and_refuses_other_worlds():
    import dataclasses

    even = dataclasses.replace(_suite("even", 8, min_world_size=2), power_of_two_world=True)
    assert _config(even, _suite("any", 8)).fitted_to(6).worlds == {"even": 4, "any": 6}
    assert [_config(even).fitted_to(n).worlds for n in (2, 3, 7)] == [{"even": 2}, {"even": 2}, {"even": 4}]
    assert "needs at least 2 ranks" in _config(even, _suite("any", 8)).fitted_to(1).skipped["even"]["why"]
    for world in (3, 6):
        with pytest.raises(
            InputError, match=f"even splits its buffers evenly over a power-of-two world .* got {world}"
        ):
            _config(even, world_size=world).validate(gpus=None)
    _config(even, world_size=8).validate(gpus=None)


def test_a_skipped_suite_is_a_row_of_the_summary_and_a_line_of_the_table(tmp_path):
    from racecheck.results import report, tally

    root = write_suite(tmp_path / "p", arms={"never": {}}, tests={"test_seeded.py": SEEDED_TEST})
    assert racecheck("run", "--trials", 1, "--out", tmp_path / "out", "-q", cwd=root).code == 0
    summary = tally.summarize(record_frame(tmp_path / "out"))
    skipped = {"pair": {"arms": ["race"], "expect": {"race": "race"}, "why": "needs at least 2 ranks"}}
    table = tally.with_skipped(summary, skipped)
    row = table[table["scenario"] == "pair"].iloc[0]
    assert (row["test"], row["trials"], row["note"]) == ("*", 0, "skipped: needs at least 2 ranks")
    assert "pair\n  race (race)  skipped: needs at least 2 ranks" in report.render_terminal(table)
