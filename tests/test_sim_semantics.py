"""The CPU emulation (racecheck.device.sim) keeps CUDA's stream, event and caching-allocator semantics.

Each test pins one documented CUDA/PyTorch behaviour, named in its docstring, and writes its
expectation from that behaviour, not from the emulation's code. Orderings are made with host-held
gates or sleeps; no test asserts on wall time.
"""

from __future__ import annotations

import datetime
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from run_kit import free_port

from racecheck.device.base import ReduceOp, RuntimeObserver
from racecheck.device.sim import SimRuntime, StreamError

GATE_TIMEOUT_S = 10.0  # a gate never opened fails the test instead of hanging it


@pytest.fixture
def rt():
    runtime = SimRuntime()
    yield runtime
    runtime.close()


def held(gate: threading.Event, log: list, tag: str):
    """Work that blocks its stream until the host opens `gate`, then logs `tag`."""
    return lambda: (gate.wait(GATE_TIMEOUT_S), log.append(tag))


def logs(log: list, tag: str, delay_s: float = 0.0):
    return lambda: (time.sleep(delay_s), log.append(tag))


class Recorder(RuntimeObserver):
    """Logs the name of every observer call, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


for _name in [n for n in vars(RuntimeObserver) if n.startswith("on_")]:
    setattr(Recorder, _name, lambda self, rt, *a, _n=_name, **kw: self.calls.append(_n))


def test_stream_runs_work_in_launch_order(rt):
    """CUDA: operations on one stream execute in issue order. The first task sleeps longest, so
    a runtime that ran tasks concurrently or by readiness would log them in another order."""
    side, log = rt.new_stream("side"), []
    with rt.stream(side):
        rt.launch("slow", logs(log, "a", 0.06))
        rt.launch("fast", logs(log, "b"))
        rt.launch("mid", logs(log, "c", 0.02))
    rt.synchronize()
    assert log == ["a", "b", "c"]


def test_launch_returns_before_side_stream_work_runs(rt):
    """CUDA: kernel launches are asynchronous to the host; the host runs ahead of the stream."""
    side, gate, log = rt.new_stream("side"), threading.Event(), []
    with rt.stream(side):
        rt.sleep(0.05)
        rt.launch("held", held(gate, log, "ran"))
    log.append("host")  # the side stream is still asleep, then held: the host got here first
    gate.set()
    side.synchronize()
    # The emulation's stated limit (sim.py): the default stream runs inline on the host.
    rt.launch("inline", logs(log, "inline"))
    assert log == ["host", "ran", "inline"]


def test_event_orders_consumer_after_producer(rt):
    """cudaEventRecord + cudaStreamWaitEvent: work on the consumer after the wait runs after the
    producer's work before the record; cudaEventQuery is false while that work is pending."""
    producer, consumer = rt.new_stream("producer"), rt.new_stream("consumer")
    gate, log, ev = threading.Event(), [], rt.new_event()
    with rt.stream(producer):
        rt.launch("produce", held(gate, log, "produce"))
        ev.record()  # producer -> consumer hand-off of whatever "produce" wrote
    with rt.stream(consumer):
        ev.wait()
        rt.launch("consume", logs(log, "consume"))
    assert not ev.query()
    gate.set()
    ev.synchronize()
    assert ev.query()
    consumer.synchronize()
    assert log == ["produce", "consume"]


def test_unrecorded_event_is_complete(rt):
    """cudaEventQuery returns cudaSuccess for an event never recorded, and waiting on it is a
    no-op (nothing is captured)."""
    side, ev, log = rt.new_stream("side"), rt.new_event(), []
    ev.synchronize()  # returns at once
    side.wait_event(ev)
    assert ev.query()
    with rt.stream(side):
        rt.launch("after", logs(log, "ran"))
    side.synchronize()
    assert log == ["ran"]


def test_wait_uses_the_record_current_at_wait_time(rt):
    """cudaStreamWaitEvent waits for the most recent cudaEventRecord at the time of the wait call;
    a later re-record has no effect on that wait."""
    producer, consumer = rt.new_stream("producer"), rt.new_stream("consumer")
    gate, log, ev = threading.Event(), [], rt.new_event()
    ev.record(producer)  # first record: nothing pending before it
    consumer.wait_event(ev)  # captures the first record
    with rt.stream(producer):
        rt.launch("late", held(gate, log, "late"))
    ev.record(producer)  # second record, behind the held work
    with rt.stream(consumer):
        rt.launch("consume", logs(log, "consume"))
    consumer.synchronize()  # returns with the gate still shut: only the first record was waited on
    assert log == ["consume"] and not ev.query()
    gate.set()
    producer.synchronize()
    assert ev.query()


