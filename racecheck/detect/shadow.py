"""Shadow memory: the last accesses to every tracked byte, as sorted, non-overlapping cells.

A cell is a byte range whose bytes share one access history in the FastTrack style: the last
write, and the last read by each clock domain since that write. Cells are split where an access
starts or ends inside one (views and offsets), created over bytes a read sees for the first time,
and replaced by one cell over all the bytes a write covers. History is *not* dropped when a block
is freed: the accesses of a freed buffer stay on its bytes until an allocation that reuses them has
been checked against them (see engine.py, [Note: reuse]).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from racecheck.detect.allocations import Allocation
    from racecheck.detect.clocks import Domain


class Access:
    """One read or write of a byte range by a clock domain at an epoch (its own clock entry)."""

    __slots__ = ("domain", "epoch", "is_write", "op", "alloc", "stack")

    def __init__(self, domain: Domain, epoch: int, is_write: bool, op: str, alloc: Allocation, stack: object) -> None:
        self.domain = domain
        self.epoch = epoch
        self.is_write = is_write
        self.op = op
        self.alloc = alloc  # the Allocation (generation of the bytes) it touched
        self.stack: object = stack


class Cell:
    __slots__ = ("start", "end", "write", "reads")

    def __init__(
        self, start: int, end: int, write: Access | None = None, reads: dict[Domain, Access] | None = None
    ) -> None:
        self.start = start
        self.end = end
        self.write = write
        self.reads = reads  # domain -> Access, or None when there is none

    def split(self, at: int) -> Cell:
        """Cut this cell at `at`; it keeps [start, at) and the returned cell gets [at, end)."""
        right = Cell(at, self.end, self.write, dict(self.reads) if self.reads else None)
        self.end = at
        return right

    @property
    def empty(self) -> bool:
        return self.write is None and not self.reads


class ShadowMemory:
    def __init__(self) -> None:
        self._starts: list[int] = []
        self._cells: list[Cell] = []

    def __len__(self) -> int:
        return len(self._cells)

    def _boundary(self, addr: int) -> int:
        """Make sure no cell straddles `addr`; the index of the first cell starting at or after it."""
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            cell = self._cells[i]
            if cell.start == addr:
                return i
            if cell.end > addr:
                self._cells.insert(i + 1, cell.split(addr))
                self._starts.insert(i + 1, addr)
            return i + 1
        return 0

    def span(self, start: int, end: int, *, fill: bool) -> tuple[int, int]:
        """Index range [i, j) of the cells tiling [start, end), split at both ends. With `fill`,
        bytes never seen before get empty cells, so the range is covered without gaps."""
        i = bisect_right(self._starts, start) - 1
        if i >= 0:  # fast path: the range is exactly one existing cell (a whole-tensor access)
            cell = self._cells[i]
            if cell.start == start and cell.end == end:
                return i, i + 1
        i = self._boundary(start)
        j = self._boundary(end)
        if fill:
            pos, k = start, i
            while pos < end:
                if k < j and self._cells[k].start == pos:
                    pos = self._cells[k].end
                    k += 1
                    continue
                gap_end = self._cells[k].start if k < j else end
                self._cells.insert(k, Cell(pos, gap_end))
                self._starts.insert(k, pos)
                j += 1
                k += 1
                pos = gap_end
        return i, j

    def replace(self, i: int, j: int, cell: Cell) -> None:
        """Put `cell` in place of cells [i, j) (which must lie inside it, as from span())."""
        self._cells[i:j] = (cell,)
        self._starts[i:j] = (cell.start,)

    def drop_empty(self, i: int, j: int) -> None:
        """Remove cells in [i, j) that hold no access any more."""
        keep_cells = [c for c in self._cells[i:j] if not c.empty]
        if len(keep_cells) == j - i:
            return
        self._cells[i:j] = keep_cells
        self._starts[i:j] = [c.start for c in keep_cells]
