"""The CUDA backend (racecheck.device.cuda) shows the semantics that test_sim_semantics.py pins for the
emulation, on real streams, the real caching allocator and NCCL.

Streams are held with torch.cuda._sleep (rt.sleep); HOLD_S is far longer than any host step between
a launch and the check that follows it. Block reuse is seen by comparing the data_ptr of the next
allocation. The layouts these tests rely on are those of the default allocator (2 MiB segments for
requests up to 1 MiB, 20 MiB ones for 1-10 MiB); the fixture empties the cache before each test.
With lazy module loading (CUDA's default) the first launch of a kernel loads it and synchronizes
the device, draining any held stream; the fixture launches every kernel used here once first.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from run_kit import free_port

from racecheck.device.base import ReduceOp, RuntimeObserver

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HOLD_S = 0.2  # seconds a stream is held by a spinning kernel
LARGE = 1 << 20  # floats: a 4 MiB buffer, from the large pool


def warm_kernels(device: torch.device) -> None:
    """Launch once each kernel these tests use, so that no later first launch syncs the device."""
    for n in (1, LARGE):
        x = torch.zeros(n, device=device)
        x.fill_(1.0).add_(1.0).mul_(3.0)
        torch.empty_like(x).copy_(x)
        bool((x == 1.0).all()), x.sum()
    torch.cuda.synchronize(device)


@pytest.fixture
def rt():
    from racecheck.device.cuda import CudaRuntime

    runtime = CudaRuntime()
    warm_kernels(runtime.device)
    torch.cuda.empty_cache()  # no cached blocks left over from earlier tests or the warm-up
    yield runtime
    runtime.close()


class Recorder(RuntimeObserver):
    """Logs the name of every observer call, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


for _name in [n for n in vars(RuntimeObserver) if n.startswith("on_")]:
    setattr(Recorder, _name, lambda self, rt, *a, _n=_name, **kw: self.calls.append(_n))


def fill(value: float):
    return lambda out: out.fill_(value)


def copy(dst, src):
    dst.copy_(src)


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


def test_launch_returns_before_side_stream_work_runs(rt):
    """CUDA: kernel launches are asynchronous to the host; the host runs ahead of the stream."""
    side, ev = rt.new_stream("side"), rt.new_event()
    with rt.stream(side):
        x = rt.zeros(1)
        rt.sleep(HOLD_S)
        rt.launch("fill", fill(1.0), writes=(x,))
        ev.record()
    assert not ev.query()  # the host is here while the stream still sleeps
    ev.synchronize()
    assert x.item() == 1.0


def test_event_orders_consumer_after_producer(rt):
    """cudaEventRecord + cudaStreamWaitEvent order the consumer after the producer; cudaEventQuery
    is false while the recorded work is pending and true after."""
    producer, consumer, ev = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
        rt.sleep(HOLD_S)
        rt.launch("produce", fill(1.0), writes=(x,))
        ev.record()  # producer -> consumer: x
    with rt.stream(consumer):
        ev.wait()
        y = rt.empty(LARGE)
        rt.launch("consume", copy, reads=(x,), writes=(y,))
    assert not ev.query()
    ev.synchronize()
    assert ev.query()
    consumer.synchronize()
    assert bool((y == 1.0).all())


def test_unrecorded_event_is_complete(rt):
    """cudaEventQuery returns cudaSuccess for an event never recorded; waiting on it is a no-op."""
    side, ev = rt.new_stream("side"), rt.new_event()
    ev.synchronize()
    side.wait_event(ev)
    assert ev.query()
    with rt.stream(side):
        y = rt.zeros(4)
        rt.launch("after", fill(3.0), writes=(y,))
    side.synchronize()
    assert bool((y == 3.0).all())


def test_wait_uses_the_record_current_at_wait_time(rt):
    """cudaStreamWaitEvent waits for the most recent cudaEventRecord at the time of the wait call;
    a later re-record has no effect on that wait."""
    producer, consumer, ev = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
    ev.record(producer)  # first record: after the zero fill
    consumer.wait_event(ev)
    with rt.stream(producer):
        rt.sleep(HOLD_S)
        rt.launch("late", fill(5.0), writes=(x,))
    ev.record(producer)  # second record, behind the sleep
    with rt.stream(consumer):
        y = rt.empty(LARGE)
        rt.launch("consume", copy, reads=(x,), writes=(y,))
    consumer.synchronize()
    assert not ev.query()  # the consumer finished while the second record was still pending
    assert bool((y == 0.0).all())
    producer.synchronize()


