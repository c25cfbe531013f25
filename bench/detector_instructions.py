"""racecheck's detector cost in CPU instructions per training step, counted by valgrind: a
measure that does not drift with clocks or load, for comparing two versions of the detector's hot
path, or the parts of one, where timings on a shared machine differ by more than the change.

    python bench/detector_instructions.py                      # the native path, the working tree
    python bench/detector_instructions.py --detector proxy --rev HEAD~3 --rev .  # two versions

`--detector native` (the default): bench/detector_overhead_native.py's workloads on the CPU
(`--child`, one run in the process), small (`--fsdp2-width` 32, `--width` 64, ...) so that a step's
CPU work is mostly what it is on a GPU, where the kernels run asynchronously: dispatch, Python and
the tools; modes `plain` and `native`. The native run's added instructions are split by
callgrind's inclusive counts of the log's functions (NATIVE_FUNCTIONS): its RecordFunction
callbacks (of them, turning RecordFunction off and on around an operator's callees, and walking
stacks), the drains they call (of them, the native engine applying the records), and the rest:
RecordFunction's own work for every call it shows the log, boxing its arguments and results, which
no mode can isolate (the `native_hooks` mode, recording nothing, never turns RecordFunction off, so
it observes the callees the native path hides). Writes DIR/detector_instructions_native.{md,csv}.

`--detector proxy`: the CPU proxy loop of bench/detector_overhead.py (`--device cpu`, its stand-in
for the caching allocator's callbacks), the Python path before the native one, modes
`dispatch_floor` (an empty TorchDispatchMode) and `racecheck`. Writes DIR/detector_instructions.md.

Each count runs under `valgrind --tool=callgrind`, with address-space randomization off and a fixed
hash seed, for a few and for more timed steps; the difference over the extra steps is the count per
step. A count is exact for what ran, but what ran depends on more than the version: the same commit
counted in a worktree and in this checkout differed by 0.4 M added instructions a step on the FSDP2
step (d56b0e3: 9.02 M and 9.44 M) and by 0.2 M on the plain MLP step, and this checkout's plain MLP
step moved by 0.04 M with changes to bench/ alone. Compare versions in worktrees of the same run
(`--rev A --rev B`), not a worktree against `.`, and read differences of that size as noise.
`--rev` takes git revisions (`.`: the working tree), checked out into temporary worktrees
(the native path's extension is built in each). Needs valgrind and setarch; a run costs a minute
or so (importing torch under valgrind dominates), two at a time.

Regenerates reports/detector_instructions.md (which reports/gpu/README.md cites) and
reports/detector_instructions_native.{md,csv,log} (which the README cites).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROXY_MODES = ("dispatch_floor", "racecheck")
NATIVE_MODES = ("plain", "native")
# Functions of the native run whose inclusive counts split its added instructions: a name, and the
# text that ends the function's name in callgrind_annotate's listing.
NATIVE_FUNCTIONS = {
    "callbacks": ("::on_start(at::RecordFunction const&)", "::on_end(at::RecordFunction const&, at::ObserverContext*)"),
    "drains_in_callbacks": ("::drain_if_full()",),
    "drains": ("::py_drain(_object*, _object*)", "::engine_apply(_object*, _object*)"),
    "apply": ("::engine_apply(_object*, _object*)",),
    "switches": ("at::enableRecordFunction(bool)",),
    "stacks": ("::stack_id()",),
}


def child_command(root: Path, workload: str, mode: str, iters: int, args, tmp: Path) -> list[str]:
    """The command line of one run that does `iters` timed steps."""
    if args.detector == "proxy":
        return [sys.executable, str(root / "bench/detector_overhead.py"), "--child", "--device", "cpu",
                "--mode", mode, "--width", str(args.width), "--batch", str(args.batch), "--warmup", "2",
                "--iters", str(iters), "--json", str(tmp / "out.json")]  # fmt: skip
    return [sys.executable, str(root / "bench/detector_overhead_native.py"), "--device", "cpu", "--child", workload,
            mode, "--warmup", "2", "--iters", str(iters), "--fsdp2-iters", str(iters), "--width", str(args.width),
            "--batch", str(args.batch), "--fsdp2-width", str(args.fsdp2_width), "--fsdp2-heads", "2",
            "--fsdp2-batch", "2", "--fsdp2-seq", "8"]  # fmt: skip


def inclusive(listing: str) -> dict[str, int]:
    """NATIVE_FUNCTIONS' inclusive counts, summed per name, from `callgrind_annotate --inclusive=yes`."""
    found = dict.fromkeys(NATIVE_FUNCTIONS, 0)
    for line in listing.splitlines():
        m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+\S*?:(.*?)(?: \[[^\]]*\])?$", line)
        if not m:
            continue
        for name, ends in NATIVE_FUNCTIONS.items():
            if m.group(2).endswith(ends):
                found[name] += int(m.group(1).replace(",", ""))
    return found


