"""`fully_shard`: shard a module's parameters into one parameter group and hook it into forward
and backward, in the style of PyTorch's FSDP2 (the module's class is swapped to add FSDP methods).

Call it on each submodule that should be its own group, then on the root. The optimizer takes
`model.parameters()`, which are the groups' flat shards; any torch.optim optimizer works on them.
The root is the outermost fully_shard module whose forward runs; at its first forward it creates
the Schedule that every group under it shares (prefetch_order.py).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_map_only
from torch.utils.hooks import RemovableHandle

from racecheck.device import Runtime, get_runtime
from racecheck.fsdp import state_dict
from racecheck.fsdp.config import GroupOptions, MixedPrecisionPolicy
from racecheck.fsdp.flat_param import SHARD_MARK, materialize_buffers
from racecheck.fsdp.main_grad import MainGradPolicy
from racecheck.fsdp.mesh import Mesh
from racecheck.fsdp.param_group import ParamGroup
from racecheck.fsdp.prefetch_order import Schedule
from racecheck.fsdp.reduce import clip_grad_norm_
from racecheck.fsdp.streams import fsdp_streams

# Group names: unique in the process and, as every rank shards its model in the same order, equal
# on every rank (an address would be neither).
_GROUP_NUMBERS = itertools.count(1)


class FSDPState:
    """What fully_shard attaches to one module: its group (None when no parameters are left to
    shard) and the forward hooks that drive it, kept as handles (`hooks`) so they can be removed."""

    def __init__(self, module: nn.Module, group: ParamGroup | None, *, runtime: Runtime, options: GroupOptions) -> None:
        self.module = module
        self.group = group
        self.runtime = runtime
        self.options = options
        self.schedule: Schedule | None = None
        self.is_root = False
        self.hooks: tuple[RemovableHandle, ...] = ()  # forward pre-hook and forward hook, while attached

    def attach_hooks(self) -> None:
        """Drive the group from the module's forward (fully_shard does this once)."""
        if self.hooks:
            return
        self.hooks = (
            self.module.register_forward_pre_hook(self.pre_forward, prepend=True, with_kwargs=True),
            self.module.register_forward_hook(self.post_forward),
        )

    def remove_hooks(self) -> None:
        """Undo attach_hooks: the module's forward no longer unshards, reshards or hooks backward."""
        for handle in self.hooks:
            handle.remove()
        self.hooks = ()

    def pre_forward(self, module: nn.Module, args, kwargs):
        if self.schedule is None:
            self._lazy_init()
        if self.is_root:
            self.schedule.root_pre_forward()
        dtype = self.options.mixed_precision.param_dtype
        if dtype is not None and self.options.mixed_precision.cast_forward_inputs:
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: t.to(dtype) if torch.is_floating_point(t) else t, (args, kwargs)
            )
        if self.group is not None:
            self.schedule.group_pre_forward(self.group)
        return args, kwargs

    def post_forward(self, module: nn.Module, args, output) -> None:
        if self.group is not None:
            self.schedule.group_post_forward(self.group, output)
        if self.is_root:
            self.schedule.root_post_forward()

    def _lazy_init(self) -> None:
        """This state's forward ran first: it is the root of every fully_shard module below it."""
        states = [m._racecheck_state for m in self.module.modules() if isinstance(m, FSDPModule)]
        groups = [st.group for st in states if st.group is not None]
        schedule = Schedule(runtime=self.runtime, streams=fsdp_streams(self.runtime), groups=groups)
        for st in states:
            st.schedule, st.is_root = schedule, st is self
            if st.group is not None:
                st.group.schedule = schedule
                if st.options.reshard_after_forward is None:
                    # Backward needs the root's parameters first: keep them (FSDP2's heuristic).
                    st.group.reshard_after_forward = not st.is_root


