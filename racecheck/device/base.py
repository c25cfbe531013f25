"""The stream runtime interface that racecheck.fsdp is written against.

Two backends implement it with the same semantics: `cuda` (torch.cuda streams and events, the real
caching allocator, NCCL) and `sim` (a CPU emulation: worker-thread streams, an emulated caching
allocator, gloo). FSDP code never touches torch.cuda directly; it asks the runtime for streams,
events, buffers and collectives, and every one of those is reported to the runtime's observers
(the perturbation injector and the happens-before detector), identically on both backends:
the observed methods are defined here and call the observers around a backend hook (`_launch`,
`_allocate`, `_record`, ...), so a backend implements the work and never the reporting.

[Note: stream semantics]
Work launched on a stream runs in launch order, asynchronously to the host. Work on two streams is
unordered unless an event orders it: `consumer.wait_event(ev)` after `ev.record(producer)` makes all
later work on `consumer` run after all earlier work on `producer`. `wait_stream` is exactly
"record an event on the other stream now, wait for it here".

[Note: allocator semantics]
A block is tagged with the stream current on the host when it was allocated. When its last user
reference dies, it returns to that stream's pool at once, without waiting for queued work that may
still read or write it; only allocations on the same stream reuse it. `record_stream(t, s)` defers
that return until the work queued on `s` at the time of the free has completed. Queued work holds a
raw pointer, never a reference: launching a kernel does not keep its buffers alive.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from racecheck.device.observer import RuntimeObserver
from racecheck.device.points import check_point
from racecheck.device.pool_state import PoolState, PoolView  # noqa: F401 (part of the interface)

# All-ones bytes: NaN in every IEEE float format (fp64, fp32, bf16, fp16), -1 in signed integers.
POISON_BYTE = 0xFF
# The caching allocator's kMinBlockSize: request sizes round up to a multiple of it.
ROUND_BYTES = 512


def block_size(nbytes: int) -> int:
    """The size of the block the caching allocator hands out for a request of `nbytes`."""
    return max(ROUND_BYTES, -(-nbytes // ROUND_BYTES) * ROUND_BYTES)


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"


@dataclasses.dataclass(frozen=True)
class MemRange:
    """A byte range of device memory touched by a launch (views and offsets resolved)."""

    ptr: int
    nbytes: int

    @classmethod
    def of(cls, t: torch.Tensor) -> MemRange:
        return cls(t.data_ptr(), t.numel() * t.element_size())


class Stream(abc.ABC):
    """An ordered queue of device work.

    What callers may use is declared here, and every backend implements all of it: the
    perturbation holds a stream with `enqueue` where `runs_host_work` says it can, and the detector
    and its reports read `inline`. The observer notifications are made here, around the backend's
    hooks (`_wait_event`, `_synchronize`), so both backends report the same events by construction.
    """

    name: str
    runtime: Runtime

    @property
    @abc.abstractmethod
    def inline(self) -> bool:
        """Whether the host thread runs this stream's work at launch, so the host never runs ahead
        of it (the emulation's default stream, unless `Runtime.queued_default_stream`)."""

    @property
    @abc.abstractmethod
    def runs_host_work(self) -> bool:
        """Whether `enqueue` can put host work in this stream's order (a stream run by a host
        thread); a CUDA stream cannot wait for the host."""

    @abc.abstractmethod
    def enqueue(self, fn: Callable[[], object]) -> None:
        """Run the host function `fn` in this stream's order: after the work launched on it so
        far, before the work launched later. Unobserved (the runtime's and the perturbation's own
        work, not the program's). Only where `runs_host_work`; NotImplementedError elsewhere."""

    def wait_event(self, event: Event) -> None:
        self.runtime._notify("on_event_wait", event=event, stream=self)
        self._wait_event(event)

    def wait_stream(self, other: Stream) -> None:
        """All later work on this stream runs after all work enqueued on `other` so far."""
        if other is self:
            return
        ev = self.runtime.new_event()
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self) -> None:
        self._synchronize()
        self.runtime._notify("on_host_sync", stream=self, event=None)

    # Backend hooks (unobserved): order later work behind the event; block the host until done.
    @abc.abstractmethod
    def _wait_event(self, event: Event) -> None: ...

    @abc.abstractmethod
    def _synchronize(self) -> None: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Event(abc.ABC):
    """A marker in a stream's queue. An event never recorded counts as complete (as in CUDA).
    Records and host waits are reported to observers here, around the backend's hooks."""

    runtime: Runtime

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or self.runtime.current_stream()
        self.runtime._notify("on_event_record", event=self, stream=stream)
        self._record(stream)

    def wait(self, stream: Stream | None = None) -> None:
        (stream or self.runtime.current_stream()).wait_event(self)

    @abc.abstractmethod
    def query(self) -> bool: ...

    def synchronize(self) -> None:
        self._synchronize()
        self.runtime._notify("on_host_sync", stream=None, event=self)

    # Backend hooks (unobserved): place the marker on `stream`; block the host until it is passed.
    @abc.abstractmethod
    def _record(self, stream: Stream) -> None: ...

    @abc.abstractmethod
    def _synchronize(self) -> None: ...