def instructions(root: Path, workload: str, mode: str, iters: int, args) -> dict[str, int]:
    """One child run under callgrind: its instructions ("total") and, for the native path, the
    inclusive counts of NATIVE_FUNCTIONS."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["setarch", os.uname().machine, "-R", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               *child_command(root, workload, mode, iters, args, Path(tmp))]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or not found:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{workload} {mode} x{iters} in {root}: exit {proc.returncode}: {tail}")
        counts = {"total": int(found.group(1))}
        if mode == "native":
            listing = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                                     capture_output=True, text=True, check=True).stdout  # fmt: skip
            counts.update(inclusive(listing))
    print(f"  {workload} {mode} x{iters}: {counts}", flush=True)
    return counts


def per_step(root: Path, workload: str, modes: tuple[str, ...], args, pool) -> dict[str, dict[str, float]]:
    """Instructions per timed step of each mode: the longer run's counts less the shorter's."""
    jobs = {(m, n): pool.submit(instructions, root, workload, m, n, args) for m in modes for n in (args.few, args.more)}
    steps = args.more - args.few
    result = {}
    for m in modes:
        few, more = jobs[m, args.few].result(), jobs[m, args.more].result()
        result[m] = {k: (more[k] - few[k]) / steps for k in more}
    return result


def checkout(rev: str, keep: list[Path]) -> tuple[Path, str]:
    if rev == ".":
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(  # the reports, which a run writes, measure nothing
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!reports"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return REPO, f"working tree ({head.stdout.strip()}{', modified' if dirty else ''})"
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(tempfile.mkdtemp(prefix=f"racecheck-{sha}-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, capture_output=True, check=True)
    keep.append(path)
    return path, f"{sha}{'' if compiled_engine(path) else ' (the Python engine not compiled there)'}"


def compiled_engine(path: Path) -> bool:
    """Give a worktree this checkout's compiled Python engine (setup.py's mypyc extensions and their
    record of the sources they were built from), so that a version runs its engine as an installed
    checkout of it would; racecheck uses them only where the worktree's sources are the ones they
    were built from. Whether it does."""
    detect = REPO / "racecheck" / "detect"
    for built in [*detect.glob("*.so"), detect / "_native_build.py"]:
        if built.exists():
            shutil.copy2(built, path / "racecheck" / "detect" / built.name)
    probe = "import racecheck.detect.native as n; print(n._built_from_these_sources())"
    got = subprocess.run([sys.executable, "-c", probe], cwd=path, capture_output=True, text=True)
    return got.stdout.strip() == "True"


def command(args) -> str:
    """The command line that made a report, as the report quotes it."""
    detector = " --detector proxy" if args.detector == "proxy" else ""
    return f"`python bench/detector_instructions.py{detector}{''.join(f' --rev {r}' for r in args.rev or [])}`"


def proxy_lines(rows: list[tuple[str, dict]], args) -> list[str]:
    lines = [
        "# racecheck's detector in CPU instructions per step (CPU proxy, callgrind)",
        "",
        command(args)
        + f": the loop of `bench/detector_overhead.py --device cpu` ({args.width}-wide, batch {args.batch}), "
        f"instructions of {args.more} timed steps minus those of {args.few}, per step.",
        "",
        "| version | empty TorchDispatchMode | racecheck | racecheck above it |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, counts in rows:
        floor, racecheck = counts["proxy"]["dispatch_floor"]["total"], counts["proxy"]["racecheck"]["total"]
        lines.append(f"| {label} | {floor / 1e6:.2f} M | {racecheck / 1e6:.2f} M | {(racecheck - floor) / 1e6:.2f} M |")
    if len(rows) == 2:
        (a, ca), (b, cb) = rows
        da, db = (c["proxy"]["racecheck"]["total"] - c["proxy"]["dispatch_floor"]["total"] for c in (ca, cb))
        lines += ["", f"{b} against {a}: {100 * (db - da) / da:+.1f}% of racecheck's own instructions."]
    return lines


def native_parts(c: dict[str, dict[str, float]]) -> list[tuple[str, float]]:
    """The native path's added instructions per step, split by the inclusive counts of its run."""
    native = c["native"]
    added = native["total"] - c["plain"]["total"]
    own = native["callbacks"] - native["drains_in_callbacks"]
    return [
        ("RecordFunction's work for every call it shows the log (boxing arguments and results), and the rest",
         added - own - native["drains"]),
        ("the log's callbacks, less the drains they call", own),
        ("of these, turning RecordFunction off and on around an operator's callees", native["switches"]),
        ("of these, walking Python stacks", native["stacks"]),
        ("the drains (taking the log's records, the native engine applying them)", native["drains"]),
        ("of these, the native engine applying the records", native["apply"]),
    ]  # fmt: skip


