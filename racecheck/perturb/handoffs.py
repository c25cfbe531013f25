"""The stream API calls where work passes from one stream to another, and the points patch mode
puts on each side of them: data, so that a new call or a new side is one row here.

A side is a point and the stream its delay goes on; `before` is enqueued right before the call's
own effect, `after` right after it:

- make a side stream current (entering `torch.cuda.stream(s)`; a runtime's `set_stream`): after,
  `stream_enter` on s;
- a stream waits (`wait_stream`, `wait_event`, `Event.wait`): before, `before_stream_wait`, and
  after, `stream_wait`, both on the waiting stream;
- an event is recorded (`Event.record`, `record_event`): before, `event_record`, and after,
  `after_event_record`, both on the recording stream.

`stream_enter` has one side: nothing is enqueued on s between the host's entering and its next
launch, so a delay before would be the one after. A delay before a record holds back the work the
event covers (its waiters see it late); one after it holds back work the event does *not* cover,
which is how an event recorded too early, before the write it should mark, is exposed. A delay
before a wait runs beside the producer, one after it runs after the producer: both hold back the
waiting stream's later work. Collectives have both sides too (patch.py): `before_*` on the stream
the collective runs on, `after_*` on the stream the caller's next work runs on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from racecheck.perturb.points import (
    AFTER_EVENT_RECORD,
    BEFORE_STREAM_WAIT,
    EVENT_RECORD,
    STREAM_ENTER,
    STREAM_WAIT,
)

# (args, kwargs, actions) -> the stream the call acts on
Target = Callable[[tuple, dict, object], object]


def _first(args: tuple, kwargs: dict, actions) -> object:
    """A function's stream argument (torch.cuda.set_stream(stream)), or a method's self."""
    return args[0] if args else kwargs.get("stream")


def _context_stream(args: tuple, kwargs: dict, actions) -> object:
    """The stream a `torch.cuda.stream(s)` context makes current (its StreamContext's self)."""
    return getattr(args[0], "stream", None) if args else None


def _second_or_current(args: tuple, kwargs: dict, actions) -> object:
    """Event.record(stream=None) / Event.wait(stream=None), and a method's stream argument:
    the stream given, else the current one."""
    stream = args[1] if len(args) > 1 else kwargs.get("stream")
    return stream if stream is not None else actions.current_stream()


@dataclasses.dataclass(frozen=True)
class HandoffCall:
    """A stream API call: which stream it acts on, and its points before and after its effect
    (None: no point on that side). `entry` calls only count when they make a non-default stream
    current (a return to the default stream hands nothing over)."""

    target: Target
    before: str | None
    after: str | None
    entry: bool = False

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(p for p in (self.before, self.after) if p is not None)


_ENTER = HandoffCall(_first, None, STREAM_ENTER, entry=True)
_WAIT = HandoffCall(_first, BEFORE_STREAM_WAIT, STREAM_WAIT)  # self: the waiting stream
_EVENT_WAIT = HandoffCall(_second_or_current, BEFORE_STREAM_WAIT, STREAM_WAIT)
_RECORD = HandoffCall(_first, EVENT_RECORD, AFTER_EVENT_RECORD)  # self: the recording stream
_EVENT_RECORD = HandoffCall(_second_or_current, EVENT_RECORD, AFTER_EVENT_RECORD)

# The kind an actions object gives each function it wants wrapped (handoff_targets) -> its call.
CALLS: dict[str, HandoffCall] = {
    "set_stream": _ENTER,  # set_stream(stream)
    "stream_context": HandoffCall(_context_stream, None, STREAM_ENTER, entry=True),  # torch.cuda.stream(s)
    "set_current_stream": HandoffCall(_second_or_current, None, STREAM_ENTER, entry=True),  # rt.set_current_stream
    "wait_stream": _WAIT,
    "wait_event": _WAIT,
    "event_wait": _EVENT_WAIT,
    "record_event": _RECORD,
    "event_record": _EVENT_RECORD,
}
