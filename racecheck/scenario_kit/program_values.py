"""What a generated program (racecheck.scenario_kit.programs) computes: its outcome in program order
(`expected`), which a correctly synchronized program computes however its streams are timed, the
sizes of its witnesses, and whether an operation's lateness can show in what is read.
"""

from __future__ import annotations

import dataclasses

from racecheck.scenario_kit.program_ops import Program


@dataclasses.dataclass
class Outcome:
    """What a run computed: each live buffer's value and each witness (None: not uniform); and,
    not compared, where each device buffer was allocated (to tell a block's reuse)."""

    values: dict[int, float | None]
    witnesses: list[float | None]
    addresses: dict[int, int] = dataclasses.field(default_factory=dict, compare=False)


def expected(program: Program) -> Outcome:
    """What the program computes with every operation done at once, in program order."""
    values: dict[int, float] = {}
    live: set[int] = set()
    witnesses: list[float | None] = [None] * program.witnesses
    for op in program.ops:
        if op.kind in ("alloc", "host_alloc"):
            values[op.buf] = op.value
            live.add(op.buf)
        elif op.kind in ("write", "host_write"):
            values[op.buf] = op.value
        elif op.kind in ("copy", "to_host", "from_host"):
            values[op.buf] = values[op.src]
        elif op.kind in ("read", "host_read"):
            witnesses[op.other] = values[op.src]
        elif op.kind == "free":
            live.discard(op.buf)
    return Outcome({b: values[b] for b in sorted(live)}, witnesses)


def witness_sizes(program: Program) -> list[int]:
    """The elements each witness holds: the size of the buffer its read copies."""
    sizes: dict[int, int] = {}
    out = [0] * program.witnesses
    for op in program.ops:
        if op.kind in ("alloc", "host_alloc"):
            sizes[op.buf] = op.size
        elif op.kind in ("read", "host_read"):
            out[op.other] = sizes[op.src]
    return out


def changes_value(program: Program, i: int) -> bool:
    """Whether operation i writes a value other than the one its buffer held (a fresh buffer's
    first fill always does): only then does running it late show in what is read."""
    values: dict[int, float] = {}
    for k, op in enumerate(program.ops):
        if op.kind in ("alloc", "host_alloc", "write", "host_write"):
            new = op.value
        elif op.kind in ("copy", "to_host", "from_host"):
            new = values[op.src]
        else:
            continue
        if k == i:
            return op.kind in ("alloc", "host_alloc") or values.get(op.buf) != new
        values[op.buf] = new
    return False
