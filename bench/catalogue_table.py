"""The catalogue's runs side by side, from their summary CSVs (the `*` row of each scenario and
arm: failing trials of trials, or trials with a detector report where the run had --detect).

Two layouts:
- runs (default): one column per NAME=CSV given, headed by the run's kind;
      python bench/catalogue_table.py OUT.md perturbed=DIR/summary.csv natural=... detect=...
- the benchmark (`--benchmark`): the fixed columns of BENCHMARK (expect; CPU profile / natural /
  random; GPU profile / natural / random; the detector on the CPU and on the GPU; the CUDA
  sanitizer on the GPU), a cell "not run" where its CSV is missing or lacks the row, and below it,
  per tool, recall over race arms and false reports over safe arms, computed from the same CSVs;
      python bench/catalogue_table.py OUT.md --benchmark cpu_perturbed=reports/catalogue_perturbed.csv ...
  `--splice FILE` also replaces the text between FILE's `<!-- benchmark:start -->` and
  `<!-- benchmark:end -->` markers with the table.

A sanitizer CSV counts the trials in which torch.cuda._sanitizer reported: `racecheck report OUT
--format csv --signature CUDASanitizerErrors`, so failures by wrong numbers alone do not count.
Used by bench/catalogue.sh (CPU) and bench/gpu_check.py (GPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

HEADINGS = {
    "perturbed": "default profile",
    "natural": "natural",
    "random": "random schedule",
    "detect": "detector reported (no perturbation)",
    "sanitizer": "sanitizer reported",
}

# The benchmark's columns: (run name, heading, what a cell counts).
BENCHMARK = (
    ("cpu_perturbed", "CPU profile", "failures"),
    ("cpu_natural", "CPU natural", "failures"),
    ("cpu_random", "CPU random", "failures"),
    ("gpu_perturbed", "GPU profile", "failures"),
    ("gpu_natural", "GPU natural", "failures"),
    ("gpu_random", "GPU random", "failures"),
    ("cpu_detect", "detector CPU", "detected"),
    ("gpu_detect", "detector GPU", "detected"),
    ("gpu_sanitizer", "sanitizer GPU", "failures"),
)
# What each column measures, for the recall table.
TOOLS = {
    "cpu_perturbed": "racecheck injector, default profile (CPU)",
    "cpu_natural": "the suite alone (CPU)",
    "cpu_random": "racecheck random schedule (CPU)",
    "gpu_perturbed": "racecheck injector, default profile (GPU)",
    "gpu_natural": "the suite alone (GPU)",
    "gpu_random": "racecheck random schedule (GPU)",
    "cpu_detect": "racecheck detector (CPU)",
    "gpu_detect": "racecheck detector (GPU)",
    "gpu_sanitizer": "torch.cuda._sanitizer (GPU)",
}
START, END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def star_rows(path: Path) -> pd.DataFrame:
    """The `*` rows of one summary CSV, indexed by (scenario, arm)."""
    df = pd.read_csv(path, keep_default_na=False)
    return df[df.test == "*"].set_index(["scenario", "arm"])


def count(row: pd.Series | None, field: str) -> tuple[int, int] | None:
    """(counted trials, trials) of one `*` row, or None when the row or its column is missing."""
    if row is None or field not in row or row[field] == "":
        return None
    return int(row[field]), int(row.trials)


def cell(value: tuple[int, int] | None) -> str:
    return "not run" if value is None else f"{value[0]}/{value[1]}"


def other(row: pd.Series | None) -> str:
    """For a run counted by failure signature (the sanitizer's): the trials that failed otherwise."""
    if row is None or "other_failures" not in row or row.other_failures in ("", 0, "0"):
        return ""
    return f" ({int(row.other_failures)} failed otherwise)"


def lookup(runs: dict[str, pd.DataFrame], name: str, key: tuple[str, str]) -> pd.Series | None:
    df = runs.get(name)
    return df.loc[key] if df is not None and key in df.index else None


def table(runs: dict[str, Path]) -> list[str]:
    """The runs layout: one row per scenario and arm of the first run, one column per run."""
    star = {name: star_rows(path) for name, path in runs.items()}
    first = next(iter(star.values()))
    lines = [
        "| scenario | arm | expect | " + " | ".join(HEADINGS.get(n, n) for n in runs) + " |",
        "|---|---|---|" + "---:|" * len(runs),
    ]
    for key, row in first.iterrows():
        cells = [cell(count(lookup(star, n, key), "detected" if n.endswith("detect") else "failures")) for n in runs]
        lines.append(f"| {key[0]} | {key[1]} | {row.expect} | " + " | ".join(cells) + " |")
    return lines


def benchmark_rows(star: dict[str, pd.DataFrame]) -> list[tuple[tuple[str, str], str]]:
    """Every (scenario, arm) any run has, with its expectation, in the order the runs list them."""
    seen: dict[tuple[str, str], str] = {}
    for name, _, _ in BENCHMARK:
        df = star.get(name)
        if df is not None:
            for key, row in df.iterrows():
                seen.setdefault(key, row.expect)
    return list(seen.items())


def benchmark(star: dict[str, pd.DataFrame], scenarios: dict, *, gpu_ranks: int) -> list[str]:
    """The benchmark table, then per tool recall and false reports. `scenarios`: the catalogue by
    name (for default profiles and minimum world sizes); `gpu_ranks`: the GPU runs' world size."""
    rows = benchmark_rows(star)
    lines = [
        "| scenario | arm | expect | profile | " + " | ".join(h for _, h, _ in BENCHMARK) + " |",
        "|---|---|---|---|" + "---:|" * len(BENCHMARK),
    ]
    for key, expect in rows:
        scenario = scenarios.get(key[0])
        cells = []
        for name, _, field in BENCHMARK:
            value = count(lookup(star, name, key), field)
            if (
                value is None
                and name.startswith("gpu_")
                and name in star
                and scenario is not None
                and scenario.min_world_size > gpu_ranks
            ):
                cells.append(f"needs {scenario.min_world_size} ranks")
            else:
                cells.append(cell(value) + other(lookup(star, name, key)))
        profile = scenario.default_perturb if scenario is not None else ""
        lines.append(
            f"| {key[0]} | {key[1]} | {expect} | {f'`{profile}`' if profile else ''} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Per tool, over the arms it ran: race arms found (at least one failing or reported "
        "trial) and their trials; safe arms falsely failed or reported, and their trials.",
        "",
        "| tool | column | recall: race arms | race trials | false reports: safe arms | safe trials |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, heading, field in BENCHMARK:
        lines.append(f"| {TOOLS[name]} | {heading} | " + " | ".join(tool_scores(star, name, field, rows)) + " |")
    lines += ["", *disagreements(star, rows)]
    return lines


def tool_scores(star, name: str, field: str, rows) -> list[str]:
    """[race arms found/run, race trials, safe arms reported/run, safe trials] for one column."""
    out = []
    for expect in ("race", "safe"):
        counts = [count(lookup(star, name, key), field) for key, e in rows if e == expect]
        counts = [c for c in counts if c is not None]
        if not counts:
            out += ["not run", "not run"]
            continue
        out.append(f"{sum(1 for c in counts if c[0] > 0)}/{len(counts)}")
        out.append(f"{sum(c[0] for c in counts)}/{sum(c[1] for c in counts)}")
    return out


def disagreements(star, rows) -> list[str]:
    """Race arms that the detector on the GPU reports and the sanitizer does not, and the reverse."""
    if "gpu_detect" not in star or "gpu_sanitizer" not in star:
        return ["Detector against sanitizer, arm by arm: not run (needs both GPU columns)."]
    only_ours, only_theirs = [], []
    for key, expect in rows:
        ours = count(lookup(star, "gpu_detect", key), "detected")
        theirs = count(lookup(star, "gpu_sanitizer", key), "failures")
        if ours is None or theirs is None:
            continue
        if ours[0] > 0 and theirs[0] == 0:
            only_ours.append(f"{key[0]}/{key[1]} ({expect})")
        elif theirs[0] > 0 and ours[0] == 0:
            only_theirs.append(f"{key[0]}/{key[1]} ({expect})")
    return [
        f"Reported by racecheck's detector and not by the sanitizer on the GPU: {', '.join(only_ours) or 'none'}.",
        "",
        f"Reported by the sanitizer and not by racecheck's detector: {', '.join(only_theirs) or 'none'}.",
    ]


def catalogue() -> dict:
    """The catalogue's scenarios by name (empty when racecheck is not importable)."""
    try:
        from racecheck.suites.catalogue import find_catalogue, load_catalogue
    except ImportError:
        return {}
    return load_catalogue(find_catalogue(str(Path(__file__).resolve().parents[1] / "scenarios")))


def splice(path: Path, block: list[str]) -> None:
    """Replace the text between the markers in `path` with `block`."""
    text = path.read_text()
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"{path}: no {START} ... {END} markers")
    path.write_text(head + START + "\n" + "\n".join(block) + "\n" + END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("runs", nargs="+", help="NAME=summary.csv")
    parser.add_argument("--title", default="Catalogue")
    parser.add_argument("--note", default="Failing trials out of trials (`*` rows).")
    parser.add_argument(
        "--benchmark", action="store_true", help=f"the benchmark layout; names: {', '.join(n for n, _, _ in BENCHMARK)}"
    )
    parser.add_argument(
        "--gpu-ranks", type=int, default=1, help="the world size of the GPU runs (scenarios needing more say so)"
    )
    parser.add_argument(
        "--splice",
        type=Path,
        action="append",
        default=[],
        help="also write the table between the benchmark markers of this file",
    )
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        if args.benchmark and name not in TOOLS:
            parser.error(f"unknown benchmark column {name!r}; known: {', '.join(TOOLS)}")
        if Path(path).exists():
            runs[name] = Path(path)
    if not runs:
        parser.error("none of the summary files exists")
    if args.benchmark:
        block = benchmark({name: star_rows(path) for name, path in runs.items()}, catalogue(), gpu_ranks=args.gpu_ranks)
    else:
        block = table(runs)
    lines = [f"# {args.title}", "", args.note, "", *block]
    args.output.write_text("\n".join(lines) + "\n")
    for path in args.splice:
        splice(path, block)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
