"""The injection points code written against the runtime marks with `Runtime.point`: one Enum,
checked at every call, so a misspelt point is an error rather than a point nothing ever acts on.

racecheck.fsdp and the scenarios mark these on the host; the perturbation (racecheck.perturb.points)
lists them beside the points it derives itself (frees, event waits) and the hand-off points of
patch mode. A `Point` is a `str`, so observers and profiles compare it with plain names.
"""

from __future__ import annotations

import enum


class Point(enum.StrEnum):
    """A marked injection point; `description` says where the host is when it marks it."""

    BEFORE_ALL_GATHER = "before_all_gather"
    AFTER_ALL_GATHER = "after_all_gather"
    WAIT_ALL_GATHER = "wait_all_gather"
    BEFORE_REDUCE_SCATTER = "before_reduce_scatter"
    AFTER_REDUCE_SCATTER = "after_reduce_scatter"
    BEFORE_ALL_REDUCE = "before_all_reduce"
    AFTER_ALL_REDUCE = "after_all_reduce"
    BEFORE_COPY = "before_copy"
    AFTER_COPY = "after_copy"
    BEFORE_GRAD = "before_grad"
    WAIT_COPY = "wait_copy"
    RESHARD = "reshard"
    END_OF_BACKWARD = "end_of_backward"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Point.BEFORE_ALL_GATHER: "host, inside the all-gather stream context, before the all-gather is enqueued",
    Point.AFTER_ALL_GATHER: "host, inside the all-gather stream context, after the all-gather is enqueued",
    Point.WAIT_ALL_GATHER: "host, after the consumer stream was made to wait for the all-gather",
    Point.BEFORE_REDUCE_SCATTER: "host, inside the reduce-scatter stream context, before the collective",
    Point.AFTER_REDUCE_SCATTER: "host, inside the reduce-scatter stream context, after the collective",
    Point.BEFORE_ALL_REDUCE: "host, inside the all-reduce stream context, before the HSDP all-reduce",
    Point.AFTER_ALL_REDUCE: "host, inside the all-reduce stream context, after the HSDP all-reduce",
    Point.BEFORE_COPY: "host, inside the copy stream context, before an offload copy is enqueued",
    Point.AFTER_COPY: "host, inside the copy stream context, after an offload copy is enqueued",
    Point.BEFORE_GRAD: "host, inside the stream that computes a gradient, before its kernel is enqueued",
    Point.WAIT_COPY: "host, after the consumer stream was made to wait for a host-to-device copy",
    Point.RESHARD: "host, when a group drops its unsharded parameters",
    Point.END_OF_BACKWARD: "host, after the default stream waited for the reduction streams",
}
assert set(_DESCRIPTIONS) == set(Point), "every point is described"

# name -> the plain str Runtime.point hands to observers (one lookup checks and normalizes).
_CANONICAL: dict[str, str] = {p.value: p.value for p in Point}


def check_point(name: str) -> str:
    """`name` as a plain str when it is a `Point`; ValueError naming the known points otherwise."""
    canonical = _CANONICAL.get(name)
    if canonical is None:
        raise ValueError(f"unknown injection point {name!r}; known: {', '.join(_CANONICAL)}")
    return canonical
