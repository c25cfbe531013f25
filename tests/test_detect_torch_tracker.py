"""The tracker for plain PyTorch code, driven on the CPU: its dispatch mode sees real operators on
CPU tensors, and the CUDA trace callbacks (allocation, free, event record and wait, syncs) are
called by hand in the order the caching allocator and CUDA would call them. The streams are plain
integers standing for cudaStream_t handles. The same code runs on a GPU in
bench/sanitizer_compare.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_kit import free_port, racecheck

from racecheck.detect import RaceKind, feed_apply
from racecheck.detect.cpu_trace import AllocatorTrace
from racecheck.detect.dispatch import plan_for
from racecheck.detect.inflight import InFlight
from racecheck.detect.torch_tracker import TorchRaceTracker

DEFAULT, RS, NCCL = 0, 0x100, 0x200
N = 1024


class Streams:
    """The current stream of the (pretend) CUDA thread. On the native path the tracker applies
    its log before each switch (`on_switch`), as patch mode's recording twin does."""

    def __init__(self) -> None:
        self._current = DEFAULT
        self.on_switch = lambda: None

    @property
    def current(self) -> int:
        return self._current

    @current.setter
    def current(self, stream: int) -> None:
        self.on_switch()
        self._current = stream

    def __call__(self) -> int:
        return self._current


@pytest.fixture
def cur():
    return Streams()


# A tracker's three ways: the TorchDispatchMode with the Python engine, and the native operator log
# applied by the native engine or by the Python one (the reference).
PATHS = {"python": ("python", None), "native": ("native", "native"), "native-pyengine": ("native", "python")}


@pytest.fixture(params=list(PATHS))
def path(request):
    """Every tracker test on every path."""
    return request.param


def make_tracker(cur: Streams, path: str) -> TorchRaceTracker:
    kind, engine = PATHS[path]
    t = TorchRaceTracker(device_type="cpu", current_stream=cur, stream_handle=lambda s: s, path=kind, engine=engine)
    assert t.path == kind  # native: the log was built here (a test machine has a compiler)
    assert t._feed is None or t._feed.engine_kind == engine
    cur.on_switch = t.flush
    return t


@pytest.fixture
def tracker(cur, path):
    t = make_tracker(cur, path)
    t.name_stream(DEFAULT, "default")
    t.name_stream(RS, "reduce_scatter")
    with t:
        yield t
    assert t.errors == []


def alloc(tracker, cur, stream, numel=N, *, block: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor as the caching allocator would hand it out on `stream`: the trace callback fires
    (with the stream current), then the factory op runs. `block` reuses another tensor's memory."""
    saved, cur.current = cur.current, stream
    try:
        t = torch.empty(numel) if block is None else block.view(-1)[:numel]
        tracker.handler._handle_memory_allocation(t.untyped_storage().data_ptr())
        t.zero_()
        return t
    finally:
        cur.current = saved


def free(tracker, t: torch.Tensor) -> None:
    tracker.handler._handle_memory_deallocation(t.untyped_storage().data_ptr())


def record(tracker, event: int, stream: int) -> None:
    tracker.handler._handle_event_record(event, stream)


def wait(tracker, event: int, stream: int) -> None:
    tracker.handler._handle_event_wait(event, stream)


def record_stream(tracker, t: torch.Tensor, stream: int) -> None:
    """`t.record_stream(stream)` as the tracker sees it: what the dispatch mode does for
    aten.record_stream, or the native log's record of it."""
    if tracker._feed is None:
        tracker._record_stream((t, stream))
    else:
        tracker._feed.note(feed_apply.STREAM_RECORDED, -1, stream, t.untyped_storage().data_ptr())


def motivating(tracker, cur, *, fix: str | None):
    """main_grad A on default, accumulated and read by the reduce-scatter stream, then dropped;
    the next default-stream allocation gets A's block."""
    grad = alloc(tracker, cur, DEFAULT).normal_()
    a = alloc(tracker, cur, DEFAULT)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)  # rs.wait_stream(default)
    cur.current = RS
    a.add_(grad)
    b = alloc(tracker, cur, RS)
    b.copy_(a)  # the reduce-scatter reads A
    if fix == "record_stream":
        record_stream(tracker, a, RS)
    cur.current = DEFAULT
    if fix == "hold_until_wait":
        record(tracker, 2, RS)
        wait(tracker, 2, DEFAULT)
    free(tracker, a)
    alloc(tracker, cur, DEFAULT, block=a)  # the caching allocator hands A's block out again
    return b


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


