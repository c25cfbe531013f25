"""Replace one or more scenarios' rows in a catalogue run's summary.csv with those of a later run
of only those scenarios (after a scenario changed, without rerunning the whole catalogue).

    python3 bench/catalogue_replace.py BASE.csv NEWER.csv --output OUT.csv

Every row of NEWER's scenarios in BASE is dropped and NEWER's rows take their place, in BASE's
column order; the other scenarios' rows are kept as they are. The reports that use it name both
runs.

It makes no report of its own: bench/catalogue.sh (reports/catalogue_*.csv) and the GPU check
(reports/gpu/README.md) put a partial rerun's rows in place with it, and the tables are rebuilt
from those CSVs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def replace(base: pd.DataFrame, newer: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in base.columns if c not in newer.columns]
    if missing:
        raise ValueError(f"the newer summary lacks columns {', '.join(missing)}")
    kept = base[~base["scenario"].isin(set(newer["scenario"]))]
    return pd.concat([kept, newer[list(base.columns)]]).sort_values("scenario", kind="stable")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("newer", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    try:
        out = replace(
            pd.read_csv(args.base, dtype=str, keep_default_na=False),
            pd.read_csv(args.newer, dtype=str, keep_default_na=False),
        )
    except (OSError, ValueError, KeyError) as exc:
        print(f"catalogue_replace: {exc}", file=sys.stderr)
        return 2
    out.to_csv(args.output, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
