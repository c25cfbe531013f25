"""The tracker's native path: drains op_log.cpp's log into TorchRaceTracker in the order the
program issued its work.

The log holds what the TorchDispatchMode of the Python path would have seen (operators, with the
byte ranges their plans read and write) and, on CUDA, what CUDA's trace callbacks would have told
Python (allocations, frees, event record and wait, synchronizations), in the order the program
issued them, without a Python frame per operator or event. `NativeFeed.drain` turns each record
into the tracker call the Python path makes for it: an operator's accesses
(`NativeTrackerOps._native_op`), a collective's begin and end (the in-flight collective that the
events during it charge, see torch_tracker.py), a record_stream, an allocation or free, an event
or synchronization, the death of a host buffer the tracker follows. The log calls the drain when
it is full; the tracker drains for a report, at its exit, and, where Python drives the events (a
CPU tracker: tests, patch mode's recording twin), before each event and stream switch.

Stacks stay compact: a record carries the id of its Python stack in the log's table; `LogStack`
resolves it to user frames only when a report is formatted.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from racecheck.detect.dispatch import NATIVE_RESOLVE, NATIVE_WRITE, OpPlan, overload_named, plan_for
from racecheck.detect.stacks import LazyStack, user_frames

if TYPE_CHECKING:
    from racecheck.detect.torch_tracker import TorchRaceTracker

# op_log.cpp's record types
OP, COLLECTIVE_BEGIN, COLLECTIVE_END, STREAM_RECORDED, HOST_FREED = range(5)
ALLOCATED, FREED, EVENT_RECORDED, EVENT_WAITED, EVENT_DELETED, DEVICE_SYNCED, STREAM_SYNCED, EVENT_SYNCED = range(5, 13)
NO_STREAM = -(2**63)  # the record's stream is the tracker's current stream
# op_log.cpp's Record and Item, as drain() hands their arrays over (native byte order, C layout):
# Record (type, op id, stream id, device index, stack id, first item, item count, extra) and
# Item (address, bytes, storage start, storage bytes, access, device, pinned).
RECORD = struct.Struct("=b3xiqi4xqIIq")
ITEM = struct.Struct("=QQQQbbb5x")


class LogStack(LazyStack):
    """A Python stack captured by the native log: resolved to frames when a report needs it."""

    __slots__ = ("_log", "_id", "_frames")

    def __init__(self, log, stack_id: int) -> None:
        self._log = log
        self._id = stack_id
        self._frames: list | None = None

    def frames(self) -> list[tuple[str, int, str]]:
        if self._frames is None:
            self._frames = user_frames(self._log.frames(self._id))
        return self._frames


class NativeFeed:
    """One tracker's use of the native log: starts and stops it and applies what it drains."""

    def __init__(self, log, tracker: TorchRaceTracker) -> None:
        self.log = log
        self.tracker = tracker
        self.plans: list[OpPlan | None] = []  # by the log's op id
        self._stacks: dict[int, LogStack | tuple] = {-1: ()}
        self._streams: dict[tuple[int, int], int] = {}  # (stream id, device) -> stream handle
        self.records = 0
        self.active = False
        self._failures_at_start = 0

    def start(self) -> None:
        from racecheck.detect.dispatch import native_plan

        tracker = self.tracker
        cuda = tracker.device_type == "cuda"
        # On CUDA the log takes CUDA's trace events too (op_log.cpp), in place of Python's callbacks.
        self.log.start(native_plan, self.drain, cuda, tracker.stacks_on, cuda)  # one tracker at a time
        self.active = True
        self._failures_at_start = self.log.failures()[0]
        self.log.watch_host(cuda)

    def stop(self) -> None:
        if self.active:
            self.drain()
            self.log.stop()
            self.active = False
            count, reason = self.log.failures()
            if count > self._failures_at_start:  # calls the log could not read: say so
                self.tracker.errors.append(
                    f"native log: {count - self._failures_at_start} operator call(s) not recorded ({reason})"
                )

    def _plan(self, name: str, overload: str) -> OpPlan | None:
        try:
            return plan_for(overload_named(name, overload))
        except Exception:  # noqa: BLE001 - a name that is no operator overload records nothing
            return None

    def _stack(self, stack_id: int):
        stack = self._stacks.get(stack_id)
        if stack is None:
            stack = self._stacks[stack_id] = LogStack(self.log, stack_id)
        return stack

    def _stream(self, stream_id: int, device: int) -> int | None:
        """The CUDA stream handle (the tracker's stream key) of a c10 stream id, or None for the
        current stream."""
        if stream_id == NO_STREAM:
            return None
        handle = self._streams.get((stream_id, device))
        if handle is None:
            import torch

            stream = torch.cuda.Stream(stream_id=stream_id, device_index=device, device_type=1)
            handle = self._streams[(stream_id, device)] = stream.cuda_stream
        return handle

    def drain(self) -> None:
        """Apply the log's records (the tracker itself calls no operator meanwhile)."""
        if not self.active:  # the log is another tracker's, or nobody's
            return
        records, items, names = self.log.drain(len(self.plans))
        for name, overload in names:
            self.plans.append(self._plan(name, overload))
        if records:
            self._apply(records, items)

    def _apply(self, records: bytes, items: bytes) -> None:
        """Apply a drained batch: `records` and `items` are the bytes of the log's arrays (RECORD,
        ITEM). A record's items are unpacked only while its tracker call runs, so a batch never
        holds thousands of tuples at once (which would wake Python's cyclic collector).

        The three kinds that make up nearly every batch (an operator, an allocation, a free) are
        applied here in line, with the stream and stack tables read in place: a Python call per
        record costs as much as the work it does. An allocation is pending until an operator
        first touches its block and so tells its size ([Note: pending allocations],
        torch_tracker.py); a free of a block no operator touched drops it unseen."""
        tracker = self.tracker
        plans = self.plans
        stacks = self._stacks
        streams = self._streams
        native_op = tracker._native_op
        pending = tracker._pending
        domains = tracker._domains
        engine = tracker.engine
        live = engine.live
        unpack_items = ITEM.iter_unpack
        view = memoryview(items)
        size = ITEM.size
        self.records += len(records) // RECORD.size
        for kind, op, stream_id, device, stack_id, first, count, extra in RECORD.iter_unpack(records):
            try:
                if kind <= COLLECTIVE_BEGIN or kind == ALLOCATED:
                    if stream_id == NO_STREAM:
                        stream = None
                    else:
                        stream = streams.get((stream_id, device))
                        if stream is None:
                            stream = self._stream(stream_id, device)
                if kind == OP:
                    plan = plans[op]
                    if plan is not None:
                        stack = stacks[stack_id] if stack_id in stacks else self._stack(stack_id)
                        native_op(
                            plan, stream, stack, unpack_items(view[first * size : (first + count) * size]), extra != 0
                        )
                elif kind == ALLOCATED:  # the caching allocator handed out the block at `extra`
                    if stream is None:
                        stream = tracker._current()
                    if stream not in domains:
                        tracker._key(stream)
                    if extra in live:  # the block is free again, so that record missed its free
                        engine.retire(extra)
                    pending[extra] = [stream, None, None]
                elif kind == FREED:
                    if pending.pop(extra, None) is None:  # else: no op ever touched it
                        stack = stacks[stack_id] if stack_id in stacks else self._stack(stack_id)
                        engine.free(extra, stack=stack)
                elif kind == COLLECTIVE_BEGIN:
                    plan = plans[op]
                    if plan is not None:  # its items wait for the collective's end: kept as tuples
                        its = list(unpack_items(view[first * size : (first + count) * size]))
                        tracker._native_collective_begin(plan, stream, self._stack(stack_id), its)
                elif kind == COLLECTIVE_END:
                    tracker._native_collective_end()
                elif kind == STREAM_RECORDED:
                    if count:
                        ptr = ITEM.unpack_from(view, first * size)[0]
                        tracker._native_record_stream(ptr, self._stream(extra, device))
                elif kind == EVENT_RECORDED:
                    tracker._on_event_record(extra, stream_id)
                elif kind == EVENT_WAITED:
                    tracker._on_event_wait(extra, stream_id)
                elif kind == EVENT_DELETED:
                    engine.forget_event(extra)
                elif kind == DEVICE_SYNCED:
                    tracker._on_host_sync("device")
                elif kind == STREAM_SYNCED:
                    tracker._on_host_sync("stream", stream_id)
                elif kind == EVENT_SYNCED:
                    tracker._on_host_sync("event", extra)
                elif kind == HOST_FREED:
                    tracker._host_freed(extra)
            except Exception as exc:  # never break the program under test
                tracker.errors.append(f"{type(exc).__name__}: {exc}")


