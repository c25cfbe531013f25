"""The cost of race detection on one training loop, side by side (needs one CUDA GPU):
no detector, racecheck's detector (racecheck.detect.TorchRaceTracker) and torch.cuda._sanitizer.

    python bench/detector_overhead.py --out reports/gpu
    python bench/detector_overhead.py --device cpu --out reports    # the CPU proxy, see below

The loop: an MLP of --layers Linear(width, width) + ReLU layers, batch --batch, MSE loss, backward,
SGD with momentum, zero_grad; --warmup steps, then --iters timed steps (CUDA synchronized before
and after), in a fresh process per mode and repeat so that no tool's CUDA trace callbacks outlive
its run. Reference modes explain the cost: `dispatch_floor` (a TorchDispatchMode that only
calls the op: what any dispatch-mode tool pays before doing anything), `racecheck_python`
(racecheck with its engine in pure Python, RACECHECK_PURE_PYTHON=1, where it was compiled),
`racecheck_nostacks` (racecheck without its per-access call stacks) and the `split_*` modes, racecheck with parts
switched off (see split_tracker). The target: racecheck's slowdown (time per step over the plain
loop's) at most a third of the sanitizer's. `--profile` says where one mode's time goes.

`--device cpu` runs the same loop on the CPU, where there are no CUDA trace callbacks:
racecheck.detect.cpu_trace.AllocatorTrace stands in for the caching allocator's (an inner
dispatch mode calling the tracker's allocation callback for every new output storage and its free
callback when the storage dies). Every mode pays for that stand-in alike, the sanitizer is not
run (it ignores CPU tensors), and what the table shows is racecheck's bookkeeping above the
dispatch floor: the part of the GPU overhead that racecheck's own code decides, measurable
without a GPU.

Writes DIR/detector_overhead[_cpu].csv (one row per run) and DIR/detector_overhead[_cpu].md,
prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = (
    "none",
    "racecheck",
    "sanitizer",
    "dispatch_floor",
    "racecheck_python",
    "racecheck_nostacks",
    "split_dispatch",
    "split_trace",
    "split_callbacks",
)
CPU_MODES = tuple(m for m in MODES if m != "sanitizer")


def child(args) -> dict:
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO))
    cpu = args.device == "cpu"
    result = {
        "mode": args.mode,
        "reports": None,
        "errors": [],
        "torch": torch.__version__,
        "device": _cpu_name() if cpu else torch.cuda.get_device_name(0),
    }
    ctx = None
    if args.mode.startswith(("racecheck", "split_")):
        from racecheck.detect import TorchRaceTracker

        if cpu:  # one stream; the allocator's callbacks come from the stand-in below
            ctx = TorchRaceTracker(
                stacks_on=args.mode != "racecheck_nostacks",
                device_type="cpu",
                current_stream=lambda: 0,
                stream_handle=lambda s: 0,
            )
        else:
            ctx = TorchRaceTracker(stacks_on=args.mode != "racecheck_nostacks")
        if args.mode.startswith("split_"):
            ctx = split_tracker(ctx, args.mode, cpu)
    elif args.mode == "sanitizer":
        import torch.cuda._sanitizer as csan

        csan.enable_cuda_sanitizer()  # for the whole process, as its documentation says
    elif args.mode == "dispatch_floor":
        from torch.utils._python_dispatch import TorchDispatchMode

        class Floor(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, a=(), kw=None):
                return func(*a, **(kw or {}))

        ctx = Floor()
    stand_in = None
    if cpu:
        from racecheck.detect.cpu_trace import AllocatorTrace

        handler = getattr(ctx, "handler", None)
        stand_in = AllocatorTrace(
            handler._handle_memory_allocation if handler else (lambda ptr: None),
            handler._handle_memory_deallocation if handler else (lambda ptr: None),
        )
        stand_in.__enter__()  # inner: the allocator runs inside the tracked operator
    if ctx is not None:
        ctx.__enter__()
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)  # CUDA's default
    x = torch.randn(args.batch, args.width, device=dev)
    y = torch.randn(args.batch, args.width, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync()
    profiler = None
    if args.profile_out:  # where the time goes (not a timed run: the profiler slows every call)
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    sync()
    result["ms_per_step"] = (time.perf_counter() - t0) / args.iters * 1e3
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        Path(args.profile_out).write_text(f"mode {args.mode}, {args.iters} steps under cProfile\n" + text.getvalue())
    if ctx is not None:
        ctx.__exit__(None, None, None)
    if stand_in is not None:
        stand_in.__exit__(None, None, None)
    if args.mode.startswith("racecheck"):  # the split modes are not detectors: nothing to count
        result["reports"] = len(ctx.reports())
        result["errors"] = ctx.errors
        from racecheck.detect import ENGINE

        result["engine"] = ENGINE  # compiled or python (racecheck/detect/native.py)
        result["stats"] = {**ctx.stats, **ctx.engine.stats, "ops": ctx.ops, "accesses": ctx.engine.accesses}
    return result


def split_tracker(tracker, mode: str, cpu: bool):
    """racecheck with parts switched off, to split its cost (reference modes, not detectors):
    split_dispatch: its dispatch mode only (each operator's plan looked up, no bookkeeping);
    split_trace: that plus the CUDA trace callbacks, into handlers that do nothing (on the CPU,
    which has none, the same as split_dispatch);
    split_callbacks: that with racecheck's own allocation and free handlers (still no operator
    bookkeeping). racecheck itself adds the bookkeeping of each operator's accesses."""
    import contextlib

    from racecheck.detect import torch_hooks
    from racecheck.detect.dispatch import sanitizer_module, set_trace_handler

    tracker._op = lambda *a, **k: None  # the operator bookkeeping, off in every split mode
    if mode == "split_callbacks":
        return tracker
    stack = contextlib.ExitStack()
    if mode == "split_trace" and not cpu:

        class Idle(sanitizer_module().EventHandler):
            pass

        idle = Idle()
        for name in dir(idle):
            if name.startswith("_handle_"):
                setattr(idle, name, lambda *a: None)
        import torch

        torch._C._activate_gpu_trace()
        set_trace_handler(idle, attached=True)
        stack.callback(set_trace_handler, idle, attached=False)
    stack.enter_context(torch_hooks.TrackerMode(tracker))
    return stack