def test_wait_stream_orders_all_earlier_work_only(rt):
    """torch.cuda.Stream.wait_stream: all work queued on the other stream so far runs before later
    work here; work queued there afterwards is not waited for."""
    producer, consumer, later = rt.new_stream("producer"), rt.new_stream("consumer"), rt.new_event()
    with rt.stream(producer):
        x = rt.zeros(LARGE)
        rt.sleep(HOLD_S)
        rt.launch("p1", fill(1.0), writes=(x,))
        rt.launch("p2", lambda t: t.add_(1.0), writes=(x,))
    consumer.wait_stream(producer)  # producer -> consumer: p1 and p2
    with rt.stream(producer):
        rt.sleep(HOLD_S)  # after the wait: not covered by it
        later.record()
    with rt.stream(consumer):
        y = rt.empty(LARGE)
        rt.launch("c", copy, reads=(x,), writes=(y,))
    consumer.synchronize()
    assert not later.query()  # checked first: the comparison below syncs the device
    assert bool((y == 2.0).all())
    producer.synchronize()


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
    """A block belongs to the stream current at allocation; a view shares its tensor's block."""
    side = rt.new_stream("side")
    with rt.stream(side):
        t = rt.empty(64)
    assert rt.allocation_stream(t) is side and rt.allocation_stream(t[8:]) is side
    assert rt.allocation_stream(rt.empty(4)) is rt.default_stream()
    assert rt.allocation_stream(torch.zeros(4, device="cuda")) is None


