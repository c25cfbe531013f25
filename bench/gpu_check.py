"""The whole GPU check in one call: environment, CUDA tests, the catalogue over CUDA (perturbed and
natural), FSDP parity, the detector against torch.cuda._sanitizer, patch mode and FSDP2, and the
injector's and detector's overheads. Every step runs as its own subprocess with a time limit; its
output and tables land under OUT/<step>/, and a summary table is printed last.

    python3 bench/gpu_check.py --out "$OUT/gpu" [--steps env,tests,catalogue,...] [--trials 10]

Run it through bench/gpu_check.sh on the GPU machine; it adapts to the number of GPUs present.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def catalogue_groups(gpus: int) -> list[tuple[str, str, list[str]]]:
    """(label, scenarios, world-size option): the scenarios that fit on `gpus` as they are, and
    those that need a smaller world."""
    from racecheck.trials.catalogue import find_catalogue, load_catalogue

    catalogue = load_catalogue(find_catalogue(str(ROOT / "scenarios")))
    fits = [s.name for s in catalogue.values() if s.world_size <= gpus]
    shrink = [s.name for s in catalogue.values() if s.world_size > gpus]
    groups = [("fits", ",".join(fits), [])] if fits else []
    if shrink:
        groups.append(("shrunk", ",".join(shrink), ["--world-size", str(gpus)]))
    return groups


def steps(args, gpus: int) -> dict[str, list[tuple[str, list[str], float]]]:
    """Each step: a list of (name, argv, time limit in seconds)."""
    rc = [PY, "-m", "racecheck", "run", "--backend", "cuda", "--quiet", "--arms", "all", "--trials", str(args.trials)]
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc-per-node", str(min(gpus, 2))]
    out = {
        "env": [("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv"], 30),
                ("versions", [PY, "-c", "import torch, sys; print(sys.version.split()[0], torch.__version__, "
                                        "torch.version.cuda, torch.cuda.device_count())"], 60)],
        "tests": [("pytest-cuda", [PY, "-m", "pytest", "-m", "cuda", "tests", "-q", "-p", "no:cacheprovider",
                                   "-x", "--timeout=120"], 240)],
        # Scenarios that need more ranks than there are GPUs run on all of them (their meshes
        # shrink, see racecheck.harness.hsdp_mesh_config); the others keep their own world size.
        "catalogue": [
            (f"{name}-{group}", rc + ["--scenario", scenarios, *extra, *world, "--out", f"{{dir}}/{name}-{group}"], 300)
            for group, scenarios, world in catalogue_groups(gpus)
            for name, extra in (("perturbed", []), ("natural", ["--no-perturb"]),
                                ("detect", ["--no-perturb", "--detect"]))
        ],
        "parity": [("fsdp-parity", torchrun + [str(ROOT / "bench/gpu_parity.py"), "--out", "{dir}"], 240)],
        "detector": [("sanitizer-compare", [PY, str(ROOT / "bench/sanitizer_compare.py"), "--out", "{dir}"], 240),
                     ("detector-overhead", [PY, str(ROOT / "bench/detector_overhead.py"), "--out", "{dir}"], 180)],
        "patch": [("patch-mode", torchrun + [str(ROOT / "bench/patch_mode_gpu.py"), "--out", "{dir}"], 240)],
        "overhead": [("injector-overhead", [PY, str(ROOT / "bench/injector_overhead.py"), "--backend", "cuda",
                                            "--out", "{dir}"], 180)],
        "fsdp2": [("fsdp-vs-fsdp2", torchrun + [str(ROOT / "bench/fsdp_vs_fsdp2.py"), "--out", "{dir}"], 300)],
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
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as fh:
        fh.write("$ " + shlex.join(argv) + "\n")
        fh.flush()
        try:
            proc = subprocess.run(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=limit, env=env)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {limit:.0f} s"
    tail = [l for l in log.read_text(errors="replace").splitlines() if l.strip()][-3:]
    return {"step": name, "status": status, "detail": " | ".join(tail)[-300:],
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="env,tests,catalogue,parity,detector,patch,overhead,fsdp2")
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    gpus = gpu_count()
    plan = steps(args, gpus)
    chosen = [s for s in args.steps.split(",") if s]
    unknown = [s for s in chosen if s not in plan]
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {', '.join(plan)}")
    results = []
    for step in chosen:
        for name, argv, limit in plan[step]:
            if gpus < 2 and step in ("fsdp2", "patch", "parity"):
                results.append({"step": name, "status": "skipped", "detail": "needs 2 GPUs", "seconds": 0.0})
                continue
            results.append(run_step(name, argv, limit, args.out / step))
            print(f"[gpu_check] {results[-1]['step']}: {results[-1]['status']} ({results[-1]['seconds']} s)",
                  flush=True)
    (args.out / "summary.json").write_text(json.dumps({"gpus": gpus, "results": results}, indent=2))
    print(f"\nGPU check on {gpus} GPU(s):")
    for r in results:
        print(f"  {r['step']:<22} {r['status']:<22} {r['seconds']:>7} s  {r['detail'][-110:]}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
