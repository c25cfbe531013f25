"""The generated programs of the soundness check as data: their operations, the synchronizations
the generator inserted (what each one orders), the program itself, and the streams and buffer
sizes they use. racecheck.scenario_kit.programs generates them; program_clocks.py replays their
happens-before order, program_values.py says what they compute.
"""

from __future__ import annotations

import dataclasses

STREAMS = 4  # 0: the default stream
SIZES = (256, 1024)  # float32 elements: equal sizes so that a freed block is reused


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation; `kind` names it, the other fields are its operands (-1: unused)."""

    kind: str
    stream: int = -1  # where it runs (the waiting stream of a wait)
    buf: int = -1  # the buffer it writes or acts on
    src: int = -1  # the buffer it reads
    other: int = -1  # the stream waited for, an event, a witness slot
    value: float = 0.0
    size: int = 0
    # How the operation is written, where programs write it several ways (FORMS): the same effect,
    # through other entries of the stream API and other kernels.
    form: str = ""


@dataclasses.dataclass(frozen=True)
class Sync:
    """A synchronization the generator inserted: its operations' indices, why it is there (an
    access, or a reuse before the next allocation on a stream), and the racing pair it orders:
    the earlier access (its stream and operation) and the operation after it. A reuse names the
    buffers whose blocks the allocation may be handed."""

    ops: tuple[int, ...]
    reason: str  # "access" or "reuse"
    early_stream: int
    early_op: int
    late_op: int
    freed: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Program:
    ops: tuple[Op, ...]
    syncs: tuple[Sync, ...]
    witnesses: int

    def text(self) -> str:
        return "\n".join(f"{i:2d} {op}" for i, op in enumerate(self.ops))


HOST = -2  # the host, as the domain of a pinned buffer's host-side accesses

# The ways an operation may be written (its `form`), all with the same effect:
# - write: `fill` (fill_ with a number) or `add` (fill_(0) then add_ with a Python number, which the
#   dispatcher wraps as a 0-dim CPU tensor);
# - copy: `""` (copy_), `compiled` (a torch.compile'd function: Inductor's kernel, C++ on the CPU,
#   Triton on CUDA), `triton` (a Triton kernel of the program's own, called eagerly; on the CPU
#   emulation the compiled function stands in for it), or over a process group of one rank:
#   `collective` (a functional all-reduce, then an all-gather), `dtensor` (a DTensor's
#   full_tensor(), which on one rank gathers nothing) or `fsdp2` (FSDP2's
#   fsdp::split_with_sizes_copy), their modules imported at the first such copy (program_kernels.py);
# - record, wait: `""` (the stream named: `ev.record(s)`, `s.wait_event(ev)`) or `context` (inside
#   `with stream(s)`: `ev.record()`, `ev.wait()` on the current stream).
FORMS = {
    "write": ("fill", "add"),
    "copy": ("", "compiled", "triton", "collective", "dtensor", "fsdp2"),
    "record": ("", "context"),
    "wait": ("", "context"),
}
