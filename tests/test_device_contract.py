"""What both stream runtimes promise alike, each test run on the CPU emulation (racecheck.device.sim)
and on CUDA (racecheck.device.cuda; its cases are marked `cuda` and skip without a GPU): launch
order, events and waits, the caching allocator's per-stream pools and best fit, record_stream,
one-rank collectives, and the observer calls in program order.

Each test pins a documented CUDA/PyTorch behaviour, named in its docstring, and writes its
expectation from that behaviour, not from a backend's code. What only one backend has is in
test_sim_semantics.py and test_cuda_runtime.py; the base class alone is in test_device_base.py.
"""

from __future__ import annotations

import pytest
import torch
from device_kit import HOLD_S, LARGE, StreamHold

from racecheck.device import Point, RuntimeObserver
from racecheck.device.base import ReduceOp

# Every test on each runtime (conftest.py's `rt`, given the backend).
pytestmark = pytest.mark.parametrize(
    "rt",
    [
        pytest.param("sim", id="sim"),
        pytest.param(
            "cuda",
            id="cuda",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
        ),
    ],
    indirect=True,
)


class Recorder(RuntimeObserver):
    """Logs the name of every observer call, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


for _name in [n for n in vars(RuntimeObserver) if n.startswith("on_")]:
    setattr(Recorder, _name, lambda self, rt, *a, _n=_name, **kw: self.calls.append(_n))


@pytest.fixture
def hold(rt):
    held = StreamHold(rt)
    yield held
    held.release()  # a test that failed before its release leaves no worker waiting


def fill(value: float):
    return lambda out: out.fill_(value)


def copy(dst, src):
    dst.copy_(src)


# -- streams and events ------------------------------------------------------------------------
def test_stream_runs_work_in_launch_order(rt):
    """CUDA: operations on one stream execute in issue order, whatever each waits for."""
    side = rt.new_stream("side")
    with rt.stream(side):
        x = rt.zeros(1)
        rt.sleep(0.05)
        rt.launch("a", fill(1.0), writes=(x,))
        rt.launch("b", lambda t: t.add_(2.0), writes=(x,))
        rt.sleep(0.02)
        rt.launch("c", lambda t: t.mul_(3.0), writes=(x,))
    rt.synchronize()
    assert x.item() == 9.0  # (1 + 2) * 3: every other order gives another value


def test_launch_returns_before_side_stream_work_runs(rt, hold):
    """CUDA: kernel launches are asynchronous to the host; the host runs ahead of the stream."""
    side, ev = rt.new_stream("side"), rt.new_event()
    with rt.stream(side):
        x = rt.zeros(1)
        hold()
        rt.launch("fill", fill(1.0), writes=(x,))
        ev.record()
    assert not ev.query()  # the host is here while the stream is still held
    hold.release()
    ev.synchronize()
    assert x.item() == 1.0


def test_event_orders_consumer_after_producer(rt, hold):
    """cudaEventRecord + cudaStreamWaitEvent order the consumer after the producer; cudaEventQuery
    is false while the recorded work is pending and true after."""
    producer, consumer, ev = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
        hold()
        rt.launch("produce", fill(1.0), writes=(x,))
        ev.record()  # producer -> consumer: x
    with rt.stream(consumer):
        ev.wait()
        y = rt.empty(LARGE)
        rt.launch("consume", copy, reads=(x,), writes=(y,))
    assert not ev.query()
    hold.release()
    ev.synchronize()
    assert ev.query()
    consumer.synchronize()
    assert bool((y == 1.0).all())


def test_unrecorded_event_is_complete(rt):
    """cudaEventQuery returns cudaSuccess for an event never recorded; waiting on it is a no-op."""
    side, ev = rt.new_stream("side"), rt.new_event()
    ev.synchronize()  # returns at once
    side.wait_event(ev)
    assert ev.query()
    with rt.stream(side):
        y = rt.zeros(4)
        rt.launch("after", fill(3.0), writes=(y,))
    side.synchronize()
    assert bool((y == 3.0).all())


def test_wait_uses_the_record_current_at_wait_time(rt, hold):
    """cudaStreamWaitEvent waits for the most recent cudaEventRecord at the time of the wait call;
    a later re-record has no effect on that wait."""
    producer, consumer, ev = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
    ev.record(producer)  # first record: after the zero fill
    consumer.wait_event(ev)
    with rt.stream(producer):
        hold()
        rt.launch("late", fill(5.0), writes=(x,))
    ev.record(producer)  # second record, behind the held work
    with rt.stream(consumer):
        y = rt.empty(LARGE)
        rt.launch("consume", copy, reads=(x,), writes=(y,))
    consumer.synchronize()  # returns with the producer still held: only the first record was waited on
    assert not ev.query()
    assert bool((y == 0.0).all())
    hold.release()
    producer.synchronize()
    assert ev.query()


def test_wait_stream_orders_all_earlier_work_only(rt, hold):
    """torch.cuda.Stream.wait_stream: all work queued on the other stream so far runs before later
    work here; work queued there afterwards is not waited for."""
    producer, consumer, later = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
        rt.sleep(HOLD_S)  # without the wait the consumer would copy zeros
        rt.launch("p1", fill(1.0), writes=(x,))
        rt.launch("p2", lambda t: t.add_(1.0), writes=(x,))
    consumer.wait_stream(producer)  # producer -> consumer: p1 and p2
    with rt.stream(producer):
        hold()  # after the wait: not covered by it
        later.record()
    with rt.stream(consumer):
        y = rt.empty(LARGE)
        rt.launch("c", copy, reads=(x,), writes=(y,))
    consumer.synchronize()
    assert not later.query()  # checked first: on CUDA the comparison below syncs the device
    assert bool((y == 2.0).all())
    hold.release()
    producer.synchronize()


# -- the caching allocator ---------------------------------------------------------------------
def test_freed_block_is_reused_on_its_stream_only(rt):
    """torch.cuda caching allocator: blocks are cached per allocation stream; an allocation reuses
    only blocks of the stream current at allocation."""
    a, b = rt.new_stream("a"), rt.new_stream("b")
    with rt.stream(a):
        ptr = rt.empty(LARGE).data_ptr()  # the tensor dies at once: the block is cached for `a`
    with rt.stream(b):
        assert rt.empty(LARGE).data_ptr() != ptr
    with rt.stream(a):
        assert rt.empty(LARGE).data_ptr() == ptr


def test_allocation_stream_is_the_stream_current_at_allocation(rt):
    """torch.cuda caching allocator: a block belongs to the stream current on the host when it was
    allocated, and a view shares its tensor's block; memory from elsewhere has none."""
    side = rt.new_stream("side")
    with rt.stream(side):
        t = rt.empty(64)
    assert rt.allocation_stream(t) is side and rt.allocation_stream(t[8:]) is side
    assert rt.allocation_stream(rt.empty(4)) is rt.default_stream()
    assert rt.allocation_stream(torch.zeros(4, device=rt.device)) is None


