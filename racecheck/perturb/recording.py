"""Patch mode's recording twin: the actions seam (patch_actions.py) without a GPU, for CPU tests.

RecordingActions does what CudaActions does on the host side and records what it would enqueue on
a device instead. Its hand-off targets are the small host stream API below, shaped like
torch.cuda's (HostStream.wait_stream / wait_event / record_event, HostEvent.record / wait,
set_stream, stream(s)); a CPU test suite written against it passes the same hand-off points that
torch.cuda code passes, and patch mode wraps them exactly as it wraps torch.cuda's. A delay lands
on the HostStream it targets (`stream.delayed`, seconds), so a suite can play a race that a
delayed hand-off exposes; `allocate(nbytes)` and `release(ptr)` play an allocation on the current
host stream and a free, as the caching allocator's callbacks report them (its pools are the
blocks these made). A detector hears the host events' record and wait (listen), as CUDA's trace
callbacks tell it of CUDA's: the per-test harness runs TorchRaceTracker over CPU tensors with these
streams for CUDA's (racecheck.rank.detectors).

The trial runner's plugin uses it in place of CudaActions when $RACECHECK_PATCH_ACTIONS is
`recording` (for tests only: it perturbs no real stream).
"""

from __future__ import annotations

import contextlib
import itertools
import threading

_names = itertools.count(1)
_handles = itertools.count(0x100, 0x100)  # what cudaStream_t handles are to CUDA (0: default)
_allocator_callbacks: list = []  # (on_alloc, on_free) pairs attached
_listeners: list = []  # what hears the host events' record and wait (a detector, as CUDA's trace)
_addresses = itertools.count(0x1000, 0x1000)  # fake block addresses
_blocks: dict[int, list] = {}  # address -> [stream handle, nbytes, live]


class HostStream:
    """A stream as the host sees it: a name, and the delays patch mode enqueued on it."""

    def __init__(self, name: str | None = None, *, handle: int | None = None) -> None:
        self.name = name or f"host-stream-{next(_names)}"
        self.handle = next(_handles) if handle is None else handle
        self.delayed = 0.0  # seconds of delay enqueued on this stream so far

    def wait_stream(self, other: HostStream) -> None:
        self.wait_event(other.record_event())

    def wait_event(self, event: HostEvent) -> None:
        event.wait(self)

    def record_event(self, event: HostEvent | None = None) -> HostEvent:
        event = event if event is not None else HostEvent()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"HostStream({self.name!r})"


class HostEvent:
    def __init__(self) -> None:
        self.stream: HostStream | None = None

    def record(self, stream: HostStream | None = None) -> None:
        self.stream = stream if stream is not None else current_stream()
        for listener in _listeners:  # as CUDA's trace callbacks tell a detector
            listener.event_recorded(id(self), self.stream.handle)

    def wait(self, stream: HostStream | None = None) -> None:
        """Nothing to wait for on the host; a tracker learns of the wait."""
        stream = stream if stream is not None else current_stream()
        for listener in _listeners:
            listener.event_waited(id(self), stream.handle)


DEFAULT = HostStream("default", handle=0)
_current = threading.local()


def current_stream() -> HostStream:
    return getattr(_current, "stream", DEFAULT)


def default_stream() -> HostStream:
    return DEFAULT


def set_stream(stream: HostStream | None) -> None:
    if stream is not None:
        _current.stream = stream


@contextlib.contextmanager
def stream(s: HostStream | None):
    """Like torch.cuda.stream: make `s` current (through set_stream) for the block."""
    previous = current_stream()
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


def listen(listener) -> None:
    """Have `listener` told of every event record and wait on the host streams, by its
    `event_recorded(event, stream)` and `event_waited(event, stream)` (TorchRaceTracker's)."""
    _listeners.append(listener)


def unlisten(listener) -> None:
    while listener in _listeners:
        _listeners.remove(listener)


def allocate(nbytes: int) -> int:
    """Play an allocation of `nbytes` on the current host stream: every attached allocation
    callback gets its (fake) address, as from the caching allocator's."""
    ptr = next(_addresses)
    _blocks[ptr] = [current_stream().handle, nbytes, True]
    for on_alloc, _ in list(_allocator_callbacks):
        on_alloc(ptr)
    return ptr


def release(ptr: int) -> int:
    """Play the free of a block `allocate` made (back to its stream's pool), or of a block of
    that many bytes the callbacks never saw allocated; returns its address."""
    if ptr not in _blocks:
        nbytes, ptr = ptr, next(_addresses)
        _blocks[ptr] = [DEFAULT.handle, nbytes, True]
    _blocks[ptr][2] = False
    for _, on_free in list(_allocator_callbacks):
        on_free(ptr)
    return ptr


class _RecordedPools:
    """The pools of the blocks allocate/release played (pool_state.PoolView.find)."""

    def find(self, ptr: int):
        from racecheck.device.pool_state import PoolState

        block = _blocks.get(ptr)
        if block is None:
            return None
        handle, nbytes, live = block
        return (PoolState.TAKEN, ptr, 0, handle) if live else (PoolState.IN_POOL, ptr, nbytes, handle)


class RecordingActions:
    """CudaActions' twin: acts on CPU tensors and the host streams above, and records it all."""

    def __init__(self) -> None:
        self.launches: list[tuple[float, bool]] = []  # (delay, async_op) of every collective
        self.delays: list[tuple[str, float]] = []  # (stream name, seconds) at hand-off points
        self.frees: list[tuple[int, bool, bool]] = []  # (ptr or bytes, poison, pressure) acted on

    def applies(self, tensors) -> bool:
        return bool(tensors)

    def current_stream(self) -> HostStream:
        return current_stream()

    def is_default(self, s: HostStream) -> bool:
        return s is DEFAULT

    def stream_id(self, s: HostStream) -> int:
        return s.handle

    def current_stream_id(self) -> int:
        return current_stream().handle

    def handoff_targets(self) -> list[tuple[object, str, str]]:
        import sys

        module = sys.modules[__name__]
        return [
            (module, "set_stream", "set_stream"),
            (HostStream, "wait_stream", "wait_stream"),
            (HostStream, "wait_event", "wait_event"),
            (HostEvent, "wait", "event_wait"),
            (HostStream, "record_event", "record_event"),
            (HostEvent, "record", "event_record"),
        ]

    def delay(self, s: HostStream, seconds: float) -> None:
        s.delayed += seconds
        self.delays.append((s.name, seconds))

    def launch(self, call, *, delay: float, async_op: bool):
        self.launches.append((delay, async_op))
        if delay > 0:
            current_stream().delayed += delay
        return call()

    def attach_allocator(self, on_alloc, on_free) -> None:
        _allocator_callbacks.append((on_alloc, on_free))

    def detach_allocator(self, on_alloc, on_free) -> None:
        while (on_alloc, on_free) in _allocator_callbacks:
            _allocator_callbacks.remove((on_alloc, on_free))

    def pool_view(self) -> _RecordedPools:
        return _RecordedPools()

    def poison(self, start: int, nbytes: int, sid: int) -> None:
        self.frees.append((start, True, False))

    def pressure(self, nbytes: int, sid: int) -> None:
        self.frees.append((nbytes, False, True))
