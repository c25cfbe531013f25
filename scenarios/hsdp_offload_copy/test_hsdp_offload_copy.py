"""HSDP with CPU offload: the gradient's device-to-host copy runs on the all-reduce stream.

FSDP2's `foreach_reduce` allocates the reduce-scatter output on the reduce-scatter stream; under
HSDP the all-reduce over replicas and the non-blocking copy of the result into pinned host memory
run on the all-reduce stream (the post-reduce stream). The block's allocation stream is the
reduce-scatter stream, so when the last reference to the output dies on the host, right after the
copy is enqueued, the block goes back to that stream's pool; the next group's reduce-scatter output
is cut from it and written before the all-reduce stream's copy has read it. The host receives the
next group's gradient. The tests compare every offloaded gradient shard with the average computed
without streams.
"""

from typing import NamedTuple

import pytest
import torch

from racecheck.device import Event, ReduceOp
from racecheck.fsdp.mesh import Mesh
from racecheck.scenario_kit.harness import check_values, hsdp_mesh_config

NUMEL = 4096  # per unsharded gradient; divisible by every shard count the catalogue runs at
GROUPS = 6  # parameter groups reduced one after another in the backward


class Keepalive(NamedTuple):
    """The reduce-scatter output that an offload copy still reads, with the post-reduce event."""

    tensor: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def hsdp(world):
    """The HSDP mesh and FSDP2's two reduction streams (created once)."""
    mesh = Mesh(hsdp_mesh_config(int(torch.distributed.get_world_size())), runtime=world)
    # reduce_scatter: reduce-scatters gradients over the shard axis, overlapping the backward.
    # all_reduce: all-reduces the shards over replicas and copies them to the host (post-reduce).
    return {"mesh": mesh, "rs": world.new_stream("reduce_scatter"), "ar": world.new_stream("all_reduce")}


def local_grad(step: int, group: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + group * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


@pytest.mark.parametrize("steps", [1, 2])
def test_offloaded_gradients_match(steps, runtime, hsdp, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "keepalive"
    rt, mesh, rs, ar = runtime, hsdp["mesh"], hsdp["rs"], hsdp["ar"]
    shard = mesh.config.shard
    world = mesh.config.world_size
    chunk = NUMEL // shard
    default = rt.default_stream()
    offloaded, expected, events = {}, {}, []
    previous: Keepalive | None = None
    for step in range(steps):
        for g in range(GROUPS):
            name = f"step{step}.group{g}"
            mean = sum(local_grad(step, g, r, seed=racecheck_seed) for r in range(world)) / world
            expected[name] = mean[mesh.shard_index * chunk : (mesh.shard_index + 1) * chunk]
            value = local_grad(step, g, mesh.rank, seed=racecheck_seed).to(rt.device)
            with rt.stream(default):
                grad = rt.empty(NUMEL)  # the unsharded gradient, from the backward
                rt.launch("backward_group", lambda out, v: out.copy_(v), reads=(value,), writes=(grad,))
            rs.wait_stream(default)  # producer: the backward wrote grad; consumer: the reduce-scatter
            with rt.stream(rs):
                if previous is not None:
                    # keepalive: the predecessor's copy is done before its block can be cut again.
                    rs.wait_event(previous.event)  # producer: the all-reduce stream's copy
                    previous = None
                reduce_output = rt.empty(chunk)  # allocated on the reduce-scatter stream
                rt.reduce_scatter(reduce_output, grad, group=mesh.shard_group, op=ReduceOp.AVG)
            rt.record_stream(grad, rs)  # the unsharded gradient's lifetime is not this scenario's bug
            del grad
            ar.wait_stream(rs)  # producer: the reduce-scatter; consumer: the all-reduce and the copy
            host = rt.pinned_empty(chunk)  # the offloaded gradient: pinned CPU memory
            with rt.stream(ar):
                rt.all_reduce(reduce_output, group=mesh.replicate_group, op=ReduceOp.AVG)
                rt.point("before_copy", group=g)
                rt.launch(
                    "offload_copy",
                    lambda out, src: out.copy_(src, non_blocking=True),
                    reads=(reduce_output,),
                    writes=(host,),
                )
                rt.point("after_copy", group=g)
                post_reduce = rt.new_event()
                post_reduce.record()  # grad_offload_event: the host waits on it before the optimizer
            events.append(post_reduce)
            offloaded[name] = host
            if arm == "keepalive":
                previous = Keepalive(reduce_output, post_reduce)
            elif arm == "record_stream":
                rt.record_stream(reduce_output, ar)
            # param.grad now points at the host copy: the device output loses its last reference
            # (baseline: back in the reduce-scatter stream's pool while the copy is queued).
            del reduce_output
        # finalize_backward: the host waits for every offload copy before the CPU optimizer runs.
        for ev in events:
            ev.synchronize()
        events.clear()
        previous = None
    check_values(offloaded, expected, rtol=1e-5, what="offloaded gradient shard")
