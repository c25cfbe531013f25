"""Which records the native log drained for the first tracker of a process, over ordered code
with a compiled function on a side stream (`cold`: compiled under the tracker; `warm`: compiled and
run once before it): the reports, the tracker's counters, and every record other than a plain
operator's. Written to find why the native path reported the first test of every run of
examples/compiled: no record of CUDA's trace (allocation, free, event record or wait) reached the
log. Its output before the fix is reports/gpu/native_first_tracker_debug.log.

    python3 bench/first_tracker_records.py cold|warm      # on a CUDA machine, a fresh process each
"""

from __future__ import annotations

import collections
import os
import sys

import torch

from racecheck.detect import TorchRaceTracker, feed_apply, native_feed

N = 1 << 22


def ordered(work, generator) -> None:
    """A default-stream tensor read by `work` on a side stream, kept by record_stream, and the
    output read after the default stream waited: no race."""
    side = torch.cuda.Stream()
    x = torch.randn(N, device="cuda", generator=generator)
    expected = x * 3 + 1
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = work(x)
    x.record_stream(side)
    del x
    filler = torch.full((N,), -7.0, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    got = out.clone()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, expected)
    del filler


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "cold"
    drained: list[tuple] = []
    apply = native_feed.NativeFeed._apply

    def keep(feed, records: bytes, items: bytes) -> None:  # every drained record, then applied
        for kind, op, stream, device, _stack, _first, count, extra in feed_apply.RECORD.iter_unpack(records):
            plan = feed.plans[op] if 0 <= op < len(feed.plans) else None
            drained.append((kind, getattr(plan, "name", ""), stream, device, count, hex(extra) if extra > 0 else extra))
        apply(feed, records, items)

    native_feed.NativeFeed._apply = keep
    work = torch.compile(lambda x: x * 3.0 + 1.0)
    generator = torch.Generator(device="cuda").manual_seed(1)
    if mode == "warm":
        ordered(work, generator)
    with TorchRaceTracker() as tracker:
        ordered(work, generator)
    native_feed.NativeFeed._apply = apply
    reports = tracker.reports()
    engine = os.environ.get("RACECHECK_DETECT_ENGINE")
    print("MODE", mode, "path", tracker.path, "engine", engine, "reports", len(reports), "errors", tracker.errors,
          dict(tracker.stats))  # fmt: skip
    for report in reports[:1]:
        print(report.text()[:900])
    print("record kinds", collections.Counter(r[0] for r in drained))
    for r in drained:
        if r[0] != feed_apply.OP or r[4] or r[1] in ("aten.randn.generator", "aten.clone.default", "aten.full.default"):
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
