"""The detector on a GPU: the runtime's own events on racecheck's CUDA backend, and the tracker for
plain PyTorch code. The same patterns as tests/test_detect.py, where the CPU emulation runs them;
skipped without a GPU (run on the GPU machine with `pytest tests/test_detect_cuda.py`)."""

from __future__ import annotations

import pytest
import torch

from racecheck.detect import RaceKind

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.runtime("cuda"),
]

N = 1 << 20  # 4 MiB buffers
# Operators past which the native log has handed what it holds to Python (op_log.cpp's DRAIN_AT, 4096)
PAST_A_DRAIN = 4200


def copy(out, src):
    out.copy_(src)


@pytest.mark.parametrize("fix", [None, "record_stream", "hold_until_wait", "wait_stream"])
def test_runtime_detector_on_cuda(rt, fix):
    from racecheck.detect import RaceDetector

    side = rt.new_stream("side")
    with RaceDetector().attached(rt) as det:
        a = rt.zeros(N)
        side.wait_stream(rt.default_stream())  # producer default (zeros), consumer side
        with rt.stream(side):
            out = rt.empty(N)
            rt.launch("consume", copy, reads=(a,), writes=(out,))
            if fix == "record_stream":
                rt.record_stream(a, side)
        if fix == "hold_until_wait":
            ev = rt.new_event()
            ev.record(side)
            rt.default_stream().wait_event(ev)
        elif fix == "wait_stream":
            rt.default_stream().wait_stream(side)
        del a
        b = rt.zeros(N)  # the caching allocator hands out a's block when it may
        rt.synchronize()
    assert [r.kind for r in det.reports()] == ([RaceKind.REUSE] if fix is None else [])
    del out, b


@pytest.mark.parametrize("sync", [False, True])
def test_host_read_of_pinned_memory_on_cuda(rt, sync):
    """A non-blocking device-to-host copy into pinned memory on a side stream; the host reads the
    buffer before (race) or after (no report) synchronizing the event after the copy."""
    from racecheck.detect import RaceDetector

    side = rt.new_stream("side")
    with RaceDetector().attached(rt) as det:
        a = rt.zeros(N)
        host = rt.pinned_empty(N)
        side.wait_stream(rt.default_stream())  # producer default (zeros), consumer side
        with rt.stream(side):
            rt.launch("d2h", lambda out, src: out.copy_(src, non_blocking=True), reads=(a,), writes=(host,))
            rt.record_stream(a, side)
            done = rt.new_event()
            done.record()
        if sync:
            done.synchronize()
        host.sum()
        rt.synchronize()
    assert [r.kind for r in det.reports()] == ([] if sync else [RaceKind.READ_AFTER_WRITE])
    del a, host


@pytest.mark.parametrize("fix", [None, "record_stream", "hold_until_wait", "fixed"])
def test_torch_tracker_on_plain_pytorch(fix):
    from racecheck.detect import TorchRaceTracker

    torch.cuda.synchronize()
    default, rs = torch.cuda.current_stream(), torch.cuda.Stream()
    with TorchRaceTracker() as tracker:
        grad = torch.randn(N, device="cuda")
        a = None if fix == "fixed" else torch.zeros(N, device="cuda")
        rs.wait_stream(default)
        with torch.cuda.stream(rs):
            if a is None:
                a = torch.zeros(N, device="cuda")  # allocated on the consuming stream
            a.add_(grad)
            torch.cuda._sleep(1_000_000)
            b = torch.empty(N, device="cuda")
            b.copy_(a)
            if fix == "record_stream":
                a.record_stream(rs)
            ev = torch.cuda.Event()
            ev.record(rs)
        if fix == "hold_until_wait":
            default.wait_event(ev)
        del a
        c = torch.zeros(N, device="cuda")
        default.wait_stream(rs)
        torch.cuda.synchronize()
    assert tracker.errors == []
    kinds = [r.kind for r in tracker.reports()]
    assert kinds == ([RaceKind.REUSE] if fix is None else []), tracker.render() if kinds else ""
    del b, c


