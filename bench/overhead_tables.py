"""The tables of bench/detector_overhead_native.py: medians of its runs per workload, mode and
placement (unpinned runs first, then those pinned to --cpus), each mode's slowdown over the plain
step, and where the native path's time goes.

Writes DIR/detector_overhead_native.csv (workload, optimizer, mode, pinned, ms_median, slowdown,
runs; the modes plain, native, python and sanitizer), DIR/detector_overhead_native_runs.csv (every
run) and DIR/detector_overhead_native.md.

Part of bench/detector_overhead_native.py, which regenerates reports/gpu/detector_overhead_native.*.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from overhead_workloads import OLD_NAMES, OPTIMIZERS, WORKLOADS, describe, step_name

MODES = (
    "plain",
    "native",
    "python",
    "sanitizer",
    "native_hooks_args",
    "native_hooks",
    "native_record",
    "native_nostacks",
    "native_pyengine",
    "dispatch_floor",
    "python_nostacks",
)
TABLE_MODES = ("plain", "native", "python", "sanitizer")  # detector_overhead_native.csv's (its contract)
# Measured inside a native run, per timed step: the log's callbacks (record; of them, taking the
# GIL back and walking the stack), and Python's drains of the log (applying its records).
PARTS = ("record_us", "gil_us", "walk_us", "drain_us", "stacks_per_step", "frames_per_stack", "observed_per_step",
         "recorded_per_step")  # fmt: skip
RUN_FIELDS = ("workload", "optimizer", "mode", "pinned", "repeat", "iters", "ms_per_step", "reports", "path", "engine",
              "ops", "errors", "torch", "device", "cpus", *PARTS)  # fmt: skip


# Columns that only the runs measured since they were added note, each placed after its neighbour:
# a run's place in its round, the seconds its process took from its start to its result, two
# parts measured inside a native run: CUDA's trace callbacks (the frees' stacks among them) and
# turning RecordFunction off and on around callees, how often a native run asked CUDA whether
# host memory is pinned, and what became of the calls that made no record (UNRECORDED).
#
# What became of the calls RecordFunction showed the log that made no record, per step (op_log.cpp's
# Seen): callees of a recorded call, seen before RecordFunction was turned off around them;
# transparent operators, whose callees are recorded in their place; operators that touch no tensor
# data (views, empty tensors); the host's own calls on host memory that make no record.
UNRECORDED = ("callees_per_step", "transparent_per_step", "skipped_per_step", "host_only_per_step")
NOTED_FIELDS = (
    ("position", "repeat"), ("run_s", "ms_per_step"), ("switch_us", "drain_us"), ("trace_us", "drain_us"),
    ("asked_per_step", "recorded_per_step"), *zip(UNRECORDED, ("observed_per_step", *UNRECORDED[:-1]), strict=True),
)  # fmt: skip
LATER_PARTS = ("trace_us", "switch_us")


def placement(run: dict) -> str:
    return "pinned" if run.get("cpus") else "unpinned"


def measured(rows: list[dict]) -> list[dict]:
    """The runs that count: those with a time, from the measured repeats (not the warm-up rounds)."""
    return [r for r in rows if r.get("ms_per_step") and r["repeat"] >= 0]


def medians(rows: list[dict]) -> dict[tuple[str, str, str], float]:
    """Per (placement, workload, mode): the median time per step."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in measured(rows):
        groups.setdefault((placement(r), r["workload"], r["mode"]), []).append(r["ms_per_step"])
    return {key: statistics.median(v) for key, v in groups.items()}


def run_counts(rows: list[dict]) -> dict[tuple[str, str, str], int]:
    """Per (placement, workload, mode): how many measured runs its median is of."""
    counts: dict[tuple[str, str, str], int] = {}
    for r in measured(rows):
        k = (placement(r), r["workload"], r["mode"])
        counts[k] = counts.get(k, 0) + 1
    return counts


def paired(rows: list[dict]) -> dict[tuple[str, str, str], float]:
    """Per (placement, workload, mode): the median over rounds of its time over plain's in the same
    round (call, repeat and placement), which leaves out the drift between rounds both runs share."""
    runs = measured(rows)
    key = lambda r: (r.get("call"), r["repeat"], placement(r), r["workload"])  # noqa: E731
    plain = {key(r): r["ms_per_step"] for r in runs if r["mode"] == "plain"}
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for r in runs:
        base = plain.get(key(r))
        if base:
            ratios.setdefault((placement(r), r["workload"], r["mode"]), []).append(r["ms_per_step"] / base)
    return {k: statistics.median(v) for k, v in ratios.items()}


