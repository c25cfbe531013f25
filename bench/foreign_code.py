"""Code that is not racecheck's, through `racecheck run` only: the example projects in examples/
(megatron-fsdp 0.6.1 as released and with its fix, PyTorch's FSDP2, six plain-torch patterns),
each in every mode, and the soundness check's generated programs (bench/soundness.py), into one
table.

    python3 bench/foreign_code.py --out DIR [--suites megatron_fsdp,fsdp2,plain_torch]
        [--modes natural,profile,systematic,random,detect] [--trials 10] [--report reports/gpu]

Modes, each `--trials` trials of every arm, run from the example's folder:
- natural      `--no-perturb`: the rate with nothing injected;
- profile:SPEC `--perturb SPEC`, the profile named for the case below (FSDP2, correct code: every
               named profile of patch mode and of the cases, every pair of a delay at a hand-off
               or a collective with pressure or poison, one run each);
- systematic   `--perturb systematic`: one recorded hand-off point delayed per trial, with
               `--systematic-trials` trials (default 30: at least k + 1, trial 0 records the k
               points); the Markdown table gives each case's k and its first failing trial;
- random       `--perturb random`, with `--random-trials` trials (default 30);
- detect       `--detect --no-perturb`: the detector, nothing injected;
- soundness    bench/soundness.py on torch.cuda: generated programs under every patch-mode profile
               and pair, and with one synchronization removed (suite `generated`).
Natural runs go one at a time, alone; with `--jobs N` the other runs go N at a time (a forced or
detected outcome does not need a quiet GPU). Each run's folder (trials.jsonl, summary.csv, the
console log) lands under DIR/runs/;
`--from-runs DIR` rebuilds the rows from such folders without running anything. The rows
(`suite,case,arm,expect,mode,trials,failures,detected`) are merged into REPORT/foreign_code.csv
(rows of the same suite, case, arm and mode are replaced, so a run split over several device calls
builds one table; the systematic bounds likewise into REPORT/foreign_code_bounds.csv) and
REPORT/foreign_code.md is rendered from both. Run it on the GPU machine through
bench/foreign_code.sh, which installs what it needs and packs DIR.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ANY_TEST = "any test of the run"
COLUMNS = ("suite", "case", "arm", "expect", "mode", "trials", "failures", "detected")
MODES = ("natural", "profile", "systematic", "random", "detect", "soundness")


@dataclasses.dataclass(frozen=True)
class Case:
    """Tests of one example run under one named profile in mode `profile`."""

    suite: str
    targets: tuple[str, ...]  # pytest node ids or files, relative to the example's folder
    profile: str


# The profile named for each case: a delay where its hand-off happens.
CASES = (
    # The reduce-scatter stream held back while the default stream reuses the freed main_grad.
    Case("megatron_fsdp", ("tests/test_hsdp.py",), "sleep@before_reduce_scatter:5ms"),
    # The copy stream held back at its entry while the compute stream reuses the freed activation.
    Case("plain_torch", ("tests/test_overlap.py::test_offload_copy",), "sleep@stream_enter:5ms"),
    # The prefetch stream's all-gather held back; the consumer waits on the wrong event.
    Case("plain_torch", ("tests/test_overlap.py::test_prefetch_all_gather",), "sleep@before_all_gather:5ms"),
    # The all-reduce held back while the compute stream packs into the same staging buffer.
    Case("plain_torch", ("tests/test_overlap.py::test_double_buffer_all_reduce",), "sleep@before_all_reduce:5ms"),
    # The reduce-scatter held back while the compute stream reuses the freed bucket.
    Case("plain_torch", ("tests/test_overlap.py::test_bucketed_reduce_scatter",), "sleep@before_reduce_scatter:5ms"),
    # The copy to pinned memory held back at its stream's entry while the host reads the buffer.
    Case("plain_torch", ("tests/test_overlap.py::test_host_statistics",), "sleep@stream_enter:5ms"),
    # The side stream's work held back after its (early) event: the consumer reads before it.
    Case("plain_torch", ("tests/test_overlap.py::test_staged_inputs",), "sleep@after_event_record:5ms"),
)
ARMS = {"megatron_fsdp": "fixed,asis", "fsdp2": "bf16,fp32", "plain_torch": "correct,race"}
WHOLE_SUITE = {
    "megatron_fsdp": ("tests/test_hsdp.py",),
    "fsdp2": ("tests/test_fully_shard.py", "tests/test_transformer.py"),
    "plain_torch": ("tests/test_overlap.py",),
}
# The suite a user saw FSDP2 fail under combined profiles: what FSDP2's profile runs take.
FSDP2_PROFILE_TARGETS = ("tests/test_transformer.py",)
# Covering every single point takes k + 1 trials of each arm: the runs that do (systematic), or
# that draw many trials (random), take one suite or one parametrization where the whole suite
# would not fit one device call (megatron-fsdp: k = 30 to 50 points per test, 4 to 13 s a test).
MODE_TARGETS = {
    ("fsdp2", "systematic"): FSDP2_PROFILE_TARGETS,
    ("fsdp2", "random"): FSDP2_PROFILE_TARGETS,
    ("megatron_fsdp", "systematic"): ("tests/test_hsdp.py::test_hsdp_losses_match_baseline[1-False]",),
    ("megatron_fsdp", "random"): ("tests/test_hsdp.py::test_hsdp_losses_match_baseline[1-False]",),
}
# Correct code under every action racecheck takes, alone and combined: the named profiles of
# patch mode, each delay at a hand-off or collective joined with pressure and with poison, and
# the combinations a user saw fail FSDP2 before allocator actions waited for an allocation.
_DELAYS = (
    "sleep@stream_enter:3ms",
    "sleep@stream_wait:3ms",
    "sleep@before_stream_wait:3ms",
    "sleep@event_record:3ms",
    "sleep@after_event_record:3ms",
    "sleep@before_all_gather:5ms",
    "sleep@before_reduce_scatter:5ms",
    "sleep@before_all_reduce:5ms",
)
FSDP2_PROFILES = (
    "enter_delay",
    "wait_delay",
    "before_wait_delay",
    "record_delay",
    "after_record_delay",
    "rs_delay",
    "ar_delay",
    "poison",
    "pressure",
    *(f"{d},{a}@free" for d in _DELAYS for a in ("pressure", "poison")),
    "sleep@stream_enter:3ms,sleep@stream_wait:3ms,pressure@free",
    "sleep@stream_enter:3ms,sleep@stream_wait:3ms,poison@free",
)


@dataclasses.dataclass(frozen=True)
class Run:
    """One `racecheck run` of one example: its arms (default: ARMS[suite]) and, for mode detect,
    the detector's path (RACECHECK_DETECT_PATH; "": its default)."""

    suite: str
    mode: str  # as in the table: natural, profile:SPEC, systematic, random, detect
    targets: tuple[str, ...]
    arms: str = ""
    path: str = ""

    @property
    def name(self) -> str:
        tag = self.mode.replace("profile:", "profile-").translate(str.maketrans("@:,/>", "_____"))
        which = "-".join(t.partition("::")[2] or Path(t).stem for t in self.targets)
        which = re.sub(r"[^a-z0-9_.-]", "_", which.lower())  # a node id's parameters: a plain file name
        extra = "".join(f".{x}" for x in (self.arms.replace(",", "-"), self.path) if x)
        return f"{self.suite}.{tag}.{which}{extra}"

    def flags(self) -> list[str]:
        if self.mode == "natural":
            return ["--no-perturb"]
        if self.mode == "detect":
            return ["--detect", "--no-perturb"]
        if self.mode.startswith("profile:"):
            return ["--perturb", self.mode.partition(":")[2]]
        return ["--perturb", self.mode]  # systematic, random


