"""Race detection for plain PyTorch code on CUDA: code that is not written against racecheck's
runtime (a training loop, someone else's FSDP), in one run, with no perturbation.

    with TorchRaceTracker() as tracker:
        train_step()
    for report in tracker.reports():
        print(report.text())

It is built on torch.cuda._sanitizer's machinery: a TorchDispatchMode sees every operator and its
arguments (read and written by the sanitizer's schema rules, see dispatch.py), and a subclass of the
sanitizer's EventHandler receives the CUDA trace callbacks (allocations, frees, event record and
wait, stream, event and device synchronization), registered the way the sanitizer registers its
own. Where the sanitizer misses the motivating race, this tracker does not:
- a free keeps the block's history: the sanitizer deletes a pointer's accesses at the free, so the
  allocation that reuses the block starts clean; here the bytes stay tracked and the reusing
  allocation, on its stream, is checked against every access not ordered before it (engine.py,
  [Note: reuse]). The allocation stream is the stream current when the allocator was called;
- accesses are byte ranges of storages (views at offsets, split blocks), not data pointers;
- record_stream, which the sanitizer skips, defers the reuse as the allocator does;
- a c10d collective is charged to the stream it runs on: the current stream for synchronous
  collectives on PyTorch >= 2.8, otherwise ProcessGroupNCCL's internal stream, recognized as the
  stream that waits on an event while the collective is issued; its accesses are placed before
  the first event that stream records (the collective's end event), so `work.wait()` orders them.
Its cost is kept low by compiling each operator's schema once, capturing compact stacks (code
objects, user frames only) and formatting nothing until a report is asked for.

Code compiled with torch.compile is tracked like the rest: the operators its generated code calls
pass the dispatcher, and its Triton kernels, like a user's own `@triton.jit` kernels, are reported
at their launch with the tensors they read and write (kernel_launches.py). On the Python path the
dispatch mode steps aside while Dynamo and Inductor compile and is back for the compiled code's run
(TrackerMode in torch_hooks.py), so a compiled function still compiles and runs compiled.

Limits: memory allocated before the tracker started is adopted at its first access without an
allocation stream (its first reuse is not checked); on PyTorch < 2.8, ProcessGroupNCCL's own
record_stream calls are invisible (set TORCH_NCCL_AVOID_RECORD_STREAMS=1); one device; kernels
replayed from a CUDA graph (torch.compile's "reduce-overhead" mode) are not seen.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import ClassVar

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from racecheck.detect import native_feed, stacks
from racecheck.detect.dispatch import byte_range, kernel_plan, non_blocking, returned_tensors, set_trace_handler
from racecheck.detect.engine import HappensBefore
from racecheck.detect.feed_apply import freeze, native_op, resolve_block
from racecheck.detect.host_accesses import HOST, HostAccesses
from racecheck.detect.inflight import InFlight
from racecheck.detect.kernel_launches import KernelWatch
from racecheck.detect.native_feed import NoteHandler
from racecheck.detect.report import RaceReport, render
from racecheck.detect.torch_hooks import TrackerMode, cuda_current_stream_fn, cuda_stream_handle, make_handler

_NO_KWARGS: dict = {}  # read only


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})  # what nearly every operator sees


def _no_memory(t: torch.Tensor) -> bool:
    """A tensor with no memory of the program's: a fake tensor (what torch.compile and
    torch.library.opcheck trace with; its data pointer must not even be asked for) or a meta one.
    op_log.cpp skips both alike, as storages without data."""
    return t.is_meta or isinstance(t, FakeTensor)


class TrackerUnavailable(RuntimeError):
    """A CUDA tracker entered where torch has no CUDA device."""


def _unknown_current() -> int:
    raise RuntimeError("a CUDA tracker reads the current stream once it is entered")


def _host_stream() -> int:
    return 0  # the CPU's one stream: c10's id of a device's default stream, as the native log records it


class TorchRaceTracker(HostAccesses):
    """See the module docstring; it is a feed_types.LoopTracker, the native loop's view of it."""

    _recording: ClassVar[list[TorchRaceTracker]] = []  # entered and not yet exited, in this process

    def __init__(
        self,
        *,
        device_type: str = "cuda",
        stacks_on: bool = True,
        current_stream: Callable[[], int] | None = None,
        stream_handle: Callable[[object], int] | None = None,
        host_memory: Callable[[torch.Tensor], bool] | None = None,
        path: str | None = None,
        engine: str | None = None,
    ) -> None:
        """`device_type`, `current_stream`, `stream_handle` and `host_memory` (which tensors are
        host memory, on the CPU where all are) exist for tests on the CPU, which drive the trace
        handler by hand (a CPU tracker given no `current_stream` runs on the CPU's one stream);
        on CUDA leave them alone. `path`: "native" (op_log.cpp's log, see
        native_feed.py), "python" (a TorchDispatchMode), or None: native on CUDA where the log
        builds ($RACECHECK_DETECT_PATH overrides). `engine`, on the native path: "native" (the
        C++ engine, the default) or "python" (engine.py, the reference; $RACECHECK_DETECT_ENGINE
        overrides the default). A CPU tracker's streams are Python's: on the native path, whoever
        switches the current stream calls `flush()` first."""
        self.device_type = device_type
        self.stacks_on = stacks_on
        self.capture = stacks.capturer() if stacks_on else (lambda: ())
        default_current = _unknown_current if device_type == "cuda" else _host_stream
        self.current: Callable[[], int] = current_stream or default_current
        self._stream_handle = stream_handle or cuda_stream_handle
        self._names: dict[int, str] = {}
        custom_host = host_memory is not None
        if host_memory is None:
            host_memory = (lambda t: not t.is_cuda) if device_type == "cuda" else (lambda t: False)
        self._is_host = host_memory
        self._feed = native_feed.feed_for(self, path, engine, custom_host=custom_host)
        self.path = "python" if self._feed is None else "native"
        self.engine = HappensBefore() if self._feed is None else self._feed.engine
        if isinstance(self.engine, HappensBefore):  # the bookkeeping below is Python's
            self.domains = self.engine.domains
            # The host's own work on host memory that streams touch ([Note: host accesses]).
            self.host = self.engine.domain(HOST, "host")
        HostAccesses.__init__(self)
        self.pending: dict[int, list] = {}  # ptr -> [stream, clock at allocation, stack]
        self._inflight: InFlight | None = None
        self.handler = make_handler(self) if self._feed is None else NoteHandler(self._feed)
        self._mode: TrackerMode | None = None
        self.errors: list[str] = []  # internal failures (callbacks must never raise into PyTorch)
        self.stats: collections.Counter[str] = collections.Counter()
        self.ops = 0  # operators with tracked accesses
        # Kernels launched below the dispatcher (kernel_launches.py), on CUDA: the watch, and by
        # kernel name the launches whose writes could not be known (their tensors counted as reads).
        self._kernels: KernelWatch | None = None
        self.unseen_kernels: collections.Counter[str] = collections.Counter()
        self._kernel_plan_of: dict[str, object] = {}

    # -- lifetime --------------------------------------------------------------------------
    def __enter__(self) -> TorchRaceTracker:
        # [Note: a native tracker records alone]
        # The native path's log, and on CUDA the GPU trace it takes over, are the process's: a
        # second tracker on it could not start, a Python-path tracker inside it would get no CUDA
        # trace callback (every free unseen, so a freed block's reuse on another stream could be
        # reported as a race) and one around it would lose them while it records. Trackers on the
        # Python path nest (Triton launches go to the outermost one's KernelWatch only).
        busy = [t for t in TorchRaceTracker._recording if t is not self]
        if busy and (self._feed is not None or any(t._feed is not None for t in busy)):
            raise TrackerUnavailable(
                "TorchRaceTracker: another tracker records in this process, and a tracker on the native "
                "path records alone; exit the other first, or run both on the Python path (path='python')"
            )
        if self.device_type == "cuda" and not torch.cuda.is_available():
            raise TrackerUnavailable(
                "TorchRaceTracker follows CUDA streams, and this torch has no CUDA device "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
            )
        if self.device_type == "cuda":
            if self.current is _unknown_current:
                self.current = cuda_current_stream_fn()
            self.name_stream(torch.cuda.default_stream().cuda_stream, "default")
            if self._feed is None:  # the native log takes CUDA's trace events itself
                torch._C._activate_gpu_trace()
                set_trace_handler(self.handler, attached=True)
        if self._feed is not None:
            self._feed.start()
        else:
            self._mode = TrackerMode(self)
            self._mode.__enter__()
        if self.device_type == "cuda":
            watch = KernelWatch(self._kernel_launched, self.errors.append)
            self._kernels = watch if watch.install() else None  # else an enclosing tracker's watch
        TorchRaceTracker._recording.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in TorchRaceTracker._recording:
            TorchRaceTracker._recording.remove(self)
        if self._kernels is not None:
            self._kernels.uninstall()
            self._kernels = None
        if self._feed is not None:
            self._feed.stop()
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        if self.device_type == "cuda" and self._feed is None:
            set_trace_handler(self.handler, attached=False)

    def flush(self) -> None:
        """Apply what the native operator log holds (nothing to do on the Python path)."""
        if self._feed is not None and self._feed.active:
            self._feed.drain()

    def name_stream(self, stream, name: str) -> None:
        """Name a stream (a torch.cuda.Stream or its handle) in reports."""
        handle = stream if isinstance(stream, int) else self._stream_handle(stream)
        self._names[handle] = name
        self.engine.rename(handle, name)

    def event_recorded(self, event: int, stream: int) -> None:
        """An event recorded on a stream (handles), as CUDA's trace callbacks report it: for a
        stream API that CUDA does not trace, such as patch mode's recording twin."""
        self.handler._handle_event_record(event, stream)

    def event_waited(self, event: int, stream: int) -> None:
        """A stream made to wait for an event (handles), as CUDA's trace callbacks report it."""
        self.handler._handle_event_wait(event, stream)

    # -- results ---------------------------------------------------------------------------
    def reports(self) -> list[RaceReport]:
        self.flush()
        return self.engine.reports()

    def render(self) -> str:
        return render(self.reports())

    # -- streams ---------------------------------------------------------------------------
    def key(self, handle: int) -> int:
        if handle not in self.domains:
            name = self._names.get(handle) or ("default" if handle == 0 else f"stream {handle:#x}")
            self.engine.domain(handle, name)
        return handle

    # -- trace callbacks (through the handler) ---------------------------------------------
    # [Note: pending allocations]
    # The allocation callback gives only the block's address; its size is learnt when an operator
    # returns or touches the new storage, and the reuse is checked then, against the allocating
    # stream's clock *at the allocation*. That clock only grows by waits and host
    # synchronizations, so it is copied lazily: right before the tracker applies one (`_freeze`).
    # The callbacks themselves are the handler's _handle_memory_(de)allocation below.
    def _freeze(self) -> None:
        freeze(self.pending, self.engine)

    def on_event_record(self, event: int, stream: int) -> None:
        flight = self._inflight
        if flight is not None and not flight.charged and flight.stream == stream:
            self._charge(flight, None)  # the collective's kernel precedes its end event
        self.engine.record_event(event, self.key(stream))

    def on_event_wait(self, event: int, stream: int) -> None:
        flight = self._inflight
        if flight is not None and stream != flight.issuer and flight.stream is None:
            flight.stream = stream  # the internal stream the collective runs on
            self._names.setdefault(stream, f"collective stream {stream:#x}")
        if self.pending:
            self._freeze()
        self.engine.wait_event(event, self.key(stream))

    def on_host_sync(self, kind: str, arg=None) -> None:
        if self.pending:
            self._freeze()
        if kind == "device":
            self.engine.host_sync_all()
        elif kind == "stream":
            self.engine.host_sync_stream(self.key(arg))
        else:
            self.engine.host_sync_event(arg)

    # -- kernels launched below the dispatcher (kernel_launches.py) --------------------------
    def _kernel_launched(self, name: str, stream: int | None, reads: list, writes: list, known: bool) -> None:
        """A Triton kernel about to be launched on `stream` (None: the current one), touching
        `reads` and `writes`; `known` False: its writes could not be told ([Note: a kernel's reads
        and writes])."""
        if not known:
            self.unseen_kernels[name] += 1
        key = self.current() if stream is None else stream
        self.stats["kernels"] += 1
        if self._feed is not None:
            self._feed.kernel(name, key, reads, writes)  # into the native log, in the program's order
        else:
            self._guard(self._op, self._kernel_plans(name), (reads, writes), _NO_KWARGS, None, key)

    def _kernel_plans(self, name: str):
        plan = self._kernel_plan_of.get(name)
        if plan is None:
            plan = self._kernel_plan_of[name] = kernel_plan(name)
        return plan

    # -- operators (through the dispatch mode) ---------------------------------------------
    def _op(self, plan, args, kwargs, out, stream: int | None = None) -> None:
        reads, writes = plan.tensors(args, kwargs, out)
        pending = self.pending
        stack = None  # captured once, when first needed
        if pending and out is not None and not plan.writes_returns:
            stack = self.capture()
            self._resolve_returns(out, stack)  # empty(), *_like factories: sized by what they return
        if not reads and not writes:
            return
        engine = self.engine
        live_get = engine.live.get
        items = []
        fresh_host = None  # host tensors no stream has touched yet: tracked if this op is a copy
        host = self.host
        touches_host = False
        for tensors, is_write in ((reads, False), (writes, True)):
            for t in tensors:
                if type(t) not in _PLAIN_TENSORS and _no_memory(t):
                    continue
                try:
                    ptr = t.data_ptr()
                except RuntimeError:  # no storage (a sparse or MKL-DNN layout): op_log.cpp skips it too
                    continue
                if not ptr:
                    continue  # a meta tensor, or an empty one: no memory (op_log.cpp: a storage without data)
                # A tensor at the start of a live block is the common case; a block the allocator
                # just handed out is pending until an operator touches it (the allocation
                # callback made sure no stale record shares its address).
                alloc = live_get(ptr)
                if alloc is None and pending and ptr in pending:
                    if stack is None:
                        stack = self.capture()
                    alloc = self._resolve(t, stack)
                nbytes = t.nbytes if t.is_contiguous() else byte_range(t)[1]
                if alloc is None:
                    if not nbytes or is_traceable_wrapper_subclass(t):  # no memory of its own (a DTensor)
                        continue  # (op_log.cpp skips it too: its local tensors are the callees' business)
                    if self._is_host(t):
                        alloc = engine.allocation_at(ptr)
                        if alloc is None:
                            fresh_host = fresh_host or []
                            fresh_host.append(self._fresh_host(t, is_write, nbytes))
                            continue
                    else:
                        alloc = engine.allocation_at(ptr) or self._adopt(t, stack)
                if alloc.stream is host:
                    touches_host = True
                    self.seen_host(t, alloc)
                if nbytes:
                    items.append((ptr, nbytes, is_write, alloc))
        if not items:
            return  # nothing on a stream: host memory that no stream touched stays untracked
        if touches_host or fresh_host:
            self.host_op(plan, items, fresh_host, stream, stack, non_blocking(plan, args, kwargs))
            return
        key = self.current() if stream is None else stream
        if key not in self.domains:
            self.key(key)
        engine.access_many(key, items, plan.name, stack if stack is not None else self.capture())
        if plan.blocks_host:  # .item(): the host waited for the stream
            engine.host_sync_stream(key)
        self.ops += 1

    def _resolve_returns(self, out, stack) -> None:
        for t in returned_tensors(out):
            if type(t) not in _PLAIN_TENSORS and _no_memory(t):
                continue
            try:
                ptr = t.data_ptr()
            except RuntimeError:  # no storage (a sparse or MKL-DNN layout), as in _op
                continue
            if ptr in self.pending:
                self._resolve(t, stack)

    def _resolve(self, t: torch.Tensor, stack):
        """The pending allocation whose block `t` starts (see [Note: pending allocations])."""
        storage = t.untyped_storage()
        return self._resolve_block(storage.data_ptr(), storage.nbytes(), stack)

    def _resolve_block(self, ptr: int, nbytes: int, stack):
        return resolve_block(self, self.engine, ptr, nbytes, stack)

    def _adopt(self, t: torch.Tensor, stack=None):
        """A storage the tracker has no live allocation for: allocated while no op could tell its
        size (resolved now) or before the tracker started (adopted without a stream)."""
        storage = t.untyped_storage()
        return self.adopt_block(storage.data_ptr(), storage.nbytes(), stack)

    def adopt_block(self, ptr: int, nbytes: int, stack):
        alloc = self._resolve_block(ptr, nbytes, stack)
        if alloc is not None:
            return alloc
        self.stats["adopted"] += 1
        return self.engine.allocate(None, ptr, nbytes)

    def _record_stream(self, args) -> None:
        tensor, stream = args[0], args[1]
        alloc = self.engine.allocation_at(tensor.data_ptr())
        if alloc is not None:
            self.engine.record_stream(alloc.ptr, self.key(self._stream_handle(stream)))

    def _collective(self, func, plan, args, kwargs):
        flight = InFlight(plan, args, kwargs, self.current())
        self._inflight = flight
        try:
            out = func(*args, **kwargs)
        finally:
            self._inflight = None
        if not flight.charged:
            self._guard(self._charge, flight, out)
        return out

    def _charge(self, flight: InFlight, out) -> None:
        flight.charged = True
        stream = flight.stream if flight.stream is not None else flight.issuer
        if flight.native is not None:
            stack, items = flight.native
            native_op(self, self.engine, self.device_type == "cuda", flight.plan, stream, stack, items, False)
        else:
            self._op(flight.plan, flight.args, flight.kwargs, out, stream=stream)
        self.stats["collectives"] += 1

    # -- the native path's rare records (feed_apply.py) ------------------------------------------
    def watch_host(self, ptr: int) -> None:
        assert self._feed is not None, "the native path's"
        if not self._feed.log.watch(ptr):
            self.stats["unwatched_host"] += 1

    def collective_begin(self, plan, stream: int | None, stack, its: list) -> None:
        flight = InFlight(plan, None, None, self.current() if stream is None else stream)
        flight.native = (stack, its)
        self._inflight = flight

    def collective_end(self) -> None:
        flight, self._inflight = self._inflight, None
        if flight is not None and not flight.charged:
            self._charge(flight, None)

    def record_stream_at(self, ptr: int, stream: int | None) -> None:
        alloc = self.engine.allocation_at(ptr)
        if alloc is not None and stream is not None:
            self.engine.record_stream(alloc.ptr, self.key(stream))

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # never break the program under test
            self.errors.append(f"{type(exc).__name__}: {exc}")
