"""racecheck's detector cost in CPU instructions per training step, counted by valgrind: a
measure that does not drift with clocks or load, for comparing two versions of the detector's hot
path where timings on a shared machine differ by more than the change.

    python bench/detector_instructions.py                      # the working tree
    python bench/detector_instructions.py --rev HEAD~3 --rev .  # two versions side by side

Each version runs the CPU proxy loop of bench/detector_overhead.py (`--device cpu`, its stand-in
for the caching allocator's callbacks) under `valgrind --tool=callgrind`, with address-space
randomization off and a fixed hash seed, for a few and for more timed steps; the difference over
the extra steps is the count per step. Modes: `dispatch_floor` (an empty TorchDispatchMode) and
`racecheck`; racecheck's own work is the difference. `--rev` takes git revisions (`.`: the working
tree), checked out into temporary worktrees. Needs valgrind and setarch; a version costs a few
minutes (importing torch under valgrind dominates), two runs at a time.

Writes DIR/detector_instructions.md (default DIR: reports) and prints it.

Regenerates reports/detector_instructions.md (which reports/gpu/README.md cites).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("dispatch_floor", "racecheck")


def instructions(root: Path, mode: str, iters: int, args) -> int:
    """Instructions of one child run of the CPU proxy loop under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "setarch",
            os.uname().machine,
            "-R",
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(root / "bench/detector_overhead.py"),
            "--child",
            "--device",
            "cpu",
            "--mode",
            mode,
            "--width",
            str(args.width),
            "--batch",
            str(args.batch),
            "--warmup",
            "2",
            "--iters",
            str(iters),
            "--json",
            str(Path(tmp) / "out.json"),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{mode} x{iters} in {root}: exit {proc.returncode}: {tail}")
    return int(found.group(1))


def per_step(root: Path, args, pool) -> dict[str, float]:
    jobs = {(m, n): pool.submit(instructions, root, m, n, args) for m in MODES for n in (args.few, args.more)}
    return {m: (jobs[m, args.more].result() - jobs[m, args.few].result()) / (args.more - args.few) for m in MODES}


def checkout(rev: str, keep: list[Path]) -> tuple[Path, str]:
    if rev == ".":
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return REPO, f"working tree ({head.stdout.strip()}{', modified' if dirty else ''})"
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(tempfile.mkdtemp(prefix=f"racecheck-{sha}-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, capture_output=True, check=True)
    keep.append(path)
    return path, sha


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rev",
        action="append",
        help="git revision to measure, `.` for the working tree (repeatable; default: the working tree)",
    )
    p.add_argument("--out", default=str(REPO / "reports"))
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--few", type=int, default=2, help="timed steps of the shorter run")
    p.add_argument("--more", type=int, default=12, help="timed steps of the longer run")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    missing = [tool for tool in ("valgrind", "setarch") if shutil.which(tool) is None]
    if missing:
        print(f"detector_instructions: error: {', '.join(missing)} not found", file=sys.stderr)
        return 2
    worktrees: list[Path] = []
    rows = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for rev in args.rev or ["."]:
                root, label = checkout(rev, worktrees)
                counts = per_step(root, args, pool)
                rows.append((label, counts))
                print(f"{label}: {counts}", flush=True)
    finally:
        for path in worktrees:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
    lines = [
        "# racecheck's detector in CPU instructions per step (CPU proxy, callgrind)",
        "",
        "`python bench/detector_instructions.py"
        + "".join(f" --rev {r}" for r in args.rev or [])
        + "`"
        + f": the loop of `bench/detector_overhead.py --device cpu` ({args.width}-wide, batch {args.batch}), "
        f"instructions of {args.more} timed steps minus those of {args.few}, per step.",
        "",
        "| version | empty TorchDispatchMode | racecheck | racecheck above it |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, c in rows:
        lines.append(
            f"| {label} | {c['dispatch_floor'] / 1e6:.2f} M | {c['racecheck'] / 1e6:.2f} M | "
            f"{(c['racecheck'] - c['dispatch_floor']) / 1e6:.2f} M |"
        )
    if len(rows) == 2:
        (a, ca), (b, cb) = rows
        da, db = (c["racecheck"] - c["dispatch_floor"] for c in (ca, cb))
        lines += ["", f"{b} against {a}: {100 * (db - da) / da:+.1f}% of racecheck's own instructions."]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "detector_instructions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
