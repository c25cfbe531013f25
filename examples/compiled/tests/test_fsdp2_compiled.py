"""FSDP2 with each block compiled, as torchtitan builds its models: every TransformerBlock is
`torch.compile`d, then it and the root are `fully_shard`ed; trained with AdamW beside a replica
(the same blocks compiled alike, unsharded) for three steps, every parameter's `full_tensor()`
must match the replica's.

This code is correct in every arm (the arms change only the side-stream tests): no perturbation may
make it fail and the detector must stay silent on it.
"""

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: FSDP2 here runs on NCCL")

WIDTH, HEADS, LAYERS = 128, 4, 2
BATCH, SEQ, STEPS, LR = 4, 32, 3, 1e-3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm(x))


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(LAYERS)]).cuda()


def test_fsdp2_with_compiled_blocks_matches_a_replica(mesh, generator):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    replica = make_model()
    model = copy.deepcopy(replica)
    for i in range(LAYERS):
        replica[i] = torch.compile(replica[i], fullgraph=True)  # the same kernels, unsharded
        model[i] = torch.compile(model[i], fullgraph=True)
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    ref_opt = torch.optim.AdamW(replica.parameters(), lr=LR, foreach=True)
    for _ in range(STEPS):
        x = torch.randn(BATCH, SEQ, WIDTH, device="cuda", generator=generator)
        for m, o in ((model, opt), (replica, ref_opt)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for (name, p), (_, ref) in zip(model.named_parameters(), replica.named_parameters(), strict=True):
        assert isinstance(p, DTensor), name
        torch.testing.assert_close(p.full_tensor(), ref.detach(), rtol=1e-4, atol=1e-5, msg=name)
