"""Unsharded parameter storage freed on reshard while compute still reads it.

A 4-layer MLP is sharded over the world. Before each layer's forward its weight is all-gathered
into a buffer allocated on the all-gather stream; compute, on its own stream, waits for the
all-gather and reads the buffer; after the layer the host reshards (drops the buffer). The host
runs ahead of compute, so in the `baseline` arm the block returns to the all-gather stream's pool
while the layer's matmul is still queued, and the next layer's all-gather, which does not wait for
compute, is allocated the same block and overwrites it: the layer runs with its successor's
weights. The tests compare the outputs with the same MLP evaluated without streams.

The CPU emulation runs its default stream on the host, which never runs ahead of it; compute
therefore runs on a stream of its own here, as the default stream does on a GPU.
"""

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from racecheck.device import Event
from racecheck.scenario_kit.harness import check_values

WIDTH = 64
LAYERS = 4
BATCH = 8


class AllGatherState(NamedTuple):
    """An all-gather output kept alive until the next all-gather waited on `event` (the event
    recorded after the compute that read it), as FSDP2's AllGatherState."""

    full: torch.Tensor
    event: Event


@pytest.fixture(scope="module")
def fsdp(world):
    rank, size = dist.get_rank(), dist.get_world_size()
    # all_gather: unshards the next layer while the current one computes (prefetch).
    # compute: forward matmuls; on a GPU this is the default stream, asynchronous to the host.
    return {
        "all_gather": world.new_stream("all_gather"),
        "compute": world.new_stream("compute"),
        "group": world.new_group(list(range(size))),
        "rank": rank,
        "size": size,
    }


def layer_weight(i: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + i)
    return torch.randn(WIDTH, WIDTH, generator=gen) / WIDTH**0.5


def reference_forward(x: torch.Tensor) -> torch.Tensor:
    for i in range(LAYERS):
        x = torch.tanh(x @ layer_weight(i).T)
    return x


def linear_tanh(out, weight, inp):
    out.copy_(torch.tanh(inp.view(BATCH, WIDTH) @ weight.view(WIDTH, WIDTH).T).view(-1))


@pytest.mark.parametrize("steps", [1, 2])
def test_forward_matches_unsharded(steps, runtime, fsdp, racecheck_arm, racecheck_seed):
    arm = racecheck_arm or "hold_until_next_all_gather"
    rt, ag, compute = runtime, fsdp["all_gather"], fsdp["compute"]
    rank, size = fsdp["rank"], fsdp["size"]
    shard_numel = WIDTH * WIDTH // size
    shards = []
    with rt.stream(rt.default_stream()):
        for i in range(LAYERS):
            shard = rt.empty(shard_numel)
            mine = layer_weight(i).reshape(-1)[rank * shard_numel : (rank + 1) * shard_numel].to(rt.device)
            rt.launch("init_shard", lambda out, v: out.copy_(v), reads=(mine,), writes=(shard,))
            shards.append(shard)
    # Producer: the default stream wrote the shards; consumer: the all-gathers.
    ag.wait_stream(rt.default_stream())
    gen = torch.Generator().manual_seed(racecheck_seed)
    outputs, expected = {}, {}
    for step in range(steps):
        x = torch.randn(BATCH, WIDTH, generator=gen)
        expected[f"step{step}"] = reference_forward(x)
        with rt.stream(compute):
            act = rt.empty(BATCH * WIDTH)
            rt.launch("load_input", lambda out, v: out.copy_(v.reshape(-1)), reads=(x.to(rt.device),), writes=(act,))
        state: AllGatherState | None = None
        for i in range(LAYERS):
            if state is not None:
                # Producer: compute read the previous output; consumer: this all-gather's reuse.
                ag.wait_event(state.event)
                state = None  # the block returns to the all-gather pool behind that wait
            with rt.stream(ag):
                rt.point("before_all_gather", layer=i)
                full = rt.empty(WIDTH * WIDTH)  # allocated on the all-gather stream
                rt.all_gather(full, shards[i], group=fsdp["group"])
                rt.point("after_all_gather", layer=i)
                gathered = rt.new_event()
                gathered.record()
            # Producer: the all-gather stream; consumer: compute.
            compute.wait_event(gathered)
            with rt.stream(compute):
                rt.point("wait_all_gather", layer=i)
                out = rt.empty(BATCH * WIDTH)
                rt.launch("linear_tanh", linear_tanh, reads=(full, act), writes=(out,))
                act = out
            del out
            # Reshard after forward: the host drops the unsharded weight.
            rt.point("reshard", layer=i)
            if arm == "record_stream":
                rt.record_stream(full, compute)
            elif arm == "hold_until_next_all_gather":
                used = rt.new_event()
                used.record(compute)
                state = AllGatherState(full, used)
            del full  # baseline: back to the all-gather pool while compute may not have read it
        compute.synchronize()  # the host reads the output
        outputs[f"step{step}"] = act.detach().view(BATCH, WIDTH).cpu().clone()
        del state
    check_values(outputs, expected, rtol=1e-5, what="output")
