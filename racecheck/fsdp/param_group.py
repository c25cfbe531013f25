"""One parameter group: a module's parameters flattened into one padded buffer, sharded over the
mesh's shard axis, unsharded by all-gather for compute and reduced by reduce-scatter (and, for
HSDP, all-reduce across replicas) after backward.

[Note: group buffers and their streams]
  shard (flat_param_shard)  default stream   the optimizer's parameter; lives for the model's life
  unsharded parameters      all_gather       produced by the all-gather, consumed by default-stream
                                             compute; dropped after backward (or forward)
  main_grad (A)             see main_grad.py  unsharded gradient, read by the reduce-scatter
  reduce output (B)         reduce_scatter   sharded gradient, read by the all-reduce (HSDP) and
                                             the accumulation; held until the default stream waits
  grad accumulator          reduction stream the shard's .grad, read by the optimizer on default
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
from torch import nn

from racecheck.device import Event, Runtime
from racecheck.fsdp.main_grad import HeldBuffer, MainGrad, MainGradPolicy
from racecheck.fsdp.mesh import Mesh
from racecheck.fsdp.streams import FSDPStreams


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """Where one original parameter lives inside the group's flat buffer."""

    fqn: str
    module: nn.Module
    attr: str
    shape: torch.Size
    offset: int
    numel: int


class Unsharded(NamedTuple):
    """All-gather output travelling from the all-gather stream to compute, with its event."""

    full: torch.Tensor
    event: Event


