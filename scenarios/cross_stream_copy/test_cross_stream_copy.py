"""The offload-copy race: a buffer allocated on stream X (default), copied out on stream Y, freed.

Each step of a backward produces a gradient bucket on the default stream and offloads it to host
memory on a copy stream, as ZeRO-Offload-style optimizers do. The `baseline` arm drops the device
buffer as soon as the copy is enqueued: its block returns to the default stream's pool at once, the
next bucket is allocated there and written before the copy stream has read the previous one, so the
host receives the wrong bucket. The tests compare every offloaded bucket with its value computed
without streams.
"""

from typing import NamedTuple

import pytest
import torch

from racecheck.device import Event
from racecheck.scenario_kit.harness import check_values

NUMEL = 4096  # 16 KiB per bucket: every bucket fits the previous one's block
BUCKETS = 8


class HeldBuffer(NamedTuple):
    """A device buffer that must outlive the copy reading it, with the event marking that copy."""

    tensor: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def copy_stream(world):
    # The offload stream: device-to-host copies overlap the next buckets' compute.
    return world.new_stream("offload_copy")


def bucket_value(step: int, bucket: int, seed: int) -> torch.Tensor:
    """What the backward computes for one bucket (distinct per bucket, so a swap shows)."""
    gen = torch.Generator().manual_seed(seed * 1000 + step * 100 + bucket)
    return torch.randn(NUMEL, generator=gen)


def host_buffer(rt) -> torch.Tensor:
    # Pinned on a GPU so the copy is truly asynchronous; plain memory on the CPU emulation.
    return torch.empty(NUMEL, pin_memory=rt.device.type == "cuda")


@pytest.mark.parametrize("steps", [1, 2])
def test_offloaded_buckets_match(steps, runtime, copy_stream, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "record_stream"
    rt = runtime
    default = rt.default_stream()
    expected, offloaded = {}, {}
    held: list[HeldBuffer] = []
    for step in range(steps):
        for b in range(BUCKETS):
            value = bucket_value(step, b, racecheck_seed).to(rt.device)
            # hold_event: buffers whose copy the default stream has waited for can go now.
            for h in held:
                default.wait_event(h.event)  # producer: copy stream read h.tensor; consumer: reuse on default
            held.clear()
            with rt.stream(default):
                grad = rt.empty(NUMEL)  # allocated on X: the default stream's pool
                rt.launch("backward_bucket", lambda out, v: out.copy_(v), reads=(value,), writes=(grad,))
            dst = host_buffer(rt)
            name = f"step{step}.bucket{b}"
            expected[name], offloaded[name] = value.cpu(), dst
            # Producer: the default stream wrote grad; consumer: the copy stream.
            copy_stream.wait_stream(default)
            with rt.stream(copy_stream):
                rt.point("before_copy", bucket=name)
                rt.launch(
                    "offload_copy", lambda out, src: out.copy_(src, non_blocking=True), reads=(grad,), writes=(dst,)
                )
                rt.point("after_copy", bucket=name)
                if arm == "record_stream":
                    rt.record_stream(grad, copy_stream)
                elif arm == "hold_event":
                    event = rt.new_event()
                    event.record(copy_stream)
                    held.append(HeldBuffer(grad, event))
            del grad  # baseline: the block is back in the default pool, the copy still queued
    for h in held:
        default.wait_event(h.event)  # producer: copy stream read h.tensor; consumer: the default pool
    held.clear()
    copy_stream.synchronize()  # the host reads the offloaded buckets
    check_values(offloaded, expected, rtol=1e-6, what="offloaded bucket")
