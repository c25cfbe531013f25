"""The happens-before detector on the CPU emulation: true positives for the race classes it exists
for, and no report on the correct patterns that order the same accesses; on each of its engines
(engine.py and the C++ one, racecheck.detect.native_hb).

Every test drives SimRuntime directly in program order; the verdicts come from the clocks, not from
timing, so no test sleeps or asserts on time.
"""

from __future__ import annotations

import pytest

from racecheck.detect import RaceDetector, RaceKind

N = 1024  # floats: 4 KiB buffers, so every reuse below is an exact fit


@pytest.fixture
def side(rt):
    return rt.new_stream("side")


@pytest.fixture(params=["python", "native"])
def det(rt, request):
    """The detector on each engine: engine.py, and the C++ engine (native_hb.py)."""
    detector = RaceDetector(engine=request.param)
    assert detector.engine_kind == request.param  # a test machine has a compiler
    detector.attach(rt)
    yield detector
    detector.detach()


def copy(out, src):
    out.copy_(src)


def kinds(det) -> list[RaceKind]:
    return [r.kind for r in det.reports()]


def consume_on(rt, stream, buf):
    """Enqueue a read of `buf` on `stream` into a buffer allocated there; returns that buffer."""
    with rt.stream(stream):
        out = rt.empty(buf.numel())
        rt.launch("consume", copy, reads=(buf,), writes=(out,))
    return out


# -- true positives ------------------------------------------------------------------------------
def test_free_while_in_use_reuse_is_reported(rt, side, det):
    """The motivating pattern: allocated on default, read by side, freed, reused by default."""
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())  # producer default (zeros), consumer side
    keep = consume_on(rt, side, a)
    del a  # the block goes back to the default pool while `consume` may be queued
    b = rt.zeros(N)  # reuses the block on default, not ordered after side's read
    assert kinds(det) == [RaceKind.REUSE]
    report = det.reports()[0]
    assert report.streams() == ("side", "default")
    text = report.text()
    for part in (
        "free-while-in-use",
        "'side'",
        "'default'",
        "allocation of the buffer",
        "racing access",
        "free of the buffer",
        "reusing allocation",
        "record_stream",
        "fix options",
    ):
        assert part in text, part
    assert "del a" in text and "b = rt.zeros(N)" in text  # the stacks point at the user's lines
    del keep, b


def test_unsynchronized_read_after_write_across_streams(rt, side, det):
    """side reads what another side stream wrote, with no event between them."""
    other = rt.new_stream("other")
    with rt.stream(other):
        a = rt.zeros(N)
    out = consume_on(rt, side, a)
    assert kinds(det) == [RaceKind.READ_AFTER_WRITE]
    assert det.reports()[0].streams() == ("other", "side")
    del out


def test_missing_wait_on_default_stream_output(rt, side, det):
    """The class the inline default stream hides from timing: a side stream reads default-stream
    output without waiting. It must be reported even though the emulation already ran the write."""
    a = rt.zeros(N)  # written on default, inline, before the host goes on
    out = consume_on(rt, side, a)  # no side.wait_stream(default)
    assert kinds(det) == [RaceKind.READ_AFTER_WRITE]
    assert "inline" in det.reports()[0].text()
    del out


def test_write_after_read_across_streams(rt, side, det):
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    out = consume_on(rt, side, a)
    rt.launch("overwrite", lambda t: t.fill_(1.0), writes=(a,))  # default, not ordered after side's read
    assert kinds(det) == [RaceKind.WRITE_AFTER_READ]
    del out


