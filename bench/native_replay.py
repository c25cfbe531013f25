"""The native path's drains, recorded once on a GPU and replayed anywhere: where applying the
native log's records costs time, measured without the GPU's noise.

    python bench/native_replay.py record --workload fsdp2 --out /tmp/fsdp2.dump    # one CUDA GPU
    python bench/native_replay.py replay /tmp/fsdp2.dump --repeats 5               # any machine

`record` runs bench/detector_overhead_native.py's workload (its --warmup and --iters steps) under
TorchRaceTracker on the native path and keeps every batch the log hands to the tracker (the Record
and Item arrays, as op_log.cpp's drain returns them), the operator names in the order the log
numbered them, and the stream handles the feed looked up. `replay` applies those batches again,
in order, to fresh trackers (the compiled engine where it is built, as in a run) and prints the
time per recorded step and the reports each replay gives: a change to feed_apply.py or the engine
is compared on the same records, with the same reports, before it goes to the GPU. Stacks are
not replayed (a report's frames come from the live log), only their ids.
"""

from __future__ import annotations

import argparse
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

from racecheck.detect.feed_apply import RECORD  # noqa: E402


def record(args) -> int:
    import torch

    cpu = args.device == "cpu"
    bench.init_world(args.workload, cpu)
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
    with tracker:
        step, what = bench._workload(args, torch.device("cpu") if cpu else torch.device("cuda", 0))
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


def replay_once(dump: dict) -> tuple[float, int, int]:
    """(seconds spent applying, reports, errors) of one replay into a fresh tracker."""
    from racecheck.detect.feed_apply import apply_batch
    from racecheck.detect.native_feed import NativeFeed
    from racecheck.detect.torch_tracker import TorchRaceTracker

    tracker = TorchRaceTracker(device_type=dump["device_type"], path="python")  # the feed below is the native one
    current = dump["current"]
    tracker._current = lambda: current
    for handle, name in dump["stream_names"].items():
        tracker.name_stream(handle, name)
    feed = NativeFeed(log=None, tracker=tracker)
    feed.plans = [feed._plan(name, overload) for name, overload in dump["names"]]
    feed._streams.update(dump["streams"])
    engine = tracker.engine
    gc.collect()  # earlier replays' trackers, which a run would not have, outside the timed part
    t0 = time.perf_counter()
    for records, items in dump["batches"]:
        apply_batch(feed, tracker, engine, records, items)
    spent = time.perf_counter() - t0
    return spent, len(engine.reports()), len(tracker.errors)


def replay(args) -> int:
    from racecheck.detect import ENGINE

    with gzip.open(args.dump, "rb") as fh:
        dump = pickle.load(fh)
    records = sum(len(r) for r, _ in dump["batches"]) // RECORD.size
    print(f"{dump['what']} (torch {dump['torch']}): {records} records over {dump['steps']} steps; engine {ENGINE}")
    runs = [replay_once(dump) for _ in range(args.repeats)]
    per_step = [spent / dump["steps"] * 1e3 for spent, _, _ in runs]
    print(
        f"applying: {statistics.median(per_step):.3f} ms per step (median of {args.repeats}, "
        f"least {min(per_step):.3f}; "
        f"runs {', '.join(f'{t:.3f}' for t in per_step)}); "
        f"reports {sorted({r for _, r, _ in runs})} (recorded: {dump['reports']}), errors {runs[0][2]}"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a workload's drains on a CUDA GPU")
    r.add_argument("--workload", choices=("mlp", "fsdp2"), default="mlp")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of this script")
    bench.add_workload_options(r)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--out", type=Path, required=True)
    p_replay = sub.add_parser("replay", help="apply a recording's drains again")
    p_replay.add_argument("dump", type=Path)
    p_replay.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    return record(args) if args.command == "record" else replay(args)


if __name__ == "__main__":
    sys.exit(main())
