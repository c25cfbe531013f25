"""What patch mode costs a training step when it is installed but does not act, side by side.

The step: a small MLP's forward, backward and SGD update, a copy of the gradients on a side
stream that the default stream then waits for (stream_enter, stream_wait and event_record points),
and two all-reduces of gradient-sized buckets over a one-rank group (before_all_reduce points). Every
configuration runs the same steps, in rotating order, round after round:
- bare:    nothing installed;
- off:     patch mode with the `off` profile, as the plugin installs it for a project suite
           (it wraps nothing: an off profile names no point);
- idle:    `sleep@stream_enter:0ms,sleep@stream_wait:0ms,sleep@event_record:0ms,
           sleep@before_all_reduce:0ms`: every wrapper installed and deciding at every point,
           never delaying;
- tracing: the systematic schedule with a plan that matches no point: the wrappers plus a code
           location at every point (what a systematic trial pays).
Reported: the median step time of each and its ratio to bare (the acceptance bound is off <= 1.01),
and the points a step passes. The clock is the wall clock on a GPU (the step ends with a device
synchronization) and the process's CPU time on the CPU (a shared machine's load stretches wall
time, not the CPU time the step itself takes).

    python bench/patch_off_overhead.py --device cuda --out reports/gpu/patch_off_overhead
    python bench/patch_off_overhead.py --device cpu --out reports/patch_off_overhead_cpu

On the CPU, torch.cuda's streams are replaced by the recording twin's host streams
(racecheck.perturb.recording), the same wrappers on a stream API of the same shape: a proxy for
the host-side cost, without the GPU's asynchrony.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from racecheck.perturb.patch import PatchMode  # noqa: E402
from racecheck.perturb.profiles import parse_profile  # noqa: E402

IDLE = "sleep@stream_enter:0ms,sleep@stream_wait:0ms,sleep@event_record:0ms,sleep@before_all_reduce:0ms"
TRACING = "systematic:at=stream_enter@nowhere.py:1/s1"
CONFIGS = {"bare": None, "off": "off", "idle": IDLE, "tracing": TRACING}


class Step:
    """One training step on `device`, with a side-stream hand-off and an all-reduce."""

    def __init__(self, device: str, *, width: int, layers: int, batch: int) -> None:
        torch.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
        self.model = torch.nn.Sequential(*mods).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(batch, width, device=device)
        self.device = device
        if device == "cuda":
            self.streams = torch.cuda
            self.side = torch.cuda.Stream()
        else:
            from racecheck.perturb import recording

            self.streams = recording
            self.side = recording.HostStream("side")
        self.copies = [torch.empty_like(p) for p in self.model.parameters()]
        self.buckets = [torch.zeros(width * width, device=device) for _ in range(2)]

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=False)
        self.model(self.x).square().mean().backward()
        current = self.streams.current_stream()
        self.side.wait_stream(current)  # producer: the default stream's gradients
        with self.streams.stream(self.side):  # consumer: the side stream's copies
            for c, p in zip(self.copies, self.model.parameters(), strict=True):
                c.copy_(p.grad, non_blocking=True)
            done = self.side.record_event()
        current.wait_event(done)  # the default stream reads nothing of the copies before they are done
        for bucket in self.buckets:  # gradients all-reduced in buckets, as DDP and FSDP do
            dist.all_reduce(bucket)
        self.opt.step()
        if self.device == "cuda":
            torch.cuda.synchronize()


def actions_for(device: str):
    if device == "cuda":
        from racecheck.perturb.patch_actions import CudaActions

        return CudaActions()
    from racecheck.perturb.recording import RecordingActions

    return RecordingActions()


POINTS: dict[str, int] = {}  # config -> points passed per step


def measure(step: Step, name: str, *, steps: int, device: str) -> float:
    """Median seconds per step over `steps` steps with CONFIGS[name] installed (None: nothing)."""
    spec = CONFIGS[name]
    patch = None if spec is None else PatchMode(parse_profile(spec), actions=actions_for(device))
    clock = time.perf_counter if device == "cuda" else time.process_time
    times = []
    if patch is not None:
        patch.install()
    try:
        for _ in range(steps):
            start = clock()
            step()
            times.append(clock() - start)
    finally:
        if patch is not None:
            patch.uninstall()
            POINTS[name] = patch.passed // steps
    return statistics.median(times)


def point_cost(step: Step, spec: str, *, device: str, calls: int = 5000, repeats: int = 7) -> float:
    """Seconds one passage of a hand-off point costs with `spec` installed, over the bare call: the
    best of `repeats` timings of `calls` x (stream entry, wait_stream, record_event), 3 points."""
    streams, side = step.streams, step.side
    current = streams.current_stream()

    def sequence() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            with streams.stream(side):
                pass
            side.wait_stream(current)
            side.record_event()
        return time.perf_counter() - start

    bare = min(sequence() for _ in range(repeats))
    with PatchMode(parse_profile(spec), actions=actions_for(device)):
        patched = min(sequence() for _ in range(repeats))
    return max(patched - bare, 0.0) / (3 * calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="steps per configuration per round")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="OUT.csv and OUT.md are written")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core's work per step: less scheduling noise on a shared machine
    if args.device == "cuda":
        torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    load = os.getloadavg()[0]  # a shared machine's load is the side-by-side figures' noise
    step = Step(args.device, width=args.width, layers=args.layers, batch=args.batch)
    for _ in range(5):
        step()  # warm-up: allocator pools, kernels, gloo buffers
    medians: dict[str, list[float]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotating order: drift hits all alike
            medians[name].append(measure(step, name, steps=args.steps, device=args.device))
    costs = {
        name: point_cost(step, spec, device=args.device)
        for name, spec in CONFIGS.items()
        if spec is not None and spec != "off"
    }
    dist.destroy_process_group()
    bare = statistics.median(medians["bare"])
    rows = [
        {
            "config": name,
            "profile": CONFIGS[name] or "",
            "median_step_ms": round(statistics.median(m) * 1e3, 4),
            "ratio_to_bare": round(statistics.median(m) / bare, 4),
            "worst_round_ratio": round(max(a / b for a, b in zip(m, medians["bare"], strict=True)), 4),
            "points_per_step": POINTS.get(name, 0),
        }
        for name, m in medians.items()
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = "python bench/patch_off_overhead.py " + " ".join(sys.argv[1:])
    lines = [
        f"# Patch mode installed but not acting: cost per training step ({args.device})",
        "",
        f"`{command}`; torch {torch.__version__}; {args.rounds} rounds x {args.steps} steps per "
        f"configuration, rotating order; MLP {args.layers}x{args.width}, batch {args.batch}; clock: "
        f"{'wall' if args.device == 'cuda' else 'process CPU time'}; {os.cpu_count()} cores, load "
        f"average {load:.1f} at the start.",
        "",
        "| config | profile | points per step | median step (ms) | ratio to bare | worst round |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | `{r['profile'] or '-'}` | {r['points_per_step']} | {r['median_step_ms']} | "
        f"{r['ratio_to_bare']} | {r['worst_round_ratio']} |"
        for r in rows
    ]
    lines += [
        "",
        "Per point passed (wrapped minus bare call, best of 7 x 5000 x 3 points), and what that "
        "bounds per step (points per step x cost / bare step):",
        "",
        "| config | cost per point (us) | bound per step |",
        "|---|---|---|",
    ]
    for name, cost in costs.items():
        bound = POINTS.get(name, 0) * cost / bare
        lines.append(f"| {name} | {cost * 1e6:.2f} | {1 + bound:.5f}x |")
    lines += [
        "",
        "`off` wraps nothing, so off against bare is the same code twice: its ratio is this "
        "machine's noise floor for the side-by-side figures.",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
