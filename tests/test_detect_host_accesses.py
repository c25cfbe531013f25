"""The PyTorch tracker's view of host memory that streams touch ([Note: host accesses] in
racecheck/detect/host_accesses.py), driven on the CPU as test_detect_torch_tracker.py drives it.
"""

from __future__ import annotations

import pytest
import torch
from tracker_kit import (
    DEFAULT,
    RS,
    N,
    alloc,
    cur,  # noqa: F401 (fixtures)
    record,
    wait,
)

from racecheck.detect import RaceKind
from racecheck.detect.torch_tracker import TorchRaceTracker

# -- host accesses ([Note: host accesses] in torch_tracker.py) -----------------------------------
# On the CPU every tensor is host memory; `host_memory` marks which ones stand for pinned host
# buffers, the rest for device memory. `.copy_(..., non_blocking=True)` between the two is the
# stream's work, an operation on a pinned tensor alone is the host's.


@pytest.fixture
def host_tracker(cur):
    pinned: set[int] = set()
    t = TorchRaceTracker(
        device_type="cpu",
        current_stream=cur,
        stream_handle=lambda s: s,
        host_memory=lambda x: x.untyped_storage().data_ptr() in pinned,
    )
    t.name_stream(DEFAULT, "default")
    t.name_stream(RS, "side")
    with t:
        yield t, pinned
    assert t.errors == []


def pinned_buffer(pinned: set[int], numel: int = N) -> torch.Tensor:
    h = torch.empty(numel)  # no data touched: marked as host memory before its first write
    pinned.add(h.untyped_storage().data_ptr())
    return h.zero_()


def device_to_host(tracker, cur, pinned, *, wait_for: str | None):
    """A side stream copies a device tensor into a pinned buffer (non-blocking) and records an
    event; the host reads the buffer, after `wait_for` ("event", "stream", "device") or not."""
    src = alloc(tracker, cur, DEFAULT).fill_(2.0)
    host = pinned_buffer(pinned)  # the host's: written before any stream touched it
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    host.copy_(src, non_blocking=True)  # queued on the side stream
    record(tracker, 2, RS)
    cur.current = DEFAULT
    if wait_for == "event":
        tracker.handler._handle_event_synchronization(2)
    elif wait_for == "stream":
        tracker.handler._handle_stream_synchronization(RS)
    elif wait_for == "device":
        tracker.handler._handle_device_synchronization()
    return float(host.sum())  # the host reads it


def test_a_host_read_before_the_copy_into_pinned_memory_is_known_complete_is_a_race(host_tracker, cur):
    tracker, pinned = host_tracker
    device_to_host(tracker, cur, pinned, wait_for=None)
    reports = tracker.reports()
    assert [r.kind for r in reports] == [RaceKind.READ_AFTER_WRITE]
    text = reports[0].text()
    assert "host" in text and "side" in text and "test_detect_host_accesses.py" in text  # both sides located


@pytest.mark.parametrize("wait_for", ["event", "stream", "device"])
def test_a_host_read_after_a_host_synchronization_is_not(host_tracker, cur, wait_for):
    tracker, pinned = host_tracker
    device_to_host(tracker, cur, pinned, wait_for=wait_for)
    assert tracker.reports() == []


def test_a_host_refill_while_a_copy_from_the_buffer_is_queued_is_a_race(host_tracker, cur):
    tracker, pinned = host_tracker
    host = pinned_buffer(pinned).fill_(1.0)
    dst = alloc(tracker, cur, DEFAULT)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    dst.copy_(host, non_blocking=True)  # host to device, queued on the side stream
    cur.current = DEFAULT
    host.fill_(5.0)  # the host refills the buffer: the queued copy may read either
    assert [r.kind for r in tracker.reports()] == [RaceKind.WRITE_AFTER_READ]


@pytest.mark.parametrize("dies_first", ["alias", "buffer"])
def test_a_pinned_buffer_seen_through_an_alias_is_freed_when_its_last_storage_dies(host_tracker, cur, dies_first):
    """torch.from_dlpack makes a second storage over a buffer's bytes, which keeps the buffer
    alive: the buffer stays tracked while either storage lives, whichever an upload read first and
    whichever dies first, and is freed once both have died."""
    tracker, pinned = host_tracker
    host = pinned_buffer(pinned).fill_(1.0)
    alias = torch.from_dlpack(host)  # a second storage starting at the buffer's first byte
    assert alias.untyped_storage()._cdata != host.untyped_storage()._cdata
    dst, dst2 = alloc(tracker, cur, DEFAULT), alloc(tracker, cur, DEFAULT)
    record(tracker, 1, DEFAULT)
    wait(tracker, 1, RS)
    cur.current = RS
    dst.copy_(alias, non_blocking=True)  # the buffer first seen through the alias
    dst2.copy_(host, non_blocking=True)
    cur.current = DEFAULT
    start = host.data_ptr()
    if dies_first == "alias":
        del alias  # the buffer lives on
        host.fill_(5.0)  # the host refills it while the uploads are queued
    else:
        del host  # the alias keeps the buffer, and its storage, alive
        alias.fill_(5.0)
    assert [r.kind for r in tracker.reports()] == [RaceKind.WRITE_AFTER_READ]
    assert tracker.engine.allocation_at(start) is not None
    tracker.handler._handle_device_synchronization()
    del dst, dst2
    if dies_first == "alias":
        del host
    else:
        del alias
    assert tracker.engine.allocation_at(start) is None  # freed with the last of its storages


def test_blocking_copies_and_item_synchronize_the_host(host_tracker, cur):
    tracker, pinned = host_tracker
    src, out = alloc(tracker, cur, RS), alloc(tracker, cur, RS)
    host = pinned_buffer(pinned)
    cur.current = RS
    src.fill_(3.0)
    host.copy_(src)  # blocking: returns once the side stream did it
    cur.current = DEFAULT
    assert float(host.sum()) == 3.0 * N
    cur.current = RS
    out.fill_(4.0)
    value = out[0].item()  # the host waits for the side stream
    cur.current = DEFAULT
    host.fill_(value)
    assert tracker.reports() == []
