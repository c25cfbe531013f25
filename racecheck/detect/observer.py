"""The race detector on a racecheck runtime: a RuntimeObserver that feeds the happens-before engine
with the runtime's own events, identically on the CPU emulation and on CUDA.

What it sees: every allocation and free of the runtime's caching allocator (with its stream and,
for frees, the streams record_stream deferred it to) and of its pinned host buffers, every launch
with the byte ranges it reads and writes (collectives included, on the stream that issues them),
every event record and wait (`wait_stream` is one of each), and every host synchronization. With
`host_ops` (the default) it also sees plain PyTorch operations issued on the host (autograd,
optimizers, `.copy_()` in test code) on the runtime's buffers, through a TorchDispatchMode, and
charges each to the stream that is current on the host: that is where CUDA would run it; on the
emulation it runs on the host thread, the inline default stream's thread, so a host-side access is
a default-stream access. Host-side reads are checked but not remembered ([Note: host-side reads]);
operations on pinned host buffers are the host's own ([Note: pinned host buffers]); operations
inside a launched function are the launch's own and are not counted twice.

Memory that the runtime did not allocate (tensors made by plain torch calls) has no lifetime the
detector could follow, so accesses to it are not tracked; on CUDA, racecheck.detect.torch_tracker
covers such code.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from types import CodeType, FrameType

from torch.utils._python_dispatch import TorchDispatchMode

from racecheck.detect import stacks
from racecheck.detect.dispatch import OpKind, byte_range, plan_for
from racecheck.detect.engine import HappensBefore
from racecheck.detect.report import RaceReport, render
from racecheck.device.base import Runtime, RuntimeObserver

ENGINES = ("python", "native", "compare")


def _engine(engine: str | None):
    """The happens-before engine and its kind, as `engine` (else $RACECHECK_DETECT_ENGINE, else
    "python") asks: engine.py's ("python"); the native engine ("native", native_hb.py); or both fed
    the same events, engine.py answering and the native engine checked against it ("compare").
    Where the op log's extension cannot be had, "native" falls back to engine.py alone, and
    "compare", which exists to check the native engine, fails (op_log.NativeUnavailable)."""
    import os

    from racecheck.detect.native_feed import ENGINE_ENV

    kind = (engine or os.environ.get(ENGINE_ENV) or "python").strip().lower()
    if kind not in ENGINES:
        raise ValueError(f"engine {kind!r}: expected one of {', '.join(ENGINES)} ({ENGINE_ENV})")
    if kind != "python":
        from racecheck.detect import op_log

        log = op_log.load_required() if kind == "compare" else op_log.load_available()
        if log is not None:
            from racecheck.detect.native_hb import ComparedEngines, NativeHappensBefore

            native = NativeHappensBefore(log)
            return (native, kind) if kind == "native" else (ComparedEngines(_reference(), native), kind)
    return _reference(), "python"


def _reference() -> HappensBefore:
    """engine.py's engine, its events forgotten as they are collected."""
    return HappensBefore(events=weakref.WeakKeyDictionary())


