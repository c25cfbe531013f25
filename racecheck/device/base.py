"""The stream runtime interface that racecheck.fsdp is written against.

Two backends implement it with the same semantics: `cuda` (torch.cuda streams and events, the real
caching allocator, NCCL) and `sim` (a CPU emulation: worker-thread streams, an emulated caching
allocator, gloo). FSDP code never touches torch.cuda directly; it asks the runtime for streams,
events, buffers and collectives, and every one of those is reported to the runtime's observers
(the perturbation injector and the happens-before detector), identically on both backends.

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
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch


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
    def of(cls, t: torch.Tensor) -> "MemRange":
        return cls(t.data_ptr(), t.numel() * t.element_size())


class RuntimeObserver:
    """Receives runtime events. The injector and the detector subclass it; every method is a
    no-op by default so that an observer implements only what it needs, and the runtime calls only
    the methods named by `events()` (by default, those the subclass overrides): an observer pays
    nothing for the events it ignores.

    Calls happen on the host thread at launch (enqueue) time, in program order, which is what a
    happens-before analysis needs and what a perturbation acts on."""

    def events(self) -> "Iterable[str]":
        """The callbacks the runtime should make (asked once, when the observer is added)."""
        return [m for m in OBSERVER_EVENTS if getattr(type(self), m) is not getattr(RuntimeObserver, m)]

    def on_alloc(self, rt: "Runtime", *, block: int, stream: "Stream", ptr: int, nbytes: int) -> None:
        """A block was handed out on `stream` (the stream current on the host)."""

    def on_free(self, rt: "Runtime", *, block: int, stream: "Stream", ptr: int, nbytes: int,
                deferred_to: Sequence["Stream"]) -> None:
        """The last reference to a block died; it returns to `stream`'s pool, after the streams in
        `deferred_to` (from record_stream) pass this point."""

    def on_host_alloc(self, rt: "Runtime", *, ptr: int, nbytes: int) -> None:
        """A page-locked host buffer was made (`Runtime.pinned_empty`): host memory, which the host
        reads and writes at once and streams reach only through queued copies."""

    def on_host_free(self, rt: "Runtime", *, ptr: int, nbytes: int, deferred_to: Sequence["Stream"]) -> None:
        """A pinned host buffer's last reference died. CUDA's host allocator hands it out again only
        after the streams that copied to or from it passed this point; `deferred_to` names them."""

    def on_record_stream(self, rt: "Runtime", *, block: int, stream: "Stream") -> None:
        """record_stream(tensor, stream) on a tensor of `block`."""

    def on_launch(self, rt: "Runtime", *, stream: "Stream", name: str, reads: Sequence[MemRange],
                  writes: Sequence[MemRange]) -> None:
        """Work was enqueued on `stream` (collectives included)."""

    def on_event_record(self, rt: "Runtime", *, event: "Event", stream: "Stream") -> None:
        """`event` was recorded on `stream`."""

    def on_event_wait(self, rt: "Runtime", *, event: "Event", stream: "Stream") -> None:
        """`stream` waits for `event`'s last record."""

    def on_host_sync(self, rt: "Runtime", *, stream: "Stream | None", event: "Event | None") -> None:
        """The host waited for a stream (or all streams when both are None) or an event."""

    def on_point(self, rt: "Runtime", name: str, **context) -> None:
        """A named injection point along the FSDP path was reached on the host."""


OBSERVER_EVENTS = tuple(m for m in vars(RuntimeObserver) if m.startswith("on_"))


