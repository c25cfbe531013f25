"""The CPU emulation backend: CUDA stream, event and caching-allocator semantics on threads and gloo.

- A side stream is an ordered queue run by its own worker thread; launching returns at once.
- The default stream runs inline on the host thread: the host never runs ahead of it. The limit this
  implies: a side stream that forgets to wait for default-stream output cannot fail by timing here
  (on a GPU it can); the happens-before detector reports that class regardless of timing. Code that
  reaches default-stream results only through launches can lift the limit with
  `queued_default_stream()`, which gives the default stream a worker thread like any other.
- Pinned host buffers (`pinned_empty`) are plain host memory; a copy into one launched on a side
  stream is queued work like any other, so the host that reads it before waiting reads stale bytes.
- Events order work across streams exactly as in CUDA; waiting on the inline default stream blocks
  the host, which is the only faithful order for a stream that the host itself executes.
- Collectives run on gloo inside the issuing stream's worker. Each communicator holds one gloo
  group per issuing stream, so two workers never drive one gloo group concurrently (ranks would
  disagree on the order); streams take their slot in the order the host first uses them, which is
  the same program order on every rank.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.distributed as dist

from racecheck.device.base import POISON_BYTE, CommGroup, Event, NewBlock, PoolView, ReduceOp, Runtime, Stream
from racecheck.device.sim_allocator import SimCachingAllocator

# Gloo groups made per communicator: default, all-gather, reduce-scatter, all-reduce streams,
# plus one spare for scenarios with an extra side stream.
COMM_SLOTS = 5


class StreamError(RuntimeError):
    """Work on an emulated stream raised; re-raised on the host at the next synchronization."""


class SimStream(Stream):
    def __init__(self, runtime: SimRuntime, name: str, *, inline: bool) -> None:
        self.runtime = runtime
        self.name = name
        self._queue: queue.SimpleQueue | None = None
        self._worker: threading.Thread | None = None
        self.error: BaseException | None = None
        if not inline:
            self.start_queue()

    @property
    def inline(self) -> bool:
        """Whether the host thread runs this stream's work at launch (no queue of its own)."""
        return self._queue is None

    @property
    def runs_host_work(self) -> bool:
        return True  # every emulated stream is run by a host thread (its worker, or the host itself)

    def start_queue(self) -> None:
        """Give the stream a queue and a worker thread: launching returns at once from now on."""
        assert self._queue is None, "the stream already has a queue"
        self._queue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, args=(self._queue,), name=f"stream-{self.name}", daemon=True)
        self._worker.start()

    def _run(self, tasks: queue.SimpleQueue) -> None:
        while True:
            task = tasks.get()
            if task is None:
                return
            if self.error is not None:
                # After a failure, markers still complete so nobody waits forever; work is skipped.
                if getattr(task, "is_marker", False):
                    task()
                continue
            try:
                task()
            except BaseException as exc:  # surfaced on the host at the next synchronization
                self.error = exc

    def enqueue(self, fn: Callable[[], object]) -> None:
        """Queue `fn` behind the stream's work; an inline stream runs it at once."""
        tasks = self._queue
        if tasks is None:
            fn()
        else:
            tasks.put(fn)

    def _wait_event(self, event: Event) -> None:
        marker = cast(SimEvent, event).marker
        if marker is not None:  # the worker blocks until the producer's marker ran
            self.enqueue(marker.wait)

    def _synchronize(self) -> None:
        marker = threading.Event()
        self.enqueue(_Marker(marker))
        marker.wait()
        self.raise_error()

    def raise_error(self) -> None:
        if self.error is not None:
            raise StreamError(f"work on stream {self.name!r} failed: {self.error!r}") from self.error

    def stop(self, *, timeout: float | None = 5) -> None:
        """Drain and end the worker (the stream runs inline afterwards); `timeout` bounds the wait
        for the queued work (None: wait for all of it)."""
        if self._queue is not None:
            tasks, worker = self._queue, self._worker
            assert worker is not None, "a queue always has its worker (start_queue)"
            tasks.put(None)  # after every task already queued
            worker.join(timeout=timeout)
            self._queue = self._worker = None


class _Marker:
    """A queued task that completes an event; it runs even on a stream whose work failed."""

    is_marker = True

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self) -> None:
        self.flag.set()


class SimEvent(Event):
    def __init__(self, runtime: SimRuntime) -> None:
        self.runtime = runtime
        self.marker: threading.Event | None = None  # the last record's completion flag

    def _record(self, stream: Stream) -> None:
        flag = threading.Event()
        self.marker = flag  # a later wait() waits for this record, as in CUDA
        stream.enqueue(_Marker(flag))

    def record_unobserved(self, stream: Stream) -> None:
        """Record without telling observers. For the allocator's own record_stream events: CUDA's
        caching allocator keeps those internal, and observers learn of them from on_free's
        `deferred_to`, so both backends report the same calls."""
        self._record(stream)

    def query(self) -> bool:
        return self.marker is None or self.marker.is_set()

    def _synchronize(self) -> None:
        if self.marker is not None:
            self.marker.wait()


class SimCommGroup(CommGroup):
    def __init__(self, ranks: Sequence[int], groups: list) -> None:
        self.ranks = tuple(ranks)
        self._groups = groups  # one gloo group per slot
        self._slots: dict[str, int] = {}

    def for_stream(self, stream: Stream):
        """The gloo group reserved for collectives issued on `stream`."""
        slot = self._slots.get(stream.name)
        if slot is None:
            slot = len(self._slots)
            if slot >= len(self._groups):
                raise RuntimeError(f"more than {len(self._groups)} streams issue collectives on {self.ranks}")
            self._slots[stream.name] = slot
        return self._groups[slot]