def _training_loop(tracker, cur, *, steps: int, side_read: str | None) -> None:
    """An MLP trained for `steps` steps with the allocator's callbacks from AllocatorTrace: every
    activation, gradient and optimizer buffer is allocated, used, freed and its block reused, as on
    CUDA. `side_read`: after the loop, the reduce-scatter stream reads the last layer's gradient,
    unordered ("none") or after waiting for the default stream ("wait")."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    x, y = torch.randn(8, 32), torch.randn(8, 32)
    handler = tracker.handler
    with AllocatorTrace(handler._handle_memory_allocation, handler._handle_memory_deallocation) as trace, tracker:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if side_read is not None:
            if side_read == "wait":
                record(tracker, 1, DEFAULT)
                wait(tracker, 1, RS)
            cur.current = RS
            model[2].weight.grad.sum()
            cur.current = DEFAULT
    assert trace.live, "the stand-in saw no allocation"


@pytest.mark.parametrize("side_read", [None, "wait"])
def test_training_loop_with_allocator_callbacks_has_no_reports(cur, side_read, path):
    t = make_tracker(cur, path)
    _training_loop(t, cur, steps=4, side_read=side_read)
    assert t.errors == []
    assert t.reports() == []
    assert t.ops > 50 and t.engine.accesses > 200
    assert t.engine.stats["unknown_frees"] == 0  # every free matched an allocation it resolved


def test_training_loop_unordered_side_read_is_reported(cur, path):
    t = make_tracker(cur, path)
    t.name_stream(RS, "reduce_scatter")
    _training_loop(t, cur, steps=4, side_read="none")
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


# -- host accesses ([Note: host accesses] in torch_tracker.py) -----------------------------------
# On the CPU every tensor is host memory; `host_memory` marks which ones stand for pinned host
# buffers, the rest for device memory. `.copy_(..., non_blocking=True)` between the two is the
# stream's work, an operation on a pinned tensor alone is the host's.


@pytest.fixture
def host_tracker(cur):
    pinned: set[int] = set()
    t = TorchRaceTracker(
        device_type="cpu",
        current_stream=cur,
        stream_handle=lambda s: s,
        host_memory=lambda x: x.untyped_storage().data_ptr() in pinned,
    )
    t.name_stream(DEFAULT, "default")
    t.name_stream(RS, "side")
    with t:
        yield t, pinned
    assert t.errors == []


def pinned_buffer(pinned: set[int], numel: int = N) -> torch.Tensor:
    h = torch.empty(numel)  # no data touched: marked as host memory before its first write
    pinned.add(h.untyped_storage().data_ptr())
    return h.zero_()


def device_to_host(tracker, cur, pinned, *, wait_for: str | None):
    """A side stream copies a device tensor into a pinned buffer (non-blocking) and records an
    event; the host reads the buffer, after `wait_for` ("event", "stream", "device") or not."""
    src = alloc(tracker, cur, DEFAULT).fill_(2.0)
    host = pinned_buffer(pinned)  # the host's: written before any stream touched it
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    host.copy_(src, non_blocking=True)  # queued on the side stream
    record(tracker, 2, RS)
    cur.current = DEFAULT
    if wait_for == "event":
        tracker.handler._handle_event_synchronization(2)
    elif wait_for == "stream":
        tracker.handler._handle_stream_synchronization(RS)
    elif wait_for == "device":
        tracker.handler._handle_device_synchronization()
    return float(host.sum())  # the host reads it


def test_a_host_read_before_the_copy_into_pinned_memory_is_known_complete_is_a_race(host_tracker, cur):
    tracker, pinned = host_tracker
    device_to_host(tracker, cur, pinned, wait_for=None)
    reports = tracker.reports()
    assert [r.kind for r in reports] == [RaceKind.READ_AFTER_WRITE]
    text = reports[0].text()
    assert "host" in text and "side" in text and "test_detect_torch_tracker.py" in text  # both sides located


@pytest.mark.parametrize("wait_for", ["event", "stream", "device"])
def test_a_host_read_after_a_host_synchronization_is_not(host_tracker, cur, wait_for):
    tracker, pinned = host_tracker
    device_to_host(tracker, cur, pinned, wait_for=wait_for)
    assert tracker.reports() == []


def test_a_host_refill_while_a_copy_from_the_buffer_is_queued_is_a_race(host_tracker, cur):
    tracker, pinned = host_tracker
    host = pinned_buffer(pinned).fill_(1.0)
    dst = alloc(tracker, cur, DEFAULT)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    dst.copy_(host, non_blocking=True)  # host to device, queued on the side stream
    cur.current = DEFAULT
    host.fill_(5.0)  # the host refills the buffer: the queued copy may read either
    assert [r.kind for r in tracker.reports()] == [RaceKind.WRITE_AFTER_READ]


def test_blocking_copies_and_item_synchronize_the_host(host_tracker, cur):
    tracker, pinned = host_tracker
    src, out = alloc(tracker, cur, RS), alloc(tracker, cur, RS)
    host = pinned_buffer(pinned)
    cur.current = RS
    src.fill_(3.0)
    host.copy_(src)  # blocking: returns once the side stream did it
    cur.current = DEFAULT
    assert float(host.sum()) == 3.0 * N
    cur.current = RS
    out.fill_(4.0)
    value = out[0].item()  # the host waits for the side stream
    cur.current = DEFAULT
    host.fill_(value)
    assert tracker.reports() == []


# -- the two recording paths ------------------------------------------------------------------------
def _reports_of(path: str, scenario) -> str:
    cur = Streams()
    t = make_tracker(cur, path)
    t.name_stream(DEFAULT, "default")
    t.name_stream(RS, "reduce_scatter")
    scenario(t, cur)
    assert t.errors == []
    return t.render()


@pytest.mark.parametrize(
    "scenario",
    [
        lambda t, cur: (t.__enter__(), motivating(t, cur, fix=None), t.__exit__(None, None, None)),
        lambda t, cur: _training_loop(t, cur, steps=2, side_read="none"),
    ],
    ids=["motivating", "training-loop-side-read"],
)
def test_both_paths_give_the_same_reports(scenario):
    """The native log and the dispatch mode feed the engines the same accesses, and the native
    engine applies them as the Python one does: the reports are the same text, stacks included."""
    python, native, native_pyengine = (_reports_of(path, scenario) for path in PATHS)  # one call site
    assert "race" in python.lower()
    assert native == python and native_pyengine == python


def test_without_a_compiler_the_tracker_takes_the_python_path(tmp_path):
    """Where op_log.cpp cannot be built, a CUDA tracker runs the Python path (and says why in one
    line); asking for the native path fails with that line."""
    code = (
        "from racecheck.detect import op_log\n"
        "from racecheck.detect.torch_tracker import TorchRaceTracker\n"
        "t = TorchRaceTracker(device_type='cuda')\n"
        "print(t.path)\n"
        "print(len(op_log.why_not().splitlines()), op_log.why_not()[:60])\n"
        "try:\n"
        "    TorchRaceTracker(device_type='cpu', current_stream=lambda: 0, path='native')\n"
        "except op_log.NativeUnavailable as exc:\n"
        "    print('refused', len(str(exc).splitlines()))\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), "RACECHECK_NATIVE_CACHE": str(tmp_path / "cache")}
    env.pop("RACECHECK_DETECT_PATH", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "python"
    assert lines[1].startswith("1 building op_log.cpp failed")
    assert lines[2] == "refused 1"


def test_build_native_compiles_ahead_of_time_or_says_in_one_line_why_not(tmp_path, monkeypatch):
    """`racecheck build-native` prints where the log is (the file the tracker then loads), and
    exits 3 with one line where no compiler can build it."""
    from racecheck.detect import op_log

    res = racecheck("build-native", cwd=tmp_path)
    assert res.code == 0 and Path(res.out.strip()) == op_log.build(), res
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    monkeypatch.setenv("RACECHECK_NATIVE_CACHE", str(tmp_path / "cache"))
    res = racecheck("build-native", cwd=tmp_path)
    assert res.code == 3 and res.err.count("\n") == 1 and "Traceback" not in res.err, res
    assert res.err.startswith("racecheck: infrastructure error: building op_log.cpp failed"), res
    assert res.err.rstrip().endswith("the tracker runs its Python path here"), res


def test_the_native_path_leaves_callees_unobserved_only_while_it_records(cur):
    """While the native log records, a recorded operator's callees run without RecordFunction (the
    profiler beside it sees mse_loss but not the mean inside it); once the tracker stops, the
    thread observes them again."""
    from torch.profiler import ProfilerActivity, profile

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as during:
        with make_tracker(cur, "native"):
            torch.nn.functional.mse_loss(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as after:
        torch.nn.functional.mse_loss(x, y)
    seen_during = [e.name for e in during.events()]
    seen_after = [e.name for e in after.events()]
    assert "aten::mse_loss" in seen_during and "aten::mean" not in seen_during
    assert "aten::mse_loss" in seen_after and "aten::mean" in seen_after


def test_the_native_log_plans_operators_only_once(cur):
    """Autograd's calls named by a string (`autograd::engine::evaluate_function: ...`, a new name
    pointer every call) and a user's record_function scope are no operators: the log's table
    holds the operators of the first two steps (the second is the first to accumulate gradients)
    and no more after later steps."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    tracker = make_tracker(cur, "native")
    sizes = []
    with tracker:
        for _ in range(4):
            with torch.autograd.profiler.record_function("user scope"):
                model(x).sum().backward()
            tracker.flush()
            sizes.append(len(tracker._feed.plans))
    assert tracker.errors == []
    assert sizes[1] == sizes[2] == sizes[3]
    assert None not in tracker._feed.plans  # every entry an operator the planner knew


