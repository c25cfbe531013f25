"""Strategies for the lifetime of a parameter group's unsharded gradient buffer, `main_grad`.

`main_grad` (call it A) accumulates the unsharded gradient of a group on the reduce-scatter stream;
`reduce_partial_gradients` reduce-scatters A into a new sharded buffer B and drops A. Whether that
drop is safe depends on where A was allocated. Each strategy is one arm of the motivating race.

[Note: main_grad lifetime]
The caching allocator returns a block to its *allocation* stream's pool as soon as the last
reference dies (see racecheck.device.base [Note: allocator semantics]). If A was allocated on the
default stream and dropped while the reduce-scatter that reads it is still queued on the
reduce-scatter stream, the next default-stream allocation of that size reuses A's block and
overwrites it before the collective reads it: silently wrong gradients. The safe strategies either
allocate and release A on the reduce-scatter stream (`fixed`), tell the allocator about the
cross-stream use (`record_stream`), or keep A alive until the default stream has waited for the
reduce-scatter (`hold_until_wait`, FSDP2's way).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from racecheck.device import Event, Runtime, Stream


class MainGradPolicy(enum.StrEnum):
    BASELINE = "baseline"  # eager allocation on the default stream: the race
    FIXED = "fixed"  # lazy allocation inside the reduce-scatter stream context
    RECORD_STREAM = "record_stream"  # eager allocation + A.record_stream(rs_stream)
    HOLD_UNTIL_WAIT = "hold_until_wait"  # eager allocation + keep A until the default stream waits


class HeldBuffer(NamedTuple):
    """A buffer kept alive until the default stream has waited for `event` (its last use)."""

    tensor: torch.Tensor
    event: Event


class MainGrad:
    """Owns a group's `main_grad` buffer under one policy.

    `acquire()` is called on the host inside the reduce-scatter stream context and returns A (the
    same A for every backward until a release: gradient accumulation without sync adds into it);
    `release(A)` is called right after the reduce-scatter reading A was enqueued, still inside
    that context; `finish_backward()` runs after the default stream waited for the reduction."""

    def __init__(
        self,
        *,
        runtime: Runtime,
        numel: int,
        policy: MainGradPolicy,
        rs_stream: Stream,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.runtime = runtime
        self.numel = numel
        self.dtype = dtype
        self.policy = MainGradPolicy(policy)
        self.rs_stream = rs_stream
        self._buffer: torch.Tensor | None = None
        self._held: list[HeldBuffer] = []
        if self.policy is not MainGradPolicy.FIXED:
            self._allocate_eagerly()

    def _allocate_eagerly(self) -> None:
        # Eager: allocated on whatever stream the host is on (the default stream in __init__ and
        # after each reduction), zero-filled there; the reduce-scatter stream uses it later.
        with self.runtime.stream(self.runtime.default_stream()):
            self._buffer = self.runtime.zeros(self.numel, dtype=self.dtype)

    def acquire(self) -> torch.Tensor:
        if self._buffer is None:
            # Lazy (fixed): first access is inside the reduce-scatter stream context, so the block
            # is tagged with the stream that will read it and later release it.
            assert self.policy is MainGradPolicy.FIXED, "only the lazy policy starts empty"
            self._buffer = self.runtime.zeros(self.numel, dtype=self.dtype)
        return self._buffer

    def release(self) -> None:
        """Drop A after the reduce-scatter that reads it was enqueued on the reduce-scatter stream.

        The caller must hold no reference to A: this drop is the last one, as in the rebinding
        `self.main_grad = B` of the motivating code."""
        rt = self.runtime
        buffer, self._buffer = self._buffer, None
        assert buffer is not None, "release() without acquire()"
        if self.policy is MainGradPolicy.FIXED:
            # Allocated and released on one stream: the block can only be reused by allocations
            # already ordered behind the reduce-scatter.
            assert rt.allocation_stream(buffer) is rt.current_stream(), (
                "main_grad must be allocated and released on the reduce-scatter stream"
            )
        elif self.policy is MainGradPolicy.RECORD_STREAM:
            # Producer: the default stream allocated A; consumer: the reduce-scatter stream.
            # The allocator keeps A's block out of the default pool until rs passes this point.
            rt.record_stream(buffer, self.rs_stream)
        elif self.policy is MainGradPolicy.HOLD_UNTIL_WAIT:
            # Keep A with an event marking the reduce-scatter's last read of it; the default
            # stream waits on that event in finish_backward() before the reference is dropped.
            event = rt.new_event()
            event.record(self.rs_stream)
            self._held.append(HeldBuffer(buffer, event))
        del buffer  # BASELINE: A's block goes straight back to the default stream's pool
        if self.policy is not MainGradPolicy.FIXED:
            self._allocate_eagerly()

    def finish_backward(self) -> None:
        """After the reduction: release held buffers once the default stream has waited for them."""
        default = self.runtime.default_stream()
        for held in self._held:
            # Producer: the reduce-scatter stream's last read of A (the held event); consumer: the
            # default stream, A's allocation stream, whose later allocations may reuse A's block
            # once the reference below is dropped.
            default.wait_event(held.event)
        self._held.clear()

    def zero_grad(self, *, set_to_none: bool) -> None:
        """Reset the accumulation buffer between steps (each arm keeps its own allocation rule)."""
        if self._buffer is None:
            return
        if set_to_none:
            self._buffer = None
            if self.policy is not MainGradPolicy.FIXED:
                self._allocate_eagerly()
        else:
            # Producer: the reduce-scatter stream accumulated into A, and the end-of-backward wait
            # ordered the default stream after it; consumer: this zero on the default stream, which
            # the next copy-in follows (reduce_scatter.wait_stream(default)). A lives on.
            with self.runtime.stream(self.runtime.default_stream()):
                buf = self._buffer
                self.runtime.launch("zero_", lambda out: out.zero_(), writes=(buf,))
