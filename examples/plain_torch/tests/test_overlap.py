"""Tests of the six overlap patterns in overlap.py: each compares what the overlapped code
produced with the same computation done without side streams.

`fixed` (PLAIN_TORCH_FIXED) picks the version: 1 the correct one, 0 the one with the mistake.
Every rank uses the same inputs, so an average over ranks is the local value.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from overlap import (
    ActivationOffloader,
    AllGatherPrefetcher,
    BucketedReduceScatter,
    DoubleBufferedAllReduce,
    HostStatistics,
    StagedInputs,
)
from torch import nn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the patterns overlap CUDA streams"
)

HIDDEN = 2048
LAYERS = 6
BATCH = 1024
OFFLOAD_BATCH = 4096  # 32 MiB activations: each device-to-host copy takes about a millisecond
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5 for _ in range(LAYERS)]


def _inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(1))


def _model(bias: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(HIDDEN, HIDDEN, bias=bias), nn.Tanh()) for _ in range(LAYERS)]
    ).cuda()


def _differs(what: str, got: torch.Tensor, want: torch.Tensor) -> str:
    difference = (got.detach().float().cpu() - want.detach().float().cpu()).abs().max().item()
    return f"{what}: largest difference {difference:.3e}"


def _loss(output: torch.Tensor) -> torch.Tensor:
    # A sum, not a mean: gradients of order one, so that a gradient swapped for another one is
    # far outside the tolerance (with a mean over 2M outputs they are of order 1e-6).
    return output.square().sum()


def test_offload_copy(fixed):
    """Activations offloaded to the host during a forward; no collective."""
    weights = [w.cuda() for w in _weights()]
    x = _inputs(OFFLOAD_BATCH).cuda()
    expected, h = [], x
    for w in weights:
        h = torch.tanh(h @ w)
        expected.append(h.cpu())
    del h

    offloader = ActivationOffloader(slots=LAYERS, shape=x.shape, dtype=x.dtype, fixed=fixed)
    handles, h = [], x
    for w in weights:
        h = torch.tanh(h @ w)  # rebinding drops the previous activation: only its host copy stays
        handles.append(offloader.offload(h))
    del h
    for index, (handle, want) in enumerate(zip(handles, expected, strict=True)):
        got = offloader.fetch(handle)
        torch.testing.assert_close(
            got, want, **TOL, msg=lambda m, i=index, got=got, want=want: _differs(f"layer {i}'s host copy", got, want)
        )


def test_prefetch_all_gather(group, fixed):
    """A forward over sharded weights, each all-gathered one layer ahead."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    weights = _weights()
    shards = [w.reshape(-1).chunk(world)[rank].cuda() for w in weights]
    x = _inputs(BATCH).cuda()

    h = x
    for w in AllGatherPrefetcher(shards, weights[0].shape, group, fixed=fixed).weights():
        h = torch.tanh(h @ w)
    got = h.cpu()

    h = x
    for w in weights:
        h = torch.tanh(h @ w.cuda())
    torch.testing.assert_close(got, h.cpu(), **TOL, msg=lambda m: _differs("the forward's output", got, h))


def test_double_buffer_all_reduce(group, fixed):
    """Gradients averaged during backward through two staging buffers."""
    model = _model(bias=False)
    params = list(model.parameters())
    reducer = DoubleBufferedAllReduce(params, group, fixed=fixed)
    _loss(model(_inputs(BATCH).cuda())).backward()
    reducer.finish()
    for index, p in enumerate(params):
        got = reducer.reduced[p]
        torch.testing.assert_close(
            got,
            p.grad,
            **TOL,
            msg=lambda m, i=index, got=got, p=p: _differs(f"parameter {i}'s averaged gradient", got, p.grad),
        )


def test_bucketed_reduce_scatter(group, fixed):
    """Each layer's gradients reduce-scattered during backward, the full gradients freed."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    model = _model(bias=True)
    x = _inputs(BATCH).cuda()
    reference = copy.deepcopy(model)
    _loss(reference(x)).backward()
    want = [torch.cat([p.grad.view(-1) for p in block[0].parameters()]).chunk(world)[rank] for block in reference]
    del reference

    layers = [block[0] for block in model]
    reducer = BucketedReduceScatter(layers, group, fixed=fixed)
    _loss(model(x)).backward()
    reducer.finish()
    for index, (layer, expected) in enumerate(zip(layers, want, strict=True)):
        got = reducer.shards[layer]
        torch.testing.assert_close(
            got,
            expected,
            **TOL,
            msg=lambda m, i=index, got=got, expected=expected: _differs(f"layer {i}'s gradient shard", got, expected),
        )


def test_host_statistics(fixed):
    """Per-row norms copied to the host for logging, three steps in a row; no collective."""
    x = _inputs(OFFLOAD_BATCH).cuda()
    stats = HostStatistics(OFFLOAD_BATCH, fixed=fixed)
    for step in range(3):
        norms = (x * (step + 1)).norm(dim=1)
        want = norms.cpu()  # blocking: the reference, read after the device is done
        got = stats.snapshot(norms).clone()  # the host reads the pinned buffer
        torch.testing.assert_close(
            got, want, **TOL, msg=lambda m, s=step, got=got, want=want: _differs(f"step {s}'s norms", got, want)
        )


def test_staged_inputs(fixed):
    """Batches normalized on a side stream and consumed by the compute stream."""
    stager = StagedInputs(fixed=fixed)
    weights = _weights()[0].cuda()
    for step in range(3):
        batch = _inputs(OFFLOAD_BATCH).cuda() * (step + 1)
        got = (stager.stage(batch) @ weights).cpu()
        want = ((batch - batch.mean(dim=1, keepdim=True)) @ weights).cpu()
        torch.testing.assert_close(
            got, want, **TOL, msg=lambda m, s=step, got=got, want=want: _differs(f"step {s}'s output", got, want)
        )
