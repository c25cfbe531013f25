"""The tracker's native path: drains op_log.cpp's log into TorchRaceTracker in the order the
program issued its work.

The log holds what the TorchDispatchMode of the Python path would have seen (operators, with the
byte ranges their plans read and write) and, on CUDA, what CUDA's trace callbacks would have told
Python (allocations, frees, event record and wait, synchronizations), in the order the program
issued them, without a Python frame per operator or event. `NativeFeed.drain` hands each batch to
one of two engines, which turn each record into what the Python path does for it: an operator's
accesses, a collective's begin and end (the in-flight collective that the events during it charge,
see torch_tracker.py), a record_stream, an allocation or free, an event or synchronization, the
death of a host buffer the tracker follows:
- the native engine (native_engine.py, in C++), the default;
- the Python engine (engine.py, through feed_apply.py, both compiled by mypyc where they can be),
  the reference: TorchRaceTracker(engine="python"), or $RACECHECK_DETECT_ENGINE=python.
The log calls the drain when it is full; the tracker drains for a report and at its exit. Where
Python drives the trace events (a CPU tracker: tests, patch mode's recording twin), they go into
the log too (`note`, through NoteHandler), and are applied at once; whoever switches such a
tracker's current stream drains first (`TorchRaceTracker.flush`).

Stacks stay compact: a record carries the id of its Python stack in the log's table; `LogStack`
resolves it to user frames only when a report is formatted.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from racecheck.detect import feed_apply as rec
from racecheck.detect.dispatch import KERNEL_OVERLOAD, OpPlan, kernel_plan, overload_named, plan_for
from racecheck.detect.engine import HappensBefore
from racecheck.detect.feed_apply import NO_STREAM, RECORD, apply_batch
from racecheck.detect.native_engine import NativeEngine
from racecheck.detect.stacks import LazyStack, user_frames

if TYPE_CHECKING:
    from racecheck.detect.feed_types import LoopTracker


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


ENGINE_ENV = "RACECHECK_DETECT_ENGINE"


def wanted_engine(engine: str | None) -> str:
    """`native` or `python`: the engine the native path applies its log with (`engine`, else
    $RACECHECK_DETECT_ENGINE, else native)."""
    import os

    value = (engine or os.environ.get(ENGINE_ENV, "") or "native").strip().lower()
    if value == "compare":  # the runtime observer's check of its engines (observer.py): native here
        return "native"
    if value not in ("native", "python"):
        raise ValueError(f"engine {value!r}: expected native, python or compare ({ENGINE_ENV})")
    return value


def feed_for(tracker: LoopTracker, path: str | None, engine: str | None, *, custom_host: bool) -> NativeFeed | None:
    """The feed of `tracker` when it runs the native path (see TorchRaceTracker's `path` and
    `engine`), else None."""
    from racecheck.detect import op_log

    if custom_host:  # a Python predicate over tensors: only the Python path can ask it
        if path == "native":
            raise ValueError("host_memory needs the Python path (path='python')")
        return None
    choice = path or op_log.wanted()
    kind = wanted_engine(engine)
    if choice == "python":
        return None
    if choice == "native":
        return NativeFeed(op_log.load_required(), tracker, engine=kind)
    if tracker.device_type != "cuda":
        return None  # a CPU tracker's streams are Python's: native only when asked for
    log = op_log.load_available()
    return None if log is None else NativeFeed(log, tracker, engine=kind)


# Each feed's number for the log (op_log.cpp's start `owner`): the log keeps what it knows of host
# memory (the pinned memory records touched, the storages Python watches) when the same feed, whose
# engine stays, starts it again, and forgets it for any other.
_FEEDS = itertools.count(1)


class NativeFeed:
    """One tracker's use of the native log: starts and stops it and applies what it drains with
    its engine (`engine`: "native" or "python", see the module's docstring)."""

    def __init__(self, log, tracker: LoopTracker, *, engine: str = "native") -> None:
        self.log = log
        self.tracker = tracker
        self.number = next(_FEEDS)
        self.engine: NativeEngine | HappensBefore = (
            NativeEngine(log, self) if engine == "native" and log is not None else HappensBefore()
        )
        self.engine_kind = "native" if isinstance(self.engine, NativeEngine) else "python"
        self.plans: list[OpPlan | None] = []  # by the log's op id
        self.stacks: dict[int, LogStack | tuple] = {-1: ()}
        self.streams: dict[tuple[int, int], int] = {}  # (stream id, device) -> stream handle
        self._kernel_ops: dict[str, int] = {}  # kernel name -> the log's op id for it
        self.records = 0
        self.active = False
        self._failures_at_start = 0

    def start(self) -> None:
        from racecheck.detect.dispatch import native_plan, sanitizer_module
        from racecheck.detect.torch_hooks import eager

        tracker = self.tracker
        cuda = tracker.device_type == "cuda"
        if cuda:
            # [Note: the GPU trace taken once]
            # On CUDA the log takes CUDA's trace events too (op_log.cpp), in place of Python's
            # callbacks, by putting its interpreter in c10's GPU trace for the time it records.
            # torch._C._activate_gpu_trace() puts Python's there once per process (a call_once),
            # whenever it is first called: by importing torch.cuda._sanitizer (whose module-level
            # sanitizer calls it), which planning the first operators does. Called while the log
            # records, it would take the trace over, and every allocation, free and event wait
            # after it would go unseen: ordered code reported as racing (the first test of every
            # process, on one H200). So it is called here, before the log saves the trace it
            # puts back at its stop; later calls are no-ops.
            sanitizer_module()
            import torch

            torch._C._activate_gpu_trace()
        # The log calls both from inside the program's operators: Dynamo stays off them (`eager`).
        # one tracker at a time
        self.log.start(eager(native_plan), eager(self.drain), cuda, tracker.stacks_on, cuda, True, self.number)
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

    def kernel(self, name: str, stream: int, reads: list, writes: list) -> None:
        """A kernel launched below the dispatcher, on the raw `stream`: into the log, in order."""
        op = self._kernel_ops.get(name)
        if op is None:
            op = self._kernel_ops[name] = self.log.kernel_op(name)
        self.log.launch(op, stream, reads, writes)

    def _plan(self, name: str, overload: str) -> OpPlan | None:
        if overload == KERNEL_OVERLOAD:
            return kernel_plan(name)
        try:
            return plan_for(overload_named(name, overload))
        except Exception:  # noqa: BLE001 - a name that is no operator overload records nothing
            return None

    def stack(self, stack_id: int):
        stack = self.stacks.get(stack_id)
        if stack is None:
            stack = self.stacks[stack_id] = LogStack(self.log, stack_id)
        return stack

    def stream(self, stream_id: int, device: int) -> int | None:
        """The CUDA stream handle (the tracker's stream key) of a c10 stream id, or None for the
        current stream; a CPU tracker's records carry its keys."""
        if stream_id == NO_STREAM:
            return None
        if self.tracker.device_type != "cuda":
            return stream_id
        handle = self.streams.get((stream_id, device))
        if handle is None:
            import torch

            stream = torch.cuda.Stream(stream_id=stream_id, device_index=device, device_type=1)
            handle = self.streams[(stream_id, device)] = stream.cuda_stream
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
        """Apply a drained batch: the native engine, or feed_apply.py (compiled with the Python engine)."""
        self.records += len(records) // RECORD.size
        engine = self.engine
        if isinstance(engine, NativeEngine):
            engine.apply(records, items)
        else:
            apply_batch(self, self.tracker, engine, records, items)

    def note(self, kind: int, stream: int, extra: int, ptr: int = -1) -> None:
        """A trace event Python saw, logged in order with the operators and applied at once."""
        if self.active:
            self.log.note(kind, stream, extra, ptr)
            self.drain()


class NoteHandler:
    """The trace handler of a tracker on the native path: the CUDA trace callbacks that a CPU
    tracker's driver calls by hand (torch_hooks.make_handler's, on the Python path), noted in the
    log (NativeFeed.note) as CUDA's own reach it on a GPU."""

    def __init__(self, feed: NativeFeed) -> None:
        self._note = feed.note

    def _handle_event_creation(self, event: int) -> None:
        """Nothing to track: an event matters once recorded."""

    def _handle_stream_creation(self, stream: int) -> None:
        """Nothing to track: streams are named at first use."""

    def _handle_event_deletion(self, event: int) -> None:
        self._note(rec.EVENT_DELETED, NO_STREAM, event)

    def _handle_event_record(self, event: int, stream: int) -> None:
        self._note(rec.EVENT_RECORDED, stream, event)

    def _handle_event_wait(self, event: int, stream: int) -> None:
        self._note(rec.EVENT_WAITED, stream, event)

    def _handle_memory_allocation(self, data_ptr: int) -> None:
        self._note(rec.ALLOCATED, NO_STREAM, data_ptr)  # on the current stream

    def _handle_memory_deallocation(self, data_ptr: int) -> None:
        self._note(rec.FREED, NO_STREAM, data_ptr)

    def _handle_device_synchronization(self) -> None:
        self._note(rec.DEVICE_SYNCED, NO_STREAM, 0)

    def _handle_stream_synchronization(self, stream: int) -> None:
        self._note(rec.STREAM_SYNCED, stream, 0)

    def _handle_event_synchronization(self, event: int) -> None:
        self._note(rec.EVENT_SYNCED, NO_STREAM, event)
