"""A CPU stand-in for the CUDA caching allocator's trace callbacks, so that the PyTorch tracker
(torch_tracker.py) can run a whole training loop, and be measured, without a GPU.

On CUDA, the allocator calls the tracker's allocation callback while the allocating operator runs
and its free callback when the block's last reference dies. On the CPU there are no such
callbacks; `AllocatorTrace` is a dispatch mode, entered *inside* the tracker's mode, that calls the
allocation callback for every output storage it has not seen before (right after the operator
returns, still inside the tracker's call to it, as on CUDA) and the free callback when that
storage dies (a weakref finalizer on the storage, which PyTorch keeps alive exactly as long as the
C++ storage). Storages created outside any operator (tensors from before the mode) are left to the
tracker's adoption.

    with AllocatorTrace(tracker.handler._handle_memory_allocation,
                        tracker.handler._handle_memory_deallocation), tracker:
        train_step()
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from racecheck.detect.dispatch import returned_tensors


class AllocatorTrace(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # never runs under Dynamo; see torch_hooks.TrackerMode

    def __init__(self, on_alloc: Callable[[int], None], on_free: Callable[[int], None]) -> None:
        super().__init__()
        self.on_alloc, self.on_free = on_alloc, on_free
        self.live: set[int] = set()

    def _died(self, ptr: int) -> None:
        self.live.discard(ptr)
        self.on_free(ptr)

    def _seen(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # a DTensor: its local tensor's storage is the memory
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self.live:
            self.live.add(ptr)
            self.on_alloc(ptr)
            weakref.finalize(storage, self._died, ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in returned_tensors(out):
            self._seen(t)
        return out
