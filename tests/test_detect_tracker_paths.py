"""The PyTorch tracker's two recording paths on the CPU (the native log applied by either engine,
and the dispatch mode): the same reports, the log built or refused in one line, its callbacks and
plans, and kernels launched below the dispatcher.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import tracker_kit as kit
from run_kit import free_port, racecheck
from tracker_kit import cur, path, tracker  # noqa: F401 (fixtures)

from racecheck.detect import RaceKind
from racecheck.detect.torch_tracker import TorchRaceTracker, TrackerUnavailable


# -- the two recording paths ------------------------------------------------------------------------
def _reports_of(path: str, scenario) -> str:
    cur = kit.Streams()
    t = kit.make_tracker(cur, path)
    t.name_stream(kit.DEFAULT, "default")
    t.name_stream(kit.RS, "reduce_scatter")
    scenario(t, cur)
    assert t.errors == []
    return t.render()


@pytest.mark.parametrize(
    "scenario",
    [
        lambda t, cur: (t.__enter__(), kit.motivating(t, cur, fix=None), t.__exit__(None, None, None)),
        lambda t, cur: kit.training_loop(t, cur, steps=2, side_read="none"),
    ],
    ids=["motivating", "training-loop-side-read"],
)
def test_both_paths_give_the_same_reports(scenario):
    """The native log and the dispatch mode feed the engines the same accesses, and the native
    engine applies them as the Python one does: the reports are the same text, stacks included."""
    python, native, native_pyengine = (_reports_of(path, scenario) for path in kit.PATHS)  # one call site
    assert "race" in python.lower()
    assert native == python and native_pyengine == python


def test_without_a_compiler_the_tracker_takes_the_python_path(tmp_path):
    """Where op_log.cpp cannot be built, a CUDA tracker runs the Python path (and says why in one
    line); asking for the native path fails with that line. (And the tracker's modules, in this
    fresh process, import no torch._dynamo: see torch_hooks.eager.)"""
    code = (
        "import sys\n"
        "from racecheck.detect import op_log\n"
        "from racecheck.detect.torch_tracker import TorchRaceTracker\n"
        "t = TorchRaceTracker(device_type='cuda')\n"
        "print(t.path)\n"
        "print(len(op_log.why_not().splitlines()), op_log.why_not()[:60])\n"
        "try:\n"
        "    TorchRaceTracker(device_type='cpu', current_stream=lambda: 0, path='native')\n"
        "except op_log.NativeUnavailable as exc:\n"
        "    print('refused', len(str(exc).splitlines()))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), "RACECHECK_NATIVE_CACHE": str(tmp_path / "cache")}
    env.pop("RACECHECK_DETECT_PATH", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "python"
    assert lines[1].startswith("1 building op_log.cpp failed")
    assert lines[2] == "refused 1"
    assert lines[3] == "False"  # importing torch._dynamo takes about a second


def test_an_installed_package_carries_every_source_the_native_log_is_built_from():
    """The log and engine are compiled at first use from the installed package's files: every
    .cpp and .h beside them is one op_log builds from, and pyproject.toml ships each as package
    data (a wheel without them left a plain `pip install` on the Python path)."""
    import fnmatch
    import tomllib

    from racecheck.detect import op_log

    detect = Path(op_log.__file__).parent
    on_disk = {p.name for p in detect.iterdir() if p.suffix in (".cpp", ".h")}
    assert on_disk == {p.name for p in (*op_log.SOURCES, *op_log.HEADERS)}
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["racecheck.detect"]
    assert [name for name in sorted(on_disk) if not any(fnmatch.fnmatch(name, p) for p in patterns)] == []


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
        with kit.make_tracker(cur, "native"):
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
    tracker = kit.make_tracker(cur, "native")
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
    """`kit.record(False)` (the benchmark's native_hooks floor: the hooks installed, doing nothing)
    records no operator, however often it runs; `kit.record(True)` records again."""
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    tracker = kit.make_tracker(cur, "native")
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


def test_the_native_log_started_without_results_records_nothing_and_cannot_be_told_to(cur, monkeypatch):
    """start(..., results=False) (the benchmark's native_hooks_args floor: RecordFunction with the
    calls' arguments only) records no operator, as a recording log without the results would
    lose their writes; record(True) is refused with a one-line error."""
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    tracker = kit.make_tracker(cur, "native")
    log = tracker._feed.log
    start = log.start
    monkeypatch.setattr(log, "start", lambda *a: start(*a[:5], False, *a[6:]))  # results, the sixth
    with tracker:
        for _ in range(3):
            torch.mm(x, y)
        tracker.flush()
        with pytest.raises(RuntimeError, match="started without the calls' results: it cannot record"):
            log.record(True)
    assert tracker.errors == [] and tracker.ops == 0
    monkeypatch.undo()
    with kit.make_tracker(cur, "native") as again:  # the next start takes the results again
        torch.mm(x, y)
        again.flush()
    assert again.errors == [] and again.ops == 1


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
    handed out again on the default stream: a kit.free-while-in-use race unless the default stream
    waited for the kernel. Both paths: the native one logs the launch in the program's order."""
    a = kit.alloc(tracker, cur, kit.DEFAULT).normal_()
    out = kit.alloc(tracker, cur, kit.RS)
    kit.record(tracker, 1, kit.DEFAULT)
    kit.wait(tracker, 1, kit.RS)
    tracker._kernel_launched("triton_poi_fused_mul_0", kit.RS, [a], [out], True)
    if ordered:
        kit.record(tracker, 2, kit.RS)
        kit.wait(tracker, 2, kit.DEFAULT)
    kit.free(tracker, a)
    kit.alloc(tracker, cur, kit.DEFAULT, block=a)
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
    a = kit.alloc(tracker, cur, kit.DEFAULT).normal_()
    kit.record(tracker, 1, kit.DEFAULT)
    kit.wait(tracker, 1, kit.RS)
    tracker._kernel_launched("user_kernel", kit.RS, [a], [], False)
    tracker._kernel_launched("user_kernel", kit.DEFAULT, [a], [], False)
    assert tracker.reports() == []
    assert tracker.unseen_kernels == {"user_kernel": 2}


def test_the_engine_variable_compare_leaves_the_tracker_on_the_native_engine(monkeypatch):
    """RACECHECK_DETECT_ENGINE=compare is the runtime observer's check of its two engines: a tracker
    in the same run (a project suite beside the catalogue) takes the native engine instead of
    failing on a value it does not know; an unknown value is refused in one line."""
    from racecheck.detect.native_feed import wanted_engine

    monkeypatch.setenv("RACECHECK_DETECT_ENGINE", "compare")
    assert wanted_engine(None) == "native"
    monkeypatch.setenv("RACECHECK_DETECT_ENGINE", "both")
    with pytest.raises(ValueError, match="expected native, python or compare"):
        wanted_engine(None)


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_compiled_function_runs_compiled_under_the_tracker(path):
    """torch.compile under the tracker, on the CPU (Inductor's C++ kernel): Dynamo captures the
    function as one graph, with no graph break, and it computes what it computes without the
    tracker. The Python path's dispatch mode steps aside while Dynamo compiles
    (TrackerMode.ignore_compile_internals); without that, Dynamo traced the mode's own frames and
    broke the function into some twenty frames."""
    from torch._dynamo.utils import counters

    from racecheck.detect.torch_tracker import TorchRaceTracker

    torch._dynamo.reset()
    counters.clear()

    @torch.compile
    def scaled_sine(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(1024)
    with TorchRaceTracker(device_type="cpu", current_stream=lambda: 0, stream_handle=lambda s: s, path=path) as t:
        y = scaled_sine(x)
    assert t.path == path and t.errors == []
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    assert dict(counters["frames"]) == {"total": 1, "ok": 1}
    torch.testing.assert_close(y, torch.sin(x) * 2 + 1)


def _compiled_with_a_graph_break(tracked: str | None) -> tuple[dict, int, list[str]]:
    """Dynamo's frame counts and graphs for a compiled function that breaks its graph on a value
    (its eager part runs between two compiled graphs), run under a tracker on `tracked`'s path or
    under none; and the warnings that name racecheck's files."""
    import contextlib
    import warnings

    from torch._dynamo.utils import counters

    from racecheck.detect.torch_tracker import TorchRaceTracker

    torch._dynamo.reset()
    counters.clear()

    @torch.compile
    def block(x, w):
        y = torch.relu(x @ w)
        if y.sum() > 0:  # a graph break: the rest is a second frame, compiled on its own
            y = y * 2
        return y.sin()

    w = torch.randn(8, 8)
    tracker = None if tracked is None else TorchRaceTracker(device_type="cpu", path=tracked)
    with warnings.catch_warnings(record=True) as caught, tracker or contextlib.nullcontext():
        warnings.simplefilter("always")
        for i in range(4):
            block(torch.randn(8 + i, 8), w)
    assert tracker is None or (tracker.errors == [] and tracker.ops > 0)
    ours = [str(c.message) for c in caught if "racecheck" in f"{c.filename} {c.message}"]
    return dict(counters["frames"]), counters["stats"]["unique_graphs"], ours


@pytest.mark.parametrize("path", ["python", "native"])
def test_dynamo_compiles_only_the_programs_frames_under_the_tracker_even_across_a_graph_break(path):
    """Where a compiled function breaks its graph, its eager part runs with Dynamo's frame hook
    on: the Python path's __torch_dispatch__, called from it, was itself compiled by Dynamo (with
    recompilations guarded on the tracker's plan table, and Dynamo's warnings about racecheck's
    files). Under either path Dynamo compiles the frames and graphs it compiles without a tracker,
    and says nothing of racecheck."""
    alone_frames, alone_graphs, _ = _compiled_with_a_graph_break(None)
    frames, graphs, ours = _compiled_with_a_graph_break(path)
    assert (frames, graphs, ours) == (alone_frames, alone_graphs, [])


def test_eager_hands_the_function_back_where_dynamo_has_its_per_code_setting_else_wraps_it(monkeypatch):
    """`eager` marks the function's code for Dynamo to skip and hands it back (no cost per call);
    where torch has no per-code setting, its wrapper runs the function as it is until torch._dynamo
    is imported, and under torch.compiler.disable after."""
    import functools
    import importlib

    from racecheck.detect import torch_hooks

    def f(x):
        return x + 1

    assert torch_hooks._skip_recursively() is not None  # torch 2.13, which CI installs
    assert torch_hooks.eager(f) is f
    partial = functools.partial(f)  # no code object of its own: wrapped, as below
    assert torch_hooks.eager(partial) is not partial and torch_hooks.eager(partial)(1) == 2
    monkeypatch.setattr(torch_hooks, "_skip_recursively", lambda: None)
    disabled = []
    monkeypatch.setattr(torch.compiler, "disable", lambda fn, recursive: disabled.append(recursive) or fn)
    g = torch_hooks.eager(f)
    assert g is not f and g.__wrapped__ is f
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch._dynamo", raising=False)
        assert g(1) == 2 and disabled == []  # no Dynamo imported: nothing to keep off
    importlib.import_module("torch._dynamo")  # as the program's first torch.compile would
    assert g(1) == 2 and g(2) == 3 and disabled == [True]


@pytest.mark.parametrize("name", list(kit.PATHS))
def test_a_cpu_tracker_given_no_streams_runs_on_the_cpus_one_stream(name):
    """On the CPU, with no stream functions given, code on one stream runs the same on every path
    (the Python path asked for a CUDA stream and failed each operator)."""
    path_, engine = kit.PATHS[name]
    with TorchRaceTracker(device_type="cpu", path=path_, engine=engine) as t:
        x = torch.ones(64)
        y = (x * 2).sum()
        x.add_(y)
    assert t.errors == [] and t.reports() == [] and t.ops > 0


def _sparse_step() -> list[torch.Tensor]:
    """A sparse-gradient embedding trained a step (recommendation models' idiom), a COO and a CSR
    product: tensors of layouts without a storage of their own."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    emb(torch.tensor([1, 4, 4, 9])).sum().backward()
    opt.step()
    dense = torch.randn(6, 6)
    return [emb.weight.detach().clone(), dense.to_sparse() @ torch.ones(6, 2), dense.to_sparse_csr() @ torch.ones(6, 2)]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("name", list(kit.PATHS))
def test_tensors_without_storage_are_passed_over_on_every_path(name):
    """A sparse tensor has no storage of its own (its indices and values do, which the sparse
    kernels read unseen): on the Python path, asking it for its data pointer failed every operator
    that took one, as a tracker error. Every path passes it over, as op_log.cpp does, and records
    the operator's strided tensors."""
    want = _sparse_step()
    path_, engine = kit.PATHS[name]
    with TorchRaceTracker(device_type="cpu", path=path_, engine=engine) as t:
        got = _sparse_step()
    assert t.errors == [] and t.reports() == [] and t.ops > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(kit.PATHS))
def test_the_operators_another_thread_issues_are_seen_on_the_native_path_only(name):
    """A thread of the program other than the one that entered the tracker (one that prefetches or
    stages copies, say): the native path's RecordFunction observer is global and records its
    operators; the Python path's TorchDispatchMode is per thread and sees none (the README says so)."""
    import threading

    path_, engine = kit.PATHS[name]
    with TorchRaceTracker(device_type="cpu", path=path_, engine=engine) as t:
        worker = threading.Thread(target=lambda: (torch.ones(64) * 3).sum())
        worker.start()
        worker.join()
    assert t.errors == [] and t.reports() == []
    assert (t.ops > 0) == (path_ == "native")


@pytest.mark.parametrize(("outer", "inner"), [("python", "python"), ("python", "native"), ("native", "python"),
                                              ("native", "native")])  # fmt: skip
def test_a_tracker_on_the_native_path_records_alone_and_python_path_trackers_nest(outer, inner):
    """[Note: a native tracker records alone] (torch_tracker.py): a second tracker entered while
    one records is refused, in one line, where either is on the native path (its log and CUDA's
    trace are the process's; a Python-path tracker inside a native one on CUDA got no trace
    callback); trackers on the Python path nest. The outer tracker goes on, and once it has exited
    any tracker starts."""
    with TorchRaceTracker(device_type="cpu", path=outer) as first:
        x = torch.ones(8) * 2
        second = TorchRaceTracker(device_type="cpu", path=inner)
        if "native" in (outer, inner):
            with pytest.raises(TrackerUnavailable) as refused:
                second.__enter__()
            assert "\n" not in str(refused.value) and "path='python'" in str(refused.value)
        else:
            with second:
                x.add_(1)
            assert second.ops > 0
        (x * 3).sum()
    assert first.errors == [] and first.reports() == [] and first.ops > 0
    with TorchRaceTracker(device_type="cpu", path=inner) as later:
        (torch.ones(4) + 1).sum()
    assert later.errors == [] and later.ops > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_cuda_tracker_without_cuda_says_so_in_one_line():
    with pytest.raises(TrackerUnavailable, match=r"^TorchRaceTracker follows CUDA streams.*no CUDA device") as got:
        TorchRaceTracker().__enter__()
    assert "\n" not in str(got.value)


@pytest.mark.parametrize("name", list(kit.PATHS))
def test_fake_and_meta_tensors_are_no_memory_on_every_path(name):
    """What torch.compile and torch.library.opcheck trace with (fake tensors) and meta tensors
    have no memory: no access, and no touch of a fake tensor's data pointer (deprecated, to become
    an error). The native log skips them as storages without data; the Python path did not."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    path_, engine = kit.PATHS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TorchRaceTracker(device_type="cpu", path=path_, engine=engine) as t:
            with FakeTensorMode():
                fake = torch.empty(64)
                (fake * 2).add_(1)
            meta = torch.empty(64, device="meta")
            (meta * 2).add_(1)
            real = torch.ones(64) * 2
    assert t.errors == [] and t.reports() == [] and real.sum().item() == 128
    assert t.ops == 2  # the real ones() and multiplication alone


@contextlib.contextmanager
def log_as_cuda_trackers(owner: int = 0):
    """The native log started as a CUDA tracker's would be (no stacks, no trace; `owner` as start's),
    on whatever build this is; stopped after."""
    from racecheck.detect import op_log
    from racecheck.detect.dispatch import native_plan

    log = op_log.load_required()
    log.start(native_plan, lambda: None, True, False, False, True, owner)  # planner, drainer, cuda, stacks, trace
    try:
        yield log
    finally:
        log.stop()


def test_the_log_as_cuda_trackers_records_no_host_only_call_asks_nothing_of_it_and_keeps_no_storage():
    """[Note: the host's own calls] (op_log.cpp), on this CPU build: the log started as a CUDA
    tracker's sees only host memory no stream touched here, so it records none of the operators
    and asks CUDA nothing about their tensors; a kernel launch, recorded whatever its memory, asks
    about each of its host tensors once, at its record; no call holds its tensors' storages after
    it ends."""
    from racecheck.detect.feed_apply import RECORD

    state = torch.zeros(16)
    step = torch.zeros(())
    with log_as_cuda_trackers() as log:
        before = log.costs()
        step.add_(1.0)
        float(step.item())
        state.mul_(0.9).add_(step)
        during = log.costs()
        kernel = log.kernel_op("triton_poi_fused_add_0")
        log.launch(kernel, 0, [step], [state])
        after = log.costs()
        records, _, _ = log.drain(0)
    assert during["host_only"] - before["host_only"] == 4  # add_, item, mul_, add_
    assert during["pinned_asked"] == before["pinned_asked"]
    assert after["pinned_asked"] - during["pinned_asked"] == 2  # the kernel's two host tensors
    assert len(records) == RECORD.size  # the kernel's, the only record
    assert torch._C._storage_Use_Count(state.untyped_storage()._cdata) == 2  # the tensor's, and this line's


def test_the_pinned_ranges_merge_where_they_meet_and_belong_to_the_tracker_that_started_the_log():
    """[Note: the host's own calls]: the pinned memory records touched is kept as ranges merged
    where they meet or overlap, a range within one already there adding nothing; it is kept when
    the same tracker (start's `owner`) starts the log again, and forgotten for another or none."""

    def start(owner):
        with log_as_cuda_trackers(owner) as started:
            return started

    log = start(9_001)
    assert log.pinned_ranges() == []
    for r in ((100, 200), (300, 400)):
        log.add_pinned_range(*r)
    assert log.pinned_ranges() == [(100, 200), (300, 400)]
    log.add_pinned_range(200, 300)  # meets both
    assert log.pinned_ranges() == [(100, 400)]
    log.add_pinned_range(150, 160)  # within
    log.add_pinned_range(50, 120)  # overlaps the start
    assert log.pinned_ranges() == [(50, 400)]
    for r in ((500, 600), (450, 460), (455, 550)):  # the last overlaps both before it
        log.add_pinned_range(*r)
    assert log.pinned_ranges() == [(50, 400), (450, 600)]
    with pytest.raises(ValueError, match="empty range"):
        log.add_pinned_range(10, 10)
    start(9_001)  # the same tracker again: kept
    assert log.pinned_ranges() == [(50, 400), (450, 600)]
    start(9_002)  # another: forgotten
    assert log.pinned_ranges() == []
    log.add_pinned_range(1, 2)
    start(0)  # none given: forgotten
    assert log.pinned_ranges() == []


def test_the_log_as_cuda_trackers_asks_about_host_memory_that_overlaps_pinned_memory_records_touched():
    """[Note: the host's own calls], on this CPU build: a host tensor whose memory overlaps pinned
    memory a record touched is asked about at the call's end, once a call (an in-place operator's
    argument and result are one question), a view of it and another storage over part of it alike;
    a tensor elsewhere is not; none being pinned here, the calls still make no record."""
    buf, elsewhere = torch.zeros(64), torch.zeros(64)
    start = buf.untyped_storage().data_ptr()
    with log_as_cuda_trackers(9_003) as log:
        log.add_pinned_range(start + 64, start + 128)  # as an upload of part of it would
        before = log.costs()
        buf.add_(1.0)
        buf[20:].mul_(2.0)  # a view: the same storage
        alias = torch.from_dlpack(buf[30:])  # another storage over its memory (torch asks is_pinned() of it)
        alias.sub_(1.0)
        elsewhere.add_(1.0)
        after = log.costs()
    assert after["pinned_asked"] - before["pinned_asked"] == 4  # add_, mul_, is_pinned, sub_
    assert after["host_only"] - before["host_only"] == 5


def test_the_log_frees_host_memory_once_every_storage_seen_there_died():
    """op_log.cpp's host storages, on this CPU build with its host memory taken for pinned memory
    (answer_pinned) and a kernel's launches recording it: a storage at bytes whose storages all
    died is a new allocation, whose first record the old one's free precedes, once, within a batch
    or after Python watched it; an alias over a watched buffer's bytes (torch.from_dlpack) joins its
    storages, and the free waits for the last of them."""
    from racecheck.detect.feed_apply import HOST_FREED, KERNEL, RECORD

    def logged(log) -> list[tuple[int, int]]:
        records, _, _ = log.drain(0)
        unpacked = (RECORD.unpack_from(records, at) for at in range(0, len(records), RECORD.size))
        return [(r[0], r[-1] if r[0] == HOST_FREED else 0) for r in unpacked]

    memory, elsewhere = bytearray(64), torch.zeros(16)
    with log_as_cuda_trackers() as log:
        log.watch_host(True)
        log.answer_pinned(True)
        try:
            kernel = log.kernel_op("triton_poi_fused_upload_0")
            a = torch.frombuffer(memory, dtype=torch.float32)  # a staging buffer
            start = a.untyped_storage().data_ptr()
            log.launch(kernel, 0, [a], [])
            del a  # dropped, and its bytes handed out again within the batch
            b = torch.frombuffer(memory, dtype=torch.float32)
            log.launch(kernel, 0, [b], [])
            log.launch(kernel, 0, [b], [])
            assert logged(log) == [(KERNEL, 0), (HOST_FREED, start), (KERNEL, 0), (KERNEL, 0)]
            assert log.watch(start)  # Python tracks it from the batch it applies
            del b
            c = torch.frombuffer(memory, dtype=torch.float32)
            log.launch(kernel, 0, [c], [])
            assert logged(log) == [(HOST_FREED, start), (KERNEL, 0)]  # once
            assert log.watch(start)
            alias = torch.from_dlpack(c)  # another storage over the same bytes, which keeps c's alive
            assert alias.untyped_storage().data_ptr() == start
            assert HOST_FREED not in {kind for kind, _ in logged(log)}  # from_dlpack's own calls on c, if any
            log.launch(kernel, 0, [alias], [])
            del alias
            log.launch(kernel, 0, [c], [])
            del c
            log.launch(kernel, 0, [elsewhere], [])
            assert logged(log) == [(KERNEL, 0), (KERNEL, 0), (HOST_FREED, start), (KERNEL, 0)]
            # drained and not yet watched when it dies and its bytes are handed out again
            d = torch.frombuffer(memory, dtype=torch.float32)
            log.launch(kernel, 0, [d], [])
            assert logged(log) == [(KERNEL, 0)]
            del d
            e = torch.frombuffer(memory, dtype=torch.float32)
            log.launch(kernel, 0, [e], [])
            assert log.watch(start)  # Python, applying the batch of d's record: e, seen at those bytes since
            log.launch(kernel, 0, [e], [])
            assert logged(log) == [(HOST_FREED, start), (KERNEL, 0), (KERNEL, 0)]
            assert log.watch(start)  # e's, from the batch Python applies now
            del e
            log.launch(kernel, 0, [elsewhere], [])
            log.launch(kernel, 0, [elsewhere], [])
            assert logged(log) == [(HOST_FREED, start), (KERNEL, 0), (KERNEL, 0)]  # once
        finally:
            log.answer_pinned(None)
            log.watch_host(False)