def test_best_fit_among_cached_blocks(rt):
    """CUDA caching allocator: the smallest cached block that fits the rounded size (best fit).
    Live 512 B separators keep the freed blocks from coalescing with their neighbours."""
    with rt.stream(rt.new_stream("fresh")):  # a stream with no cached blocks: one new segment
        pairs = [(rt.empty(n // 4), rt.empty(1)) for n in (4096, 2048, 8192)]  # block, separator
        ptrs = [block.data_ptr() for block, _ in pairs]
        separators = [sep for _, sep in pairs]  # noqa: F841 - kept alive on purpose
        del pairs  # frees the three blocks
        assert rt.empty(1500 // 4).data_ptr() == ptrs[1]  # 1500 B -> 1536 B: the 2048 B block
        assert rt.empty(3000 // 4).data_ptr() == ptrs[0]  # 3000 B -> 3072 B: the 4096 B block


def test_sizes_round_up_to_512_bytes(rt):
    """CUDA caching allocator: request sizes round up to multiples of 512 bytes (kMinBlockSize), so
    the block of a 4 B request serves a later request of 500 B but not one of 600 B (1024 B). A
    live separator keeps the freed block from coalescing with the rest of its segment."""
    with rt.stream(rt.new_stream("fresh")):
        small, separator = rt.empty(1), rt.empty(1)  # noqa: F841 - the separator is kept alive on purpose
        ptr = small.data_ptr()
        del small
        assert rt.empty(150).data_ptr() != ptr  # 600 B -> 1024 B: more than the cached block holds
        assert rt.empty(125).data_ptr() == ptr  # 500 B -> 512 B: the cached block


def _read_queued_behind(rt, hold):
    """`a` (ones, default stream) and a copy of it into `out` queued on a side stream behind a hold."""
    rs = rt.new_stream("reduce_scatter")
    a = rt.empty(LARGE)
    rt.launch("fill_a", fill(1.0), writes=(a,))
    with rt.stream(rs):
        out = rt.empty(LARGE)
        rs.wait_stream(rt.default_stream())  # default -> rs: the fill of `a`
        hold()
        rt.launch("read_a", copy, reads=(a,), writes=(out,))
    return rs, a, out


def test_freed_block_goes_back_at_once_while_a_side_stream_reads_it(rt, hold):
    """The motivating race in miniature. CUDA caching allocator: a block returns to its allocation
    stream's pool when its last reference dies on the host, whatever other streams still have
    queued; the next allocation on that stream overwrites it before the queued read runs."""
    rs, a, out = _read_queued_behind(rt, hold)
    a_ptr = a.data_ptr()
    del a  # last reference: the block goes back to the default stream's pool now
    b = rt.empty(LARGE)
    assert b.data_ptr() == a_ptr
    rt.launch("overwrite", fill(7.0), writes=(b,))  # runs at once: the default stream is idle
    hold.release()
    rs.synchronize()
    assert bool((out == 7.0).all())


def test_record_stream_defers_reuse_until_the_stream_passes_the_free(rt, hold):
    """Tensor.record_stream: when the tensor is deallocated, its memory is not reused until all
    work queued on the recorded stream at the time of deallocation is complete."""
    rs, a, out = _read_queued_behind(rt, hold)
    rt.record_stream(a, rs)  # rs reads `a`: its block waits for rs at the free
    a_ptr = a.data_ptr()
    del a
    b = rt.empty(LARGE)
    assert b.data_ptr() != a_ptr
    rt.launch("overwrite", fill(7.0), writes=(b,))
    hold.release()
    rs.synchronize()
    assert bool((out == 1.0).all())
    assert rt.empty(LARGE).data_ptr() == a_ptr  # rs passed the free: the next allocation gets it


def test_queued_work_holds_no_reference_to_its_buffers(rt, hold):
    """CUDA kernels hold raw pointers, not references: a tensor whose only other user is queued
    work is freed (on_free fires) while that work is still queued."""
    side, ev = rt.new_stream("side"), rt.new_event()
    rt.add_observer(recorder := Recorder())
    a = rt.zeros(LARGE)
    with rt.stream(side):
        side.wait_stream(rt.default_stream())  # default -> side: the zero fill of `a`
        hold()
        rt.launch("read", lambda t: t.sum(), reads=(a,))
        ev.record()
    del a
    assert "on_free" in recorder.calls and not ev.query()
    hold.release()
    rt.synchronize()


# -- collectives and observers -----------------------------------------------------------------
def test_one_rank_collectives_are_copies(rt):
    """A one-rank world: all-gather and reduce-scatter copy, all-reduce leaves the data (AVG of one)."""
    group, side = rt.new_group([0]), rt.new_stream("comm")
    src = torch.arange(8.0, device=rt.device)
    gathered, scattered, reduced = rt.zeros(8), rt.zeros(8), rt.zeros(8).add_(src)
    side.wait_stream(rt.default_stream())  # default -> side: the zero fills and the add
    with rt.stream(side):
        rt.all_gather(gathered, src, group=group)
        rt.reduce_scatter(scattered, src, group=group, op=ReduceOp.AVG)
        rt.all_reduce(reduced, group=group, op=ReduceOp.AVG)
    rt.synchronize()
    for result in (gathered, scattered, reduced):
        assert torch.equal(result.cpu(), src.cpu())


def test_observers_see_the_same_calls_in_program_order(rt):
    """Both backends report every runtime event on the host at enqueue time, in program order
    (observer.RuntimeObserver): one sequence, pinned once for both."""
    side = rt.new_stream("side")
    rt.add_observer(recorder := Recorder())
    a = rt.empty(256)
    with rt.stream(side):
        rt.launch("read", lambda x: None, reads=(a,))
    ev = rt.new_event()
    ev.record(side)
    rt.default_stream().wait_event(ev)
    rt.record_stream(a, side)
    del a
    ev.synchronize()
    rt.point(Point.RESHARD)
    rt.synchronize()
    assert recorder.calls == [
        "on_alloc",
        "on_launch",
        "on_event_record",
        "on_event_wait",
        "on_record_stream",
        "on_free",
        "on_host_sync",
        "on_point",
        "on_host_sync",
        "on_host_sync",
    ]
