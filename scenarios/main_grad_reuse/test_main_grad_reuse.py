"""The motivating race: HSDP losses must match a single-process reference.

A 2x2 mesh (2-way shard x 2-way replicate) trains a 4-layer MLP whose layers are parameter groups
of equal size, for a few SGD steps over microbatches. The `baseline` arm allocates `main_grad` on
the default stream and drops it while the reduce-scatter reading it is queued; the safe arms do not.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from racecheck.fsdp import Mesh, fully_shard
from racecheck.harness import check_parity, full_parameters, hsdp_mesh_config, update_errors

WIDTH = 64
LAYERS = 4
GLOBAL_BATCH = 24
STEPS = 2
LR = 0.05


def make_model() -> nn.Sequential:
    torch.manual_seed(1234)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


@pytest.fixture(scope="module")
def mesh(world):
    # 2x2 (2-way shard x 2-way replicate) on 4 ranks; fewer GPUs get a smaller mesh.
    return Mesh(hsdp_mesh_config(dist.get_world_size()), runtime=world)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("num_microbatches", [1, 3])
def test_hsdp_losses_match_baseline(num_microbatches, set_to_none, mesh, runtime, racecheck_arm,
                                    racecheck_seed):
    arm = racecheck_arm or "fixed"
    world, rank = dist.get_world_size(), dist.get_rank()
    device = runtime.device
    reference = make_model().to(device)
    model = make_model().to(device)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, main_grad_policy=arm, runtime=runtime)
    fully_shard(model, mesh=mesh, main_grad_policy=arm, runtime=runtime)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    gen = torch.Generator().manual_seed(racecheck_seed)
    losses, ref_losses = [], []
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen).to(device)
        y = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen).to(device)
        ref_opt.zero_grad(set_to_none=set_to_none)
        ref_loss = nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_losses.append(ref_loss.item())

        model.zero_grad(set_to_none=set_to_none)
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
