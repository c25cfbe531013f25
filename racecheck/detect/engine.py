"""The happens-before engine: vector clocks per stream and for the host, allocations and frees,
record_stream holds, and byte-range access histories, checked at every access and every reuse.

Both front ends feed it: racecheck.detect.observer (the runtime's own events, on the CPU
emulation and on CUDA) and racecheck.detect.torch_tracker (PyTorch ops and CUDA trace callbacks,
for code that is not ours). Streams and events are identified by whatever hashable key the front
end uses (runtime Stream objects, cudaStream_t handles).

[Note: clocks]
Every stream is a clock domain with a vector clock; its own entry is the epoch stamped on its
accesses. Recording an event snapshots the stream's clock (and then advances its own entry, so
later work is not covered); waiting merges the snapshot. The host is a domain too, without
accesses of its own: its clock is what the host *knows to be complete*, merged at
stream/event/device synchronization. Work enqueued afterwards on any stream is ordered after
that, so a stream merges the host clock before each access or allocation. Enqueueing alone orders
nothing: the host does not wait for the default stream, so a side stream that reads default-stream
output without a wait races even though the host issued the write first (on the CPU emulation the
default stream runs inline, which hides this from timing but not from the clocks).

[Note: reuse]
A free is a host event: the block goes back to its allocation stream's pool at once, and its bytes'
access history is kept. An allocation on stream S that reuses bytes is checked against every access
still recorded on them: an access by another stream T that S's clock does not cover is a
free-while-in-use race. record_stream(t, s) is modelled as an event recorded on s at the free that
the reusing allocation waits for (the allocator keeps the block out of the pool until it
completes), so accesses covered by that snapshot, or already known complete by the host, are
dropped. Accesses ordered before S but not known complete are kept: a stream U that then uses the
new buffer without being ordered after them races too, and is reported at its access. Memory only
moves between stream pools through a synchronizing cudaFree, so bytes of a block from another
stream's pool count as complete.

This module and shadow.py are compiled by mypyc at install (setup.py; racecheck/detect/native.py
says which build runs): keep them fully annotated, since the compiled build checks annotations at
run time and uses them to make attribute access and arithmetic native.
"""

from __future__ import annotations

import collections
import itertools
import threading
from bisect import bisect_right
from collections.abc import Mapping, MutableMapping

from racecheck.detect.allocations import Allocation, AllocState, LiveAllocations
from racecheck.detect.clocks import Clock, Domain, join
from racecheck.detect.report import RaceKind, RaceReport
from racecheck.detect.shadow import Access, Cell, ShadowMemory
from racecheck.detect.stacks import key as stack_key

MAX_REPORTS = 64  # distinct races kept per engine; more are only counted


def _kept_at_reuse(acc: Access, d: Domain, clock: Clock, host: Clock, racing: dict[Domain, Access]) -> bool:
    """Whether an access to bytes that stream d's new allocation reuses stays on them ([Note:
    reuse]); one not ordered before the allocation is noted in `racing` (by its stream, a read
    preferred) and dropped."""
    dom, epoch = acc.domain, acc.epoch
    gen = acc.alloc
    if (
        host.get(dom, 0) >= epoch
        or (gen.stream is not None and gen.stream is not d)
        or (gen.holds and any(h.get(dom, 0) >= epoch for h in gen.holds))
    ):
        return False  # complete
    if dom is d or clock.get(dom, 0) >= epoch:
        return True  # ordered before the allocation, not known complete
    prev = racing.get(dom)
    if prev is None or (prev.is_write and not acc.is_write):
        racing[dom] = acc  # a read names the consumer the reuse cheats
    return False


