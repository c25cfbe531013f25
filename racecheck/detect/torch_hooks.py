"""The PyTorch tracker's two hooks into PyTorch (torch_tracker.py): a subclass of
torch.cuda._sanitizer's EventHandler that receives the CUDA trace callbacks, and the
TorchDispatchMode that sees every operator; plus how the current stream is read on CUDA, and
`eager`, which keeps Dynamo off every function of the tracker that the program's own calls reach.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from racecheck.detect.dispatch import OpKind, _plans, plan_for, sanitizer_module

if TYPE_CHECKING:
    from racecheck.detect.torch_tracker import TorchRaceTracker


def _handler_base():
    return sanitizer_module().EventHandler


def eager(fn: Callable) -> Callable:
    """`fn`, whose frames and every frame they call Dynamo never compiles: for the tracker's
    functions that the program's own calls reach (the dispatch mode's __torch_dispatch__, the CUDA
    trace callbacks, the native log's planner and drain). Where a compiled function breaks its
    graph, its eager part runs with Dynamo's frame hook on, and Dynamo compiled those functions as
    if they were the program's frames (recompiling them on guards over the tracker's own tables, and
    warning about racecheck's files).

    Where torch has it, the function's code object is marked to be skipped with every frame it calls
    (Dynamo's per-code setting in torch._C._dynamo.eval_frame, the one its own skip_code sets):
    `fn` is returned as it is, at no cost per call and with no import of torch._dynamo. Elsewhere
    (or for a callable with no code object of its own, a functools.partial) a wrapper runs it under
    torch.compiler.disable(recursive=True) once torch._dynamo is imported (no hook can be on
    before): importing it takes about a second, which would otherwise fall on every process a
    tracker starts in."""
    strategy, code = _skip_recursively(), getattr(fn, "__code__", None)  # a function's or a method's
    if strategy is not None and code is not None:
        set_strategy, skip = strategy
        set_strategy(code, skip)
        return fn
    disabled: Callable | None = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn, recursive=True)
        return disabled(*args, **kwargs)

    return call


@functools.cache
def _skip_recursively():
    """(set_code_exec_strategy, the strategy "skip this frame and every frame it calls"), or None
    where this torch has no per-code setting."""
    frames = getattr(torch._C, "_dynamo", None)
    frames = getattr(frames, "eval_frame", None)
    needed = ("set_code_exec_strategy", "_FrameExecStrategy", "_FrameAction")
    if frames is None or not all(hasattr(frames, name) for name in needed):
        return None
    skip = frames._FrameAction.SKIP
    return frames.set_code_exec_strategy, frames._FrameExecStrategy(skip, skip)


def make_handler(tracker: TorchRaceTracker):
    """An EventHandler of torch.cuda._sanitizer whose callbacks feed the racecheck engine instead
    of the sanitizer's per-pointer history (which a free erases). The Python path's: the native
    path's handler (native_feed.NoteHandler) logs them instead."""

    domains = tracker.domains
    live = tracker.engine.live

    # The base is torch.cuda._sanitizer.EventHandler, imported only here (its import has a side
    # effect, see dispatch.py); a class computed at run time is beyond the type check.
    class TraceHandler(_handler_base()):  # type: ignore[misc]
        def _handle_event_creation(self, event):
            """Nothing to track (overrides the sanitizer's bookkeeping): an event matters once recorded."""

        @eager
        def _handle_event_deletion(self, event):
            tracker._guard(tracker.engine.forget_event, event)

        @eager
        def _handle_event_record(self, event, stream):
            tracker._guard(tracker.on_event_record, event, stream)

        @eager
        def _handle_event_wait(self, event, stream):
            tracker._guard(tracker.on_event_wait, event, stream)

        @eager
        def _handle_memory_allocation(self, data_ptr):  # the most frequent: no call layer but `eager`
            try:
                # The stack is the allocating operator's: _op captures it when it resolves this.
                stream = tracker.current()
                if stream not in domains:
                    tracker.key(stream)
                if data_ptr in live:  # the block is free again, so that record missed its free
                    tracker.engine.retire(data_ptr)
                tracker.pending[data_ptr] = [stream, None, None]
            except Exception as exc:
                tracker.errors.append(f"{type(exc).__name__}: {exc}")

        @eager
        def _handle_memory_deallocation(self, data_ptr):
            try:
                if tracker.pending.pop(data_ptr, None) is None:  # else: no op ever touched it
                    tracker.engine.free(data_ptr, stack=tracker.capture())
            except Exception as exc:
                tracker.errors.append(f"{type(exc).__name__}: {exc}")

        def _handle_stream_creation(self, stream):
            """Nothing to track (overrides the sanitizer's bookkeeping): streams are named at first use."""

        @eager
        def _handle_device_synchronization(self):
            tracker._guard(tracker.on_host_sync, "device")

        @eager
        def _handle_stream_synchronization(self, stream):
            tracker._guard(tracker.on_host_sync, "stream", stream)

        @eager
        def _handle_event_synchronization(self, event):
            tracker._guard(tracker.on_host_sync, "event", event)

    return TraceHandler()


_PLAIN = OpKind.PLAIN
_NO_KWARGS: dict = {}  # read only


class TrackerMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No wrapper from PyTorch, which (2.9 and later) wraps every mode's __torch_dispatch__ in
        torch._disable_dynamo unless it opts out: that imports torch._dynamo at the first operator
        and costs every call, while `eager` keeps Dynamo off this one already, at no cost."""
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Step aside while torch.compile compiles, and be back for the compiled code's run: a
        compiled function compiles and runs compiled under the tracker, its operators seen as they
        run and its Triton kernels at their launch (kernel_launches.py). Without it, Dynamo falls
        back to eager under the mode, or traces the mode's own frames and fails."""
        return True

    def __init__(self, tracker: TorchRaceTracker) -> None:
        super().__init__()
        self.tracker = tracker

    @eager
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        plan = _plans.get(func) or plan_for(func)
        kind = plan.kind
        if kind is _PLAIN:
            out = plan.call(*args, **kwargs) if kwargs else plan.call(*args)
            try:
                self.tracker._op(plan, args, kwargs or _NO_KWARGS, out)
            except Exception as exc:  # never break the program under test
                self.tracker.errors.append(f"{type(exc).__name__}: {exc}")
            return out
        kwargs = kwargs or {}
        tracker = self.tracker
        if kind is OpKind.COLLECTIVE:
            return tracker._collective(func, plan, args, kwargs)
        if kind is OpKind.RECORD_STREAM:
            tracker._guard(tracker._record_stream, args)
        return func(*args, **kwargs)


def cuda_current_stream_fn() -> Callable[[], int]:
    index = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


def cuda_stream_handle(stream) -> int:
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    return torch.cuda.Stream(
        stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
    ).cuda_stream
