"""The PyTorch tracker's bookkeeping of host memory that streams touch ([Note: host accesses]):
the part of TorchRaceTracker (torch_tracker.py) that both of its paths share, the Python path
from tensors and the native loop (feed_apply.py) from log items.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HOST = "host operations"  # the engine key of the host's own work on tracked host memory


class HostAccesses:
    """TorchRaceTracker's host memory: which tracked host allocations streams touched, and which
    are pinned; the rest it reads is the tracker's."""

    # The tracker's (TorchRaceTracker.__init__ sets them).
    engine: Any
    device_type: str
    host: Any
    domains: Any
    ops: int
    current: Callable[[], int]
    capture: Callable[[], Any]

    def __init__(self) -> None:
        self._host_touched: dict[int, set] = {}  # host allocation start -> stream keys that touched it
        self._host_pinned: dict[int, bool] = {}  # tracked host allocations (all pinned)
        # tracked host allocation start -> ids of the live storages seen starting there ([Note: host
        # accesses]: the allocation is freed when the last of them dies)
        self._host_storages: dict[int, set[int]] = {}

    def key(self, stream: int) -> int:
        raise NotImplementedError  # the tracker's: `stream`, known to the engine from now on

    def _guard(self, fn, *args) -> None:
        raise NotImplementedError  # the tracker's: fn(*args), an error kept rather than raised

    # [Note: host accesses]
    # Host memory that a stream reads or writes (a pinned buffer a non-blocking copy fills or
    # drains) takes part in happens-before. A copy between host and device memory is stream work
    # on both sides; the host memory is tracked from then on, as an allocation the host owns,
    # until its storage dies (then its reuse waits for the streams that touched it, as CUDA's
    # pinned-memory allocator waits for their events). A later operation of the host's own on
    # that memory (`host.sum()`, `host.fill_()`) is an access by the host: it must follow every
    # stream access it conflicts with through a host synchronization (a stream, event or device
    # synchronize; a blocking copy; `.item()`), and once it returns, work enqueued afterwards on
    # any stream follows it. A copy is asynchronous only when it is non_blocking and every host
    # tensor in it is pinned; any other copy returns once the stream has done it, so the host
    # learns the stream complete. Host memory no stream ever touched is not tracked. Several
    # storages may start at the same host bytes (torch.from_dlpack of a pinned buffer makes a
    # second one, which keeps the first alive): every one an operator touches there is watched, and
    # the memory is freed when the last of them dies, not when an alias that died first does. An
    # alias alone seen, dying before the buffer is touched through another storage, still frees it.
    def _fresh_host(self, t: torch.Tensor, is_write: bool, nbytes: int) -> tuple:
        """A host tensor no stream touched yet, as host_op takes it: (address, bytes, written,
        pinned, storage start, storage bytes, how to learn of the storage's death)."""
        storage = t.untyped_storage()
        pinned = self.device_type != "cuda" or t.is_pinned()

        def watch(ptr: int) -> None:
            self._watch_storage(storage, ptr)

        return (t.data_ptr(), nbytes, is_write, pinned, storage.data_ptr(), storage.nbytes(), watch)

    def seen_host(self, t: torch.Tensor, alloc) -> None:
        """A tensor over the tracked host allocation `alloc`: its storage is watched too where it
        starts there (an alias of the one first seen)."""
        storage = t.untyped_storage()
        if storage.data_ptr() == alloc.ptr:
            self._watch_storage(storage, alloc.ptr)

    def _watch_storage(self, storage, ptr: int) -> None:
        alive = self._host_storages.setdefault(ptr, set())
        if id(storage) not in alive:  # PyTorch keeps a storage's Python object as long as the storage
            alive.add(id(storage))
            weakref.finalize(storage, self._storage_died, ptr, id(storage))

    def _storage_died(self, ptr: int, storage_id: int) -> None:
        alive = self._host_storages.get(ptr)
        if alive is None or storage_id not in alive:
            return
        alive.discard(storage_id)
        if not alive:
            del self._host_storages[ptr]
            self.host_freed(ptr)

    def host_op(self, plan, items, fresh_host, stream, stack, non_blocking: bool) -> None:
        engine = self.engine
        host = self.host
        if stack is None:
            stack = self.capture()
        device = [it for it in items if it[3].stream is not host]
        if not device:  # the host's own operation on host memory that streams touch
            if items:
                engine.access_many(HOST, items, plan.name, stack)
                engine.host_sync_stream(HOST)  # done when it returns: later stream work follows it
            return
        key = self.current() if stream is None else stream
        if key not in self.domains:
            self.key(key)
        pinned = all(self._host_pinned.get(it[3].ptr, False) for it in items if it[3].stream is host)
        for ptr, nbytes, is_write, is_pinned, start, size, watch in fresh_host or ():
            if self.device_type == "cuda" and not is_pinned:
                pinned = False  # pageable memory: the copy is synchronous, nothing to track
                continue
            items.append((ptr, nbytes, is_write, self._host_allocation(start, size, stack, watch)))
        for it in items:
            if it[3].stream is host:
                self._host_touched.setdefault(it[3].ptr, set()).add(key)
        engine.access_many(key, items, plan.name, stack)
        self.ops += 1
        if not (pinned and non_blocking):
            engine.host_sync_stream(key)  # a synchronous copy: the host waited for the stream

    def _host_allocation(self, ptr: int, nbytes: int, stack, watch):
        """Track the host storage at `ptr` from now on; its death (`watch(ptr)` arranges to learn
        of it) frees it."""
        alloc = self.engine.allocate(HOST, ptr, nbytes, stack=stack)
        self._host_pinned[ptr] = True
        watch(ptr)
        return alloc

    def host_freed(self, ptr: int) -> None:
        self._host_pinned.pop(ptr, None)
        touched = self._host_touched.pop(ptr, set())
        self._guard(lambda: self.engine.free(ptr, deferred_to=sorted(touched, key=str)))