class FSDPModule:
    """Methods mixed into a module's class by fully_shard."""

    _racecheck_state: FSDPState

    @property
    def _racecheck_group(self) -> ParamGroup | None:
        return self._racecheck_state.group

    @property
    def fsdp_state(self) -> FSDPState:
        """What fully_shard attached to this module: its group, its schedule, its hook handles."""
        return self._racecheck_state

    def remove_fsdp_hooks(self) -> None:
        """Remove fully_shard's forward hooks from this module and every fully_shard module below
        it. The groups keep their shards and state; `unshard()`/`reshard()` still drive them by
        hand, and `fsdp_state.attach_hooks()` puts a module's hooks back."""
        for m in self.modules():
            if isinstance(m, FSDPModule):
                m._racecheck_state.remove_hooks()

    def param_groups(self) -> list[ParamGroup]:
        return [
            m._racecheck_state.group
            for m in self.modules()
            if isinstance(m, FSDPModule) and m._racecheck_state.group is not None
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups():
            group.zero_grad(set_to_none=set_to_none)
        for p in self.parameters():  # parameters no fully_shard manages, if any
            if not getattr(p, SHARD_MARK, False) and p.grad is not None:
                p.grad = None if set_to_none else p.grad.zero_()

    def unshard(self) -> None:
        if self._racecheck_group is not None:
            self._racecheck_group.unshard()

    def reshard(self) -> None:
        if self._racecheck_group is not None:
            self._racecheck_group.reshard()

    # -- gradient accumulation ---------------------------------------------------------------------
    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """False: backward accumulates unsharded gradients in main_grad without communication; the
        next backward with True reduces the sum (FSDP2's name for DDP's no_sync)."""
        for group in self.param_groups():
            group.requires_gradient_sync = bool(requires_gradient_sync)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.set_requires_gradient_sync(True)

    # -- across all shards -------------------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return clip_grad_norm_(self.param_groups(), max_norm, norm_type=norm_type)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return state_dict.full_state_dict(self)

    def load_full_state_dict(self, sd: dict[str, torch.Tensor], *, strict: bool = True) -> None:
        state_dict.load_full_state_dict(self, sd, strict=strict)

    def sharded_state_dict(self) -> dict[str, torch.Tensor]:
        return state_dict.sharded_state_dict(self)

    def load_sharded_state_dict(self, sd: dict[str, torch.Tensor], *, strict: bool = True) -> None:
        state_dict.load_sharded_state_dict(self, sd, strict=strict)

    def init_parameters(
        self, init_fn: Callable[[nn.Module], None] | None = None, *, device: torch.device | str | None = None
    ) -> None:
        state_dict.init_parameters(self, init_fn, device=device)


def fully_shard(
    module: nn.Module,
    *,
    mesh: Mesh,
    main_grad_policy: str | MainGradPolicy = "fixed",
    hold_reduce_output: bool = True,
    reshard_after_forward: bool | None = None,
    prefetch: bool = True,
    mixed_precision: MixedPrecisionPolicy | None = None,
    runtime: Runtime | None = None,
) -> nn.Module:
    """Shard `module`'s parameters that no nested fully_shard manages into one group.

    Options: see config.GroupOptions. A module built on the meta device is sharded without values;
    fill them with `model.init_parameters()` or `model.load_full_state_dict(...)`."""
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard was already applied to this {type(module).__name__}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a racecheck.fsdp.Mesh, got {type(mesh).__name__}")
    runtime = runtime or get_runtime()
    options = GroupOptions(
        main_grad_policy=main_grad_policy,
        hold_reduce_output=hold_reduce_output,
        reshard_after_forward=reshard_after_forward,
        prefetch=prefetch,
        mixed_precision=mixed_precision or MixedPrecisionPolicy(),
    )
    materialize_buffers(module, runtime.device)
    group = None
    if any(not getattr(p, SHARD_MARK, False) for p in module.parameters()):
        name = f"{type(module).__name__}#{next(_GROUP_NUMBERS)}"
        group = ParamGroup(
            module, name=name, mesh=mesh, streams=fsdp_streams(runtime), runtime=runtime, options=options
        )
    state = FSDPState(module, group, runtime=runtime, options=options)
    module._racecheck_state = state
    state.attach_hooks()
    cls = type(module)
    module.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return module
