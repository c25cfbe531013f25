"""The native engine (hb_*.cpp) against the Python engine it follows (engine.py, applied by
feed_apply.py): the same native-log records, applied by each to a fresh tracker, give the same
reports (their whole text, stacks included), counts and errors.

The records come from two generators: the random engine traces of tests/test_detect_native.py,
written as the log records them, and random tracker traces that add what only the tracker's
bookkeeping does: allocations sized by a later operator, blocks adopted at first sight, host memory
a copy touches and its death, collectives charged to the stream that waited during them, operators
without a plan, and stacks whose user frames match. Each trace is cut into batches at random
places, as the log's drains cut a run. A trace runs on a CUDA tracker (c10 stream ids turned into
handles, host memory told apart) and on a CPU one (records carrying the tracker's keys).
"""

from __future__ import annotations

import random

import pytest
import torch
from test_detect_native import _trace

from racecheck.detect import feed_apply as rec
from racecheck.detect import op_log
from racecheck.detect.dispatch import plan_for
from racecheck.detect.feed_apply import apply_batch
from racecheck.detect.native_engine import TRACKER_STATS
from racecheck.detect.native_feed import NativeFeed
from racecheck.detect.torch_tracker import TorchRaceTracker

CURRENT = 0x10  # the current stream's handle
HANDLES = {"A": 0x100, "B": 0x200, "C": 0x300}  # C stays unnamed
STREAM_IDS = {"A": 1, "B": 2, "C": 3}  # c10 stream ids on the CUDA tracker
BASE = 0x10000  # device memory
HOST = 0x900000  # host memory
CUDA_DEVICE, CPU_DEVICE = 1, 0
# The op log's operators, by op id: None for a name the planner could not plan.
OPS = [
    plan_for(torch.ops.aten.add_.Tensor),
    plan_for(torch.ops.aten.copy_.default),
    plan_for(torch.ops.aten._local_scalar_dense.default),  # blocks the host
    None,
    plan_for(torch.ops.aten.mm.default),
    plan_for(torch.ops.c10d.allreduce_.default),
]
ACCESS_OPS, LOCAL_SCALAR, UNPLANNED, COLLECTIVE = (0, 1, 4), 2, 3, 5


def _here_a():
    pass


def _here_b():
    pass


def _here_c():
    pass


# A stack id's frames: ids 0, 3, 6 ... share their user frames, so their races are one report.
_CODES = (_here_a.__code__, _here_b.__code__, _here_c.__code__)


class FakeLog:
    """The op log as the feeds and engines ask it: stacks, host storages, the engine's type."""

    def __init__(self) -> None:
        self.Engine = op_log.load_required().Engine

    def frames(self, stack_id: int) -> tuple:
        return ((_CODES[stack_id % 3], 0),) if stack_id >= 0 else ()

    def watch(self, storage: int) -> bool:
        return storage % 3 != 0  # some host storages cannot be watched


