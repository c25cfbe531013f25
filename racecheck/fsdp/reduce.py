"""Gradients from autograd to the optimizer: per group, accumulate the unsharded gradients into
`main_grad`, reduce-scatter it into a sharded gradient, all-reduce that across HSDP replicas and add
the result into the shard's `.grad`, each collective on its own stream; across groups, clip by the
global norm.

[Note: reduction buffers and their streams]
  buffer              allocated on         written by         read by            freed
  autograd grads      default (autograd)   default compute    copy-in on rs      by autograd after
                                                                                 the post-backward;
                                                                                 record_stream(rs)
  main_grad (A)       see main_grad.py     copy-in on rs      reduce-scatter     release() (policy)
  reduce output (B)   reduce_scatter       reduce-scatter     accumulate (rs or  host, at once (no
                                                              all_reduce)        HSDP), or held
                                                                                 until default and
                                                                                 rs wait for the
                                                                                 all-reduce
  shard .grad         rs (FSDP) or         accumulate         optimizer and      zero_grad(
                      all_reduce (HSDP)                       clipping, default  set_to_none=True),
                                                                                 after a wait
Drops follow [Note: drop on the allocation stream's terms] in streams.py: the shard's .grad is
dropped by zero_grad(set_to_none=True) after its allocation stream waited for the default stream
(the optimizer's reads), and a held HSDP reduce output after the reduce-scatter stream waited for
the all-reduce.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from racecheck.device import Point, Runtime
from racecheck.fsdp.flat_param import FlatLayout
from racecheck.fsdp.main_grad import HeldBuffer, MainGrad, MainGradPolicy
from racecheck.fsdp.mesh import Mesh
from racecheck.fsdp.streams import FSDPStreams

if TYPE_CHECKING:
    from racecheck.fsdp.param_group import ParamGroup


class GradReducer:
    """Reduces one group's gradients into `shard.grad` (the flat shard is an nn.Parameter)."""

    def __init__(
        self,
        *,
        name: str,
        layout: FlatLayout,
        shard: torch.nn.Parameter,
        mesh: Mesh,
        streams: FSDPStreams,
        runtime: Runtime,
        policy: MainGradPolicy,
        hold_reduce_output: bool,
        reduce_dtype: torch.dtype,
    ) -> None:
        self.name = name
        self.layout = layout
        self.shard = shard
        self.mesh = mesh
        self.streams = streams
        self.runtime = runtime
        self.hold_reduce_output = hold_reduce_output
        self.reduce_dtype = reduce_dtype
        self.main_grad = MainGrad(
            runtime=runtime,
            numel=layout.padded_numel,
            policy=policy,
            rs_stream=streams.reduce_scatter,
            dtype=reduce_dtype,
        )
        self._held: list[HeldBuffer] = []  # HSDP reduce outputs (hold_reduce_output)
        self.reduced_in_backward = False

    def reduce_partial_gradients(self, grads: Sequence[torch.Tensor | None], *, sync: bool) -> None:
        """Accumulate this backward's unsharded gradients (one per parameter, None where a parameter
        got none) into main_grad; with `sync`, reduce main_grad into the shard's gradient.

        Without `sync` (gradient accumulation without communication, like `no_sync`), main_grad
        keeps the sum until a backward with `sync` reduces it."""
        rt, s, mesh = self.runtime, self.streams, self.mesh
        # Producer: autograd wrote `grads` on the default stream; consumer: the copy-in below on
        # the reduce-scatter stream.
        s.reduce_scatter.wait_stream(s.default)
        with rt.stream(s.reduce_scatter):
            main_grad = self.main_grad.acquire()
            present = [
                (i.offset, i.numel, i.shape) for i, g in zip(self.layout.infos, grads, strict=True) if g is not None
            ]
            tensors = [g for g in grads if g is not None]
            for g in tensors:
                # Producer: default (autograd allocated and wrote g); consumer: rs, until the copy-in
                # runs. Autograd drops g right after this post-backward returns; record_stream keeps
                # its block out of the default pool until rs has passed this point.
                rt.record_stream(g, s.reduce_scatter)

            def copy_in(a, *gs):
                for (offset, numel, shape), g in zip(present, gs, strict=True):
                    a[offset : offset + numel].view(shape).add_(g)

            rt.launch("accumulate_main_grad", copy_in, reads=tensors, writes=(main_grad,))
            del tensors, grads
            if not sync:
                return  # main_grad lives on (on its policy's terms) until a synchronizing backward
            rt.point(Point.BEFORE_REDUCE_SCATTER, group=self.name)
            reduced = rt.empty(self.layout.shard_numel, dtype=self.reduce_dtype)
            rt.reduce_scatter(reduced, main_grad, group=mesh.shard_group)
            rt.point(Point.AFTER_REDUCE_SCATTER, group=self.name)
            # [Note: main_grad lifetime] in main_grad.py: the rebinding drops A here.
            del main_grad
            self.main_grad.release()
            if not mesh.config.is_hybrid:
                self._accumulate(reduced)  # same stream as the reduce-scatter: no hand-off
                return
        # Producer: the reduce-scatter stream wrote `reduced`; consumer: the all-reduce stream.
        s.all_reduce.wait_stream(s.reduce_scatter)
        with rt.stream(s.all_reduce):
            rt.point(Point.BEFORE_ALL_REDUCE, group=self.name)
            rt.all_reduce(reduced, group=mesh.replicate_group)
            rt.point(Point.AFTER_ALL_REDUCE, group=self.name)
            self._accumulate(reduced)
            if self.hold_reduce_output:
                # `reduced` was allocated on the reduce-scatter stream; released from the host now
                # it would go back to that pool while the all-reduce stream still uses it. Hold it
                # until the default stream has waited for the all-reduce (finish_backward).
                event = rt.new_event()
                event.record()
                self._held.append(HeldBuffer(reduced, event))

    def _accumulate(self, reduced: torch.Tensor) -> None:
        """Add the reduced gradient, averaged over the world, into the shard's .grad (current stream:
        the reduce-scatter stream for FSDP, the all-reduce stream for HSDP)."""
        rt = self.runtime
        acc = self.shard.grad
        if acc is None:
            # Allocated on this reduction stream, read by the optimizer on default after the
            # end-of-backward wait; see [Note: reduction buffers and their streams].
            acc = rt.zeros(self.layout.shard_numel, dtype=self.shard.dtype)
            self.shard.grad = acc
        scale = 1.0 / self.mesh.config.world_size
        rt.launch("accumulate_grad", lambda a, r: a.add_(r, alpha=scale), reads=(reduced,), writes=(acc,))
        self.reduced_in_backward = True

    def finish_backward(self) -> None:
        """Runs after the default stream waited for both reduction streams."""
        s = self.streams
        for held in self._held:
            # Producer: the all-reduce stream's last use of the held output; consumers: the default
            # stream (the optimizer reads what the all-reduce produced) and the reduce-scatter
            # stream, the output's allocation stream, whose wait makes the drop below safe
            # ([Note: drop on the allocation stream's terms] in streams.py).
            s.default.wait_event(held.event)
            s.reduce_scatter.wait_event(held.event)
        self._held.clear()
        self.main_grad.finish_backward()
        self.reduced_in_backward = False

    def zero_grad(self, *, set_to_none: bool) -> None:
        """Reset the shard's gradient and main_grad between steps (host, after the optimizer)."""
        rt = self.runtime
        if self.shard.grad is not None:
            if set_to_none:
                # Producer: the optimizer's reads on the default stream; consumer: the gradient's
                # allocation stream (a reduction stream), which waits for them before the drop.
                alloc = rt.allocation_stream(self.shard.grad)
                if alloc is not None:
                    alloc.wait_stream(rt.default_stream())
                self.shard.grad = None
            else:
                with rt.stream(rt.default_stream()):
                    rt.launch("zero_grad", lambda g: g.zero_(), writes=(self.shard.grad,))
        self.main_grad.zero_grad(set_to_none=set_to_none)