class HappensBefore:
    def __init__(self, *, events: MutableMapping | None = None) -> None:
        self.lock = threading.RLock()  # frees can arrive on any thread
        self.host = Domain("host", "host")
        self._host_version = 0
        self._domains: dict[object, Domain] = {}
        self._events: MutableMapping[object, Clock] = {} if events is None else events  # event key -> clock snapshot
        self._live = LiveAllocations()
        self.shadow = ShadowMemory()
        self._reports: dict[tuple, RaceReport] = {}
        self._serials = itertools.count(1)
        self.stats: collections.Counter[str] = collections.Counter()  # rare events; the hot counter is `accesses`
        self.accesses = 0

    # -- domains and clocks ----------------------------------------------------------------
    def domain(self, key, name: str | None = None, *, inline: bool = False) -> Domain:
        d = self._domains.get(key)
        if d is None:
            d = self._domains[key] = Domain(key, name if name is not None else str(key), inline=inline)
        return d

    def rename(self, key, name: str) -> None:
        self.domain(key).name = name

    # Read-only views for front ends that feed the engine from a hot path (torch_tracker): the
    # engine's own dicts typed as Mapping, so a lookup stays one dict call; never mutate them.
    @property
    def domains(self) -> Mapping[object, Domain]:
        """The domains by key, as `domain` made them."""
        return self._domains

    @property
    def live(self) -> Mapping[int, Allocation]:
        """The live allocations by start address (`allocation_at` finds one by any address)."""
        return self._live.by_start

    def _now(self, d: Domain) -> Clock:
        """d's clock, after merging what the host knows complete (see [Note: clocks])."""
        if d.host_version != self._host_version:
            join(d.clock, self.host.clock)
            d.host_version = self._host_version
        return d.clock

    def _snapshot(self, d: Domain) -> Clock:
        snap = dict(self._now(d))
        d.clock[d] += 1  # later work on d is not covered by this snapshot
        return snap

    def record_event(self, event, stream) -> None:
        with self.lock:
            self._events[event] = self._snapshot(self.domain(stream))

    def wait_event(self, event, stream) -> None:
        with self.lock:
            snap = self._events.get(event)
            if snap is not None:  # an event never recorded is complete: waiting orders nothing
                join(self._now(self.domain(stream)), snap)

    def forget_event(self, event) -> None:
        with self.lock:
            self._events.pop(event, None)

    def _host_learns(self, snap: Clock) -> None:
        join(self.host.clock, snap)
        self._host_version += 1

    def host_sync_stream(self, stream) -> None:
        with self.lock:
            self._host_learns(self._snapshot(self.domain(stream)))

    def host_sync_event(self, event) -> None:
        with self.lock:
            snap = self._events.get(event)
            if snap is not None:
                self._host_learns(snap)

    def host_sync_all(self) -> None:
        with self.lock:
            for d in list(self._domains.values()):
                self._host_learns(self._snapshot(d))

    def clock_now(self, stream) -> Clock:
        """A copy of the stream's clock now (for front ends that check an allocation later)."""
        with self.lock:
            return dict(self._now(self.domain(stream)))

    # -- allocations -----------------------------------------------------------------------
    # A live allocation is known by its start address: live blocks never share one.
    def allocate(self, stream, ptr: int, nbytes: int, *, stack: object = (), clock: Clock | None = None) -> Allocation:
        """A block handed out on `stream` (None: allocated before the detector saw it, adopted
        without a stream); checks the reuse of its bytes ([Note: reuse]). `clock`: the stream's
        clock at the allocation, when the front end learns the size later."""
        with self.lock:
            d = (self._domains.get(stream) or self.domain(stream)) if stream is not None else None
            live = self._live
            end = ptr + nbytes
            if live.clashes(ptr, end):  # a live record at these bytes missed its free
                for old in live.overlapping(ptr, end):
                    self._retire(old)
            alloc = Allocation(next(self._serials), ptr, nbytes, d, stack)
            if nbytes > 0 and d is not None:
                self._check_reuse(alloc, d, clock if clock is not None else self._now(d))
            live.add(alloc)
            return alloc

    def _retire(self, alloc: Allocation) -> None:
        self._live.remove(alloc)
        alloc.state = AllocState.FREED
        self.stats["unseen_frees"] += 1

    def retire(self, ptr: int) -> None:
        """The live allocation starting at `ptr` was freed unseen (its block is handed out again)."""
        with self.lock:
            alloc = self._live.by_start.get(ptr)
            if alloc is not None:
                self._retire(alloc)

    def record_stream(self, ptr: int, stream) -> None:
        with self.lock:
            alloc = self._live.by_start.get(ptr)
            if alloc is not None:
                alloc.recorded = alloc.recorded | {self.domain(stream)}

    def free(self, ptr: int, *, deferred_to=(), stack=()) -> Allocation | None:
        """The last reference to the block at `ptr` died on the host; `deferred_to`: the streams
        record_stream named."""
        with self.lock:
            alloc = self._live.by_start.get(ptr)
            if alloc is None:
                self.stats["unknown_frees"] += 1
                return None
            self._live.remove(alloc)
            alloc.state = AllocState.FREED
            alloc.free_stack = stack
            if alloc.recorded or deferred_to:
                held = alloc.recorded | {self.domain(s) for s in deferred_to}
                # the allocator's event on each such stream, recorded at the free
                alloc.holds = tuple(self._snapshot(d) for d in held if d is not alloc.stream)
            return alloc

    def allocation_at(self, ptr: int) -> Allocation | None:
        """The live allocation containing address `ptr`."""
        return self._live.containing(ptr)

    def _check_reuse(self, alloc: Allocation, d: Domain, clock: Clock) -> None:
        shadow = self.shadow
        cells = shadow._cells
        ptr, end = alloc.ptr, alloc.end
        # The cells overlapping the block, visited without splitting any: most reuses drop nothing
        # (the same stream's history stays, see [Note: reuse]), and then none needs splitting.
        # An access by d itself to d's own block, without record_stream holds, stays (complete or
        # not: one the host knows complete is ordered before everything that follows).
        k = bisect_right(shadow._starts, ptr) - 1
        if k < 0 or cells[k].end <= ptr:
            k += 1
        n = len(cells)
        others = []  # accesses that are not d's own to d's own block: only these can go or race
        while k < n:
            cell = cells[k]
            if cell.start >= end:
                break
            k += 1
            w = cell.write
            if w is not None and (w.domain is not d or w.alloc.stream is not d or w.alloc.holds):
                others.append(w)
            if cell.reads:
                for r in cell.reads.values():
                    if r.domain is not d or r.alloc.stream is not d or r.alloc.holds:
                        others.append(r)
        if not others:
            return
        host = self.host.clock
        racing: dict[Domain, Access] = {}  # one report per racing stream: its read if any
        dropped = {id(acc) for acc in others if not _kept_at_reuse(acc, d, clock, host, racing)}
        if dropped:  # drop them from the block's bytes only: split the cells at its ends
            i, j = shadow.span(ptr, end, fill=False)
            for cell in cells[i:j]:
                if cell.write is not None and id(cell.write) in dropped:
                    cell.write = None
                reads = cell.reads
                if reads:
                    for dom in [dom for dom, r in reads.items() if id(r) in dropped]:
                        del reads[dom]
                    if not reads:
                        cell.reads = None
            shadow.drop_empty(i, j)
        if racing:
            later = Access(d, clock.get(d, 0), True, "allocation", alloc, alloc.stack)
            for acc in racing.values():
                self._report(RaceKind.REUSE, acc, later)

    # -- accesses --------------------------------------------------------------------------
    def access(
        self,
        stream,
        ptr: int,
        nbytes: int,
        *,
        write: bool,
        op: str,
        stack=(),
        alloc: Allocation | None = None,
        record: bool = True,
    ) -> None:
        """Work on `stream` reads or writes [ptr, ptr + nbytes). Only memory inside a live
        allocation is tracked: other memory has no lifetime the detector could reason about.
        With `record=False` a read is checked against earlier writes but not remembered."""
        if nbytes <= 0:
            return
        with self.lock:
            if alloc is None:
                alloc = self.allocation_at(ptr)
                if alloc is None:
                    self.stats["untracked_accesses"] += 1
                    return
            d = self.domain(stream)
            self._access(d, self._now(d), ptr, nbytes, write, op, stack, alloc, record)
            self.accesses += 1

    def access_many(self, stream, items: list[tuple[int, int, bool, Allocation]], op: str, stack: object = ()) -> None:
        """One operator's accesses: `items` of (ptr, nbytes, is_write, allocation), all live.
        The hot path of the PyTorch tracker: a whole-cell access (a tensor touched as it was last
        time) is checked inline; anything else goes through `_access`."""
        with self.lock:
            d = self._domains.get(stream) or self.domain(stream)
            clock = self._now(d)
            epoch = clock[d]
            shadow = self.shadow
            starts, cells = shadow._starts, shadow._cells
            for ptr, nbytes, write, alloc in items:
                end = ptr + nbytes
                i = bisect_right(starts, ptr) - 1
                cell = cells[i] if i >= 0 else None
                if cell is None or cell.start != ptr or cell.end != end or end > alloc.end:
                    self._access(d, clock, ptr, nbytes, write, op, stack, alloc, True)  # clamps to alloc
                    continue
                acc = Access(d, epoch, write, op, alloc, stack)
                w = cell.write
                if w is not None and w.domain is not d and clock.get(w.domain, 0) < w.epoch:
                    self._report(RaceKind.WRITE_AFTER_WRITE if write else RaceKind.READ_AFTER_WRITE, w, acc)
                reads = cell.reads
                if write:
                    if reads is not None:
                        for r in reads.values():
                            if r.domain is not d and clock.get(r.domain, 0) < r.epoch:
                                self._report(RaceKind.WRITE_AFTER_READ, r, acc)
                        cell.reads = None
                    cell.write = acc
                elif reads is None:
                    cell.reads = {d: acc}
                else:
                    reads[d] = acc
            self.accesses += len(items)

    def _access(
        self,
        d: Domain,
        clock: Clock,
        ptr: int,
        nbytes: int,
        write: bool,
        op: str,
        stack: object,
        alloc: Allocation,
        record: bool,
    ) -> None:
        end = ptr + nbytes
        if end > alloc.end:
            end = alloc.end
        if end <= ptr:
            return  # no byte of the allocation (one of 0 bytes at this address)
        acc = Access(d, clock[d], write, op, alloc, stack)
        shadow = self.shadow
        # A write leaves one history on all its bytes: the cells it covers (gaps need none) are
        # checked, then replaced by one cell. A read adds itself to every cell, gaps filled.
        i, j = shadow.span(ptr, end, fill=not write)
        reported = None  # one report per earlier access, however many cells
        for cell in shadow._cells[i:j]:
            w = cell.write
            if w is not None and w.domain is not d and clock.get(w.domain, 0) < w.epoch:
                reported = reported or set()
                if id(w) not in reported:
                    reported.add(id(w))
                    self._report(RaceKind.WRITE_AFTER_WRITE if write else RaceKind.READ_AFTER_WRITE, w, acc)
            if write:
                reads = cell.reads
                if reads:
                    for r in reads.values():
                        if r.domain is not d and clock.get(r.domain, 0) < r.epoch:
                            reported = reported or set()
                            if id(r) not in reported:
                                reported.add(id(r))
                                self._report(RaceKind.WRITE_AFTER_READ, r, acc)
            elif record:
                if cell.reads is None:
                    cell.reads = {d: acc}
                else:
                    cell.reads[d] = acc
        if write:
            shadow.replace(i, j, Cell(ptr, end, acc))

    # -- reports ---------------------------------------------------------------------------
    def _report(self, kind: RaceKind, earlier: Access, later: Access) -> None:
        key = (
            kind,
            earlier.domain.name,
            earlier.op,
            earlier.is_write,
            stack_key(earlier.stack),
            later.domain.name,
            later.op,
            stack_key(later.stack),
        )
        found = self._reports.get(key)
        if found is not None:
            found.count += 1
        elif len(self._reports) < MAX_REPORTS:
            self._reports[key] = RaceReport(kind, earlier, later)
        else:
            self.stats["reports_dropped"] += 1

    def reports(self) -> list[RaceReport]:
        with self.lock:
            return list(self._reports.values())
