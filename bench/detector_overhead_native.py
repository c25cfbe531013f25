"""What race detection costs on the training steps users run, with the tracker's two recording
paths side by side (needs one CUDA GPU): racecheck.detect.TorchRaceTracker on its native path
(op_log.cpp, applied by the native engine) and on its Python path (a TorchDispatchMode), and
torch.cuda._sanitizer, against the step with no tool.

    python bench/detector_overhead_native.py --out reports/gpu
    python bench/detector_overhead_native.py --device cpu --workloads mlp-adamw --width 64 --out /tmp/x  # a smoke run
    python bench/detector_overhead_native.py --from-runs CALL1_runs.csv CALL2_runs.csv --out reports/gpu \
        --splice README.md  # the calls' runs merged into the tables, and the README's table between its markers

Workloads (bench/overhead_workloads.py): the MLP with SGD, AdamW (foreach) and AdamW (fused); the
FSDP2 transformer with AdamW; the same with each layer compiled. Each (workload, mode, placement,
repeat) runs in a fresh process, every mode of every workload interleaved within a round, the
modes' order rotated from round to round (`round_order`: over as many rounds as there are modes,
each mode runs once in each position, so none is always the first after another workload): --warmup
steps, then --iters timed ones (--fsdp2-iters for the FSDP2 workloads; the sanitizer's scaled by
--sanitizer-iters-scale), CUDA synchronized around them. A run's process is forked from a server
that has imported torch and racecheck and touched no device (multiprocessing's forkserver), so the
rounds do not pay for those imports again and again; each run starts its own CUDA context,
process group and tools. Runs are unpinned; --cpus LIST runs every mode a second time in each
round pinned to those CPUs (a second table). Before the measured rounds, --warmup-rounds rounds run
the same way and are kept in the runs CSV (repeat < 0) but left out of the medians: a machine just
lent runs its first minutes slower. --deadline stops starting rounds that would not end in time.
Each run notes its place in its round (`position`) and the seconds its process took, start to result
(`run_s`: what a round costs a call's budget, its compiling and the sanitizer's slow warm-up included).

Modes: `plain` (no tool), `native`, `python`, `sanitizer`, and the parts that say where the time
goes: `native_hooks` (the hooks the native log uses, a RecordFunction observer with inputs and
outputs and c10's GPU trace, installed but recording nothing), `native_hooks_args` (the same without
the outputs: what RecordFunction's taking every call's results costs), `native_record` (the log records
and is drained, its records dropped), `native_nostacks`, `native_pyengine` (the native log applied
by the Python engine, the reference), `dispatch_floor` (an empty TorchDispatchMode) and
`python_nostacks`. Every native run also measures its parts inside itself (the log's callbacks,
the stacks, the drains, CUDA's trace callbacks, turning RecordFunction off and on around callees),
so each workload's table says where its time goes without them.
The tables: bench/overhead_tables.py. `--child WORKLOAD MODE` does one run in this process and prints
its result as JSON (bench/detector_instructions.py counts the instructions of such runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from overhead_tables import (  # noqa: E402
    MODES,
    README_END,
    README_START,
    UNRECORDED,
    false_alarms,
    read_runs,
    readme_table,
    write_outputs,
)
from overhead_workloads import WORKLOADS, add_workload_options, build, init_world, uses_world  # noqa: E402
from readme_block import splice  # noqa: E402

PRELOAD = ["torch", "torch.distributed.fsdp", "racecheck.detect.torch_tracker"]  # the run server's imports


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
    engine = ("python" if mode == "native_pyengine" else "native") if path == "native" else None
    tracker = TorchRaceTracker(stacks_on=not mode.endswith("nostacks"), path=path, engine=engine, **kwargs)
    if mode == "native_record":  # recorded and drained, then dropped
        tracker._feed._apply = lambda records, items: None
    if mode in ("native_hooks", "native_hooks_args"):  # the hooks installed by start(), recording nothing
        feed = tracker._feed
        start, log = feed.start, feed.log

        def hooks_only():
            if mode == "native_hooks_args":  # RecordFunction not asked for the calls' results either
                log_start = log.start
                log.start = lambda *a: log_start(*a[:5], False, *a[6:])  # results, the sixth
                try:
                    start()
                finally:
                    log.start = log_start
            else:
                start()
            log.record(False)

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
    parts = ("record", "gil", "walk", "drain", "trace", "switch")  # the last two: logs from before lack them
    out = {f"{part}_us": (after[part][1] - before[part][1]) / steps / 1e3 for part in parts if part in after}
    stacks = after["walk"][0] - before["walk"][0]
    out["stacks_per_step"] = stacks / steps
    out["frames_per_stack"] = (after["frames"] - before["frames"]) / stacks if stacks else 0.0
    seen = [b - a for a, b in zip(before["seen"], after["seen"], strict=True)]  # op_log.cpp's Seen order
    out["observed_per_step"] = sum(seen) / steps
    # calls that made a record: those recorded from their start, less the host's own ones that made none
    out["recorded_per_step"] = (seen[3] - (after.get("host_only", 0) - before.get("host_only", 0))) / steps
    if "host_only" in after:  # what became of the calls not recorded (logs from before lack host_only)
        host_only = after["host_only"] - before.get("host_only", 0)
        for field, n in zip(UNRECORDED, (*seen[:3], host_only), strict=True):
            out[field] = n / steps
    if "pinned_asked" in after:  # host items CUDA was asked about, whether pinned (logs from before lack it)
        out["asked_per_step"] = (after["pinned_asked"] - before["pinned_asked"]) / steps
    return out


def iters_of(args, workload: str, mode: str) -> int:
    iters = args.fsdp2_iters if uses_world(workload) else args.iters
    return max(3, round(iters * args.sanitizer_iters_scale)) if mode == "sanitizer" else iters


def child(args, workload: str, mode: str) -> dict:
    """One run: the workload's steps under the mode's tool, timed."""
    import torch

    cpu = args.device == "cpu"
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    init_world(workload, cpu)
    ctx, tracker = _tool(mode, cpu)
    if ctx is not None:
        ctx.__enter__()
    step, what = build(workload, args, dev)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    for _ in range(args.warmup):
        step()
    sync()
    before = _costs(tracker)
    iters = iters_of(args, workload, mode)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    ms = (time.perf_counter() - t0) / iters * 1e3
    parts = _per_step(before, _costs(tracker), iters)
    if cpu:
        parts.pop("asked_per_step", None)  # the CPU tracker's memory is all stream memory: it asks CUDA nothing
    result = {"workload": workload, "optimizer": WORKLOADS[workload].optimizer, "mode": mode, "iters": iters,
              "ms_per_step": ms, "what": what, "torch": torch.__version__,
              "device": "cpu" if cpu else torch.cuda.get_device_name(0), **parts}  # fmt: skip
    if ctx is not None:
        ctx.__exit__(None, None, None)
    if tracker is not None:
        engine = tracker._feed.engine_kind if tracker._feed is not None else "python"
        result.update(reports=len(tracker.reports()), errors=tracker.errors[:3], path=tracker.path, engine=engine,
                      ops=tracker.ops, accesses=tracker.engine.accesses)  # fmt: skip
    return result  # (the process group, if any, ends with the process)


def _run_in_child(args, workload: str, mode: str, cpus: set[int], path: str) -> None:
    """The body of a run's process: pinned where asked, its result (or why it failed) to `path`."""
    if cpus:
        import torch

        os.sched_setaffinity(0, cpus)  # the threads it starts inherit it
        torch.set_num_threads(len(cpus))  # as a process started on these CPUs sizes its thread pool
    try:
        result = child(args, workload, mode)
    except BaseException as exc:  # noqa: BLE001 - the run failed: say why in its row
        lines = traceback.format_exception(exc)
        result = {"error": " | ".join("".join(lines).strip().splitlines()[-3:])}
    Path(path).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # no teardown of what the tools left behind (a process group, CUDA's trace)


