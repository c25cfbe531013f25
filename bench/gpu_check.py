"""The whole GPU check: environment, CUDA tests, the catalogue over CUDA (perturbed, natural, the
random schedule, with the detector, and unperturbed under torch.cuda._sanitizer), FSDP parity,
the detector against torch.cuda._sanitizer, patch mode and FSDP2, and the injector's and
detector's overheads. Every step runs as its own subprocess with a time limit;
its output and tables land under OUT/<step>/, and a summary table is printed last.

    python3 bench/gpu_check.py --out "$OUT/gpu" [--steps default|more|all|STEP,PART,...] [--trials 10]

`default` fits one 10-minute device call, `more` is the rest of the evidence in a second one
(`--continue` resumes catalogue runs that a time limit cut); `benchmark` is every catalogue part
the benchmark table reads (bench/catalogue_table.py --benchmark), in more than one call. Run it
through bench/gpu_check.sh on the GPU machine; it adapts to the number of GPUs present.

Regenerates the GPU columns of reports/catalogue_table.md and the tables under reports/gpu/ that
reports/gpu/README.md lists (catalogue_x*, benchmark_x1_*, parity, sanitizer_compare*,
patch_mode, fsdp_vs_fsdp2, perturb_overhead*, detector_overhead*).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# NVLink multicast stays off on shared hosts (NCCL, PyTorch's symmetric memory, NVSHMEM).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# What one device call (10 minutes) holds on 2 GPUs: the CUDA tests, the catalogue perturbed and
# natural, the detector against the sanitizer, the FSDP2 benchmark and the injector's overhead
# (about 510 s in all by the step times measured on nvidia-h200-x2, over separate calls); `more` is
# the rest of the evidence.
PRESETS = {
    "default": ["env", "tests", "perturbed", "natural", "sanitizer-compare", "fsdp-vs-fsdp2", "injector-overhead"],
    "more": ["detect", "meshes", "fsdp-parity", "patch-mode", "detector-overhead"],
    # The benchmark's GPU columns (bench/catalogue_table.py --benchmark): more than one call holds,
    # see the README's GPU section for the split.
    "benchmark": ["env", "perturbed", "natural", "random", "detect", "sanitizer"],
}
PRESETS["all"] = PRESETS["default"] + PRESETS["more"] + ["random", "sanitizer"]
# torch.cuda._sanitizer on the unperturbed catalogue: enabled at `import torch` in every process the
# run starts (torch/__init__.py reads TORCH_CUDA_SANITIZER); a test it reports on fails with
# CUDASanitizerErrors, which `racecheck report --signature` counts apart from wrong numbers.
SANITIZER_ENV = ["env", "TORCH_CUDA_SANITIZER=1"]
SANITIZER_SIGNATURE = "CUDASanitizerErrors"


def catalogue_split(gpus: int) -> tuple[list[str], list[str]]:
    """(scenarios that can run on `gpus` ranks, those that need more: their min_world_size)."""
    from racecheck.suites.catalogue import find_catalogue, load_catalogue

    catalogue = load_catalogue(find_catalogue(str(ROOT / "scenarios")))
    runs = [s.name for s in catalogue.values() if s.min_world_size <= gpus]
    return runs, [s.name for s in catalogue.values() if s.min_world_size > gpus]


def earlier_run(args, name: str) -> Path | None:
    """The run folder of catalogue part `name` in the --continue check, when it has one."""
    if args.continue_from is None:
        return None
    earlier = args.continue_from / "catalogue" / name
    return earlier if (earlier / "run.json").exists() else None


def catalogue_run(args, name: str, extra: list[str], runnable: list[str], gpus: int) -> list[str]:
    """One `racecheck run` of the catalogue, or the continuation of an earlier check's run (--continue:
    main copies its folder in before the part runs; run.json keeps the options)."""
    out = f"{{dir}}/{name}"
    limit = ["--max-time", str(args.run_seconds)]  # a slow run keeps its finished trials
    rc = (SANITIZER_ENV if name == "sanitizer" else []) + [PY, "-m", "racecheck", "run", "--quiet"]
    if earlier_run(args, name) is not None:
        return rc + ["--resume", out, *limit]
    # The whole catalogue at one rank per GPU (the HSDP meshes adapt, see
    # racecheck.scenario_kit.harness.hsdp_mesh_config).
    return rc + fresh_run_options(args, ",".join(runnable), gpus) + [*extra, *limit, "--out", out]


def fresh_run_options(args, scenarios: str, gpus: int) -> list[str]:
    """The options of a new `racecheck run` of every arm of `scenarios` on `gpus` ranks."""
    return [
        "--backend",
        args.backend,
        "--arms",
        "all",
        "--trials",
        str(args.trials),
        "--scenario",
        scenarios,
        "--world-size",
        str(gpus),
    ]


def extra_meshes(gpus: int) -> list[str]:
    """HSDP meshes SHARDxREPLICATE with both axes >= 2 other than the catalogue's own (2 x gpus/2,
    racecheck.scenario_kit.harness.hsdp_mesh_config): on 8 GPUs, 4x2."""
    return [f"{s}x{gpus // s}" for s in range(3, gpus // 2 + 1) if gpus % s == 0]


def mesh_runs(args, gpus: int) -> list[tuple[str, list[str], float]]:
    """The motivating scenario on each extra HSDP mesh (--mesh), perturbed and natural."""
    out = []
    for mesh in extra_meshes(gpus):
        for name, extra in (("perturbed", []), ("natural", ["--no-perturb"])):
            argv = [
                PY,
                "-m",
                "racecheck",
                "run",
                "--quiet",
                *fresh_run_options(args, "main_grad_reuse", gpus),
                "--mesh",
                mesh,
                *extra,
                "--max-time",
                str(args.run_seconds),
                "--out",
                f"{{dir}}/{mesh}-{name}",
            ]
            out.append((f"mesh-{mesh}-{name}", argv, args.run_seconds + 60))
    return out


def steps(args, gpus: int, runnable: list[str]) -> dict[str, list[tuple[str, list[str], float]]]:
    """Each step: a list of (name, argv, time limit in seconds); `runnable`: the catalogue's
    scenarios that fit on `gpus` ranks."""
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node"]
    every_gpu, two_gpus = torchrun + [str(gpus)], torchrun + [str(min(gpus, 2))]
    out = {
        "env": [
            ("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"], 30),
            (
                "versions",
                [
                    PY,
                    "-c",
                    "import torch, sys; print(sys.version.split()[0], torch.__version__, "
                    "torch.version.cuda, torch.cuda.device_count())",
                ],
                60,
            ),
        ],
        "tests": [
            (
                "pytest-cuda",
                [
                    PY,
                    "-m",
                    "pytest",
                    "-m",
                    "cuda",
                    "tests/test_cuda_runtime.py",
                    "tests/test_detect_cuda.py",
                    "tests/test_patch_cuda.py",
                    "tests/test_device_contract.py",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-x",
                    "--timeout=120",
                ],
                240,
            )
        ],
        # The whole catalogue at one rank per GPU (the HSDP meshes adapt, see
        # racecheck.scenario_kit.harness.hsdp_mesh_config); --max-time keeps the finished trials of a slow run.
        "catalogue": [
            (name, catalogue_run(args, name, extra, runnable, gpus), args.run_seconds + 60)
            for name, extra in (
                ("perturbed", []),
                ("natural", ["--no-perturb"]),
                ("random", ["--perturb", "random"]),
                ("detect", ["--no-perturb", "--detect"]),
                ("sanitizer", ["--no-perturb"]),
            )
        ]
        if runnable
        else [],
        "meshes": mesh_runs(args, gpus),
        "parity": [("fsdp-parity", every_gpu + [str(ROOT / "bench/gpu_parity.py"), "--out", "{dir}"], 240)],
        "detector": [
            ("sanitizer-compare", [PY, str(ROOT / "bench/sanitizer_compare.py"), "--out", "{dir}"], 240),
            (
                "detector-overhead",
                [
                    PY,
                    str(ROOT / "bench/detector_overhead.py"),
                    "--out",
                    "{dir}",
                    "--modes",
                    "none,racecheck,sanitizer,dispatch_floor,racecheck_python",
                    "--iters",
                    "1000",
                    "--repeats",
                    "5",
                ],
                540,
            ),
        ],
        "patch": [("patch-mode", two_gpus + [str(ROOT / "bench/patch_mode_gpu.py"), "--out", "{dir}"], 240)],
        "overhead": [
            (
                "injector-overhead",
                [PY, str(ROOT / "bench/injector_overhead.py"), "--backend", "cuda", "--out", "{dir}"],
                180,
            )
        ],
        "fsdp2": [("fsdp-vs-fsdp2", every_gpu + [str(ROOT / "bench/fsdp_vs_fsdp2.py"), "--out", "{dir}"], 300)],
    }
    return out


def run_step(name: str, argv: list[str], limit: float, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    argv = [a.replace("{dir}", str(folder)) for a in argv]
    missing = [a for a in argv if a.endswith(".py") and not Path(a).exists()]
    if missing:
        return {"step": name, "status": "missing", "detail": f"no {missing[0]}", "seconds": 0.0}
    log = folder / f"{name}.log"
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **NO_MULTICAST}
    with open(log, "w") as fh:
        fh.write("$ " + shlex.join(argv) + "\n")
        fh.flush()
        try:
            proc = subprocess.run(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=limit, env=env)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {limit:.0f} s"
        except OSError as exc:  # e.g. no nvidia-smi on this machine
            fh.write(f"could not start: {exc}\n")
            status = "could not start"
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
    return {
        "step": name,
        "status": status,
        "detail": " | ".join(tail)[-300:],
        "seconds": round(time.monotonic() - started, 1),
    }


def sanitizer_counts(run: Path) -> None:
    """RUN/sanitizer.csv: the sanitizer run's summary counting only the trials it reported in."""
    if not (run / "trials.jsonl").exists():
        return
    subprocess.run(
        [
            PY,
            "-m",
            "racecheck",
            "report",
            str(run),
            "--format",
            "csv",
            "--signature",
            SANITIZER_SIGNATURE,
            "--output",
            str(run / "sanitizer.csv"),
        ],
        cwd=ROOT,
        check=False,
    )