@pytest.mark.parametrize("wait_for", [None, "event", "stream", "device", "blocking"])
def test_torch_tracker_sees_the_host_read_pinned_memory(wait_for):
    """A side stream copies into pinned memory (non-blocking) and records an event; the host reads
    the buffer, after a host synchronization or not ([Note: host accesses])."""
    from racecheck.detect.torch_tracker import TorchRaceTracker

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    host = torch.empty(N, pin_memory=True)
    with TorchRaceTracker() as tracker:
        src = torch.full((N,), 2.0, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.copy_(src, non_blocking=wait_for != "blocking")
            done = side.record_event()
        if wait_for == "event":
            done.synchronize()
        elif wait_for == "stream":
            side.synchronize()
        elif wait_for == "device":
            torch.cuda.synchronize()
        total = float(host.sum())  # the host reads the buffer
        torch.cuda.synchronize()
    kinds = [r.kind for r in tracker.reports()]
    assert kinds == ([RaceKind.READ_AFTER_WRITE] if wait_for is None else []), tracker.render()
    assert wait_for is None or total == 2.0 * N


def test_torch_tracker_sees_the_host_refill_a_queued_upload():
    from racecheck.detect.torch_tracker import TorchRaceTracker

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    host = torch.ones(N, pin_memory=True)
    with TorchRaceTracker() as tracker:
        dst = torch.empty(N, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(1_000_000)
            dst.copy_(host, non_blocking=True)  # reads the pinned buffer once the stream gets there
        host.fill_(3.0)  # the host refills it meanwhile
        torch.cuda.synchronize()
    assert [r.kind for r in tracker.reports()] == [RaceKind.WRITE_AFTER_READ], tracker.render()


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("early", [True, False])
def test_an_event_recorded_before_the_write_it_should_cover(path, early):
    """The producer records its event before an in-place update with a Python number
    (`buf.add_(5.0)`): the consumer that waits on the event reads `buf` unordered with the update.
    Both paths report it; recorded after the update, neither does. (The native log once took the
    number, which the dispatcher wraps as a 0-dim CPU tensor, for host memory, and the update for a
    synchronous host copy that ordered everything after it.)"""
    from racecheck.detect import TorchRaceTracker

    prod, cons = torch.cuda.Stream(), torch.cuda.Stream()
    with TorchRaceTracker(path=path) as tracker:
        buf = torch.zeros(N, device="cuda")
        prod.wait_stream(torch.cuda.current_stream())
        cons.wait_stream(torch.cuda.current_stream())
        ev = torch.cuda.Event()
        with torch.cuda.stream(prod):
            if early:
                ev.record(prod)
            buf.add_(5.0)
            if not early:
                ev.record(prod)
        with torch.cuda.stream(cons):
            cons.wait_event(ev)
            got = buf * 2
        torch.cuda.synchronize()
    assert tracker.path == path and not tracker.errors
    assert [r.kind for r in tracker.reports()] == ([RaceKind.READ_AFTER_WRITE] if early else []), tracker.render()
    del got


def _side_work(kind: str):
    """A torch.compile'd function (Inductor's Triton kernel), a Triton kernel called eagerly, or that
    kernel inside a compiled function: x * 3 + 1, below the dispatcher."""
    import triton
    import triton.language as tl

    if kind == "compiled":
        return torch.compile(lambda x: x * 3.0 + 1.0)

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0 + 1.0, mask=mask)

    def eager(x):
        out = torch.empty_like(x)
        scale[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out

    return eager if kind == "triton" else torch.compile(lambda x: eager(x) * 1.0)


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("kind", ["compiled", "triton", "triton_in_compiled"])
@pytest.mark.parametrize("mistake", [None, "drop_early", "no_wait"])
def test_kernels_below_the_dispatcher_are_tracked(path, kind, mistake):
    """A side stream's Triton kernel reads a default-stream tensor and writes its output: dropping
    the input without record_stream is a free-while-in-use race, reading the output on the default
    stream without a wait a read-after-write race; ordered, nothing is reported. The compiled
    function runs compiled under the tracker (Inductor's kernel is seen, not an eager fallback)."""
    from racecheck.detect import TorchRaceTracker

    work = _side_work(kind)
    side = torch.cuda.Stream()
    with TorchRaceTracker(path=path) as tracker:
        x = torch.randn(N, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = work(x)
        if mistake != "drop_early":
            x.record_stream(side)
        del x
        filler = torch.full((N,), -7.0, device="cuda")
        if mistake != "no_wait":
            torch.cuda.current_stream().wait_stream(side)
        got = out.clone()
        torch.cuda.synchronize()
    expected = {None: [], "drop_early": [RaceKind.REUSE], "no_wait": [RaceKind.READ_AFTER_WRITE]}[mistake]
    assert [r.kind for r in tracker.reports()] == expected, tracker.render()
    # A Triton kernel was seen: the compiled functions ran compiled, not as an eager fallback
    # (whose operators are the dispatcher's).
    assert tracker.stats["kernels"] >= 1 and not tracker.unseen_kernels and not tracker.errors
    del got, filler


_FIRST_TRACKER = """
import torch
from racecheck.detect import TorchRaceTracker
work = torch.compile(lambda x: x * 3.0 + 1.0)
side = torch.cuda.Stream()
with TorchRaceTracker() as tracker:
    x = torch.randn(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = work(x)
    x.record_stream(side)
    del x
    torch.cuda.current_stream().wait_stream(side)
    got = out.clone()
    torch.cuda.synchronize()
print("reports", len(tracker.reports()), "adopted", tracker.stats["adopted"], "path", tracker.path)
"""


def test_the_first_tracker_of_a_process_sees_cuda_trace_events():
    """The first tracker of a process, on the native path, over ordered code that compiles: the
    planning of its first operators imports torch.cuda._sanitizer, which used to take c10's GPU
    trace over from the log, so that no allocation or event wait was seen and the ordered code
    was reported ([Note: the GPU trace taken once]). A fresh process: in this one, earlier tests
    already took the trace once."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_TRACKER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-6:] == ["reports", "0", "adopted", "0", "path", "native"], (
        done.stdout + done.stderr[-3000:]
    )


# -- the native engine against the Python engine, on the same records -------------------------------
def _motivating_race():
    default, rs = torch.cuda.current_stream(), torch.cuda.Stream()
    grad = torch.randn(N, device="cuda")
    a = torch.zeros(N, device="cuda")
    rs.wait_stream(default)
    with torch.cuda.stream(rs):
        a.add_(grad)
        b = torch.empty(N, device="cuda")
        b.copy_(a)
    del a
    torch.zeros(N, device="cuda")  # may get a's block: free-while-in-use
    default.wait_stream(rs)
    return b


def _pinned_read_and_refill():
    side = torch.cuda.Stream()
    host = torch.empty(N, pin_memory=True)
    src = torch.full((N,), 2.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        host.copy_(src, non_blocking=True)
    total = float(host.sum())  # before the copy is known complete
    dst = torch.empty(N, device="cuda")
    with torch.cuda.stream(side):
        dst.copy_(host, non_blocking=True)
    host.fill_(3.0)  # while the upload is queued
    torch.cuda.synchronize()
    del host  # its death is logged: the pinned block's reuse waits for the side stream
    return total, dst


def _pinned_filled_before_the_upload():
    host = torch.empty(N, pin_memory=True)
    host.fill_(1.0)  # the host's own work before any stream touched the buffer
    host.mul_(2.0)
    dst = torch.empty(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dst.copy_(host, non_blocking=True)
    host.add_(1.0)  # while the upload is queued
    torch.cuda.synchronize()
    return dst


def _pinned_alias_written_during_the_upload():
    host = torch.zeros(N, pin_memory=True)
    dst = torch.empty(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dst.copy_(host, non_blocking=True)
    alias = torch.from_dlpack(host[8:])  # another storage over the same pinned memory
    alias.fill_(3.0)  # while the upload is queued
    torch.cuda.synchronize()
    return dst


def _pinned_uploaded_through_an_alias_that_dies_first():
    host = torch.zeros(N, pin_memory=True)
    alias = torch.from_dlpack(host)  # another storage over the buffer's bytes, which keeps the buffer alive
    dst, dst2 = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dst.copy_(alias, non_blocking=True)  # the buffer first seen through the alias
        dst2.copy_(host, non_blocking=True)
    count = torch.zeros((), device="cuda")
    for _ in range(PAST_A_DRAIN):  # the native log hands the uploads to Python first
        count.add_(1.0)
    del alias  # the buffer lives on, and stays tracked
    host.fill_(3.0)  # while the uploads are queued
    torch.cuda.synchronize()
    return dst, dst2


def _training_with_a_side_read():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(32, 256, device="cuda")
    side = torch.cuda.Stream()
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
    with torch.cuda.stream(side):
        model[2].weight.grad.sum()  # not ordered after the backward that wrote it
    torch.cuda.synchronize()


def _both_engines(program) -> tuple[list[str], list[str], list[str]]:
    """`program` under the tracker's native path and native engine, the batches its log drained
    kept; those batches applied again by the Python engine to a second tracker that reads the same
    log (operators, stacks, streams): both report texts, and both trackers' errors."""
    from racecheck.detect.feed_apply import apply_batch
    from racecheck.detect.native_feed import NativeFeed
    from racecheck.detect.torch_tracker import TorchRaceTracker

    torch.cuda.synchronize()
    tracker = TorchRaceTracker(path="native", engine="native")
    feed, batches = tracker._feed, []
    apply = feed._apply

    def kept(records, items):
        batches.append((bytes(records), bytes(items)))
        apply(records, items)

    feed._apply = kept
    with tracker:
        program()
        torch.cuda.synchronize()
    native = [r.text() for r in tracker.reports()]
    reference = TorchRaceTracker(path="python")  # its engine is the Python one, fed the same records
    reference.current = tracker.current
    ref_feed = NativeFeed(feed.log, reference, engine="python")
    ref_feed.engine, reference._feed = reference.engine, ref_feed
    ref_feed.plans, ref_feed.streams, ref_feed.stacks = feed.plans, feed.streams, feed.stacks
    for handle, name in tracker._names.items():
        reference.name_stream(handle, name)
    for records, items in batches:
        apply_batch(ref_feed, reference, reference.engine, records, items)
    return native, [r.text() for r in reference.reports()], tracker.errors + reference.errors


HOST_PROGRAMS = [
    _pinned_read_and_refill,
    _pinned_filled_before_the_upload,
    _pinned_alias_written_during_the_upload,
    _pinned_uploaded_through_an_alias_that_dies_first,
    _training_with_a_side_read,
]


@pytest.mark.parametrize("program", HOST_PROGRAMS)
def test_torch_tracker_paths_agree_where_the_log_makes_no_record_of_the_host_own_calls(program):
    """[Note: the host's own calls] (op_log.cpp): on CUDA the native log makes no record of a call
    that touches only host memory no stream may have touched, as AdamW's `step.item()` for each
    parameter or the filling of a pinned buffer before its upload, and asks CUDA whether a host
    item is pinned only where that may matter; the calls on the pinned buffer once a stream touched
    it stay, through another storage over its memory too. Both paths report the same races, the
    Python path having seen every call."""
    from racecheck.detect import TorchRaceTracker

    kinds, dropped, asked = {}, 0, 0
    for path in ("native", "python"):
        torch.cuda.synchronize()
        with TorchRaceTracker(path=path) as tracker:
            log = tracker._feed.log if path == "native" else None
            before = log.costs() if log else {}
            program()
            torch.cuda.synchronize()
            if log:
                dropped = log.costs()["host_only"] - before["host_only"]
                asked = log.costs()["pinned_asked"] - before["pinned_asked"]
        assert tracker.errors == []
        kinds[path] = sorted(str(r.kind) for r in tracker.reports())
    assert kinds["native"] and kinds["native"] == kinds["python"]
    if program is _training_with_a_side_read:
        # three AdamW steps of four parameters: two step counts read each, and the counts' increments,
        # none of them asked about (no stream touched the step counts); the four parameters' copies
        # to the device ask once each
        assert dropped >= 3 * 4 * 2 + 3 and asked == 4
    elif program is _pinned_filled_before_the_upload:
        # the buffer's filling and doubling make no record and ask nothing (its making, an
        # uninitialized allocation, is skipped from the start); the upload and the add after it ask
        # once each
        assert dropped >= 2 and asked == 2
    elif program is _pinned_alias_written_during_the_upload:
        # the buffer's making asks nothing; the upload asks, and so does the write through the
        # other storage, whose memory the upload touched (and from_dlpack's own is_pinned() on the
        # slice, where torch asks it)
        assert dropped >= 1 and asked >= 2


@pytest.mark.parametrize("batches", ["one", "several"])
def test_a_staging_buffers_block_allocated_again_after_its_upload_races_nothing(batches):
    """A correct loop: each step fills a new pinned staging buffer and uploads it; the pinned-memory
    allocator hands the last buffer's block out again once the upload's event completed, with no
    synchronization the tracker sees. The host's fill of the new buffer follows the old buffer's
    free, which both paths log, so neither reports it: the native log at the new storage's first
    record where the old one's record is in the same batch (`one`), or at the first record after
    the old one died where Python, having applied the batch between (`several`), watches it."""
    import time

    from racecheck.detect import TorchRaceTracker

    starts = {}
    for path in ("native", "python"):
        torch.cuda.synchronize()
        src = torch.randn(N)
        dst = torch.empty(N, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        count = torch.zeros((), device="cuda")
        starts[path] = []
        with TorchRaceTracker(path=path) as tracker:
            for _ in range(3):
                buf = torch.empty(N, pin_memory=True)
                starts[path].append(buf.data_ptr())
                buf.copy_(src)  # the host fills it
                with torch.cuda.stream(side):
                    dst.copy_(buf, non_blocking=True)
                del buf
                time.sleep(0.01)  # the upload done: its block may be handed out again
                for _ in range(PAST_A_DRAIN if batches == "several" else 0):  # the native log drains between
                    count.add_(1.0)
            torch.cuda.synchronize()
        assert tracker.errors == []
        assert tracker.reports() == [], path
    # the block was handed out again, on each path (else this tests nothing)
    assert all(len(set(s)) < len(s) for s in starts.values()), starts


def test_a_tracker_entered_again_sees_the_host_write_to_a_buffer_it_saw_uploaded():
    """A tracker entered a second time keeps its engine, which tracks the pinned buffer the first
    entry saw uploaded: the log keeps what it knew of that memory for the same tracker (op_log.cpp's
    start `owner`), so the host's write to the buffer in the second entry, unordered with the
    upload, is recorded and reported by both paths alike."""
    from racecheck.detect import TorchRaceTracker

    kinds = {}
    for path in ("native", "python"):
        torch.cuda.synchronize()
        tracker = TorchRaceTracker(path=path)
        host = torch.zeros(N, pin_memory=True)
        dst = torch.empty(N, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with tracker:
            with torch.cuda.stream(side):
                dst.copy_(host, non_blocking=True)
        with tracker:
            host.add_(1.0)  # nothing ordered it after the upload
        torch.cuda.synchronize()
        assert tracker.errors == []
        kinds[path] = sorted(str(r.kind) for r in tracker.reports())
    assert kinds["native"] and kinds["native"] == kinds["python"]


@pytest.mark.parametrize("program", [_motivating_race, *HOST_PROGRAMS])
def test_the_native_and_the_python_engine_report_the_same_on_cuda(program):
    native, python, errors = _both_engines(program)
    assert errors == []
    assert native and native == python
