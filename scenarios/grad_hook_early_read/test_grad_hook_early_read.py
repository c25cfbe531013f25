"""FSDP2 with CPU offload: a post-accumulate-grad hook reads the pinned gradient too early.

`foreach_reduce` reduce-scatters each gradient and copies the shard to pinned host memory with a
non-blocking copy on the post-reduce stream; the host waits on the offload event only in
`finalize_backward`. A `post_accumulate_grad_hook` registered on the parameter (optimizer in
backward: `p.add_(p.grad, alpha=-lr)`) runs inside `foreach_reduce`, right after the copy is
enqueued, so it reads the pinned buffer before the copy has landed: the update uses stale bytes.
This is a host-versus-stream race: no stream misses a wait, the host does. The tests compare the
CPU parameters after the in-backward updates with the updates computed without streams.
"""

import pytest
import torch
import torch.distributed as dist

from racecheck.device import ReduceOp
from racecheck.scenario_kit.harness import check_values

NUMEL = 4096  # per unsharded gradient; divisible by every world size the catalogue runs at
PARAMS = 6
LR = 0.1


@pytest.fixture(scope="module")
def fsdp(world):
    """FSDP2's reduce-scatter stream (the post-reduce stream without HSDP) and the communicator."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # reduce_scatter: reduce-scatters gradients and copies the shards to the host, overlapping
    # the rest of the backward.
    return {
        "rs": world.new_stream("reduce_scatter"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def local_grad(step: int, param: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + param * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


def initial_shard(param: int, rank: int, chunk: int) -> torch.Tensor:
    full = torch.linspace(-1.0, 1.0, NUMEL) * (param + 1)
    return full[rank * chunk : (rank + 1) * chunk].clone()


def sgd_hook(param: torch.Tensor, grad: torch.Tensor) -> None:
    """The optimizer in backward, as PyTorch documents it: `p.add_(p.grad, alpha=-lr)` on the host."""
    param.add_(grad, alpha=-LR)


@pytest.mark.parametrize("steps", [1, 2])
def test_in_backward_updates_match(steps, runtime, fsdp, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "sync_before_hook"
    rt, rs, group, rank, size = runtime, fsdp["rs"], fsdp["group"], fsdp["rank"], fsdp["size"]
    chunk = NUMEL // size
    default = rt.default_stream()
    # The sharded parameters live on the CPU (CPUOffloadPolicy); the CPU optimizer updates them.
    params = [initial_shard(p, rank, chunk) for p in range(PARAMS)]
    expected = {f"param{p}": initial_shard(p, rank, chunk) for p in range(PARAMS)}
    for step in range(steps):
        pending = []  # (param index, pinned gradient, offload event) for finalize_backward
        for p in range(PARAMS):
            mean = sum(local_grad(step, p, r, seed=racecheck_seed) for r in range(size)) / size
            expected[f"param{p}"] -= LR * mean[rank * chunk : (rank + 1) * chunk]
            value = local_grad(step, p, rank, seed=racecheck_seed).to(rt.device)
            with rt.stream(default):
                grad = rt.empty(NUMEL)  # the unsharded gradient, from the backward
                rt.launch("backward_param", lambda out, v: out.copy_(v), reads=(value,), writes=(grad,))
            rs.wait_stream(default)  # producer: the backward wrote grad; consumer: the reduce-scatter
            host = rt.pinned_empty(chunk)  # the offloaded gradient: pinned CPU memory
            with rt.stream(rs):
                shard = rt.empty(chunk)
                rt.reduce_scatter(shard, grad, group=group, op=ReduceOp.AVG)
                rt.point("before_copy", param=p)
                rt.launch(
                    "offload_copy", lambda out, src: out.copy_(src, non_blocking=True), reads=(shard,), writes=(host,)
                )
                rt.point("after_copy", param=p)
                offload = rt.new_event()
                offload.record()  # grad_offload_event: marks the copy's completion for the host
            rt.record_stream(grad, rs)  # the device buffers' lifetimes are not this scenario's bug
            del grad, shard
            # The post-accumulate-grad hook fires here, inside foreach_reduce's per-parameter loop.
            if arm == "early_hook":
                sgd_hook(params[p], host)  # bug: the copy may still be queued
            elif arm == "sync_before_hook":
                offload.synchronize()  # the fix: the host waits for the copy, then runs the hook
                sgd_hook(params[p], host)
            pending.append((p, host, offload))
        # finalize_backward: the host waits for every offload copy.
        for p, host, offload in pending:
            offload.synchronize()
            if arm == "hook_after_backward":
                sgd_hook(params[p], host)
    check_values({f"param{p}": t for p, t in enumerate(params)}, expected, rtol=1e-5, what="parameter")
