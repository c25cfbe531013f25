"""The base class of racecheck.device (base.py) on its own, without a backend: what Stream and
Runtime declare, the observer notifications base.Runtime makes around a backend's hooks (so that
every backend reports the same events), and the checked injection point names of
racecheck.device.points. What both backends must do alike is in test_device_contract.py.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest
import torch

import racecheck.device.base as base
from racecheck.device import Point, Runtime, RuntimeObserver, Stream
from racecheck.device.base import Event, NewBlock
from racecheck.device.sim import SimRuntime, SimStream
from racecheck.perturb.decisions import Hold
from racecheck.perturb.injector import install
from racecheck.perturb.profiles import parse_profile

FSDP = Path(base.__file__).parents[1] / "fsdp"


class Recorder(RuntimeObserver):
    """Logs the name of every observer call, in order, and the point names it is given."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.points: list[object] = []

    def on_point(self, rt, name, **context) -> None:
        self.calls.append("on_point")
        self.points.append(name)


for _name in [n for n in vars(RuntimeObserver) if n.startswith("on_") and n != "on_point"]:
    setattr(Recorder, _name, lambda self, rt, *a, _n=_name, **kw: self.calls.append(_n))


# -- a backend that implements the hooks only --------------------------------------------------
class _HostStream(Stream):
    """A stream the host runs at once: the least a backend must write."""

    def __init__(self, runtime: Runtime, name: str) -> None:
        self.runtime, self.name = runtime, name

    inline = property(lambda self: True)
    runs_host_work = property(lambda self: True)

    def enqueue(self, fn) -> None:
        fn()

    def _wait_event(self, event) -> None:
        pass

    def _synchronize(self) -> None:
        pass


class _HostEvent(Event):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def query(self) -> bool:
        return True

    def _record(self, stream) -> None:
        pass

    def _synchronize(self) -> None:
        pass


class _HostRuntime(Runtime):
    """Every hook, none of the reporting: the base class must report each call by itself."""

    backend, device = "host", torch.device("cpu")

    def __init__(self) -> None:
        super().__init__()
        self._streams = [_HostStream(self, "default")]
        self._current = self._streams[0]

    def default_stream(self):
        return self._streams[0]

    def current_stream(self):
        return self._current

    def new_stream(self, name):
        self._streams.append(_HostStream(self, name))
        return self._streams[-1]

    @contextlib.contextmanager
    def stream(self, stream):
        prev, self._current = self._current, stream
        try:
            yield stream
        finally:
            self._current = prev

    def new_event(self):
        return _HostEvent(self)

    def _synchronize(self) -> None:
        pass

    def _allocate(self, shape, dtype, stream):
        tensor = torch.empty(shape, dtype=dtype)
        return tensor, NewBlock(0, tensor.data_ptr(), tensor.nbytes)

    def _record_stream(self, tensor, stream):
        return 0

    def _launch(self, stream, fn, reads, writes) -> None:
        fn(*writes, *reads)

    sleep = all_gather = reduce_scatter = all_reduce = new_group = allocation_stream = lambda self, *a, **kw: None


def test_the_base_class_reports_around_backend_hooks():
    """A backend that writes no notification at all still reports every observed call, with the
    stream current at the call: the reporting lives in base.Runtime, Stream and Event."""
    rt = _HostRuntime()
    side = rt.new_stream("side")
    rt.add_observer(recorder := Recorder())
    a = rt.empty(4)
    with rt.stream(side):
        rt.launch("w", lambda t: t.zero_(), writes=(a,))
        ev = rt.new_event()
        ev.record()
    ev.wait(rt.default_stream())
    rt.record_stream(a, side)
    side.synchronize()
    rt.synchronize()
    assert recorder.calls == [
        "on_alloc",
        "on_launch",
        "on_event_record",
        "on_event_wait",
        "on_record_stream",
        "on_host_sync",
        "on_host_sync",
        "on_host_sync",
    ]


def test_stream_declares_what_callers_use():
    """inline, runs_host_work and enqueue are abstract members: a backend without them cannot be made."""
    assert {"inline", "runs_host_work", "enqueue", "_wait_event", "_synchronize"} <= Stream.__abstractmethods__
    assert {"_allocate", "_launch", "_record_stream", "_synchronize"} <= Runtime.__abstractmethods__
    assert not hasattr(base, "no_observers")
    with pytest.raises(TypeError, match="inline"):
        type(
            "NoInline",
            (Stream,),
            {
                "runs_host_work": property(lambda s: True),
                "enqueue": lambda s, f: None,
                "_wait_event": lambda s, e: None,
                "_synchronize": lambda s: None,
            },
        )()


def test_a_stream_that_cannot_run_host_work_is_held_by_a_delay():
    """The injector asks Stream.runs_host_work, never probes: a stream that cannot wait for the host
    (CUDA's) gets the hold's bound as a sleep, and nothing is enqueued on it."""

    class NoHostWork(SimStream):
        runs_host_work = property(lambda self: False)

        def enqueue(self, fn) -> None:
            if not getattr(fn, "is_marker", False):
                raise AssertionError("host work enqueued on a stream that cannot run it")
            super().enqueue(fn)

    rt = SimRuntime()
    try:
        side = NoHostWork(rt, "all_reduce", inline=False)
        rt._streams.append(side)
        slept = []
        rt.sleep = lambda seconds: slept.append((rt.current_stream().name, seconds))
        inj = install(rt, parse_profile("reorder@before_all_reduce>end_of_backward:2s"))
        with rt.stream(side):
            rt.point(Point.BEFORE_ALL_REDUCE)
        assert slept == [("all_reduce", 2.0)] and [type(f.action) for f in inj.log] == [Hold]
    finally:
        rt.close()


# -- injection points ----------------------------------------------------------------------------
def test_an_unknown_point_is_an_error_observed_or_not():
    rt = SimRuntime()
    try:
        with pytest.raises(ValueError, match="unknown injection point 'before_all_gahter'; known: "):
            rt.point("before_all_gahter")
        rt.add_observer(recorder := Recorder())
        rt.point(Point.BEFORE_COPY, bucket=1)
        rt.point("after_copy")  # a plain name that is a Point still works
        with pytest.raises(ValueError):
            rt.point("nowhere")
        assert recorder.points == ["before_copy", "after_copy"]
        assert [type(p) for p in recorder.points] == [str, str]  # observers get plain names
    finally:
        rt.close()


def test_fsdp_marks_points_with_the_constants():
    """Every Runtime.point call in racecheck.fsdp names a Point member, never a string literal."""
    calls = []
    for path in sorted(FSDP.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "point":
                arg = node.args[0]
                assert isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "Point", (
                    f"{path.name}:{node.lineno}: {ast.unparse(arg)}"
                )
                assert arg.attr in Point.__members__, f"{path.name}:{node.lineno}: Point.{arg.attr}"
                calls.append(arg.attr)
    assert {"BEFORE_REDUCE_SCATTER", "BEFORE_ALL_GATHER", "RESHARD", "END_OF_BACKWARD"} <= set(calls)


def test_profiles_know_the_marked_points():
    from racecheck.perturb.points import MARKED_POINTS

    assert list(MARKED_POINTS) == [p.value for p in Point]
    assert all(MARKED_POINTS[p.value] == p.description for p in Point)
