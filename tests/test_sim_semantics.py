"""What only the CPU emulation (racecheck.device.sim) has: its default stream on the host and the
queue that lets the host run ahead of it, its allocator's block sizes, gloo collectives issued from
concurrent streams, sticky stream errors, pinned host buffers and frees deferred by record_stream.
What it shares with the CUDA backend (launch order, events, waits, the caching allocator's pools,
record_stream) is pinned once for both in test_device_contract.py.

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
from device_kit import GATE_TIMEOUT_S
from run_kit import free_port

from racecheck.device.base import ReduceOp, RuntimeObserver
from racecheck.device.sim import SimRuntime, StreamError


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


def test_the_default_stream_runs_inline_on_the_host(rt):
    """The emulation's stated limit (sim.py): work on the default stream runs on the host thread,
    done when its launch returns, while a side stream's work runs on a worker of its own."""
    side, gate, log = rt.new_stream("side"), threading.Event(), []
    with rt.stream(side):
        rt.launch("held", held(gate, log, "side"))
    rt.launch("inline", logs(log, "inline"))
    assert log == ["inline"]  # done at once, ahead of the side stream's held work
    gate.set()
    side.synchronize()
    assert log == ["inline", "side"]


def test_block_sizes_are_the_requests_rounded_up_to_512_bytes(rt):
    """The emulated allocator's blocks have CUDA's rounded sizes (kMinBlockSize, 512 B): 4 B take
    a 512 B block and 516 B a 1024 B one (test_device_contract.py pins the reuse this implies)."""
    small, odd = rt.empty(1), rt.empty(129)  # 4 B and 516 B
    assert (rt.allocator.block_of(small).size, rt.allocator.block_of(odd).size) == (512, 1024)


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
