"""Pinned host buffers as observers see them, on both backends: made, and released once the
host drops the last reference.

A non-blocking copy between the device and page-locked host memory is stream work: it returns at
once and lands when its stream gets to it, so the host must wait for that stream (an event, a
stream synchronization) before it reads the buffer. That is the hazard these buffers exist to
expose, and the detector needs their byte ranges to see it: the runtime reports each buffer on
`on_host_alloc`, and the detector charges the host's own reads and writes of it to the host
(racecheck.detect.observer, [Note: pinned host buffers]), which knows a queued copy complete only
after it waited for the copy's stream.

Lifetime follows CUDA's pinned-memory caching allocator, which records an event on every stream
that copied to or from a block and reuses it only after those events complete: `on_host_free`
defers the block to every stream of the runtime (a superset of the ones that used it). The CPU
emulation never reuses such a buffer early either: queued work keeps memory that is not the
device allocator's alive (sim_allocator.raw_view).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from racecheck.device.base import Runtime


def track_host_buffer(rt: Runtime, tensor: torch.Tensor) -> torch.Tensor:
    """Report `tensor`'s storage to `rt`'s observers as a pinned host buffer, and its death."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return tensor
    storage = tensor.untyped_storage()
    ptr = storage.data_ptr()
    rt._notify("on_host_alloc", ptr=ptr, nbytes=nbytes)
    # The storage's Python object lives exactly as long as the C++ storage (as in cuda.py).
    weakref.finalize(storage, _released, weakref.ref(rt), ptr, nbytes)
    return tensor


def _released(rt_ref: weakref.ref[Runtime], ptr: int, nbytes: int) -> None:
    rt = rt_ref()
    if rt is not None:
        rt._notify("on_host_free", ptr=ptr, nbytes=nbytes, deferred_to=rt.streams())
