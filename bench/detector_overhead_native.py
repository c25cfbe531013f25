"""What race detection costs on a training step, with the tracker's two recording paths side by side
(needs one CUDA GPU): racecheck.detect.TorchRaceTracker on its native path (op_log.cpp) and on its
Python path (a TorchDispatchMode), and torch.cuda._sanitizer, against the step with no tool.

    python bench/detector_overhead_native.py --out reports/gpu
    python bench/detector_overhead_native.py --device cpu --workloads mlp --out /tmp/x   # a smoke run

Workloads: `mlp`, an MLP of --layers Linear(2048, 2048) + ReLU, batch 64, MSE, SGD with momentum
(bench/detector_overhead.py's loop); `fsdp2`, a transformer (--fsdp2-layers encoder layers of
width 1024) with torch.distributed.fsdp.fully_shard on every layer and the root, AdamW, on a
one-rank process group. Each (workload, mode, repeat) runs in a fresh process, modes interleaved
within a repeat, --warmup steps then --iters timed ones (CUDA synchronized around them). Before the
measured repeats, --warmup-rounds rounds of every (workload, mode) run the same way and are kept in
the runs CSV (repeat < 0) but left out of the medians: a machine just lent runs its first minutes
slower (on the H200 machine, in one call of four rounds, the first round's runs took 1.5x (plain)
to 2x (native) the time of the fourth's).

Modes: `plain` (no tool), `native`, `python`, `sanitizer`, and the parts that say where the time
goes: `native_hooks` (the hooks the native log uses, a RecordFunction observer with inputs and
outputs and c10's GPU trace, installed but recording nothing: what PyTorch charges before the log
does any work), `native_record` (the native log records every operator and CUDA trace event with its stack
and is drained, its records dropped), `native_nostacks` (the native path without stacks),
`dispatch_floor` (an empty TorchDispatchMode: the Python path's floor) and `python_nostacks`.
The split, per workload: the hooks = native_hooks - plain; recording = native_record - native_hooks
(or - plain without native_hooks); applying the records (the tracker's
bookkeeping and the engine's shadow updates) = native - native_record; of all that, stacks =
native - native_nostacks.

Writes DIR/detector_overhead_native.csv (workload, mode, ms_median, slowdown over plain; the modes
plain, native, python and sanitizer),
DIR/detector_overhead_native_runs.csv (every run) and DIR/detector_overhead_native.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = (
    "plain",
    "native",
    "python",
    "sanitizer",
    "native_hooks",
    "native_record",
    "native_nostacks",
    "dispatch_floor",
    "python_nostacks",
)
WORKLOADS = ("mlp", "fsdp2")
# The modes detector_overhead_native.csv holds (its contract); the parts are in the Markdown only.
TABLE_MODES = ("plain", "native", "python", "sanitizer")
# Measured inside a native run, per timed step: the log's callbacks (record; of them, taking the
# GIL back and walking the stack), and Python's drains of the log (applying its records).
PARTS = ("record_us", "gil_us", "walk_us", "drain_us", "stacks_per_step", "frames_per_stack")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workload(args, dev):
    """(step, what it is) for the workload, built on `dev`."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if args.workload == "mlp":
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        model = nn.Sequential(*layers).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)
        x = torch.randn(args.batch, args.width, device=dev)
        y = torch.randn(args.batch, args.width, device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        return step, describe(args, "mlp")
    from torch.distributed.fsdp import fully_shard

    width = args.fsdp2_width
    model = nn.Sequential(
        *[
            nn.TransformerEncoderLayer(width, 16, 4 * width, dropout=0.0, batch_first=True, device=dev)
            for _ in range(args.fsdp2_layers)
        ]
    )
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(args.fsdp2_batch, args.fsdp2_seq, width, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    return step, describe(args, "fsdp2")


def describe(args, workload: str) -> str:
    if workload == "mlp":
        return f"{args.layers}-layer {args.width}-wide MLP, batch {args.batch}, SGD with momentum"
    return (
        f"{args.fsdp2_layers}-layer width-{args.fsdp2_width} transformer, batch {args.fsdp2_batch} x "
        f"{args.fsdp2_seq}, FSDP2 (fully_shard per layer and root) on one rank, AdamW"
    )


def _tool(mode: str, cpu: bool):
    """The context the step runs under, and the tracker (or None)."""
    if mode == "plain":
        return None, None
    if mode == "sanitizer":
        import torch.cuda._sanitizer as csan

        csan.enable_cuda_sanitizer()  # for the whole process, as its documentation says
        return None, None
    if mode == "dispatch_floor":
        from torch.utils._python_dispatch import TorchDispatchMode

        class Floor(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, a=(), kw=None):
                return func(*a, **(kw or {}))

        return Floor(), None
    from racecheck.detect import TorchRaceTracker

    path = "python" if mode.startswith("python") else "native"
    kwargs = {"device_type": "cpu", "current_stream": lambda: 0, "stream_handle": lambda s: 0} if cpu else {}
    tracker = TorchRaceTracker(stacks_on=not mode.endswith("nostacks"), path=path, **kwargs)
    if mode == "native_record":  # recorded and drained, then dropped
        tracker._feed._apply = lambda records, items: None
    if mode == "native_hooks":  # the hooks installed by start(), then told to record nothing
        feed = tracker._feed
        start = feed.start

        def hooks_only():
            start()
            feed.log.record(False)

        feed.start = hooks_only
    if tracker._feed is not None:  # the log calls the feed's `drain` attribute: time it
        drain = tracker._feed.drain

        def timed_drain():
            t0 = time.perf_counter_ns()
            drain()
            tracker.drain_ns += time.perf_counter_ns() - t0

        tracker.drain_ns = 0
        tracker._feed.drain = timed_drain
    return tracker, tracker


def _costs(tracker) -> dict | None:
    """The native log's cost counters (op_log.cpp's costs()) and the drains' time so far."""
    if tracker is None or tracker._feed is None:
        return None
    return {**tracker._feed.log.costs(), "drain": (0, tracker.drain_ns)}


def _per_step(before: dict | None, after: dict | None, steps: int) -> dict:
    """Microseconds per step in each part of the native path between two _costs readings."""
    if before is None or after is None:
        return {}
    out = {
        f"{part}_us": (after[part][1] - before[part][1]) / steps / 1e3 for part in ("record", "gil", "walk", "drain")
    }
    stacks = after["walk"][0] - before["walk"][0]
    out["stacks_per_step"] = stacks / steps
    out["frames_per_stack"] = (after["frames"] - before["frames"]) / stacks if stacks else 0.0
    return out


def init_world(workload: str, cpu: bool) -> None:
    """The one-rank process group the fsdp2 workload runs in (gloo on the CPU, NCCL on CUDA)."""
    if workload != "fsdp2":
        return
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    if not cpu:
        torch.cuda.set_device(0)
    dist.init_process_group("gloo" if cpu else "nccl", rank=0, world_size=1)


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """The workloads' sizes (_workload reads them), for this script and bench/native_replay.py."""
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--fsdp2-layers", type=int, default=4)
    p.add_argument("--fsdp2-width", type=int, default=1024)
    p.add_argument("--fsdp2-batch", type=int, default=8)
    p.add_argument("--fsdp2-seq", type=int, default=256)


def child(args) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    cpu = args.device == "cpu"
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    init_world(args.workload, cpu)
    ctx, tracker = _tool(args.mode, cpu)
    if ctx is not None:
        ctx.__enter__()
    step, what = _workload(args, dev)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    for _ in range(args.warmup):
        step()
    sync()
    before = _costs(tracker)
    profile = None
    if args.profile:  # Python's profiler over the timed steps (its own cost makes the time incomparable)
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    sync()
    ms = (time.perf_counter() - t0) / args.iters * 1e3
    if profile is not None:
        import pstats

        profile.disable()
        with open(Path(args.profile) / f"profile-{args.workload}-{args.mode}.txt", "w") as fh:
            pstats.Stats(profile, stream=fh).sort_stats("tottime").print_stats(40)
    parts = _per_step(before, _costs(tracker), args.iters)
    result = {
        "workload": args.workload,
        "mode": args.mode,
        "ms_per_step": ms,
        "what": what,
        "torch": torch.__version__,
        "device": "cpu" if cpu else torch.cuda.get_device_name(0),
        **parts,
    }
    if ctx is not None:
        ctx.__exit__(None, None, None)
    if tracker is not None:
        from racecheck.detect import ENGINE

        result.update(
            reports=len(tracker.reports()),
            errors=tracker.errors[:3],
            path=tracker.path,
            engine=ENGINE,
            ops=tracker.ops,
            accesses=tracker.engine.accesses,
        )
    if args.workload == "fsdp2":
        import torch.distributed as dist

        dist.destroy_process_group()
    return result


def parse_cpus(spec: str | None) -> set[int]:
    """The CPUs of a list like `4-7` or `2,3,8-9` (none: no pinning)."""
    cpus: set[int] = set()
    for part in (spec or "").split(","):
        if part.strip():
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def paired(rows: list[dict]) -> dict[tuple[str, str], float]:
    """Per (workload, mode): the median over rounds of its time over plain's in the same round (the
    same call and repeat), which leaves out the drift between rounds that both runs of a round share."""
    runs = measured(rows)
    plain = {(r.get("call"), r["repeat"], r["workload"]): r["ms_per_step"] for r in runs if r["mode"] == "plain"}
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        base = plain.get((r.get("call"), r["repeat"], r["workload"]))
        if base:
            ratios.setdefault((r["workload"], r["mode"]), []).append(r["ms_per_step"] / base)
    return {key: statistics.median(v) for key, v in ratios.items()}


def run_child(args, workload: str, mode: str, path: Path) -> str | None:
    cmd = [sys.executable, __file__, "--child", "--workload", workload, "--mode", mode, "--json", str(path)]
    for name in ("device", "layers", "width", "batch", "warmup", "fsdp2_layers", "fsdp2_width"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    cmd += ["--iters", str(args.fsdp2_iters if workload == "fsdp2" else args.iters)]
    cmd += ["--fsdp2-batch", str(args.fsdp2_batch), "--fsdp2-seq", str(args.fsdp2_seq)]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    cpus = args.cpu_set
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=args.timeout,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # its threads inherit it
        )
    except subprocess.TimeoutExpired:
        return f"no result in {args.timeout:.0f} s"
    if proc.returncode != 0 or not path.exists():
        return " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
    return None


def measured(rows: list[dict]) -> list[dict]:
    """The runs that count: those with a time, from the measured repeats (not the warm-up rounds)."""
    return [r for r in rows if r.get("ms_per_step") and r["repeat"] >= 0]


def medians(rows: list[dict]) -> dict[tuple[str, str], float]:
    out = {}
    runs = measured(rows)
    for key in {(r["workload"], r["mode"]) for r in runs}:
        out[key] = statistics.median(r["ms_per_step"] for r in runs if (r["workload"], r["mode"]) == key)
    return out


def write_outputs(out: Path, rows: list[dict], args) -> list[str]:
    with open(out / "detector_overhead_native_runs.csv", "w", newline="") as fh:
        fields = [
            *(["call"] if any("call" in r for r in rows) else []),  # --from-runs: the call that ran it
            "workload",
            "mode",
            "repeat",
            "ms_per_step",
            "reports",
            "path",
            "engine",
            "ops",
            "errors",
            "torch",
            "device",
            "cpus",
            *PARTS,
        ]
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "errors": " | ".join(map(str, r.get("errors") or []))})
    med = medians(rows)
    with open(out / "detector_overhead_native.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["workload", "mode", "ms_median", "slowdown"])
        for workload in WORKLOADS:
            base = med.get((workload, "plain"))
            for mode in TABLE_MODES:
                m = med.get((workload, mode))
                if m is not None:
                    w.writerow([workload, mode, f"{m:.3f}", f"{m / base:.2f}" if base else ""])
    meta = next((r for r in rows if r.get("device")), {})
    warm = any(r["repeat"] < 0 for r in rows)
    pinned = sorted({str(r.get("cpus")) for r in measured(rows) if r.get("cpus")})
    by_round = paired(rows)
    lines = [
        "# Detector overhead: the native and the Python recording path",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}. {args.warmup} warm-up and "
        f"{args.iters} timed steps per run ({args.fsdp2_iters} for fsdp2), median of "
        + (f"{args.repeats} runs" if not args.from_runs else "every run listed (from several calls)")
        + " (fresh processes, modes interleaved within a call)"
        + (", its warm-up rounds (repeat < 0 in the runs CSV) left out" if warm else "")
        + (
            f"; runs pinned to CPUs {' / '.join(pinned)}"
            + (" (the runs CSV's `cpus` says which)." if any(not r.get("cpus") for r in measured(rows)) else ".")
            if pinned
            else "."
        )
        + " Slowdown: the ratio of the medians; paired: the median over rounds of a run's time over plain's in"
        " its round.",
        "",
    ]
    for workload in WORKLOADS:
        base = med.get((workload, "plain"))
        if base is None:
            continue
        what = next((r["what"] for r in rows if r["workload"] == workload and r.get("what")), workload)
        lines += [
            f"## {workload}: {what}",
            "",
            "| mode | ms per step (median) | slowdown | paired | every run (ms) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for mode in MODES:
            m = med.get((workload, mode))
            runs = sorted(r["ms_per_step"] for r in measured(rows) if (r["workload"], r["mode"]) == (workload, mode))
            if m is not None:
                pair = by_round.get((workload, mode))
                lines.append(
                    f"| {mode} | {m:.3f} | {m / base:.2f}x | {f'{pair:.2f}x' if pair else ''} | "
                    f"{', '.join(f'{t:.2f}' for t in runs)} |"
                )
        part = {mode: med.get((workload, mode)) for mode in MODES}
        native = [r for r in measured(rows) if (r["workload"], r["mode"]) == (workload, "native")]
        # The split, from the medians of the modes that ran: each part the difference of two of them.
        # (native_record and native needed; native_hooks and native_nostacks where they ran)
        names = {
            "native_hooks": "PyTorch's hooks alone",
            "native_record": "recording",
            "native": "applying the records",
        }
        chain = [m for m in names if part[m] is not None]
        times = [base] + [part[m] for m in chain]
        diffs = [(names[m], times[k + 1] - times[k]) for k, m in enumerate(chain)]
        if part["native_nostacks"] is not None and part["native"] is not None:
            diffs.append(("stacks (in recording and applying)", part["native"] - part["native_nostacks"]))
        if part["native"] is not None and part["native_record"] is not None:
            if min(d for _, d in diffs) < 0:
                spread = [r["ms_per_step"] for r in native]
                lines += [
                    "",
                    f"The native path's parts are within the runs' spread here (its runs span {min(spread):.2f} "
                    f"to {max(spread):.2f} ms): more repeats are needed to split them.",
                ]
            else:
                lines += [
                    "",
                    f"Where the native path's {part['native'] - base:.3f} ms per step go (differences of the "
                    "medians): " + ", ".join(f"{name} {d:.3f}" for name, d in diffs) + ".",
                ]
        inside = [r for r in native if r.get("record_us")]
        if inside:
            mid = {k: statistics.median(float(r[k]) for r in inside) for k in PARTS}
            lines += [
                "",
                f"Measured inside the native runs (medians, per step): the log's callbacks "
                f"{mid['record_us'] / 1e3:.3f} ms, of which taking the GIL back {mid['gil_us'] / 1e3:.3f} and "
                f"walking {mid['stacks_per_step']:.0f} stacks of {mid['frames_per_stack']:.0f} frames "
                f"{mid['walk_us'] / 1e3:.3f}; applying the records (the drains) {mid['drain_us'] / 1e3:.3f} ms.",
            ]
        if part["python"] is not None and part["dispatch_floor"] is not None and part["python_nostacks"] is not None:
            lines.append(
                f"The Python path's {part['python'] - base:.3f} ms: dispatch floor "
                f"{part['dispatch_floor'] - base:.3f}, "
                f"stacks {part['python'] - part['python_nostacks']:.3f}, the rest "
                f"{part['python_nostacks'] - part['dispatch_floor']:.3f}."
            )
        lines.append("")
    (out / "detector_overhead_native.md").write_text("\n".join(lines))
    return lines


def _read_runs(args) -> list[dict]:
    """Every run of the runs CSVs; a CSV without a `call` column is one call, numbered after the
    calls read before it."""
    rows: list[dict] = []
    for path in args.from_runs:
        with open(path, newline="") as fh:
            runs = list(csv.DictReader(fh))
        numbered = [int(r["call"]) for r in rows if str(r.get("call", "")).isdigit()]
        call = str(max(numbered, default=0) + 1)
        for r in runs:
            rows.append(
                {
                    **r,
                    "call": r.get("call") or call,
                    "repeat": int(r["repeat"]),
                    "ms_per_step": float(r["ms_per_step"]) if r["ms_per_step"] else None,
                    "errors": [e for e in r["errors"].split(" | ") if e],
                    "what": describe(args, r["workload"]),
                }
            )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/gpu")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--modes", default=",".join(MODES))
    add_workload_options(p)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--fsdp2-iters", type=int, default=50, help="timed steps of the fsdp2 workload")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-rounds", type=int, default=1, help="rounds of every mode run first and left out")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--cpus", help="pin every run to these CPUs (e.g. 4-7): one placement for all modes")
    p.add_argument(
        "--from-runs",
        nargs="+",
        type=Path,
        metavar="RUNS_CSV",
        help="rebuild the tables from earlier runs' detector_overhead_native_runs.csv (one per call, or one whose "
        "column `call` says which call ran each run)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the timed steps of every run with cProfile into DIR/profile-WORKLOAD-MODE.txt "
        "(where the Python side's time goes; the profiler's own cost makes those runs' times incomparable)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        args.cpu_set = parse_cpus(args.cpus)
    except ValueError:
        p.error(f"--cpus {args.cpus!r}: expected CPUs like 4-7 or 2,3,8-9")
    if args.child:
        Path(args.json).write_text(json.dumps(child(args)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_runs:
        print("\n".join(write_outputs(out, _read_runs(args), args)))
        return 0
    modes = [m for m in MODES if m in args.modes.split(",") and not (args.device == "cpu" and m == "sanitizer")]
    rows: list[dict] = []
    lines: list[str] = []
    for repeat in range(-args.warmup_rounds, args.repeats):
        for workload in args.workloads.split(","):
            for mode in modes:  # interleaved: drift in clocks or load affects every mode alike
                path = out / f".native-{workload}-{mode}-{repeat}.json"
                failure = run_child(args, workload, mode, path)
                if failure is None:
                    rows.append({**json.loads(path.read_text()), "repeat": repeat, "cpus": args.cpus or ""})
                    path.unlink()
                else:
                    rows.append(
                        {"workload": workload, "mode": mode, "repeat": repeat, "ms_per_step": None, "errors": [failure]}
                    )
                r = rows[-1]
                print(
                    f"{'warm-up' if repeat < 0 else 'repeat'} {repeat} {workload:6} {mode:16} "
                    f"{r.get('ms_per_step')} ms/step reports={r.get('reports')} "
                    f"path={r.get('path')} ops={r.get('ops')} {r.get('errors') or ''}",
                    flush=True,
                )
        lines = write_outputs(out, rows, args)  # a run cut short keeps its tables
    print("\n".join(lines))
    return 0 if all(r.get("ms_per_step") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
