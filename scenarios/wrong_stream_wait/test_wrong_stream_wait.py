"""Waiting on the wrong stream before consuming a collective's output.

Gradient buckets are averaged over the world by an all-reduce on its own stream, and the optimizer
step on the default stream consumes them. The consumer must wait for the stream (or an event on
the stream) that ran the collective. The race arms wait on another communication stream, which
is idle, or on an event recorded before the collective was enqueued, so the update reads the
gradient before (or while) it is reduced: each rank applies its local gradient instead of the
average. The tests compare the updated parameters with the update computed without streams.
"""

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from racecheck.device import Event, ReduceOp
from racecheck.scenario_kit.harness import check_values

NUMEL = 2048
BUCKETS = 4
LR = 0.1


class Reduced(NamedTuple):
    """An all-reduced gradient travelling to its consumer with the event that marks it ready."""

    grad: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def comm(world):
    """The communication streams (created once, as FSDP does) and the world's communicator."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # all_reduce: averages gradients, overlapping the backward of earlier buckets.
    # reduce_scatter: another communication stream of the same engine, idle here; the race arm
    # waits on it by mistake.
    return {
        "all_reduce": world.new_stream("all_reduce"),
        "reduce_scatter": world.new_stream("reduce_scatter"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def local_grad(step: int, bucket: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + bucket * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


def initial_param(bucket: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, NUMEL) * (bucket + 1)


@pytest.mark.parametrize("steps", [1, 2])
def test_updates_use_reduced_gradients(steps, runtime, comm, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "event"
    rt, ar, group = runtime, comm["all_reduce"], comm["group"]
    default = rt.default_stream()
    params, expected = [], {}
    with rt.stream(default):
        for b in range(BUCKETS):
            p = rt.empty(NUMEL)
            rt.launch("init_param", lambda out, v: out.copy_(v), reads=(initial_param(b).to(rt.device),), writes=(p,))
            params.append(p)
            expected[f"bucket{b}"] = initial_param(b)
    for step in range(steps):
        for b in range(BUCKETS):
            grad_value = local_grad(step, b, comm["rank"], racecheck_seed).to(rt.device)
            mean = sum(local_grad(step, b, r, racecheck_seed) for r in range(comm["size"])) / comm["size"]
            expected[f"bucket{b}"] = expected[f"bucket{b}"] - LR * mean
            with rt.stream(default):
                grad = rt.empty(NUMEL)
                rt.launch("backward_bucket", lambda out, v: out.copy_(v), reads=(grad_value,), writes=(grad,))
            # Producer: the default stream wrote grad; consumer: the all-reduce stream.
            ar.wait_stream(default)
            with rt.stream(ar):
                early = rt.new_event()
                if arm == "record_before_collective":
                    early.record()  # bug: marks the stream before the collective is enqueued
                rt.point("before_all_reduce", bucket=b)
                rt.all_reduce(grad, group=group, op=ReduceOp.AVG)
                rt.point("after_all_reduce", bucket=b)
                ready = rt.new_event()
                ready.record()
            reduced = Reduced(grad, early if arm == "record_before_collective" else ready)
            # Producer: the all-reduce stream; consumer: the optimizer step on the default stream.
            if arm == "wrong_stream":
                default.wait_stream(comm["reduce_scatter"])  # bug: not the stream that reduced it
            elif arm == "right_stream":
                default.wait_stream(ar)
            else:
                default.wait_event(reduced.event)
            with rt.stream(default):
                rt.launch("sgd_step", lambda p, g: p.sub_(g, alpha=LR), reads=(reduced.grad,), writes=(params[b],))
            # The gradient was allocated on the default stream and its last reader is ordered
            # there (or, in the race arms, already raced): dropping it is not this scenario's bug.
            default.wait_stream(ar)
            del grad, reduced
    rt.synchronize()
    check_values({f"bucket{b}": p for b, p in enumerate(params)}, expected, rtol=1e-5, what="parameter")