def test_wait_stream_orders_all_earlier_work_only(rt):
    """torch.cuda.Stream.wait_stream: all work queued on the other stream so far runs before later
    work here; work queued there afterwards is not waited for."""
    producer, consumer = rt.new_stream("producer"), rt.new_stream("consumer")
    gate, log = threading.Event(), []
    with rt.stream(producer):
        rt.launch("p1", logs(log, "p1", 0.05))
        rt.launch("p2", logs(log, "p2"))
    consumer.wait_stream(producer)  # producer -> consumer: p1 and p2
    with rt.stream(producer):
        rt.launch("p3", held(gate, log, "p3"))  # after the wait: not covered by it
    with rt.stream(consumer):
        rt.launch("c", logs(log, "c"))
    consumer.synchronize()
    assert log == ["p1", "p2", "c"]
    gate.set()
    rt.synchronize()


def test_freed_block_is_reused_on_its_stream_only(rt):
    """torch.cuda caching allocator: blocks are cached per allocation stream; an allocation reuses
    only blocks of the stream current at allocation."""
    a, b = rt.new_stream("a"), rt.new_stream("b")
    with rt.stream(a):
        ptr = rt.empty(256).data_ptr()  # the tensor dies at once: the block is cached for `a`
    with rt.stream(b):
        assert rt.empty(256).data_ptr() != ptr
    with rt.stream(a):
        assert rt.empty(256).data_ptr() == ptr


def test_allocation_stream_is_the_stream_current_at_allocation(rt):
    """torch.cuda caching allocator: a block belongs to the stream current on the host when it was
    allocated, and a view shares its tensor's block; memory from elsewhere has none."""
    side = rt.new_stream("side")
    with rt.stream(side):
        t = rt.empty(64)
    assert rt.allocation_stream(t) is side and rt.allocation_stream(t[8:]) is side
    assert rt.allocation_stream(rt.empty(4)) is rt.default_stream()
    assert rt.allocation_stream(torch.zeros(4)) is None