def native_lines(rows: list[tuple[str, dict]], args) -> list[str]:
    lines = [
        "# The native detector in CPU instructions per training step (callgrind)",
        "",
        command(args) + f": bench/detector_overhead_native.py's workloads on the CPU, small (FSDP2: 4 layers of width "
        f"{args.fsdp2_width}, batch 2 x 8, bf16, one gloo rank; MLP: 8 layers of width {args.width}, batch "
        f"{args.batch}), the CPU tracker, one thread; instructions of {args.more} timed steps minus those of "
        f"{args.few}, per step. The split is callgrind's inclusive counts of the log's functions in the native "
        "run. A count is exact for the code it ran: it does not drift with clocks or load.",
    ]
    for label, counts in rows:
        for workload, c in counts.items():
            plain, native = c["plain"]["total"], c["native"]["total"]
            added = native - plain
            lines += ["", f"## {workload} ({label})", "",
                      f"Plain step {plain / 1e6:.2f} M instructions, with the native detector {native / 1e6:.2f} M "
                      f"({100 * added / plain:+.1f}%).", "",
                      "| the native path's added instructions | M per step | share |",
                      "| --- | ---: | ---: |"]  # fmt: skip
            for name, n in native_parts(c):
                lines.append(f"| {name} | {n / 1e6:.2f} | {100 * n / added:.0f}% |")
    return lines


def write_native_csv(out: Path, rows: list[tuple[str, dict]]) -> None:
    with (out / "detector_instructions_native.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["version", "workload", "plain", "native", *NATIVE_FUNCTIONS])
        for label, counts in rows:
            for workload, c in counts.items():
                native = c["native"]
                w.writerow([label, workload, round(c["plain"]["total"]), round(native["total"]),
                            *(round(native[k]) for k in NATIVE_FUNCTIONS)])  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--detector", choices=("native", "proxy"), default="native")
    p.add_argument(
        "--rev",
        action="append",
        help="git revision to measure, `.` for the working tree (repeatable; default: the working tree)",
    )
    p.add_argument("--out", default=str(REPO / "reports"))
    p.add_argument("--workloads", default="fsdp2-adamw,mlp-adamw", help="--detector native: which workloads")
    p.add_argument("--width", type=int, help="the MLP's width (default: 64; the proxy's 256)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--fsdp2-width", type=int, default=32)
    p.add_argument("--few", type=int, default=2, help="timed steps of the shorter run")
    p.add_argument("--more", type=int, default=12, help="timed steps of the longer run")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    if args.width is None:
        args.width = 256 if args.detector == "proxy" else 64
    if args.few >= args.more:
        p.error(f"--few {args.few} must be fewer than --more {args.more}")
    missing = [tool for tool in ("valgrind", "setarch") if shutil.which(tool) is None]
    if missing:
        print(f"detector_instructions: error: {', '.join(missing)} not found", file=sys.stderr)
        return 2
    workloads = ["proxy"] if args.detector == "proxy" else args.workloads.split(",")
    modes = PROXY_MODES if args.detector == "proxy" else NATIVE_MODES
    worktrees: list[Path] = []
    rows = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for rev in args.rev or ["."]:
                root, label = checkout(rev, worktrees)
                print(f"{label}:", flush=True)
                counts = {w: per_step(root, w, modes, args, pool) for w in workloads}
                rows.append((label, counts))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"detector_instructions: error: {exc}", file=sys.stderr)
        return 1
    finally:
        for path in worktrees:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.detector == "proxy":
        lines = proxy_lines(rows, args)
        (out / "detector_instructions.md").write_text("\n".join(lines) + "\n")
    else:
        lines = native_lines(rows, args)
        (out / "detector_instructions_native.md").write_text("\n".join(lines) + "\n")
        write_native_csv(out, rows)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
