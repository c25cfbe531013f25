"""Patch mode on a GPU: the motivating race in a plain-torch program, and PyTorch's own FSDP2.

    torchrun --nproc-per-node 2 bench/patch_mode_gpu.py --out DIR [--trials 10]

1. `plain`: the motivating pattern written with plain torch (no racecheck.fsdp, no racecheck
   runtime): four parameter groups of 16 MiB whose `main_grad` is allocated eagerly on the default
   stream (`baseline`) or lazily inside the reduce-scatter stream context (`fixed`); each group's
   reduce-scatter reads main_grad on the reduce-scatter stream, then main_grad is rebound to the
   sharded result. A trial is one backward over the four groups; it fails when any reduce-scatter
   output differs from the value computed without streams. Every arm runs with patch mode off
   (the natural rate) and on (`sleep@before_reduce_scatter` + `pressure@free`), over the world
   (NCCL, 2 ranks) and over a one-rank group per rank.
2. `fsdp2`: a training loop with torch.distributed.fsdp.fully_shard, as HSDP (2 replicas x 1 shard
   on 2 GPUs) and as FSDP over the world, under patch mode with delays before every collective and
   allocator pressure, compared with a single-GPU reference each trial. No failure is expected: patch mode
   must not make correct third-party code fail.
The code under test is unchanged by patch mode: it is installed around it (PatchMode).
Writes DIR/patch_mode.csv and DIR/patch_mode.md (rank 0).

Regenerates reports/gpu/patch_mode.{md,csv}.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import time
from pathlib import Path

# First launches of a lazily loaded kernel serialize the device and hide the race in a process's
# first iteration (measured on an H200, reports/gpu/README.md); load every module eagerly.
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from racecheck.perturb.patch import PatchMode  # noqa: E402
from racecheck.perturb.profiles import parse_profile  # noqa: E402

GROUPS = 4
GROUP_NUMEL = 4 * 1024 * 1024  # 16 MiB of fp32 per group
PLAIN_PERTURB = "sleep@before_reduce_scatter:2ms,pressure@free"
FSDP2_PERTURB = "sleep@before_all_gather:1ms,sleep@before_reduce_scatter:2ms,sleep@before_all_reduce:2ms,pressure@free"


# -- the code under test: plain torch, as in the motivating PR ------------------------------------
class PlainParamGroup:
    """A parameter group's gradient reduction as the motivating code wrote it."""

    def __init__(self, numel: int, *, rs_stream: torch.cuda.Stream, group, lazy: bool) -> None:
        self.numel = numel
        self.rs_stream = rs_stream
        self.group = group
        self.lazy = lazy
        # Eager (baseline): allocated here, on whatever stream the caller is on: the default one.
        self._main_grad = None if lazy else torch.zeros(numel, device="cuda")
        self.reduced: torch.Tensor | None = None

    @property
    def main_grad(self) -> torch.Tensor:
        if self._main_grad is None:  # lazy (fixed): allocated on the stream current at first use
            self._main_grad = torch.zeros(self.numel, device="cuda")
        return self._main_grad

    def reduce_partial_gradients(self, grad: torch.Tensor) -> None:
        # Producer: autograd wrote `grad` on the current (default) stream; consumer: the
        # accumulation and reduce-scatter on the rs stream.
        self.rs_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.rs_stream):
            # The gradient comes from autograd on the default stream and is dropped by the caller
            # right after this returns; like racecheck.fsdp, keep its block for the rs stream.
            grad.record_stream(self.rs_stream)
            self.main_grad.add_(grad)
            out = torch.empty(self.numel // dist.get_world_size(self.group), device="cuda")
            dist.reduce_scatter_tensor(out, self.main_grad, group=self.group)
            self._main_grad = None  # the rebinding `main_grad = B`: A loses its last reference
            self.reduced = out


def grad_value(group_index: int, rank: int, numel: int, device) -> torch.Tensor:
    base = torch.arange(numel, device=device, dtype=torch.float32).remainder_(997).mul_(1e-3)
    return base.add_(10.0 * group_index + rank)


def plain_trial(*, lazy: bool, group, rs_stream) -> float:
    """One backward over GROUPS groups; the worst relative error of a reduce-scatter output."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    groups = [PlainParamGroup(GROUP_NUMEL, rs_stream=rs_stream, group=group, lazy=lazy) for _ in range(GROUPS)]
    torch.cuda.synchronize()
    for g in reversed(range(GROUPS)):
        # Backward computes this group's gradient on the default stream: an allocation there.
        grad = grad_value(g, dist.get_rank(), GROUP_NUMEL, "cuda")
        groups[g].reduce_partial_gradients(grad)
        del grad
    torch.cuda.synchronize()
    shard = GROUP_NUMEL // size
    worst = 0.0
    for g in range(GROUPS):
        expected = sum(grad_value(g, r, GROUP_NUMEL, "cuda")[me * shard : (me + 1) * shard] for r in ranks)
        err = ((groups[g].reduced - expected).norm() / expected.norm()).item()
        worst = max(worst, err if err == err else float("inf"))
    return worst


def world_max(value: float) -> float:
    t = torch.tensor([value], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


class PatchStats:
    """What patch mode did over a run (rank 0's view): wrapped calls, delays, pressure allocations."""

    def __init__(self) -> None:
        self.calls = self.delayed = self.pressured = 0

    def add(self, patch: PatchMode | None) -> None:
        if patch is not None:
            self.calls += sum(patch.calls.values())
            self.delayed += patch.counts["sleep"]
            self.pressured += patch.counts["pressure"]

    def columns(self) -> dict:
        return {"wrapped_calls": self.calls, "delayed": self.delayed, "pressure_allocs": self.pressured}


@contextlib.contextmanager
def patched(perturb: str | None, seed: int, stats: PatchStats):
    """Patch mode with profile `perturb` (none when None) around one trial; its counts go to `stats`."""
    patch = PatchMode(parse_profile(perturb), seed=seed) if perturb else None
    if patch:
        patch.install()
    try:
        yield
    finally:
        if patch:
            patch.uninstall()
    stats.add(patch)


def run_plain(
    trials: int, *, lazy: bool, group, rs_stream, perturb: str | None, seed: int, stats: PatchStats
) -> tuple[int, float]:
    failures, worst = 0, 0.0
    for trial in range(trials):
        with patched(perturb, seed + trial, stats):
            err = plain_trial(lazy=lazy, group=group, rs_stream=rs_stream)
        err = world_max(err)
        worst = max(worst, err)
        failures += err > 1e-5
    return failures, worst


# -- FSDP2 (PyTorch's own fully_shard), HSDP on 2 GPUs ---------------------------------------------
def make_mlp(width: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods[:-1])


def fsdp2_layouts(world: int) -> list[tuple[str, tuple[int, ...]]]:
    """HSDP (2 replicas, the all-reduce axis first) where the world allows it, and plain FSDP over
    the whole world (on 2 GPUs the HSDP shard axis has one rank, so only FSDP exercises
    all-gather and reduce-scatter across GPUs)."""
    layouts = []
    if world >= 2 and world % 2 == 0:
        layouts.append((f"HSDP 2x{world // 2} (replicate x shard)", (2, world // 2)))
    layouts.append((f"FSDP {world}", (world,)))
    return layouts


def fsdp2_trial(trial: int, *, shape: tuple[int, ...], width=1024, layers=4, steps=3, batch=16) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world, rank = dist.get_world_size(), dist.get_rank()
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh("cuda", shape, mesh_dim_names=names)
    reference = make_mlp(width, layers).cuda()
    model = make_mlp(width, layers).cuda()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    initial = [p.detach().clone() for p in reference.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    gen = torch.Generator(device="cuda").manual_seed(1000 + trial)
    for _ in range(steps):
        x = torch.randn(batch * world, width, device="cuda", generator=gen)
        y = torch.randn(batch * world, width, device="cuda", generator=gen)
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(model(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        opt.step()
    torch.cuda.synchronize()
    worst = 0.0
    for p, r, p0 in zip(model.parameters(), reference.parameters(), initial, strict=True):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        # Relative error of the update (final - initial), so a wrong gradient cannot hide under
        # the size of the parameter itself.
        err = ((full - r).norm() / (r - p0).norm().clamp_min(1e-30)).item()
        worst = max(worst, err if err == err else float("inf"))
    return worst


def run_fsdp2(
    trials: int, *, shape: tuple[int, ...], perturb: str | None, seed: int, stats: PatchStats
) -> tuple[int, float]:
    failures, worst = 0, 0.0
    for trial in range(trials):
        with patched(perturb, seed + trial, stats):
            err = world_max(fsdp2_trial(trial, shape=shape))
        worst = max(worst, err)
        failures += err > 1e-3
    return failures, worst


# -- driver ------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", default="plain,fsdp2")
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    parts = set(args.parts.split(","))
    if "plain" in parts:
        # Every rank creates every one-rank group, in the same order.
        singles = [dist.new_group([r]) for r in range(world)]
        rs_stream = torch.cuda.Stream()
        layouts = [("world", dist.group.WORLD)] if world > 1 else []
        layouts.append(("one-rank group", singles[rank]))
        for layout, group in layouts:
            plain_trial(lazy=True, group=group, rs_stream=rs_stream)  # warm-up: not counted
            for arm, lazy in (("baseline", False), ("fixed", True)):
                for perturb in (None, PLAIN_PERTURB):
                    started, stats = time.monotonic(), PatchStats()
                    failures, worst = run_plain(
                        args.trials,
                        lazy=lazy,
                        group=group,
                        rs_stream=rs_stream,
                        perturb=perturb,
                        seed=args.seed,
                        stats=stats,
                    )
                    rows.append(
                        {
                            "program": "plain-torch motivating race",
                            "arm": arm,
                            "expect": "race" if arm == "baseline" else "safe",
                            "group": f"{layout} ({dist.get_world_size(group)} rank"
                            f"{'s' if dist.get_world_size(group) > 1 else ''})",
                            "perturb": perturb or "off (natural)",
                            "trials": args.trials,
                            "failures": failures,
                            "worst_error": f"{worst:.2e}",
                            **stats.columns(),
                            "seconds": round(time.monotonic() - started, 1),
                        }
                    )
                    if rank == 0:
                        print(rows[-1], flush=True)
    if "fsdp2" in parts:
        for layout, shape in fsdp2_layouts(world):
            fsdp2_trial(-1, shape=shape)  # warm-up: not counted
            for perturb in (None, FSDP2_PERTURB):
                started, stats = time.monotonic(), PatchStats()
                failures, worst = run_fsdp2(args.trials, shape=shape, perturb=perturb, seed=args.seed, stats=stats)
                rows.append(
                    {
                        "program": "torch FSDP2 training loop",
                        "arm": "fully_shard",
                        "expect": "safe",
                        "group": layout,
                        "perturb": perturb or "off (natural)",
                        "trials": args.trials,
                        "failures": failures,
                        "worst_error": f"{worst:.2e}",
                        **stats.columns(),
                        "seconds": round(time.monotonic() - started, 1),
                    }
                )
                if rank == 0:
                    print(rows[-1], flush=True)
    if rank == 0:
        write_tables(args.out, rows, world=world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def write_tables(out: Path, rows: list[dict], *, world: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = [
        "program",
        "arm",
        "expect",
        "group",
        "perturb",
        "trials",
        "failures",
        "worst_error",
        "wrapped_calls",
        "delayed",
        "pressure_allocs",
        "seconds",
    ]
    with open(out / "patch_mode.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"# Patch mode on {torch.cuda.get_device_name()} x {world}",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; command: "
        f"`torchrun --nproc-per-node {world} bench/patch_mode_gpu.py --out DIR`",
        "",
        "Failures are trials (of `trials`) with a wrong result on any rank; wrapped calls, delays and",
        "pressure allocations are rank 0's, summed over the trials (0 with patch mode off).",
        "",
        "| program | arm | expect | group | perturb | failures | worst error | wrapped calls | delayed "
        "| pressure allocs | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['arm']} | {r['expect']} | {r['group']} | `{r['perturb']}` | "
            f"{r['failures']}/{r['trials']} | {r['worst_error']} | {r['wrapped_calls']} | "
            f"{r['delayed']} | {r['pressure_allocs']} | {r['seconds']} |"
        )
    (out / "patch_mode.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
