"""The streams FSDP uses, created in one place, once per runtime, and the rule for dropping a buffer
that crossed from one of them to another.

Why each stream exists:
- default: forward/backward compute and the optimizer step (the host's stream).
- all_gather: unshard parameters ahead of compute, so communication overlaps with the previous
  group's compute (prefetch).
- reduce_scatter: reduce gradients while backward compute of earlier layers continues.
- all_reduce: HSDP's cross-replica all-reduce of the sharded gradient, so that it overlaps with the
  next group's reduce-scatter instead of queueing behind it.

[Note: drop on the allocation stream's terms]
When a buffer's last reference dies, its block returns to its *allocation* stream's pool at once
(racecheck.device.base, [Note: allocator semantics]), and whatever that stream runs next may
overwrite it: the next allocation there, or the perturbation's poison-on-free, which fills the
block on that stream at the moment of the free. So a buffer allocated on stream S and read by
another stream T is dropped only after S itself has waited for T's last read; then anything S
enqueues after the drop is ordered behind that read. This is stricter than what the CUDA allocator
contract needs when every later allocation on S happens to wait for T first (FSDP2 relies on
that), and it does not depend on it: no later code path can forget the wait. The unsharded
parameters (all_gather -> default) go through `Retired`; the HSDP reduce output (reduce_scatter ->
all_reduce) and the shards' gradients (reduction stream -> default) apply the rule where they drop.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from racecheck.device import Runtime, Stream


class Retired:
    """Buffers allocated on `stream` that their owner has dropped while `reader` may still read
    them; held until `release()`. See [Note: drop on the allocation stream's terms]."""

    def __init__(self, stream: Stream, reader: Stream) -> None:
        self.stream = stream
        self.reader = reader
        self._held: list[torch.Tensor] = []

    def add(self, buffer: torch.Tensor) -> None:
        self._held.append(buffer)

    def release(self) -> None:
        """Make the allocation stream wait for the reader, then drop what is held."""
        # Producer: the reader's work so far (the last reads of the held buffers); consumer: the
        # allocation stream, whose later work (a reuse of the blocks, or a poison) comes after it.
        self.stream.wait_stream(self.reader)
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


@dataclasses.dataclass(frozen=True)
class FSDPStreams:
    default: Stream
    all_gather: Stream
    reduce_scatter: Stream
    all_reduce: Stream
    # Unsharded parameter buffers resharded from the host, still read by queued default compute.
    retired_unsharded: Retired


_streams: weakref.WeakKeyDictionary[Runtime, FSDPStreams] = weakref.WeakKeyDictionary()


def fsdp_streams(runtime: Runtime) -> FSDPStreams:
    """The runtime's FSDP streams (created on first use; every module of the runtime shares them)."""
    streams = _streams.get(runtime)
    if streams is None:
        all_gather = runtime.new_stream("all_gather")
        streams = FSDPStreams(
            default=runtime.default_stream(),
            all_gather=all_gather,
            reduce_scatter=runtime.new_stream("reduce_scatter"),
            all_reduce=runtime.new_stream("all_reduce"),
            retired_unsharded=Retired(all_gather, runtime.default_stream()),
        )
        _streams[runtime] = streams
    return streams
