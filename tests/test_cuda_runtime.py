"""What only the CUDA backend (racecheck.device.cuda) has: the real caching allocator's segment
layout, a storage finalizer run inside the runtime's lock, poison written by a kernel, and NCCL
collectives of one group issued from two streams. What it shares with the CPU emulation (launch
order, events, waits, the allocator's pools, record_stream) is pinned once for both in
test_device_contract.py.

Streams are held with torch.cuda._sleep (rt.sleep, HOLD_S in device_kit.py). The layouts these
tests rely on are those of the default allocator (2 MiB segments for requests up to 1 MiB); the
fixture empties the cache before each test and, since CUDA loads modules lazily and a kernel's
first launch synchronizes the device, launches every kernel used here once first.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from device_kit import HOLD_S, warm_kernels
from run_kit import free_port

from racecheck.device.base import ReduceOp, RuntimeObserver

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.runtime("cuda"),
]


class Recorder(RuntimeObserver):
    """Logs the name of every observer call, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


for _name in [n for n in vars(RuntimeObserver) if n.startswith("on_")]:
    setattr(Recorder, _name, lambda self, rt, *a, _n=_name, **kw: self.calls.append(_n))


def test_blocks_carved_from_a_fresh_segment_sit_at_rounded_offsets(rt):
    """The real caching allocator rounds requests up to 512 bytes (kMinBlockSize): blocks carved one
    after another from a fresh segment sit 512 and 1024 bytes apart (test_device_contract.py pins
    the reuse this implies, on both backends)."""
    with rt.stream(rt.new_stream("fresh")):
        small, odd, after = rt.empty(1), rt.empty(129), rt.empty(1)  # 4 B, 516 B, 4 B
        assert odd.data_ptr() - small.data_ptr() == 512
        assert after.data_ptr() - odd.data_ptr() == 1024


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
