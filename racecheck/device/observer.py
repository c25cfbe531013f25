"""What a runtime reports: the observer interface that the perturbation injector and the
happens-before detector implement, and the names of its events.

Both backends report through `Runtime` (base.py), which makes every call around its backend hooks,
so an observer sees the same events in the same order on the CUDA backend and the emulation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from racecheck.device.base import Event, MemRange, Runtime, Stream


class RuntimeObserver:
    """Receives runtime events. The injector and the detector subclass it; every method is a
    no-op by default so that an observer implements only what it needs, and the runtime calls only
    the methods named by `events()` (by default, those the subclass overrides): an observer pays
    nothing for the events it ignores.

    Calls happen on the host thread at launch (enqueue) time, in program order, which is what a
    happens-before analysis needs and what a perturbation acts on."""

    def events(self) -> Iterable[str]:
        """The callbacks the runtime should make (asked once, when the observer is added)."""
        return [m for m in OBSERVER_EVENTS if getattr(type(self), m) is not getattr(RuntimeObserver, m)]

    def on_alloc(self, rt: Runtime, *, block: int, stream: Stream, ptr: int, nbytes: int) -> None:
        """A block was handed out on `stream` (the stream current on the host)."""

    def on_free(
        self, rt: Runtime, *, block: int, stream: Stream, ptr: int, nbytes: int, deferred_to: Sequence[Stream]
    ) -> None:
        """The last reference to a block died; it returns to `stream`'s pool, after the streams in
        `deferred_to` (from record_stream) pass this point."""

    def on_host_alloc(self, rt: Runtime, *, ptr: int, nbytes: int) -> None:
        """A page-locked host buffer was made (`Runtime.pinned_empty`): host memory, which the host
        reads and writes at once and streams reach only through queued copies."""

    def on_host_free(self, rt: Runtime, *, ptr: int, nbytes: int, deferred_to: Sequence[Stream]) -> None:
        """A pinned host buffer's last reference died. CUDA's host allocator hands it out again only
        after the streams that copied to or from it passed this point; `deferred_to` names them."""

    def on_record_stream(self, rt: Runtime, *, block: int, stream: Stream) -> None:
        """record_stream(tensor, stream) on a tensor of `block`."""

    def on_launch(
        self, rt: Runtime, *, stream: Stream, name: str, reads: Sequence[MemRange], writes: Sequence[MemRange]
    ) -> None:
        """Work was enqueued on `stream` (collectives included)."""

    def on_event_record(self, rt: Runtime, *, event: Event, stream: Stream) -> None:
        """`event` was recorded on `stream`."""

    def on_event_wait(self, rt: Runtime, *, event: Event, stream: Stream) -> None:
        """`stream` waits for `event`'s last record."""

    def on_host_sync(self, rt: Runtime, *, stream: Stream | None, event: Event | None) -> None:
        """The host waited for a stream (or all streams when both are None) or an event."""

    def on_point(self, rt: Runtime, name: str, **context) -> None:
        """A named injection point along the FSDP path was reached on the host."""


OBSERVER_EVENTS = tuple(m for m in vars(RuntimeObserver) if m.startswith("on_"))

__all__ = ["OBSERVER_EVENTS", "RuntimeObserver"]
