"""Modern PyTorch under racecheck, through `racecheck run` only: examples/compiled (torch.compile'd
functions and the project's Triton kernel on side streams, FSDP2 with each block compiled against
a replica, DTensor's full_tensor(), imports inside tests and fixtures) in every mode, the detector
on both paths; into reports/gpu/modern_code.csv, reports/gpu/modern_code.md and the README's table.

    python3 bench/modern_code.py --out DIR [--modes natural,profile,systematic,random,detect] [--missing] [--arms A,B]
        [--jobs 8] [--max-seconds S] [--report reports/gpu] [--splice README.md]
    python3 bench/modern_code.py --from-runs DIR --splice README.md      # rebuild, run nothing

What runs, each from examples/compiled as a user would run it (bench/foreign_code.py's machinery):
- natural: every arm, `--no-perturb`;
- profile: the correct arms (fixed, hold) under every named profile of patch mode and every delay
  at a hand-off or a collective joined with pressure and with poison (foreign_code.FSDP2_PROFILES),
  `--profile-trials` trials each; the race arms (drop_early, no_wait) under the case's named
  profile, `enter_delay,poison`;
- systematic: every arm, `--systematic-trials` trials (k + 1 covers every single point);
- random: the correct arms, `--random-trials` trials;
- detect: every arm, `--detect --no-perturb`, on each of the detector's paths (`native`,
  `python`: RACECHECK_DETECT_PATH).
The natural runs and the race arms' profile runs go one at a time, with nothing else on the GPU,
as a user runs a suite (a delay is GPU time, which other processes would share); every other run
goes `--jobs` at a time (a correct arm must pass whatever the timing). `--arms` keeps the runs of those arms only.
Rows: `suite,case,arm,expect,mode,path,trials,failures,detected` (`path` set for mode detect);
rows of the same suite, case, arm, mode and path replace earlier ones, so a run split over device
calls builds one table. Run it on the GPU machine through bench/modern_code.sh.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import foreign_code as fc  # noqa: E402 - the same runs, rows and bounds as the foreign-code table
from readme_block import splice  # noqa: E402

ROOT = fc.ROOT
SUITE = "compiled"
CORRECT, RACE = "fixed,hold", "drop_early,no_wait"
TARGETS = ("tests/test_side_streams.py", "tests/test_fsdp2_compiled.py")
# The side stream held back at its entry (it reads and writes late) and freed blocks poisoned: with
# the delay alone, whether drop_early's freed input is handed to the default stream's next
# allocation before the side stream reads it is the allocator's choice (5/10, alone or beside
# other runs, on one H200); poison makes the free itself visible.
RACE_PROFILE = "enter_delay,poison"
MODES = ("natural", "profile", "systematic", "random", "detect")
COLUMNS = ("suite", "case", "arm", "expect", "mode", "path", "trials", "failures", "detected")
PATHS = ("native", "python")
START, END = "<!-- modern-code:start -->", "<!-- modern-code:end -->"


def plan(modes: list[str]) -> list[fc.Run]:
    """The runs of `modes`, one arm each (runs go `--jobs` at a time, so an arm's trials run
    beside the other arms' rather than after them)."""
    runs: list[fc.Run] = []
    correct, race = CORRECT.split(","), RACE.split(",")
    for mode in modes:
        if mode == "profile":
            profiles = dict.fromkeys((*fc.FSDP2_PROFILES, RACE_PROFILE))
            runs += [fc.Run(SUITE, f"profile:{p}", TARGETS, arms=arm) for p in profiles for arm in correct]
            runs += [fc.Run(SUITE, f"profile:{RACE_PROFILE}", TARGETS, arms=arm) for arm in race]
        elif mode == "detect":
            runs += [fc.Run(SUITE, "detect", TARGETS, arms=arm, path=p) for p in PATHS for arm in correct + race]
        elif mode == "random":
            runs += [fc.Run(SUITE, "random", TARGETS, arms=arm) for arm in correct]
        else:
            runs += [fc.Run(SUITE, mode, TARGETS, arms=arm) for arm in correct + race]
    return runs


def timed(run: fc.Run) -> bool:
    """A run whose result depends on GPU timing: natural, or a race arm under its profile."""
    return run.mode == "natural" or (run.mode.startswith("profile:") and run.arms in RACE.split(","))


def measured(report: Path) -> dict[tuple[str, str, str], int]:
    """The trials the report's table holds per (arm, mode, path), over the whole suite."""
    path = report / "modern_code.csv"
    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        return {
            (r["arm"], r["mode"], r["path"]): int(r["trials"]) for r in csv.DictReader(f) if r["case"] == fc.ANY_TEST
        }


def merge(report: Path, rows: list[dict]) -> list[dict]:
    order = {m: i for i, m in enumerate(MODES)}
    return fc.merge_csv(
        report / "modern_code.csv",
        rows,
        key=lambda r: (r["suite"], r["case"], r["arm"], r["mode"], r["path"]),
        columns=COLUMNS,
        order=lambda r: (r["suite"], r["case"], order.get(r["mode"].split(":")[0], 9), r["mode"], r["path"], r["arm"]),
    )


def summary(rows: list[dict], bounds: dict) -> list[str]:
    """The README's table: per arm, what every mode gave over the whole suite (a trial fails when
    any of its tests fails), the profile runs' worst, and the systematic schedule's bound."""
    whole = [r for r in rows if r["case"] == fc.ANY_TEST]
    arms = sorted({r["arm"] for r in whole}, key=lambda a: (CORRECT + "," + RACE).split(",").index(a))
    lines = [
        "| arm | expect | natural | profiles: a safe arm's worst, a race arm's own | random | "
        "systematic: k, first failure | detect, native | detect, python |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        mine = [r for r in whole if r["arm"] == arm]
        cell = _cells(mine)

        profiles = [r for r in mine if r["mode"].startswith("profile:")]
        if arm in RACE.split(","):  # the race arm under the case's named profile
            named = [r for r in profiles if r["mode"] == f"profile:{RACE_PROFILE}"]
            prof = "" if not named else f"{named[0]['failures']}/{named[0]['trials']} (`{RACE_PROFILE}`)"
        else:  # the correct arm's worst profile
            worst = max(profiles, key=lambda r: int(r["failures"]) / max(1, int(r["trials"])), default=None)
            prof = "" if worst is None else f"{worst['failures']}/{worst['trials']} (worst of {len(profiles)} runs)"
        ks = [b for (suite, case, a), b in bounds.items() if suite == SUITE and a == arm]
        k = max((b["k"] for b in ks), default=0)
        firsts = [b["first"] for b in ks if b["first"] is not None]
        system = "" if not ks else f"k {k}, " + (f"trial {min(firsts)}" if firsts else "none")
        expect = mine[0]["expect"]
        lines.append(
            f"| {arm} | {expect} | {cell('natural')} | {prof} | {cell('random')} | {system} | "
            f"{cell('detect', 'native', detected=True)} | {cell('detect', 'python', detected=True)} |"
        )
    return lines


def _cells(rows: list[dict]):
    """cell(mode, path, detected=): one arm's row of that mode as `failures/trials` (or detected)."""

    def cell(mode: str, path: str = "", *, detected: bool = False) -> str:
        got = [r for r in rows if r["mode"] == mode and r["path"] == path]
        if not got:
            return ""
        r = got[0]
        return f"{r['detected'] if detected else r['failures']}/{r['trials']}"

    return cell


def render(report: Path, rows: list[dict], bounds: dict, *, where: str, command: str, errors: list[str]) -> list[str]:
    table = summary(rows, bounds)
    lines = [
        "# Modern PyTorch through `racecheck run`: examples/compiled",
        "",
        f"{where}; command: `{command}` (bench/modern_code.sh on the GPU machine).",
        "",
        "Per arm, over the whole suite (a trial fails when any test in it fails). `detect`: trials with "
        "a detector report, nothing injected; systematic: k points recorded in trial 0, the first "
        "failing trial (a race that one delayed point exposes fails by trial k).",
        "",
        *table,
        "",
        "## Every row",
        "",
        "| case | arm | expect | mode | path | failures | detected |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        detected = f"{r['detected']}/{r['trials']}" if r["detected"] != "" else ""
        lines.append(
            f"| `{r['case']}` | {r['arm']} | {r['expect']} | `{r['mode']}` | {r['path']} | "
            f"{r['failures']}/{r['trials']} | {detected} |"
        )
    if errors:
        lines += ["", "Runs that did not finish:", "", *[f"- {e}" for e in errors]]
    (report / "modern_code.md").write_text("\n".join(lines) + "\n")
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where the run folders and logs go")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--trials", type=int, default=10, help="natural, detect and the race arms' profile")
    parser.add_argument("--profile-trials", type=int, default=5, help="trials of each correct-arm profile run")
    parser.add_argument("--systematic-trials", type=int, default=60, help="at least k + 1: every point once")
    parser.add_argument("--random-trials", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--arms", default=None, help="comma-separated: the runs of these arms only")
    parser.add_argument("--chunk", type=int, default=50, help="racecheck run --chunk: trials per session")
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument(
        "--missing", action="store_true", help="skip the runs whose arm and mode the report already holds in full"
    )
    parser.add_argument("--from-runs", type=Path, default=None, metavar="DIR")
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "gpu")
    parser.add_argument("--splice", type=Path, default=None, metavar="README")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        parser.error(f"modes are {', '.join(MODES)}")
    if args.out is None and args.from_runs is None:
        parser.error("give --out (run) or --from-runs (rebuild)")
    start = time.monotonic()
    rows: list[dict] = []
    bounds: dict = {}
    errors: list[str] = []

    def trials_of(run: fc.Run) -> int:
        if run.mode.startswith("profile:") and run.arms in CORRECT.split(","):
            return args.profile_trials
        return {"systematic": args.systematic_trials, "random": args.random_trials}.get(run.mode, args.trials)

    def one(run: fc.Run) -> None:
        trials = trials_of(run)
        if args.from_runs is not None:
            rc, folder = 0, args.from_runs / "runs" / run.name
            if not (folder / "summary.csv").is_file():
                return
        else:
            left = None if args.max_seconds is None else args.max_seconds - (time.monotonic() - start)
            if left is not None and left < 30:
                errors.append(f"{run.name}: not started, out of time")
                return
            began = time.monotonic()
            rc, folder = fc.execute(
                run, out=args.out, trials=trials, chunk=args.chunk, timeout=left if left is not None else 3600
            )
            print(f"{run.name}: exit {rc} in {time.monotonic() - began:.0f} s", flush=True)
        if rc != 0:
            errors.append(f"{run.name}: exit {rc}")
        rows.extend(fc.rows_of(run, folder))
        if run.mode == "systematic":
            bounds.update({(run.suite, *k): v for k, v in fc.bounds_of(folder).items()})

    runs = plan(modes)
    if args.missing:
        held = measured(args.report)
        runs = [r for r in runs if held.get((r.arms, r.mode, r.path), 0) < trials_of(r)]
        print(f"{len(runs)} runs not yet in {args.report / 'modern_code.csv'}", flush=True)
    if args.arms:
        runs = [r for r in runs if r.arms in args.arms.split(",")]
    alone = [r for r in runs if timed(r)]
    for run in alone:  # nothing else on the GPU: a delay's GPU time is not shared out
        one(run)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # the longest runs first, so that a call's time limit cuts the short ones
        rest = sorted((r for r in runs if r not in alone), key=trials_of, reverse=True)
        for future in [pool.submit(one, r) for r in rest]:
            future.result()
    merged = merge(args.report, rows)
    kept = fc.merge_bounds(args.report, bounds, name="modern_code_bounds.csv")
    where = fc.measured_where(args.from_runs)
    command = "python3 bench/modern_code.py " + " ".join(sys.argv[1:])
    table = render(args.report, merged, kept, where=where, command=command, errors=errors)
    if args.splice is not None:
        splice(args.splice, START, END, table)
    print("\n".join(table))
    print(f"{len(rows)} rows into {args.report / 'modern_code.csv'}; {len(errors)} runs not finished")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
