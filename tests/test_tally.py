"""racecheck.results.tally: the summary.csv contract, built from synthetic trial logs."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from run_kit import record_frame, run_summary, trial_record, write_log
from scipy.stats import binomtest

from racecheck.results import tally

SCENARIO = "main_grad_reuse"
TEST = "scenarios/main_grad_reuse/test_main_grad_reuse.py::test_hsdp_losses_match_baseline[{}]"
PARAMS = ("1-True", "1-False", "3-True", "3-False")


def record(arm, trial, params, outcome, **extra):
    test = TEST.format(params)
    return trial_record(
        run_id="run-1", arm=arm, trial=trial, seed=1000 + trial, test=test, params=params, outcome=outcome, **extra
    )


def row(summary, arm, params=None, scenario=SCENARIO):
    test = tally.ALL_TESTS if params is None else TEST.format(params)
    hit = summary[(summary.scenario == scenario) & (summary.arm == arm) & (summary.test == test)]
    assert len(hit) == 1
    return hit.iloc[0]


@pytest.fixture
def two_arms(tmp_path):
    """baseline fails param i in trial t when (t + i) % 4 == 0 (so not every trial fails);
    fixed never fails."""
    recs = []
    for arm, expect in (("baseline", "race"), ("fixed", "safe")):
        for t in range(8):
            for i, p in enumerate(PARAMS):
                bad = arm == "baseline" and (t + i) % 4 == 0 and t < 6
                recs.append(record(arm, t, p, "failed" if bad else "passed", expect=expect))
    return write_log(tmp_path, recs)


def test_load_records_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        record_frame(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no trial log"):
        record_frame(tmp_path)
    (tmp_path / "trials.jsonl").write_text("")
    with pytest.raises(ValueError, match="no records"):
        record_frame(tmp_path)
    (tmp_path / "trials.jsonl").write_text(record("a", 0, "1-True", "weird").to_json() + "\n")
    with pytest.raises(ValueError, match="unknown outcome"):
        record_frame(tmp_path)


def test_torn_last_line_is_skipped(tmp_path):
    write_log(tmp_path, [record("fixed", 0, "1-True", "passed")])
    with open(tmp_path / "trials.jsonl", "a") as fh:
        fh.write('{"run_id": "run-1", "scen')
    assert len(record_frame(tmp_path)) == 1


def test_summary_columns_and_counts(two_arms):
    summary = tally.summarize(record_frame(two_arms))
    assert list(summary.columns) == list(tally.SUMMARY_COLUMNS)  # no detector: no `detected`
    assert len(summary) == 2 * (1 + len(PARAMS))
    r = row(summary, "baseline", "1-True")  # i = 0: trials 0 and 4 fail
    assert (r.trials, r.failures, r.passed, r.failed) == (8, 2, 6, 2)
    assert r.failure_rate == pytest.approx(0.25)
    ref = binomtest(2, 8).proportion_ci(method="wilson")
    assert (r.ci_low, r.ci_high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    star = row(summary, "baseline")  # trials 0-5 each fail one test; 6 and 7 pass
    assert (star.trials, star.failures, star.passed, star.failed) == (8, 6, 2, 6)
    assert row(summary, "fixed").failures == 0 and row(summary, "fixed").expect == "safe"


def test_sorting_arm_first_appearance_star_first(tmp_path):
    recs = [
        record(arm, 0, p, "passed", scenario=s)
        for s in ("zeta", "alpha")
        for arm in ("zz_fixed", "aa_baseline")
        for p in PARAMS[::-1]
    ]
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    assert list(summary.scenario.drop_duplicates()) == ["alpha", "zeta"]
    first = summary[summary.scenario == "alpha"]
    assert list(first.arm.drop_duplicates()) == ["zz_fixed", "aa_baseline"]
    tests = list(first[first.arm == "zz_fixed"].test)
    assert tests[0] == "*" and tests[1:] == sorted(TEST.format(p) for p in PARAMS)


def test_resumed_run_keeps_the_last_record(tmp_path):
    recs = [record("baseline", t, "1-True", "failed", expect="race") for t in range(3)]
    recs.append(record("baseline", 2, "1-True", "passed", expect="race"))  # re-run of trial 2
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    r = row(summary, "baseline", "1-True")
    assert (r.trials, r.failures, r.passed) == (3, 2, 1)
    assert row(summary, "baseline").trials == 3


def test_trial_outcome_in_star_row(tmp_path):
    recs = [
        record("a", 0, "1-True", "passed"),
        record("a", 0, "1-False", "skipped"),
        record("a", 1, "1-True", "failed"),
        record("a", 1, "1-False", "crash"),
        record("a", 2, "1-True", "skipped"),
        record("a", 2, "1-False", "skipped"),
        record("a", 3, "1-True", "timeout"),
        record("a", 3, "1-False", "error"),
    ]
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    star = row(summary, "a", scenario=SCENARIO)
    counts = {c: int(star[c]) for c in tally.OUTCOME_COLUMNS}
    assert counts == dict(passed=1, skipped=1, crash=1, timeout=1, failed=0, error=0)
    assert star.failures == 2 and star.trials == 3 and star.expect == ""
    skipped_test = row(summary, "a", "1-False")
    assert skipped_test.skipped == 2 and skipped_test.trials == 2  # a skip is no trial


def test_all_skipped_row_has_no_rate(tmp_path):
    recs = [record("a", t, "1-True", "skipped") for t in range(3)]
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    r = row(summary, "a", "1-True")
    assert (r.trials, r.skipped, r.failures) == (0, 3, 0) and pd.isna(r.failure_rate)
    assert (r.ci_low, r.ci_high) == (0.0, 1.0)
    assert row(summary, "a").trials == 0


def test_detected_counts_trials_with_a_report(tmp_path):
    recs = []
    for t in range(4):
        for p in PARAMS[:2]:
            hit = t < 2 and p == "1-True" or t == 0
            recs.append(
                record(
                    "baseline",
                    t,
                    p,
                    "failed" if hit else "passed",
                    detect=True,
                    detected=int(hit),
                    reports=["free while in use"] if hit else [],
                )
            )
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    assert summary.columns[-1] == "detected"
    assert row(summary, "baseline").detected == 2
    assert row(summary, "baseline", "1-True").detected == 2
    assert row(summary, "baseline", "1-False").detected == 1


def test_expect_comes_from_the_first_non_empty_value(tmp_path):
    recs = [record("baseline", 0, "1-True", "failed"), record("baseline", 1, "1-True", "failed", expect="race")]
    summary = tally.summarize(record_frame(write_log(tmp_path, recs)))
    assert set(summary.expect) == {"race"}


def test_write_summary_roundtrip(two_arms):
    summary = run_summary(two_arms)
    back = pd.read_csv(two_arms / "summary.csv", keep_default_na=False)
    assert list(back.columns) == list(tally.SUMMARY_COLUMNS) == list(summary.columns)
    assert set(back[back.test == "*"].arm) == {"baseline", "fixed"}
    assert back.loc[0, "ci_high"] == pytest.approx(summary.loc[0, "ci_high"], rel=1e-5)


def test_write_summary_adds_the_skipped_suites(two_arms):
    (two_arms / "run.json").write_text(
        json.dumps({"skipped": {"big": {"arms": ["a"], "expect": {"a": "race"}, "why": "needs at least 8 ranks"}}})
    )
    summary = run_summary(two_arms)
    row = summary[summary.scenario == "big"].iloc[0]
    assert (row.test, row.arm, row.trials, row.note) == ("*", "a", 0, "skipped: needs at least 8 ranks")
    assert "skipped: needs at least 8 ranks" in (two_arms / "summary.csv").read_text()


def test_summarize_refuses_an_empty_log(two_arms):
    with pytest.raises(ValueError):
        tally.summarize(record_frame(two_arms).iloc[0:0])


def test_signature_counts_only_matching_failures(tmp_path):
    """An unrelated failure (another exception, elsewhere) is not counted as the race."""
    race = dict(signature="AssertionError at scenarios/x.py:77 in test_hsdp", message="update off by 60%")
    other = dict(signature="ConnectionError at tests/net.py:12 in fetch", message="connection reset")
    recs = [
        record("fixed", 0, "1-True", "failed", expect="safe", **other),
        record("fixed", 1, "1-True", "passed", expect="safe"),
        record("baseline", 0, "1-True", "failed", expect="race", **race),
        record("baseline", 0, "1-False", "failed", expect="race", **other),
        record("baseline", 1, "1-True", "failed", expect="race", **other),
    ]
    out = write_log(tmp_path, recs)
    plain = tally.summarize(record_frame(out))
    assert "other_failures" not in plain.columns
    assert row(plain, "fixed").failures == 1 and row(plain, "baseline").failures == 2

    filtered = tally.summarize(record_frame(out), signature=r"AssertionError.*test_hsdp")
    fixed, baseline = row(filtered, "fixed"), row(filtered, "baseline")
    assert (fixed.trials, fixed.failures, fixed.other_failures) == (2, 0, 1)
    # trial 0 failed by the race (its other failure does not count again); trial 1 only otherwise
    assert (baseline.trials, baseline.failures, baseline.other_failures) == (2, 1, 1)
    assert row(filtered, "baseline", "1-False").other_failures == 1
    with pytest.raises(ValueError, match="invalid failure signature"):
        tally.summarize(record_frame(out), signature="(")
