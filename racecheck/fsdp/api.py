"""`fully_shard`: shard a module's parameters into one parameter group and hook it into forward
and backward, in the style of PyTorch's FSDP2 (the module's class is swapped to add FSDP methods).

Call it on each submodule that should be its own group, then on the root. The optimizer takes
`model.parameters()`, which are the groups' flat shards.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch import nn

from racecheck.device import Runtime, get_runtime
from racecheck.fsdp.main_grad import MainGradPolicy
from racecheck.fsdp.mesh import Mesh
from racecheck.fsdp.param_group import ParamGroup
from racecheck.fsdp.streams import fsdp_streams


class BackwardPass:
    """Per-runtime bookkeeping of one backward pass: which groups reduced, and the final callback
    that makes the default stream wait for the reductions (like FSDP2's root post-backward)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.unsharded: list[ParamGroup] = []
        self.reduced: list[ParamGroup] = []
        self._callback_queued = False
        self._lock = threading.Lock()

    def group_unsharded(self, group: ParamGroup) -> None:
        if group not in self.unsharded:
            self.unsharded.append(group)

    def group_reduced(self, group: ParamGroup) -> None:
        self.reduced.append(group)
        with self._lock:
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def finish(self) -> None:
        rt = self.runtime
        streams = fsdp_streams(rt)
        # Producers: the reduce-scatter and all-reduce streams wrote the shards' .grad;
        # consumer: the optimizer on the default stream.
        streams.default.wait_stream(streams.reduce_scatter)
        streams.default.wait_stream(streams.all_reduce)
        rt.point("end_of_backward")
        for group in self.reduced:
            group.finish_backward()
        for group in self.unsharded:
            if group.is_unsharded:  # parameters that got no gradient in this pass
                group.reshard()
        self.reduced.clear()
        self.unsharded.clear()
        self._callback_queued = False


_passes: "weakref.WeakKeyDictionary[Runtime, BackwardPass]" = weakref.WeakKeyDictionary()


def backward_pass(runtime: Runtime) -> BackwardPass:
    bp = _passes.get(runtime)
    if bp is None:
        bp = _passes[runtime] = BackwardPass(runtime)
    return bp


class FSDPModule:
    """Methods mixed into a module's class by fully_shard."""

    _racecheck_group: ParamGroup | None

    def zero_grad(self, set_to_none: bool = True) -> None:
        nn.Module.zero_grad(self, set_to_none=set_to_none)
        for module in self.modules():
            group = getattr(module, "_racecheck_group", None)
            if group is not None:
                group.zero_grad(set_to_none=set_to_none)

    def unshard(self) -> None:
        if self._racecheck_group is not None:
            self._racecheck_group.unshard()

    def reshard(self) -> None:
        if self._racecheck_group is not None:
            self._racecheck_group.reshard()

    def param_groups(self) -> list[ParamGroup]:
        return [m._racecheck_group for m in self.modules()
                if getattr(m, "_racecheck_group", None) is not None]


def fully_shard(module: nn.Module, *, mesh: Mesh, main_grad_policy: str | MainGradPolicy = "fixed",
                hold_reduce_output: bool = True, runtime: Runtime | None = None) -> nn.Module:
    """Shard `module`'s parameters that no nested fully_shard manages into one group."""
    runtime = runtime or get_runtime()
    has_params = any(not getattr(p, "_racecheck_flat_shard", False) for p in module.parameters())
    group = None
    if has_params:
        name = type(module).__name__ + f"#{id(module) & 0xffff:04x}"
        group = ParamGroup(module, name=name, mesh=mesh, streams=fsdp_streams(runtime), runtime=runtime,
                           main_grad_policy=MainGradPolicy(main_grad_policy),
                           hold_reduce_output=hold_reduce_output)
    module._racecheck_group = group
    if group is not None:
        module.register_forward_pre_hook(_make_pre_forward(group))
        module.register_forward_hook(_make_post_forward(group))
    cls = type(module)
    if not isinstance(module, FSDPModule):
        module.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return module


def _make_pre_forward(group: ParamGroup):
    def hook(module, args):
        group.wait_for_unshard()
        backward_pass(group.runtime).group_unsharded(group)

    return hook


def _make_post_forward(group: ParamGroup):
    def hook(module, args, output):
        if not torch.is_grad_enabled():
            group.reshard()  # no backward will come to reshard it

    return hook
