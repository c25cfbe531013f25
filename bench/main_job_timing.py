"""Time the README's main job five times and say where each run's time goes; writes
reports/main_job.md (its head; the sections below the first `## ` heading are kept) and
reports/main_job.csv.

Each run is `racecheck run --arms fixed,baseline --trials 10` as a newcomer types it, timed from
the command's start to its exit. The split comes from the run folder: until run.json (the
command's own start: interpreter, imports, options), until the ranks' `collected` event (torchrun,
the ranks' interpreters importing torch, collection, the process group), the tests (the ranks' reported
durations: training steps, delays, collectives), and the rest (teardown, the summary). Every run
must give baseline 10/10 and fixed 0/10 in every parametrization; the table says whether it did.

    .venv/bin/python bench/main_job_timing.py [--runs 5] [--racecheck .venv/bin/racecheck]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd


def one_run(racecheck: str, out: Path) -> dict:
    start = time.time()
    proc = subprocess.run(
        [racecheck, "run", "--arms", "fixed,baseline", "--trials", "10", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    end = time.time()
    run = json.loads((out / "run.json").read_text())
    begun = datetime.datetime.fromisoformat(run["attempts"][0]["started"]).timestamp()
    events = [json.loads(line) for f in sorted((out / "ranks").glob("*-rank-0.jsonl")) for line in open(f)]
    collected = min(e["time"] for e in events if e["event"] == "collected")
    tests = sum(e["duration"] for e in events if e["event"] == "outcome")
    last = max(e["time"] for e in events if e["event"] == "outcome")
    summary = pd.read_csv(out / "summary.csv")
    per_test = summary[summary["test"] != "*"]
    ok = (
        per_test[per_test["arm"] == "baseline"]["failures"].eq(10).all()
        and per_test[per_test["arm"] == "fixed"]["failures"].eq(0).all()
        and len(per_test) == 8
    )
    return {
        "wall_s": round(end - start, 1),
        "exit": proc.returncode,
        "command_start_s": round(begun - start, 1),  # run.json's time has whole seconds
        "session_start_s": round(collected - begun, 1),
        "tests_s": round(tests, 1),
        "after_last_test_s": round(end - last, 1),
        "baseline_10_of_10_everywhere_fixed_0": bool(ok),
        "baseline": "/".join(str(int(x)) for x in per_test[per_test["arm"] == "baseline"]["failures"]),
        "fixed": "/".join(str(int(x)) for x in per_test[per_test["arm"] == "fixed"]["failures"]),
    }


def markdown_table(df: pd.DataFrame) -> list[str]:
    return ["| " + " | ".join(df.columns) + " |", "|" + "---:|" * len(df.columns)] + [
        "| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--racecheck", default=".venv/bin/racecheck")
    parser.add_argument("--out", type=Path, default=Path("reports"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.runs):
            row = {"run": i + 1, **one_run(args.racecheck, Path(work) / f"run{i}")}
            rows.append(row)
            print(row, flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "main_job.csv", index=False)
    load = os.getloadavg()[0]
    text = [
        f"# The main job, timed: {args.runs} runs on {os.cpu_count()} CPU cores, {datetime.date.today().isoformat()}",
        "",
        f"`{' '.join(['python', 'bench/main_job_timing.py', '--runs', str(args.runs)])}` (Python "
        f"{platform.python_version()}; load average {load:.1f} at the end). Each run is "
        "`racecheck run --arms fixed,baseline --trials 10` from its start to its exit. Columns: "
        "the command's own start (interpreter, imports), the session's start (torchrun, the ranks "
        "importing torch, collection), the tests as the ranks report them (training, delays, "
        "collectives), and what follows the last test (teardown, the summary).",
        "",
        *markdown_table(df),
        "",
        f"Median wall time {df['wall_s'].median():.1f} s (min {df['wall_s'].min():.1f}, max "
        f"{df['wall_s'].max():.1f}); baseline 10/10 and fixed 0/10 in every parametrization in "
        f"{int(df['baseline_10_of_10_everywhere_fixed_0'].sum())} of {len(df)} runs.",
    ]
    report = args.out / "main_job.md"
    kept = report.read_text() if report.exists() else ""
    kept = kept[kept.index("\n## ") :] if "\n## " in kept else ""  # earlier sections stay below
    report.write_text("\n".join(text) + "\n" + kept)
    print("\n".join(text))


if __name__ == "__main__":
    main()
