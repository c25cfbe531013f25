"""The native path's drains, recorded once on a GPU and replayed anywhere: where applying the
native log's records costs time, measured without the GPU's noise.

    python bench/native_replay.py record --workload fsdp2-adamw --out /tmp/fsdp2.dump   # one CUDA GPU
    python bench/native_replay.py record --device cpu --workload mlp-adamw --width 256 --out /tmp/mlp.dump
    python bench/native_replay.py replay /tmp/fsdp2.dump --repeats 5               # any machine

`record` runs a workload of bench/overhead_workloads.py (--warmup and --iters steps) under
TorchRaceTracker on the native path and keeps every batch the log hands to the tracker (the Record
and Item arrays, as op_log.cpp's drain returns them), the operator names in the order the log
numbered them, and the stream handles the feed looked up. On the CPU, where CUDA reports no
allocations, racecheck.detect.cpu_trace.AllocatorTrace stands in for the caching allocator's
callbacks (bench/detector_overhead.py's CPU proxy), so the drains hold allocations and frees as a
GPU's do. `replay` re-cuts the recorded records into drains of DRAIN_AT records (the log's own
size: a CPU recording drains at every allocation) and applies them, in order, to fresh trackers
with each engine (--engines: the native one, and the Python one, compiled by mypyc where it is
built, as in a run), alternating, and prints each engine's time per recorded step and the reports
each replay gives: a change to the engines is compared on the same records, with the same reports,
before it goes to the GPU. Stacks are not replayed (a report's frames come from the live log),
only their ids.

Its replays on the 2-core CPU machine are reports/native_engine_cpu.md, which the README cites.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import pickle
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import detector_overhead_native as bench  # noqa: E402
from overhead_workloads import WORKLOADS, add_workload_options, build, init_world  # noqa: E402

from racecheck.detect.feed_apply import RECORD  # noqa: E402

DRAIN_AT = 4096  # op_log.cpp's: the records that make the log call the drain


class ReplayLog:
    """The log as a replay's feed asks it: no stacks (their ids only), no host storage to watch."""

    def __init__(self) -> None:
        from racecheck.detect import op_log

        self.Engine = op_log.load_required().Engine

    def frames(self, stack_id: int) -> tuple:
        return ()

    def watch(self, storage: int) -> bool:
        return False


def record(args) -> int:
    import torch

    cpu = args.device == "cpu"
    init_world(args.workload, cpu)
    tracker, _ = bench._tool("native", cpu)  # the benchmark's native tracker, as its runs use it
    feed = tracker._feed
    batches: list[tuple[bytes, bytes]] = []
    names: list[tuple[str, str]] = []
    apply, plan = feed._apply, feed._plan

    def kept_apply(records: bytes, items: bytes) -> None:
        batches.append((bytes(records), bytes(items)))
        apply(records, items)

    def kept_plan(name: str, overload: str):
        names.append((name, overload))
        return plan(name, overload)

    feed._apply, feed._plan = kept_apply, kept_plan
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    with contextlib.ExitStack() as stack:
        if cpu:  # the caching allocator's callbacks, stood in for
            from racecheck.detect.cpu_trace import AllocatorTrace

            handler = tracker.handler
            stack.enter_context(AllocatorTrace(handler._handle_memory_allocation, handler._handle_memory_deallocation))
        stack.enter_context(tracker)
        step, what = build(args.workload, args, torch.device("cpu") if cpu else torch.device("cuda", 0))
        for _ in range(args.warmup + args.iters):
            step()
        sync()
    dump = {
        "what": what,
        "steps": args.warmup + args.iters,
        "batches": batches,
        "names": names,
        "streams": dict(feed._streams),
        "device_type": tracker.device_type,
        "current": 0 if cpu else torch.cuda.current_stream().cuda_stream,
        "stream_names": dict(tracker._names),
        "reports": len(tracker.reports()),
        "torch": torch.__version__,
    }
    with gzip.open(args.out, "wb") as fh:
        pickle.dump(dump, fh)
    records = sum(len(r) for r, _ in batches) // RECORD.size
    print(f"{what}: {len(batches)} batches, {records} records, {dump['reports']} reports -> {args.out}")
    return 0


