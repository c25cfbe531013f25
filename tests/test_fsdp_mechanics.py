"""How racecheck.fsdp schedules its work, seen through the runtime's own observer calls, in one
process on the CPU emulation (a one-rank mesh: the collectives are copies on their streams).

Each test pins one promise of the design: reshard after forward really frees the unsharded
buffers, backward gathers them again, prefetch issues the next all-gather before the current wait,
no more than two groups are unsharded at once, accumulation without sync does not communicate,
mixed precision computes in bf16 and reduces in fp32.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from racecheck.device import RuntimeObserver
from racecheck.fsdp import Mesh, MeshConfig, MixedPrecisionPolicy, fully_shard
from racecheck.fsdp.param_group import GroupState
from racecheck.fsdp.streams import fsdp_streams

LAYERS = 5


class Log(RuntimeObserver):
    """Points, launches and per-stream live block counts, in host order."""

    def __init__(self, groups) -> None:
        self.groups = groups
        self.trace: list[tuple[str, str | None]] = []
        self.live: dict[str, int] = {}
        self.max_unsharded = 0

    def on_alloc(self, rt, *, block, stream, ptr, nbytes):
        self.live[stream.name] = self.live.get(stream.name, 0) + 1

    def on_free(self, rt, *, block, stream, ptr, nbytes, deferred_to):
        self.live[stream.name] = self.live.get(stream.name, 0) - 1

    def on_launch(self, rt, *, stream, name, reads, writes):
        self.trace.append((name, stream.name))

    def on_point(self, rt, name, **context):
        self.trace.append((name, context.get("group")))
        unsharded = sum(g.state is not GroupState.SHARDED for g in self.groups)
        self.max_unsharded = max(self.max_unsharded, unsharded)

    def index(self, name: str, group: str, start: int = 0) -> int:
        return self.trace.index((name, group), start)


def build(rt, **options):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(LAYERS)])
    mesh = Mesh(MeshConfig(shard=1), runtime=rt)
    for layer in model:
        fully_shard(layer, mesh=mesh, runtime=rt, **options)
    fully_shard(model, mesh=mesh, runtime=rt, **options)
    groups = model.param_groups()
    log = Log(groups)
    rt.add_observer(log)
    return model, [g.name for g in groups], log


def step(model, x=None):
    x = torch.randn(4, 16) if x is None else x
    model(x).square().mean().backward()


def test_reshard_after_forward_frees_every_unsharded_buffer(rt):
    model, _, log = build(rt)
    step(model)  # the first iteration records the order prefetch uses
    rt.synchronize()
    out = model(torch.randn(4, 16))
    assert all(g.state is GroupState.SHARDED for g in model.param_groups())
    # Resharded buffers are retired until the all-gather stream waits for compute, at the latest
    # when the root's forward ends.
    retired = fsdp_streams(rt).retired_unsharded
    assert log.live.get("all_gather", 0) == len(retired) == 0, "an unsharded buffer outlived its forward"
    out.square().mean().backward()
    rt.synchronize()
    assert log.live.get("all_gather", 0) == len(retired) == 0


def test_reshard_after_forward_false_keeps_the_buffers(rt):
    model, _, log = build(rt, reshard_after_forward=False)
    out = model(torch.randn(4, 16))
    assert all(g.state is GroupState.UNSHARDED for g in model.param_groups())
    assert log.live["all_gather"] == LAYERS
    out.square().mean().backward()
    rt.synchronize()
    assert all(g.state is GroupState.SHARDED for g in model.param_groups())
    assert log.live["all_gather"] == 0


def test_backward_gathers_each_resharded_group_again(rt):
    model, names, log = build(rt)
    out = model(torch.randn(4, 16))
    forward_gathers = sum(name == "all_gather" for name, _ in log.trace)
    out.square().mean().backward()
    backward_gathers = sum(name == "all_gather" for name, _ in log.trace) - forward_gathers
    assert forward_gathers == LAYERS and backward_gathers == LAYERS
    assert log.max_unsharded <= 2


@pytest.mark.parametrize("prefetch", [True, False])
def test_forward_prefetch_issues_the_next_all_gather_before_waiting(rt, prefetch):
    model, names, log = build(rt, prefetch=prefetch)
    step(model)
    log.trace.clear()
    model(torch.randn(4, 16))  # second forward: the order is known
    for cur, nxt in itertools.pairwise(names):
        issued_early = log.index("before_all_gather", nxt) < log.index("wait_all_gather", cur)
        assert issued_early == prefetch, (cur, nxt, log.trace)
    assert log.max_unsharded <= 2


@pytest.mark.parametrize("prefetch", [True, False])
def test_backward_prefetch_runs_in_reverse_order(rt, prefetch):
    model, names, log = build(rt, prefetch=prefetch)
    out = model(torch.randn(4, 16))
    start = len(log.trace)
    out.square().mean().backward()
    for cur, prev in itertools.pairwise(names[::-1]):  # backward visits the last layer first
        issued_early = log.index("before_all_gather", prev, start) < log.index("wait_all_gather", cur, start)
        assert issued_early == prefetch, (cur, prev, log.trace[start:])
    assert log.max_unsharded <= 2


def test_no_sync_accumulates_without_communication(rt):
    model, names, log = build(rt)
    with model.no_sync():
        step(model)
    assert not any(name == "reduce_scatter" for name, _ in log.trace)
    assert all(g.flat_param_shard.grad is None for g in model.param_groups())
    step(model)
    assert sum(name == "reduce_scatter" for name, _ in log.trace) == LAYERS


def test_gradient_accumulation_modes_agree(rt):
    xs = [torch.randn(4, 16) for _ in range(3)]
    grads = {}
    for sync in (True, False):
        model, _, log = build(rt)
        for i, x in enumerate(xs):
            quiet = model.no_sync() if not sync and i < len(xs) - 1 else torch.enable_grad()
            with quiet:
                step(model, x)
        rt.synchronize()
        grads[sync] = [g.flat_param_shard.grad.clone() for g in model.param_groups()]
        rt.remove_observer(log)
    for a, b in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bf16_compute_with_fp32_reduction(rt):
    model, _, log = build(rt, mixed_precision=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    seen = []
    # Our pre-forward hook runs first (it is prepended): later pre-hooks see the unsharded weight.
    model[0].register_forward_pre_hook(lambda m, args: seen.append((m.weight.dtype, args[0].dtype)))
    out = model(torch.randn(4, 16))
    assert seen == [(torch.bfloat16, torch.bfloat16)] and out.dtype == torch.bfloat16
    out.float().square().mean().backward()
    rt.synchronize()
    for g in model.param_groups():
        assert g.flat_param_shard.dtype == torch.float32
        assert g.flat_param_shard.grad.dtype == torch.float32
        assert g.main_grad.dtype == torch.float32


def test_parameters_are_the_flat_shards_and_hidden_outside_forward(rt):
    model, _, _ = build(rt)
    assert [p.shape for p in model.parameters()] == [g.flat_param_shard.shape for g in model.param_groups()]
    assert "weight" not in model[0].__dict__ and "weight" not in model[0]._parameters
    with torch.no_grad():
        model(torch.randn(4, 16))  # no backward will come: everything reshards, the root too
    assert all(g.state is GroupState.SHARDED for g in model.param_groups())


def test_clip_grad_norm_matches_torch(rt):
    torch.manual_seed(0)
    reference = nn.Sequential(*[nn.Linear(16, 16) for _ in range(LAYERS)])
    model, _, _ = build(rt)
    x = torch.randn(4, 16)
    reference(x).square().mean().backward()
    expected = nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    step(model, x)
    norm = model.clip_grad_norm_(0.01)
    torch.testing.assert_close(norm, expected)
    flat = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    ours = torch.cat([g.flat_param_shard.grad for g in model.param_groups()])
    torch.testing.assert_close(ours.norm(), flat.norm())


def test_meta_device_module_is_sharded_without_values_then_initialized(rt):
    torch.manual_seed(0)
    reference = nn.Sequential(*[nn.Linear(16, 16) for _ in range(LAYERS)])
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(LAYERS)])
    mesh = Mesh(MeshConfig(shard=1), runtime=rt)
    for layer in model:
        fully_shard(layer, mesh=mesh, runtime=rt)
    fully_shard(model, mesh=mesh, runtime=rt)
    assert all(g.needs_init and not g.flat_param_shard.is_meta for g in model.param_groups())
    torch.manual_seed(0)
    model.init_parameters()
    full = model.full_state_dict()
    for name, p in reference.named_parameters():
        assert torch.equal(full[name], p.detach()), name


def test_fully_shard_keeps_its_hook_handles_and_can_remove_them(rt):
    """fully_shard's forward hooks are handles on the module's state: removed, forward no longer
    drives the groups (no all-gather, parameters stay hidden); attached again, it trains as before."""
    model, names, log = build(rt)
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = model(x)
    states = [m.fsdp_state for m in [model, *model]]
    assert all(len(st.hooks) == 2 for st in states)
    model.remove_fsdp_hooks()
    assert all(st.hooks == () for st in states)
    log.trace.clear()
    with torch.no_grad(), pytest.raises(AttributeError, match="weight"):
        model(x)  # the layers' parameters are hidden and nothing unshards them
    assert log.trace == []  # no point, no launch: no all-gather was issued
    model.remove_fsdp_hooks()  # idempotent
    for st in states:
        st.attach_hooks()
    with torch.no_grad():
        assert torch.equal(model(x), before)
    assert log.index("before_all_gather", names[0]) >= 0