# -- across groups -------------------------------------------------------------------------------
# [Note: global gradient norm]
# Each rank holds a disjoint slice of every group's flat gradient, so the global norm is the sum of
# local p-th powers over the shard axis; HSDP replicas hold identical shards and are not summed.
# Padding elements have zero gradient and do not change it ([Note: flat layout and padding]).
# Everything runs on the default stream, after the end-of-backward wait made the gradients ready.


def clip_grad_norm_(groups: Sequence[ParamGroup], max_norm: float, *, norm_type: float = 2.0) -> torch.Tensor:
    """Scale every shard's gradient so that the global `norm_type` norm is at most `max_norm`, as
    torch.nn.utils.clip_grad_norm_ does on the unsharded parameters. Collective over the shard axis;
    returns the global norm before clipping (a 0-dim tensor on the runtime's device)."""
    norm_type = float(norm_type)
    if not (norm_type > 0 and math.isfinite(norm_type)):
        raise ValueError(f"norm_type must be a positive finite number, got {norm_type}")
    if not groups:
        raise ValueError("clip_grad_norm_: the module has no parameter groups")
    rt, mesh = groups[0].runtime, groups[0].mesh
    if any(g.mesh is not mesh for g in groups):
        raise ValueError("clip_grad_norm_ needs every group on one mesh")
    grads = [g.flat_param_shard.grad for g in groups if g.flat_param_shard.grad is not None]
    with rt.stream(rt.default_stream()):
        total = rt.zeros(1, dtype=torch.float32)
        if grads:

            def local_power_sum(out, *gs):
                norms = torch._foreach_norm([g.float() for g in gs], norm_type)
                out.copy_(torch.stack(norms).pow(norm_type).sum().reshape(1))

            rt.launch("grad_norm", local_power_sum, reads=grads, writes=(total,))
        # On the default stream, like the gradients it reads: no cross-stream hand-off.
        rt.all_reduce(total, group=mesh.shard_group)
        total_norm = total.pow(1.0 / norm_type).reshape(())
        if grads:

            def scale(*gs_and_norm):
                *gs, norm = gs_and_norm
                coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
                torch._foreach_mul_(gs, coef.to(gs[0].dtype))

            rt.launch("clip_grads", scale, reads=(total_norm,), writes=grads)
    return total_norm
