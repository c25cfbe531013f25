"""The motivating fix, applied to megatron-fsdp 0.6.1 at runtime: `main_grad` allocated lazily.

As released, `megatron_fsdp/experimental/parameter_group.py` allocates each parameter group's
`main_grad` in `FsdpParameterGroup.__init__`, on whatever stream `fully_shard()` runs on (normally
the default stream). `reduce_partial_gradients`, which `FsdpModule._reduce_gradient_groups` calls
inside the reduce-scatter stream context, rebinds `self.main_grad` on the last microbatch (the
HSDP all-reduce returns a new buffer) while the reduce-scatter stream still has the copy out of the
old buffer queued. The caching allocator ties a block to its allocation stream, so the old block
goes back to the default stream's pool at once, and the default stream's next allocation (the next
layer's weight gradient) overwrites it before the reduce-scatter stream reads it.

The fix, as the motivating report describes it: `main_grad` becomes a property that materializes
the buffer on first access. The first access is inside `reduce_partial_gradients` (or the
`allocate_partial_grad_buffer` just before it), both inside the reduce-scatter stream context, so
the buffer is allocated on the stream that later drops it and its block only becomes reusable by
work ordered behind the reduce-scatter. An assertion pins "allocated and released on one stream".

Nothing in the installed package is edited: `install()` replaces the class attribute and wraps
`__init__` in this process only; `uninstall()` restores both.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron_fsdp.experimental.dbuffer import DBuffer
from megatron_fsdp.experimental.parameter_group import FsdpParameterGroup

_STATE = "_lazy_main_grad_state"


@dataclasses.dataclass
class _BufferSpec:
    """What `DBuffer(...)` needs to build a group's main_grad again."""

    mesh: object
    placements: tuple
    tensor_shapes: tuple
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, buffer: DBuffer) -> _BufferSpec:
        return cls(
            mesh=buffer.mesh,
            placements=buffer.placements,
            tensor_shapes=buffer.layout.tensor_shapes,
            dtype=buffer.dtype,
            device=buffer.device,
        )


@dataclasses.dataclass
class _MainGradState:
    """One group's main_grad: the buffer once materialized, how to build it, and the stream that
    was current when its storage was allocated."""

    buffer: DBuffer | None = None
    spec: _BufferSpec | None = None
    stream: torch.cuda.Stream | None = None


def _state(group: FsdpParameterGroup) -> _MainGradState:
    state = group.__dict__.get(_STATE)
    if state is None:
        state = group.__dict__[_STATE] = _MainGradState()
    return state


def _storage(buffer: DBuffer) -> int:
    return buffer.local_buffer.untyped_storage().data_ptr()


class LazyMainGrad:
    """The data descriptor that replaces `FsdpParameterGroup.main_grad`."""

    def __get__(self, group, owner=None):
        if group is None:
            return self
        state = _state(group)
        if state.buffer is None and state.spec is not None:
            # First use: allocated on the current stream, which is the reduce-scatter stream
            # (FsdpModule._reduce_gradient_groups enters its context before the first access).
            spec = state.spec
            state.buffer = DBuffer(
                mesh=spec.mesh,
                placements=spec.placements,
                tensor_shapes=spec.tensor_shapes,
                dtype=spec.dtype,
                device=spec.device,
            )
            state.stream = torch.cuda.current_stream(spec.device)
        return state.buffer

    def __set__(self, group, value) -> None:
        state = _state(group)
        old = state.buffer
        if old is not None and value is not None and _storage(old) == _storage(value):
            state.buffer = value  # a relabel (Replicate -> Partial): the same storage, same stream
            return
        if old is not None:
            # Rebinding drops the old buffer's storage on the current stream: it must be the
            # stream it was allocated on, or its block is reusable before that stream's queued
            # readers of it have run.
            current = torch.cuda.current_stream(old.device)
            assert current == state.stream, f"main_grad allocated on {state.stream} is released on {current}"
        state.buffer = value
        state.stream = None if value is None else torch.cuda.current_stream(value.device)


_original_init = None


def _lazy_init(self, *args, **kwargs) -> None:
    _original_init(self, *args, **kwargs)
    state = _state(self)
    if state.buffer is not None:
        # The released __init__ built main_grad eagerly (it reads its dtype and layout there).
        # Keep how to build it and drop the buffer: its block returns to the default stream's pool
        # before any other stream has been given work on it, so nothing can read it late.
        state.spec = _BufferSpec.of(state.buffer)
        state.buffer = None
        state.stream = None


def install() -> None:
    """Make main_grad lazy in every FsdpParameterGroup built from now on (idempotent)."""
    global _original_init
    if _original_init is not None:
        return
    _original_init = FsdpParameterGroup.__init__
    FsdpParameterGroup.__init__ = _lazy_init
    FsdpParameterGroup.main_grad = LazyMainGrad()


def uninstall() -> None:
    """Restore the released class."""
    global _original_init
    if _original_init is None:
        return
    FsdpParameterGroup.__init__ = _original_init
    del FsdpParameterGroup.main_grad
    _original_init = None


def installed() -> bool:
    return _original_init is not None
