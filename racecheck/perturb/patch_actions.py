"""How patch mode acts on a GPU (CudaActions): the one place that touches torch.cuda for it.

Patch mode (patch.py) decides; an actions object carries the decision out. This is the seam that
lets the CPU tests drive patch mode's whole logic with a recording twin (recording.py) in place of
this one. An actions object provides:
- `applies(tensors)`: whether a collective with these inputs is one to perturb (CUDA tensors);
- `current_stream()`, `is_default(stream)`, `stream_id(stream)`: the host's view of streams;
- `launch(call, delay=, async_op=)`: issue a collective behind a delay (see patch.py's docstring
  for which stream the delay goes on);
- `delay(stream, seconds)`: enqueue a delay on `stream` (hand-off points);
- `handoff_targets()`: the (owner, attribute, kind) of every stream API function to wrap;
- `attach_free(callback)` / `detach_free(callback)`: `callback(ptr)` at every free the caching
  allocator sees, through torch.cuda._gpu_trace's deallocation callbacks (the hook that
  torch.cuda._sanitizer uses; once switched on, tracing stays on for the process);
- `on_frees(requests)`: act on freed blocks, at a host point after the frees; each request is
  (ptr, poison, pressure); returns how many were poisoned and how many pressured;
- `start_tracker()` / `stop_tracker(tracker)` (static): TorchRaceTracker around a test (--detect).
"""

from __future__ import annotations

import bisect
import os


class PatchUnavailable(Exception):
    """Patch mode or the tracker were asked for where they cannot act (no CUDA)."""


def actions_factory(*, need: str):
    """A callable making the actions object of patch mode: the recording twin when
    $RACECHECK_PATCH_ACTIONS is `recording` (tests), CudaActions on a CUDA machine. `need` names
    what asked, for the one-line error raised where there is neither."""
    from racecheck.perturb.recording import ENV_VAR

    choice = os.environ.get(ENV_VAR, "")
    if choice == "recording":
        from racecheck.perturb.recording import RecordingActions

        return RecordingActions
    if choice:
        raise PatchUnavailable(f"${ENV_VAR}={choice!r}: the only other choice is 'recording'")
    import torch

    if not torch.cuda.is_available():
        raise PatchUnavailable(
            f"{need} acts on CUDA streams in a project's own suite, and this machine "
            f"has no CUDA device; run with --no-perturb (and without --detect)"
        )
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
        self._side: dict[int, object] = {}
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
        # Event.wait: patch mode counts only the outermost call as the point.
        return [
            (torch.cuda, "set_stream", "set_stream"),
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

    # -- detection -------------------------------------------------------------------------
    @staticmethod
    def start_tracker():
        from racecheck.detect.torch_tracker import TorchRaceTracker

        tracker = TorchRaceTracker()
        tracker.__enter__()
        return tracker

    @staticmethod
    def stop_tracker(tracker) -> None:
        import torch

        try:
            torch.cuda.synchronize()  # inside: the tracker sees the host learn of completion
        finally:
            tracker.__exit__(None, None, None)

    # -- frees -----------------------------------------------------------------------------
    def attach_free(self, callback) -> None:
        import torch
        import torch.cuda._gpu_trace as gpu_trace

        torch._C._activate_gpu_trace()
        gpu_trace.register_callback_for_memory_deallocation(callback)
        self._callbacks.append(callback)

    def detach_free(self, callback) -> None:
        import torch.cuda._gpu_trace as gpu_trace

        registry = gpu_trace.MemoryDeallocationCallbacks.callback_list
        while callback in registry:
            registry.remove(callback)
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def on_frees(self, requests) -> tuple[int, int]:
        """Poison and pressure act only on a block that is free in its stream's pool right now
        (state `inactive` in the snapshot), on that stream: what the program's own next
        allocation on the stream could do. A block that record_stream holds back (pending free)
        or that the program has taken again is left alone."""
        import torch

        from racecheck.device.base import POISON_BYTE

        regions = []  # (start, nbytes, stream handle) of every free block
        for seg in torch.cuda.memory._snapshot()["segments"]:
            addr = seg["address"]
            for block in seg["blocks"]:
                if block["state"] == "inactive":
                    regions.append((addr, block["size"], seg["stream"]))
                addr += block["size"]
        regions.sort()
        starts = [r[0] for r in regions]
        poisoned = pressured = 0
        acted: set[int] = set()  # a free region acted on once, however many frees merged into it
        for ptr, poison, pressure in requests:
            i = bisect.bisect_right(starts, ptr) - 1
            if i < 0 or i in acted or not regions[i][0] <= ptr < regions[i][0] + regions[i][1]:
                continue
            acted.add(i)
            start, nbytes, handle = regions[i]
            with torch.cuda.stream(self._stream(handle)):
                if poison:
                    torch.as_tensor(_RawBlock(start, nbytes), device="cuda").fill_(POISON_BYTE)
                    poisoned += 1
                if pressure:
                    block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                    block.fill_(POISON_BYTE)  # NaN in every float format
                    del block
                    pressured += 1
        return poisoned, pressured

    def _stream(self, handle: int):
        import torch

        default = torch.cuda.default_stream()
        if handle in (0, default.cuda_stream):
            return default
        return torch.cuda.ExternalStream(handle)
