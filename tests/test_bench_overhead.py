"""The detector-overhead benchmark's tables without a GPU (bench/overhead_tables.py): medians per
workload, mode and placement, the unpinned runs first, each row with its optimizer, and runs
CSVs from before the optimizer was a column read with the workloads they ran; and the split of
bench/detector_instructions.py's instruction counts into the native path's parts."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tables():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import overhead_tables

        yield overhead_tables
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _args(**extra) -> argparse.Namespace:
    sizes = dict(layers=8, width=2048, batch=64, fsdp2_layers=4, fsdp2_width=512, fsdp2_heads=8, fsdp2_batch=8,
                 fsdp2_seq=256, compile_backend="inductor")  # fmt: skip
    return argparse.Namespace(warmup=5, iters=60, fsdp2_iters=20, **sizes, **extra)


def _run(workload, mode, repeat, ms, cpus="", iters=60) -> dict:
    return {"workload": workload, "optimizer": "adamw", "mode": mode, "repeat": repeat, "ms_per_step": ms,
            "cpus": cpus, "iters": iters, "errors": []}  # fmt: skip


def test_the_tables_put_the_unpinned_runs_first_with_their_optimizer(tables, tmp_path):
    rows = [_run("mlp-adamw", "plain", -1, 100.0)]  # a warm-up run: left out
    for repeat, (plain, native, sanitizer) in enumerate([(2.0, 2.4, 20.0), (2.2, 2.6, 22.0), (2.1, 3.0, 30.0)]):
        rows += [_run("mlp-adamw", "plain", repeat, plain), _run("mlp-adamw", "native", repeat, native),
                 _run("mlp-adamw", "sanitizer", repeat, sanitizer, iters=15)]  # fmt: skip
    rows += [_run("mlp-adamw", "plain", 0, 1.0, cpus="4-7"), _run("mlp-adamw", "native", 0, 1.5, cpus="4-7")]
    lines = tables.write_outputs(tmp_path, rows, _args())
    with open(tmp_path / "detector_overhead_native.csv", newline="") as fh:
        got = list(csv.reader(fh))
    assert got == [
        ["workload", "optimizer", "mode", "pinned", "ms_median", "slowdown", "runs"],
        ["mlp", "adamw", "plain", "no", "2.100", "1.00", "3"],
        ["mlp", "adamw", "native", "no", "2.600", "1.24", "3"],
        ["mlp", "adamw", "sanitizer", "no", "22.000", "10.48", "3"],
        ["mlp", "adamw", "plain", "4-7", "1.000", "1.00", "1"],
        ["mlp", "adamw", "native", "4-7", "1.500", "1.50", "1"],
    ]
    text = "\n".join(lines)
    assert text.index("## Unpinned runs") < text.index("## Pinned runs (CPUs 4-7)")
    assert "the sanitizer's runs time fewer (mlp-adamw sanitizer: 15)" in text
    assert "| native | 2.600 | 1.24x | 1.20x | 3 |" in text  # paired: the median of 1.2, 1.18 and 1.43


def test_runs_from_before_the_optimizer_column_keep_the_workloads_they_ran(tables, tmp_path):
    old = tmp_path / "old_runs.csv"
    old.write_text(
        "workload,mode,repeat,ms_per_step,reports,path,engine,ops,errors,torch,device,cpus\n"
        "mlp,plain,0,1.8,,,,,,2.11,H200,4-7\n"
        "mlp,native,0,2.4,0,native,compiled,100,,2.11,H200,4-7\n"
        "fsdp2,plain,0,17.0,,,,,,2.11,H200,\n"
    )
    rows = tables.read_runs([old])
    assert [(r["workload"], r["optimizer"], r["call"]) for r in rows] == [
        ("mlp-sgd", "sgd", "1"),
        ("mlp-sgd", "sgd", "1"),
        ("fsdp2-adamw", "adamw", "1"),
    ]
    tables.write_outputs(tmp_path, rows, _args())
    with open(tmp_path / "detector_overhead_native.csv", newline="") as fh:
        got = [row[:5] for row in csv.reader(fh)][1:]
    assert got == [["fsdp2", "adamw", "plain", "no", "17.000"], ["mlp", "sgd", "plain", "4-7", "1.800"],
                   ["mlp", "sgd", "native", "4-7", "2.400"]]  # fmt: skip


def test_the_modes_order_rotates_so_that_each_mode_runs_once_in_each_place(tables, tmp_path):
    """A round's modes run in an order rotated by one from the round before: over as many rounds as
    modes, each mode runs once in each place of its round (none always first after the previous
    workload's last run); the table says so where every run notes its place, and only then."""
    import detector_overhead_native as bench

    modes = ["plain", "native", "python", "sanitizer"]
    orders = [bench.round_order(modes, i) for i in range(len(modes))]
    assert all(sorted(order) == sorted(modes) for order in orders)
    assert [{order[place] for order in orders} for place in range(len(modes))] == [set(modes)] * len(modes)
    assert bench.round_order(modes, len(modes)) == modes and bench.round_order([], 3) == []

    rows = [{**_run("mlp-adamw", m, r, 2.0), "position": p} for r, o in enumerate(orders) for p, m in enumerate(o)]
    assert "interleaved within a round, in an order rotated from round to round;" in "\n".join(
        tables.write_outputs(tmp_path, rows, _args())
    )
    with open(tmp_path / "detector_overhead_native_runs.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header[header.index("repeat") + 1] == "position"
    old = [_run("mlp-adamw", m, 0, 2.0) for m in modes]  # from before the order rotated: no position
    assert "interleaved within a round;" in "\n".join(tables.write_outputs(tmp_path, old, _args()))
    assert "in the runs that note their place in it" in "\n".join(tables.write_outputs(tmp_path, old + rows, _args()))


def test_the_runs_note_how_long_each_process_took_and_the_tables_give_its_median(tables, tmp_path):
    """A run's seconds from its process's start to its result (what a round costs a call's budget):
    a column after ms_per_step, read back from the CSV, and a line of medians per mode under the
    workload's table; runs from before it was measured have neither."""
    took = {"plain": (3.0, 5.0, 4.0), "native": (6.0, 7.0, 8.0)}
    rows = [{**_run("mlp-adamw", m, r, 2.0), "run_s": took[m][r]} for m in took for r in range(3)]
    rows.append({**_run("mlp-adamw", "native", -1, 9.0), "run_s": 99.0})  # a warm-up run: left out
    md = "\n".join(tables.write_outputs(tmp_path, rows, _args()))
    assert "A run's process took, from its start to its result (medians, s): plain 4.0, native 7.0." in md
    runs_csv = tmp_path / "detector_overhead_native_runs.csv"
    with open(runs_csv, newline="") as fh:
        header = next(csv.reader(fh))
    assert header[header.index("ms_per_step") + 1] == "run_s"
    again = tables.write_outputs(tmp_path, tables.read_runs([runs_csv]), _args())
    assert "\n".join(again) == md
    old = [_run("mlp-adamw", m, 0, 2.0) for m in took]
    assert "A run's process took" not in "\n".join(tables.write_outputs(tmp_path, old, _args()))
    with open(runs_csv, newline="") as fh:
        assert "run_s" not in next(csv.reader(fh))


def test_the_split_tells_each_part_mode_against_the_one_before_and_the_hooks_arguments_apart(tables, tmp_path):
    """`Where the native path's time goes`: each part mode's median less the one before it that ran;
    with native_hooks_args, the hooks' cost split into the calls' arguments and their results; a part
    whose mode did not run is told with the next one that did."""
    medians = {"plain": 2.0, "native_hooks_args": 2.3, "native_hooks": 2.5, "native_record": 2.6, "native": 2.8}

    def split(modes):
        rows = [_run("mlp-adamw", m, 0, medians[m]) for m in modes]
        found = [x for x in tables.write_outputs(tmp_path, rows, _args()) if x.startswith("Where the native path's")]
        return found[0] if found else None

    assert split(medians) == (
        "Where the native path's 0.800 ms per step go (differences of the medians): PyTorch's hooks taking the calls' "
        "arguments 0.300, their results 0.200, recording 0.100, applying the records 0.200."
    )
    assert split(["plain", "native_hooks_args", "native_hooks", "native"]).endswith(
        "PyTorch's hooks taking the calls' arguments 0.300, their results 0.200, recording and applying the records "
        "0.300."
    )
    assert split(["plain", "native_hooks_args", "native"]).endswith(
        "PyTorch's hooks taking the calls' arguments 0.300, their results and recording and applying the records 0.500."
    )
    assert split(["plain", "native_hooks", "native_record", "native"]).endswith(
        "PyTorch's hooks alone 0.500, recording 0.100, applying the records 0.200."
    )
    assert split(["plain", "native"]) is None  # no part measured: nothing to split


def test_the_parts_measured_inside_the_native_runs_tell_the_stacks_apart_from_recording(tables, tmp_path):
    """The stacks a native run reads are timed wherever they are read: in the log's callbacks and at
    CUDA's frees, outside them. The line says so rather than counting them within recording, and
    the rest over plain holds those read at frees."""
    parts = {"record_us": 200.0, "gil_us": 30.0, "walk_us": 60.0, "drain_us": 100.0, "stacks_per_step": 126.0,
             "frames_per_stack": 7.0, "observed_per_step": 338.0, "recorded_per_step": 57.0}  # fmt: skip
    rows = [_run("mlp-adamw", "plain", 0, 3.0), {**_run("mlp-adamw", "native", 0, 3.8), **parts}]
    (line,) = [x for x in tables.write_outputs(tmp_path, rows, _args()) if x.startswith("Measured inside")]
    assert line == (
        "Measured inside the native runs (medians, ms per step): recording (the log's callbacks) 0.200; Python "
        "stacks, read in those callbacks and at CUDA's frees, 0.090 (126 walked, 7 frames each); applying the "
        "records (the drains) 0.100; the rest of the native path's 0.800 ms over plain, PyTorch's hooks "
        "(RecordFunction boxing every operator's arguments, CUDA's trace) and what the callbacks' clocks leave out "
        "(the stacks read at frees among it), 0.500. RecordFunction showed the log 338 calls per step, 57 of them "
        "recorded."
    )
    # runs that also timed CUDA's trace callbacks and the switches around callees: told, and out of the rest
    later = {"trace_us": 70.0, "switch_us": 30.0}
    rows = [_run("mlp-adamw", "plain", 0, 3.0), {**_run("mlp-adamw", "native", 0, 3.8), **parts, **later}]
    (line,) = [x for x in tables.write_outputs(tmp_path, rows, _args()) if x.startswith("Measured inside")]
    assert (
        "(the drains) 0.100; CUDA's trace callbacks (the frees' stacks among them) 0.070; turning RecordFunction off "
        "and on around the callees of recorded calls 0.030; the rest of the native path's 0.800 ms over plain, "
        "PyTorch's hooks (RecordFunction boxing every operator's arguments, CUDA's trace) and what the clocks leave "
        "out, 0.400." in line
    )
    with open(tmp_path / "detector_overhead_native_runs.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header[header.index("drain_us") + 1 :][:2] == ["trace_us", "switch_us"]
    assert "asked_per_step" not in header and "asked" not in line
    # runs that also counted the questions to CUDA whether host memory is pinned: told after the calls
    rows = [_run("mlp-adamw", "plain", 0, 3.0), {**_run("mlp-adamw", "native", 0, 3.8), **parts, "asked_per_step": 4.0}]
    (line,) = [x for x in tables.write_outputs(tmp_path, rows, _args()) if x.startswith("Measured inside")]
    assert line.endswith(
        "338 calls per step, 57 of them recorded, and CUDA was asked 4 times whether host memory is pinned."
    )
    with open(tmp_path / "detector_overhead_native_runs.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header[header.index("recorded_per_step") + 1] == "asked_per_step"
    # runs that also counted what became of the calls that made no record: told after the questions,
    # and in the runs CSV after the calls observed
    unrecorded = {"callees_per_step": 11.0, "transparent_per_step": 60.0, "skipped_per_step": 200.0,
                  "host_only_per_step": 10.0}  # fmt: skip
    native = {**_run("mlp-adamw", "native", 0, 3.8), **parts, "asked_per_step": 0.0, **unrecorded}
    (line,) = [
        x for x in tables.write_outputs(tmp_path, [_run("mlp-adamw", "plain", 0, 3.0), native], _args())
        if x.startswith("Measured inside")
    ]  # fmt: skip
    assert line.endswith(
        "57 of them recorded, and CUDA was asked 0 times whether host memory is pinned. Of the others, 11 were callees "
        "of recorded calls seen before RecordFunction was turned off around them, 60 transparent operators (their "
        "callees recorded in their place), 200 operators that touch no tensor data (views, empty tensors) and 10 the "
        "host's own calls on host memory: RecordFunction boxed the arguments and results of each."
    )
    with open(tmp_path / "detector_overhead_native_runs.csv", newline="") as fh:
        header = next(csv.reader(fh))
    at = header.index("observed_per_step")
    assert header[at : at + 7] == ["observed_per_step", *unrecorded, "recorded_per_step", "asked_per_step"]


def test_a_report_on_the_correct_steps_is_named_a_false_alarm(tables):
    """Every step the benchmark times is correct code: a detector report there is a false alarm,
    which the run prints and fails on (a call once reported 10 races a run on the FSDP2 steps, and
    only its log said so)."""
    rows = [{**_run("fsdp2-adamw", "native", r, 20.0), "reports": n} for r, n in enumerate((10, 0, 10))]
    rows += [
        {**_run("mlp-adamw", "python", 0, 5.0), "reports": 0},
        {**_run("mlp-adamw", "plain", 0, 2.0), "reports": ""},
    ]
    assert tables.false_alarms(rows) == [
        "FALSE ALARM: native reported races on the correct fsdp2-adamw step in 2 run(s) (10 at most)"
    ]
    assert tables.false_alarms(rows[1:2] + rows[3:]) == []


def test_the_instruction_counts_split_the_native_paths_added_instructions_into_parts_that_add_up(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import detector_instructions as di
    finally:
        sys.path.remove(str(ROOT / "bench"))
    listing = """
    9,000,000 (90.00%)  ???:main [/usr/bin/python3]
    3,000,000 (30.00%)  ???:(anonymous namespace)::on_start(at::RecordFunction const&) [/cache/_op_log.so]
    1,000,000 (10.00%)  ???:(anonymous namespace)::on_end(at::RecordFunction const&, at::ObserverContext*) [/c/x.so]
      500,000 ( 5.00%)  ???:(anonymous namespace)::drain_if_full() [/cache/_op_log.so]
      100,000 ( 1.00%)  ???:(anonymous namespace)::py_drain(_object*, _object*) [/cache/_op_log.so]
      700,000 ( 7.00%)  ???:(anonymous namespace)::engine_apply(_object*, _object*) [/cache/_op_log.so]
      900,000 ( 9.00%)  ???:at::enableRecordFunction(bool) [/torch/lib/libtorch_cpu.so]
      400,000 ( 4.00%)  ???:(anonymous namespace)::stack_id() [/cache/_op_log.so]
"""
    native = {"total": 20e6, **di.inclusive(listing)}
    assert native["callbacks"] == 4e6 and native["drains"] == 8e5 and native["switches"] == 9e5
    counts = {"plain": {"total": 12e6}, "native": native}
    args = argparse.Namespace(detector="native", rev=None, fsdp2_width=32, width=64, batch=64, few=2, more=12)
    parts = dict(di.native_parts(counts))
    callbacks = "the log's callbacks, less the drains they call"
    assert parts[callbacks] == 3.5e6  # less the drain called from a callback
    rest = [v for k, v in parts.items() if k.startswith("RecordFunction's work")]
    assert rest == [8e6 - 3.5e6 - 8e5]  # what is added, less the callbacks' own and every drain
    lines = di.native_lines([("HEAD", {"fsdp2-adamw": counts})], args)
    assert "Plain step 12.00 M instructions, with the native detector 20.00 M (+66.7%)." in lines
    assert f"| {callbacks} | 3.50 | 44% |" in lines
    di.write_native_csv(tmp_path, [("HEAD", {"fsdp2-adamw": counts})])
    with (tmp_path / "detector_instructions_native.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert [row[k] for k in ("plain", "native", "callbacks", "stacks")] == ["12000000", "20000000", "4000000", "400000"]


def test_a_native_run_counts_as_recorded_the_calls_that_made_a_record(monkeypatch):
    """The log's costs() counts in `seen` every call recorded from its start, and in `host_only`
    those of them that made no record at their end (op_log.cpp's [Note: the host's own calls]): a
    run's recorded_per_step is the calls that made a record. Counts from before `host_only` read as
    none left out; the trace callbacks' and the switches' times are per step where the log gives them."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository and bench/ first
    spec = importlib.util.spec_from_file_location("overhead_native", ROOT / "bench" / "detector_overhead_native.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    parts = {"record": (0, 0), "gil": (0, 0), "walk": (0, 0), "drain": (0, 0), "frames": 0}
    later = {"trace": (0, 0), "switch": (0, 0)}
    before = {**parts, **later, "seen": (0, 0, 0, 0), "host_only": 4, "pinned_asked": 3}
    after = {**parts, "trace": (7, 50_000), "switch": (4, 20_000), "seen": (10, 20, 30, 40), "host_only": 24,
             "pinned_asked": 43}  # fmt: skip
    got = bench._per_step(before, after, steps=10)
    assert got["observed_per_step"] == 10.0 and got["recorded_per_step"] == 2.0
    # the calls that made no record, by what became of them: they and the recorded add up to those observed
    unrecorded = [
        got[k] for k in ("callees_per_step", "transparent_per_step", "skipped_per_step", "host_only_per_step")
    ]
    assert unrecorded == [1.0, 2.0, 3.0, 2.0] and sum(unrecorded) + got["recorded_per_step"] == got["observed_per_step"]
    assert (got["trace_us"], got["switch_us"], got["asked_per_step"]) == (5.0, 2.0, 4.0)
    older = {k: v for k, v in after.items() if k not in ("host_only", "trace", "switch", "pinned_asked")}
    got = bench._per_step({**parts, "seen": (0, 0, 0, 0)}, older, steps=10)
    assert got["recorded_per_step"] == 4.0 and "trace_us" not in got and "asked_per_step" not in got
    assert "callees_per_step" not in got