def write_runs(out: Path, rows: list[dict]) -> None:
    with open(out / "detector_overhead_native_runs.csv", "w", newline="") as fh:
        fields = [*(["call"] if any("call" in r for r in rows) else []), *RUN_FIELDS]
        for field, after in NOTED_FIELDS:
            if any(r.get(field) not in (None, "") for r in rows):
                fields.insert(fields.index(after) + 1, field)
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "pinned": r.get("cpus") or "no", "errors": " | ".join(map(str, r.get("errors") or []))})


def write_summary(out: Path, rows: list[dict]) -> None:
    med, counts = medians(rows), run_counts(rows)
    pins = {placement(r): r.get("cpus") or "no" for r in measured(rows)}
    with open(out / "detector_overhead_native.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["workload", "optimizer", "mode", "pinned", "ms_median", "slowdown", "runs"])
        for where in ("unpinned", "pinned"):
            for name, work in WORKLOADS.items():
                base = med.get((where, name, "plain"))
                for mode in TABLE_MODES:
                    m = med.get((where, name, mode))
                    if m is not None:
                        slowdown = f"{m / base:.2f}" if base else ""
                        w.writerow([work.model, work.optimizer, mode, pins[where], f"{m:.3f}", slowdown,
                                    counts[(where, name, mode)]])  # fmt: skip


def _split(where: str, name: str, rows: list[dict], med: dict) -> list[str]:
    """Where the native path's time goes: the parts' modes that ran (differences of medians), and
    what the native runs measured inside themselves."""
    part = {mode: med.get((where, name, mode)) for mode in MODES}
    base, lines = part["plain"], []
    # Each part mode adds one thing to the one before it; a part whose mode did not run is told
    # with the next one that did.
    steps = {"native_hooks": "PyTorch's hooks alone", "native_record": "recording", "native": "applying the records"}
    if part["native_hooks_args"] is not None:  # the hooks split: the calls' arguments, then their results
        steps = {"native_hooks_args": "PyTorch's hooks taking the calls' arguments", "native_hooks": "their results",
                 **{m: label for m, label in steps.items() if m != "native_hooks"}}  # fmt: skip
    if base is not None and part["native"] is not None and any(part[m] is not None for m in steps if m != "native"):
        diffs, before, untold = [], base, []
        for mode, label in steps.items():
            untold.append(label)
            if part[mode] is not None:
                diffs.append((" and ".join(untold), part[mode] - before))
                before, untold = part[mode], []
        if part["native_nostacks"] is not None:
            diffs.append(("stacks (in recording and applying)", part["native"] - part["native_nostacks"]))
        lines.append(
            f"Where the native path's {part['native'] - base:.3f} ms per step go (differences of the medians): "
            + ", ".join(f"{label} {d:.3f}" for label, d in diffs)
            + "."
        )
    inside = [r for r in measured(rows) if (placement(r), r["workload"], r["mode"]) == (where, name, "native")]
    inside = [r for r in inside if all(r.get(k) not in (None, "") for k in PARTS)]  # runs that measured them all
    if inside and base is not None and part["native"] is not None:
        mid = {k: statistics.median(float(r[k]) for r in inside) for k in PARTS}
        record, stacks, drain = mid["record_us"] / 1e3, (mid["gil_us"] + mid["walk_us"]) / 1e3, mid["drain_us"] / 1e3
        rest = part["native"] - base - record - drain
        later, left_out = "", "the callbacks' clocks leave out (the stacks read at frees among it)"
        trace, switch = (_noted_median(inside, k) for k in LATER_PARTS)
        if trace is not None and switch is not None:
            trace, switch = trace / 1e3, switch / 1e3
            rest -= trace + switch
            later = (
                f"; CUDA's trace callbacks (the frees' stacks among them) {trace:.3f}; turning RecordFunction off and "
                f"on around the callees of recorded calls {switch:.3f}"
            )
            left_out = "the clocks leave out"
        lines.append(
            f"Measured inside the native runs (medians, ms per step): recording (the log's callbacks) {record:.3f}; "
            f"Python stacks, read in those callbacks and at CUDA's frees, {stacks:.3f} ({mid['stacks_per_step']:.0f} "
            f"walked, {mid['frames_per_stack']:.0f} frames each); applying the records (the drains) {drain:.3f}"
            f"{later}; the rest of the native path's {part['native'] - base:.3f} ms over plain, PyTorch's hooks "
            f"(RecordFunction boxing every operator's arguments, CUDA's trace) and what {left_out}, {rest:.3f}. "
            f"RecordFunction showed the log {mid['observed_per_step']:.0f} calls per step, "
            f"{mid['recorded_per_step']:.0f} of them recorded{_asked(inside)}.{_unrecorded(inside)}"
        )
    return lines


def _noted_median(runs: list[dict], key: str) -> float | None:
    """The median of a column over runs, where every one of them noted it (NOTED_FIELDS)."""
    if not runs or any(r.get(key) in (None, "") for r in runs):
        return None
    return statistics.median(float(r[key]) for r in runs)


def _asked(inside: list[dict]) -> str:
    """How often a step asked CUDA whether host memory is pinned, where every native run noted it."""
    asked = _noted_median(inside, "asked_per_step")
    return "" if asked is None else f", and CUDA was asked {asked:.0f} times whether host memory is pinned"


def _unrecorded(inside: list[dict]) -> str:
    """What became of the calls that made no record (UNRECORDED), where every native run noted it."""
    counts = [_noted_median(inside, field) for field in UNRECORDED]
    if None in counts:
        return ""
    callees, transparent, skipped, host_only = counts
    return (
        f" Of the others, {callees:.0f} were callees of recorded calls seen before RecordFunction was turned off "
        f"around them, {transparent:.0f} transparent operators (their callees recorded in their place), "
        f"{skipped:.0f} operators that touch no tensor data (views, empty tensors) and {host_only:.0f} the host's "
        "own calls on host memory: RecordFunction boxed the arguments and results of each."
    )


def _workload_table(where: str, name: str, rows: list[dict], args) -> list[str]:
    med, pairs = medians(rows), paired(rows)
    base = med.get((where, name, "plain"))
    if base is None:
        return []
    lines = [
        f"### {name}: {describe(name, args)}",
        "",
        "| mode | ms per step (median) | slowdown | paired | runs | every run (ms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in MODES:
        runs = sorted(
            r["ms_per_step"] for r in measured(rows) if (placement(r), r["workload"], r["mode"]) == (where, name, mode)
        )
        m = med.get((where, name, mode))
        if m is not None:
            pair = pairs.get((where, name, mode))
            lines.append(
                f"| {mode} | {m:.3f} | {m / base:.2f}x | {f'{pair:.2f}x' if pair else ''} | {len(runs)} | "
                f"{', '.join(f'{t:.2f}' for t in runs)} |"
            )
    notes = _split(where, name, rows, med) + _run_seconds(where, name, rows)  # a paragraph each
    return [*lines, *(line for note in notes for line in ("", note)), ""]


def _run_seconds(where: str, name: str, rows: list[dict]) -> list[str]:
    """How long a run's process took, start to result (warm-up steps, compiling, teardown of its
    tools included), per mode: what a round costs a call's budget. Runs that note it only."""
    took: dict[str, list[float]] = {}
    for r in measured(rows):
        if (placement(r), r["workload"]) == (where, name) and r.get("run_s") not in (None, ""):
            took.setdefault(r["mode"], []).append(float(r["run_s"]))
    if not took:
        return []
    each = ", ".join(f"{mode} {statistics.median(took[mode]):.1f}" for mode in MODES if mode in took)
    return [f"A run's process took, from its start to its result (medians, s): {each}."]


README_START, README_END = "<!-- detector-overhead:start -->", "<!-- detector-overhead:end -->"


def readme_table(rows: list[dict], args) -> list[str]:
    """The README's table: per placement (unpinned first) and workload, plain's median time and each
    tool's, with its slowdown (the ratio of the medians) and its paired ratio; `runs` counts the
    runs behind each median (a range where the modes' counts differ)."""
    med, pairs, counts = medians(rows), paired(rows), run_counts(rows)
    lines = [
        "| step | optimizer | runs | plain (ms) | native | python | torch.cuda._sanitizer |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for where in ("unpinned", "pinned"):
        for name, work in WORKLOADS.items():
            base = med.get((where, name, "plain"))
            if base is None:
                continue
            cells, n = [], {counts[(where, name, "plain")]}
            for mode in ("native", "python", "sanitizer"):
                m = med.get((where, name, mode))
                if m is None:
                    cells.append("")
                    continue
                n.add(counts[(where, name, mode)])
                pair = pairs.get((where, name, mode))
                cells.append(f"{m:.3f} ({m / base:.2f}x" + (f", paired {pair:.2f}x)" if pair else ")"))
            runs = f"{min(n)}" if len(n) == 1 else f"{min(n)} to {max(n)}"
            lines.append(f"| {step_name(name, args)} | {OPTIMIZERS[work.optimizer]} | {where}, {runs} | {base:.3f} | "
                         + " | ".join(cells) + " |")  # fmt: skip
    return lines


def order_note(rows: list[dict]) -> str:
    """How the modes were ordered within a round, as far as the runs say (runs from before the
    order was rotated note no `position`)."""
    noted = [r.get("position") not in (None, "") for r in measured(rows)]
    if noted and all(noted):
        return ", in an order rotated from round to round"
    if any(noted):
        return ", in an order rotated from round to round in the runs that note their place in it (`position`)"
    return ""


def write_markdown(out: Path, rows: list[dict], args) -> list[str]:
    meta = next((r for r in rows if r.get("device")), {})
    steps = sorted({(r["workload"], r["mode"], r.get("iters")) for r in measured(rows) if r.get("iters")})
    fewer = sorted({f"{w} {m}: {i}" for w, m, i in steps if m == "sanitizer" and str(i) != str(args.iters)})
    lines = [
        "# Detector overhead: the native and the Python recording path, and torch.cuda._sanitizer",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}. Medians of fresh-process runs, every "
        f"mode of every workload interleaved within a round{order_note(rows)}; warm-up rounds (repeat < 0 in the runs "
        "CSV) left out. "
        f"{args.warmup} warm-up steps and {args.iters} timed ones per run ({args.fsdp2_iters} for the FSDP2 "
        "workloads)" + (f"; the sanitizer's runs time fewer ({'; '.join(fewer)})" if fewer else "") + ". "
        "Slowdown: the ratio of the medians; paired: the median over rounds of a run's time over plain's in its round.",
        "",
    ]
    for where in ("unpinned", "pinned"):
        here = [r for r in measured(rows) if placement(r) == where]
        if not here:
            continue
        cpus = sorted({str(r["cpus"]) for r in here if r.get("cpus")})
        lines += [f"## {where.capitalize()} runs" + (f" (CPUs {' / '.join(cpus)})" if cpus else ""), ""]
        for name in WORKLOADS:
            lines += _workload_table(where, name, rows, args)
    (out / "detector_overhead_native.md").write_text("\n".join(lines))
    return lines


def write_outputs(out: Path, rows: list[dict], args) -> list[str]:
    write_runs(out, rows)
    write_summary(out, rows)
    return write_markdown(out, rows, args)


def false_alarms(rows: list[dict]) -> list[str]:
    """One line per workload and mode whose runs reported races: every step measured here is
    correct code, so a report is a false alarm, whatever the timings say."""
    found: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if int(r.get("reports") or 0):  # runs read back from a CSV hold "" or a number's text
            found.setdefault((r["workload"], r["mode"]), []).append(int(r["reports"]))
    return [
        f"FALSE ALARM: {mode} reported races on the correct {workload} step in {len(n)} run(s) ({max(n)} at most)"
        for (workload, mode), n in sorted(found.items())
    ]


def read_runs(paths: list[Path]) -> list[dict]:
    """Every run of the runs CSVs; a CSV without a `call` column is one call, numbered after the
    calls read before it. Runs from before the optimizer was a column take their workload's."""
    rows: list[dict] = []
    for path in paths:
        with open(path, newline="") as fh:
            runs = list(csv.DictReader(fh))
        numbered = [int(r["call"]) for r in rows if str(r.get("call", "")).isdigit()]
        call = str(max(numbered, default=0) + 1)
        for r in runs:
            name = OLD_NAMES.get(r["workload"], r["workload"])
            rows.append(
                {
                    **r,
                    "workload": name,
                    "optimizer": WORKLOADS[name].optimizer,
                    "call": r.get("call") or call,
                    "repeat": int(r["repeat"]),
                    "ms_per_step": float(r["ms_per_step"]) if r["ms_per_step"] else None,
                    "errors": [e for e in r["errors"].split(" | ") if e],
                }
            )
    return rows
