"""The soundness check on a GPU: programs generated as in tests/test_soundness.py, run with
torch.cuda itself under patch mode (every named profile, every pair, the random schedule) and the
PyTorch tracker; then the same programs with one synchronization removed, reported by the tracker
and found by the systematic schedule. On the CPU, `--backend emulation` runs the check of CI with
more examples.

    python3 bench/soundness.py --out rows.csv [--programs 20] [--racy 20] [--backend cuda|emulation]

The programs' copies are written several ways (program_ops.FORMS): copy_, a compiled function, a
Triton kernel, and over a process group of one rank the functional collectives (an all-reduce,
then an all-gather), a DTensor's full_tensor() and FSDP2's own operator, whose modules the first
such copy imports, with patch mode installed. On CUDA the check holds that group (NCCL) for all
its runs and adds profiles at the collective points.

Rows (`suite,case,arm,expect,mode,trials,failures,detected`, as bench/foreign_code.py writes):
suite `generated`; case `correct` (a program as generated), `racy-access` or `racy-reuse` (one
synchronization removed); mode a profile (`profile:SPEC`), `detect` (the tracker, nothing
injected) or `systematic` (correct programs: `failures` counts those that computed something else
with any single point delayed; racy programs: those found within k trials, among those one delayed
point must expose, `trials`); `trials` counts programs.

Its GPU run, which the README's Soundness section cites, is reports/gpu/verdicts/soundness_x1.csv
(bench/foreign_code.py and bench/verdicts_gpu.sh run it).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLUMNS = ("suite", "case", "arm", "expect", "mode", "trials", "failures", "detected")
# The systematic schedule's delay on the emulation, tests/test_soundness.py's RACE_DELAY_S: the
# delayed stream must still be behind when the host makes the racing access, however long the host
# thread waits for a core (50 ms missed a racy program beside other work on the 2-core machine).
EMULATION_DELAY_S = 0.25


def draw_programs(n: int, *, seed: int) -> list:
    """`n` programs from the generator, reproducibly (Hypothesis' find with a fixed seed)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from racecheck.scenario_kit.programs import programs

    found: list = []

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(programs())
    def collect(program):
        found.append(program)

    collect()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--programs", type=int, default=20, help="correct programs")
    parser.add_argument("--racy", type=int, default=20, help="programs whose synchronizations are each removed once")
    parser.add_argument("--backend", choices=("cuda", "emulation"), default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=None)
    args = parser.parse_args()

    from racecheck.scenario_kit import program_kernels
    from racecheck.scenario_kit.program_values import expected
    from racecheck.scenario_kit.soundness import EmulationPatch, TorchCudaPatch, profile_specs

    backend = TorchCudaPatch() if args.backend == "cuda" else EmulationPatch()
    start = time.monotonic()
    rows: dict[tuple, dict] = {}

    def count(case, expect, mode, *, failed=False, detected=None):
        row = rows.setdefault(
            (case, mode),
            {
                "suite": "generated",
                "case": case,
                "arm": backend.name,
                "expect": expect,
                "mode": mode,
                "trials": 0,
                "failures": 0,
                "detected": "" if detected is None else 0,
            },
        )
        row["trials"] += 1
        row["failures"] += int(failed)
        if detected is not None:
            row["detected"] = int(row["detected"] or 0) + int(detected)

    specs = profile_specs(backend.profiles)
    with contextlib.ExitStack() as held:
        if args.backend == "cuda":  # one NCCL group of one rank for every run, not one per run
            held.enter_context(program_kernels.world_of_one(set(program_kernels.DISTRIBUTED_FORMS), cuda=True))
        for i, program in enumerate(draw_programs(args.programs, seed=args.seed)):
            want = expected(program)
            for j, spec in enumerate(specs):
                got = backend.run(program, spec=spec, seed=1000 * i + j).outcome
                count("correct", "safe", f"profile:{spec}", failed=got != want)
            plain = backend.run(program, detect=True)
            count("correct", "safe", "detect", failed=plain.outcome != want, detected=bool(plain.reports))
            single = "systematic:delay=2ms:pairs=0"  # every point the program passes, delayed alone
            keys = backend.run(program, spec=single).handoffs
            failed = any(backend.run(program, spec=single, plan=(k,)).outcome != want for k in keys)
            count("correct", "safe", "systematic", failed=failed)
            if args.max_seconds and time.monotonic() - start > args.max_seconds / 2:
                break
        _racy(args, backend, count, start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows.values())
    bad = [r for r in rows.values() if r["expect"] == "safe" and (r["failures"] or r["detected"])]
    missed = [r for r in rows.values() if r["expect"] == "race" and _missed(r)]
    print(f"{len(rows)} rows in {time.monotonic() - start:.0f} s: {len(bad)} unsound, {len(missed)} missed")
    for r in bad + missed:
        print("  ", r)
    return 0 if not (bad or missed) else 1


def _racy(args, backend, count, start: float) -> None:
    """Each synchronization of each racy program removed once: reported, and found in time."""
    from racecheck.scenario_kit.soundness import racy_verdict

    for program in draw_programs(args.racy, seed=args.seed + 1):
        for i in range(len(program.syncs)):
            verdict = racy_verdict(backend, program, i, delay=0.005 if args.backend == "cuda" else EMULATION_DELAY_S)
            case = f"racy-{verdict.reason}"
            if verdict.physical:
                count(case, "race", "detect", detected=verdict.reported)
            if verdict.must_find:
                count(case, "race", "systematic", failed=verdict.found_in is not None)
        if args.max_seconds and time.monotonic() - start > args.max_seconds:
            break


def _missed(row: dict) -> bool:
    """A racy row whose tool did not catch every program: the detector, or the systematic bound."""
    if row["mode"] == "detect":
        return row["detected"] != row["trials"]
    return row["mode"] == "systematic" and row["failures"] != row["trials"]


if __name__ == "__main__":
    sys.exit(main())
