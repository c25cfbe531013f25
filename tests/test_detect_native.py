"""The compiled engine (setup.py, racecheck/detect/native.py) and the pure-Python engine it is
built from: which one runs, and that both give the same reports on the same random traces."""

from __future__ import annotations

import functools
import importlib.machinery
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
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


# The traces both engines run: each engine's interpreter starts once for the module's tests.
SEEDS = 400


@functools.cache
def _run(seeds: int, *, pure: bool) -> tuple[str, list, list[str]]:
    """In a fresh interpreter: which engine runs, the summaries of `seeds` traces, and the files
    the engine's modules were loaded from (one interpreter per engine and count, kept for the
    module's other tests)."""
    env = {k: v for k, v in os.environ.items() if k != "RACECHECK_PURE_PYTHON"}
    if pure:
        env["RACECHECK_PURE_PYTHON"] = "1"
    code = (
        "import importlib, json, sys; sys.path.insert(0, sys.argv[1]); import racecheck.detect as d; "
        "from racecheck.detect.native import _MODULES; from test_detect_native import summaries; "
        "files = [importlib.import_module('racecheck.detect.' + m).__file__ for m in _MODULES]; "
        "print(json.dumps([d.ENGINE, summaries(int(sys.argv[2])), files]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(seeds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    kind, result, files = json.loads(proc.stdout)
    return kind, result, files


def _why_setup_compiles_nothing() -> str | None:
    """What keeps setup.py (native_extensions) from compiling the engine on this machine, or None
    where it compiles it: RACECHECK_PURE_PYTHON set, no mypyc, or no C compiler for extensions."""
    if os.environ.get("RACECHECK_PURE_PYTHON"):
        return "RACECHECK_PURE_PYTHON is set"
    try:
        import mypyc.build  # noqa: F401 - what setup.py imports to compile
    except ImportError:
        return "mypyc is not installed"
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler ({cc[0] if cc else 'sysconfig names none'})"
    return None


def _is_extension(path: str) -> bool:
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_pure_python_engine_can_be_forced():
    kind, result, files = _run(SEEDS, pure=True)
    assert kind == "python"
    assert len(result) == SEEDS
    assert all(f.endswith(".py") for f in files), files


def test_compiled_engine_is_the_one_in_use_where_setup_can_compile_it():
    why = _why_setup_compiles_nothing()
    if why is not None:
        pytest.skip(f"setup.py compiles no engine on this machine: {why}")
    missing = [name for name in native._MODULES if not native._compiled(name)]
    assert not missing, f"mypyc and a C compiler are here, yet {missing} were not compiled: reinstall racecheck"
    assert native._built_from_these_sources(), "compiled engine is stale or partial: reinstall racecheck"
    kind, _, files = _run(SEEDS, pure=False)
    assert kind == "compiled"
    assert all(_is_extension(f) for f in files), files


def test_compiled_and_pure_engines_report_the_same_races():
    pure_kind, pure, _ = _run(SEEDS, pure=True)
    kind, default, files = _run(SEEDS, pure=False)
    assert pure_kind == "python"
    if _why_setup_compiles_nothing() is None:  # else both runs are the Python engine's
        assert kind == "compiled" and all(_is_extension(f) for f in files), files
    assert sum(len(reports) for reports, _ in pure) > 100  # the traces do race
    assert default == pure, f"the {kind} engine differs from the pure-Python one"
