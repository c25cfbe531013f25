"""Tally the trial log into the summary table (`OUT/summary.csv`); racecheck's one pandas user.

The summary's columns are a contract that other tools (CI jobs, bench/) rely on:

    scenario,test,arm,expect,trials,failures,failure_rate,ci_low,ci_high,
    passed,failed,timeout,crash,error,skipped[,detected]

One row per scenario x test x arm, plus one row per scenario x arm with test `*` whose unit is the
trial: a trial (scenario, arm, trial index) fails if any of its tests has a failing outcome
(`Outcome.is_failure`). `ci_low,ci_high` are the 95% Wilson interval (see stats.py,
[Note: Wilson everywhere]). `detected`, present when any record ran with the detector, counts trials
with at least one detector report. A skip is no evidence either way: `trials` counts the trials in
which the test ran (passed+failed+timeout+crash+error), and `skipped`, an addition to the contract's
columns, counts those that skipped it; a row whose trials all skipped has `trials` 0, an empty
`failure_rate` and the uninformative interval (0, 1).

A suite the run skipped (on CUDA, one whose min_world_size exceeds the GPUs) gets one `*` row per
arm with `trials` 0 and its reason in a column `note`, present only when something was skipped.

With a failure `signature` (a regular expression searched in each record's signature and message),
only matching failures count as failures: a failure with another signature is not evidence of the
race under study, and the column `other_failures` counts those trials instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pandas as pd

from racecheck.protocol.records import Outcome, TrialRecord
from racecheck.results import blame, stats
from racecheck.results.rows import ALL_TESTS

LOG_NAME = "trials.jsonl"
SUMMARY_NAME = "summary.csv"
OUTCOME_COLUMNS = ("passed", "failed", "timeout", "crash", "error", "skipped")
SUMMARY_COLUMNS = (
    "scenario",
    "test",
    "arm",
    "expect",
    "trials",
    "failures",
    "failure_rate",
    "ci_low",
    "ci_high",
) + OUTCOME_COLUMNS
_KEY = ["scenario", "arm", "trial", "test"]
# A trial's outcome in the `*` row: the worst failing outcome of its tests, else `passed` if any
# test passed, else `skipped` (unlike record.worst, a skip does not outrank a pass here).
_TRIAL_RANK = {
    Outcome.SKIPPED.value: 0,
    Outcome.PASSED.value: 1,
    Outcome.FAILED.value: 2,
    Outcome.ERROR.value: 3,
    Outcome.TIMEOUT.value: 4,
    Outcome.CRASH.value: 5,
}


class RunRecords(Protocol):
    """A run folder as the results read it, opened by whoever calls them (runner/run_folder.py's
    RunFolder, which checks run.json and each record against the run's plan): its place, its
    run.json (`{}` where it has none) and its trial log's records."""

    @property
    def path(self) -> Path: ...

    @property
    def run(self) -> dict: ...

    def records(self, *, bad_lines: list | None = None) -> Iterator[TrialRecord]: ...


def load_records(folder: RunRecords) -> pd.DataFrame:
    """All records of the folder's `trials.jsonl` in log order, one column per TrialRecord field.

    Raises FileNotFoundError for a missing directory or log, ValueError for a log without records
    and for a line that is no valid record of the run (RunRecords.records). Lines that are not
    JSON are skipped, each described in `df.attrs["bad_lines"]` for the caller to report.
    """
    out = folder.path
    if not out.is_dir():
        raise FileNotFoundError(f"{out}: no such directory")
    log = out / LOG_NAME
    if not log.exists():
        raise FileNotFoundError(f"{log}: no trial log (was the run started with --out {out}?)")
    bad: list = []
    rows = [vars(record) for record in folder.records(bad_lines=bad)]
    if not rows:
        raise ValueError(f"{log}: the trial log holds no records")
    df = pd.DataFrame(rows, columns=[f for f in TrialRecord.__dataclass_fields__])
    df.attrs["bad_lines"] = [f"{log}: {b.describe()}: skipped" for b in bad]
    df.attrs["control"] = blame.controls(out)  # the run's control trials, where it made some
    return df


def latest_records(df: pd.DataFrame) -> pd.DataFrame:
    """The records that count: of a (scenario, arm, trial, test) seen twice (a resumed run re-ran
    it), the last one."""
    return df.drop_duplicates(subset=_KEY, keep="last")


def _aggregate(rows: pd.DataFrame, *, with_detected: bool) -> pd.DataFrame:
    """Counts per (scenario, test, arm) over `rows`, each row one trial's outcome of one test."""
    keys = ["scenario", "test", "arm"]
    grouped = rows.groupby(keys, sort=False)
    out = grouped.agg(expect=("expect", "first"), trials=("ran", "sum"), failures=("is_failure", "sum"))
    counts = pd.crosstab([rows[k] for k in keys], rows["outcome"])
    out = out.join(counts.reindex(columns=list(OUTCOME_COLUMNS), fill_value=0))
    if with_detected:
        out["detected"] = grouped["has_report"].sum()
    if "is_other" in rows:
        out["other_failures"] = grouped["is_other"].sum().astype(int)
    return out.reset_index()


def summarize(df: pd.DataFrame, *, signature: str | None = None) -> pd.DataFrame:
    """The summary table of a record frame (see the module docstring for its contract);
    `signature` keeps only the failures it matches (ValueError for an invalid expression).

    A (scenario, arm, trial, test) seen twice (a resumed run re-ran it) counts once, as its last
    record. Rows are sorted by scenario, then arm in order of first appearance, then test with `*`
    first and the rest by name.
    """
    if df.empty:
        raise ValueError("no trial records to summarize")
    df = latest_records(df).copy()
    df["is_failure"] = df["outcome"].map(lambda o: Outcome(o).is_failure)
    if signature is not None:
        try:
            pattern = re.compile(signature)
        except re.error as exc:
            raise ValueError(f"invalid failure signature expression {signature!r}: {exc}") from None
        text = df["signature"].fillna("") + "\n" + df["message"].fillna("")
        matches = text.map(lambda t: bool(pattern.search(t)))
        df["is_other"] = df["is_failure"] & ~matches
        df["is_failure"] = df["is_failure"] & matches
    df["ran"] = df["outcome"] != Outcome.SKIPPED.value
    reports = df["reports"].map(lambda r: bool(r) if isinstance(r, list) else False)
    df["has_report"] = (df["detected"].fillna(0).astype(int) > 0) | reports
    # An arm's expectation comes from its scenario's definition: the first non-empty value seen.
    expect = df[df["expect"].fillna("") != ""].groupby(["scenario", "arm"])["expect"].first()
    df["expect"] = [expect.get((s, a), "") for s, a in zip(df["scenario"], df["arm"], strict=True)]
    with_detected = bool(df["detect"].fillna(False).astype(bool).any())

    summary = pd.concat(
        [_aggregate(_per_trial(df), with_detected=with_detected), _aggregate(df, with_detected=with_detected)],
        ignore_index=True,
    )
    summary["failures"] = summary["failures"].astype(int)
    summary["trials"] = summary["trials"].astype(int)
    ran = summary["trials"] > 0
    summary["failure_rate"] = (summary["failures"] / summary["trials"].where(ran)).astype(float)
    summary["ci_low"], summary["ci_high"] = stats.wilson_interval(
        summary["failures"].to_numpy(), summary["trials"].to_numpy(), confidence=0.95
    )

    arm_order = {arm: i for i, arm in enumerate(pd.unique(df["arm"]))}
    summary = summary.assign(_arm=summary["arm"].map(arm_order), _star=summary["test"] != ALL_TESTS).sort_values(
        ["scenario", "_arm", "_star", "test"], kind="stable"
    )
    columns = (
        list(SUMMARY_COLUMNS)
        + (["detected"] if with_detected else [])
        + (["other_failures"] if signature is not None else [])
    )
    return summary[columns].reset_index(drop=True)


def _per_trial(df: pd.DataFrame) -> pd.DataFrame:
    """One row per trial (scenario, arm, trial index) of a prepared record frame, as the `*` row
    counts it: its outcome the worst of its tests' (_TRIAL_RANK), failing when any test failed."""
    others = "is_other" in df
    per_trial = (
        df.assign(rank=df["outcome"].map(_TRIAL_RANK))
        .groupby(["scenario", "arm", "trial"], sort=False)
        .agg(
            rank=("rank", "max"),
            is_failure=("is_failure", "any"),
            has_report=("has_report", "any"),
            expect=("expect", "first"),
            **({"is_other": ("is_other", "any")} if others else {}),
        )
        .reset_index()
    )
    if others:  # a trial that failed by the race is not also an "other" failure
        per_trial["is_other"] = per_trial["is_other"] & ~per_trial["is_failure"]
    by_rank = {rank: outcome for outcome, rank in _TRIAL_RANK.items()}
    per_trial["outcome"] = per_trial["rank"].map(by_rank)
    per_trial["ran"] = per_trial["outcome"] != Outcome.SKIPPED.value
    per_trial["test"] = ALL_TESTS
    return per_trial


def skipped_suites(folder: RunRecords) -> dict:
    """The suites a run skipped (run.json's `skipped`); {} for a folder without run.json."""
    return folder.run.get("skipped") or {}


def with_skipped(summary: pd.DataFrame, skipped: dict) -> pd.DataFrame:
    """The summary with one `*` row per arm of every suite the run skipped, `skipped` being
    {suite: {"arms": [...], "expect": {arm: ...}, "why": "..."}} as run.json keeps it: no trials,
    and the reason in the column `note` (present only when something was skipped)."""
    if not skipped:
        return summary
    rows = [
        {
            "scenario": suite,
            "test": ALL_TESTS,
            "arm": arm,
            "expect": info.get("expect", {}).get(arm, ""),
            "trials": 0,
            "failures": 0,
            "failure_rate": float("nan"),
            "ci_low": 0.0,
            "ci_high": 1.0,
            **{c: 0 for c in OUTCOME_COLUMNS},
            "note": f"skipped: {info['why']}",
        }
        for suite, info in skipped.items()
        for arm in info["arms"]
    ]
    extra = pd.DataFrame(rows)
    summary = summary.assign(note="")
    for column in summary.columns.difference(extra.columns):
        extra[column] = 0
    return pd.concat([summary, extra[summary.columns]], ignore_index=True)


def write_summary(folder: RunRecords, records: pd.DataFrame) -> pd.DataFrame:
    """Tally the folder's `records` (load_records), with a row for every suite the run skipped
    (run.json), into its `summary.csv` (replaced whole, never left cut), and return that summary.
    ValueError for a frame without records, OSError where it cannot be written."""
    summary = with_skipped(summarize(records), skipped_suites(folder))
    path = folder.path / SUMMARY_NAME
    tmp = path.with_name(f".{SUMMARY_NAME}.{os.getpid()}.tmp")  # whole or not at all: never a cut table
    try:
        tmp.write_text(summary_to_csv(summary), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return summary


def summary_to_csv(summary: pd.DataFrame) -> str:
    """The summary as CSV text (rates with 6 significant digits)."""
    return summary.to_csv(index=False, float_format="%.6g", lineterminator="\n")
