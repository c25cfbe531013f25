"""The native path's hot loop: a batch drained from op_log.cpp's log, applied record by record to
the tracker and its happens-before engine (native_feed.py says how the records arrive).

A training step makes hundreds to thousands of records (an operator, an allocation, a free, an
event), and interpreted, the bookkeeping around each costs more than the engine's own work. So
this module is compiled with the engine (setup.py's NATIVE, native.py's _MODULES): the loop runs as
C, its calls into the engine are native calls, and the record's fields are unboxed ints. Without
a compiler it runs as it stands, with the same effects.

Per record it does what the Python path does per callback (torch_tracker.py): an operator's
accesses (`native_op`, the Python path's TorchRaceTracker._op over log items instead of tensors),
the pending allocation an allocation opens ([Note: pending allocations] there), the free of a
block, a kernel launched below the dispatcher (as an operator on its stream), and, through the
tracker's methods, the rare kinds (collectives, record_stream, events, synchronizations, the death
of a host buffer). It reads the feed and the tracker through two typed protocols, feed_types.py's
LogTables and LoopTracker: what it needs of them, and no private name.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from racecheck.detect.engine import HappensBefore

# op_log.cpp's record types
OP: Final = 0
COLLECTIVE_BEGIN: Final = 1
COLLECTIVE_END: Final = 2
STREAM_RECORDED: Final = 3
HOST_FREED: Final = 4
ALLOCATED: Final = 5
FREED: Final = 6
EVENT_RECORDED: Final = 7
EVENT_WAITED: Final = 8
EVENT_DELETED: Final = 9
DEVICE_SYNCED: Final = 10
STREAM_SYNCED: Final = 11
EVENT_SYNCED: Final = 12
KERNEL: Final = 13  # a kernel launched below the dispatcher (kernel_launches.py); `extra`: its stream
# op_log.cpp's access codes of an item (its Access enum); RESOLVE: a return that only sizes a fresh block
READ: Final = 0
WRITE: Final = 1
RESOLVE: Final = 2
CUDA_DEVICE: Final = 1  # an item's device: 0 CPU, 1 CUDA, 2 other
NO_STREAM: Final = -(2**63)  # the record's stream is the tracker's current stream
# op_log.cpp's Record and Item, as its drain hands their arrays over (native byte order, C layout):
# Record (type, op id, stream id, device index, stack id, first item, item count, extra) and
# Item (address, bytes, storage start, storage bytes, access, device, pinned).
RECORD: Final = struct.Struct("=b3xiqi4xqIIq")
ITEM: Final = struct.Struct("=QQQQbbb5x")

if TYPE_CHECKING:
    from racecheck.detect.allocations import Allocation
    from racecheck.detect.dispatch import OpPlan
    from racecheck.detect.feed_types import LogTables, LoopTracker


def apply_batch(feed: LogTables, tracker: LoopTracker, engine: HappensBefore, records: bytes, items: bytes) -> None:
    """Apply the records (the bytes of the log's Record array) whose items are `items`; `feed`
    holds the op plans, stacks and streams they name. A record's items are unpacked only while its
    operator is applied, so a batch never holds thousands of tuples at once (which would wake
    Python's cyclic collector). An error is the tracker's to report, never the program's."""
    plans: list = feed.plans
    stacks: dict = feed.stacks
    streams: dict = feed.streams
    pending: dict = tracker.pending
    domains = tracker.domains
    live = engine.live
    cuda = tracker.device_type == "cuda"
    view = memoryview(items)
    size: int = ITEM.size
    kind: int
    op: int
    stream_id: int
    device: int
    stack_id: int
    first: int
    count: int
    extra: int
    for kind, op, stream_id, device, stack_id, first, count, extra in RECORD.iter_unpack(records):
        try:
            stream: Any = None
            if (kind == OP or kind == ALLOCATED) and stream_id != NO_STREAM:
                stream = streams.get((stream_id, device))
                if stream is None:
                    stream = feed.stream(stream_id, device)
            if kind == OP or kind == KERNEL:  # a kernel (KERNEL) runs on the raw stream in `extra`
                plan = plans[op]
                if plan is not None:
                    stack = stacks[stack_id] if stack_id in stacks else feed.stack(stack_id)
                    its = ITEM.iter_unpack(view[first * size : (first + count) * size])
                    if kind == OP:
                        native_op(tracker, engine, cuda, plan, stream, stack, its, extra != 0)
                    else:
                        native_op(tracker, engine, cuda, plan, extra, stack, its, False)
            elif kind == ALLOCATED:  # the caching allocator handed out the block at `extra`
                if stream is None:
                    stream = tracker.current()
                if stream not in domains:
                    tracker.key(stream)
                if extra in live:  # the block is free again, so that record missed its free
                    engine.retire(extra)
                pending[extra] = [stream, None, None]  # until an operator tells its size
            elif kind == FREED:
                if pending.pop(extra, None) is None:  # else: no operator ever touched it
                    stack = stacks[stack_id] if stack_id in stacks else feed.stack(stack_id)
                    engine.free(extra, stack=stack)
            else:
                its_bytes = view[first * size : (first + count) * size]
                _apply_rare(feed, tracker, engine, kind, op, stream_id, device, stack_id, its_bytes, extra)
        except Exception as exc:  # never break the program under test
            tracker.errors.append(f"{type(exc).__name__}: {exc}")


def _apply_rare(
    feed: LogTables,
    tracker: LoopTracker,
    engine: HappensBefore,
    kind: int,
    op: int,
    stream_id: int,
    device: int,
    stack_id: int,
    its: memoryview,
    extra: int,
) -> None:
    """A record of the rare kinds, through the tracker's methods: a collective's begin and end,
    record_stream, an event's record, wait or deletion, a host synchronization, the death of a
    host buffer the tracker follows. `its`: the bytes of its items."""
    if kind == COLLECTIVE_BEGIN:
        plan = feed.plans[op]
        if plan is not None:  # its items wait for the collective's end: kept as tuples
            stream = feed.stream(stream_id, device)  # None: the current stream
            tracker.collective_begin(plan, stream, feed.stack(stack_id), list(ITEM.iter_unpack(its)))
    elif kind == COLLECTIVE_END:
        tracker.collective_end()
    elif kind == STREAM_RECORDED:
        if len(its):
            tracker.record_stream_at(ITEM.unpack_from(its, 0)[0], feed.stream(extra, device))
    elif kind == EVENT_RECORDED:
        tracker.on_event_record(extra, stream_id)
    elif kind == EVENT_WAITED:
        tracker.on_event_wait(extra, stream_id)
    elif kind == EVENT_DELETED:
        engine.forget_event(extra)
    elif kind == DEVICE_SYNCED:
        tracker.on_host_sync("device")
    elif kind == STREAM_SYNCED:
        tracker.on_host_sync("stream", stream_id)
    elif kind == EVENT_SYNCED:
        tracker.on_host_sync("event", extra)
    elif kind == HOST_FREED:
        tracker.host_freed(extra)


def native_op(
    tracker: LoopTracker,
    engine: HappensBefore,
    cuda: bool,
    plan: OpPlan,
    stream: int | None,
    stack: object,
    its: Iterable[tuple],
    non_blocking: bool,
) -> None:
    """One operator's items (`its`: Item tuples) as accesses on `stream` (None: the current one):
    a fresh block's pending allocation resolved to its size, host memory handed to the tracker's
    host bookkeeping, the rest checked by the engine in one call."""
    pending: dict = tracker.pending
    live = engine.live
    items: list[tuple[int, int, bool, Any]] = []
    fresh_host: list = []
    host = tracker.host
    touches_host = False
    ptr: int
    nbytes: int
    start: int
    size: int
    access: int
    device: int
    pinned: int
    for ptr, nbytes, start, size, access, device, pinned in its:
        if access == RESOLVE:  # a return that only sizes a fresh block
            if pending and start in pending:
                resolve_block(tracker, engine, start, size, stack)
            continue
        alloc = live.get(ptr)
        if alloc is None and pending and ptr in pending:
            alloc = resolve_block(tracker, engine, start, size, stack)
        if alloc is None:
            if not nbytes:
                continue
            alloc = engine.allocation_at(ptr)
            if alloc is None:
                if cuda and device != CUDA_DEVICE:  # host memory no stream has touched yet
                    fresh_host.append((ptr, nbytes, access == WRITE, pinned != 0, start, size, tracker.watch_host))
                    continue
                alloc = tracker.adopt_block(start, size, stack)
        if alloc.stream is host:
            touches_host = True
        if nbytes:
            items.append((ptr, nbytes, access == WRITE, alloc))
    if not items:
        return  # nothing on a stream: host memory that no stream touched stays untracked
    if touches_host or fresh_host:
        tracker.host_op(plan, items, fresh_host, stream, stack, non_blocking)
        return
    key = tracker.current() if stream is None else stream
    if key not in tracker.domains:
        tracker.key(key)
    engine.access_many(key, items, plan.name, stack)
    if plan.blocks_host:  # .item(): the host waited for the stream
        engine.host_sync_stream(key)
    tracker.ops += 1


def resolve_block(
    tracker: LoopTracker, engine: HappensBefore, ptr: int, nbytes: int, stack: object
) -> Allocation | None:
    """The pending allocation at `ptr` as the engine's Allocation, now that an operator tells its
    size, its reuse checked against the stream's clock at the allocation ([Note: pending
    allocations] in torch_tracker.py); None when no allocation is pending there. Both paths call
    it (TorchRaceTracker._resolve_block)."""
    found = tracker.pending.pop(ptr, None)
    if found is None:
        return None
    stream, clock, alloc_stack = found
    if alloc_stack is None:
        alloc_stack = stack if stack is not None else tracker.capture()
    return engine.allocate(stream, ptr, nbytes, stack=alloc_stack, clock=clock)


def freeze(pending: dict, engine: HappensBefore) -> None:
    """Copy each pending allocation's stream clock that is not copied yet: the tracker is about to
    apply a wait or a host synchronization, which may grow it (TorchRaceTracker._freeze)."""
    for entry in pending.values():
        if entry[1] is None:
            entry[1] = engine.clock_now(entry[0])
