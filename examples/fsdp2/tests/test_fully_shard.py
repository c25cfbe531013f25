"""Training with PyTorch's FSDP2 (`fully_shard`, bf16 or fp32 parameters, fp32 gradient
reduction) against a single-process reference that does the same arithmetic without sharding.

The model is four blocks of `Linear(2048, 2048, bias=False)` + `Tanh`; each block is one
`fully_shard` unit, then the root, with `MixedPrecisionPolicy(param_dtype=the arm's,
reduce_dtype=fp32)`. Three SGD steps of `num_microbatches` microbatches each; each rank trains on
its slice of the global batch. The reference keeps fp32 master weights and, each step, computes
every rank's microbatches on a copy of them in the parameter dtype, casting each microbatch's gradient to fp32 and
averaging over ranks, which is what FSDP2 computes. Losses and final parameters must match.

FSDP2 keeps every buffer that crosses streams alive until the consuming stream has waited on an
event (no record_stream), so no schedule of its streams may make this suite fail.
"""

import copy
import itertools

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: FSDP2 here runs on CUDA streams and NCCL"
)

HIDDEN = 2048
BLOCKS = 4
BATCH_PER_RANK = 48  # divisible by every num_microbatches below
STEPS = 3
LR = 2.0  # a corrupted gradient moves the parameters by about 1e-3, ten times the tolerance
LOSS_RTOL = 1e-3
PARAM_ATOL = 1e-4  # bf16 compute: a master weight one ulp apart can round to another bf16 value


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Tanh()) for _ in range(BLOCKS)])


def make_batches(world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    size = BATCH_PER_RANK * world_size
    return [(torch.randn(size, HIDDEN, generator=g), torch.randn(size, HIDDEN, generator=g)) for _ in range(STEPS)]


def microbatches(x, y, n):
    return zip(x.chunk(n), y.chunk(n), strict=True)


def train_fsdp2(mesh, batches, *, num_microbatches: int, reshard_after_forward: bool, param_dtype):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # imported where it is used

    model = make_model().cuda()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        x, y = (t.chunk(world)[rank].cuda() for t in (x, y))
        step_loss = torch.zeros((), device="cuda")
        for xm, ym in microbatches(x, y, num_microbatches):
            loss = nn.functional.mse_loss(model(xm).float(), ym) / num_microbatches
            loss.backward()
            step_loss += loss.detach()
        dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        losses.append(step_loss.item())
        optimizer.step()
    return losses, [p.full_tensor().cpu() for p in model.parameters()]


def train_reference(batches, *, world: int, num_microbatches: int, param_dtype):
    master = make_model().cuda()
    optimizer = torch.optim.SGD(master.parameters(), lr=LR, foreach=False)
    losses = []
    for x, y in batches:
        for p in master.parameters():
            p.grad = torch.zeros_like(p)  # the fp32 sums of the microbatches' gradients
        compute = copy.deepcopy(master).to(param_dtype)  # FSDP2's all-gathered copy
        step_loss = 0.0
        for xr, yr in zip(x.chunk(world), y.chunk(world), strict=True):  # what each rank computes
            for xm, ym in microbatches(xr.cuda(), yr.cuda(), num_microbatches):
                compute.zero_grad(set_to_none=True)
                out = compute(xm.to(param_dtype))
                loss = nn.functional.mse_loss(out.float(), ym) / num_microbatches
                loss.backward()
                step_loss += loss.item() / world
                for p, c in zip(master.parameters(), compute.parameters(), strict=True):
                    p.grad += c.grad.float() / world  # reduce_dtype fp32, averaged over ranks
        losses.append(step_loss)
        optimizer.step()
    return losses, [p.detach().cpu() for p in master.parameters()]


@pytest.mark.parametrize(("num_microbatches", "reshard_after_forward"), list(itertools.product([1, 3], [True, False])))
def test_fully_shard_losses_match_reference(mesh, param_dtype, num_microbatches, reshard_after_forward):
    world = dist.get_world_size()
    batches = make_batches(world)
    losses, params = train_fsdp2(
        mesh,
        batches,
        num_microbatches=num_microbatches,
        reshard_after_forward=reshard_after_forward,
        param_dtype=param_dtype,
    )
    ref_losses, ref_params = train_reference(
        batches, world=world, num_microbatches=num_microbatches, param_dtype=param_dtype
    )
    torch.testing.assert_close(
        torch.tensor(losses),
        torch.tensor(ref_losses),
        rtol=LOSS_RTOL,
        atol=0.0,
        msg=lambda m: f"losses per step differ from the reference: {losses} vs {ref_losses}\n{m}",
    )
    for index, (param, ref) in enumerate(zip(params, ref_params, strict=True)):
        torch.testing.assert_close(
            param, ref, rtol=0.0, atol=PARAM_ATOL, msg=lambda m, i=index: f"block {i}'s weight after {STEPS} steps: {m}"
        )
