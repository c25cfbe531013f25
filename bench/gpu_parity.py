"""racecheck.fsdp parity on GPUs: the CPU test matrix (racecheck.scenario_kit.fsdp_parity) on the CUDA backend
over NCCL, unchanged FSDP code, and a pass/fail table.

    torchrun --nproc-per-node N bench/gpu_parity.py [--quick] [--out reports/gpu/parity.md]

Meshes (see `meshes`), on 2 GPUs: FSDP over 2 ranks (shard 2), HSDP 1x2 (shard 1 x replicate 2:
every rank holds the whole group; the gradient goes through the all-reduce stream) and HSDP 2x1
(shard 2 x replicate 1; a replicate axis of one rank has nothing to all-reduce, so it runs the
FSDP path); on 4 GPUs also HSDP 2x2, where both the reduce-scatter and the all-reduce run.
Each mesh runs the parity matrix, the perturbed cases (delays and poison-on-free through the CUDA
runtime) and the bitwise state-dict round trip. TF32 is off: fp32 parity means fp32 arithmetic.
Exit code 0 when every case passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from racecheck.device import init_runtime, shutdown_runtime  # noqa: E402
from racecheck.fsdp import Mesh, MeshConfig  # noqa: E402
from racecheck.scenario_kit import fsdp_parity as parity  # noqa: E402


def meshes(world: int) -> dict[str, MeshConfig]:
    """FSDP over every rank, and HSDP SHARDxREPLICATE for every way of factoring the world (on 2
    ranks: FSDP 2, HSDP 1x2, HSDP 2x1; on 4: FSDP 4, HSDP 1x4, 2x2, 4x1)."""
    out = {f"FSDP {world}": MeshConfig(shard=world)}
    for shard in range(1, world + 1):
        if world % shard == 0:
            out[f"HSDP {shard}x{world // shard}"] = MeshConfig(shard=shard, replicate=world // shard)
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the short matrix, no perturbed cases")
    p.add_argument(
        "--out",
        type=Path,
        help="also write the table as Markdown to this file, or to parity.md in this directory (rank 0)",
    )
    p.add_argument("--cpu", action="store_true", help="run on the CPU emulation over gloo (checks the script)")
    return p.parse_args()


def cases(quick: bool):
    """(label, callable(mesh, rt) -> CaseResult) in run order."""
    out = [
        (c.name, lambda mesh, rt, c=c: parity.run_case(c, mesh=mesh, runtime=rt))
        for c in parity.default_matrix(full=not quick)
    ]
    if not quick:
        out += [
            (f"{c.name}@{p}", lambda mesh, rt, c=c, p=p: parity.run_case(c, mesh=mesh, runtime=rt, perturb=p))
            for p, c in parity.perturbed_matrix()
        ]
    out.append(("state_dict-transformer", lambda mesh, rt: parity.state_dict_round_trip(mesh=mesh, runtime=rt)))
    if not quick:  # the check has teeth: poison-on-free must expose the motivating race
        baseline = parity.ParityCase(microbatches=3, policy="baseline")

        def expect_failure(mesh, rt):
            r = parity.run_case(baseline, mesh=mesh, runtime=rt, perturb=parity.TEETH)
            r.name, r.ok, r.detail = (
                f"{r.name} (must fail)",
                not r.ok,
                "baseline race " + ("caught" if not r.ok else "NOT caught"),
            )
            return r

        out.append((f"baseline@{parity.TEETH} (must fail)", expect_failure))
    return out


def main() -> int:
    args = parse_args()
    if dist.is_torchelastic_launched():
        local_rank = int(os.environ["LOCAL_RANK"])
    else:
        sys.exit("run me with torchrun --nproc-per-node N bench/gpu_parity.py")
    if args.cpu:
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(local_rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("gloo" if args.cpu else "nccl", timeout=datetime.timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = init_runtime("sim" if args.cpu else "cuda")
    rows = []
    try:
        for label, config in meshes(world).items():
            mesh = Mesh(config, runtime=rt)
            for name, run in cases(args.quick):
                start = time.perf_counter()
                try:
                    r = run(mesh, rt)
                except Exception:  # a crash on one rank usually hangs the other: show it first
                    traceback.print_exc()
                    rows.append((label, name, "ERROR", "", "", ""))
                    raise
                secs = time.perf_counter() - start
                rows.append(
                    (
                        label,
                        name,
                        "pass" if r.ok else "FAIL",
                        f"{r.param_error:.2e} ({r.worst_param})",
                        f"{r.loss_error:.2e}",
                        f"{r.rtol:g}  {secs:.1f}s {r.detail}".rstrip(),
                    )
                )
    finally:
        rt.synchronize()
        if rank == 0:
            table = render(rows, "CPU emulation" if args.cpu else torch.cuda.get_device_name(), world)
            print(table, flush=True)
            if args.out:
                path = args.out / "parity.md" if args.out.is_dir() or not args.out.suffix else args.out
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(table + "\n")
        shutdown_runtime()
        dist.destroy_process_group()
    return 0 if all(row[2] in ("pass", "SKIP") for row in rows) else 1


def render(rows, device: str, world: int) -> str:
    failed = sum(row[2] not in ("pass", "SKIP") for row in rows)
    lines = [
        f"# racecheck.fsdp GPU parity: {world} x {device}, torch {torch.__version__}",
        "",
        f"{len(rows) - failed} of {len(rows)} passed.",
        "",
        "| mesh | case | result | worst update error (param) | loss error | tolerance, time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
