"""One parameter group: a module's parameters flattened into one padded buffer (flat_param.py),
sharded over the mesh's shard axis, unsharded by all-gather for compute and resharded after forward
and after backward; its gradients are reduced by reduce.py.

[Note: group buffers and their streams]
  buffer                  allocated on     produced by        consumed by          freed
  shard (flat_param_      default          init / optimizer   all-gather (cast or  with the model
  shard), fp32                             (default)          input), optimizer
  cast shard (mixed       all_gather       cast on all_gather all-gather           host, right after
  precision only)                                                                  the all-gather is
                                                                                   enqueued
  unsharded `full`,       all_gather       all-gather         default compute in   retired by
  compute dtype                                               forward and backward reshard(), then
                                                                                   dropped after
                                                                                   all_gather waits
                                                                                   for default
reshard() retires `full` instead of dropping it: it is dropped when the all-gather stream waits for
the default stream, at the next unshard (right before that unshard allocates, so the block is
reused at once) or at the end of backward ([Note: drop on the allocation stream's terms] in
streams.py). The end of backward also makes the default stream wait for the all-gather stream
before the optimizer overwrites the shard that an all-gather (a prefetch left unused) may still read.
Gradient buffers: [Note: reduction buffers and their streams] in reduce.py.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from racecheck.device import Event, Point, Runtime
from racecheck.fsdp.autograd import UnshardParams, unsharded_storages
from racecheck.fsdp.config import GroupOptions
from racecheck.fsdp.flat_param import SHARD_MARK, FlatLayout, flatten_into, take_parameters
from racecheck.fsdp.mesh import Mesh
from racecheck.fsdp.reduce import GradReducer
from racecheck.fsdp.streams import FSDPStreams

if TYPE_CHECKING:
    from racecheck.fsdp.prefetch_order import Schedule


class GroupState(enum.Enum):
    SHARDED = "sharded"  # only the shard exists
    GATHERING = "gathering"  # the all-gather is enqueued; compute has not waited for it yet
    UNSHARDED = "unsharded"  # compute waited: `full` is readable on the default stream


class Unsharded(NamedTuple):
    """All-gather output travelling from the all-gather stream to compute, with its event."""

    full: torch.Tensor
    event: Event


class ParamGroup:
    def __init__(
        self, module: nn.Module, *, name: str, mesh: Mesh, streams: FSDPStreams, runtime: Runtime, options: GroupOptions
    ) -> None:
        self.name = name
        self.mesh = mesh
        self.streams = streams
        self.runtime = runtime
        self.options = options
        self.layout = FlatLayout.of(module, shard_count=mesh.config.shard)
        self.infos = list(self.layout.infos)
        mp = options.mixed_precision
        self.compute_dtype = mp.param_dtype or self.layout.dtype
        self.needs_init = False  # set when the module's parameters were on the meta device
        self.flat_param_shard = self._make_shard()
        module.register_parameter("flat_param_shard", self.flat_param_shard)
        self.reducer = GradReducer(
            name=name,
            layout=self.layout,
            shard=self.flat_param_shard,
            mesh=mesh,
            streams=streams,
            runtime=runtime,
            policy=options.main_grad_policy,
            hold_reduce_output=options.hold_reduce_output,
            reduce_dtype=mp.reduce_dtype or self.layout.dtype,
        )
        self.main_grad = self.reducer.main_grad
        self.state = GroupState.SHARDED
        self._gather: Unsharded | None = None  # while GATHERING
        self._full: torch.Tensor | None = None  # while UNSHARDED
        # None until the schedule resolves it (the root keeps its parameters for backward).
        self.reshard_after_forward = options.reshard_after_forward
        self.requires_gradient_sync = True
        self.schedule: Schedule | None = None  # set at the root's first forward
        self.pre_backward_seen = False

    # -- sizes (the flat layout's) -----------------------------------------------------------------
    @property
    def numel(self) -> int:
        return self.layout.numel

    @property
    def padded_numel(self) -> int:
        return self.layout.padded_numel

    @property
    def shard_numel(self) -> int:
        return self.layout.shard_numel

    # -- construction ------------------------------------------------------------------------------
    def _make_shard(self) -> nn.Parameter:
        rt, layout = self.runtime, self.layout
        params = take_parameters(layout)  # the modules get views of `full` while unsharded
        with rt.stream(rt.default_stream()):
            shard = rt.empty(layout.shard_numel, dtype=layout.dtype)
            if any(p.is_meta for p in params):
                # Meta-device module: values come later (state_dict.init_parameters or a load).
                self.needs_init = True
                rt.launch("zero_", lambda out: out.zero_(), writes=(shard,))
            else:
                flat = torch.empty(layout.padded_numel, dtype=layout.dtype, device=params[0].device)
                flatten_into(layout, params, flat)
                start, end = layout.shard_range(self.mesh.shard_index)
                rt.launch("init_shard", lambda out, src: out.copy_(src), reads=(flat[start:end],), writes=(shard,))
        param = nn.Parameter(shard)
        setattr(param, SHARD_MARK, True)
        return param

    # -- unshard / reshard -------------------------------------------------------------------------
    def unshard(self) -> None:
        """Enqueue the all-gather of this group's parameters (no wait: compute waits later)."""
        if self.state is not GroupState.SHARDED:
            return
        rt, s = self.runtime, self.streams
        # Producer: the default stream (the optimizer wrote the shard, which lives with the model;
        # compute read the retired unsharded buffers); consumer: the all-gather stream. The wait
        # also lets the retired buffers go: their blocks may be reused by the allocation below.
        s.retired_unsharded.release()
        with rt.stream(s.all_gather):
            rt.point(Point.BEFORE_ALL_GATHER, group=self.name)
            full = rt.empty(self.layout.padded_numel, dtype=self.compute_dtype)
            src = self.flat_param_shard.detach()
            if self.compute_dtype != self.layout.dtype:
                # Allocated, written, read and freed on the all-gather stream: no hand-off.
                cast = rt.empty(self.layout.shard_numel, dtype=self.compute_dtype)
                rt.launch("cast_shard", lambda out, inp: out.copy_(inp), reads=(src,), writes=(cast,))
                src = cast
            rt.all_gather(full, src, group=self.mesh.shard_group)
            rt.point(Point.AFTER_ALL_GATHER, group=self.name)
            event = rt.new_event()
            event.record()
        self._gather = Unsharded(full, event)
        self.state = GroupState.GATHERING

    def wait_for_unshard(self) -> None:
        """Make compute (the default stream) wait for the all-gather; enqueue it first if needed."""
        if self.state is GroupState.UNSHARDED:
            return
        self.unshard()
        full, event = self._gather
        # Producer: the all-gather stream wrote `full`; consumer: default-stream compute, in forward
        # and (through saved-parameter handles) in backward, until reshard() drops `full`.
        self.streams.default.wait_event(event)
        self.runtime.point(Point.WAIT_ALL_GATHER, group=self.name)
        self._gather, self._full = None, full
        self.state = GroupState.UNSHARDED
        unsharded_storages.add(full, self)

    def unsharded_buffer(self) -> torch.Tensor:
        """The unsharded flat buffer (compute dtype, padded); only while UNSHARDED."""
        assert self._full is not None, f"group {self.name} is {self.state.value}, not unsharded"
        return self._full

    def unsharded_for_backward(self) -> torch.Tensor:
        """The unsharded buffer for a saved-parameter handle, all-gathered again if resharded."""
        self.wait_for_unshard()
        return self._full

    def expose_parameters(self) -> None:
        """Set each original parameter attribute to its view of `full` (an UnshardParams output)."""
        views = UnshardParams.apply(self, self.flat_param_shard)
        for info, view in zip(self.infos, views, strict=True):
            setattr(info.module, info.attr, view)

    def hide_parameters(self) -> None:
        for info in self.infos:
            info.module.__dict__.pop(info.attr, None)

    def reshard(self) -> None:
        """Drop the unsharded parameters; the block returns to the all-gather stream's pool."""
        if self.state is GroupState.SHARDED:
            return
        self.runtime.point(Point.RESHARD, group=self.name)
        self.hide_parameters()
        if self._full is not None:
            unsharded_storages.remove(self._full)
        # `full` (allocated on the all-gather stream) may still be read by queued default-stream
        # compute: retired, it lives until the all-gather stream has waited for the default stream
        # (the next unshard, or the end of backward). [Note: drop on the allocation stream's terms]
        self.streams.retired_unsharded.add(self._full if self._full is not None else self._gather.full)
        self._full = self._gather = None
        self.state = GroupState.SHARDED

    # -- gradients ---------------------------------------------------------------------------------
    def post_backward(self, grads) -> None:
        """UnshardParams.backward: every parameter's gradient of this backward is known."""
        if self.schedule is not None:
            self.schedule.backward_running()
        self.reducer.reduce_partial_gradients(grads, sync=self.requires_gradient_sync)
        self.reshard()

    def finish_backward(self) -> None:
        """Runs after the default stream waited for the reduction streams (end of backward)."""
        self.reducer.finish_backward()
        self.pre_backward_seen = False

    def zero_grad(self, *, set_to_none: bool) -> None:
        self.reducer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"<ParamGroup {self.name} {self.state.value} numel={self.numel} shard={self.shard_numel}>"
