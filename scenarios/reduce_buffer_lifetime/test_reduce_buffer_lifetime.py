"""ZeRO-2's overlap-comm buffers: used on the reduction stream, freed on the host, reused at once.

`allreduce_and_copy` flattens a small bucket of gradients into one buffer, all-reduces it on the
reduction stream and copies the result out through a second buffer into the gradients. Both
buffers come from the caching allocator on the current (default) stream. The `baseline` arm drops
them once the reduction work is enqueued: their blocks go straight back to the default stream's
pool, the next bucket's buffers are cut from them and written before the reduction stream has read
the previous bucket, so gradients come out of the wrong bucket. The tests compare the reduced
gradients with the averages computed without streams.
"""

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from racecheck.device import Event, ReduceOp
from racecheck.scenario_kit.harness import check_values

NUMEL = 1024  # per gradient
PARAMS_PER_BUCKET = 4
BUCKETS = 3  # per step


class HeldBuffers(NamedTuple):
    """Buffers that must outlive their last use on the reduction stream, with the event after it."""

    flat: torch.Tensor
    synced: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def zero2(world):
    """ZeRO-2's reduction stream (created once) and the world's communicator."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # reduction: all-reduces buckets and copies them out, overlapping the rest of the backward.
    return {
        "reduction": world.new_stream("reduction"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def local_grad(step: int, param: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + param * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


def copy_into(out: torch.Tensor, *parts: torch.Tensor) -> None:
    torch.cat(parts, out=out)


def backward_grads(rt, step: int, bucket: int, rank: int, size: int, *, seed: int, reduced: dict, expected: dict):
    """The bucket's gradients as the backward writes them on the current stream, each persistent
    until the optimizer step; `reduced` gets each buffer by name, `expected` its average over ranks."""
    grads = []
    for p in range(bucket * PARAMS_PER_BUCKET, (bucket + 1) * PARAMS_PER_BUCKET):
        g = rt.empty(NUMEL)
        value = local_grad(step, p, rank, seed=seed).to(rt.device)
        rt.launch("backward_grad", lambda out, v: out.copy_(v), reads=(value,), writes=(g,))
        grads.append(g)
        name = f"step{step}.param{p}"
        expected[name] = sum(local_grad(step, p, r, seed=seed) for r in range(size)) / size
        reduced[name] = g
    return grads


@pytest.mark.parametrize("steps", [1, 3])
def test_reduced_gradients_match(steps, runtime, zero2, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "record_stream"
    rt, reduction, group, rank, size = runtime, zero2["reduction"], zero2["group"], zero2["rank"], zero2["size"]
    default = rt.default_stream()
    reduced, expected = {}, {}
    held: list[HeldBuffers] = []
    for step in range(steps):
        for b in range(BUCKETS):
            with rt.stream(default):
                grads = backward_grads(rt, step, b, rank, size, seed=racecheck_seed, reduced=reduced, expected=expected)
                # hold_until_wait: buffers whose last use the default stream has waited for can go now.
                for h in held:
                    default.wait_event(h.event)  # producer: the reduction stream's last use; consumer: reuse here
                held.clear()
                # The all-reduce buffer (flatten) and the copy buffer (unflatten), cut from the
                # caching allocator on the current stream.
                flat = rt.empty(PARAMS_PER_BUCKET * NUMEL)
                synced = rt.empty(PARAMS_PER_BUCKET * NUMEL)
                rt.launch("flatten", copy_into, reads=tuple(grads), writes=(flat,))
            # Producer: the default stream wrote the gradients and flat; consumer: the reduction stream.
            reduction.wait_stream(default)
            with rt.stream(reduction):
                rt.point("before_all_reduce", bucket=b)
                rt.all_reduce(flat, group=group, op=ReduceOp.AVG)
                rt.point("after_all_reduce", bucket=b)
                rt.launch("unflatten", lambda out, src: out.copy_(src), reads=(flat,), writes=(synced,))
                for slot, g in enumerate(grads):
                    rt.launch(
                        "copy_back",
                        lambda out, src: out.copy_(src),
                        reads=(synced[slot * NUMEL : (slot + 1) * NUMEL],),
                        writes=(g,),
                    )
                if arm == "record_stream":
                    # The fix: the reduction stream is recorded on both buffers before they go.
                    rt.record_stream(flat, reduction)
                    rt.record_stream(synced, reduction)
                elif arm == "hold_until_wait":
                    event = rt.new_event()
                    event.record()
                    held.append(HeldBuffers(flat, synced, event))
            del flat, synced  # baseline: both blocks are back in the default pool, the reduction still queued
        # End of the backward: the optimizer (default stream) consumes the reduced gradients.
        default.wait_stream(reduction)  # producer: the reduction stream; consumer: the optimizer
        for h in held:
            default.wait_event(h.event)
        held.clear()
        rt.synchronize()
        check_values(
            {n: reduced[n] for n in expected if n.startswith(f"step{step}.")},
            {n: v for n, v in expected.items() if n.startswith(f"step{step}.")},
            rtol=1e-5,
            what=f"step {step} gradient",
        )