def grouped(todo: list, together: set[str]) -> list[list]:
    """`todo` as groups run one after the other: the parts named in `together` form one group,
    placed where the first of them comes; every other part is a group of its own."""
    groups: list[list] = []
    joint: list | None = None
    for item in todo:
        if item[1][0] in together:
            if joint is None:
                joint = []
                groups.append(joint)
            joint.append(item)
        else:
            groups.append([item])
    return groups


def write_summary(out: Path, gpus: int, results: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"gpus": gpus, "results": results}, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--steps",
        default="default",
        help="comma-separated steps or parts of steps, or a preset: default (fits one "
        "10-minute call), more (the rest), all",
    )
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--backend",
        default="cuda",
        choices=("cuda", "sim"),
        help="sim: rehearse the catalogue steps on the CPU emulation",
    )
    parser.add_argument("--ranks", type=int, default=None, help="ranks to use (default: the GPU count)")
    parser.add_argument(
        "--continue",
        dest="continue_from",
        type=Path,
        default=None,
        metavar="DIR",
        help="an earlier check's output folder: resume its catalogue runs",
    )
    parser.add_argument("--run-seconds", type=int, default=170, help="--max-time of each catalogue run")
    parser.add_argument(
        "--scenarios",
        default="",
        help="comma-separated catalogue scenarios for the catalogue parts (default: all that fit)",
    )
    parser.add_argument(
        "--together",
        default="",
        help="comma-separated parts that run at the same time, as one group where the "
        "first of them comes (e.g. perturbed,random,detect,sanitizer: forced and "
        "detected outcomes do not depend on a quiet GPU; keep natural out of it)",
    )
    args = parser.parse_args()
    gpus = args.ranks or gpu_count()
    runnable, too_few = catalogue_split(gpus)
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = [w for w in wanted if w not in runnable and w not in too_few]
        if unknown:
            parser.error(f"--scenarios: unknown {', '.join(unknown)}")
        runnable, too_few = [s for s in runnable if s in wanted], [s for s in too_few if s in wanted]
    plan = steps(args, gpus, runnable)
    chosen = [s for token in args.steps.split(",") if token for s in PRESETS.get(token, [token])]
    # A step runs all its parts; a part (e.g. detector-overhead) can also be chosen alone.
    parts = {name: step for step, items in plan.items() for name, _, _ in items}
    unknown = [s for s in chosen if s not in plan and s not in parts]
    if unknown:
        parser.error(
            f"unknown steps {unknown}; known: {', '.join(PRESETS)}, {', '.join(plan)} (or one part: {', '.join(parts)})"
        )
    todo = [(step, item) for step, items in plan.items() for item in items if step in chosen or item[0] in chosen]
    results = []
    runs_catalogue = any(step == "catalogue" for step, _ in todo)
    if runs_catalogue and too_few:
        results.append(
            {
                "step": "catalogue",
                "status": "skipped",
                "seconds": 0.0,
                "detail": f"{', '.join(too_few)}: need more ranks than {gpus} GPU(s)",
            }
        )
    together = {t for t in args.together.split(",") if t}
    if together - set(parts):
        parser.error(f"--together names unknown parts {sorted(together - set(parts))}")
    for group in grouped(todo, together):
        runnable_now = []
        for step, (name, argv, limit) in group:
            if gpus < 2 and step in ("fsdp2", "patch", "parity"):
                results.append({"step": name, "status": "skipped", "detail": "needs 2 GPUs", "seconds": 0.0})
                continue
            earlier = earlier_run(args, name) if step == "catalogue" else None
            if earlier is not None and not (args.out / step / name).exists():
                shutil.copytree(earlier, args.out / step / name)  # then `racecheck run --resume` continues it
            runnable_now.append((name, argv, limit, args.out / step))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(runnable_now))) as pool:
            for result in pool.map(lambda item: run_step(*item), runnable_now):
                results.append(result)
                print(f"[gpu_check] {result['step']}: {result['status']} ({result['seconds']} s)", flush=True)
        write_summary(args.out, gpus, results)  # after every group: a cut-off check keeps what ran
    if runs_catalogue:
        folder = args.out / "catalogue"
        sanitizer_counts(folder / "sanitizer")
        runs = [f"{n}={folder / n / 'summary.csv'}" for n in ("perturbed", "natural", "random", "detect")]
        runs.append(f"sanitizer={folder / 'sanitizer' / 'sanitizer.csv'}")
        subprocess.run(
            [
                PY,
                str(ROOT / "bench/catalogue_table.py"),
                str(folder / "catalogue_table.md"),
                *runs,
                "--title",
                f"Catalogue over {args.backend} on {gpus} rank(s), {args.trials} trials per arm",
                "--note",
                f"Failing trials out of trials (`*` rows); every scenario at --world-size {gpus}."
                + (f" Not run: {', '.join(too_few)} (need more ranks)." if too_few else ""),
            ],
            cwd=ROOT,
            check=False,
        )
    write_summary(args.out, gpus, results)
    print(f"\nGPU check on {gpus} GPU(s):")
    for r in results:
        print(f"  {r['step']:<22} {r['status']:<22} {r['seconds']:>7} s  {r['detail'][-110:]}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
