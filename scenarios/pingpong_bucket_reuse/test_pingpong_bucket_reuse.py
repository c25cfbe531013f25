"""ZeRO-2's ping-pong gradient buckets: the buffer index is reset, so a bucket in flight is refilled.

With `overlap_comm` and `contiguous_gradients`, ZeRO 1/2 copies gradients into one of two bucket
buffers on the current stream while the reduction stream all-reduces the other one and copies the
result into the gradient partitions. At the start of each reduction the current stream waits for
the reduction stream's earlier work, so a buffer is safe to refill two buckets later, once the
index has flipped twice. The `reset_index` arm resets the index to 0 after every reduction (as a
`bucket.clear()` did): the next bucket is copied into the buffer whose reduction is still queued,
and the partitions receive the next bucket's gradients. The tests compare the partitions with the
averages computed without streams.
"""

import pytest
import torch
import torch.distributed as dist

from racecheck.device import ReduceOp
from racecheck.scenario_kit.harness import check_values

NUMEL = 1024  # per gradient
PARAMS_PER_BUCKET = 2
BUCKETS = 4  # per step: more than the two buffers, so each is reused


@pytest.fixture(scope="module")
def zero2(world):
    """ZeRO-2's reduction stream (created once) and the world's communicator."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # reduction: all-reduces a full bucket and copies it out, overlapping the rest of the backward.
    return {
        "reduction": world.new_stream("reduction"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def local_grad(step: int, param: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 10_000 + step * 1000 + param * 10 + rank)
    return torch.randn(NUMEL, generator=gen)


@pytest.mark.parametrize("steps", [1, 2])
def test_partitions_match(steps, runtime, zero2, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "flip"
    rt, reduction, group, rank, size = runtime, zero2["reduction"], zero2["group"], zero2["rank"], zero2["size"]
    default = rt.default_stream()
    with rt.stream(default):
        # The two IPG buffers, allocated once at the start of the backward (engine.backward).
        buffers = [rt.empty(PARAMS_PER_BUCKET * NUMEL) for _ in range(2)]
    index = 0
    partitions, expected = {}, {}
    for step in range(steps):
        for b in range(BUCKETS):
            params = range(b * PARAMS_PER_BUCKET, (b + 1) * PARAMS_PER_BUCKET)
            if arm == "sync":
                # The earlier fix: wait for the reduction before a buffer is refilled.
                default.wait_stream(reduction)  # producer: the reduction read the buffer; consumer: the refill
            buf = buffers[index]
            with rt.stream(default):
                # reduce_independent_p_g_buckets_and_remove_grads: each gradient is copied into the
                # bucket on the current stream as its backward finishes.
                for slot, p in enumerate(params):
                    value = local_grad(step, p, rank, seed=racecheck_seed).to(rt.device)
                    rt.launch(
                        "copy_to_bucket",
                        lambda out, v: out.copy_(v),
                        reads=(value,),
                        writes=(buf[slot * NUMEL : (slot + 1) * NUMEL],),
                    )
                    name = f"step{step}.param{p}"
                    expected[name] = sum(local_grad(step, p, r, seed=racecheck_seed) for r in range(size)) / size
            # average_tensor: producer: the default stream filled buf; consumer: the reduction stream.
            reduction.wait_stream(default)
            # ... and the current stream waits for the reduction's earlier buckets (DeepSpeed's reverse
            # dependency): the buffer of the bucket before is free once this bucket's turn comes.
            default.wait_stream(reduction)
            with rt.stream(reduction):
                rt.point("before_all_reduce", bucket=b)
                rt.all_reduce(buf, group=group, op=ReduceOp.AVG)
                rt.point("after_all_reduce", bucket=b)
                for slot, p in enumerate(params):
                    part = rt.empty(NUMEL)  # the gradient partition, on the reduction stream
                    rt.launch(
                        "copy_out",
                        lambda out, src: out.copy_(src),
                        reads=(buf[slot * NUMEL : (slot + 1) * NUMEL],),
                        writes=(part,),
                    )
                    partitions[f"step{step}.param{p}"] = part
            # reduce_ipg_grads ends with bucket.clear()
            index = 0 if arm in ("reset_index", "sync") else 1 - index
    rt.synchronize()
    check_values(partitions, expected, rtol=1e-5, what="gradient partition")
