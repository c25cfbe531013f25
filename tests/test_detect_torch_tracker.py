"""The tracker for plain PyTorch code, driven on the CPU: its dispatch mode sees real operators on
CPU tensors, and the CUDA trace callbacks (allocation, free, event record and wait, syncs) are
called by hand in the order the caching allocator and CUDA would call them. The streams are plain
integers standing for cudaStream_t handles. The same code runs on a GPU in
bench/sanitizer_compare.py.
"""

from __future__ import annotations

import pytest
import torch
from tracker_kit import (  # noqa: F401 (fixtures)
    DEFAULT,
    NCCL,
    RS,
    N,
    alloc,
    cur,
    free,
    make_tracker,
    motivating,
    path,
    record,
    record_stream,
    tracker,
    training_loop,
    wait,
)

from racecheck.detect import RaceKind
from racecheck.detect.dispatch import plan_for
from racecheck.detect.inflight import InFlight


def test_reuse_after_free_is_reported(tracker, cur):
    motivating(tracker, cur, fix=None)
    (report,) = tracker.reports()
    assert report.kind is RaceKind.REUSE
    assert report.streams() == ("reduce_scatter", "default")
    assert "aten.copy_" in report.text()


@pytest.mark.parametrize("fix", ["record_stream", "hold_until_wait"])
def test_fixed_versions_are_not_reported(tracker, cur, fix):
    motivating(tracker, cur, fix=fix)
    assert tracker.reports() == []


def test_a_block_handed_out_again_retires_the_record_that_missed_its_free(cur, path):
    """A block whose free never reached the tracker (here: memory from before it started, dropped
    unseen) and that the allocator hands out again is a new allocation, checked as a reuse; the
    stale record must not take the new block's accesses."""
    a = torch.zeros(N)  # from before the tracker: adopted at its first access
    tracker = make_tracker(cur, path)
    tracker.name_stream(DEFAULT, "default")
    tracker.name_stream(RS, "reduce_scatter")
    with tracker:
        cur.current = RS
        a.add_(1.0)
        cur.current = DEFAULT
        alloc(tracker, cur, DEFAULT, block=a)  # no free callback came; the block is handed out again
    (report,) = tracker.reports()
    assert report.kind is RaceKind.REUSE and report.streams() == ("reduce_scatter", "default")
    assert tracker.engine.stats["unseen_frees"] == 1 and tracker.errors == []


def test_stream_synchronize_then_reuse_is_not_reported(tracker, cur):
    grad = alloc(tracker, cur, DEFAULT)
    a = alloc(tracker, cur, DEFAULT)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    a.add_(grad)
    cur.current = DEFAULT
    tracker.handler._handle_stream_synchronization(RS)
    free(tracker, a)
    alloc(tracker, cur, DEFAULT, block=a)
    assert tracker.reports() == []


def test_unsynchronized_read_is_reported(tracker, cur):
    a = alloc(tracker, cur, DEFAULT)
    a.fill_(1.0)
    cur.current = RS
    a.sum()  # no wait on default
    (report,) = tracker.reports()
    assert report.kind is RaceKind.READ_AFTER_WRITE


# These two put a collective in flight by hand (the tracker's `_inflight`), which only the Python
# engine's bookkeeping reads; the native engine's collectives are compared with it record by record
# in tests/test_detect_engines.py.
@pytest.mark.parametrize("path", ["python", "native-pyengine"])
def test_collective_is_charged_to_the_stream_that_waited_during_it(tracker, cur):
    """PyTorch < 2.8 (or async_op=True): ProcessGroupNCCL records an event on the current stream,
    makes its own stream wait for it, launches there and records its end event there."""
    grad = alloc(tracker, cur, DEFAULT)
    flight = InFlight(plan_for(torch.ops.aten.add_.Tensor), (grad, grad), {}, DEFAULT)
    tracker._inflight = flight
    record(tracker, 7, DEFAULT)
    wait(tracker, 7, NCCL)
    record(tracker, 8, NCCL)  # the end event: the accesses are charged before it
    tracker._inflight = None
    assert flight.charged and flight.stream == NCCL
    free(tracker, grad)
    alloc(tracker, cur, DEFAULT, block=grad)  # nobody waited for the end event
    (report,) = tracker.reports()
    assert report.kind is RaceKind.REUSE and report.earlier.domain.key == NCCL


