"""HSDP all-reduce reuse: cross-layer gradient aliasing under a slow all-reduce.

HSDP reduce-scatters each group's gradient over the shard axis into a buffer B allocated on the
reduce-scatter stream, then all-reduces B over the replicate axis on its own stream, so the
all-reduce overlaps the next group's reduce-scatter. In the `drop_after_all_reduce` arm the host
releases B as soon as the all-reduce is enqueued: B's block goes back to the reduce-scatter pool,
the next group's reduce-scatter output is allocated the same block and written while the all-reduce
(held back) has not read it yet, so one layer's sharded gradient becomes another's. The test trains
an MLP whose layers are equal-sized groups and compares losses and parameters with a
single-process reference.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from racecheck.fsdp import Mesh, MeshConfig, fully_shard
from racecheck.harness import check_parity, full_parameters, update_errors

WIDTH = 64
LAYERS = 4
GLOBAL_BATCH = 24
STEPS = 2
LR = 0.05


def make_model() -> nn.Sequential:
    torch.manual_seed(4321)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


@pytest.fixture(scope="module")
def mesh(world):
    # Always hybrid: 2 replicas (the all-reduce axis) x world/2 shards; 2x2 on 4 ranks, 1x2 on 2.
    size = dist.get_world_size()
    if size < 2 or size % 2:
        pytest.fail(f"HSDP needs an even world of at least 2 ranks, got {size}", pytrace=False)
    return Mesh(MeshConfig(shard=size // 2, replicate=2), runtime=world)


@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_hsdp_training_matches_reference(num_microbatches, mesh, runtime, racecheck_arm):
    arm = racecheck_arm or "hold_until_wait"
    hold = {"hold_until_wait": True, "drop_after_all_reduce": False}[arm]
    world, rank = dist.get_world_size(), dist.get_rank()
    device = runtime.device
    reference = make_model().to(device)
    model = make_model().to(device)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, hold_reduce_output=hold, runtime=runtime)
    fully_shard(model, mesh=mesh, hold_reduce_output=hold, runtime=runtime)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    gen = torch.Generator().manual_seed(7)
    losses, ref_losses = [], []
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen).to(device)
        y = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen).to(device)
        ref_opt.zero_grad()
        ref_loss = nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_losses.append(ref_loss.item())

        model.zero_grad()
        local = 0.0
        for xb, yb in zip(x.chunk(world)[rank].chunk(num_microbatches),
                          y.chunk(world)[rank].chunk(num_microbatches)):
            loss = nn.functional.mse_loss(model(xb), yb) / num_microbatches
            loss.backward()
            local += loss.item()
        opt.step()
        total = torch.tensor([local], device=device)
        dist.all_reduce(total)
        losses.append(total.item() / world)

    replicas = full_parameters(model, world=world)
    errors = update_errors(initial, replicas, dict(reference.named_parameters()))
    check_parity(losses=losses, ref_losses=ref_losses, errors=errors, rtol=1e-4)
