"""Run a generated program (programs.py) and read back what it computed: on racecheck's runtime
(the CPU emulation, or CUDA) and on plain torch.cuda, so that the perturbation and the detector
can be judged against `programs.expected` on both.

Every access is a launch on its stream (a fill, a copy), so that nothing but the program's own
operations allocate: a read copies its buffer into a slice of one witness buffer made before the
program starts, which no later allocation can be handed. Each run writes its values offset by a
salt of its own and reads them back without it: a block handed out again in a later run of the
same program (a real caching allocator gives the same addresses to the same program) then holds
values of no run, so that a read of memory not yet written shows.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import torch

from racecheck.scenario_kit.program_ops import STREAMS, Program
from racecheck.scenario_kit.program_values import Outcome, witness_sizes

_SALTS = itertools.count(1)
SALT_STEP = 1000.0  # far above any value a generated program writes


def _salt() -> float:
    """The next run's salt; below 2**24 with the values added, so float32 holds them exactly."""
    return SALT_STEP * (1 + next(_SALTS) % 4096)


def _uniform(t: torch.Tensor, salt: float) -> float | None:
    """The value every element holds less the run's salt, None when they differ (or are NaN)."""
    flat = t.flatten()
    first = float(flat[0])
    return first - salt if bool((flat == first).all()) else None


def _slices(program: Program) -> list[tuple[int, int]]:
    out, at = [], 0
    for n in witness_sizes(program):
        out.append((at, at + n))
        at += n
    return out


def run_on_runtime(
    program: Program, rt, *, around: Callable[[], contextlib.AbstractContextManager] | None = None
) -> Outcome:
    """Run `program` on racecheck runtime `rt` (its default stream queued, as on a GPU), inside
    `around()` (a perturbation, a detector) from the first operation to the last."""
    streams = [rt.default_stream()] + [rt.new_stream(f"s{i}") for i in range(1, STREAMS)]
    slices = _slices(program)
    salt = _salt()
    with _world(program, cuda=rt.device.type == "cuda"), _drained(rt), rt.queued_default_stream():
        witness = rt.empty(max(1, slices[-1][1] if slices else 1))
        host_witness: dict[int, torch.Tensor] = {}
        bufs: dict[int, torch.Tensor] = {}
        events: dict[int, object] = {}
        addresses: dict[int, int] = {}
        with around() if around is not None else contextlib.nullcontext():
            for op in program.ops:
                _runtime_op(rt, op, streams, bufs, events, witness, slices, host_witness, salt)
                if op.kind == "alloc":
                    addresses[op.buf] = bufs[op.buf].data_ptr()
            rt.synchronize()
        values = {b: _uniform(t, salt) for b, t in sorted(bufs.items())}
        seen = [
            _uniform(host_witness[i] if i in host_witness else witness[a:z], salt) for i, (a, z) in enumerate(slices)
        ]
    return Outcome(values, seen, addresses)


def _fill(value: float, form: str = "fill"):
    if form == "add":  # a Python number the dispatcher wraps as a 0-dim CPU tensor
        return lambda out: out.fill_(0.0).add_(value)
    return lambda out: out.fill_(value)


def _copy(out, src):
    out.copy_(src)


def _copy_as(form: str, *, cuda: bool):
    """A copy as the operation's form writes it (program_ops.FORMS)."""
    from racecheck.scenario_kit import program_kernels

    if form == "triton" and cuda:
        return program_kernels.triton_copy()
    if form in ("compiled", "triton"):
        return program_kernels.compiled_copy()
    if form == "collective":
        return program_kernels.collective_copy()
    if form == "dtensor":
        return program_kernels.dtensor_copy()
    if form == "fsdp2":
        return program_kernels.fsdp2_copy()
    return _copy


@contextlib.contextmanager
def _drained(rt):
    """Every stream's queued work done on the way out, an error's way too: before the process
    group that a distributed copy queued on a stream uses is destroyed."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # the error on its way out says what went wrong
            rt.synchronize()


def _world(program: Program, *, cuda: bool) -> contextlib.AbstractContextManager:
    """The process group of one rank that the program's distributed copies need, if any."""
    from racecheck.scenario_kit import program_kernels

    return program_kernels.world_of_one({op.form for op in program.ops}, cuda=cuda)


def _shared_op(
    op,
    s,
    streams,
    bufs,
    events,
    host_witness,
    salt: float,
    *,
    new_event,
    synchronize,
    record_stream,
    pinned_empty,
    context,
) -> bool:
    """The operations both interpreters carry out alike, through the stream API's names they share
    (events, waits, synchronizations, record_stream, frees, the host's own work on pinned
    buffers); False for any other."""
    kind = op.kind
    if kind == "record":
        if op.other not in events:
            events[op.other] = new_event()
        if op.form == "context":
            with context(s):
                events[op.other].record()  # on the current stream
        else:
            events[op.other].record(s)
    elif kind == "wait":
        if op.form == "context":
            with context(s):
                events[op.other].wait()  # the current stream waits
        else:
            s.wait_event(events[op.other])
    elif kind == "wait_stream":
        s.wait_stream(streams[op.other])
    elif kind == "stream_sync":
        s.synchronize()
    elif kind == "event_sync":
        events[op.other].synchronize()
    elif kind == "synchronize":
        synchronize()
    elif kind == "record_stream":
        record_stream(bufs[op.buf], s)
    elif kind == "free":
        del bufs[op.buf]
    elif kind == "host_alloc":
        bufs[op.buf] = pinned_empty(op.size)
        bufs[op.buf].fill_(op.value + salt)  # the host writes its own buffer at once
    elif kind == "host_write":
        bufs[op.buf].fill_(op.value + salt)
    elif kind == "host_read":
        host_witness[op.other] = bufs[op.src].clone()
    else:
        return False
    return True