def test_the_native_log_told_not_to_record_keeps_its_hooks_and_records_nothing(cur):
    """`record(False)` (the benchmark's native_hooks floor: the hooks installed, doing nothing)
    records no operator, however often it runs; `record(True)` records again."""
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    tracker = make_tracker(cur, "native")
    with tracker:
        log = tracker._feed.log
        torch.mm(x, y)  # planned, recorded
        tracker.flush()
        recorded = tracker.ops
        log.record(False)
        for _ in range(3):
            torch.mm(x, y)
        tracker.flush()
        idle = tracker.ops
        log.record(True)
        torch.mm(x, y)
        tracker.flush()
    assert tracker.errors == []
    assert recorded == 1 and idle == recorded and tracker.ops == recorded + 1


FSDP2_STEP = """
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from racecheck.detect.torch_tracker import TorchRaceTracker
dist.init_process_group("gloo", rank=0, world_size=1)  # the rendezvous from the environment
torch.manual_seed(0)
model = nn.Sequential(*[nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) for _ in range(1)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
x = torch.randn(2, 8, 32)
for path, engine in (("python", None), ("native", "native"), ("native", "python")):
    with TorchRaceTracker(device_type="cpu", current_stream=lambda: 0, stream_handle=lambda s: 0, path=path,
                          engine=engine) as t:
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()
    print(path, t.ops, len(t.reports()), t.stats["collectives"], t.engine.accesses, t.errors[:2])
dist.destroy_process_group()
"""