def run(server, args, workload: str, mode: str, cpus: set[int], path: Path) -> dict:
    """One run in a fresh process: its result, or an error row."""
    proc = server.Process(target=_run_in_child, args=(args, workload, mode, cpus, str(path)))
    proc.start()
    proc.join(args.timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"error": f"no result in {args.timeout:.0f} s"}
    if not path.exists():
        return {"error": f"exit code {proc.exitcode}, no result"}
    result = json.loads(path.read_text())
    path.unlink()
    return result


def round_order(modes: list[str], index: int) -> list[str]:
    """The order of `modes` in the round `index` (counted from 0, warm-up rounds included): rotated
    by one a round, so that a mode's runs do not all follow the same one (a workload's first run
    follows the previous workload's last, often the sanitizer's)."""
    k = index % len(modes) if modes else 0
    return modes[k:] + modes[:k]


def rounds(args, out: Path) -> list[dict]:
    """Every round's runs, the tables rewritten after each round (a call cut short keeps them)."""
    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(PRELOAD)
    workloads = args.workloads.split(",")
    modes = [m for m in MODES if m in args.modes.split(",") and not (args.device == "cpu" and m == "sanitizer")]
    placements = [set()] + ([args.cpu_set] if args.cpu_set else [])
    rows: list[dict] = []

    def one(workload: str, mode: str, cpus: set[int], repeat: int, position: int) -> None:
        launched = time.monotonic()
        got = run(server, args, workload, mode, cpus, out / f".native-{workload}-{mode}-{repeat}.json")
        row = {"workload": workload, "optimizer": WORKLOADS[workload].optimizer, "mode": mode, "repeat": repeat,
               "position": position, "run_s": round(time.monotonic() - launched, 2), "cpus": args.cpus if cpus else "",
               **got}  # fmt: skip
        row["errors"] = row.get("errors") or ([row["error"]] if "error" in row else [])
        rows.append(row)
        print(f"{'warm-up' if repeat < 0 else 'repeat'} {repeat} {'pinned' if cpus else 'unpinned'} {workload:15} "
              f"{mode:16} {row.get('ms_per_step')} ms/step reports={row.get('reports')} engine={row.get('engine')} "
              f"ops={row.get('ops')} run={row['run_s']:.1f}s {row['errors'] or ''}", flush=True)  # fmt: skip

    start, last = time.monotonic(), 0.0
    if not args.warmup_rounds:  # a compiled workload's first process fills Inductor's caches for the others
        for workload in (w for w in workloads if WORKLOADS[w].model == "fsdp2_compiled"):
            one(workload, "plain", set(), -1, 0)
    for repeat in range(-args.warmup_rounds, args.repeats):
        began = time.monotonic()
        if args.deadline and began - start + last * 1.1 > args.deadline:
            print(f"stopping before round {repeat}: it would end after the {args.deadline:.0f} s deadline", flush=True)
            break
        for cpus in placements:
            for workload in workloads:
                # interleaved: drift in clocks or load affects every mode alike
                for position, mode in enumerate(round_order(modes, repeat + args.warmup_rounds)):
                    one(workload, mode, cpus, repeat, position)
        last = time.monotonic() - began
        write_outputs(out, rows, args)
    return rows


