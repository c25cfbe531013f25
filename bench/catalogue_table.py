"""The catalogue's runs side by side: the `*` row (failing trials of trials) of each scenario and
arm in each run's summary.csv, and the detector's count where the run had --detect.

    python bench/catalogue_table.py OUT.md perturbed=DIR/summary.csv natural=... detect=... [--title T]

Used by bench/catalogue.sh (CPU) and bench/gpu_check.py (GPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

HEADINGS = {"perturbed": "default profile", "natural": "natural", "random": "random schedule",
            "detect": "detector reported (no perturbation)"}


def table(runs: dict[str, Path]) -> list[str]:
    """Markdown lines: one row per scenario and arm of the first run, one column per run."""
    star = {}
    for name, path in runs.items():
        df = pd.read_csv(path, keep_default_na=False)
        star[name] = df[df.test == "*"].set_index(["scenario", "arm"])
    first = next(iter(star.values()))
    lines = ["| scenario | arm | expect | " + " | ".join(HEADINGS.get(n, n) for n in runs) + " |",
             "|---|---|---|" + "---:|" * len(runs)]
    for (scenario, arm), row in first.iterrows():
        cells = []
        for name in runs:
            found = star[name].loc[(scenario, arm)] if (scenario, arm) in star[name].index else None
            if found is None:
                cells.append("not run")
            else:
                count = found.detected if name == "detect" and "detected" in found else found.failures
                cells.append(f"{int(count)}/{int(found.trials)}")
        lines.append(f"| {scenario} | {arm} | {row.expect} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("runs", nargs="+", help="NAME=summary.csv")
    parser.add_argument("--title", default="Catalogue")
    parser.add_argument("--note", default="Failing trials out of trials (`*` rows).")
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        if Path(path).exists():
            runs[name] = Path(path)
    if not runs:
        parser.error("none of the summary files exists")
    lines = [f"# {args.title}", "", args.note, "", *table(runs)]
    args.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
