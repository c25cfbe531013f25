"""The compiled engine (setup.py, racecheck/detect/native.py) and the pure-Python engine it is
built from: which one runs, and that both give the same reports on the same random traces."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from racecheck.detect import native

HERE = Path(__file__).resolve().parent


def _trace(seed: int) -> list[tuple]:
    """A random sequence of engine calls over three streams and a few dozen overlapping blocks:
    allocations that reuse freed bytes, whole and partial accesses, events, record_stream and
    host synchronizations."""
    rng = random.Random(seed)
    ops: list[tuple] = []
    live: dict[int, tuple[int, int]] = {}
    for step in range(rng.randint(5, 80)):
        r, s = rng.random(), rng.choice("ABC")
        if r < 0.25 or not live:
            ptr, n = rng.randrange(0, 64) * 8, rng.choice([8, 16, 24, 64, 128])
            for key, (p, m) in list(live.items()):  # the allocator frees what it hands out again
                if p < ptr + n and ptr < p + m:
                    ops.append(("free", p, tuple(rng.sample("ABC", rng.randint(0, 1)))))
                    del live[key]
            live[step] = (ptr, n)
            ops.append(("alloc", s, ptr, n))
        elif r < 0.55:
            p, n = live[rng.choice(list(live))]
            off, ln = rng.choice([0, 0, 0, 8]), rng.choice([n, n, 8, 16])
            ops.append(("access", s, p + off, max(0, min(ln, n - off)), rng.random() < 0.5, f"op{step}"))
        elif r < 0.62:
            key = rng.choice(list(live))
            ops.append(("free", live.pop(key)[0], tuple(rng.sample("ABC", rng.randint(0, 1)))))
        elif r < 0.72:
            ops.append(("record", rng.randrange(4), s))
        elif r < 0.82:
            ops.append(("wait", rng.randrange(4), s))
        elif r < 0.87:
            ops.append(("record_stream", live[rng.choice(list(live))][0], s))
        elif r < 0.92:
            ops.append(("sync_stream", s))
        elif r < 0.95:
            ops.append(("sync_event", rng.randrange(4)))
        else:
            ops.append(("sync_all",))
    return ops


def summaries(seeds: int) -> list:
    """Each trace's reports (kind, streams, ops, counts) and access count, in this process's engine."""
    from racecheck.detect.engine import HappensBefore

    out = []
    for seed in range(seeds):
        e = HappensBefore()
        for op in _trace(seed):
            kind = op[0]
            if kind == "alloc":
                e.allocate(op[1], op[2], op[3])
            elif kind == "free":
                e.free(op[1], deferred_to=op[2])
            elif kind == "access" and op[3] > 0:
                alloc = e.allocation_at(op[2])
                if alloc is not None and op[2] + op[3] <= alloc.end:  # the tracker's path
                    e.access_many(op[1], [(op[2], op[3], op[4], alloc)], op[5])
                else:  # the runtime observer's path (clamps to the allocation)
                    e.access(op[1], op[2], op[3], write=op[4], op=op[5])
            elif kind == "record":
                e.record_event(op[1], op[2])
            elif kind == "wait":
                e.wait_event(op[1], op[2])
            elif kind == "record_stream":
                e.record_stream(op[1], op[2])
            elif kind == "sync_stream":
                e.host_sync_stream(op[1])
            elif kind == "sync_event":
                e.host_sync_event(op[1])
            elif kind == "sync_all":
                e.host_sync_all()
        out.append(
            [
                sorted(
                    [
                        r.kind.name,
                        r.earlier.domain.name,
                        r.earlier.op,
                        r.earlier.is_write,
                        r.later.domain.name,
                        r.later.op,
                        r.count,
                        r.buffer.serial,
                    ]
                    for r in e.reports()
                ),
                e.accesses,
            ]
        )
    return out


def _run(seeds: int, *, pure: bool) -> tuple[str, list]:
    env = {k: v for k, v in os.environ.items() if k != "RACECHECK_PURE_PYTHON"}
    if pure:
        env["RACECHECK_PURE_PYTHON"] = "1"
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import racecheck.detect as d; "
        "from test_detect_native import summaries; print(json.dumps([d.ENGINE, summaries(int(sys.argv[2]))]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(seeds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    kind, result = json.loads(proc.stdout)
    return kind, result


def test_pure_python_engine_can_be_forced():
    kind, result = _run(1, pure=True)
    assert kind == "python"
    assert len(result) == 1


def test_compiled_engine_runs_when_built_from_these_sources():
    if not any(native._compiled(name) for name in native._MODULES):
        pytest.skip("the engine was not compiled on this machine (no mypyc or no C compiler at install)")
    assert native._built_from_these_sources(), "compiled engine is stale or partial: reinstall racecheck"
    kind, _ = _run(1, pure=False)
    assert kind == "compiled"


def test_compiled_and_pure_engines_report_the_same_races():
    pure_kind, pure = _run(400, pure=True)
    kind, default = _run(400, pure=False)
    assert pure_kind == "python"
    assert sum(len(reports) for reports, _ in pure) > 100  # the traces do race
    assert default == pure, f"the {kind} engine differs from the pure-Python one"
