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
    # correct code: every named profile, each delay with pressure and with poison, the cases' own
    assert fsdp2 == {f"profile:{p}" for p in (*fc.FSDP2_PROFILES, *(c.profile for c in fc.CASES))}
    assert {"profile:enter_delay", "profile:sleep@stream_wait:3ms,pressure@free", "profile:poison"} <= fsdp2
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


def test_rows_name_the_whole_trial_rows_and_merge_replaces_the_same_key(fc, tmp_path):
    run = fc.Run("megatron_fsdp", "detect", ("tests/test_hsdp.py",))
    node = "tests/test_hsdp.py::test_hsdp_losses_match_baseline[1-True]"
    row = {"scenario": "megatron_fsdp", "arm": "asis", "expect": "race", "trials": 10, "detected": 10}
    _summary(tmp_path / "a", [{**row, "test": node, "failures": 9}, {**row, "test": "*", "failures": 10}])
    rows = fc.rows_of(run, tmp_path / "a")
    shared = {"suite": "megatron_fsdp", "arm": "asis", "expect": "race", "mode": "detect", "path": ""}
    shared.update(trials="10", detected="10")
    assert rows == [
        {**shared, "case": "test_hsdp_losses_match_baseline[1-True]", "failures": "9"},
        {**shared, "case": fc.ANY_TEST, "failures": "10"},
    ]
    report = tmp_path / "report"
    fc.merge(report, rows)
    natural = dict(rows[0], mode="natural", failures="0", detected="")
    fc.merge(report, [natural, dict(rows[0], failures="10")])
    with open(report / "foreign_code.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["case"], r["mode"], r["failures"]) for r in table] == [
        (fc.ANY_TEST, "detect", "10"),  # kept: no new row of its key
        ("test_hsdp_losses_match_baseline[1-True]", "natural", "0"),
        ("test_hsdp_losses_match_baseline[1-True]", "detect", "10"),  # replaced
    ]
    assert list(table[0]) == list(fc.COLUMNS)


def _trials(folder: Path, records: list[dict]) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_systematic_bound_is_the_first_failing_trial_and_merges_by_case(fc, tmp_path):
    node = "tests/test_overlap.py::test_offload_copy"
    _trials(
        tmp_path / "run",
        [
            {"test": node, "arm": "race", "trial": 0, "outcome": "passed", "handoffs": 3, "delayed": []},
            {"test": node, "arm": "race", "trial": 2, "outcome": "failed", "delayed": ["stream_wait@o.py:45/s1"]},
            {"test": node, "arm": "race", "trial": 1, "outcome": "failed", "delayed": ["stream_enter@o.py:40/s1"]},
            {"test": node, "arm": "correct", "trial": 0, "outcome": "passed", "handoffs": 2, "delayed": []},
            {"test": node, "arm": "correct", "trial": 1, "outcome": "passed", "delayed": ["stream_enter@o.py:40/s1"]},
        ],
    )
    bounds = fc.bounds_of(tmp_path / "run")
    assert bounds[("test_offload_copy", "race")] == {
        "k": 3,
        "trials": 3,
        "first": 1,
        "delayed": "stream_enter@o.py:40/s1",
    }
    assert bounds[("test_offload_copy", "correct")]["first"] is None
    report = tmp_path / "report"
    fc.merge_bounds(report, {("plain_torch", *k): v for k, v in bounds.items()})
    later = {("plain_torch", "test_offload_copy", "race"): dict(bounds[("test_offload_copy", "race")], trials=30)}
    merged = fc.merge_bounds(report, later)  # the same key is replaced, the other kept
    assert merged[("plain_torch", "test_offload_copy", "race")]["trials"] == 30
    assert merged[("plain_torch", "test_offload_copy", "correct")]["k"] == 2


def test_from_runs_rebuilds_rows_without_running(fc, tmp_path, monkeypatch):
    run = fc.Run("plain_torch", "detect", fc.WHOLE_SUITE["plain_torch"])
    node = "tests/test_overlap.py::test_offload_copy"
    _summary(
        tmp_path / "packed" / "runs" / run.name,
        [
            {
                "scenario": "plain_torch",
                "test": node,
                "arm": "race",
                "expect": "race",
                "trials": 10,
                "failures": 10,
                "detected": 10,
            }
        ],
    )
    monkeypatch.setattr(fc, "execute", lambda *a, **k: pytest.fail("--from-runs must run nothing"))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "foreign_code.py",
            "--out",
            str(tmp_path / "out"),
            "--suites",
            "plain_torch",
            "--modes",
            "detect",
            "--from-runs",
            str(tmp_path / "packed"),
            "--report",
            str(tmp_path / "report"),
        ],
    )
    assert fc.main() == 0
    with open(tmp_path / "report" / "foreign_code.csv", newline="") as f:
        assert [(r["case"], r["mode"], r["detected"]) for r in csv.DictReader(f)] == [
            ("test_offload_copy", "detect", "10")
        ]
