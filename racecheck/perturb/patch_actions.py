"""How patch mode acts on a GPU (CudaActions): the one place that touches torch.cuda for it.

Patch mode (patch.py) decides; an actions object carries the decision out. This is the seam that
lets the CPU tests drive patch mode's whole logic with a recording twin (recording.py) in place of
this one. An actions object provides:
- `applies(tensors)`: whether a collective with these inputs is one to perturb (CUDA tensors);
- `current_stream()`, `is_default(stream)`, `stream_id(stream)`, `current_stream_id()`: the
  host's view of streams (the last is called at every allocation: keep it cheap);
- `launch(call, delay=, async_op=)`: issue a collective behind a delay (see patch.py's docstring
  for which stream the delay goes on);
- `delay(stream, seconds)`: enqueue a delay on `stream` (hand-off points);
- `handoff_targets()`: the (owner, attribute, kind) of every stream API function to wrap, kind a
  key of handoffs.CALLS;
- `attach_allocator(on_alloc, on_free)` / `detach_allocator(...)`: `on_alloc(ptr)` and
  `on_free(ptr)` at every allocation and free the caching allocator makes, through
  torch.cuda._gpu_trace's callbacks (the hooks torch.cuda._sanitizer uses; once switched on,
  tracing stays on for the process); the allocation callback runs on the allocating thread;
- `pool_view()`: the allocator's pools now (racecheck.device.pool_state.PoolView, streams by id);
- `poison(start, nbytes, sid)`, `pressure(nbytes, sid)`: the allocator actions, on stream id
  `sid`, at the program's allocation there ([Note: sound allocator actions]); hidden from any
  dispatch mode (the detector sees the program, not the perturbation).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from racecheck.protocol.names import PATCH_ACTIONS_VAR

if TYPE_CHECKING:
    import torch


class PatchUnavailable(Exception):
    """Patch mode or the tracker were asked for where they cannot act (no CUDA)."""


def actions_factory(*, need: str, hint: str = "run with --no-perturb (and without --detect)"):
    """A callable making the actions object of patch mode: the recording twin when
    $RACECHECK_PATCH_ACTIONS is `recording` (tests), CudaActions on a CUDA machine. `need` names
    what asked, and `hint` what to do instead, for the one-line error raised where there is
    neither (a profile that acts on nothing would perturb nothing, silently)."""
    choice = os.environ.get(PATCH_ACTIONS_VAR, "")
    if choice == "recording":
        from racecheck.perturb.recording import RecordingActions

        return RecordingActions
    if choice:
        raise PatchUnavailable(f"${PATCH_ACTIONS_VAR}={choice!r}: the only other choice is 'recording'")
    import torch

    if not torch.cuda.is_available():
        raise PatchUnavailable(f"{need} acts on CUDA streams, and this machine has no CUDA device; {hint}")
    return CudaActions


class _RawBlock:
    """Device memory seen as a uint8 array without owning it (CUDA array interface, no stream:
    no synchronization is asked for): a tensor over it never returns it to the allocator."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "stream": None,
        }


