"""Happens-before race detection: free-while-in-use and unsynchronized cross-stream accesses,
reported in a single run, whatever the timing.

- `RaceDetector` (observer.py): on a racecheck runtime (the CPU emulation or CUDA), from the
  runtime's own allocation, launch, event and synchronization events.
- `TorchRaceTracker` (torch_tracker.py): on CUDA, for plain PyTorch code that is not written
  against the runtime, from PyTorch's dispatcher and CUDA trace callbacks (torch.cuda._sanitizer's
  machinery, extended so that a free keeps the block's history until its reuse).
Both feed one engine (engine.py) and produce the same reports (report.py). The engine runs
compiled when setup.py could build it, else in Python (native.py; `ENGINE` says which). The
tracker's native path applies its log with the same engine's rules in C++ (native_engine.py), with
the same reports.
"""

from racecheck.detect.engine import HappensBefore
from racecheck.detect.native import KIND as ENGINE  # first: it may replace the compiled engine
from racecheck.detect.observer import RaceDetector
from racecheck.detect.report import RaceKind, RaceReport, render

__all__ = [
    "ENGINE",
    "HappensBefore",
    "RaceDetector",
    "RaceKind",
    "RaceReport",
    "TorchRaceTracker",
    "TrackerUnavailable",
    "render",
]


# Imported on first use: torch_tracker imports torch.cuda._sanitizer, which the runtime's detector
# and the engine do without.
_LAZY = {name: "racecheck.detect.torch_tracker" for name in ("TorchRaceTracker", "TrackerUnavailable")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