@pytest.mark.parametrize("path", ["python", "native-pyengine"])
def test_collective_end_event_waited_orders_the_reuse(tracker, cur):
    grad = alloc(tracker, cur, DEFAULT)
    flight = InFlight(plan_for(torch.ops.aten.add_.Tensor), (grad, grad), {}, DEFAULT)
    tracker._inflight = flight
    record(tracker, 7, DEFAULT)
    wait(tracker, 7, NCCL)
    record(tracker, 8, NCCL)
    tracker._inflight = None
    wait(tracker, 8, DEFAULT)  # work.wait()
    free(tracker, grad)
    alloc(tracker, cur, DEFAULT, block=grad)
    assert tracker.reports() == []


def test_tensors_from_before_the_tracker_are_adopted(cur, path):
    before = torch.ones(N)
    with make_tracker(cur, path) as t:
        before.add_(1.0)
        cur.current = RS
        before.sum()
    assert t.stats["adopted"] >= 1  # `before` (and, on the CPU, the scalar sum() returns)
    assert [r.kind for r in t.reports()] == [RaceKind.READ_AFTER_WRITE]


def test_c10d_plans_follow_argument_names():
    rs = plan_for(torch.ops.c10d._reduce_scatter_base_.default)
    assert [(name, w) for _, name, w, _ in rs.args] == [("output_tensor", True), ("input_tensor", False)]
    ar = plan_for(torch.ops.c10d.allreduce_.default)
    assert ("tensors", True) in [(name, w) for _, name, w, _ in ar.args]
    assert plan_for(torch.ops.aten.view.default).kind.value == "skip"


@pytest.mark.parametrize("side_read", [None, "wait"])
def test_training_loop_with_allocator_callbacks_has_no_reports(cur, side_read, path):
    t = make_tracker(cur, path)
    training_loop(t, cur, steps=4, side_read=side_read)
    assert t.errors == []
    assert t.reports() == []
    assert t.ops > 50 and t.engine.accesses > 200
    assert t.engine.stats["unknown_frees"] == 0  # every free matched an allocation it resolved


def test_training_loop_unordered_side_read_is_reported(cur, path):
    t = make_tracker(cur, path)
    t.name_stream(RS, "reduce_scatter")
    training_loop(t, cur, steps=4, side_read="none")
    assert t.errors == []
    (report,) = t.reports()
    assert report.kind is RaceKind.READ_AFTER_WRITE
    assert (report.earlier.domain.name, report.later.domain.name) == ("default", "reduce_scatter")


# -- the engine's public views ---------------------------------------------------------------------
def test_engine_views_follow_domains_and_live_allocations():
    """HappensBefore.domains / .live: the tracker's lookups, kept current by the engine itself
    (on the compiled engine too, racecheck.detect.ENGINE)."""
    from racecheck.detect import engine as engine_mod

    engine = engine_mod.HappensBefore()
    assert "s1" not in engine.domains and 4096 not in engine.live
    d = engine.domain("s1", "side")
    engine.allocate("s1", 4096, 512)
    assert engine.domains["s1"] is d and engine.live[4096].nbytes == 512 and engine.live[4096].stream is d
    engine.free(4096)
    assert 4096 not in engine.live and "s1" in engine.domains


def test_the_tracker_reaches_no_private_name_of_the_engine():
    import ast
    import inspect

    import racecheck.detect.torch_tracker as tt

    private = [
        f"line {n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(ast.parse(inspect.getsource(tt)))
        if isinstance(n, ast.Attribute)
        and n.attr.startswith("_")
        and not n.attr.startswith("__")
        and "engine" in ast.unparse(n.value)
    ]
    assert private == []
