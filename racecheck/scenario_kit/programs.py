"""Small multi-stream programs, correctly synchronized by construction, and the same programs with
one synchronization removed: the soundness check of the perturbation and the detector.

A program is a list of operations on up to four streams (0 the default stream), device buffers
and pinned host buffers. The generator (`programs`, a Hypothesis strategy) keeps the program's
happens-before relation as vector clocks while it draws operations, and before any access that
an earlier conflicting access is not ordered before it inserts one synchronization, drawn from
what a correct program may use: an event recorded on the producer and waited on by the
consumer, `wait_stream`, or a host synchronization of the producer's stream or event (before a
host access that is the only kind that helps). It frees a buffer at any moment, and then either
calls `record_stream` for each other stream that used it before the free, or makes the buffer's
own stream wait for those streams before that stream next allocates: the free-then-wait-then-
allocate order that FSDP2 relies on, which an allocator action must not break ([Note: sound
allocator actions] in racecheck.perturb.free_actions).

Every synchronization the generator inserts is needed at that moment; `without(program, i)`
drops the i-th such one (an event's record and wait together) and gives a racy program: the
access it ordered now races with the earlier one. `expected(program)` is what the program
computes when every operation runs at once in program order, which a correctly synchronized
program computes however its streams are timed.

This module is the generator; the programs' data is in program_ops.py, their happens-before
replay in program_clocks.py and what they compute in program_values.py.
"""

from __future__ import annotations

import dataclasses

from racecheck.scenario_kit.program_clocks import Clocks, ordered
from racecheck.scenario_kit.program_ops import FORMS, HOST, SIZES, STREAMS, Op, Program, Sync


@dataclasses.dataclass
class _Buffer:
    stream: int  # the allocation stream (HOST for pinned host buffers)
    size: int
    live: bool = True
    write: tuple[int, int, int] | None = None  # (domain, epoch, operation) of the last write
    reads: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # domain -> (epoch, operation)
    recorded: set[int] = dataclasses.field(default_factory=set)