def test_an_fsdp2_step_with_dtensor_parameters_is_tracked_without_errors_on_every_path():
    """FSDP2's parameters are DTensors (wrapper subclasses with no memory of their own): every path
    passes over them, as it passes over any tensor without bytes, instead of failing on each
    optimizer operator; the step has no race, and both engines of the native path count the same
    operators, collectives and accesses."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run([sys.executable, "-c", FSDP2_STEP], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split(" ", 5) for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == ["python", "native", "native"]
    for _, ops, reports, _, _, errors in rows:
        assert int(ops) > 50 and reports == "0" and errors == "[]", rows
    assert rows[1][1:5] == rows[2][1:5], rows  # ops, reports, collectives, accesses


@pytest.mark.parametrize("ordered", [False, True])
def test_a_kernel_launched_below_the_dispatcher_is_an_access_on_its_stream(tracker, cur, ordered):
    """A Triton kernel (as kernel_launches.py reports it: name, raw stream, reads, writes) reads a
    default-stream buffer on the reduce-scatter stream, and the buffer is dropped and its block
    handed out again on the default stream: a free-while-in-use race unless the default stream
    waited for the kernel. Both paths: the native one logs the launch in the program's order."""
    a = alloc(tracker, cur, DEFAULT).normal_()
    out = alloc(tracker, cur, RS)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    tracker._kernel_launched("triton_poi_fused_mul_0", RS, [a], [out], True)
    if ordered:
        record(tracker, 2, RS)
        wait(tracker, 2, DEFAULT)
    free(tracker, a)
    alloc(tracker, cur, DEFAULT, block=a)
    reports = tracker.reports()
    assert tracker.stats["kernels"] == 1 and not tracker.unseen_kernels
    if ordered:
        assert reports == []
    else:
        (report,) = reports
        assert report.kind is RaceKind.REUSE and report.streams() == ("reduce_scatter", "default")
        assert "triton_poi_fused_mul_0" in report.text()


def test_a_kernel_whose_writes_are_unknown_counts_its_tensors_as_reads(tracker, cur):
    """Two kernels read one buffer on two streams, unordered: no race. A kernel whose writes the
    analysis could not tell (known=False) takes its tensors for reads, so it raises no false
    alarm against the other reader, and the tracker counts it."""
    a = alloc(tracker, cur, DEFAULT).normal_()
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    tracker._kernel_launched("user_kernel", RS, [a], [], False)
    tracker._kernel_launched("user_kernel", DEFAULT, [a], [], False)
    assert tracker.reports() == []
    assert tracker.unseen_kernels == {"user_kernel": 2}