def test_best_fit_among_cached_blocks(rt):
    """CUDA caching allocator: the smallest cached block that fits (best fit). Live 512 B
    separators keep the freed blocks from coalescing with their neighbours."""
    with rt.stream(rt.new_stream("fresh")):  # a stream with no cached blocks: one new segment
        pairs = [(rt.empty(n // 4), rt.empty(1)) for n in (4096, 2048, 8192)]  # block, separator
        ptrs = [block.data_ptr() for block, _ in pairs]
        separators = [sep for _, sep in pairs]  # noqa: F841 - kept alive on purpose
        del pairs  # frees the three blocks
        assert rt.empty(1500 // 4).data_ptr() == ptrs[1]  # 1500 B -> 1536 B: the 2048 B block
        assert rt.empty(3000 // 4).data_ptr() == ptrs[0]  # 3000 B -> 3072 B: the 4096 B block


def test_sizes_round_up_to_512_bytes(rt):
    """CUDA caching allocator: request sizes round up to multiples of 512 bytes (kMinBlockSize);
    blocks carved one after another from a fresh segment sit 512 and 1024 bytes apart."""
    with rt.stream(rt.new_stream("fresh")):
        small, odd, after = rt.empty(1), rt.empty(129), rt.empty(1)  # 4 B, 516 B, 4 B
        assert odd.data_ptr() - small.data_ptr() == 512
        assert after.data_ptr() - odd.data_ptr() == 1024
        ptr = small.data_ptr()
        del small
        assert rt.empty(125).data_ptr() == ptr  # 500 B fits the cached 512 B block


def _read_queued_behind_sleep(rt):
    """`a` (ones, default stream) and a copy of it into `out` queued on a side stream behind a sleep."""
    rs = rt.new_stream("reduce_scatter")
    a = rt.empty(LARGE)
    rt.launch("fill_a", fill(1.0), writes=(a,))
    with rt.stream(rs):
        out = rt.empty(LARGE)
        rs.wait_stream(rt.default_stream())  # default -> rs: the fill of `a`
        rt.sleep(HOLD_S)
        rt.launch("read_a", copy, reads=(a,), writes=(out,))
    return rs, a, out


def test_freed_block_goes_back_at_once_while_a_side_stream_reads_it(rt):
    """The motivating race. CUDA caching allocator: a block returns to its allocation stream's pool
    when its last reference dies on the host; the next allocation on that stream reuses it and
    overwrites it before the side stream's queued read runs."""
    rs, a, out = _read_queued_behind_sleep(rt)
    a_ptr = a.data_ptr()
    del a  # last reference: the block goes back to the default stream's pool now
    b = rt.empty(LARGE)
    assert b.data_ptr() == a_ptr
    rt.launch("overwrite", fill(7.0), writes=(b,))  # runs at once: the default stream is idle
    rs.synchronize()
    assert bool((out == 7.0).all())


def test_record_stream_defers_reuse_until_the_stream_passes_the_free(rt):
    """Tensor.record_stream: when the tensor is deallocated, its memory is not reused until all
    work queued on the recorded stream at the time of deallocation is complete."""
    rs, a, out = _read_queued_behind_sleep(rt)
    rt.record_stream(a, rs)  # rs reads `a`: its block waits for rs at the free
    a_ptr = a.data_ptr()
    del a
    b = rt.empty(LARGE)
    assert b.data_ptr() != a_ptr
    rt.launch("overwrite", fill(7.0), writes=(b,))
    rs.synchronize()
    assert bool((out == 1.0).all())
    assert rt.empty(LARGE).data_ptr() == a_ptr  # rs passed the free: the next allocation gets it


def test_queued_work_holds_no_reference_to_its_buffers(rt):
    """CUDA kernels hold raw pointers, not references: on_free fires while the read is queued."""
    side, ev = rt.new_stream("side"), rt.new_event()
    rt.add_observer(recorder := Recorder())
    a = rt.zeros(LARGE)
    with rt.stream(side):
        side.wait_stream(rt.default_stream())  # default -> side: the zero fill of `a`
        rt.sleep(HOLD_S)
        rt.launch("read", lambda t: t.sum(), reads=(a,))
        ev.record()
    del a
    assert "on_free" in recorder.calls and not ev.query()
    rt.synchronize()


def test_a_storage_dying_inside_the_runtimes_locked_section_does_not_hang(rt):
    # A garbage-collection pass can start at any allocation, also inside the runtime's locked
    # section, and run a storage's finalizer (_storage_died) there, on the same thread.
    import threading

    victim = rt.empty(256)

    def die_while_locked():
        nonlocal victim
        with rt._lock:
            del victim  # the finalizer runs now, inside the lock

    worker = threading.Thread(target=die_while_locked, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the finalizer waited on its own thread's lock"


def test_poison_fills_a_freed_block_on_the_stream(rt):
    """Poison-on-free (base.Runtime.poison): all-ones bytes, NaN as floats, written by a kernel on
    the given stream over a block that no tensor owns; the next allocation there reads them."""
    a = rt.zeros(1024)
    ptr = a.data_ptr()
    del a
    rt.poison(ptr, 4096, stream=rt.default_stream())
    b = rt.empty(1024)
    assert b.data_ptr() == ptr and bool(b.isnan().all())


def _nccl_worker(rank: int, world: int, port: int) -> None:
    """One rank, one GPU: collectives on two side streams of one NCCL group, and a collective's
    input freed while the collective is still queued."""
    from racecheck.device.cuda import CudaRuntime

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    rt = CudaRuntime()
    warm_kernels(rt.device)
    try:
        group = rt.new_group(range(world))
        rt.all_reduce(rt.zeros(1), group=group)  # creates the communicator (a blocking host call)
        rt.synchronize()
        first, second, ev = rt.new_stream("ag"), rt.new_stream("rs"), rt.new_event()
        shard = rt.zeros(4).add_(rank + 1.0)
        full = rt.zeros(8).add_(torch.arange(8.0, device=rt.device) + 10 * rank)
        gathered, scattered = rt.zeros(8), rt.zeros(4)
        summed, averaged = rt.zeros(4).add_(rank + 1.0), rt.zeros(4).add_(rank + 1.0)
        for s in (first, second):
            s.wait_stream(rt.default_stream())  # default -> side streams: the fills above
        with rt.stream(first):
            rt.sleep(HOLD_S if rank == 0 else 0.0)  # the ranks' streams reach NCCL at other times
            rt.all_gather(gathered, shard, group=group)
            ev.record()
            rt.all_reduce(summed, group=group)
        with rt.stream(second):
            rt.sleep(HOLD_S if rank == 1 else 0.0)
            rt.reduce_scatter(scattered, full, group=group, op=ReduceOp.AVG)
            rt.all_reduce(averaged, group=group, op=ReduceOp.AVG)
        rt.add_observer(recorder := Recorder())
        del shard  # the all-gather's input: NCCL keeps no reference to it
        assert "on_free" in recorder.calls and not ev.query()  # rank 0's sleep holds both ranks
        rt.synchronize()
        assert torch.equal(gathered.cpu(), torch.tensor([1.0] * 4 + [2.0] * 4))
        assert torch.equal(scattered.cpu(), torch.arange(8.0)[4 * rank : 4 * rank + 4] + 5)
        assert torch.equal(summed.cpu(), torch.full((4,), 3.0))
        assert torch.equal(averaged.cpu(), torch.full((4,), 1.5))
    finally:
        rt.close()
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_rank_nccl_collectives_on_two_streams():
    """NCCL orders one communicator's kernels across streams, so one group per rank list serves
    collectives issued from several streams (cuda.py, [Note: one NCCL group per rank list])."""
    ctx = mp.spawn(_nccl_worker, args=(2, free_port()), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("NCCL workers did not finish")
