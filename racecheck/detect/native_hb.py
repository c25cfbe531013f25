"""The runtime observer's engine in C++: the part of engine.py's HappensBefore that
observer.RaceDetector calls, over `_op_log.HappensBefore` (hb::Engine itself, [Note: the engine
alone] in hb_module.cpp). The C++ engine takes integers where the observer hands Python objects:
each stream key gets one for the detector's life, each event one until the event is collected
(the engine then forgets it, as engine.py's WeakKeyDictionary of events does), each stack an index
into a table kept here. Reports come back as engine.py's RaceReport objects, over the Domain
objects made here (their names, and `inline`, which the observer sets), so that their text is
engine.py's own.

RaceDetector(engine="native"), or $RACECHECK_DETECT_ENGINE=native, selects it; engine.py stays the
runtime observer's default and the reference, with the same reports (tests/test_detect_engines.py
runs the catalogue's scenarios and the soundness check's programs on both, fed the same events:
ComparedEngines below). One cost engine.py does not have: the stack table keeps every stack the
run captured (one per launch, allocation and free; the C++ engine does not say when it forgets
an access), which suits a test's run, not a process that detects for hours.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from types import ModuleType

from racecheck.detect import stacks
from racecheck.detect.clocks import Domain
from racecheck.detect.native_engine import reports_from
from racecheck.detect.report import RaceReport


class LiveBlock:
    """The live allocation containing an address, as allocation_at answers (start and size)."""

    __slots__ = ("ptr", "nbytes", "end")

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes, self.end = ptr, nbytes, ptr + nbytes


class NativeHappensBefore:
    """engine.py's HappensBefore, as the runtime observer calls it, on the native engine."""

    def __init__(self, log: ModuleType) -> None:
        self._core = log.HappensBefore(self._stack_key)
        self.lock = threading.RLock()  # the observer's events arrive from several threads
        self._ids: dict[object, int] = {}  # stream key -> the engine's key
        self._domains: dict[int, Domain] = {}  # the engine's key -> the Domain reports show
        self._events: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._next_event = itertools.count(1)
        self._collected: list[int] = []  # events gone since the last record: the engine forgets them
        self._stacks: list[object] = []  # stack id -> the stack as captured
        self._user_frames: dict[tuple, int] = {}  # a stack's user frames -> their id

    # -- ids ---------------------------------------------------------------------------------
    def domain(self, key, name: str | None = None, *, inline: bool = False) -> Domain:
        with self.lock:
            i = self._ids.get(key)
            if i is None:
                i = self._ids[key] = len(self._ids)
                d = self._domains[i] = Domain(key, name if name is not None else str(key), inline=inline)
                self._core.domain(i, d.name)
            return self._domains[i]

    def _id(self, key) -> int:
        i = self._ids.get(key)
        if i is None:
            self.domain(key)
            i = self._ids[key]
        return i

    def rename(self, key, name: str) -> None:
        with self.lock:
            self.domain(key).name = name
            self._core.rename(self._id(key), name)

    def _event(self, event, *, make: bool) -> int | None:
        i = self._events.get(event)
        if i is None and make:
            i = self._events[event] = next(self._next_event)
            # Noted when the event is collected (whenever the collector runs, inside a call of the
            # engine too), forgotten at the next record; the note holds neither engine alive.
            weakref.finalize(event, self._collected.append, i).atexit = False
        return i

    def _stack(self, stack) -> int:
        """The id of `stack`: a launch's reads and writes share the one stack the observer captured."""
        if self._stacks and self._stacks[-1] is stack:
            return len(self._stacks) - 1
        self._stacks.append(stack)
        return len(self._stacks) - 1

    def _stack_key(self, stack_id: int) -> int:
        """The id of a stack's user frames (races whose stacks share them are one report)."""
        return self._user_frames.setdefault(stacks.key(self._stacks[stack_id]), len(self._user_frames))

    # -- clocks ------------------------------------------------------------------------------
    def record_event(self, event, stream) -> None:
        with self.lock:
            while self._collected:
                self._core.forget_event(self._collected.pop())
            self._core.record_event(self._event(event, make=True), self._id(stream))

    def wait_event(self, event, stream) -> None:
        with self.lock:
            i = self._event(event, make=False)
            if i is not None:  # never recorded: complete, orders nothing
                self._core.wait_event(i, self._id(stream))

    def forget_event(self, event) -> None:
        with self.lock:
            i = self._events.pop(event, None)
            if i is not None:
                self._core.forget_event(i)

    def host_sync_stream(self, stream) -> None:
        with self.lock:
            self._core.host_sync_stream(self._id(stream))

    def host_sync_event(self, event) -> None:
        with self.lock:
            i = self._event(event, make=False)
            if i is not None:
                self._core.host_sync_event(i)

    def host_sync_all(self) -> None:
        with self.lock:
            self._core.host_sync_all()

    # -- allocations -------------------------------------------------------------------------
    def allocate(self, stream, ptr: int, nbytes: int, *, stack: object = ()) -> None:
        with self.lock:
            self._core.allocate(None if stream is None else self._id(stream), ptr, nbytes, self._stack(stack))

    def free(self, ptr: int, *, deferred_to=(), stack=()) -> None:
        with self.lock:
            self._core.free(ptr, [self._id(s) for s in deferred_to], self._stack(stack))

    def record_stream(self, ptr: int, stream) -> None:
        with self.lock:
            self._core.record_stream(ptr, self._id(stream))

    def allocation_at(self, ptr: int) -> LiveBlock | None:
        with self.lock:
            found = self._core.allocation_at(ptr)
        return None if found is None else LiveBlock(*found)

    # -- accesses ----------------------------------------------------------------------------
    def access(self, stream, ptr: int, nbytes: int, *, write: bool, op: str, stack=(), record: bool = True) -> None:
        """engine.py's access: memory outside every live allocation is not tracked."""
        if nbytes <= 0:
            return
        with self.lock:
            self._core.access(self._id(stream), ptr, nbytes, write, op, self._stack(stack), record)

    # -- results -----------------------------------------------------------------------------
    @property
    def stats(self) -> collections.Counter[str]:
        with self.lock:
            return collections.Counter({k: v for k, v in self._core.stats().items() if v})

    @property
    def accesses(self) -> int:
        with self.lock:
            return self._core.accesses()

    def reports(self) -> list[RaceReport]:
        """The races found so far, as engine.py's objects (built now)."""
        with self.lock:
            domain_rows, _, _ = data = self._core.report_data()
            return reports_from(data, [self._domains[key] for key, _ in domain_rows], self._stacks.__getitem__)