class Records:
    """One batch of records and items, laid out as op_log.cpp's drain hands them over."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.items: list[bytes] = []

    def add(self, kind, *, op=-1, stream=rec.NO_STREAM, device=-1, frame=-1, extra=0, items=()) -> None:
        self.records.append(rec.RECORD.pack(kind, op, stream, device, frame, len(self.items), len(items), extra))
        self.items += [rec.ITEM.pack(*it) for it in items]


class Trace:
    """A record sequence for a CUDA or a CPU tracker, cut into batches."""

    def __init__(self, rng: random.Random, cuda: bool) -> None:
        self.rng, self.cuda = rng, cuda
        self.batches = [Records()]

    def add(self, kind, **fields) -> None:
        if self.rng.random() < 0.04:
            self.batches.append(Records())  # a drain
        self.batches[-1].add(kind, **fields)

    def stream(self, name: str) -> dict:
        """A record's stream fields: a c10 stream id on CUDA, the tracker's key on the CPU."""
        if self.cuda:
            return {"stream": STREAM_IDS[name], "device": 0}
        return {"stream": HANDLES[name]}

    def frame(self) -> int:
        return self.rng.randrange(-1, 9)

    def item(self, ptr, nbytes, access, *, start=None, size=None, device=CUDA_DEVICE, pinned=0) -> tuple:
        return (ptr, nbytes, ptr if start is None else start, nbytes if size is None else size, access, device, pinned)


def engine_trace(seed: int, cuda: bool) -> Trace:
    """test_detect_native's engine trace `seed` as the log records it: an allocation sized by the
    operator that returns it, accesses, frees (record_stream first for the streams a free is
    deferred to), events and synchronizations."""
    t = Trace(random.Random(seed), cuda)
    dev = CUDA_DEVICE if cuda else CPU_DEVICE
    for op in _trace(seed):
        kind = op[0]
        if kind == "alloc":
            t.add(rec.ALLOCATED, extra=BASE + op[2], **t.stream(op[1]))
            t.add(rec.OP, op=0, frame=t.frame(), items=[t.item(BASE + op[2], 0, rec.RESOLVE, size=op[3], device=dev)])
        elif kind == "free":
            for s in op[2]:
                t.add(rec.STREAM_RECORDED, extra=t.stream(s)["stream"], device=0, items=[t.item(BASE + op[1], 0, 0)])
            t.add(rec.FREED, extra=BASE + op[1], frame=t.frame())
        elif kind == "access":
            item = t.item(BASE + op[2], op[3], rec.WRITE if op[4] else rec.READ, device=dev)
            t.add(rec.OP, op=ACCESS_OPS[op[3] % 3], frame=t.frame(), items=[item], **t.stream(op[1]))
        elif kind in ("record", "wait"):
            t.add(rec.EVENT_RECORDED if kind == "record" else rec.EVENT_WAITED, stream=HANDLES[op[2]], extra=op[1])
        elif kind == "record_stream":
            t.add(rec.STREAM_RECORDED, extra=t.stream(op[2])["stream"], device=0, items=[t.item(BASE + op[1], 0, 0)])
        elif kind == "sync_stream":
            t.add(rec.STREAM_SYNCED, stream=HANDLES[op[1]])
        elif kind == "sync_event":
            t.add(rec.EVENT_SYNCED, extra=op[1])
        else:
            t.add(rec.DEVICE_SYNCED)
    return t


def tracker_trace(seed: int, cuda: bool, steps: int = 0) -> Trace:
    """A random program of what the tracker's own bookkeeping decides (see the module's docstring),
    of `steps` steps (0: between 10 and 90)."""
    t = Trace(random.Random(seed), cuda)
    rng = t.rng
    blocks: list[tuple[int, int]] = []  # (start, size): allocated, maybe freed since
    hosts = [(HOST + i * 0x1000, rng.choice([64, 256])) for i in range(3)]  # (start, size) host storages
    for step in range(steps or rng.randint(10, 90)):
        r = rng.random()
        if r < 0.18 or not blocks:
            start, size = BASE + rng.randrange(0, 48) * 16, rng.choice([16, 32, 64, 128])
            blocks.append((start, size))
            stream = t.stream(rng.choice("ABC")) if rng.random() < 0.5 else {}
            t.add(rec.ALLOCATED, extra=start, **stream)  # sized by the first operator that sees it
        elif r < 0.50:
            items = []
            for _ in range(rng.randint(1, 3)):
                start, size = rng.choice(blocks)
                off = rng.choice([0, 0, 0, 16])
                access = rng.choice([rec.READ, rec.WRITE, rec.WRITE, rec.RESOLVE])
                items.append(
                    t.item(start + off, max(0, min(rng.choice([size, 16]), size - off)), access, start=start, size=size)
                )
            op = rng.choice([*ACCESS_OPS, LOCAL_SCALAR, UNPLANNED]) if rng.random() < 0.3 else ACCESS_OPS[0]
            stream = t.stream(rng.choice("ABC")) if rng.random() < 0.7 else {}
            t.add(rec.OP, op=op, frame=t.frame(), extra=int(rng.random() < 0.5), items=items, **stream)
        elif r < 0.60 and cuda:  # a copy between a device block and host memory, or the host's own work
            hstart, hsize = rng.choice(hosts)
            host_item = t.item(
                hstart, hsize, rng.choice([rec.READ, rec.WRITE]), device=CPU_DEVICE, pinned=int(rng.random() < 0.8)
            )
            start, size = rng.choice(blocks)
            items = [host_item] + ([t.item(start, size, rec.READ)] if rng.random() < 0.8 else [])
            stream = t.stream(rng.choice("AB")) if items[1:] else {}
            t.add(rec.OP, op=1, frame=t.frame(), extra=int(rng.random() < 0.7), items=items, **stream)
        elif r < 0.64 and cuda:
            t.add(rec.HOST_FREED, extra=rng.choice(hosts)[0])
        elif r < 0.72:
            start = rng.choice(blocks)[0] if rng.random() < 0.9 else BASE + 8
            t.add(rec.FREED, extra=start, frame=t.frame())
        elif r < 0.78:
            collective(t, rng.choice(blocks))
        elif r < 0.82:
            t.add(
                rec.STREAM_RECORDED,
                extra=t.stream(rng.choice("ABC"))["stream"],
                device=0,
                items=[t.item(rng.choice(blocks)[0], 0, 0)],
            )
        else:
            event(t, step)
    return t


def collective(t: Trace, block: tuple[int, int]) -> None:
    """An all-reduce of a block: on the issuing stream, or on another that waits for it during the
    call, records its end event there, and is waited for by the issuer (or not)."""
    rng = t.rng
    items = [t.item(block[0], block[1], rec.READ), t.item(block[0], block[1], rec.WRITE)]
    t.add(rec.COLLECTIVE_BEGIN, op=COLLECTIVE, frame=t.frame(), items=items, **t.stream("A"))
    if rng.random() < 0.7:
        t.add(rec.EVENT_RECORDED, stream=HANDLES["A"], extra=1000)
        t.add(rec.EVENT_WAITED, stream=0x700, extra=1000)  # the collective's own stream
        if rng.random() < 0.7:
            t.add(rec.EVENT_RECORDED, stream=0x700, extra=1001)
    t.add(rec.COLLECTIVE_END)
    if rng.random() < 0.5:
        t.add(rec.EVENT_WAITED, stream=HANDLES["A"], extra=1001)


def event(t: Trace, step: int) -> None:
    rng = t.rng
    r, handle = rng.random(), HANDLES[rng.choice("ABC")]
    if r < 0.35:
        t.add(rec.EVENT_RECORDED, stream=handle, extra=rng.randrange(4))
    elif r < 0.7:
        t.add(rec.EVENT_WAITED, stream=handle, extra=rng.randrange(4))
    elif r < 0.8:
        t.add(rec.STREAM_SYNCED, stream=handle)
    elif r < 0.87:
        t.add(rec.EVENT_SYNCED, extra=rng.randrange(4))
    elif r < 0.93:
        t.add(rec.EVENT_DELETED, extra=rng.randrange(4))
    else:
        t.add(rec.DEVICE_SYNCED)


def applied(trace: Trace, engine: str, *, slots: list | None = None) -> dict:
    """The trace's batches applied by `engine` to a fresh tracker: what the tracker then says."""
    device = "cuda" if trace.cuda else "cpu"
    tracker = TorchRaceTracker(
        device_type=device, current_stream=lambda: CURRENT, stream_handle=lambda s: s, path="python"
    )
    feed = NativeFeed(FakeLog(), tracker, engine=engine)
    tracker._feed = feed  # the feed's engine is the tracker's, its log the tracker's to ask
    if engine == "native":
        tracker.engine = feed.engine
    feed.plans = list(OPS)
    feed.streams.update({(STREAM_IDS[s], 0): HANDLES[s] for s in STREAM_IDS})
    for s in ("A", "B"):
        tracker.name_stream(HANDLES[s], f"stream {s}")
    for batch in trace.batches:
        records, items = b"".join(batch.records), b"".join(batch.items)
        if engine == "native":
            feed._apply(records, items)
        else:
            apply_batch(feed, tracker, tracker.engine, records, items)
    reports = tracker.reports()
    if slots is not None and engine == "native":
        slots.append(feed.engine._core.counts()[2])  # type: ignore[union-attr]
    return {
        "texts": [r.text() for r in reports],
        "races": [(r.kind, r.count, r.earlier.epoch, r.later.epoch, r.earlier.domain.key) for r in reports],
        "ops": tracker.ops,
        "accesses": tracker.engine.accesses,
        "engine_stats": {k: v for k, v in tracker.engine.stats.items() if v},
        "stats": {k: tracker.stats[k] for k in TRACKER_STATS},
        "errors": tracker.errors,
    }