class CudaActions:
    """Calibrated torch.cuda._sleep, a side stream per device for asynchronous collectives, and
    poison and pressure on freed blocks found in the allocator's snapshot."""

    def __init__(self) -> None:
        self._side: dict[int, torch.cuda.Stream] = {}
        self._callbacks: list = []

    # -- the host's view of streams --------------------------------------------------------
    def applies(self, tensors) -> bool:
        return any(t.is_cuda for t in tensors)

    def current_stream(self):
        import torch

        return torch.cuda.current_stream()

    def is_default(self, stream) -> bool:
        import torch

        return self.stream_id(stream) == torch.cuda.default_stream(stream.device).cuda_stream

    def stream_id(self, stream) -> int:
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:  # a generic torch.Stream: its cudaStream_t through torch.cuda.Stream
            import torch

            handle = torch.cuda.Stream(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            ).cuda_stream
        return handle

    def handoff_targets(self) -> list[tuple[object, str, str]]:
        import torch

        # Stream.wait_stream calls record_event and wait_event, which call Event.record and
        # Event.wait: patch mode counts only the outermost call as the point. Only class
        # attributes are wrapped: Dynamo knows module functions (`torch.cuda.set_stream`,
        # `torch.cuda.stream`) by identity, in a table it builds once, so a wrapper in their place
        # would stay in that table after uninstalling. A stream entered with `torch.cuda.stream(s)`
        # (FSDP2's, Megatron's and most code's way) passes StreamContext.__enter__; a bare
        # `torch.cuda.set_stream(s)` is not a point.
        return [
            (torch.cuda.StreamContext, "__enter__", "stream_context"),
            (torch.cuda.Stream, "wait_stream", "wait_stream"),
            (torch.cuda.Stream, "wait_event", "wait_event"),
            (torch.cuda.Event, "wait", "event_wait"),
            (torch.cuda.Stream, "record_event", "record_event"),
            (torch.cuda.Event, "record", "event_record"),
        ]

    # -- delays ----------------------------------------------------------------------------
    def _cycles(self, seconds: float) -> int:
        import torch

        from racecheck.device.cuda import sleep_cycles_per_second

        return int(seconds * sleep_cycles_per_second(torch.device("cuda", torch.cuda.current_device())))

    def delay(self, stream, seconds: float) -> None:
        import torch

        cycles = self._cycles(seconds)
        if cycles > 0:
            with torch.cuda.stream(stream):  # the stream the work after the point runs on
                torch.cuda._sleep(cycles)

    def launch(self, call, *, delay: float, async_op: bool):
        import torch

        cycles = self._cycles(delay) if delay > 0 else 0
        if cycles <= 0:
            return call()
        current = torch.cuda.current_stream()
        if not async_op:
            torch.cuda._sleep(cycles)  # on the stream the collective runs on (see patch.py)
            return call()
        side = self._side.get(current.device.index)
        if side is None:
            side = self._side[current.device.index] = torch.cuda.Stream(current.device)
        # Producer: the caller's stream (the collective's inputs); consumer: the group's stream,
        # which waits for the stream current at the call: here the side stream, behind the delay.
        side.wait_stream(current)
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            return call()

    # -- frees: see [Note: sound allocator actions] in free_actions.py -------------------------
    def current_stream_id(self) -> int:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:
            return torch.cuda.current_stream().cuda_stream
        return raw(torch.cuda.current_device())

    def attach_allocator(self, on_alloc, on_free) -> None:
        import torch
        import torch.cuda._gpu_trace as gpu_trace

        torch._C._activate_gpu_trace()
        gpu_trace.register_callback_for_memory_allocation(on_alloc)
        gpu_trace.register_callback_for_memory_deallocation(on_free)
        self._callbacks += [on_alloc, on_free]

    def detach_allocator(self, on_alloc, on_free) -> None:
        import torch.cuda._gpu_trace as gpu_trace

        for registry, callback in (
            (gpu_trace.MemoryAllocationCallbacks.callback_list, on_alloc),
            (gpu_trace.MemoryDeallocationCallbacks.callback_list, on_free),
        ):
            while callback in registry:
                registry.remove(callback)
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def pool_view(self):
        import torch

        from racecheck.device.cuda import CudaPoolView

        return CudaPoolView(torch.device("cuda", torch.cuda.current_device()))

    def poison(self, start: int, nbytes: int, sid: int) -> None:
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        from racecheck.device.base import POISON_BYTE

        with _disable_current_modes(), torch.cuda.stream(self._stream(sid)):
            torch.as_tensor(_RawBlock(start, nbytes), device="cuda").fill_(POISON_BYTE)

    def pressure(self, nbytes: int, sid: int) -> None:
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        from racecheck.device.base import POISON_BYTE

        with _disable_current_modes(), torch.cuda.stream(self._stream(sid)):
            block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            block.fill_(POISON_BYTE)  # NaN in every float format
            del block  # back to the pool, written: what a next owner of the block would leave

    def _stream(self, handle: int):
        import torch

        default = torch.cuda.default_stream()
        if handle in (0, default.cuda_stream):
            return default
        return torch.cuda.ExternalStream(handle)
