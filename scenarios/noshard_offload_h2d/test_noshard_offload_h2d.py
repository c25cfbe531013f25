"""FSDP1 NO_SHARD with CPU offload: the device copy of a parameter is freed under its consumer.

With `ShardingStrategy.NO_SHARD` and `CPUOffload(offload_params=True)`, `pre_unshard()` copies the
CPU flat parameter to the device with a non-blocking copy allocated on the pre-unshard stream; the
computation (default) stream waits for it and computes with it. `NO_SHARD` never enters the
all-gather path whose `record_stream` would protect the buffer, so when the reshard points the flat
parameter back at its CPU shard the device copy loses its last reference while the computation's
kernels are still queued: the block goes back to the pre-unshard stream's pool and the next
handle's host-to-device copy is written into it before the computation has read it.

The race needs a computation stream that lags behind the host, which the emulation's inline
default stream never does: the module runs with `queued_default_stream()` (on CUDA the default
stream is always a queue). The tests compare every unit's output with the one computed without
streams.
"""

from typing import NamedTuple

import pytest
import torch

from racecheck.device import Event
from racecheck.scenario_kit.harness import check_values

NUMEL = 4096  # per flat parameter
HANDLES = 4  # FSDP units, unsharded one after another in the forward
LR = 0.5


class HeldCopy(NamedTuple):
    """A device copy of a flat parameter that the computation still reads, with the event after it."""

    tensor: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def pre_unshard(world):
    # pre_unshard: FSDP1's stream for the host-to-device copy of offloaded parameters, so that
    # the copy overlaps the computation of the unit before.
    return world.new_stream("pre_unshard")


@pytest.fixture
def lagging(runtime):
    """The runtime with a default stream that the host runs ahead of, as CUDA's."""
    with runtime.queued_default_stream():
        yield runtime


def initial_param(handle: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, NUMEL) * (handle + 1)


def unit_input(step: int, handle: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1000 + step * 100 + handle)
    return torch.randn(NUMEL, generator=gen)


@pytest.mark.parametrize("steps", [1, 2])
def test_unit_outputs_match(steps, lagging, pre_unshard, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "record_stream"
    rt, compute = lagging, lagging.default_stream()
    cpu_params = []
    for h in range(HANDLES):
        p = rt.pinned_empty(NUMEL)  # the CPU flat parameter (offloaded, pinned)
        p.copy_(initial_param(h))
        cpu_params.append(p)
    reference = [initial_param(h) for h in range(HANDLES)]
    outputs, expected = {}, {}
    held: list[HeldCopy] = []
    for step in range(steps):
        # The step's inputs reach the device before its first unit: on CUDA a blocking copy from
        # pageable memory synchronizes its stream (the computation stream here), which would drain
        # the computation's lag in every unit before the reshard could free under it.
        inputs = [unit_input(step, h, racecheck_seed) for h in range(HANDLES)]
        with rt.stream(compute):
            device_inputs = [x.to(rt.device) for x in inputs]
        for h in range(HANDLES):
            x = inputs[h]
            name = f"step{step}.unit{h}"
            expected[name] = reference[h] * x
            with rt.stream(pre_unshard):
                for copy in held:
                    # hold_until_next_unshard: the copy's reader is done before its block is cut again.
                    pre_unshard.wait_event(copy.event)  # producer: the computation's last read
                held.clear()
                # pre_unshard(): flat_param_to(device, non_blocking=True), allocated on this stream.
                device_param = rt.empty(NUMEL)
                rt.launch(
                    "h2d_copy",
                    lambda out, src: out.copy_(src, non_blocking=True),
                    reads=(cpu_params[h],),
                    writes=(device_param,),
                )
            compute.wait_stream(pre_unshard)  # producer: the copy; consumer: the computation
            rt.point("wait_copy", handle=h)
            with rt.stream(compute):
                x_dev = rt.empty(NUMEL)
                rt.launch("load_input", lambda out, v: out.copy_(v), reads=(device_inputs[h],), writes=(x_dev,))
                out = rt.empty(NUMEL)
                rt.launch("forward", lambda o, w, i: torch.mul(w, i, out=o), reads=(device_param, x_dev), writes=(out,))
                outputs[name] = out
                if arm == "hold_until_next_unshard":
                    last_use = rt.new_event()
                    last_use.record()
                    held.append(HeldCopy(device_param, last_use))
            if arm == "record_stream":
                rt.record_stream(device_param, compute)  # the fix: the computation stream is recorded
            # _use_sharded_flat_param: flat_param.data = flat_param._local_shard; the device copy's
            # last reference dies (baseline: back in the pre-unshard pool, the forward still queued).
            del device_param, x_dev
        # The CPU optimizer step: the host waits for the device, then updates the offloaded params.
        rt.synchronize()
        held.clear()
        for h in range(HANDLES):
            cpu_params[h].mul_(LR)
            reference[h] = reference[h] * LR
    rt.synchronize()
    check_values(outputs, expected, rtol=1e-5, what="unit output")