def _runtime_op(rt, op, streams, bufs, events, witness, slices, host_witness, salt: float) -> None:
    kind = op.kind
    s = streams[op.stream] if op.stream >= 0 else None
    if kind == "alloc":
        with rt.stream(s):
            t = rt.empty(op.size)
            rt.launch("fill", _fill(op.value + salt), writes=(t,))
        bufs[op.buf] = t
    elif kind == "write":
        with rt.stream(s):
            rt.launch("fill", _fill(op.value + salt, op.form), writes=(bufs[op.buf],))
    elif kind in ("copy", "to_host", "from_host"):
        with rt.stream(s):
            rt.launch(kind, _copy_as(op.form, cuda=False), writes=(bufs[op.buf],), reads=(bufs[op.src],))
    elif kind == "read":
        a, z = slices[op.other]
        with rt.stream(s):
            rt.launch("read", _copy, writes=(witness[a:z],), reads=(bufs[op.src],))
    elif not _shared_op(
        op,
        s,
        streams,
        bufs,
        events,
        host_witness,
        salt,
        new_event=rt.new_event,
        synchronize=rt.synchronize,
        record_stream=rt.record_stream,
        pinned_empty=rt.pinned_empty,
        context=rt.stream,
    ):
        raise AssertionError(f"unknown operation {op}")


def run_on_torch_cuda(
    program: Program, *, around: Callable[[], contextlib.AbstractContextManager] | None = None
) -> Outcome:
    """Run `program` with torch.cuda itself (streams, events, the caching allocator, pinned
    memory), inside `around()`: what patch mode and the PyTorch tracker act on."""
    device = torch.device("cuda", torch.cuda.current_device())
    streams = [torch.cuda.default_stream(device)] + [torch.cuda.Stream(device) for _ in range(1, STREAMS)]
    slices = _slices(program)
    salt = _salt()
    witness = torch.empty(max(1, slices[-1][1] if slices else 1), device=device)
    host_witness: dict[int, torch.Tensor] = {}
    bufs: dict[int, torch.Tensor] = {}
    events: dict[int, torch.cuda.Event] = {}
    addresses: dict[int, int] = {}
    torch.cuda.synchronize(device)
    with _world(program, cuda=True), around() if around is not None else contextlib.nullcontext():
        for op in program.ops:
            _torch_op(op, device, streams, bufs, events, witness, slices, host_witness, salt)
            if op.kind == "alloc":
                addresses[op.buf] = bufs[op.buf].data_ptr()
        torch.cuda.synchronize(device)
    values = {b: _uniform(t.cpu(), salt) for b, t in sorted(bufs.items())}
    seen = [
        _uniform(host_witness[i] if i in host_witness else witness[a:z].cpu(), salt) for i, (a, z) in enumerate(slices)
    ]
    return Outcome(values, seen, addresses)


def _torch_op(op, device, streams, bufs, events, witness, slices, host_witness, salt: float) -> None:
    kind = op.kind
    s = streams[op.stream] if op.stream >= 0 else None
    if kind == "alloc":
        with torch.cuda.stream(s):
            t = torch.empty(op.size, device=device)
            t.fill_(op.value + salt)
        bufs[op.buf] = t
    elif kind == "write":
        with torch.cuda.stream(s):
            _fill(op.value + salt, op.form)(bufs[op.buf])
    elif kind == "copy" and op.form:
        with torch.cuda.stream(s):
            _copy_as(op.form, cuda=True)(bufs[op.buf], bufs[op.src])
    elif kind in ("copy", "to_host", "from_host"):
        with torch.cuda.stream(s):
            bufs[op.buf].copy_(bufs[op.src], non_blocking=True)
    elif kind == "read":
        a, z = slices[op.other]
        with torch.cuda.stream(s):
            witness[a:z].copy_(bufs[op.src])
    elif not _shared_op(
        op,
        s,
        streams,
        bufs,
        events,
        host_witness,
        salt,
        new_event=torch.cuda.Event,
        synchronize=lambda: torch.cuda.synchronize(device),
        record_stream=lambda t, stream: t.record_stream(stream),
        pinned_empty=lambda n: torch.empty(n, pin_memory=True),
        context=torch.cuda.stream,
    ):
        raise AssertionError(f"unknown operation {op}")
