"""The training check the FSDP scenarios share: an MLP whose layers are equal-sized parameter
groups, trained under racecheck.fsdp for a few SGD steps over microbatches and compared with a
single-process reference trained on the same global batch. It fails only because numbers differ
(see racecheck.scenario_kit.harness.check_parity for the message)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from racecheck.device import Runtime
from racecheck.fsdp import Mesh, fully_shard
from racecheck.scenario_kit.harness import check_parity, full_parameters, update_errors


@dataclasses.dataclass(frozen=True)
class MLPTraining:
    """The workload: equal-sized groups make a freed gradient block fit the next group's request."""

    width: int = 64
    layers: int = 4
    global_batch: int = 24
    steps: int = 2
    lr: float = 0.05
    rtol: float = 1e-4

    def model(self, seed: int) -> nn.Sequential:
        torch.manual_seed(seed)
        layers = []
        for _ in range(self.layers):
            layers += [nn.Linear(self.width, self.width), nn.Tanh()]
        return nn.Sequential(*layers[:-1])


def sgd_step(model: nn.Module, *, lr: float) -> None:
    """Plain SGD, p -= lr * grad: the update torch.optim.SGD makes, without its first
    construction importing torch._dynamo (seconds per rank, more than the trials themselves)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def train_against_reference(
    *,
    mesh: Mesh,
    runtime: Runtime,
    shard_options: dict,
    num_microbatches: int,
    set_to_none: bool = True,
    model_seed: int,
    data_seed: int,
    workload: MLPTraining = MLPTraining(),
) -> None:
    """Train the sharded model and the reference side by side; raise AssertionError on a mismatch.
    `shard_options` go to every fully_shard call (the arm's knobs)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    device = runtime.device
    reference = workload.model(model_seed).to(device)
    model = workload.model(model_seed).to(device)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, runtime=runtime, **shard_options)
    fully_shard(model, mesh=mesh, runtime=runtime, **shard_options)

    gen = torch.Generator().manual_seed(data_seed)
    losses, ref_losses = [], []
    for _ in range(workload.steps):
        x = torch.randn(workload.global_batch, workload.width, generator=gen).to(device)
        y = torch.randn(workload.global_batch, workload.width, generator=gen).to(device)
        reference.zero_grad(set_to_none=set_to_none)
        ref_loss = nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        sgd_step(reference, lr=workload.lr)
        ref_losses.append(ref_loss.item())

        model.zero_grad(set_to_none=set_to_none)
        local = 0.0
        # Each rank trains on its slice of the global batch, split into microbatches; slices and
        # microbatches may differ in size (24 samples over 5 ranks, 8 in 3 microbatches), so each
        # microbatch's loss is its squared error over the global batch's elements, times the world
        # the reduce-scatter averages over: the averaged gradient is then the reference's mean.
        scale = world / x.numel()
        for xb, yb in zip(
            x.tensor_split(world)[rank].tensor_split(num_microbatches),
            y.tensor_split(world)[rank].tensor_split(num_microbatches),
            strict=True,
        ):
            loss = nn.functional.mse_loss(model(xb), yb, reduction="sum") * scale
            loss.backward()
            local += loss.item()
        sgd_step(model, lr=workload.lr)
        total = torch.tensor([local], device=device)
        dist.all_reduce(total)
        losses.append(total.item() / world)

    replicas = full_parameters(model, world=world)
    errors = update_errors(initial, replicas, dict(reference.named_parameters()))
    check_parity(losses=losses, ref_losses=ref_losses, errors=errors, rtol=workload.rtol)
