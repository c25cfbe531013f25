"""The streams FSDP uses, created in one place, once per runtime.

Why each exists:
- default: forward/backward compute and the optimizer step (the host's stream).
- all_gather: unshard parameters ahead of compute, so communication overlaps with the previous
  group's compute (prefetch).
- reduce_scatter: reduce gradients while backward compute of earlier layers continues.
- all_reduce: HSDP's cross-replica all-reduce of the sharded gradient, so that it overlaps with the
  next group's reduce-scatter instead of queueing behind it.
"""

from __future__ import annotations

import dataclasses
import weakref

from racecheck.device import Runtime, Stream


@dataclasses.dataclass(frozen=True)
class FSDPStreams:
    default: Stream
    all_gather: Stream
    reduce_scatter: Stream
    all_reduce: Stream


_streams: "weakref.WeakKeyDictionary[Runtime, FSDPStreams]" = weakref.WeakKeyDictionary()


def fsdp_streams(runtime: Runtime) -> FSDPStreams:
    """The runtime's FSDP streams (created on first use; every module of the runtime shares them)."""
    streams = _streams.get(runtime)
    if streams is None:
        streams = FSDPStreams(
            default=runtime.default_stream(),
            all_gather=runtime.new_stream("all_gather"),
            reduce_scatter=runtime.new_stream("reduce_scatter"),
            all_reduce=runtime.new_stream("all_reduce"),
        )
        _streams[runtime] = streams
    return streams
