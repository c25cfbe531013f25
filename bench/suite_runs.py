"""The suite's own runs, recorded: `python -m pytest` as the README's command 2 runs it (the whole
suite, its default workers), timed, with its counts read from a JUnit XML report, one row a run in
reports/suite_runs.csv; then the README's paragraph between `<!-- suite-runs:start -->` and
`<!-- suite-runs:end -->` is rewritten from every row of that CSV (tests/test_readme_figures.py
checks that it is what the CSV gives).

A row: when and at which commit, the machine (CPUs, load average at the start), pytest's exit
code and its counts (passed, skipped, failed, errors), the wall time, the seconds the tests of
tests/test_soundness.py took beside the rest (the sum of their durations), and the longest test
with its duration.

    .venv/bin/python bench/suite_runs.py [--csv reports/suite_runs.csv] [--readme README.md]
    .venv/bin/python bench/suite_runs.py --splice-only    # the README's paragraph from the CSV
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- suite-runs:start -->", "<!-- suite-runs:end -->"
COLUMNS = (
    "date", "commit", "cpus", "load_at_start", "exit", "passed", "skipped", "failed", "errors",
    "wall_s", "soundness_s", "longest_test", "longest_s", "skips",
)  # fmt: skip


def counts(junit: Path) -> dict:
    """Passed, skipped, failed and errors of a JUnit XML report, the soundness tests' seconds and
    the longest test."""
    tally: dict[str, float] = defaultdict(float)
    reasons: dict[str, int] = defaultdict(int)
    longest = ("", 0.0)
    for case in ET.parse(junit).getroot().iter("testcase"):
        seconds = float(case.get("time") or 0)
        kind = next((c.tag for c in case if c.tag in ("skipped", "failure", "error")), "passed")
        tally[kind] += 1
        for skip in case.iter("skipped"):
            reasons[(skip.get("message") or "").removeprefix("Skipped: ").split(":")[0]] += 1
        if case.get("classname", "").startswith("tests.test_soundness"):
            tally["soundness_s"] += seconds
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        longest = max(longest, (name, seconds), key=lambda item: item[1])
    return {
        "passed": int(tally["passed"]),
        "skipped": int(tally["skipped"]),
        "failed": int(tally["failure"]),
        "errors": int(tally["error"]),
        "soundness_s": f"{tally['soundness_s']:.1f}",
        "longest_test": longest[0].removeprefix("tests."),
        "longest_s": f"{longest[1]:.1f}",
        "skips": "; ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda item: -item[1])),
    }


def run_suite() -> dict:
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    row = {
        "date": datetime.date.today().isoformat(),
        "commit": commit.stdout.strip(),
        "cpus": str(os.cpu_count()),
        "load_at_start": f"{os.getloadavg()[0]:.1f}",
    }
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "suite.xml"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", f"--junitxml={junit}", "-q"], cwd=ROOT)
        row["wall_s"] = f"{time.monotonic() - started:.1f}"
        row["exit"] = str(proc.returncode)
        row.update(counts(junit))
    return row


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def paragraph(rows: list[dict]) -> str:
    """What the README says of the suite's recorded runs (its block between the markers)."""
    if not rows:
        return "No run of the suite is recorded yet (`python bench/suite_runs.py` records one)."

    def span(key: str, unit: str = " s") -> str:
        low, high = min(float(r[key]) for r in rows), max(float(r[key]) for r in rows)
        return f"{low:.1f}{unit}" if low == high else f"{low:.1f} to {high:.1f}{unit}"

    last = rows[-1]
    dates = sorted({r["date"] for r in rows})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    skips = f"; skipped: {last['skips']}" if last.get("skips") else ""
    text = (
        f"Recorded by `python bench/suite_runs.py` in `reports/suite_runs.csv` ({len(rows)} run(s), {when}, "
        f"on a machine of {last['cpus']} CPUs shared with other work, load average {span('load_at_start', '')} "
        f"at the start): the suite took {span('wall_s')} of wall time; the last run, at {last['commit']}, "
        f"had {last['passed']} passed, {last['skipped']} skipped, {last['failed']} failed and {last['errors']} "
        f"errors (exit {last['exit']}{skips}); the tests of `tests/test_soundness.py` took "
        f"{span('soundness_s')} of it beside the rest, and the longest test, `{last['longest_test']}`, "
        f"{span('longest_s')}."
    )
    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)


def splice(readme: Path, rows: list[dict]) -> None:
    text = readme.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{paragraph(rows)}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=ROOT / "reports" / "suite_runs.csv")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--splice-only", action="store_true", help="rewrite the README's paragraph, run nothing")
    args = parser.parse_args()
    rows = read_rows(args.csv)
    if not args.splice_only:
        rows.append(run_suite())
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(", ".join(f"{k}={rows[-1][k]}" for k in COLUMNS))
    splice(args.readme, rows)


if __name__ == "__main__":
    main()
