"""The tracker's two recording paths side by side on users' code: the run folders that
bench/paths_gpu.sh made with RACECHECK_DETECT_PATH=native and =python, trial by trial (or the
native path's two engines: any two of its variants, each named by its folder).

    python3 bench/paths_compare.py NATIVE_DIR PYTHON_DIR [--out FILE.md]

Each DIR holds run folders (anything with a trials.jsonl under it, found recursively, named by
their path below DIR). For every (run, scenario, arm, test, trial) both paths ran, it compares the
outcome, whether the detector reported, and the reports' text (unnamed streams' handles aside);
the table lists each run with the trials compared, those that agree, and every disagreement. Rows of a foreign_code.csv
(bench/foreign_code.py's table, where the soundness check's counts are) are compared as well.
Exit code 1 when any trial or row disagrees or a run is missing on one side.

Regenerates reports/gpu/paths_compare.md (bench/paths_gpu.sh runs it).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path


def _trials(root: Path) -> dict[str, dict[tuple, dict]]:
    runs: dict[str, dict[tuple, dict]] = {}
    for log in sorted(root.rglob("trials.jsonl")):
        name = str(log.parent.relative_to(root))
        rows = runs.setdefault(name, {})
        for line in log.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[(r.get("scenario"), r.get("arm"), r.get("test"), r.get("trial"))] = r
    return runs


def _what(r: dict) -> tuple:
    # A stream without a name is shown by its cudaStream_t, which differs from process to process.
    reports = tuple(re.sub(r"stream 0x[0-9a-f]+", "stream 0x...", text) for text in r.get("reports") or ())
    return (r.get("outcome"), bool(r.get("detected")), reports)


def _table_rows(root: Path) -> dict[tuple, tuple]:
    rows = {}
    for table in sorted(root.rglob("foreign_code.csv")):
        for r in csv.DictReader(table.open()):
            rows[(r["suite"], r["case"], r["arm"], r["mode"])] = (r["trials"], r["failures"], r["detected"])
    return rows


def compare(native: Path, python: Path) -> tuple[list[str], bool]:
    a, b = _trials(native), _trials(python)
    one, other = native.name, python.name  # the variants, as their folders name them
    lines = [
        f"| run | trials compared | same outcome, detection and reports | detected ({one} / {other}) |",
        "|---|---:|---:|---:|",
    ]
    problems = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"- `{name}`: only in {one if name in a else other}")
            continue
        keys = sorted(set(a[name]) & set(b[name]), key=str)
        same = [k for k in keys if _what(a[name][k]) == _what(b[name][k])]
        det = (sum(bool(a[name][k].get("detected")) for k in keys), sum(bool(b[name][k].get("detected")) for k in keys))
        lines.append(f"| `{name}` | {len(keys)} | {len(same)} | {det[0]} / {det[1]} |")
        for k in keys:
            if k not in same:
                na, pa = _what(a[name][k]), _what(b[name][k])
                problems.append(
                    f"- `{name}` {k}: {one} {na[:2]} ({len(na[2])} reports), {other} {pa[:2]} ({len(pa[2])} reports)"
                )
        if len(set(a[name]) ^ set(b[name])):
            problems.append(f"- `{name}`: {len(set(a[name]) ^ set(b[name]))} trial(s) ran in one of them only")
    ta, tb = _table_rows(native), _table_rows(python)
    if ta or tb:
        lines += [
            "",
            f"| suite | case | arm | mode | trials, failures, detected ({one}) | ({other}) |",
            "|---|---|---|---|---|---|",
        ]
        for key in sorted(set(ta) | set(tb)):
            lines.append(f"| {' | '.join(key)} | {', '.join(ta.get(key, ('-',)))} | {', '.join(tb.get(key, ('-',)))} |")
            if ta.get(key) != tb.get(key):
                problems.append(f"- table row {key}: {one} {ta.get(key)}, {other} {tb.get(key)}")
    lines += ["", "Disagreements:" if problems else "No disagreement.", *problems]
    return lines, not problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("native", type=Path)
    p.add_argument("python", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    lines, ok = compare(args.native, args.python)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