class NewBlock(NamedTuple):
    """What a backend's allocation hook hands back for observers: the block's id and bytes."""

    block: int
    ptr: int
    nbytes: int


class Runtime(abc.ABC):
    """One process's device: streams, events, the caching allocator and collectives."""

    backend: str
    device: torch.device

    def __init__(self) -> None:
        self._observers: tuple[RuntimeObserver, ...] = ()
        self._dispatch: dict[str, tuple[Callable, ...]] = {}  # event -> subscribed bound methods

    # -- streams and events ------------------------------------------------------------------
    @abc.abstractmethod
    def default_stream(self) -> Stream: ...

    @abc.abstractmethod
    def current_stream(self) -> Stream: ...

    @abc.abstractmethod
    def new_stream(self, name: str) -> Stream: ...

    @abc.abstractmethod
    def stream(self, stream: Stream) -> contextlib.AbstractContextManager: ...

    @abc.abstractmethod
    def new_event(self) -> Event: ...

    def queued_default_stream(self) -> contextlib.AbstractContextManager:
        """A context in which the default stream is an ordered queue that the host runs ahead of,
        as on a GPU. CUDA's default stream always is; the CPU emulation runs it inline on the host
        unless asked (see sim.py), for code that reaches default-stream results only through
        launches and synchronization."""
        return contextlib.nullcontext(self.default_stream())

    def synchronize(self) -> None:
        """The host waits for every stream; observers hear one host sync per stream, in order."""
        self._synchronize()
        for s in self.streams():
            self._notify("on_host_sync", stream=s, event=None)

    @abc.abstractmethod
    def _synchronize(self) -> None: ...  # hook: block the host until every stream's work is done

    # -- memory -----------------------------------------------------------------------------
    def empty(self, shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new uninitialized buffer from the caching allocator, tagged with the current stream."""
        stream = self.current_stream()
        tensor, block = self._allocate(as_shape(shape), dtype, stream)
        if block is not None:
            self._notify("on_alloc", block=block.block, stream=stream, ptr=block.ptr, nbytes=block.nbytes)
        return tensor

    @abc.abstractmethod
    def _allocate(
        self, shape: tuple[int, ...], dtype: torch.dtype, stream: Stream
    ) -> tuple[torch.Tensor, NewBlock | None]:
        """Backend hook of `empty`: a buffer tagged with `stream`, and its block (None where no
        block stands behind it, as for an empty CUDA tensor)."""

    def _block_freed(self, *, block: int, stream: Stream, ptr: int, nbytes: int, deferred_to: Sequence[Stream]) -> None:
        """Called by the backend when a block's last reference died (from any thread)."""
        self._notify("on_free", block=block, stream=stream, ptr=ptr, nbytes=nbytes, deferred_to=deferred_to)

    def zeros(self, shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new buffer, zero-filled by work on the current stream."""
        t = self.empty(shape, dtype=dtype)
        self.launch("zero_", lambda out: out.zero_(), writes=(t,))
        return t

    def pinned_empty(self, shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new uninitialized host buffer for asynchronous copies to and from the device:
        page-locked on CUDA, where a `non_blocking` copy into it returns before the data is there.
        Observers learn of it (on_host_alloc / on_host_free), so the detector checks the host's
        reads of it against the copies that fill it."""
        from racecheck.device.host_memory import track_host_buffer

        tensor = torch.empty(as_shape(shape), dtype=dtype, pin_memory=self.backend == "cuda")
        return track_host_buffer(self, tensor)

    _streams: Sequence[Stream]  # each backend's own streams, kept in creation order

    def streams(self) -> Sequence[Stream]:
        """The streams this runtime made, the default stream first."""
        return tuple(self._streams)

    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        """Defer the reuse of `tensor`'s block until `stream` passes the point of its free."""
        block = self._record_stream(tensor, stream)
        if block is not None:
            self._notify("on_record_stream", block=block, stream=stream)

    @abc.abstractmethod
    def _record_stream(self, tensor: torch.Tensor, stream: Stream) -> int | None: ...  # hook: block id

    @abc.abstractmethod
    def allocation_stream(self, tensor: torch.Tensor) -> Stream | None:
        """The stream `tensor`'s block was allocated on (None for memory not from this runtime)."""

    def pool_view(self) -> PoolView:
        """The caching allocator's pools now (for the perturbation's allocator actions). A
        backend that cannot show them gets none: no block is ever found free."""
        return _NoPools()

    def poison(self, ptr: int, nbytes: int, *, stream: Stream) -> None:
        """Enqueue on `stream` a fill of the raw bytes [ptr, ptr + nbytes) with POISON_BYTE.

        The perturbation's poison-on-free: `ptr` is a block this runtime handed out and that is
        now free, so the fill claims nothing and is not reported to observers (it is not the
        program's work). On CUDA it is a fill kernel (memset) on `stream` over the raw pointer."""
        raise NotImplementedError(f"the {self.backend} runtime cannot poison raw memory")

    # -- work -------------------------------------------------------------------------------
    def launch(
        self,
        name: str,
        fn: Callable[..., None],
        *,
        reads: Sequence[torch.Tensor] = (),
        writes: Sequence[torch.Tensor] = (),
    ) -> None:
        """Enqueue `fn(*writes, *reads)` on the current stream. `fn` receives raw views of the
        buffers: the queued work holds their memory, not their ownership."""
        stream = self.current_stream()
        self._notify(
            "on_launch",
            stream=stream,
            name=name,
            reads=[MemRange.of(t) for t in reads],
            writes=[MemRange.of(t) for t in writes],
        )
        self._launch(stream, fn, reads, writes)

    @abc.abstractmethod
    def _launch(
        self, stream: Stream, fn: Callable[..., None], reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor]
    ) -> None: ...  # hook: run or queue it on `stream`

    @abc.abstractmethod
    def sleep(self, seconds: float) -> None:
        """Enqueue a delay on the current stream (the host does not wait)."""

    @abc.abstractmethod
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, *, group: CommGroup) -> None:
        """Enqueue an all-gather into `output` on the current stream."""

    @abc.abstractmethod
    def reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, *, group: CommGroup, op: ReduceOp = ReduceOp.SUM
    ) -> None:
        """Enqueue a reduce-scatter of `input` into `output` on the current stream."""

    @abc.abstractmethod
    def all_reduce(self, tensor: torch.Tensor, *, group: CommGroup, op: ReduceOp = ReduceOp.SUM) -> None:
        """Enqueue an in-place all-reduce on the current stream."""

    @abc.abstractmethod
    def new_group(self, ranks: Sequence[int]) -> CommGroup:
        """A communicator over `ranks`. Must be called by every rank, in the same order."""

    def close(self) -> None:
        """Drain the streams and release the backend's resources."""
        self.synchronize()

    # -- observers --------------------------------------------------------------------------
    @property
    def observers(self) -> tuple[RuntimeObserver, ...]:
        return self._observers

    @observers.setter
    def observers(self, observers) -> None:
        # Each event's subscribers are resolved here, once, not on every event.
        observers = tuple(observers)
        dispatch: dict[str, list] = {}
        for obs in observers:
            for event in obs.events():
                dispatch.setdefault(event, []).append(getattr(obs, event))
        self._dispatch = {event: tuple(fns) for event, fns in dispatch.items()}
        self._observers = observers

    def add_observer(self, observer: RuntimeObserver) -> None:
        self.observers = self._observers + (observer,)

    def remove_observer(self, observer: RuntimeObserver) -> None:
        if observer not in self._observers:
            raise ValueError(f"{observer!r} is not an observer of this runtime")
        self.observers = tuple(o for o in self._observers if o is not observer)

    def point(self, name: str, **context) -> None:
        """Mark a named injection point on the host: one of `Point` (racecheck.device.points);
        ValueError for any other name, observed or not."""
        name = check_point(name)
        for fn in self._dispatch.get("on_point", ()):
            fn(self, name, **context)

    def _notify(self, method: str, **kwargs) -> None:
        for fn in self._dispatch.get(method, ()):
            fn(self, **kwargs)


class _NoPools(PoolView):
    def find(self, ptr: int) -> None:
        return None


class CommGroup(abc.ABC):
    """A communicator over a fixed set of ranks, usable from any stream."""

    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


def as_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)