SEEDS = 300


@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
@pytest.mark.parametrize("traces", [engine_trace, tracker_trace], ids=["engine-traces", "tracker-traces"])
def test_the_native_engine_reports_what_the_python_engine_reports(traces, cuda):
    found = 0
    for seed in range(SEEDS):
        trace = traces(seed, cuda)
        python, native = applied(trace, "python"), applied(trace, "native")
        assert native == python, f"seed {seed}"
        assert python["errors"] == []
        found += len(python["texts"])
    assert found > SEEDS // 3  # the traces do race


def test_the_native_engine_reports_the_same_after_it_has_reused_the_slots_of_freed_blocks():
    """Long traces: the native engine reuses the slots of the freed generations that nothing names
    any more ([Note: allocation slots] in hb_allocations.h) while races still name old ones."""
    for seed in range(2):
        trace, slots = tracker_trace(seed, True, steps=60_000), []
        python, native = applied(trace, "python"), applied(trace, "native", slots=slots)
        assert native == python, f"seed {seed}"
        assert python["errors"] == [] and len(python["texts"]) > 10
        made = sum(rec.RECORD.unpack(r)[0] == rec.ALLOCATED for batch in trace.batches for r in batch.records)
        assert slots[0] < made // 2, (slots, made)  # far fewer generations kept than made


