"""The CUDA backend: racecheck's stream runtime on torch.cuda streams, the real caching allocator and NCCL.

Nothing here emulates: streams and events are torch.cuda's, buffers come from PyTorch's caching
allocator (which tags each block with the stream current at allocation, exactly the semantics
sim.py copies), `launch` runs its function at once so its kernels enqueue on the current stream,
and collectives are torch.distributed's NCCL ones. What this module adds is the bookkeeping that
lets observers see the same calls as on the CPU emulation: which stream allocated a buffer, when
its storage dies (on_free), and which streams record_stream deferred it to.

Kernels load lazily by default (CUDA_MODULE_LOADING=LAZY), and the first launch of a kernel in a
process synchronizes the device: first launches are serialized, so races rarely show in a process's
first iteration. Warm up, or set CUDA_MODULE_LOADING=EAGER before CUDA starts.

[Note: collectives and buffer lifetime]
Queued work must hold raw memory, never ownership (base.py, [Note: allocator semantics]). What
ProcessGroupNCCL does with a collective's tensors depends on the PyTorch version:
- PyTorch >= 2.8 (pytorch/pytorch#148590, relanded as #150398 after the 2.7 branch reverted it in
  #150352): a collective with async_op=False is launched directly on the *current* stream; NCCL
  takes no record_stream and stashes no tensor (ProcessGroupNCCL::collective: "If we are
  performing sync operations ... we don't need to do anything for tensor lifetime management").
  The Work kept by the watchdog is a copy without `outputs_`. With async_op=True it runs on the
  group's internal stream and stashes inputs and outputs until work.wait() (or until the watchdog
  sees completion). TORCH_NCCL_AVOID_RECORD_STREAMS only prints "is the default now ... deprecated".
- PyTorch 2.2 to 2.7: a synchronous op runs on the group's internal stream, which first waits on
  the current stream, and work.wait() (called at once by distributed_c10d) makes the current stream
  wait for it. all_gather_into_tensor / reduce_scatter_tensor skip record_stream and stash their
  tensors only until that wait (pytorch/pytorch#111431); other collectives, all_reduce among them,
  call recordStream(input, ncclStream) unless TORCH_NCCL_AVOID_RECORD_STREAMS=1, which would keep an
  all-reduced block out of its pool until the NCCL stream passes it: safer than the emulation.
So we issue every collective with async_op=False under the current stream, and on PyTorch < 2.8
set TORCH_NCCL_AVOID_RECORD_STREAMS=1 before creating our groups (each ProcessGroupNCCL reads it in
its constructor). In both cases a collective keeps no block alive past the host call, as in sim.py.

[Note: one NCCL group per rank list]
NCCL serializes every kernel of a communicator, whichever user stream it is issued on: at launch
the user stream waits on the communicator's internal device stream and that stream then waits on
the user stream (NCCL src/enqueue.cc, ncclLaunchPrepare). Collectives of one group therefore run
in host issue order on every rank, and one group per rank list cannot deadlock however many streams
issue on it. The cost is an ordering the gloo emulation does not have (it holds one group per
issuing stream, so collectives on two streams overlap): a collective on stream S also waits for
every earlier collective of that group issued from other streams. That edge hides some races on
the GPU that the emulation shows; the detector must not count on it, and this runtime does not
report it. PyTorch's FSDP2 uses one group for all-gather and reduce-scatter alike.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import os
import threading
import weakref
from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist

from racecheck.device.base import (
    POISON_BYTE,
    CommGroup,
    Event,
    NewBlock,
    PoolState,
    PoolView,
    ReduceOp,
    Runtime,
    Stream,
    block_size,
)

_CALIBRATION_CYCLES = 20_000_000  # about 10 ms at H200 clocks
_cycles_per_second: float | None = None  # torch.cuda._sleep's rate, measured once per process
_calibration_lock = threading.Lock()


def sleep_cycles_per_second(device: torch.device) -> float:
    """How many torch.cuda._sleep cycles take one second, measured with timing events once."""
    global _cycles_per_second
    with _calibration_lock:
        if _cycles_per_second is None:
            rates = []
            # A private stream: the measurement neither waits for nor delays the caller's work.
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                torch.cuda._sleep(1000)  # the first launch loads the module; keep it out of the timing
                for _ in range(3):  # clocks rise from idle while the first run spins: keep the fastest
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    torch.cuda._sleep(_CALIBRATION_CYCLES)
                    end.record()
                    end.synchronize()
                    rates.append(_CALIBRATION_CYCLES / (start.elapsed_time(end) / 1000.0))
            _cycles_per_second = max(rates)
        return _cycles_per_second


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


class CudaStream(Stream):
    def __init__(self, runtime: CudaRuntime, name: str, torch_stream: torch.cuda.Stream) -> None:
        self.runtime = runtime
        self.name = name
        self.torch_stream = torch_stream

    @property
    def inline(self) -> bool:
        return False  # the GPU runs every stream; the host never executes one

    @property
    def runs_host_work(self) -> bool:
        return False  # a CUDA stream cannot wait for the host (no host function is ever queued)

    def enqueue(self, fn) -> None:
        raise NotImplementedError(f"CUDA stream {self.name!r} cannot run host work in its order")

    def _wait_event(self, event: Event) -> None:
        # cudaStreamWaitEvent on the event's most recent record; a no-op if it was never recorded.
        self.torch_stream.wait_event(cast(CudaEvent, event).torch_event)

    def _synchronize(self) -> None:
        self.torch_stream.synchronize()


def _torch(stream: Stream) -> torch.cuda.Stream:
    """The torch stream behind a stream of this backend (a runtime only ever sees its own)."""
    return cast(CudaStream, stream).torch_stream


class CudaEvent(Event):
    def __init__(self, runtime: CudaRuntime) -> None:
        self.runtime = runtime
        self.torch_event = torch.cuda.Event()  # no timing: ordering only, as CUDA's cheapest events

    def _record(self, stream: Stream) -> None:
        self.torch_event.record(_torch(stream))

    def query(self) -> bool:
        return self.torch_event.query()  # True for an event never recorded, as cudaEventQuery

    def _synchronize(self) -> None:
        self.torch_event.synchronize()


class CudaCommGroup(CommGroup):
    def __init__(self, ranks: Sequence[int], pg) -> None:
        self.ranks = tuple(ranks)
        self.pg = pg  # None for a one-rank group: collectives are local copies


@dataclasses.dataclass(eq=False)
class _Allocation:
    """One buffer handed out by `empty`, alive as long as its storage."""

    block: int
    stream: CudaStream
    ptr: int
    nbytes: int
    recorded: set = dataclasses.field(default_factory=set)  # streams from record_stream


class CudaRuntime(Runtime):
    backend = "cuda"

    def __init__(self, device: torch.device | int | None = None) -> None:
        super().__init__()
        if isinstance(device, int):
            device = torch.device("cuda", device)
        index = None if device is None else torch.device(device).index
        self.device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        # Storages die on any thread, and on this one too: a garbage-collection pass that runs
        # inside a locked section (it can start at any allocation) calls _storage_died there, so
        # the lock must be re-entrant or that thread waits on itself forever.
        self._lock = threading.RLock()
        self._by_handle: dict[int, CudaStream] = {}  # cudaStream_t -> wrapper
        self._streams: list[CudaStream] = []  # ours, in creation order (host syncs report these)
        self._default = self._wrap(torch.cuda.default_stream(self.device), "default", own=True)
        self._live: dict[int, _Allocation] = {}  # storage data_ptr -> live allocation
        self._block_ids: dict[int, int] = {}  # address -> stable small id, like sim's block ids
        self._next_id = itertools.count()
        sleep_cycles_per_second(self.device)

    # -- streams and events ------------------------------------------------------------------
    def _wrap(self, torch_stream: torch.cuda.Stream, name: str, *, own: bool) -> CudaStream:
        wrapper = CudaStream(self, name, torch_stream)
        self._by_handle[torch_stream.cuda_stream] = wrapper
        if own:
            self._streams.append(wrapper)
        return wrapper

    def default_stream(self) -> CudaStream:
        return self._default

    def current_stream(self) -> CudaStream:
        ts = torch.cuda.current_stream(self.device)
        found = self._by_handle.get(ts.cuda_stream)
        # A stream made current by code outside this runtime still gets a name for reports.
        return found if found is not None else self._wrap(ts, f"external-{ts.cuda_stream:#x}", own=False)

    def new_stream(self, name: str) -> CudaStream:
        # torch hands out pooled CUDA streams (32 per priority and device): a runtime with more
        # live side streams than that would alias two of them to one queue.
        return self._wrap(torch.cuda.Stream(self.device), name, own=True)

    @contextlib.contextmanager
    def stream(self, stream: Stream):
        with torch.cuda.stream(_torch(stream)):  # thread-local, as sim's current stream
            yield stream

    def new_event(self) -> CudaEvent:
        return CudaEvent(self)

    def _synchronize(self) -> None:
        torch.cuda.synchronize(self.device)  # base.Runtime.synchronize reports one sync per stream

    # -- memory -----------------------------------------------------------------------------
    def _allocate(self, shape, dtype, stream) -> tuple[torch.Tensor, NewBlock | None]:
        # The caching allocator tags the block with the current stream, as [Note: allocator semantics].
        tensor = torch.empty(shape, dtype=dtype, device=self.device)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return tensor, None  # no block behind it (the allocator returns a null pointer)
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        with self._lock:
            block = self._block_ids.setdefault(ptr, next(self._next_id))
            alloc = _Allocation(block, stream, ptr, nbytes)
            self._live[ptr] = alloc
        # The storage's Python object lives exactly as long as the C++ storage (PyObject
        # preservation), so this fires when the last tensor or view over the buffer dies.
        weakref.finalize(storage, self._storage_died, alloc)
        return tensor, NewBlock(block, ptr, nbytes)

    def _storage_died(self, alloc: _Allocation) -> None:
        with self._lock:
            if self._live.get(alloc.ptr) is alloc:
                del self._live[alloc.ptr]
            deferred_to = sorted(alloc.recorded, key=lambda s: s.name)
        self._block_freed(
            block=alloc.block,
            stream=alloc.stream,
            ptr=alloc.ptr,
            nbytes=block_size(alloc.nbytes),
            deferred_to=deferred_to,
        )

    def _allocation_of(self, tensor: torch.Tensor) -> _Allocation | None:
        with self._lock:
            return self._live.get(tensor.untyped_storage().data_ptr())

    def _record_stream(self, tensor: torch.Tensor, stream: Stream) -> int | None:
        # The allocator records an event on `stream` when the block is freed and keeps the block
        # out of its pool until that event completes; a no-op for the allocation stream itself.
        tensor.record_stream(_torch(stream))
        alloc = self._allocation_of(tensor)
        if alloc is None:
            return None
        if stream is not alloc.stream:
            with self._lock:
                alloc.recorded.add(stream)
        return alloc.block

    def allocation_stream(self, tensor: torch.Tensor) -> Stream | None:
        alloc = self._allocation_of(tensor)
        return None if alloc is None else alloc.stream

    def pool_view(self) -> CudaPoolView:
        return CudaPoolView(self.device, owner=self._by_handle.get)

    def poison(self, ptr: int, nbytes: int, *, stream: Stream) -> None:
        # A tensor over the raw bytes that owns nothing: its death frees no block. Version 2 of
        # the interface has no "stream" entry, so torch adds no synchronization of its own.
        raw = torch.as_tensor(_RawBytes(ptr, nbytes), device=self.device)
        with torch.cuda.stream(_torch(stream)):
            raw.fill_(POISON_BYTE)  # a fill kernel queued on `stream`; not reported to observers

    # -- work -------------------------------------------------------------------------------
    def _launch(self, stream, fn, reads, writes) -> None:
        # `stream` is the current one, so the kernels fn enqueues land on it. They hold device
        # pointers only; our references to the tensors end with this call, so a buffer can be
        # freed and reused before they run.
        fn(*writes, *reads)

    def sleep(self, seconds: float) -> None:
        cycles = int(seconds * sleep_cycles_per_second(self.device))
        if cycles > 0:
            torch.cuda._sleep(cycles)  # a spinning kernel on the current stream; the host goes on

    def all_gather(self, output, input, *, group: CommGroup) -> None:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        pg = cast(CudaCommGroup, group).pg  # a runtime only ever gets the groups it made

        def run(out, inp):
            if pg is None:  # a one-rank world
                out.copy_(inp)
            else:  # on the current stream; see [Note: collectives and buffer lifetime]
                gather(out, inp, group=pg, async_op=False)

        self.launch("all_gather", run, reads=(input,), writes=(output,))

    def reduce_scatter(self, output, input, *, group: CommGroup, op=ReduceOp.SUM) -> None:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        pg = cast(CudaCommGroup, group).pg

        def run(out, inp):
            if pg is None:
                out.copy_(inp)  # SUM and AVG of one rank are the input
            else:
                scatter(out, inp, op=_nccl_op(op), group=pg, async_op=False)

        self.launch("reduce_scatter", run, reads=(input,), writes=(output,))

    def all_reduce(self, tensor, *, group: CommGroup, op=ReduceOp.SUM) -> None:
        pg = cast(CudaCommGroup, group).pg

        def run(t):
            if pg is not None:
                dist.all_reduce(t, op=_nccl_op(op), group=pg, async_op=False)

        # In place: a write covers the read of the same bytes for ordering purposes.
        self.launch("all_reduce", run, writes=(tensor,))

    def new_group(self, ranks: Sequence[int]) -> CudaCommGroup:
        ranks = sorted(ranks)
        if not (dist.is_initialized() and len(ranks) > 1):
            return CudaCommGroup(ranks, None)
        if _torch_version() < (2, 8):
            # Older ProcessGroupNCCL would record_stream an all-reduce's input on its own stream
            # and so keep the block alive; read at group construction.
            os.environ["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
        # One communicator per rank list is enough: see [Note: one NCCL group per rank list].
        return CudaCommGroup(ranks, dist.new_group(ranks, backend="nccl"))


class CudaPoolView(PoolView):
    """The caching allocator's blocks on one device, from one memory snapshot: a freed block is
    IN_POOL when its region is `inactive` (the region may be larger than the block: free
    neighbours merge), HELD while record_stream keeps it `active_awaiting_free`. A block's stream
    is its segment's cudaStream_t, handed to `owner` for the caller's terms (patch mode keeps the
    handle; the runtime maps it to its own streams)."""

    def __init__(self, device: torch.device, owner=lambda handle: handle) -> None:
        regions = []  # (start, nbytes, segment's stream handle, state)
        for seg in torch.cuda.memory._snapshot()["segments"]:
            if seg.get("device", device.index) != device.index:
                continue
            addr = seg["address"]
            for block in seg["blocks"]:
                regions.append((addr, block["size"], seg["stream"], block["state"]))
                addr += block["size"]
        regions.sort()
        self._regions = regions
        self._starts = [r[0] for r in regions]
        self._owner = owner

    def find(self, ptr: int) -> tuple[PoolState, int, int, object] | None:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0 or ptr >= self._regions[i][0] + self._regions[i][1]:
            return None  # its segment went back to the driver
        start, nbytes, handle, state = self._regions[i]
        owner = self._owner(handle)
        if state == "inactive":
            return PoolState.IN_POOL, start, nbytes, owner
        return (PoolState.HELD if state == "active_awaiting_free" else PoolState.TAKEN), ptr, 0, owner


class _RawBytes:
    """Device bytes [ptr, ptr + nbytes) described by __cuda_array_interface__, for torch.as_tensor."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


def _nccl_op(op: ReduceOp):
    return dist.ReduceOp.AVG if op is ReduceOp.AVG else dist.ReduceOp.SUM
