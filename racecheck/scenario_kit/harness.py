"""Building blocks for scenario suites: the process world and its runtime, and the numerical
comparison against a single-process reference that decides pass or fail (the perturbation and the
detector around each test are the per-test harness's, racecheck.rank.harness).

A scenario's tests fail only because numbers differ; the message names the worst parameter and its
relative error, and every rank reaches the same verdict (errors are max-reduced over the world).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
from torch import nn

from racecheck.device import Runtime, init_runtime, resolve_backend
from racecheck.fsdp.mesh import MeshConfig


class WorldError(RuntimeError):
    """The test process was not started with the world the scenario needs."""


def init_world(world_size: int) -> Runtime:
    """Join the process world that torchrun (or racecheck run) started and create the runtime."""
    have = int(os.environ.get("WORLD_SIZE", "1"))
    if have != world_size:
        raise WorldError(
            f"this suite needs {world_size} ranks, the process has {have}: run it with "
            f"`racecheck run` or `torchrun --nproc-per-node {world_size} -m pytest ...`"
        )
    backend = resolve_backend("auto")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    if not dist.is_initialized():
        if backend == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        name = "nccl" if backend == "cuda" else "gloo"
        if world_size > 1:
            dist.init_process_group(name)  # rendezvous from torchrun's environment
        else:
            # One process and no launcher: a one-rank group, so collective code runs unchanged
            # (on CUDA a one-rank NCCL collective is still a kernel on its stream).
            dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
    return init_runtime(backend)


def hsdp_mesh_config(world_size: int) -> MeshConfig:
    """The HSDP mesh for a world: MeshConfig.for_world, or the mesh `racecheck run --mesh` passes
    as RACECHECK_MESH_SHARD and RACECHECK_MESH_REPLICATE (MeshConfig.from_env)."""
    return MeshConfig.from_env(world_size)


@dataclasses.dataclass
class ParamError:
    name: str
    rel_error: float  # relative L2 error of the parameter's update, max over replicas


def full_parameters(model: nn.Module, *, world: int) -> list[dict[str, torch.Tensor]]:
    """Each replica's full parameters, rebuilt from every rank's flat shards (collective)."""
    replicas: list[dict[str, torch.Tensor]] = []
    groups = model.param_groups()
    gathered = []
    for g in groups:
        shard = g.flat_param_shard.detach().clone()
        out = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)
        if world > 1:
            dist.all_gather_into_tensor(out, shard)
        else:
            out.copy_(shard)
        gathered.append(out.view(world, -1))
    module_names = {id(m): n for n, m in model.named_modules()}
    shard_count = groups[0].mesh.config.shard
    for r in range(world // shard_count):
        params = {}
        for g, out in zip(groups, gathered, strict=True):
            flat = out[r * shard_count : (r + 1) * shard_count].reshape(-1)
            for info in g.infos:
                owner = module_names[id(info.module)]
                params[f"{owner}.{info.attr}" if owner else info.attr] = flat.cpu()[
                    info.offset : info.offset + info.numel
                ].view(info.shape)
        replicas.append(params)
    return replicas


def update_errors(
    initial: dict[str, torch.Tensor], replicas: list[dict[str, torch.Tensor]], reference: dict[str, torch.Tensor]
) -> list[ParamError]:
    """Relative error of each parameter's update (final - initial) against the reference's,
    worst over replicas and over ranks (so every rank reaches the same verdict)."""
    names = sorted(reference)
    reference = {n: t.detach().cpu() for n, t in reference.items()}
    initial = {n: t.detach().cpu() for n, t in initial.items()}
    errs = torch.zeros(len(names), dtype=torch.float64)
    for i, name in enumerate(names):
        ref_update = (reference[name] - initial[name]).double()
        per_replica = [
            ((params[name] - reference[name]).double().norm() / ref_update.norm().clamp_min(1e-30))
            for params in replicas
        ]
        errs[i] = torch.stack(per_replica).max()  # torch's max keeps a NaN (Python's max drops it)
    return [ParamError(n, float(e)) for n, e in zip(names, max_over_ranks(errs), strict=True)]


def max_over_ranks(errs: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of `errs` (a CPU float64 tensor) over every rank, so all ranks agree. A NaN
    becomes +inf first: a MAX reduction may drop a NaN of another rank (gloo's does)."""
    if not dist.is_initialized():
        return errs
    # NCCL reduces device tensors only; gloo takes either.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    errs = torch.nan_to_num(errs, nan=float("inf"), posinf=float("inf")).to(device)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX)
    return errs.cpu()


def check_parity(*, losses: list[float], ref_losses: list[float], errors: list[ParamError], rtol: float) -> None:
    """Fail with the worst parameter's relative error when the numbers differ beyond `rtol`."""
    bad = [e for e in errors if not e.rel_error <= rtol]  # NaN counts as bad
    loss_bad = [
        i
        for i, (a, b) in enumerate(zip(losses, ref_losses, strict=True))
        if not abs(a - b) <= rtol * max(abs(b), 1e-12)
    ]
    if not bad and not loss_bad:
        return
    worst = max(errors, key=lambda e: (e.rel_error != e.rel_error, e.rel_error))
    raise AssertionError(
        f"parameter {worst.name!r} update off by {worst.rel_error:.1%} (relative L2 error, "
        f"tolerance {rtol:g}); {len(bad)} of {len(errors)} parameters off; "
        f"losses {[f'{x:.6f}' for x in losses]} vs reference {[f'{x:.6f}' for x in ref_losses]}"
    )


def check_values(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, rtol: float, what: str = "value"
) -> None:
    """Fail naming the worst tensor and its relative L2 error when any of `actual` differs from
    `expected` beyond `rtol` (NaN counts as off); the worst over ranks, so every rank agrees."""
    names = sorted(expected)
    errs = torch.zeros(len(names), dtype=torch.float64)
    for i, name in enumerate(names):
        want = expected[name].detach().cpu().double()
        got = actual[name].detach().cpu().double()
        errs[i] = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    errs = max_over_ranks(errs)
    bad = [n for n, e in zip(names, errs.tolist(), strict=True) if not e <= rtol]
    if not bad:
        return
    worst, err = max(zip(names, errs.tolist(), strict=True), key=lambda p: (p[1] != p[1], p[1]))
    raise AssertionError(
        f"{what} {worst!r} off by {err:.1%} (relative L2 error, tolerance {rtol:g}); "
        f"{len(bad)} of {len(names)} {what}s off: {', '.join(bad[:8])}"
    )
