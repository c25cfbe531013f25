"""Where a freed block of a caching allocator is, as an allocator action asks about it: a plain
enum and the view's interface, without torch, so that the perturbation's decisions import it
cheaply. See [Note: sound allocator actions] in racecheck.perturb.free_actions."""

from __future__ import annotations

import abc
import enum


class PoolState(enum.Enum):
    IN_POOL = "in_pool"  # free in its stream's pool: the next allocation there could be handed it
    HELD = "held"  # freed, kept out of the pool until record_stream's streams pass the free
    TAKEN = "taken"  # handed out again (or in another stream's pool): nothing to act on


class PoolView(abc.ABC):
    """The allocator's pools at one moment."""

    @abc.abstractmethod
    def find(self, ptr: int) -> tuple[PoolState, int, int, object] | None:
        """The block freed at `ptr`: its state, the bytes an action may write (the free region
        holding it, start and size; size 0 unless IN_POOL) and the stream whose pool it belongs
        to, in the caller's terms (a runtime Stream, a cudaStream_t); None for memory the
        allocator no longer holds."""

    def state(self, ptr: int, stream: object) -> tuple[PoolState, int, int]:
        """The block's state for an action on `stream`: TAKEN when it is another stream's."""
        found = self.find(ptr)
        if found is None or found[3] != stream:
            return PoolState.TAKEN, ptr, 0
        return found[0], found[1], found[2]