class RaceDetector(RuntimeObserver):
    """Reports free-while-in-use and unsynchronized cross-stream accesses in one run.

    detector = RaceDetector()
    with detector.attached(runtime):
        ...  # code under test
    for report in detector.reports():
        print(report.text())

    `engine`: "python" (engine.py, the default), "native" (the C++ engine, native_hb.py) or
    "compare" (both, checked against each other); None: $RACECHECK_DETECT_ENGINE, else "python".
    `engine_kind` says which runs.
    """

    def __init__(self, *, host_ops: bool = True, stacks_on: bool = True, engine: str | None = None) -> None:
        self.engine, self.engine_kind = _engine(engine)
        self.host_ops = host_ops
        self._capture = stacks.capture if stacks_on else (lambda skip=0: ())
        self._runtime: Runtime | None = None
        self._mode: _HostOps | None = None
        self._launch_code: CodeType | None = None  # Runtime.launch's code while attached
        self._block_ptr: dict[int, int] = {}  # runtime block id -> its start address (for record_stream)
        self._pinned: set[int] = set()  # start addresses of live pinned host buffers
        # The host's own work on pinned host buffers, as a clock domain ([Note: pinned host buffers]).
        self._host_ops = _HOST_OPS
        self.engine.domain(_HOST_OPS, "host")

    # -- lifetime --------------------------------------------------------------------------
    def attach(self, rt: Runtime) -> None:
        if self._runtime is not None:
            raise RuntimeError("the detector is already attached to a runtime")
        self._runtime = rt
        self._launch_code = type(rt).launch.__code__
        self._key(rt.default_stream())
        rt.add_observer(self)
        if self.host_ops:
            self._mode = _HostOps(self)
            self._mode.__enter__()

    def detach(self) -> None:
        rt, self._runtime = self._runtime, None
        if rt is None:
            return
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
        if self in rt.observers:
            rt.remove_observer(self)

    @contextlib.contextmanager
    def attached(self, rt: Runtime) -> Iterator[RaceDetector]:
        self.attach(rt)
        try:
            yield self
        finally:
            self.detach()

    # -- results ---------------------------------------------------------------------------
    def reports(self) -> list[RaceReport]:
        return self.engine.reports()

    def render(self) -> str:
        return render(self.reports())

    # -- runtime events --------------------------------------------------------------------
    def _key(self, stream):
        """The engine key of a runtime stream (the stream itself), named on first use. Whether it
        runs inline is read each time: the emulation's default stream can get a queue for a while
        (SimRuntime.queued_default_stream), and reports say which mode the access ran in."""
        inline = stream.inline
        domain = self.engine.domain(stream, stream.name, inline=inline)
        if domain.inline is not inline:
            domain.inline = inline
        return stream

    def on_alloc(self, rt, *, block, stream, ptr, nbytes) -> None:
        self._block_ptr[block] = ptr
        self.engine.allocate(self._key(stream), ptr, nbytes, stack=self._capture())

    def on_free(self, rt, *, block, stream, ptr, nbytes, deferred_to) -> None:
        self._block_ptr.pop(block, None)
        self.engine.free(ptr, deferred_to=[self._key(s) for s in deferred_to], stack=self._capture())

    def on_host_alloc(self, rt, *, ptr, nbytes) -> None:
        # A pinned host buffer, owned by the host: see [Note: pinned host buffers].
        self._pinned.add(ptr)
        self.engine.allocate(self._host_ops, ptr, nbytes, stack=self._capture())

    def on_host_free(self, rt, *, ptr, nbytes, deferred_to) -> None:
        # Reused only after every stream that may have copied to or from it passed the free.
        self._pinned.discard(ptr)
        self.engine.free(ptr, deferred_to=[self._key(s) for s in deferred_to], stack=self._capture())

    def on_record_stream(self, rt, *, block, stream) -> None:
        ptr = self._block_ptr.get(block)
        if ptr is not None:
            self.engine.record_stream(ptr, self._key(stream))

    def on_launch(self, rt, *, stream, name, reads, writes) -> None:
        key = self._key(stream)
        stack = self._capture()
        engine = self.engine
        for r in reads:
            engine.access(key, r.ptr, r.nbytes, write=False, op=name, stack=stack)
        for w in writes:
            engine.access(key, w.ptr, w.nbytes, write=True, op=name, stack=stack)

    def on_event_record(self, rt, *, event, stream) -> None:
        self.engine.record_event(event, self._key(stream))

    def on_event_wait(self, rt, *, event, stream) -> None:
        self.engine.wait_event(event, self._key(stream))

    def on_host_sync(self, rt, *, stream, event) -> None:
        if stream is not None:
            self.engine.host_sync_stream(self._key(stream))
        elif event is not None:
            self.engine.host_sync_event(event)
        else:
            self.engine.host_sync_all()

    # -- host-side PyTorch operations ------------------------------------------------------
    def _inside_launch(self) -> bool:
        """Whether the op runs inside Runtime.launch's function (the inline default stream's work,
        or CUDA's kernels): on_launch already reported its accesses."""
        code = self._launch_code
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def _host_op(self, func, args, kwargs, out) -> None:
        plan = plan_for(func)
        if plan.kind is OpKind.SKIP or plan.kind is OpKind.RECORD_STREAM:
            return
        reads, writes = plan.tensors(args, kwargs or {}, out)
        engine = self.engine
        touched = []
        for tensors, is_write in ((reads, False), (writes, True)):
            for t in tensors:
                ptr, nbytes = byte_range(t)
                if nbytes and engine.allocation_at(ptr) is not None:
                    touched.append((ptr, nbytes, is_write))
        if not touched or self._inside_launch():
            return
        assert self._runtime is not None, "host ops are seen only while attached (_HostOps checks)"
        key = self._key(self._runtime.current_stream())
        stack = self._capture()
        pinned = self._pinned
        on_host = False
        for ptr, nbytes, is_write in touched:
            alloc = engine.allocation_at(ptr) if pinned else None
            if alloc is not None and alloc.ptr in pinned:
                # [Note: pinned host buffers]: the host itself touches host memory, at once.
                engine.access(self._host_ops, ptr, nbytes, write=is_write, op=plan.name, stack=stack, record=is_write)
                on_host = True
                continue
            # [Note: host-side reads] below: a read is checked, not remembered.
            engine.access(key, ptr, nbytes, write=is_write, op=plan.name, stack=stack, record=is_write)
        if on_host:
            engine.host_sync_stream(self._host_ops)  # done when the op returns: later work follows it


# [Note: host-side reads]
# A host-issued read of a runtime buffer is checked against the writes it must be ordered after
# (reading data another stream has not been made to finish is a race on any device), but it is not
# remembered for later write-after-read or reuse checks. On a GPU the same line of code may be a
# kernel on the current stream or a device-to-host copy that synchronizes (`.cpu()`, `.item()`):
# the emulation, where runtime buffers are host memory and `.cpu()` is the identity, cannot tell
# them apart, and remembering the read would report correct code that hands results to the host.
# Host-issued writes are remembered and checked like launched ones.

# [Note: pinned host buffers]
# A pinned host buffer (Runtime.pinned_empty) is host memory on both backends: a host operation on
# it runs on the host and is complete when it returns, whichever stream is current. Its accesses
# are charged to a clock domain of their own, the host's work, which knows of stream work only
# what the host learned at synchronizations: so a host read of bytes that a queued non-blocking
# copy writes is a race until the host waited for the copy's stream or an event after it. Once the
# operation returns the host knows it complete (a host sync of that domain), so work enqueued
# afterwards on any stream is ordered after it, as a copy that reads the buffer later is.


_HOST_OPS = "host operations on pinned memory"  # the engine key of the host's own work


class _HostOps(TorchDispatchMode):
    """Reports host-issued PyTorch operations on the runtime's buffers to the detector."""

    def __init__(self, detector: RaceDetector) -> None:
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.detector._runtime is not None:
            self.detector._host_op(func, args, kwargs, out)
        return out
