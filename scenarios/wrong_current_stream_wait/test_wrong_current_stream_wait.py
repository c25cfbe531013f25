"""ZeRO-3's gradient hook waits on the default stream, not the stream that produced the gradient.

PyTorch's autograd engine runs each backward op on the stream its forward op ran on; in ZeRO-3
that is a side stream (the forward ran where the all-gathered parameters were). The gradient hook
(`__add_grad_to_ipg_bucket`) makes the reduce-and-partition stream wait for the *default* stream
before copying the gradient into the bucket, so the copy and the reduce-scatter can read the
gradient before the backward kernel wrote it. The tests compare every reduced partition with the
average computed without streams.
"""

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from racecheck.device import Event, ReduceOp
from racecheck.scenario_kit.harness import check_values

NUMEL = 4096  # per gradient; divisible by every world size the catalogue runs at
PARAMS = 6


class Produced(NamedTuple):
    """A gradient on its way to the reduce stream, with the event recorded after it was written."""

    grad: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def zero3(world):
    """ZeRO-3's streams (created once) and the world's communicator."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # backward: the stream the forward ran on, which autograd runs the backward ops on (and which is
    # current while their hooks run). reduce_and_partition: copies gradients into the bucket and
    # reduce-scatters it, overlapping the rest of the backward.
    return {
        "backward": world.new_stream("backward"),
        "reduce": world.new_stream("reduce_and_partition"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def local_grad(step: int, param: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + param * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


@pytest.mark.parametrize("steps", [1, 2])
def test_partitions_match(steps, runtime, zero3, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "current_stream"
    rt, backward, reduce, group = runtime, zero3["backward"], zero3["reduce"], zero3["group"]
    rank, size = zero3["rank"], zero3["size"]
    chunk = NUMEL // size
    partitions, expected = {}, {}
    inputs = []  # the backward's inputs, kept to the end: its stream reads them after the host moved on
    for step in range(steps):
        for p in range(PARAMS):
            value = local_grad(step, p, rank, seed=racecheck_seed).to(rt.device)
            inputs.append(value)
            name = f"step{step}.param{p}"
            mean = sum(local_grad(step, p, r, seed=racecheck_seed) for r in range(size)) / size
            expected[name] = mean[rank * chunk : (rank + 1) * chunk]
            with rt.stream(backward):
                # Producer: the default stream copied `value` to the device; consumer: the backward
                # op below, on the backward stream (autograd orders a backward op after its inputs).
                backward.wait_stream(rt.default_stream())
                rt.point("before_grad", param=p)
                grad = rt.empty(NUMEL)  # autograd allocates the gradient on the backward op's stream
                rt.launch("backward_op", lambda out, v: out.copy_(v), reads=(value,), writes=(grad,))
                produced = Produced(grad, rt.new_event())
                produced.event.record()
                # The post-backward hook runs here, with the backward op's stream current.
                # Producer: the backward stream wrote grad; consumer: the reduce stream.
                if arm == "default_stream":
                    reduce.wait_stream(rt.default_stream())  # bug: the default stream did not write it
                elif arm == "current_stream":
                    reduce.wait_stream(rt.current_stream())
                else:
                    reduce.wait_event(produced.event)
            with rt.stream(reduce):
                bucket = rt.empty(NUMEL)  # the IPG bucket slot, on the reduce stream
                rt.launch("copy_to_bucket", lambda out, g: out.copy_(g), reads=(produced.grad,), writes=(bucket,))
                part = rt.empty(chunk)
                rt.reduce_scatter(part, bucket, group=group, op=ReduceOp.AVG)
            partitions[name] = part
            # The gradient's lifetime is safe in every arm (the reduce stream is recorded on it):
            # only the producer wait is under test.
            rt.record_stream(grad, reduce)
            del grad, produced, bucket, part
    rt.synchronize()
    check_values(partitions, expected, rtol=1e-5, what="gradient partition")