def drains(batches: list[tuple[bytes, bytes]], size: int = DRAIN_AT) -> list[tuple[bytes, bytes]]:
    """The recorded records, in order, cut into drains of `size` records (a record's first item
    renumbered within its drain)."""
    from racecheck.detect.feed_apply import ITEM

    out: list[tuple[bytes, bytes]] = []
    records: list[bytes] = []
    items: list[bytes] = []
    for batch_records, batch_items in batches:
        for r in RECORD.iter_unpack(batch_records):
            kind, op, stream, device, frame, first, count, extra = r
            its = batch_items[first * ITEM.size : (first + count) * ITEM.size]
            records.append(RECORD.pack(kind, op, stream, device, frame, len(items), count, extra))
            items += [its[k * ITEM.size : (k + 1) * ITEM.size] for k in range(count)]
            if len(records) == size:
                out.append((b"".join(records), b"".join(items)))
                records, items = [], []
    if records:
        out.append((b"".join(records), b"".join(items)))
    return out


def replay_once(dump: dict, engine: str) -> tuple[float, int, int]:
    """(seconds spent applying, reports, errors) of one replay into a fresh tracker by `engine`
    ("native" or "python")."""
    from racecheck.detect.feed_apply import apply_batch
    from racecheck.detect.native_feed import NativeFeed
    from racecheck.detect.torch_tracker import TorchRaceTracker

    tracker = TorchRaceTracker(device_type=dump["device_type"], path="python")  # the feed below is the native one
    current = dump["current"]
    tracker._current = lambda: current
    feed = NativeFeed(ReplayLog(), tracker, engine=engine)
    tracker._feed = feed  # where the engines ask for host storages and stacks
    if engine == "native":
        tracker.engine = feed.engine
    for handle, name in dump["stream_names"].items():
        tracker.name_stream(handle, name)
    feed.plans = [feed._plan(name, overload) for name, overload in dump["names"]]
    feed._streams.update(dump["streams"])
    gc.collect()  # earlier replays' trackers, which a run would not have, outside the timed part
    t0 = time.perf_counter()
    if engine == "native":
        for records, items in dump["drains"]:
            feed.engine.apply(records, items)  # type: ignore[union-attr]
    else:
        for records, items in dump["drains"]:
            apply_batch(feed, tracker, tracker.engine, records, items)
    spent = time.perf_counter() - t0
    return spent, len(tracker.engine.reports()), len(tracker.errors)


def replay(args) -> int:
    from racecheck.detect import ENGINE

    with gzip.open(args.dump, "rb") as fh:
        dump = pickle.load(fh)
    dump["drains"] = drains(dump["batches"])
    records = sum(len(r) for r, _ in dump["batches"]) // RECORD.size
    print(
        f"{dump['what']} (torch {dump['torch']}): {records} records over {dump['steps']} steps, "
        f"{len(dump['batches'])} drains recorded, replayed as {len(dump['drains'])}; Python engine {ENGINE}"
    )
    engines = args.engines.split(",")
    runs: dict[str, list] = {engine: [] for engine in engines}
    for _ in range(args.repeats):  # alternating: drift in the machine's load affects both alike
        for engine in engines:
            runs[engine].append(replay_once(dump, engine))
    for engine, done in runs.items():
        per_step = [spent / dump["steps"] * 1e3 for spent, _, _ in done]
        print(
            f"{engine} engine: {statistics.median(per_step):.3f} ms per step (median of {args.repeats}, "
            f"least {min(per_step):.3f}; runs {', '.join(f'{t:.3f}' for t in per_step)}); "
            f"reports {sorted({r for _, r, _ in done})} (recorded: {dump['reports']}), errors {done[0][2]}"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a workload's drains on a CUDA GPU")
    r.add_argument("--workload", choices=list(WORKLOADS), default="mlp-adamw")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of this script")
    add_workload_options(r)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--out", type=Path, required=True)
    p_replay = sub.add_parser("replay", help="apply a recording's drains again")
    p_replay.add_argument("dump", type=Path)
    p_replay.add_argument("--repeats", type=int, default=5)
    p_replay.add_argument("--engines", default="native,python", help="which engines replay it, alternating")
    args = p.parse_args()
    return record(args) if args.command == "record" else replay(args)


if __name__ == "__main__":
    sys.exit(main())
