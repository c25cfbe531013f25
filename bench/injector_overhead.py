"""What an installed but switched-off injector costs: step time of the main_grad_reuse model's
training loop with no injector vs an Injector whose profile is `off` attached to the runtime
(every runtime event is still dispatched to it), side by side in one process.

    python bench/injector_overhead.py [--backend sim|cuda] [--reps 41] [--steps 10] [--out reports]

Repetitions alternate the two variants (the order flips every repetition, so drift and warm-up
hit both alike); each repetition times `--steps` steps; the figure is the ratio of the medians.
Writes OUT/perturb_overhead.md (and .csv). One process, one rank: the mesh is 1x1, so the
collectives are local copies and the loop is as short as the model allows, which makes the
injector's share of it as large as it can be.

Regenerates reports/perturb_overhead.{md,csv}; on a GPU, reports/gpu/perturb_overhead*.{md,csv}.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from racecheck.device import RuntimeObserver, init_runtime  # noqa: E402
from racecheck.fsdp import Mesh, MeshConfig, fully_shard  # noqa: E402
from racecheck.perturb.injector import Injector  # noqa: E402
from racecheck.perturb.profiles import parse_profile  # noqa: E402

WIDTH, LAYERS, BATCH, MICROBATCHES = 64, 4, 24, 3  # the main_grad_reuse model and batch


class CountingObserver(RuntimeObserver):
    """Counts the runtime events an observer receives (to say what the injector is handed)."""

    def __init__(self) -> None:
        self.count = 0

    def _hit(self, *args, **kwargs) -> None:
        self.count += 1

    on_alloc = on_free = on_record_stream = on_launch = on_event_record = on_event_wait = _hit
    on_host_sync = on_point = _hit


def build(rt):
    torch.manual_seed(1234)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    model = nn.Sequential(*layers[:-1]).to(rt.device)
    mesh = Mesh(MeshConfig(shard=1), runtime=rt)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, main_grad_policy="fixed", runtime=rt)
    fully_shard(model, mesh=mesh, main_grad_policy="fixed", runtime=rt)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def step(model, opt, x, y, rt) -> None:
    model.zero_grad()
    for xb, yb in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True):
        (nn.functional.mse_loss(model(xb), yb) / MICROBATCHES).backward()
    opt.step()
    rt.synchronize()


def timed(model, opt, x, y, rt, steps: int) -> tuple[float, float]:
    """Seconds per step: wall clock, and CPU time of the whole process (every stream's thread).
    CPU time is what the injector could add; unlike wall time it does not count the time other
    processes on a shared machine hold the cores."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(model, opt, x, y, rt)
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--reps", type=int, default=41)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "reports")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rt = init_runtime(args.backend)
    model, opt = build(rt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, WIDTH, generator=gen).to(rt.device)
    y = torch.randn(BATCH, WIDTH, generator=gen).to(rt.device)
    for _ in range(20):
        step(model, opt, x, y, rt)  # warm-up: allocator pools, autograd, caches

    counter = CountingObserver()
    rt.add_observer(counter)
    step(model, opt, x, y, rt)
    rt.remove_observer(counter)
    events_per_step = counter.count

    injector = Injector(parse_profile("off"))
    variants = ("absent", "installed, off")
    samples = {v: {"wall": [], "cpu": []} for v in variants}
    for rep in range(args.reps):
        for variant in variants if rep % 2 == 0 else variants[::-1]:
            if variant != "absent":
                rt.add_observer(injector)
            wall, cpu = timed(model, opt, x, y, rt, args.steps)
            samples[variant]["wall"].append(wall)
            samples[variant]["cpu"].append(cpu)
            if variant != "absent":
                rt.remove_observer(injector)
    rt.close()

    ratios = {}
    for clock in ("cpu", "wall"):
        med = [statistics.median(samples[v][clock]) for v in variants]
        pair = sorted(b / a for a, b in zip(samples["absent"][clock], samples["installed, off"][clock], strict=True))
        ratios[clock] = (med[0], med[1], med[1] / med[0], pair[len(pair) // 4], pair[(3 * len(pair)) // 4])
    write(args, samples, ratios, events_per_step)
    for clock, (a, b, r, q1, q3) in ratios.items():
        print(
            f"{clock}: injector installed but off / absent = {r:.4f} (median step {a * 1e3:.3f} ms vs "
            f"{b * 1e3:.3f} ms; per-pair ratio IQR {q1:.4f}-{q3:.4f}); {events_per_step} runtime events per step"
        )
    return 0


def write(args, samples, ratios, events_per_step) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "perturb_overhead.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["backend", "variant", "repetition", "wall_seconds_per_step", "cpu_seconds_per_step"])
        for variant, clocks in samples.items():
            for i, (wall, cpu) in enumerate(zip(clocks["wall"], clocks["cpu"], strict=True)):
                w.writerow([args.backend, variant, i, f"{wall:.6e}", f"{cpu:.6e}"])
    device = torch.cuda.get_device_name() if args.backend == "cuda" else "CPU emulation (sim)"
    lines = [
        "# Injector overhead: installed but off vs absent",
        "",
        f"Command: `python bench/injector_overhead.py --backend {args.backend} --reps {args.reps} "
        f"--steps {args.steps}` on {device}, torch {torch.__version__}.",
        "",
        f"The main_grad_reuse model (MLP {LAYERS}x{WIDTH}, 4 parameter groups, {MICROBATCHES} microbatches "
        f"of {BATCH // MICROBATCHES}) in one process on a 1x1 mesh; each step makes {events_per_step} runtime "
        f"events. Variants: no injector, and an `Injector` for the profile `off` attached to the runtime. "
        f"{args.reps} repetitions of {args.steps} steps per variant, interleaved (order flipped every "
        "repetition); step time as wall clock and as the process's CPU time (all threads), which other "
        "processes sharing the machine do not inflate.",
        "",
        "| clock | absent: median step (ms) | installed, off: median step (ms) | ratio of medians "
        "| per-pair ratio IQR |",
        "|---|---|---|---|---|",
    ]
    for clock, (a, b, r, q1, q3) in ratios.items():
        lines.append(f"| {clock} | {a * 1e3:.3f} | {b * 1e3:.3f} | **{r:.4f}** | {q1:.4f} to {q3:.4f} |")
    lines += [
        "",
        "Target: at most 1.01. An injector whose profile is off subscribes to no runtime event "
        "(`RuntimeObserver.events`), so the runtime never calls it: both variants run the same code, "
        "and the ratio measures only the noise of the machine.",
        "",
        "Raw samples: `perturb_overhead.csv`.",
    ]
    (out / "perturb_overhead.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