def test_views_at_offsets_are_compared_by_bytes(rt, side, det):
    """Two halves of one buffer are independent; a view overlapping the written half is not."""
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    with rt.stream(side):
        rt.launch("fill_low", lambda t: t.fill_(1.0), writes=(a[: N // 2],))
    rt.launch("fill_high", lambda t: t.fill_(2.0), writes=(a[N // 2 :],))  # disjoint bytes: fine
    assert det.reports() == []
    rt.launch("read_mid", lambda t: t.sum(), reads=(a[N // 4 : 3 * N // 4],))  # overlaps side's half
    assert kinds(det) == [RaceKind.READ_AFTER_WRITE]


def test_repeated_race_is_one_report_with_a_count(rt, side, det):
    for _ in range(3):
        a = rt.zeros(N)
        side.wait_stream(rt.default_stream())
        keep = consume_on(rt, side, a)
        del a
        b = rt.zeros(N)
        del b, keep
    (report,) = det.reports()
    assert report.count >= 3 and "seen" in report.text()


# -- no false positives --------------------------------------------------------------------------
def test_record_stream_defers_reuse(rt, side, det):
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    keep = consume_on(rt, side, a)
    rt.record_stream(a, side)
    del a
    side.synchronize()  # lets the allocator hand the block out again (its event completed)
    b = rt.zeros(N)
    assert rt.allocator.stats.reuses >= 1  # the check ran on a real reuse
    assert det.reports() == []
    del keep, b


def test_record_stream_without_host_sync_is_not_reported(rt, side, det):
    """Whenever the allocator reuses a record_stream'd block, its event has completed; the reuse is
    ordered after the stream's work at the free even if no stream or host waited for it."""
    blocks = []
    for _ in range(4):
        a = rt.zeros(N)
        side.wait_stream(rt.default_stream())
        blocks.append(consume_on(rt, side, a))
        rt.record_stream(a, side)
        del a
    assert det.reports() == []


def test_hold_until_wait(rt, side, det):
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    keep = consume_on(rt, side, a)
    done = rt.new_event()
    done.record(side)  # marks side's last use of a
    rt.default_stream().wait_event(done)  # producer side, consumer: the reuse on default
    del a
    b = rt.zeros(N)
    assert det.reports() == []
    del keep, b


def test_wait_stream_orders_reuse(rt, side, det):
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    keep = consume_on(rt, side, a)
    rt.default_stream().wait_stream(side)
    del a
    b = rt.zeros(N)
    assert det.reports() == []
    del keep, b


def test_event_ordered_reuse_on_the_consuming_stream(rt, side, det):
    """The `fixed` arm: allocated, used and released on one stream; reuse there is ordered."""
    with rt.stream(side):
        a = rt.zeros(N)
        keep = rt.empty(N)
        rt.launch("consume", copy, reads=(a,), writes=(keep,))
        del a
        b = rt.zeros(N)
    ev = rt.new_event()
    ev.record(side)
    rt.default_stream().wait_event(ev)
    rt.launch("read_on_default", lambda t: t.sum(), reads=(keep,))
    assert det.reports() == []
    del keep, b


def test_same_stream_reuse(rt, det):
    a = rt.zeros(N)
    rt.launch("use", lambda t: t.add_(1.0), writes=(a,))
    del a
    b = rt.zeros(N)
    assert rt.allocator.stats.reuses >= 1
    assert det.reports() == []
    del b


def test_host_synchronize_orders_everything(rt, side, det):
    a = rt.zeros(N)
    side.wait_stream(rt.default_stream())
    keep = consume_on(rt, side, a)
    rt.synchronize()  # the host knows side's read is done; later work is enqueued after it
    del a
    b = rt.zeros(N)
    with rt.stream(side):
        rt.launch("reuse_on_side", lambda t: t.fill_(3.0), writes=(keep,))
    assert det.reports() == []
    del keep, b


def test_event_synchronize_orders_reads_for_other_streams(rt, side, det):
    other = rt.new_stream("other")
    with rt.stream(other):
        a = rt.zeros(N)
        ev = rt.new_event()
        ev.record()
    ev.synchronize()  # host waits: later launches anywhere are ordered after the write
    out = consume_on(rt, side, a)
    assert det.reports() == []
    del out


def test_reuse_then_use_on_another_stream_needs_ordering(rt, side, det):
    """After a correct same-stream reuse, a third stream that writes the new buffer must still be
    ordered after the old accesses (kept past the reuse, [Note: reuse])."""
    other = rt.new_stream("other")
    with rt.stream(other):
        a = rt.zeros(N)
        rt.launch("use", lambda t: t.add_(1.0), writes=(a,))
        del a
        b = rt.empty(N)  # same stream: fine
    with rt.stream(side):
        rt.launch("write_new", lambda t: t.fill_(0.0), writes=(b,))  # side never waited for other
    assert kinds(det) == [RaceKind.WRITE_AFTER_WRITE]
    assert det.reports()[0].reused


def test_host_ops_on_runtime_buffers_are_charged_to_the_current_stream(rt, side, det):
    """Plain torch on the host (autograd, optimizers) is work on the current stream."""
    with rt.stream(side):
        a = rt.zeros(N)
    a.add_(1.0)  # host op, default stream, not ordered after side's zero fill
    assert kinds(det) == [RaceKind.WRITE_AFTER_WRITE]


def test_detached_detector_sees_nothing(rt, side):
    detector = RaceDetector()
    with detector.attached(rt):
        pass
    a = rt.zeros(N)
    out = consume_on(rt, side, a)
    a.add_(1.0)
    assert detector.reports() == [] and detector not in rt.observers
    del out


# -- pinned host buffers -------------------------------------------------------------------------
def offload_to_pinned(rt, side):
    """A default-stream buffer copied into a pinned host buffer on `side` (non-blocking), with
    the event recorded after the copy."""
    a = rt.zeros(N)
    host = rt.pinned_empty(N)
    side.wait_stream(rt.default_stream())  # producer default (zeros), consumer side
    with rt.stream(side):
        rt.launch("d2h", copy, writes=(host,), reads=(a,))
        rt.record_stream(a, side)
        done = rt.new_event()
        done.record()
    return host, done


def test_host_read_of_pinned_buffer_before_its_copy_is_reported(rt, side, det):
    """The early hook: the host reads the pinned destination of a queued non-blocking copy."""
    host, done = offload_to_pinned(rt, side)
    host.sum()  # no wait on the copy's stream
    assert kinds(det) == [RaceKind.READ_AFTER_WRITE]
    assert det.reports()[0].streams() == ("side", "host")
    done.synchronize()


def test_host_read_of_pinned_buffer_after_event_synchronize(rt, side, det):
    host, done = offload_to_pinned(rt, side)
    done.synchronize()  # the host learns the copy complete
    host.sum()
    host.add_(1.0)  # a host write, done at once: later copies on any stream follow it
    with rt.stream(side):
        back = rt.empty(N)
        rt.launch("h2d", copy, writes=(back,), reads=(host,))
    del host, back
    rt.synchronize()
    assert det.reports() == []
