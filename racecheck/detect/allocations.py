"""Allocations as the happens-before engine keeps them: one generation of a block each, and the
live ones by address (engine.py, [Note: reuse]).

Compiled with the engine by mypyc at install (setup.py): keep it fully annotated.
"""

from __future__ import annotations

import enum
from bisect import bisect_right

from racecheck.detect.clocks import Clock, Domain


class AllocState(enum.Enum):
    LIVE = "live"
    FREED = "freed"


class Allocation:
    """One generation of a block: from its allocation to its free."""

    __slots__ = ("serial", "ptr", "nbytes", "end", "stream", "stack", "state", "free_stack", "holds", "recorded")

    def __init__(self, serial: int, ptr: int, nbytes: int, stream: Domain | None, stack: object) -> None:
        self.serial = serial
        self.ptr = ptr
        self.nbytes = nbytes
        self.end = ptr + nbytes
        self.stream: Domain | None = stream  # None: allocated before the detector saw it
        self.stack: object = stack
        self.state = AllocState.LIVE
        self.free_stack: object = None
        self.holds: tuple[Clock, ...] = ()  # clock snapshots of record_stream'd streams at the free
        self.recorded: frozenset[Domain] = frozenset()  # streams given to record_stream while live


class LiveAllocations:
    """The live allocations by start address (live blocks never share one), and those addresses
    sorted, so that the allocation containing any address is found by bisection."""

    def __init__(self) -> None:
        self.by_start: dict[int, Allocation] = {}
        self.starts: list[int] = []

    def add(self, alloc: Allocation) -> None:
        self.by_start[alloc.ptr] = alloc
        self.starts.insert(bisect_right(self.starts, alloc.ptr), alloc.ptr)

    def remove(self, alloc: Allocation) -> None:
        del self.by_start[alloc.ptr]
        starts = self.starts
        del starts[bisect_right(starts, alloc.ptr) - 1]  # kept in step with by_start

    def clashes(self, start: int, end: int) -> bool:
        """Whether a live allocation overlaps [start, end) (its free was missed)."""
        starts = self.starts
        i = bisect_right(starts, start)
        return bool(
            (i and (starts[i - 1] == start or self.by_start[starts[i - 1]].end > start))
            or (i < len(starts) and starts[i] < end)
        )

    def overlapping(self, start: int, end: int) -> list[Allocation]:
        starts = self.starts
        i = max(bisect_right(starts, start) - 1, 0)
        out = []
        while i < len(starts) and starts[i] <= end:
            a = self.by_start[starts[i]]
            if a.ptr == start or (a.end > start and a.ptr < end):
                out.append(a)
            i += 1
        return out

    def containing(self, ptr: int) -> Allocation | None:
        alloc = self.by_start.get(ptr)
        if alloc is not None:
            return alloc
        i = bisect_right(self.starts, ptr) - 1
        if i >= 0:
            alloc = self.by_start[self.starts[i]]
            if ptr < alloc.end:
                return alloc
        return None
