"""The named injection points: where along the FSDP path a perturbation can act.

Three kinds, one namespace:
- marked points: racecheck.fsdp (and scenario code written against the runtime) calls
  `Runtime.point(Point.X, ...)` on the host (racecheck.device.points.Point, checked there); the
  stream current at that moment is where a delay goes.
- runtime points: derived by the injector from the runtime's own observer calls, on both backends
  (`free` from on_free, `event_wait` from on_event_wait), so they need no marking at all.
- hand-off points: where patch mode (patch.py) sees plain torch.cuda code hand work from one
  stream to another; they exist in patch mode only (the runtime's code marks its own points).
"""

from racecheck.device.points import Point

# The marked points are the runtime's (racecheck.device.points), described where they are defined.
MARKED_POINTS = {p.value: p.description for p in Point}

FREE = "free"
EVENT_WAIT = "event_wait"

RUNTIME_POINTS = {
    FREE: "a block's last reference died (on_free); the stream is the block's allocation stream",
    EVENT_WAIT: "a stream is made to wait for an event (on_event_wait); the stream is the waiting one",
}

STREAM_ENTER = "stream_enter"
BEFORE_STREAM_WAIT = "before_stream_wait"
STREAM_WAIT = "stream_wait"
EVENT_RECORD = "event_record"
AFTER_EVENT_RECORD = "after_event_record"

# Where each sits on its call, and why a call has the sides it has: racecheck.perturb.handoffs.
HANDOFF_POINTS = {
    STREAM_ENTER: "host, right after it made a non-default stream current (torch.cuda.stream(s), "
    "torch.cuda.set_stream); the delay goes on that stream",
    BEFORE_STREAM_WAIT: "host, right before a stream is made to wait (wait_stream, wait_event, Event.wait); "
    "the delay goes on the waiting stream, ahead of the wait",
    STREAM_WAIT: "host, right after a stream was made to wait (wait_stream, wait_event, Event.wait); "
    "the delay goes on the waiting stream",
    EVENT_RECORD: "host, right before an event is recorded (Event.record, Stream.record_event); the "
    "delay goes on the recording stream, ahead of the record",
    AFTER_EVENT_RECORD: "host, right after an event was recorded (Event.record, Stream.record_event); the "
    "delay goes on the recording stream, behind the record (work the event does not cover)",
}

POINTS = {**MARKED_POINTS, **RUNTIME_POINTS, **HANDOFF_POINTS}

# The collective each `before_*` point precedes and each `after_*` point follows: patch mode maps
# torch.distributed's calls onto them (the names are the runtime's marked points as well).
COLLECTIVE_POINTS = {
    "all_gather": "before_all_gather",
    "reduce_scatter": "before_reduce_scatter",
    "all_reduce": "before_all_reduce",
}
COLLECTIVE_AFTER_POINTS = {
    "all_gather": "after_all_gather",
    "reduce_scatter": "after_reduce_scatter",
    "all_reduce": "after_all_reduce",
}
