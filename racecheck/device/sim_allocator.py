"""The CPU emulation's caching allocator, with CUDA's caching-allocator stream semantics.

- Every block is tagged with the stream current on the host when it was handed out.
- When the last user reference to a block dies, it goes back to that stream's pool at once, even if
  work queued on another stream still reads it (CUDA frees on the host, not when kernels finish).
- An allocation on stream S reuses only S's pool: the smallest cached block that fits (best fit)
  after rounding the size up to 512 bytes, as CUDA does.
- `record_stream(t, s)`: at the free, an event is recorded on `s`; the block stays out of every pool
  until that event completes (checked when allocations are made, like CUDA's process_events).

Frees are seen through `weakref.finalize` on a per-allocation ndarray view: the user's tensor is
`torch.from_numpy(view)`, so the view dies exactly when the tensor's storage does. Queued work gets
*raw* views of the block's segment (`raw_view`), which do not reference the tracked view, so a
queued kernel never keeps a block alive.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from racecheck.device.base import block_size
from racecheck.device.pool_state import PoolState

if TYPE_CHECKING:
    from racecheck.device.base import Stream


class BlockState(enum.Enum):
    IN_USE = "in_use"
    DEFERRED = "deferred"  # freed, waiting for record_stream events
    CACHED = "cached"  # in its stream's pool


@dataclasses.dataclass(eq=False)
class Block:
    id: int
    stream: Stream  # the allocation stream
    segment: np.ndarray  # uint8 memory owned by the allocator, never by a tensor
    state: BlockState = BlockState.IN_USE
    recorded: set = dataclasses.field(default_factory=set)  # streams from record_stream
    deferred_events: list = dataclasses.field(default_factory=list)

    ptr: int = dataclasses.field(init=False)  # the segment's address: a segment never moves
    size: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.ptr = self.segment.ctypes.data
        self.size = self.segment.nbytes


@dataclasses.dataclass
class AllocatorStats:
    allocations: int = 0
    reuses: int = 0  # allocations served from a pool
    segments: int = 0  # fresh segments created
    frees: int = 0
    deferred_frees: int = 0


class SimCachingAllocator:
    """Per-stream pools of blocks over numpy segments. Thread-safe: frees can fire on any thread."""

    def __init__(self, *, on_free: Callable) -> None:
        self._lock = threading.RLock()
        self._pools: dict[object, list[Block]] = {}
        self._deferred: list[Block] = []
        self._live: dict[int, Block] = {}  # segment ptr -> in-use block
        self._segments: dict[int, Block] = {}  # segment ptr -> block, whatever its state
        self._ids = itertools.count()
        self._on_free = on_free
        self.stats = AllocatorStats()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, stream) -> tuple[torch.Tensor, Block]:
        """A tensor over a block of `stream`'s pool (or a new segment), and the block."""
        nbytes = math.prod(shape) * dtype.itemsize
        rounded = block_size(nbytes)
        with self._lock:
            self._process_deferred()
            block = self._take_cached(stream, rounded)
            if block is None:
                block = Block(next(self._ids), stream, np.empty(rounded, dtype=np.uint8))
                self._segments[block.ptr] = block
                self.stats.segments += 1
            else:
                self.stats.reuses += 1
            block.state = BlockState.IN_USE
            block.recorded = set()
            self._live[block.ptr] = block
            self.stats.allocations += 1
        # The tracked view: its death (with the tensor's storage) is the free.
        view = block.segment[:nbytes]
        weakref.finalize(view, self._free, block)
        tensor = torch.from_numpy(view).view(dtype).view(shape)
        return tensor, block  # the runtime reports the allocation (base.Runtime.empty)

    def _take_cached(self, stream, rounded: int) -> Block | None:
        pool = self._pools.setdefault(stream, [])
        fits = [b for b in pool if b.size >= rounded]
        if not fits:
            return None
        best = min(fits, key=lambda b: (b.size, b.id))
        pool.remove(best)
        return best

    def _free(self, block: Block) -> None:
        with self._lock:
            self._live.pop(block.ptr, None)
            self.stats.frees += 1
            deferred_to = sorted(block.recorded, key=lambda s: s.name)
            if deferred_to:
                block.state = BlockState.DEFERRED  # in no pool: not handed out until released below
                self.stats.deferred_frees += 1
            else:
                block.state = BlockState.CACHED
                self._pools.setdefault(block.stream, []).append(block)
        # Observers hear of a deferred free before its release events exist, so work they enqueue
        # now on a recorded stream (the perturbation's poison) runs before the block can be reused.
        self._on_free(block=block.id, stream=block.stream, ptr=block.ptr, nbytes=block.size, deferred_to=deferred_to)
        if deferred_to:
            with self._lock:
                # record_stream: the block may be reused only once every recorded stream has
                # passed this point. The events are recorded on those streams now, at the free.
                block.deferred_events = []
                for s in deferred_to:
                    ev = s.runtime.new_event()
                    ev.record_unobserved(s)  # internal to the allocator, as in CUDA
                    block.deferred_events.append(ev)
                self._deferred.append(block)

    def _process_deferred(self) -> None:
        for block in list(self._deferred):
            if all(ev.query() for ev in block.deferred_events):
                self._deferred.remove(block)
                block.deferred_events = []
                block.state = BlockState.CACHED
                self._pools.setdefault(block.stream, []).append(block)

    # -- lookups -------------------------------------------------------------------------------
    def block_of(self, tensor: torch.Tensor) -> Block | None:
        """The in-use block behind `tensor` (a view or offset into it included), or None."""
        ptr = tensor.untyped_storage().data_ptr()
        with self._lock:
            return self._live.get(ptr)

    def record_stream(self, tensor: torch.Tensor, stream) -> Block | None:
        block = self.block_of(tensor)
        if block is not None and stream is not block.stream:
            with self._lock:
                block.recorded.add(stream)
        return block

    def raw_view(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor over the same bytes as `tensor` that holds no claim on its block.

        Memory not from this allocator is returned as is (the queued work then keeps it alive,
        which is harmless: such memory is never reused by our pools)."""
        block = self.block_of(tensor)
        if block is None:
            return tensor
        if not tensor.is_contiguous():
            raise ValueError("queued work needs contiguous tensors")
        offset = tensor.data_ptr() - block.ptr
        nbytes = tensor.numel() * tensor.element_size()
        raw = block.segment[offset : offset + nbytes]  # a view of the segment, not of the tracked view
        return torch.from_numpy(raw).view(tensor.dtype).view(tensor.shape)

    def find(self, ptr: int) -> tuple[PoolState, int, int, object] | None:
        """The block at `ptr` as an allocator action sees it (pool_state.PoolView.find)."""
        with self._lock:
            block = self._segments.get(ptr)
            if block is None:
                return None
            if block.state is BlockState.CACHED:
                return PoolState.IN_POOL, ptr, block.size, block.stream
            state = PoolState.HELD if block.state is BlockState.DEFERRED else PoolState.TAKEN
            return state, ptr, 0, block.stream

    def segment_bytes(self, ptr: int, nbytes: int) -> np.ndarray:
        """The raw bytes [ptr, ptr + nbytes) of one of this allocator's segments, in any state
        (for the perturbation's poison-on-free). KeyError for memory that is not ours."""
        with self._lock:
            block = self._segments[ptr]
        if nbytes > block.size:
            raise ValueError(f"{nbytes} bytes requested from a block of {block.size}")
        return block.segment[:nbytes]