def _cpu_name() -> str:
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def parent(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rows = []
    modes = [m for m in (CPU_MODES if args.device == "cpu" else MODES) if m in args.modes.split(",")]
    common = [
        "--device",
        args.device,
        "--layers",
        str(args.layers),
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
    ]
    for repeat in range(args.repeats):
        for mode in modes:  # interleaved, so drift in clocks or load affects every mode alike
            path = out / f".overhead-{mode}-{repeat}.json"
            failure = run_child(mode, path, common, env, args)
            if failure is not None:
                rows.append({"mode": mode, "repeat": repeat, "ms_per_step": None, "errors": failure})
            else:
                rows.append({**json.loads(path.read_text()), "repeat": repeat})
                path.unlink()
            r = rows[-1]
            print(
                f"repeat {repeat} {mode:20} {r.get('ms_per_step')} ms/step reports={r.get('reports')} "
                f"{r.get('errors') or ''} {r.get('stats') or ''}",
                flush=True,
            )
        write_outputs(out, rows, args, quiet=repeat < args.repeats - 1)  # a run cut short keeps its tables
    if args.profile:
        for mode in args.profile.split(","):
            profile(out, mode, common, env, args)
        (out / ".profile.json").unlink(missing_ok=True)
    return 0


def run_child(mode: str, json_path: Path, common: list[str], env: dict, args, *extra: str) -> list[str] | None:
    """Run one mode in a fresh process; None when it wrote its result, else why not (a run that
    outlasts --timeout is recorded as such, and the others go on)."""
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--json", str(json_path), *common, *extra]
    env = {k: v for k, v in env.items() if k != "RACECHECK_PURE_PYTHON"}
    if mode == "racecheck_python":
        env["RACECHECK_PURE_PYTHON"] = "1"  # the engine's Python sources instead of their compiled build
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return [f"no result in {args.timeout:.0f} s"]
    if proc.returncode != 0 or not json_path.exists():
        return (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return None


def profile(out: Path, mode: str, common: list[str], env: dict, args) -> None:
    """Where one mode's time goes (cProfile, by own time), in DIR/detector_profile_<mode>.txt.
    cProfile sees the main thread only: on CUDA, backward's operators run on the autograd
    engine's device thread and their cost shows as the own time of run_backward (the split_*
    modes measure the parts instead)."""
    path = out / f"detector_profile_{mode}{_suffix(args)}.txt"
    failure = run_child(mode, out / ".profile.json", common, env, args, "--profile-out", str(path))
    print(f"profile of {mode}: {path if failure is None else ' '.join(failure)[-300:]}", flush=True)


def _suffix(args) -> str:
    return "_cpu" if args.device == "cpu" else ""


def write_outputs(out: Path, rows: list[dict], args, *, quiet: bool = False) -> None:
    with open(out / f"detector_overhead{_suffix(args)}.csv", "w", newline="") as fh:
        w = csv.DictWriter(
            fh,
            fieldnames=["mode", "repeat", "ms_per_step", "reports", "engine", "errors", "torch", "device"],
            extrasaction="ignore",
        )
        w.writeheader()
        for r in rows:
            w.writerow({**r, "errors": " | ".join(map(str, r.get("errors") or []))})
    median = {}
    for mode in MODES:
        times = [r["ms_per_step"] for r in rows if r["mode"] == mode and r.get("ms_per_step")]
        median[mode] = statistics.median(times) if times else None
    base = median["none"]
    meta = next((r for r in rows if r.get("device")), {})
    engines = ", ".join(sorted({r["engine"] for r in rows if r["mode"] == "racecheck" and r.get("engine")}))
    title = "# Detector overhead on one training loop" + (
        " (CPU proxy: racecheck's bookkeeping above the dispatch floor)" if args.device == "cpu" else ""
    )
    lines = [
        title,
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}. Loop: {args.layers}-layer "
        f"{args.width}-wide MLP (Linear + ReLU), batch {args.batch}, MSE, SGD with momentum; "
        f"{args.warmup} warm-up and {args.iters} timed steps per run, median of "
        f"{1 + max(r['repeat'] for r in rows)} runs "
        f"(fresh processes, modes interleaved). racecheck's engine: {engines or '?'} "
        f"(racecheck/detect/native.py).",
        "",
        "| mode | ms per step (median) | slowdown | every run (ms) |",
        "| --- | --- | --- | --- |",
    ]
    labels = {
        "none": "no detector",
        "racecheck": "racecheck (TorchRaceTracker)",
        "sanitizer": "torch.cuda._sanitizer",
        "dispatch_floor": "reference: empty TorchDispatchMode",
        "racecheck_python": "reference: racecheck, engine in pure Python",
        "racecheck_nostacks": "reference: racecheck without call stacks",
        "split_dispatch": "split: racecheck's dispatch mode alone",
        "split_trace": "split: + CUDA trace callbacks (idle handlers)",
        "split_callbacks": "split: + racecheck's allocation/free handlers",
    }
    for mode in MODES:
        m = median[mode]
        if m is None and not any(r["mode"] == mode for r in rows):
            continue  # not run
        slow = f"{m / base:.2f}x" if m and base else "n/a"
        runs = ", ".join(
            f"{t:.2f}" for t in sorted(r["ms_per_step"] for r in rows if r["mode"] == mode and r.get("ms_per_step"))
        )
        lines.append(f"| {labels[mode]} | {m:.3f} | {slow} | {runs} |" if m else f"| {labels[mode]} | n/a | n/a | |")
    if base and median["racecheck"] and median["sanitizer"]:
        rc, san = median["racecheck"] / base, median["sanitizer"] / base
        ok = rc <= san / 3
        lines += [
            "",
            f"racecheck's slowdown {rc:.2f}x is {rc / san:.2f} of the sanitizer's {san:.2f}x "
            f"(target: at most 1/3): {'met' if ok else 'NOT met'}.",
        ]
        per_repeat = []
        for repeat in sorted({r["repeat"] for r in rows}):
            t = {r["mode"]: r.get("ms_per_step") for r in rows if r["repeat"] == repeat}
            if t.get("racecheck") and t.get("sanitizer"):
                per_repeat.append(t["racecheck"] / t["sanitizer"])  # (rc / none) / (san / none)
        if per_repeat:
            lines += [
                "",
                "The same ratio within each repeat (its own runs of both tools): "
                + ", ".join(f"{x:.2f}" for x in per_repeat)
                + ".",
            ]
    if args.device == "cpu" and base and median["racecheck"] and median["dispatch_floor"]:
        lines += [
            "",
            f"racecheck's own cost above the dispatch floor: "
            f"{median['racecheck'] - median['dispatch_floor']:.3f} ms per step.",
        ]
        if median["racecheck_python"]:
            lines[-1] += (
                f" With its engine in pure Python: "
                f"{median['racecheck_python'] - median['dispatch_floor']:.3f} ms per step."
            )
    (out / f"detector_overhead{_suffix(args)}.md").write_text("\n".join(lines) + "\n")
    if quiet:
        return
    print()
    print("\n".join(lines[4:]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/gpu")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--width", type=int, default=None, help="default: 2048 on CUDA, 256 on the CPU")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument(
        "--profile",
        nargs="?",
        const="racecheck",
        default="",
        metavar="MODES",
        help="also write DIR/detector_profile_<mode>.txt for these modes (default: racecheck), cProfile by own time",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile-out", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.width is None:
        args.width = 256 if args.device == "cpu" else 2048
    if args.child:
        Path(args.json).write_text(json.dumps(child(args)))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