def programs(*, max_ops: int = 24, host: bool = True):
    """A Hypothesis strategy of correctly synchronized Programs (see the module docstring)."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw) -> Program:
        return _Generator(draw, st, host=host).run(draw(st.integers(6, max_ops)))

    return build()


class _Generator:
    def __init__(self, draw, st, *, host: bool) -> None:
        self.draw, self.st, self.host_buffers = draw, st, host
        self.ops: list[Op] = []
        self.syncs: list[Sync] = []
        self.clocks = Clocks()
        self.bufs: dict[int, _Buffer] = {}
        # stream -> {domain: (epoch, operation, buffers)} it must cover before it next allocates
        self.owed: dict[int, dict[int, tuple[int, int, set[int]]]] = {}
        self.events = 0
        self.witnesses = 0
        self.values = 0

    def value(self) -> float:
        self.values += 1
        return float(self.values)

    def run(self, steps: int) -> Program:
        for _ in range(steps):
            self.step()
        return Program(tuple(self.ops), tuple(self.syncs), self.witnesses)

    # -- drawing ---------------------------------------------------------------------------
    def pick(self, options):
        return self.draw(self.st.sampled_from(list(options)))

    def step(self) -> None:
        device = [b for b, x in self.bufs.items() if x.live and x.stream != HOST]
        pinned = [b for b, x in self.bufs.items() if x.live and x.stream == HOST]
        freed = [b for b, x in self.bufs.items() if not x.live and x.stream != HOST]
        # Weighted so that buffers cross streams, die while another stream may still use them, and
        # their blocks are asked for again: where an allocator action could break correct code.
        kinds = ["alloc"] * (3 if len(device) < 3 else 1)
        if device:
            kinds += ["write", "copy", "read", "read", "read", "free", "free", "free", "sync"]
        if freed:
            kinds += ["realloc"] * 3
        if self.host_buffers:
            kinds += ["host_alloc"] if len(pinned) < 2 else []
            if pinned:
                kinds += ["host_read", "host_write", "free_host"]
            if pinned and device:
                kinds += ["to_host", "from_host"]
        kind = self.pick(kinds)
        s = self.draw(self.st.integers(0, STREAMS - 1))
        if kind == "alloc":
            self.alloc(s, self.pick(SIZES))
        elif kind == "realloc":  # the stream and size of a freed buffer: its block may come back
            x = self.bufs[self.pick(freed)]
            self.alloc(x.stream, x.size)
        elif kind in ("write", "read"):
            b = self.pick(device)
            s = self.other_stream(b, s)
            self.access(s, writes=[b], kind=kind) if kind == "write" else self.access(s, reads=[b], kind=kind)
        elif kind == "copy":
            dst, src = self.pick(device), self.pick(device)
            if dst != src and self.bufs[dst].size == self.bufs[src].size:
                self.access(self.other_stream(dst, s), writes=[dst], reads=[src], kind="copy")
        elif kind == "free":
            self.free(self.pick(device))
        elif kind == "sync":  # an extra synchronization nothing needs: correct code does that too
            self.extra_sync(s)
        elif kind == "host_alloc":
            b = len(self.bufs)
            self.bufs[b] = _Buffer(HOST, self.pick(SIZES), write=(HOST, 0, len(self.ops)))
            self.ops.append(Op("host_alloc", buf=b, value=self.value(), size=self.bufs[b].size))
        elif kind == "host_read":
            self.host_access(self.pick(pinned), write=False)
        elif kind == "host_write":
            self.host_access(self.pick(pinned), write=True)
        elif kind == "free_host":
            b = self.pick(pinned)
            self.bufs[b].live = False
            self.ops.append(Op("free", buf=b))
        else:
            h, d = self.pick(pinned), self.pick(device)
            if self.bufs[h].size == self.bufs[d].size:
                if kind == "to_host":
                    self.access(s, writes=[h], reads=[d], kind="to_host")
                else:
                    self.access(s, writes=[d], reads=[h], kind="from_host")

    def form(self, kind: str) -> str:
        """How the next operation of `kind` is written (program_ops.FORMS): by its position, so
        that every form comes up in a program without a draw of its own (the same draws give the
        same programs whatever forms there are)."""
        forms = FORMS[kind]
        return forms[len(self.ops) % len(forms)]

    def other_stream(self, b: int, s: int) -> int:
        """Mostly a stream other than the buffer's own: buffers that cross streams."""
        own = self.bufs[b].stream
        if s == own and self.draw(self.st.booleans()):
            return (own + 1 + self.draw(self.st.integers(0, STREAMS - 2))) % STREAMS
        return s

    # -- operations ------------------------------------------------------------------------
    def alloc(self, s: int, size: int) -> None:
        mark = len(self.syncs)
        for d, (epoch, early, freed) in sorted(self.owed.pop(s, {}).items()):
            if not self.clocks.covers(s, d, epoch):  # a free's reuse: s must follow d first
                self.order(s, d, reason="reuse", early_op=early, freed=tuple(sorted(freed)))
        b = len(self.bufs)
        self.bufs[b] = _Buffer(s, size)
        self.bufs[b].write = (s, self.clocks.epoch(s), len(self.ops))
        self.emit(Op("alloc", stream=s, buf=b, value=self.value(), size=size), mark)

    def access(self, s: int, *, writes=(), reads=(), kind: str) -> None:
        mark = len(self.syncs)
        for b in (*writes, *reads):
            for d, epoch, early in self.conflicts(b, write=b in writes):
                if d != s and not self.clocks.covers(s, d, epoch):
                    self.order(s, d, reason="access", early_op=early)
        epoch = self.clocks.epoch(s)
        if kind == "write":
            op = Op("write", stream=s, buf=writes[0], value=self.value(), form=self.form("write"))
        elif kind == "read":
            op = Op("read", stream=s, src=reads[0], other=self.witnesses)
            self.witnesses += 1
        elif kind == "copy":
            op = Op(kind, stream=s, buf=writes[0], src=reads[0], form=self.form("copy"))
        else:  # to_host, from_host
            op = Op(kind, stream=s, buf=writes[0], src=reads[0])
        at = len(self.ops)
        self.emit(op, mark)
        for b in writes:
            self.bufs[b].write, self.bufs[b].reads = (s, epoch, at), {}
        for b in reads:
            self.bufs[b].reads[s] = (epoch, at)

    def conflicts(self, b: int, *, write: bool) -> list[tuple[int, int, int]]:
        """(domain, epoch, operation) of the accesses to `b` that an access must follow."""
        x = self.bufs[b]
        earlier = [x.write] if x.write else []
        if write:
            earlier += [(d, e, op) for d, (e, op) in x.reads.items()]
        return earlier

    def host_access(self, b: int, *, write: bool) -> None:
        mark = len(self.syncs)
        x = self.bufs[b]
        for d, epoch, early in self.conflicts(b, write=write):
            if d != HOST and not self.clocks.covers(HOST, d, epoch):
                self.order(HOST, d, reason="access", early_op=early)
        if write:
            x.write, x.reads = (HOST, 0, len(self.ops)), {}
            self.emit(Op("host_write", buf=b, value=self.value()), mark)
        else:
            self.emit(Op("host_read", src=b, other=self.witnesses), mark)
            self.witnesses += 1

    def emit(self, op: Op, mark: int) -> None:
        """Append an access or allocation; the synchronizations inserted for it since `mark`
        order it. One inserted later can make an earlier one redundant (it orders the same pair
        through a third stream): only those still needed are listed, so that removing any one
        leaves a race."""
        late = len(self.ops)
        self.ops.append(op)
        fresh = [dataclasses.replace(sync, late_op=late) for sync in self.syncs[mark:]]
        self.syncs[mark:] = [s for s in fresh if not ordered(self.ops, s.early_op, late, skip=set(s.ops))]

    def free(self, b: int) -> None:
        x = self.bufs[b]
        users: dict[int, tuple[int, int]] = {}  # domain -> (epoch, operation) of its last access
        for d, e, op in self.conflicts(b, write=True):
            if d not in users or users[d][0] < e:
                users[d] = (e, op)
        pending = {
            d: eo for d, eo in users.items() if d not in (x.stream, HOST) and not self.clocks.covers(x.stream, d, eo[0])
        }
        for d in sorted(pending):
            if self.draw(self.st.booleans()):  # record_stream: the allocator waits for d
                self.ops.append(Op("record_stream", stream=d, buf=b))
                x.recorded.add(d)
        owed = self.owed.setdefault(x.stream, {})
        for d, (e, op) in pending.items():
            # record_stream holds the block until each recorded stream passes the free: that covers
            # what those streams are ordered after now, other streams' accesses included
            if d not in x.recorded and not any(self.clocks.covers(r, d, e) for r in x.recorded):
                before = owed.get(d)
                if before is None or before[0] < e:
                    owed[d] = (e, op, (before[2] if before else set()) | {b})
                else:
                    before[2].add(b)
        x.live = False
        self.ops.append(Op("free", buf=b))

    # -- synchronization -------------------------------------------------------------------
    def order(self, late: int, early: int, *, reason: str, early_op: int, freed: tuple[int, ...] = ()) -> None:
        """Make `late` (a stream, or HOST) follow everything `early` (a stream) did so far."""
        first = len(self.ops)
        if late == HOST:
            how = self.pick(["stream_sync", "event_sync"])
        else:
            how = self.pick(["event", "wait_stream", "stream_sync"])
        if how == "event":
            ev = self.new_event()
            self.ops.append(Op("record", stream=early, other=ev, form=self.form("record")))
            self.clocks.record(ev, early)
            self.ops.append(Op("wait", stream=late, other=ev, form=self.form("wait")))
            self.clocks.wait(late, ev)
        elif how == "wait_stream":
            ev = self.new_event()  # wait_stream is a record on `early` and a wait, inside
            self.ops.append(Op("wait_stream", stream=late, other=early))
            self.clocks.record(ev, early)
            self.clocks.wait(late, ev)
        elif how == "event_sync":
            ev = self.new_event()
            self.ops.append(Op("record", stream=early, other=ev))
            self.clocks.record(ev, early)
            self.ops.append(Op("event_sync", other=ev))
            self.clocks.host_learns(self.clocks.events[ev])
        else:
            self.ops.append(Op("stream_sync", stream=early))
            self.clocks.sync_stream(early)
        ops = tuple(range(first, len(self.ops)))
        self.syncs.append(Sync(ops, reason, early, early_op, -1, freed))  # late_op: set by emit

    def extra_sync(self, s: int) -> None:
        other = self.draw(self.st.integers(0, STREAMS - 1))
        if other == s:
            self.ops.append(Op("synchronize"))
            for d in range(STREAMS):
                self.clocks.sync_stream(d)
            return
        self.ops.append(Op("wait_stream", stream=s, other=other))
        ev = self.new_event()
        self.clocks.record(ev, other)
        self.clocks.wait(s, ev)

    def new_event(self) -> int:
        self.events += 1
        return self.events