class ParamGroup:
    def __init__(self, module: nn.Module, *, name: str, mesh: Mesh, streams: FSDPStreams,
                 runtime: Runtime, main_grad_policy: MainGradPolicy, hold_reduce_output: bool) -> None:
        self.name = name
        self.mesh = mesh
        self.streams = streams
        self.runtime = runtime
        self.hold_reduce_output = hold_reduce_output
        self.infos = self._collect(module)
        self.numel = sum(i.numel for i in self.infos)
        shards = mesh.config.shard
        self.padded_numel = math.ceil(self.numel / shards) * shards
        self.shard_numel = self.padded_numel // shards
        self.flat_param_shard = self._make_shard()
        module.register_parameter("flat_param_shard", self.flat_param_shard)
        self.main_grad = MainGrad(runtime=runtime, numel=self.padded_numel, policy=main_grad_policy,
                                  rs_stream=streams.reduce_scatter)
        self._unsharded: Unsharded | None = None
        self._flat: torch.Tensor | None = None  # the autograd leaf over the unsharded parameters
        self._held: list[HeldBuffer] = []
        self.reduced_in_backward = False

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def _collect(module: nn.Module) -> list[ParamInfo]:
        infos, offset = [], 0
        for mod_name, mod in module.named_modules():
            for attr, p in list(mod._parameters.items()):
                if p is None or getattr(p, "_racecheck_flat_shard", False):
                    continue  # already managed by a nested fully_shard
                fqn = f"{mod_name}.{attr}" if mod_name else attr
                infos.append(ParamInfo(fqn, mod, attr, p.shape, offset, p.numel()))
                offset += p.numel()
        if not infos:
            raise ValueError("fully_shard: the module has no parameters left to shard")
        return infos

    def _make_shard(self) -> nn.Parameter:
        rt = self.runtime
        flat = torch.zeros(self.padded_numel)
        with torch.no_grad():
            for info in self.infos:
                flat[info.offset:info.offset + info.numel] = info.module._parameters[info.attr].reshape(-1)
        start = self.mesh.shard_index * self.shard_numel
        with rt.stream(rt.default_stream()):
            shard = rt.empty(self.shard_numel)
        shard.copy_(flat[start:start + self.shard_numel])
        for info in self.infos:
            del info.module._parameters[info.attr]  # replaced by views of the unsharded buffer
        param = nn.Parameter(shard)
        param._racecheck_flat_shard = True
        return param

    # -- unshard / reshard -----------------------------------------------------------------------
    def unshard(self) -> None:
        """Enqueue the all-gather of this group's parameters (no wait: compute waits later)."""
        if self._unsharded is not None or self._flat is not None:
            return
        rt, s = self.runtime, self.streams
        # Producer: the optimizer wrote the shard on the default stream; consumer: the all-gather.
        s.all_gather.wait_stream(s.default)
        with rt.stream(s.all_gather):
            rt.point("before_all_gather", group=self.name)
            full = rt.empty(self.padded_numel)
            rt.all_gather(full, self.flat_param_shard.detach(), group=self.mesh.shard_group)
            rt.point("after_all_gather", group=self.name)
            event = rt.new_event()
            event.record()
        self._unsharded = Unsharded(full, event)

    def wait_for_unshard(self) -> None:
        """Make compute (default stream) wait for the all-gather, then expose parameter views."""
        if self._flat is not None:
            return
        self.unshard()
        full, event = self._unsharded
        # Producer: all-gather stream; consumer: default-stream compute. `full` is allocated on the
        # all-gather stream and released from the host after backward; the next all-gather first
        # waits for the default stream, so a reuse of its block is ordered after this compute.
        self.streams.default.wait_event(event)
        self.runtime.point("wait_all_gather", group=self.name)
        flat = full[: self.numel].detach().requires_grad_(torch.is_grad_enabled())
        for info in self.infos:
            setattr(info.module, info.attr, flat[info.offset:info.offset + info.numel].view(info.shape))
        if flat.requires_grad:
            flat.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._flat = flat
        self._unsharded = None

    def reshard(self) -> None:
        """Drop the unsharded parameters (the block returns to the all-gather stream's pool)."""
        self.runtime.point("reshard", group=self.name)
        for info in self.infos:
            if info.attr in info.module.__dict__:
                delattr(info.module, info.attr)
        self._flat = None
        self._unsharded = None

    @property
    def is_unsharded(self) -> bool:
        return self._flat is not None

    # -- gradients -------------------------------------------------------------------------------
    def _on_grad_ready(self, flat: torch.Tensor) -> None:
        grad = flat.grad
        flat.grad = None
        self.reduce_partial_gradients(grad)
        self.reshard()
        from racecheck.fsdp.api import backward_pass  # late import: api imports this module

        backward_pass(self.runtime).group_reduced(self)

    def reduce_partial_gradients(self, grad: torch.Tensor) -> None:
        """Accumulate `grad` into main_grad and reduce it into the shard's gradient."""
        rt, s, mesh = self.runtime, self.streams, self.mesh
        n = self.numel
        # Producer: autograd wrote `grad` on the default stream; consumer: the reduce-scatter stream.
        s.reduce_scatter.wait_stream(s.default)
        with rt.stream(s.reduce_scatter):
            main_grad = self.main_grad.acquire()
            rt.launch("accumulate_main_grad", lambda a, g: a[:n].add_(g.reshape(-1)),
                      reads=(grad,), writes=(main_grad,))
            rt.point("before_reduce_scatter", group=self.name)
            reduced = rt.empty(self.shard_numel)
            rt.reduce_scatter(reduced, main_grad, group=mesh.shard_group)
            rt.point("after_reduce_scatter", group=self.name)
            # [Note: main_grad lifetime] in main_grad.py: the rebinding drops A here.
            del main_grad
            self.main_grad.release()
            if not mesh.config.is_hybrid:
                self._accumulate(reduced)  # same stream as the reduce-scatter: no hand-off
                return
        # Producer: reduce-scatter stream wrote `reduced`; consumer: the all-reduce stream.
        s.all_reduce.wait_stream(s.reduce_scatter)
        with rt.stream(s.all_reduce):
            rt.point("before_all_reduce", group=self.name)
            rt.all_reduce(reduced, group=mesh.replicate_group)
            rt.point("after_all_reduce", group=self.name)
            self._accumulate(reduced)
            if self.hold_reduce_output:
                # `reduced` was allocated on the reduce-scatter stream; released from the host now
                # it would go back to that pool while the all-reduce still uses it. Hold it until
                # the default stream has waited for the all-reduce (finish_backward).
                event = rt.new_event()
                event.record()
                self._held.append(HeldBuffer(reduced, event))

    def _accumulate(self, reduced: torch.Tensor) -> None:
        """Add the reduced gradient, averaged over the world, into the shard's .grad (current stream)."""
        rt = self.runtime
        acc = self.flat_param_shard.grad
        if acc is None:
            acc = rt.zeros(self.shard_numel)
            self.flat_param_shard.grad = acc
        scale = 1.0 / self.mesh.config.world_size
        rt.launch("accumulate_grad", lambda a, r: a.add_(r, alpha=scale), reads=(reduced,), writes=(acc,))
        self.reduced_in_backward = True

    def finish_backward(self) -> None:
        """Runs after the default stream waited for both reduction streams."""
        default = self.streams.default
        for held in self._held:
            default.wait_event(held.event)
        self._held.clear()
        self.main_grad.finish_backward()
        self.reduced_in_backward = False

    def zero_grad(self, *, set_to_none: bool) -> None:
        self.main_grad.zero_grad(set_to_none=set_to_none)