class EnginesDisagree(AssertionError):
    """The native engine reported otherwise than engine.py on the same events."""


class ComparedEngines:
    """engine.py and the native engine fed the same events, one call after the other: the runtime
    observer's `engine="compare"` ($RACECHECK_DETECT_ENGINE=compare), which checks the native engine
    on whole runs (the catalogue's, in CI and in bench/engines_cpu.sh). It answers as engine.py
    does; `reports()` raises EnginesDisagree, which fails the test, where the two reports' texts
    differ."""

    def __init__(self, reference, native: NativeHappensBefore) -> None:
        self.reference, self.native = reference, native
        self.lock = reference.lock

    def domain(self, key, name: str | None = None, *, inline: bool = False) -> Domain:
        self.native.domain(key, name, inline=inline).inline = inline  # as the observer sets the reference's
        return self.reference.domain(key, name, inline=inline)

    def allocation_at(self, ptr: int):
        return self.reference.allocation_at(ptr)

    def __getattr__(self, name: str):
        """The other calls (events, synchronizations, allocations, accesses) go to both engines."""
        first, second = getattr(self.reference, name), getattr(self.native, name)

        def both(*args, **kwargs):
            with self.lock:
                first(*args, **kwargs)
                second(*args, **kwargs)

        return both

    @property
    def stats(self) -> collections.Counter[str]:
        return self.reference.stats

    @property
    def accesses(self) -> int:
        return self.reference.accesses

    def reports(self) -> list[RaceReport]:
        with self.lock:
            want, got = self.reference.reports(), self.native.reports()
            counted = (self.reference.accesses, dict(self.reference.stats))
            native_counted = (self.native.accesses, dict(self.native.stats))
        if [r.text() for r in got] != [r.text() for r in want]:
            raise EnginesDisagree(
                f"the native engine reported {len(got)} race(s), engine.py {len(want)}, on the same events: "
                f"{[r.text().splitlines()[0] for r in got]} vs {[r.text().splitlines()[0] for r in want]}"
            )
        if native_counted != counted:
            raise EnginesDisagree(f"the native engine counted {native_counted} (accesses, stats), engine.py {counted}")
        return want
