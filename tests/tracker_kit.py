"""What the tests of the PyTorch tracker on the CPU share (test_detect_torch_tracker.py,
test_detect_host_accesses.py, test_detect_tracker_paths.py): streams as plain integers standing
for cudaStream_t handles, the tracker on each of its three paths (the `path`, `cur` and `tracker`
fixtures, which the modules import), and the CUDA trace callbacks called by hand in the order the
caching allocator and CUDA would call them.
"""

from __future__ import annotations

import pytest
import torch

from racecheck.detect import feed_apply
from racecheck.detect.cpu_trace import AllocatorTrace
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


def training_loop(tracker, cur, *, steps: int, side_read: str | None) -> None:
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