def test_best_fit_among_cached_blocks(rt):
    """CUDA caching allocator: the smallest cached block that fits the rounded size (best fit).
    Live separators keep the freed blocks apart, as the CUDA backend's version of this test needs."""
    pairs = [(rt.empty(n // 4), rt.empty(1)) for n in (4096, 2048, 8192)]  # block, separator
    ptrs = [block.data_ptr() for block, _ in pairs]
    separators = [sep for _, sep in pairs]  # noqa: F841 - kept alive on purpose
    del pairs  # frees the three blocks
    assert rt.empty(1500 // 4).data_ptr() == ptrs[1]  # 1500 B -> 1536 B: the 2048 B block
    assert rt.empty(3000 // 4).data_ptr() == ptrs[0]  # 3000 B -> 3072 B: the 4096 B block


def test_sizes_round_up_to_512_bytes(rt):
    """CUDA caching allocator: request sizes are rounded up to multiples of 512 bytes
    (kMinBlockSize), so a freed 512 B block serves any request of at most 512 B."""
    small, odd = rt.empty(1), rt.empty(129)  # 4 B and 516 B
    assert (rt.allocator.block_of(small).size, rt.allocator.block_of(odd).size) == (512, 1024)
    ptr = small.data_ptr()
    del small
    assert rt.empty(125).data_ptr() == ptr  # 500 B fits the cached 512 B block


def _read_queued_behind(rt, gate: threading.Event):
    """`a` (ones, default stream) and a copy of it into `out` queued on a side stream behind `gate`."""
    rs = rt.new_stream("reduce_scatter")
    a = rt.empty(1024)
    a.fill_(1.0)  # default stream, inline
    with rt.stream(rs):
        out = rt.empty(1024)
        rs.wait_stream(rt.default_stream())  # default -> rs: the fill of `a`
        rt.launch("hold", lambda: gate.wait(GATE_TIMEOUT_S))
        rt.launch("read_a", lambda dst, src: dst.copy_(src), reads=(a,), writes=(out,))
    return rs, a, out


def test_freed_block_goes_back_at_once_while_a_side_stream_reads_it(rt):
    """The motivating race in miniature. CUDA caching allocator: a block returns to its allocation
    stream's pool when its last reference dies on the host, whatever other streams still have
    queued; the next allocation on that stream overwrites it before the queued read runs."""
    gate = threading.Event()
    rs, a, out = _read_queued_behind(rt, gate)
    a_ptr = a.data_ptr()
    del a  # last reference: the block goes back to the default stream's pool now
    b = rt.empty(1024)
    assert b.data_ptr() == a_ptr
    b.fill_(7.0)
    gate.set()
    rs.synchronize()
    assert torch.equal(out, torch.full((1024,), 7.0))


def test_record_stream_defers_reuse_until_the_stream_passes_the_free(rt):
    """Tensor.record_stream: when the tensor is deallocated, its memory is not reused until all
    work queued on the recorded stream at the time of deallocation is complete."""
    gate = threading.Event()
    rs, a, out = _read_queued_behind(rt, gate)
    rt.record_stream(a, rs)  # rs reads `a`: its block waits for rs at the free
    a_ptr = a.data_ptr()
    del a
    b = rt.empty(1024)
    assert b.data_ptr() != a_ptr
    b.fill_(7.0)
    gate.set()
    rs.synchronize()
    assert torch.equal(out, torch.full((1024,), 1.0))
    assert rt.empty(1024).data_ptr() == a_ptr  # rs passed the free: the block is back


def test_queued_work_holds_no_reference_to_its_buffers(rt):
    """CUDA kernels hold raw pointers, not references: a tensor whose only other user is queued
    work is freed (on_free fires, the allocator counts the free) while that work is still queued."""
    side, gate, log = rt.new_stream("side"), threading.Event(), []
    rt.add_observer(recorder := Recorder())
    a = rt.empty(256)
    frees = rt.allocator.stats.frees
    with rt.stream(side):
        rt.launch("hold", held(gate, log, "held"))
        rt.all_reduce(a, group=rt.new_group([0]))  # a queued collective reads and writes `a`
    del a
    assert rt.allocator.stats.frees == frees + 1 and "on_free" in recorder.calls
    assert log == []  # the collective has not run yet
    gate.set()
    rt.synchronize()


def _gloo_worker(rank: int, world: int, port: int) -> None:
    """One rank: collectives issued on two side streams whose worker threads reach gloo in a
    different order on each rank; correct results need one gloo group per issuing stream."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    rt = SimRuntime()
    try:
        group = rt.new_group(range(world))
        first, second = rt.new_stream("ag"), rt.new_stream("rs")
        shard, full = torch.full((4,), rank + 1.0), torch.arange(8.0) + 10 * rank
        gathered, scattered = rt.zeros(8), rt.zeros(4)
        summed, averaged = rt.zeros(4).add_(rank + 1.0), rt.zeros(4).add_(rank + 1.0)
        with rt.stream(first):
            rt.sleep(0.05 if rank == 0 else 0.0)  # rank 0 reaches gloo from `first` last
            rt.all_gather(gathered, shard, group=group)
            rt.all_reduce(summed, group=group)
        with rt.stream(second):
            rt.sleep(0.05 if rank == 1 else 0.0)  # rank 1 reaches gloo from `second` last
            rt.reduce_scatter(scattered, full, group=group, op=ReduceOp.AVG)
            rt.all_reduce(averaged, group=group, op=ReduceOp.AVG)
        rt.synchronize()
        assert torch.equal(gathered, torch.tensor([1.0] * 4 + [2.0] * 4))
        assert torch.equal(scattered, torch.arange(8.0)[4 * rank : 4 * rank + 4] + 5)
        assert torch.equal(summed, torch.full((4,), 3.0))
        assert torch.equal(averaged, torch.full((4,), 1.5))
    finally:
        rt.close()
        dist.destroy_process_group()


def test_two_rank_gloo_collectives_on_concurrent_streams():
    """gloo requires that every rank issue a group's collectives in one order; two streams issuing
    concurrently must therefore use separate groups (DESIGN: one gloo group per issuing stream)."""
    ctx = mp.spawn(_gloo_worker, args=(2, free_port()), nprocs=2, join=False)
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("gloo workers did not finish (a collective order mismatch hangs)")


def test_stream_error_surfaces_at_synchronize_and_markers_still_complete():
    """Errors in stream work surface on the host at the next synchronization, as CUDA's asynchronous
    errors do; later work is skipped, but later event records complete, so nothing waits forever."""
    rt, log = SimRuntime(), []
    side, ev = rt.new_stream("side"), rt.new_event()
    with rt.stream(side):
        rt.launch("boom", lambda: 1 / 0)
        rt.launch("after", logs(log, "after"))
        ev.record()
    ev.synchronize()  # returns: the marker completes on the failed stream
    assert ev.query() and log == []
    with pytest.raises(StreamError) as info:
        rt.synchronize()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(StreamError):
        rt.close()  # the error stays (sticky, like CUDA's); the workers still stop


def test_queued_default_stream_lets_the_host_run_ahead(rt):
    """CUDA: the host does not wait for work it enqueues on the default stream either. Inside
    `queued_default_stream()` a held launch on the default stream returns at once and runs in
    launch order; on exit the queue drains and the stream runs on the host again."""
    gate, log = threading.Event(), []
    default = rt.default_stream()
    with rt.queued_default_stream():
        assert not default.inline
        rt.launch("held", held(gate, log, "held"))
        rt.launch("after", logs(log, "after"))
        log.append("host")  # the host is past both launches while the stream is blocked
        gate.set()
    assert log == ["host", "held", "after"]
    assert default.inline
    rt.launch("inline", logs(log, "inline"))
    assert log[-1] == "inline"  # inline again: done when launch returns


def test_queued_default_stream_keeps_cross_stream_order(rt):
    """CUDA: `side.wait_stream(default)` orders side's later work after all default-stream work
    enqueued so far, also when the default stream lags behind the host."""
    gate, log = threading.Event(), []
    side = rt.new_stream("side")
    with rt.queued_default_stream():
        rt.launch("held", held(gate, log, "default"))
        side.wait_stream(rt.default_stream())
        with rt.stream(side):
            rt.launch("consumer", logs(log, "side"))
        gate.set()
        side.synchronize()
    assert log == ["default", "side"]


def test_non_blocking_copy_into_pinned_memory_is_stream_work(rt):
    """CUDA: a `non_blocking` device-to-host copy into pinned memory returns before the data is
    there; the host sees it only after waiting for the copy's stream (an event after it)."""
    gate = threading.Event()
    side = rt.new_stream("side")
    src = rt.empty(64)
    rt.launch("fill", lambda t: t.fill_(3.0), writes=(src,))
    host = rt.pinned_empty(64)
    host.zero_()
    side.wait_stream(rt.default_stream())
    with rt.stream(side):
        rt.launch("gate", lambda: gate.wait(GATE_TIMEOUT_S))
        rt.launch("d2h", lambda out, s: out.copy_(s, non_blocking=True), reads=(src,), writes=(host,))
        done = rt.new_event()
        done.record()
    assert torch.equal(host, torch.zeros(64))  # the copy is still queued
    gate.set()
    done.synchronize()
    assert torch.equal(host, torch.full((64,), 3.0))


def test_pinned_buffers_are_reported_to_observers(rt):
    """pinned_empty tells observers of the buffer and of its release (with the streams it is
    deferred to), and nothing else: it is not the device allocator's."""
    rec = Recorder()
    rt.add_observer(rec)
    side = rt.new_stream("side")
    host = rt.pinned_empty(16)
    del host
    assert rec.calls == ["on_host_alloc", "on_host_free"]
    assert side in rt.streams() and rt.streams()[0] is rt.default_stream()


def test_work_enqueued_at_a_deferred_free_runs_before_the_block_is_reused(rt):
    """A record_stream'd block goes back to its pool only after the recorded stream passed the
    free; work an observer enqueues on that stream while it hears of the free (the perturbation's
    poison) is part of what the stream must pass, so it can never land in the block's next owner."""
    started, gate = threading.Event(), threading.Event()
    side = rt.new_stream("side")

    class Probe(RuntimeObserver):
        def on_free(self, rt, *, block, stream, ptr, nbytes, deferred_to):
            if deferred_to:
                with rt.stream(deferred_to[0]):
                    rt.launch("probe", lambda: (started.set(), gate.wait(GATE_TIMEOUT_S)))

    a = rt.empty(256)
    ptr = a.data_ptr()
    side.wait_stream(rt.default_stream())
    with rt.stream(side):
        rt.launch("read", lambda t: t.sum(), reads=(a,))
    rt.record_stream(a, side)
    rt.add_observer(Probe())
    del a  # deferred to side: the probe is enqueued there now
    assert started.wait(GATE_TIMEOUT_S)  # side has passed the read and runs the probe
    b = rt.empty(256)
    assert b.data_ptr() != ptr  # the block is still held: the probe precedes its release
    gate.set()
    side.synchronize()
    c = rt.empty(256)
    assert c.data_ptr() == ptr  # released once side passed the probe