class NativeTrackerOps:
    """TorchRaceTracker's side of the native path: the Python path's operator bookkeeping
    (TorchRaceTracker._op) over log items instead of tensors. An item is (address, bytes,
    storage start, storage bytes, access, device, pinned); see op_log.cpp."""

    # provided by TorchRaceTracker
    engine: Any
    device_type: str
    errors: list
    stats: Any
    ops: int
    _pending: dict
    _host: Any
    _domains: Any
    _current: Any
    _inflight: Any

    def _native_feed(self, path: str | None, *, custom_host: bool) -> NativeFeed | None:
        """The feed when this tracker runs the native path (see TorchRaceTracker's `path`)."""
        from racecheck.detect import op_log

        if custom_host:  # a Python predicate over tensors: only the Python path can ask it
            if path == "native":
                raise ValueError("host_memory needs the Python path (path='python')")
            return None
        choice = path or op_log.wanted()
        if choice == "python":
            return None
        if choice == "native":
            return NativeFeed(op_log.load_required(), self)  # type: ignore[arg-type]
        if self.device_type != "cuda":
            return None  # a CPU tracker's streams are Python's: native only when asked for
        log = op_log.load_available()
        return None if log is None else NativeFeed(log, self)  # type: ignore[arg-type]

    def _native_op(self, plan: OpPlan, stream: int | None, stack, its: Iterable[tuple], non_blocking: bool) -> None:
        pending = self._pending
        engine = self.engine
        live_get = engine.live.get
        items = []
        fresh_host = None
        host = self._host
        touches_host = False
        cuda = self.device_type == "cuda"
        for ptr, nbytes, start, size, access, device, pinned in its:
            if access == NATIVE_RESOLVE:  # a return that only sizes a fresh block: _resolve_block in line
                found = pending.pop(start, None) if pending else None
                if found is not None:
                    s, clock, alloc_stack = found
                    engine.allocate(s, start, size, stack=stack if alloc_stack is None else alloc_stack, clock=clock)
                continue
            alloc = live_get(ptr)
            if alloc is None and pending and ptr in pending:
                alloc = self._resolve_block(start, size, stack)  # type: ignore[attr-defined]
            if alloc is None:
                if not nbytes:
                    continue
                if cuda and device != 1:  # host memory
                    alloc = engine.allocation_at(ptr)
                    if alloc is None:
                        fresh_host = fresh_host or []
                        fresh_host.append((ptr, nbytes, access == NATIVE_WRITE, bool(pinned), start, size, self._watch))
                        continue
                else:
                    alloc = engine.allocation_at(ptr) or self._adopt_block(start, size, stack)  # type: ignore[attr-defined]
            if alloc.stream is host:
                touches_host = True
            if nbytes:
                items.append((ptr, nbytes, access == NATIVE_WRITE, alloc))
        if touches_host or fresh_host:
            self._host_op(plan, items, fresh_host, stream, stack, non_blocking)  # type: ignore[attr-defined]
            return
        if not items:
            return
        key = self._current() if stream is None else stream
        if key not in self._domains:
            self._key(key)  # type: ignore[attr-defined]
        engine.access_many(key, items, plan.name, stack)
        if plan.blocks_host:  # .item(): the host waited for the stream
            engine.host_sync_stream(key)
        self.ops += 1

    def _watch(self, ptr: int) -> None:
        feed = self._feed  # type: ignore[attr-defined]
        if not feed.log.watch(ptr):
            self.stats["unwatched_host"] += 1

    def _native_collective_begin(self, plan: OpPlan, stream: int | None, stack, its: list) -> None:
        from racecheck.detect.torch_tracker import _InFlight

        flight = _InFlight(plan, None, None, self._current() if stream is None else stream)
        flight.native = (stack, its)
        self._inflight = flight

    def _native_collective_end(self) -> None:
        flight, self._inflight = self._inflight, None
        if flight is not None and not flight.charged:
            self._charge(flight, None)  # type: ignore[attr-defined]

    def _native_record_stream(self, ptr: int, stream: int | None) -> None:
        alloc = self.engine.allocation_at(ptr)
        if alloc is not None and stream is not None:
            self.engine.record_stream(alloc.ptr, self._key(stream))  # type: ignore[attr-defined]
