"""Patch mode on racecheck's own runtime: the actions seam (patch_actions.py) over a Runtime, so
that patch mode's whole logic (its hand-off points on both sides, the systematic schedule, the
allocator actions at the program's next allocation) runs on the CPU emulation's real stream
semantics: delays are work on the target stream, poison and pressure go through the emulated
caching allocator. Code written against the runtime's stream API (`rt.stream(s)`,
`Stream.wait_stream` / `wait_event`, `Event.record` / `wait`) passes the same hand-off points
that torch.cuda code passes on a GPU.

The emulation's collectives are the runtime's own, run inside its stream workers, so patch mode's
collective points do not apply here (`applies` is False); the runtime's injector marks those.
"""

from __future__ import annotations

from racecheck.device.base import POISON_BYTE, Event, Runtime, RuntimeObserver, Stream


class _AllocatorEvents(RuntimeObserver):
    """The runtime's allocations and frees, handed to patch mode's callbacks by address."""

    def __init__(self, on_alloc, on_free) -> None:
        self.callbacks = (on_alloc, on_free)

    def on_alloc(self, rt, *, block, stream, ptr, nbytes) -> None:
        self.callbacks[0](ptr)

    def on_free(self, rt, *, block, stream, ptr, nbytes, deferred_to) -> None:
        self.callbacks[1](ptr)


class RuntimeActions:
    """CudaActions' counterpart for a racecheck Runtime (the CPU emulation in tests)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._observers: list[_AllocatorEvents] = []

    # -- the host's view of streams --------------------------------------------------------
    def applies(self, tensors) -> bool:
        return False

    def current_stream(self) -> Stream:
        return self.rt.current_stream()

    def current_stream_id(self) -> Stream:
        return self.rt.current_stream()

    def is_default(self, stream: Stream) -> bool:
        return stream is self.rt.default_stream()

    def stream_id(self, stream: Stream) -> Stream:
        return stream

    def handoff_targets(self) -> list[tuple[object, str, str]]:
        # Stream.wait_stream records and waits an event inside: only the outermost call counts.
        return [
            (type(self.rt), "set_current_stream", "set_current_stream"),
            (Stream, "wait_stream", "wait_stream"),
            (Stream, "wait_event", "wait_event"),
            (Event, "wait", "event_wait"),
            (Event, "record", "event_record"),
        ]

    # -- delays ----------------------------------------------------------------------------
    def delay(self, stream: Stream, seconds: float) -> None:
        with self.rt.stream(stream):  # queued on `stream`: its later work runs late
            self.rt.sleep(seconds)

    def launch(self, call, *, delay: float, async_op: bool):
        return call()  # never asked: applies() is False

    # -- frees: see [Note: sound allocator actions] in free_actions.py -------------------------
    def attach_allocator(self, on_alloc, on_free) -> None:
        observer = _AllocatorEvents(on_alloc, on_free)
        self._observers.append(observer)
        self.rt.add_observer(observer)

    def detach_allocator(self, on_alloc, on_free) -> None:
        for observer in [o for o in self._observers if o.callbacks == (on_alloc, on_free)]:
            self._observers.remove(observer)
            self.rt.remove_observer(observer)

    def pool_view(self):
        return self.rt.pool_view()

    def poison(self, start: int, nbytes: int, stream: Stream) -> None:
        self.rt.poison(start, nbytes, stream=stream)

    def pressure(self, nbytes: int, stream: Stream) -> None:
        import torch

        with self.rt.stream(stream):
            block = self.rt.empty(nbytes, dtype=torch.uint8)
            self.rt.launch("racecheck_pressure", lambda out: out.fill_(POISON_BYTE), writes=(block,))
            del block  # back to the pool, written: what a next owner of the block would leave
