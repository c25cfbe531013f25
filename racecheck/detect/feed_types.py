"""What the native path's loop (feed_apply.py, compiled with the engine) needs of the feed it
drains and of the tracker it applies the records to, as two small typed protocols: LogTables
(native_feed.NativeFeed is one) and LoopTracker (torch_tracker.TorchRaceTracker is one). The loop
reads them through these names alone, none private; this module imports neither side.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from racecheck.detect.allocations import Allocation
from racecheck.detect.dispatch import OpPlan


class LogTables(Protocol):
    """The feed's tables, by the log's ids: operator plans, stacks and c10 streams."""

    plans: list[OpPlan | None]  # by op id
    stacks: dict[int, Any]  # by stack id: a LogStack, or () for none
    streams: dict[tuple[int, int], int]  # (c10 stream id, device) -> the tracker's key, on CUDA

    def stack(self, stack_id: int) -> Any:
        """The stack of `stack_id`, made and kept at its first use."""
        ...

    def stream(self, stream_id: int, device: int) -> int | None:
        """The tracker's key of a c10 stream (None: the current stream)."""
        ...


class LoopTracker(Protocol):
    """The tracker as the loop applies records to it ([Note: pending allocations] and
    [Note: host accesses] in torch_tracker.py and host_accesses.py say what each holds)."""

    device_type: str
    stacks_on: bool
    errors: list[str]  # internal failures, never raised into the program
    stats: Any  # counters by name
    ops: int  # operators with tracked accesses
    pending: dict[int, list]  # block address -> [stream, clock at allocation, stack]
    domains: Collection[int]  # the stream keys the engine knows
    host: Any  # the engine's domain of the host's own work on tracked host memory
    current: Callable[[], int]  # the current stream's key
    capture: Callable[[], Any]  # the stack here, compact

    def key(self, stream: int) -> int:
        """`stream`, known to the engine from now on."""
        ...

    def adopt_block(self, ptr: int, nbytes: int, stack: Any) -> Allocation: ...

    def watch_host(self, ptr: int) -> None:
        """Learn of the death of the host storage at `ptr`."""
        ...

    def host_op(
        self, plan: OpPlan, items: list, fresh_host: list | None, stream: int | None, stack: Any, non_blocking: bool
    ) -> None: ...

    def host_freed(self, ptr: int) -> None: ...

    def on_event_record(self, event: int, stream: int) -> None: ...

    def on_event_wait(self, event: int, stream: int) -> None: ...

    def on_host_sync(self, kind: str, arg: Any = None) -> None: ...

    def collective_begin(self, plan: OpPlan, stream: int | None, stack: Any, its: list) -> None: ...

    def collective_end(self) -> None: ...

    def record_stream_at(self, ptr: int, stream: int | None) -> None: ...
