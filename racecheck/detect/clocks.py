"""Clock domains and vector clocks of the happens-before engine (engine.py, [Note: clocks]).

Compiled with the engine by mypyc at install (setup.py): keep it fully annotated.
"""

from __future__ import annotations

Clock = dict["Domain", int]  # a vector clock: domain -> the last epoch of it that is covered


class Domain:
    """A stream (or the host) as a clock domain."""

    __slots__ = ("key", "name", "clock", "inline", "host_version")

    def __init__(self, key, name: str, *, inline: bool = False) -> None:
        self.key: object = key
        self.name = name
        self.clock: Clock = {self: 1}
        self.inline = inline  # the CPU emulation's default stream, executed by the host thread
        self.host_version = -1

    def __repr__(self) -> str:
        return f"<Domain {self.name}>"


def join(dst: Clock, src: Clock) -> None:
    """dst covers everything src covers."""
    for d, t in src.items():
        if dst.get(d, 0) < t:
            dst[d] = t