def early_record(program: Program, i: int) -> Program | None:
    """The program with the event of its i-th synchronization recorded too early: just before the
    access it must cover, on that access's stream (`ev.record(s)` ahead of the write instead of
    after it). The waiter is then ordered after the producer's earlier work only, and the access
    races with the one after the wait. None when the i-th synchronization is no event recorded on
    the stream of the access it orders."""
    sync = program.syncs[i]
    record = next((k for k in sync.ops if program.ops[k].kind == "record"), None)
    if record is None or program.ops[record].stream != program.ops[sync.early_op].stream:
        return None
    order = [k for k in range(len(program.ops)) if k != record]
    order.insert(order.index(sync.early_op), record)
    index = {old: new for new, old in enumerate(order)}
    syncs = tuple(
        dataclasses.replace(s, ops=tuple(index[o] for o in s.ops), early_op=index[s.early_op], late_op=index[s.late_op])
        for j, s in enumerate(program.syncs)
        if j != i
    )
    return Program(tuple(program.ops[k] for k in order), syncs, program.witnesses)


def without(program: Program, i: int) -> Program:
    """The program with its i-th inserted synchronization removed (a racy program)."""
    drop = set(program.syncs[i].ops)
    keep = [k for k in range(len(program.ops)) if k not in drop]
    index = {old: new for new, old in enumerate(keep)}
    syncs = tuple(
        dataclasses.replace(s, ops=tuple(index[o] for o in s.ops), early_op=index[s.early_op], late_op=index[s.late_op])
        for j, s in enumerate(program.syncs)
        if j != i and all(o in index for o in s.ops)
    )
    return Program(tuple(program.ops[k] for k in keep), syncs, program.witnesses)


def copies_written_as(program: Program, form: str) -> Program:
    """The program with every copy written in `form` (program_ops.FORMS["copy"]): the same
    operations, so the same synchronizations and the same values, through other code."""
    if form not in FORMS["copy"]:
        raise ValueError(f"copy form {form!r}: expected one of {FORMS['copy']}")
    ops = tuple(dataclasses.replace(op, form=form) if op.kind == "copy" else op for op in program.ops)
    return dataclasses.replace(program, ops=ops)
