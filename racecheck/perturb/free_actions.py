"""Frees awaiting an allocator action: noted at the free, acted on at the program's next
allocation on the freed block's own stream. One rule for the injector (racecheck's runtime) and
patch mode (anyone's torch.cuda code); see the note below.

[Note: sound allocator actions]
Poison and pressure stand for what the caching allocator could do with a freed block, and for
nothing else. A block freed without record_stream goes back to the pool of its allocation stream
S at once; the program can be handed it again only by an allocation on S, made by a thread whose
current stream is S, and everything the program has enqueued on S by then precedes the new
owner's work. So a freed block is only noted at its free. It is acted on at the program's next
allocation on S, on S, in S's order at that allocation, and only if it is still free in S's pool
then: a block that record_stream holds back (not in the pool yet) waits for a later allocation,
and one the program took back itself is left alone.

Acting anywhere else writes where no allocation of the program could, and fails correct code.
PyTorch's FSDP2 is the example that showed it: a sharded gradient is allocated on the
reduce-scatter stream, read by the optimizer on the default stream and freed by `zero_grad` on
the default stream while those reads may still be queued; FSDP2 makes the reduce-scatter stream
wait for the default stream before that stream next allocates. A fill enqueued on the
reduce-scatter stream at the free, or at the next stream API call, runs ahead of that wait and
overwrites gradients the optimizer has not read yet. A delay, the other kind of action, only
postpones the work of one stream; it never changes what a kernel computes.

The instruments that carry the actions out change nothing the program can do either: a wrapper
keeps the object torch and other libraries look up (an operator stays an OpOverloadPacket with its
overloads, op_kernels.py; a class stays a class, with its methods wrapped in place), works whether
the code it wraps was imported before or after it, acts on real calls only (a fake tensor while
Inductor traces passes through), and uninstalling leaves torch as it was. A failure that only a
wrapper caused is as false an alarm as a wrong write.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable

from racecheck.device.pool_state import PoolState, PoolView


@dataclasses.dataclass(frozen=True)
class FreeRequest:
    """A freed block and what to do with it once the program can be handed it again."""

    ptr: int
    nbytes: int  # the block's bytes where the free says (0: the pool tells at the action)
    poison: bool  # fill it with NaN on its stream
    pressure: bool  # allocate its size on its stream and write it, as a next owner would


class PendingFrees:
    """Requests by the stream whose pool the block went back to (None: not known at the free).
    Frees arrive on any thread, from finalizers and allocator callbacks: every method locks."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_stream: dict[Hashable, dict[int, FreeRequest]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_stream)

    def note(self, stream: Hashable, request: FreeRequest) -> None:
        """A free: the latest request for an address replaces an earlier one (the block was
        handed out and freed again in between)."""
        with self._lock:
            self._by_stream.setdefault(stream, {})[request.ptr] = request

    def has(self, stream: Hashable) -> bool:
        return stream in self._by_stream

    def take(self, stream: Hashable) -> list[FreeRequest]:
        """Every request waiting on `stream`, removed."""
        with self._lock:
            return list(self._by_stream.pop(stream, {}).values())

    def ready(self, stream: Hashable, view: PoolView) -> tuple[list[tuple[FreeRequest, int, int]], int]:
        """The program allocated on `stream`: the requests to act on now, each with the free
        region to write (start, nbytes), and how many were dropped because the program has the
        block again. The rule of the note above, in one place: a block still free in `stream`'s
        pool is ready; one record_stream holds back, or one of another stream's pool (a free
        whose stream was not known), waits under its own stream for a later allocation there."""
        with self._lock:
            requests = list(self._by_stream.pop(stream, {}).values())
            requests += self._by_stream.pop(None, {}).values()
        ready, taken = [], 0
        for request in requests:
            found = view.find(request.ptr)
            if found is None:
                continue  # its memory went back to the device
            state, start, nbytes, owner = found
            if state is PoolState.TAKEN:
                taken += 1  # the program's own writes will land there
            elif owner != stream or state is PoolState.HELD:
                if owner is not None:
                    self._wait(owner, request)
            else:
                ready.append((request, start, nbytes))
        return ready, taken

    def _wait(self, stream: Hashable, request: FreeRequest) -> None:
        """Put a request back under `stream`, unless a newer free of its address came meanwhile."""
        with self._lock:
            self._by_stream.setdefault(stream, {}).setdefault(request.ptr, request)

    def clear(self) -> None:
        with self._lock:
            self._by_stream.clear()
