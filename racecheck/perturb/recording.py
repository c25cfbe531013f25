"""Patch mode's recording twin: the actions seam (patch_actions.py) without a GPU, for CPU tests.

RecordingActions does what CudaActions does on the host side and records what it would enqueue on
a device instead. Its hand-off targets are the small host stream API below, shaped like
torch.cuda's (HostStream.wait_stream / wait_event / record_event, HostEvent.record / wait,
set_stream, stream(s)); a CPU test suite written against it passes the same hand-off points that
torch.cuda code passes, and patch mode wraps them exactly as it wraps torch.cuda's. A delay lands
on the HostStream it targets (`stream.delayed`, seconds), so a suite can play a race that a
delayed hand-off exposes; `release(nbytes)` plays a free seen by the caching allocator. Its
tracker (start_tracker) is TorchRaceTracker over CPU tensors, with these streams for CUDA's.

The trial runner's plugin uses it in place of CudaActions when $RACECHECK_PATCH_ACTIONS is
`recording` (for tests only: it perturbs no real stream).
"""

from __future__ import annotations

import contextlib
import itertools
import threading

ENV_VAR = "RACECHECK_PATCH_ACTIONS"

_names = itertools.count(1)
_handles = itertools.count(0x100, 0x100)  # what cudaStream_t handles are to CUDA (0: default)
_free_callbacks: list = []
_trackers: list = []  # active TorchRaceTrackers fed the host events' record and wait
_blocks = itertools.count(0x1000, 0x1000)  # fake block addresses


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
        for tracker in _trackers:  # as CUDA's trace callbacks tell the tracker
            tracker.event_recorded(id(self), self.stream.handle)

    def wait(self, stream: HostStream | None = None) -> None:
        """Nothing to wait for on the host; a tracker learns of the wait."""
        stream = stream if stream is not None else current_stream()
        for tracker in _trackers:
            tracker.event_waited(id(self), stream.handle)


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


def release(nbytes: int) -> int:
    """Play a free of an `nbytes` block: every attached callback gets its (fake) address."""
    ptr = next(_blocks)
    for callback in list(_free_callbacks):
        callback(ptr)
    return ptr


class RecordingActions:
    """CudaActions' twin: acts on CPU tensors and the host streams above, and records it all."""

    def __init__(self) -> None:
        self.launches: list[tuple[float, bool]] = []  # (delay, async_op) of every collective
        self.delays: list[tuple[str, float]] = []  # (stream name, seconds) at hand-off points
        self.frees: list[tuple[int, bool, bool]] = []  # (ptr, poison, pressure) acted on

    def applies(self, tensors) -> bool:
        return bool(tensors)

    def current_stream(self) -> HostStream:
        return current_stream()

    def is_default(self, s: HostStream) -> bool:
        return s is DEFAULT

    def stream_id(self, s: HostStream) -> int:
        return id(s)

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

    def attach_free(self, callback) -> None:
        _free_callbacks.append(callback)

    def detach_free(self, callback) -> None:
        while callback in _free_callbacks:
            _free_callbacks.remove(callback)

    @staticmethod
    def start_tracker():
        """A TorchRaceTracker over CPU tensors whose streams are the host streams above."""
        from racecheck.detect.torch_tracker import TorchRaceTracker

        tracker = TorchRaceTracker(
            device_type="cpu", current_stream=lambda: current_stream().handle, stream_handle=lambda s: s.handle
        )
        tracker.name_stream(DEFAULT.handle, "default")
        tracker.__enter__()
        _trackers.append(tracker)
        return tracker

    @staticmethod
    def stop_tracker(tracker) -> None:
        if tracker in _trackers:
            _trackers.remove(tracker)
        tracker.__exit__(None, None, None)

    def on_frees(self, requests) -> tuple[int, int]:
        requests = list(requests)
        self.frees.extend(requests)
        return sum(1 for r in requests if r[1]), sum(1 for r in requests if r[2])
