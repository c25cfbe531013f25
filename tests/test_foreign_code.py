"""bench/foreign_code.py's plan and table, without a GPU: which `racecheck run` each mode makes,
and how their summaries become rows merged into one CSV."""

import csv
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fc():
    spec = importlib.util.spec_from_file_location("foreign_code", ROOT / "bench" / "foreign_code.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_every_case_names_existing_tests_and_one_delay(fc):
    for case in fc.CASES:
        for target in case.targets:
            path, _, test = target.partition("::")
            assert (fc.EXAMPLES / case.suite / path).is_file(), target
            assert not test or f"def {test}(" in (fc.EXAMPLES / case.suite / path).read_text(), target
        assert re.fullmatch(r"sleep@\w+:5ms", case.profile), case.profile


def test_plan_names_one_profile_per_case_and_every_profile_for_fsdp2(fc):
    runs = fc.plan(["plain_torch", "fsdp2"], ["profile", "detect"])
    plain = [r for r in runs if r.suite == "plain_torch" and r.mode.startswith("profile:")]
    assert [r.targets for r in plain] == [c.targets for c in fc.CASES if c.suite == "plain_torch"]
    fsdp2 = {r.mode for r in runs if r.suite == "fsdp2" and r.mode.startswith("profile:")}
    assert fsdp2 == {f"profile:{c.profile}" for c in fc.CASES}
    detect = [r for r in runs if r.mode == "detect"]
    assert [r.flags() for r in detect] == [["--detect", "--no-perturb"]] * 2
    assert all(r.targets == fc.WHOLE_SUITE[r.suite] for r in detect)


def test_run_names_are_distinct_plain_file_names(fc):
    runs = fc.plan(list(fc.ARMS), list(fc.MODES))
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.-") for n in names), names


def _summary(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    with open(folder / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["scenario", "test", "arm", "expect", "trials", "failures", "detected"])
        writer.writeheader()
        writer.writerows(rows)


def test_rows_drop_the_whole_trial_rows_and_merge_replaces_the_same_key(fc, tmp_path):
    run = fc.Run("megatron_fsdp", "detect", ("tests/test_hsdp.py",))
    node = "tests/test_hsdp.py::test_hsdp_losses_match_baseline[1-True]"
    _summary(tmp_path / "a", [
        {"scenario": "megatron_fsdp", "test": node, "arm": "asis", "expect": "race", "trials": 10,
         "failures": 9, "detected": 10},
        {"scenario": "megatron_fsdp", "test": "*", "arm": "asis", "expect": "race", "trials": 10,
         "failures": 10, "detected": 10}])
    rows = fc.rows_of(run, tmp_path / "a")
    assert rows == [{"suite": "megatron_fsdp", "case": "test_hsdp_losses_match_baseline[1-True]", "arm": "asis",
                     "expect": "race", "mode": "detect", "trials": "10", "failures": "9", "detected": "10"}]
    report = tmp_path / "report"
    fc.merge(report, rows)
    natural = dict(rows[0], mode="natural", failures="0", detected="")
    fc.merge(report, [natural, dict(rows[0], failures="10")])
    with open(report / "foreign_code.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["mode"], r["failures"]) for r in table] == [("natural", "0"), ("detect", "10")]
    assert list(table[0]) == list(fc.COLUMNS)