def plan(suites: list[str], modes: list[str], *, split_arms: bool = False) -> list[Run]:
    """The runs of `modes` over `suites`; with `split_arms` one run per arm, so that with --jobs
    an arm's trials run beside the other arm's rather than after them."""
    runs = _plan(suites, modes)
    if split_arms:
        runs = [dataclasses.replace(r, arms=arm) for r in runs for arm in (r.arms or ARMS[r.suite]).split(",")]
    return runs


def _plan(suites: list[str], modes: list[str]) -> list[Run]:
    runs: list[Run] = []
    for suite in suites:
        for mode in modes:
            if mode == "soundness":
                continue  # once for all suites: see main
            if mode != "profile":
                runs.append(Run(suite, mode, MODE_TARGETS.get((suite, mode), WHOLE_SUITE[suite])))
                continue
            if suite == "fsdp2":  # correct code: every action, alone and combined, on the transformer
                profiles = dict.fromkeys((*FSDP2_PROFILES, *(c.profile for c in CASES)))
                runs += [Run(suite, f"profile:{p}", FSDP2_PROFILE_TARGETS) for p in profiles]
            else:
                runs += [Run(suite, f"profile:{c.profile}", c.targets) for c in CASES if c.suite == suite]
    return runs


def execute(
    run: Run, *, out: Path, trials: int, chunk: int, timeout: float, seed: int = 0, world_size: int | None = None
) -> tuple[int, Path]:
    """`racecheck run` from the example's folder; (exit code, its run folder)."""
    folder = out / "runs" / (run.name + (f".seed{seed}" if seed else ""))
    folder.parent.mkdir(parents=True, exist_ok=True)
    # --max-time stops the run at a trial boundary with its summary written; the terminate below
    # (racecheck keeps finished trials on SIGTERM and ends its sessions) is the backstop.
    argv = [
        sys.executable,
        "-m",
        "racecheck",
        "run",
        "--arms",
        run.arms or ARMS[run.suite],
        "--trials",
        str(trials),
        "--chunk",
        str(chunk),
        "--quiet",
        "--max-time",
        str(max(1, int(timeout) - 20)),
        "--seed",
        str(seed),
        *(["--world-size", str(world_size)] if world_size else []),
        "--out",
        str(folder),
        *run.flags(),
        "--",
        *run.targets,
    ]
    log = folder.with_name(folder.name + ".log")
    with open(log, "w") as stream:
        stream.write(" ".join(argv) + "\n")
        stream.flush()
        env = {**os.environ, **({"RACECHECK_DETECT_PATH": run.path} if run.path else {})}
        proc = subprocess.Popen(argv, cwd=EXAMPLES / run.suite, stdout=stream, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
    return rc, folder


def rows_of(run: Run, folder: Path) -> list[dict]:
    """The table's rows from a run's summary.csv: one per test and arm."""
    summary = folder / "summary.csv"
    if not summary.is_file():
        return []
    with open(summary, newline="") as f:
        records = list(csv.DictReader(f))
    return [
        {
            "suite": run.suite,
            # "*": the arm's trials, a trial failing when any of its tests fails
            "case": ANY_TEST if r["test"] == "*" else r["test"].rpartition("::")[2],
            "arm": r["arm"],
            "expect": r.get("expect", ""),
            "mode": run.mode,
            "path": run.path,
            "trials": r["trials"],
            "failures": r["failures"],
            "detected": r.get("detected", ""),
        }
        for r in records
    ]


def actions_of(folder: Path) -> dict[tuple[str, str], int]:
    """Perturbation actions taken per (case, arm), summed over trials (trials.jsonl `actions`)."""
    totals: dict[tuple[str, str], int] = {}
    log = folder / "trials.jsonl"
    if not log.is_file():
        return totals
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "actions" not in record:
            continue
        key = (str(record.get("test", "")).rpartition("::")[2], str(record.get("arm", "")))
        counts = record.get("actions") or {}
        totals[key] = totals.get(key, 0) + sum(v for v in counts.values() if isinstance(v, int))
    return totals


def bounds_of(folder: Path) -> dict[tuple[str, str], dict]:
    """The systematic schedule per (case, arm): k (points recorded in trial 0), the trials run and
    the first failing trial with the point it delayed (trials.jsonl `handoffs`, `delayed`)."""
    found: dict[tuple[str, str], dict] = {}
    log = folder / "trials.jsonl"
    if not log.is_file():
        return found
    for line in log.read_text().splitlines():
        record = json.loads(line)
        key = (str(record.get("test", "")).rpartition("::")[2], str(record.get("arm", "")))
        entry = found.setdefault(key, {"k": 0, "trials": 0, "first": None, "delayed": ""})
        entry["k"] = max(entry["k"], int(record.get("handoffs") or 0))
        entry["trials"] += 1
        failed = record.get("outcome") not in ("passed", "skipped")
        if failed and record.get("delayed") and (entry["first"] is None or record["trial"] < entry["first"]):
            entry["first"], entry["delayed"] = record["trial"], " + ".join(record["delayed"])
    return found


BOUND_COLUMNS = ("suite", "case", "arm", "k", "trials", "first", "delayed")


def merge_csv(path: Path, rows: list[dict], *, key, columns, order) -> list[dict]:
    """The rows of the CSV at `path` with `rows` replacing those of the same `key`, sorted by
    `order` and written back."""
    table = {}
    if path.is_file():
        with open(path, newline="") as f:
            table = {key(r): r for r in csv.DictReader(f)}
    table.update({key(r): r for r in rows})
    merged = sorted(table.values(), key=order)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(merged)
    return merged


def merge_bounds(report: Path, bounds: dict, *, name: str = "foreign_code_bounds.csv") -> dict:
    """REPORT/`name` with `bounds` replacing the entries of the same key."""
    rows = [
        {
            "suite": suite,
            "case": case,
            "arm": arm,
            "k": b["k"],
            "trials": b["trials"],
            "first": "" if b["first"] is None else b["first"],
            "delayed": b["delayed"],
        }
        for (suite, case, arm), b in bounds.items()
    ]
    case_key = lambda r: (r["suite"], r["case"], r["arm"])  # noqa: E731
    merged = merge_csv(report / name, rows, key=case_key, columns=BOUND_COLUMNS, order=case_key)
    return {
        case_key(r): {
            "k": int(r["k"]),
            "trials": int(r["trials"]),
            "first": int(r["first"]) if r["first"] != "" else None,
            "delayed": r["delayed"],
        }
        for r in merged
    }


def merge(report: Path, rows: list[dict]) -> list[dict]:
    """The rows of REPORT/foreign_code.csv with `rows` replacing those of the same key."""
    order = {m: i for i, m in enumerate(MODES)}
    return merge_csv(
        report / "foreign_code.csv",
        rows,
        key=lambda r: (r["suite"], r["case"], r["arm"], r["mode"]),
        columns=COLUMNS,
        order=lambda r: (r["suite"], r["case"], order.get(r["mode"].split(":")[0], 9), r["mode"], r["arm"]),
    )


def measured_where(from_runs: Path | None) -> str:
    """The torch and device the rows come from: this machine's, or with --from-runs the ones the
    run folders' trials.jsonl record."""
    if from_runs is not None:
        for log in sorted((from_runs / "runs").glob("*/trials.jsonl")):
            for line in log.read_text().splitlines()[:1]:
                record = json.loads(line)
                torch_version = (record.get("versions") or {}).get("torch", "?")
                device = record.get("device", "?")
                return f"rows from the run folders of {from_runs.name}: torch {torch_version}, device {device}"
        return f"rows from the run folders of {from_runs.name}"
    try:
        import torch

        return f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}"
    except ImportError:
        return "torch not importable"


