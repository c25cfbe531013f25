"""The happens-before order of a generated program (racecheck.scenario_kit.programs): vector clocks
of its streams and the host, kept as racecheck.detect.engine keeps them, which the generator
updates while it draws operations, and `ordered`, which replays a whole program to tell whether
one operation is ordered after another once some operations are left out.
"""

from __future__ import annotations

from racecheck.scenario_kit.program_ops import HOST, STREAMS, Op


class Clocks:
    """Vector clocks of the streams and the host, as racecheck.detect.engine keeps them."""

    def __init__(self) -> None:
        self.streams = [{s: 1} for s in range(STREAMS)]
        self.host: dict[int, int] = {}
        self.events: dict[int, dict[int, int]] = {}

    def now(self, s: int) -> dict[int, int]:
        clock = self.streams[s]
        for d, t in self.host.items():
            if clock.get(d, 0) < t:
                clock[d] = t
        return clock

    def epoch(self, s: int) -> int:
        return self.now(s)[s]

    def record(self, event: int, s: int) -> None:
        self.events[event] = dict(self.now(s))
        self.streams[s][s] += 1

    def wait(self, s: int, event: int) -> None:
        clock = self.now(s)
        for d, t in self.events.get(event, {}).items():
            if clock.get(d, 0) < t:
                clock[d] = t

    def host_learns(self, snap: dict[int, int]) -> None:
        for d, t in snap.items():
            if self.host.get(d, 0) < t:
                self.host[d] = t

    def sync_stream(self, s: int) -> None:
        self.host_learns(dict(self.now(s)))
        self.streams[s][s] += 1

    def covers(self, domain: int, d: int, epoch: int) -> bool:
        """Whether `domain` (a stream, or HOST) is ordered after d's access at `epoch`."""
        if d == HOST:
            return True  # the host's accesses are done when it goes on
        known = self.host if domain == HOST else self.now(domain)
        return known.get(d, 0) >= epoch


def _domain(op: Op) -> int:
    return HOST if op.kind in ("host_alloc", "host_write", "host_read") else op.stream


def ordered(ops, early: int, late: int, *, skip: set[int] = frozenset()) -> bool:  # type: ignore[assignment]
    """Whether operation `late` is ordered after operation `early` in `ops` with the operations
    in `skip` left out: the clocks replayed."""
    clocks = Clocks()
    events = 0
    stamp = None
    for k, op in enumerate(ops):
        if k in skip:
            continue
        kind = op.kind
        if k == early:
            d = _domain(op)
            stamp = (d, 0 if d == HOST else clocks.epoch(d))
        if k == late:
            assert stamp is not None, "the earlier operation comes first"
            return clocks.covers(_domain(op), *stamp)
        if kind == "record":
            clocks.record(op.other, op.stream)
        elif kind == "wait":
            clocks.wait(op.stream, op.other)
        elif kind == "wait_stream":
            events -= 1  # a private event per wait_stream
            clocks.record(events, op.other)
            clocks.wait(op.stream, events)
        elif kind == "stream_sync":
            clocks.sync_stream(op.stream)
        elif kind == "event_sync":
            clocks.host_learns(clocks.events.get(op.other, {}))
        elif kind == "synchronize":
            for d in range(STREAMS):
                clocks.sync_stream(d)
    raise AssertionError(f"operation {late} is not in the program")
