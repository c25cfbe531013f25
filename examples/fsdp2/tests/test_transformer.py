"""A transformer trained with FSDP2 beside a plain replica of it, parameter for parameter.

Three `TransformerEncoderLayer(256, 4, 1024, batch_first=True, norm_first=True, dropout=0.0)`,
each layer and the root a `fully_shard` unit, `reshard_after_forward` True and False, in the
arm's parameter dtype with fp32 gradient reduction, AdamW (lr 1e-3) for four steps. The replica
is the same model unsharded, trained alongside (a step of one, then the same step of the other):
fp32 master weights, each step computed on a copy of them in the parameter dtype whose gradients
are cast to fp32 and averaged over the ranks' slices of the batch, which is FSDP2's arithmetic.
After the last step every parameter's `full_tensor()` must match the replica's.

FSDP2 orders every buffer that crosses streams with events and frees none that a stream may
still read before that stream's next allocation, so no perturbation may make this suite fail and
the detector must stay silent.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: FSDP2 here runs on CUDA streams and NCCL"
)

LAYERS = 3
WIDTH, HEADS, FFN = 256, 4, 1024
BATCH_PER_RANK, SEQ = 8, 64
STEPS = 4
LR = 1e-3
ATOL = 1e-5  # the same kernels on the same values: FSDP2 on one GPU matches its replica exactly


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, batch_first=True, norm_first=True, dropout=0.0)
    return nn.Sequential(*[copy.deepcopy(layer) for _ in range(LAYERS)])


def make_batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(BATCH_PER_RANK * world, SEQ, WIDTH, generator=g) for _ in range(STEPS)]


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def sharded(mesh, *, param_dtype, reshard_after_forward: bool) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # imported where it is used

    model = make_model().cuda()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def fsdp2_step(model, optimizer, x: torch.Tensor, *, param_dtype) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    loss_of(model(x.chunk(world)[rank].cuda().to(param_dtype))).backward()
    optimizer.step()


def replica_step(master, optimizer, x: torch.Tensor, *, param_dtype, world: int) -> None:
    for p in master.parameters():
        p.grad = torch.zeros_like(p)
    compute = copy.deepcopy(master).to(param_dtype)  # FSDP2's all-gathered copy
    for xr in x.chunk(world):  # what each rank computes on its slice
        compute.zero_grad(set_to_none=True)
        loss_of(compute(xr.cuda().to(param_dtype))).backward()
        for p, c in zip(master.parameters(), compute.parameters(), strict=True):
            p.grad += c.grad.float() / world  # reduce_dtype fp32, averaged over ranks
    optimizer.step()


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_every_parameter_matches_the_replica(mesh, param_dtype, reshard_after_forward):
    """The two trained alongside, step by step."""
    world = dist.get_world_size()
    model = sharded(mesh, param_dtype=param_dtype, reshard_after_forward=reshard_after_forward)
    master = make_model().cuda()
    optimizers = torch.optim.AdamW(model.parameters(), lr=LR), torch.optim.AdamW(master.parameters(), lr=LR)
    for x in make_batches(world):
        fsdp2_step(model, optimizers[0], x, param_dtype=param_dtype)
        replica_step(master, optimizers[1], x, param_dtype=param_dtype, world=world)
    got = {name: p.full_tensor().cpu() for name, p in model.named_parameters()}
    want = {name: p.detach().cpu() for name, p in master.named_parameters()}
    assert list(got) == list(want)
    for name, param in got.items():
        torch.testing.assert_close(
            param,
            want[name],
            rtol=0.0,
            atol=ATOL,
            msg=lambda m, name=name: f"{name} after {STEPS} AdamW steps differs from the replica: {m}",
        )