def render(
    report: Path, rows: list[dict], *, actions: dict, bounds: dict, command: str, errors: list[str], where: str
) -> None:
    lines = [
        "# Code that is not racecheck's, through `racecheck run`",
        "",
        f"{where}; command: `{command}` (bench/foreign_code.sh on the GPU machine).",
        "",
        "`failures`: trials in which the test failed, of `trials`; `detected`: trials with a "
        "detector report (mode `detect` only); `actions`: perturbation actions the last run of "
        "that row took in this call, summed over its trials (empty where the log records none or "
        "the row comes from an earlier call).",
        "",
        "| suite | case | arm | expect | mode | failures | detected | actions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acted = actions.get((r["suite"], r["mode"], r["case"], r["arm"]), "")
        detected = f"{r['detected']}/{r['trials']}" if r["detected"] != "" else ""
        lines.append(
            f"| {r['suite']} | `{r['case']}` | {r['arm']} | {r['expect']} | `{r['mode']}` | "
            f"{r['failures']}/{r['trials']} | {detected} | {acted} |"
        )
    if bounds:
        lines += [
            "",
            "## The systematic schedule's bound",
            "",
            "k: the distinct hand-off points trial 0 recorded for the test; trial t (1..k) delays the "
            "t-th alone, so a race that one delayed point exposes fails by trial k. `first failure`: the "
            "first failing trial of this call's run and the point it delayed.",
            "",
            "| suite | case | arm | k | trials | first failure | within k | delayed point |",
            "|---|---|---|---:|---:|---:|---|---|",
        ]
        for (suite, case, arm), b in sorted(bounds.items()):
            first = "" if b["first"] is None else b["first"]
            within = "" if b["first"] is None else ("yes" if b["first"] <= b["k"] else "no")
            lines.append(
                f"| {suite} | `{case}` | {arm} | {b['k']} | {b['trials']} | {first} | {within} | "
                f"{'`' + b['delayed'] + '`' if b['delayed'] else ''} |"
            )
    if errors:
        lines += ["", "Runs that did not finish (exit code; their logs are in the packed run folders):", ""]
        lines += [f"- {e}" for e in errors]
    (report / "foreign_code.md").write_text("\n".join(lines) + "\n")


def soundness(args, rows: list[dict], errors: list[str]) -> None:
    """bench/soundness.py on torch.cuda, its rows into the table (--from-runs: its rows as kept)."""
    if args.from_runs is not None:
        kept = args.from_runs / "runs" / "soundness.csv"
        if kept.is_file():
            with open(kept, newline="") as f:
                rows.extend(csv.DictReader(f))
        return
    out = args.out / "runs" / "soundness.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(ROOT / "bench" / "soundness.py"), "--out", str(out), "--max-seconds", "240"]
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
    print(f"soundness: exit {rc}", flush=True)
    if rc != 0:
        errors.append(f"soundness: exit {rc} (see runs/soundness.log)")
    if out.is_file():
        with open(out, newline="") as f:
            rows.extend(csv.DictReader(f))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the run folders and logs go")
    parser.add_argument("--suites", default=",".join(ARMS), help="examples to run (default: all)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to run (default: all)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--profile-trials", type=int, default=None, help="trials of the profile runs (default: --trials)"
    )
    parser.add_argument(
        "--systematic-trials",
        type=int,
        default=30,
        help="trials of the systematic mode: at least k + 1 to cover every single point",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="racecheck run --seed: further trials of a mode, as rows of their own"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="racecheck run --world-size (FSDP2 issues its all-gathers and reduce-scatters from 2 ranks on)",
    )
    parser.add_argument("--random-trials", type=int, default=30, help="trials of the random mode")
    parser.add_argument("--jobs", type=int, default=1, help="runs other than natural ones at a time")
    parser.add_argument("--split-arms", action="store_true", help="one run per arm (they go --jobs at a time)")
    parser.add_argument("--profiles", default=None, metavar="REGEX", help="only the profile runs whose spec matches")
    parser.add_argument(
        "--from-runs",
        type=Path,
        default=None,
        metavar="DIR",
        help="run nothing: take the rows of the planned runs from DIR/runs/ (an earlier "
        "call's unpacked foreign_code.tar.gz) and merge them into the table",
    )
    parser.add_argument("--chunk", type=int, default=10, help="racecheck run --chunk: trials per session")
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "gpu", help="where the table goes")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="start no run after this long (the device call has a hard limit)",
    )
    args = parser.parse_args()
    suites, modes = args.suites.split(","), args.modes.split(",")
    for name, given, known in (("suite", suites, ARMS), ("mode", modes, MODES)):
        unknown = [g for g in given if g not in known]
        if unknown:
            parser.error(f"unknown {name} {', '.join(unknown)}; known: {', '.join(known)}")
    start = time.monotonic()
    rows, errors, actions, bounds = [], [], {}, {}

    def one(run: Run) -> None:
        left = None if args.max_seconds is None else args.max_seconds - (time.monotonic() - start)
        if left is not None and left < 30:
            errors.append(f"{run.name}: not started, out of time")
            return
        began = time.monotonic()
        trials = {"systematic": args.systematic_trials, "random": args.random_trials}.get(run.mode, args.trials)
        if run.mode.startswith("profile:") and args.profile_trials is not None:
            trials = args.profile_trials
        if args.from_runs is not None:  # an earlier call's packed run folders: read, do not run
            rc, folder = 0, args.from_runs / "runs" / (run.name + (f".seed{args.seed}" if args.seed else ""))
            if not (folder / "summary.csv").is_file():
                return
        else:
            rc, folder = execute(
                run,
                out=args.out,
                trials=trials,
                chunk=args.chunk,
                timeout=left if left is not None else 3600,
                seed=args.seed,
                world_size=args.world_size,
            )
        if args.seed:  # further trials of a mode: rows of their own, beside seed 0's
            run = dataclasses.replace(run, mode=f"{run.mode} (seed {args.seed})")
        print(f"{run.name}: exit {rc} in {time.monotonic() - began:.0f} s", flush=True)
        if rc != 0:
            errors.append(f"{run.name}: exit {rc}")
        rows.extend(rows_of(run, folder))
        actions.update({(run.suite, run.mode, *k): v for k, v in actions_of(folder).items()})
        if run.mode == "systematic":
            bounds.update({(run.suite, *k): v for k, v in bounds_of(folder).items()})

    runs = plan(suites, modes, split_arms=args.split_arms)
    if args.profiles is not None:
        runs = [r for r in runs if not r.mode.startswith("profile:") or re.search(args.profiles, r.mode)]
    for run in (r for r in runs if r.mode == "natural"):  # alone: nothing else on the GPU
        one(run)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        pending = [pool.submit(one, r) for r in runs if r.mode != "natural"]
        if "soundness" in modes:
            pending.append(pool.submit(soundness, args, rows, errors))
        for future in pending:
            future.result()
    merged = merge(args.report, rows)
    bounds = merge_bounds(args.report, bounds)
    command = "python3 bench/foreign_code.py " + " ".join(sys.argv[1:])
    render(
        args.report,
        merged,
        actions=actions,
        bounds=bounds,
        command=command,
        errors=errors,
        where=measured_where(args.from_runs),
    )
    print(f"{len(rows)} rows into {args.report / 'foreign_code.csv'}; {len(errors)} runs not finished")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