class Stream(abc.ABC):
    """An ordered queue of device work."""

    name: str

    @abc.abstractmethod
    def wait_event(self, event: "Event") -> None: ...

    def wait_stream(self, other: "Stream") -> None:
        """All later work on this stream runs after all work enqueued on `other` so far."""
        if other is self:
            return
        ev = self.runtime.new_event()
        ev.record(other)
        self.wait_event(ev)

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    runtime: "Runtime"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Event(abc.ABC):
    """A marker in a stream's queue. An event never recorded counts as complete (as in CUDA)."""

    @abc.abstractmethod
    def record(self, stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def wait(self, stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def query(self) -> bool: ...

    @abc.abstractmethod
    def synchronize(self) -> None: ...


class Runtime(abc.ABC):
    """One process's device: streams, events, the caching allocator and collectives."""

    backend: str
    device: torch.device
    # Whether observers hear of a record_stream-deferred free before the allocator records its
    # release events, so work they enqueue then on a recorded stream runs before the block can be
    # handed out again (the emulation's allocator); CUDA's records them inside the free.
    free_observed_before_release: bool = True

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

    @abc.abstractmethod
    def synchronize(self) -> None:
        """The host waits for every stream."""

    # -- memory -----------------------------------------------------------------------------
    @abc.abstractmethod
    def empty(self, shape: int | Sequence[int], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new uninitialized buffer from the caching allocator, tagged with the current stream."""

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

    def streams(self) -> Sequence[Stream]:
        """The streams this runtime made, the default stream first."""
        return tuple(self._streams)

    @abc.abstractmethod
    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        """Defer the reuse of `tensor`'s block until `stream` passes the point of its free."""

    @abc.abstractmethod
    def allocation_stream(self, tensor: torch.Tensor) -> Stream | None:
        """The stream `tensor`'s block was allocated on (None for memory not from this runtime)."""

    def poison(self, ptr: int, nbytes: int, *, stream: Stream) -> None:
        """Enqueue on `stream` a fill of the raw bytes [ptr, ptr + nbytes) with POISON_BYTE.

        The perturbation's poison-on-free: `ptr` is a block this runtime handed out and that is
        now free, so the fill claims nothing and is not reported to observers (it is not the
        program's work). On CUDA it is a fill kernel (memset) on `stream` over the raw pointer."""
        raise NotImplementedError(f"the {self.backend} runtime cannot poison raw memory")

    # -- work -------------------------------------------------------------------------------
    @abc.abstractmethod
    def launch(self, name: str, fn: Callable[..., None], *, reads: Sequence[torch.Tensor] = (),
               writes: Sequence[torch.Tensor] = ()) -> None:
        """Enqueue `fn(*writes, *reads)` on the current stream. `fn` receives raw views of the
        buffers: the queued work holds their memory, not their ownership."""

    @abc.abstractmethod
    def sleep(self, seconds: float) -> None:
        """Enqueue a delay on the current stream (the host does not wait)."""

    @abc.abstractmethod
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, *, group: "CommGroup") -> None:
        """Enqueue an all-gather into `output` on the current stream."""

    @abc.abstractmethod
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, *, group: "CommGroup",
                       op: ReduceOp = ReduceOp.SUM) -> None:
        """Enqueue a reduce-scatter of `input` into `output` on the current stream."""

    @abc.abstractmethod
    def all_reduce(self, tensor: torch.Tensor, *, group: "CommGroup", op: ReduceOp = ReduceOp.SUM) -> None:
        """Enqueue an in-place all-reduce on the current stream."""

    @abc.abstractmethod
    def new_group(self, ranks: Sequence[int]) -> "CommGroup":
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
        """Mark a named injection point on the host (see racecheck.perturb.points)."""
        for fn in self._dispatch.get("on_point", ()):
            fn(self, name, **context)

    def _notify(self, method: str, **kwargs) -> None:
        for fn in self._dispatch.get(method, ()):
            fn(self, **kwargs)


class CommGroup(abc.ABC):
    """A communicator over a fixed set of ranks, usable from any stream."""

    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


def as_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


@contextlib.contextmanager
def no_observers(rt: Runtime) -> Iterator[None]:
    """Temporarily detach every observer (for setup work that must not be perturbed or checked)."""
    saved, rt.observers = rt.observers, []
    try:
        yield
    finally:
        rt.observers = saved