class _SimPoolView(PoolView):
    """The emulated allocator's pools, read live (its lock makes each answer consistent)."""

    def __init__(self, allocator: SimCachingAllocator) -> None:
        self.allocator = allocator

    def find(self, ptr: int):
        return self.allocator.find(ptr)


class SimRuntime(Runtime):
    backend = "sim"
    device = torch.device("cpu")

    def __init__(self) -> None:
        super().__init__()
        self._default = SimStream(self, "default", inline=True)
        self._streams: list[SimStream] = [self._default]
        self._local = threading.local()
        self.allocator = SimCachingAllocator(on_free=self._block_freed)

    # -- streams and events ------------------------------------------------------------------
    def default_stream(self) -> SimStream:
        return self._default

    def current_stream(self) -> SimStream:
        return getattr(self._local, "stream", self._default)

    def new_stream(self, name: str) -> SimStream:
        s = SimStream(self, name, inline=False)
        self._streams.append(s)
        return s

    @contextlib.contextmanager
    def stream(self, stream: Stream):
        prev = self.current_stream()
        self.set_current_stream(stream)
        try:
            yield stream
        finally:
            self.set_current_stream(prev)

    def set_current_stream(self, stream: Stream) -> None:
        """Make `stream` current on this thread (what `stream()` does on entry and exit; patch
        mode's stream entry point, as torch.cuda.set_stream is on CUDA)."""
        self._local.stream = stream

    def new_event(self) -> SimEvent:
        return SimEvent(self)

    @contextlib.contextmanager
    def queued_default_stream(self):
        """The default stream gets a worker thread of its own while the context is open: launches
        on it return at once and run in order, so the host runs ahead of it as on a GPU (a
        consumer on the default stream can still be pending when the host frees what it reads).
        Host-side PyTorch operations keep running on the host at once, so code inside must reach
        default-stream results through launches or a synchronization. On exit the queue drains and
        the stream runs inline again."""
        stream = self._default
        if not stream.inline:  # nested: already queued
            yield stream
            return
        stream.start_queue()
        try:
            yield stream
        finally:
            stream.stop(timeout=None)  # drains every task queued so far; then the host runs it
        stream.raise_error()

    def _synchronize(self) -> None:
        for s in self._streams:
            s._synchronize()

    # -- memory -----------------------------------------------------------------------------
    def _allocate(self, shape, dtype, stream) -> tuple[torch.Tensor, NewBlock]:
        tensor, block = self.allocator.allocate(shape, dtype, stream)
        return tensor, NewBlock(block.id, block.ptr, tensor.numel() * tensor.element_size())

    def _record_stream(self, tensor: torch.Tensor, stream: Stream) -> int | None:
        block = self.allocator.record_stream(tensor, stream)
        return None if block is None else block.id

    def allocation_stream(self, tensor: torch.Tensor) -> Stream | None:
        block = self.allocator.block_of(tensor)
        return None if block is None else block.stream

    def pool_view(self) -> PoolView:
        return _SimPoolView(self.allocator)

    def poison(self, ptr: int, nbytes: int, *, stream: Stream) -> None:
        raw = self.allocator.segment_bytes(ptr, nbytes)
        stream.enqueue(lambda: raw.fill(POISON_BYTE))

    # -- work -------------------------------------------------------------------------------
    def _launch(self, stream, fn, reads, writes) -> None:
        if stream.inline:
            fn(*writes, *reads)
            return
        # Queued work holds raw memory only: the block may be freed and reused before it runs.
        raw_writes = [self.allocator.raw_view(t) for t in writes]
        raw_reads = [self.allocator.raw_view(t) for t in reads]
        stream.enqueue(lambda: fn(*raw_writes, *raw_reads))

    def sleep(self, seconds: float) -> None:
        self.current_stream().enqueue(lambda: time.sleep(seconds))

    def all_gather(self, output, input, *, group: CommGroup) -> None:
        pg = cast(SimCommGroup, group).for_stream(self.current_stream())  # the runtime's own groups

        def run(out, inp):
            if pg is None:  # a one-rank world
                out.copy_(inp)
            else:
                dist.all_gather_into_tensor(out, inp, group=pg)

        self.launch("all_gather", run, reads=(input,), writes=(output,))

    def reduce_scatter(self, output, input, *, group: CommGroup, op=ReduceOp.SUM) -> None:
        pg = cast(SimCommGroup, group).for_stream(self.current_stream())  # the runtime's own groups

        def run(out, inp):
            if pg is None:
                out.copy_(inp)
            else:
                dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=pg)
            if op is ReduceOp.AVG:
                out.div_(group.size)

        self.launch("reduce_scatter", run, reads=(input,), writes=(output,))

    def all_reduce(self, tensor, *, group: CommGroup, op=ReduceOp.SUM) -> None:
        pg = cast(SimCommGroup, group).for_stream(self.current_stream())  # the runtime's own groups

        def run(t):
            if pg is not None:
                dist.all_reduce(t, op=dist.ReduceOp.SUM, group=pg)
            if op is ReduceOp.AVG:
                t.div_(group.size)

        # In place: a write covers the read of the same bytes for ordering purposes.
        self.launch("all_reduce", run, writes=(tensor,))

    def new_group(self, ranks: Sequence[int]) -> SimCommGroup:
        ranks = sorted(ranks)
        if dist.is_initialized() and len(ranks) > 1:
            groups = [dist.new_group(ranks, backend="gloo") for _ in range(COMM_SLOTS)]
        else:  # one rank: collectives are local copies
            groups = [None] * COMM_SLOTS
        return SimCommGroup(ranks, groups)

    def close(self) -> None:
        try:
            self.synchronize()
        finally:
            for s in self._streams:
                s.stop()
