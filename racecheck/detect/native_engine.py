"""The native engine: the happens-before engine and the tracker's bookkeeping in C++ (hb_*.cpp,
the op log's extension module's `Engine` type), applying the native log's batches without a Python
object per record. This module is its Python side: what the C++ side asks Python (the current
stream, a c10 stream's handle, an operator's plan, whether a host storage can be watched, which
stacks have the same user frames) and the reports, built as RaceReport objects when asked.

engine.py with feed_apply.py stays the reference and the fallback: the native path applies the
same records with either (TorchRaceTracker's `engine`, $RACECHECK_DETECT_ENGINE), and
tests/test_detect_engines.py checks that both give the same reports.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

from racecheck.detect import stacks
from racecheck.detect.allocations import Allocation, AllocState
from racecheck.detect.clocks import Domain
from racecheck.detect.report import RaceKind, RaceReport
from racecheck.detect.shadow import Access

if TYPE_CHECKING:
    from racecheck.detect.native_feed import NativeFeed

_KINDS = (RaceKind.REUSE, RaceKind.READ_AFTER_WRITE, RaceKind.WRITE_AFTER_READ, RaceKind.WRITE_AFTER_WRITE)
_HOST = "host operations"  # torch_tracker's key of the host's own work ([Note: host accesses])
TRACKER_STATS = ("adopted", "unwatched_host", "collectives")


class NativeEngine:
    """One tracker's native engine, fed by `feed` (its op plans, stacks and stream handles)."""

    def __init__(self, log, feed: NativeFeed) -> None:
        self._feed = feed
        self._core = log.Engine(feed.tracker.device_type == "cuda", self)
        self._stack_keys: dict[tuple, int] = {}

    # -- what the C++ side asks (hb_tracker.h's Callbacks) -------------------------------------
    def current(self) -> int:
        return self._feed.tracker.current()

    def stream_key(self, stream_id: int, device: int) -> int | None:
        return self._feed.stream(stream_id, device)

    def op_info(self, op: int) -> tuple[str, bool] | None:
        plans = self._feed.plans
        plan = plans[op] if 0 <= op < len(plans) else None
        return None if plan is None else (plan.name, plan.blocks_host)

    def watch(self, storage: int) -> bool:
        log = self._feed.log
        return log is not None and bool(log.watch(storage))

    def stack_key(self, stack_id: int) -> int:
        """An id of the stack's user frames: races whose stacks share them are one report."""
        key = stacks.key(self._feed.stack(stack_id))
        return self._stack_keys.setdefault(key, len(self._stack_keys))

    # -- the engine as the tracker and its users read it --------------------------------------
    def apply(self, records: bytes, items: bytes) -> None:
        """Apply a drained batch; the tracker's errors and counters follow."""
        core, tracker = self._core, self._feed.tracker
        core.apply(records, items)
        errors = core.take_errors()
        if errors:
            tracker.errors.extend(errors)
        tracker.ops = core.counts()[0]
        for name, count in core.stats()[1].items():
            if count:
                tracker.stats[name] = count

    def rename(self, key: int, name: str) -> None:
        self._core.name_stream(key, name)

    @property
    def stats(self) -> collections.Counter[str]:
        """The engine's counters (unseen and unknown frees, reports dropped), as engine.py's."""
        return collections.Counter({k: v for k, v in self._core.stats()[0].items() if v})

    @property
    def accesses(self) -> int:
        return self._core.counts()[1]

    def reports(self) -> list[RaceReport]:
        """The races found so far, as the Python engine reports them (its objects, built now)."""
        domain_rows, _, _ = data = self._core.report_data()
        domains = [Domain(_HOST if key is None else key, name) for key, name in domain_rows]
        return reports_from(data, domains, self._feed.stack)


def reports_from(data: tuple, domains: list[Domain], stack: Callable[[int], object]) -> list[RaceReport]:
    """RaceReport objects of a native engine's report_data() (hb_module.cpp says its fields), over
    `domains` (the Domain of each of its domain rows, in order) and `stack` (a stack id's stack)."""
    _, alloc_rows, report_rows = data
    allocs: dict[int, Allocation] = {}
    for slot, (serial, ptr, nbytes, stream, alloc_stack, free_stack, live) in alloc_rows.items():
        alloc = Allocation(serial, ptr, nbytes, domains[stream] if stream >= 0 else None, stack(alloc_stack))
        if not live:
            alloc.state = AllocState.FREED
        if free_stack is not None:
            alloc.free_stack = stack(free_stack)
        allocs[slot] = alloc

    def access(row: tuple) -> Access:
        domain, epoch, is_write, op, slot, access_stack = row
        return Access(domains[domain], epoch, is_write, op, allocs[slot], stack(access_stack))

    return [RaceReport(_KINDS[kind], access(e), access(later), count) for kind, count, e, later in report_rows]