# -- the runtime observer on either engine ---------------------------------------------------------
def test_the_runtime_observer_reports_the_same_on_both_engines_over_generated_programs():
    """The soundness check's programs on the CPU emulation, as generated (no report) and with each
    synchronization removed in turn (a race, most of the time): racecheck.detect.observer's
    RaceDetector with engine="compare" feeds engine.py and the C++ engine (native_hb.py) the same
    events of each run, and its reports raise EnginesDisagree where their texts (stacks included)
    differ. (Two runs, one per engine, would not do: the emulation's streams are threads, and the
    order in which blocks are freed and handed out again differs from run to run.)"""
    from hypothesis import HealthCheck, given, settings

    from racecheck.scenario_kit.programs import programs, without
    from racecheck.scenario_kit.soundness import EmulationPatch

    reported: list[bool] = []

    @settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(programs())
    def compare(program):
        for variant in [program, *(without(program, i) for i in range(len(program.syncs)))]:
            run = EmulationPatch().run(variant, detect=True, engine="compare")  # raises where they differ
            reported.append(bool(run.reports))

    compare()
    assert len(reported) > 60 and sum(reported) > len(reported) // 3, reported  # they do race


def test_compared_engines_fail_the_test_where_the_native_engine_reports_otherwise(rt):
    """The comparison has teeth: a native engine that misses one access (here: never told of it)
    makes reports() raise EnginesDisagree, naming both engines' races."""
    from racecheck.detect.native_hb import EnginesDisagree
    from racecheck.detect.observer import RaceDetector

    det = RaceDetector(engine="compare")
    assert det.engine_kind == "compare"
    side = rt.new_stream("side")
    with det.attached(rt):
        buf = rt.empty(256)
        rt.launch("fill", lambda out: out.fill_(1.0), writes=(buf,))  # on the default stream
        det.engine.native.access = lambda *args, **kwargs: None  # from here on, the native engine misses them
        with rt.stream(side):
            out = rt.empty(256)
            rt.launch("read", lambda o, b: o.copy_(b), writes=(out,), reads=(buf,))  # unordered with the fill
        rt.synchronize()
    with pytest.raises(EnginesDisagree, match=r"native engine reported 0 race\(s\), engine.py 1"):
        det.reports()
    assert len(det.engine.reference.reports()) == 1