def parse_cpus(spec: str | None) -> set[int]:
    """The CPUs of a list like `4-7` or `2,3,8-9` (none: no pinning)."""
    cpus: set[int] = set()
    for part in (spec or "").split(","):
        if part.strip():
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/gpu")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--workloads", default="mlp-sgd,mlp-adamw,mlp-adamw-fused,fsdp2-adamw,fsdp2-compiled")
    p.add_argument("--modes", default="plain,native,python,sanitizer")
    add_workload_options(p)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--fsdp2-iters", type=int, default=30, help="timed steps of the FSDP2 workloads")
    p.add_argument("--sanitizer-iters-scale", type=float, default=1.0, help="the sanitizer's share of the timed steps")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup-rounds", type=int, default=1, help="rounds of every mode run first and left out")
    p.add_argument("--deadline", type=float, default=0, help="seconds: start no round that would end later")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take")
    p.add_argument("--cpus", help="also run every mode pinned to these CPUs (e.g. 4-7): a second table")
    p.add_argument("--splice", type=Path, metavar="README",
                   help="also write the runs' table into README's detector-overhead block")  # fmt: skip
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "MODE"),
                   help="one run in this process, its result as JSON on stdout (for bench/detector_instructions.py, "
                   "which counts the instructions it executes)")  # fmt: skip
    p.add_argument("--from-runs", nargs="+", type=Path, metavar="RUNS_CSV",
                   help="rebuild the tables from earlier runs' detector_overhead_native_runs.csv (one per call, or one "
                   "whose column `call` says which call ran each run)")  # fmt: skip
    args = p.parse_args()
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    try:
        args.cpu_set = parse_cpus(args.cpus)
    except ValueError:
        p.error(f"--cpus {args.cpus!r}: expected CPUs like 4-7 or 2,3,8-9")
    if args.child:
        workload, mode = args.child
        if workload not in WORKLOADS or mode not in MODES:
            p.error(f"--child {workload} {mode}: unknown workload or mode")
        print(json.dumps(child(args, workload, mode)), flush=True)
        os._exit(0)  # as a run's process ends: no teardown of what the tools left behind
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_runs(args.from_runs) if args.from_runs else rounds(args, out)
    print("\n".join(write_outputs(out, rows, args)))
    if args.splice is not None:
        splice(args.splice, README_START, README_END, readme_table(rows, args))
    alarms = false_alarms(rows)
    for line in alarms:
        print(line)
    return 0 if all(r.get("ms_per_step") for r in rows) and not alarms else 1


if __name__ == "__main__":
    sys.exit(main())
