"""How parameter groups plug into autograd: a Function that hands the unsharded parameters to the
module and receives their gradients, saved-tensor hooks that let a group free its unsharded
parameters after forward, and pre-backward hooks on module outputs.

[Note: reshard after forward]
Autograd keeps every tensor an op saves for backward; a Linear saves its weight. If the weight were
a plain view of the all-gather output, autograd would keep the whole unsharded buffer alive from
forward until backward, and "resharding" would free nothing. So:
1. The module's parameters are the outputs of `UnshardParams.apply(group, shard)`: views of the
   group's unsharded buffer `full`, with UnshardParams as their grad_fn. No autograd leaf owns
   `full`; the group holds the only reference that outlives forward.
2. While the root module's forward runs, `saved_tensors_hooks(pack, unpack)` is active. `pack`
   recognizes a saved tensor whose storage is some group's `full` (a parameter, or a view such as
   `weight.t()`) and saves a `SavedParam` handle (group, offset, size, stride) instead of the
   tensor; any other tensor is saved as usual.
3. After the module's forward, the group may drop `full` (reshard). In backward, `unpack` asks the
   group for its unsharded buffer, all-gathering it again if it was resharded (the pre-backward
   hook has normally done so already), and rebuilds the view with `as_strided`.
4. When every parameter's gradient is known, autograd calls `UnshardParams.backward` once with one
   gradient per parameter (None for unused ones): that is the group's post-backward, where the
   gradients are reduced and the group reshards. It returns no gradient for the shard; the reducer
   writes the shard's `.grad` itself, on a reduction stream.
The engine runs UnshardParams.backward of group i+1 before any node of group i (its sequence number
is higher), so at most two groups are unsharded at once in backward: the one computing and the one
prefetched.

Limits: an inner `saved_tensors_hooks` (activation checkpointing, offloading) replaces ours for the
ops under it, so their saved parameters keep `full` alive (correct, but not resharded); parameters
must not be modified in place in forward; double backward is not supported.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    from racecheck.fsdp.param_group import ParamGroup


class UnshardParams(torch.autograd.Function):
    """Forward: the group's parameters as views of its unsharded buffer. Backward: the group's
    post-backward (reduce, reshard). See [Note: reshard after forward]."""

    @staticmethod
    def forward(ctx, group: ParamGroup, shard: torch.Tensor):
        ctx.group = group
        ctx.set_materialize_grads(False)  # unused parameters arrive as None, not as zeros
        return tuple(group.layout.views(group.unsharded_buffer()))

    @staticmethod
    def backward(ctx, *grads):
        ctx.group.post_backward(grads)
        return None, None


class SavedParam(NamedTuple):
    """What autograd saves in place of a tensor that lives in a group's unsharded buffer."""

    group: ParamGroup
    offset: int  # elements from the start of the unsharded buffer
    size: torch.Size
    stride: tuple[int, ...]


class _Registry:
    """Which storage belongs to which unsharded group (storage data pointer -> group)."""

    def __init__(self) -> None:
        self._by_ptr: dict[int, ParamGroup] = {}
        self._lock = threading.Lock()

    def add(self, full: torch.Tensor, group: ParamGroup) -> None:
        with self._lock:
            self._by_ptr[full.untyped_storage().data_ptr()] = group

    def remove(self, full: torch.Tensor) -> None:
        with self._lock:
            self._by_ptr.pop(full.untyped_storage().data_ptr(), None)

    def owner(self, t: torch.Tensor) -> ParamGroup | None:
        if not self._by_ptr or t.layout is not torch.strided or t.is_nested:
            return None
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # tensors without a plain storage
            return None
        return self._by_ptr.get(ptr)


unsharded_storages = _Registry()


def pack(t: torch.Tensor):
    group = unsharded_storages.owner(t)
    if group is None:
        return t
    full = group.unsharded_buffer()
    if t.dtype != full.dtype:
        return t  # a reinterpreting view: save it as is (keeps `full` alive, still correct)
    return SavedParam(group, t.storage_offset() - full.storage_offset(), t.size(), t.stride())


def unpack(saved):
    if not isinstance(saved, SavedParam):
        return saved
    full = saved.group.unsharded_for_backward()
    return full.as_strided(saved.size, saved.stride, full.storage_offset() + saved.offset)


class SavedParamHooks:
    """`saved_tensors_hooks(pack, unpack)`, entered in the root's pre-forward and exited in its
    post-forward (hooks cannot wrap the forward in a `with`)."""

    def __init__(self) -> None:
        self._active: torch.autograd.graph.saved_tensors_hooks | None = None

    def enter(self) -> None:
        self.exit()  # a forward that raised never reached its post-forward
        self._active = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._active.__enter__()

    def exit(self) -> None:
        if self._active is not None:
            active, self._active = self._active, None
            active.__exit__(None, None, None)


def register_pre_backward(output, hook) -> None:
    """Call `hook()` when the gradient of any tensor in `output` that requires grad is computed, i.e.
    when backward reaches the module that produced it (the hook must tolerate repeated calls)."""
    tensors, _ = tree_flatten(output)
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(lambda grad: hook())  # returns None: the gradient is unchanged