@pytest.mark.usefixtures("fast_sessions")
def test_the_catalogue_runs_with_both_engines_compared_on_every_event(tmp_path, monkeypatch):
    """Two scenarios of the catalogue (the motivating reuse, and an offload through pinned host
    memory, the host's own accesses), every arm, under `--detect` with RACECHECK_DETECT_ENGINE=compare: in every
    rank engine.py and the native engine see the same events and every test's reports agree (a
    disagreement would fail the test); the race arms are reported, the safe arms are not.
    bench/engines_cpu.sh does the whole catalogue (reports/engines_catalogue_cpu.md)."""
    from pathlib import Path

    import pandas as pd
    from run_kit import racecheck

    monkeypatch.setenv("RACECHECK_DETECT_ENGINE", "compare")  # the ranks' environment
    scenarios = "main_grad_reuse,hsdp_offload_copy"
    out = tmp_path / "out"
    options = ("--arms", "all", "--trials", 1, "--detect", "--no-perturb", "--backend", "sim", "-q")
    root = Path(__file__).resolve().parents[1]
    res = racecheck("run", "--scenario", scenarios, *options, "--world-size", 2, "--out", out, cwd=root)  # 2 ranks each
    assert res.code == 0, res
    assert "EnginesDisagree" not in res.out + res.err
    rows = pd.read_csv(out / "summary.csv", keep_default_na=False)
    arms = rows[rows.test == "*"]
    got = {(r.scenario, r.arm): (r.expect, int(r.detected), int(r.failures)) for r in arms.itertuples()}
    assert len(got) == 7, got
    # a race arm fails for the race it is reported for; a safe arm neither fails nor is reported
    assert all((expect == "race") == (detected > 0) == (failed > 0) for expect, detected, failed in got.values()), got


@pytest.mark.parametrize("engine", ["python", "native"])
def test_an_access_at_a_0_byte_allocation_touches_nothing_on_either_engine(engine):
    """A 0-byte allocation holds no byte: a write at its address (where it is the allocation found
    there, made after a live one at the same address) leaves no history, so a later read there is
    no race with it (engine.py once left a 0-byte cell that the read was reported against, "a
    0-byte buffer"; the native engine never did)."""
    from racecheck.detect.engine import HappensBefore
    from racecheck.detect.native_hb import NativeHappensBefore

    e = HappensBefore() if engine == "python" else NativeHappensBefore(op_log.load_required())
    for key in ("a", "b"):
        e.domain(key, key)
    e.allocate("b", 0x1000, 16)
    e.allocate("a", 0x1000, 0)
    e.access("a", 0x1000, 16, write=True, op="fill_")
    e.access("b", 0x1000, 16, write=False, op="copy_")
    assert e.reports() == []


def test_a_failing_stack_key_fails_the_call_that_reported_and_the_engine_goes_on():
    """The standalone engine asks Python for a stack's user frames when it reports a race: where
    that raises, the call that reported raises it, and the engine keeps working (the race is
    reported under a key of that stack alone)."""
    log = op_log.load_required()
    answers = iter([RuntimeError("no frames"), 0, 1, 2, 3])

    def stack_key(stack_id):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    core = log.HappensBefore(stack_key)
    core.domain(0, "a")
    core.domain(1, "b")
    core.allocate(0, 0x1000, 64, 0)
    core.access(0, 0x1000, 64, True, "fill_", 1, True)
    with pytest.raises(RuntimeError, match="no frames"):
        core.access(1, 0x1000, 64, False, "copy_", 2, True)  # unordered with the write: a race
    assert core.access(1, 0x1000, 64, True, "add_", 3, True) is True  # the engine goes on
    assert len(core.report_data()[2]) == 2
