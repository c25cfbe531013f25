"""The detector of one test, as the per-test harness (harness.py) starts, reads and stops it:

- RuntimeDetector: a RaceDetector attached to racecheck's runtime (the catalogue's scenarios);
  it stays attached through the runtime fixture's teardown, whose frees can still race;
- TrackerDetector: TorchRaceTracker around a project's own test, on CUDA or, on the CPU, over
  the host streams of patch mode's recording twin (racecheck.perturb.recording); it stops once
  the test's call has run: the suite's own teardown is not the code under test.

Both stop inside a synchronization of their device, so that the detector sees the host learn
that the streams' work completed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from racecheck.detect.report import RaceReport
    from racecheck.device.base import Runtime

MAX_ERRORS = 5  # a tracker's distinct error messages a test's record keeps


class RuntimeDetector:
    """RaceDetector on the runtime `rt`."""

    stops_after_call = False

    def __init__(self, rt: Runtime) -> None:
        from racecheck.detect import RaceDetector

        self.rt = rt
        self.detector = RaceDetector()
        self.unseen_kernels: dict[str, int] = {}  # the runtime launches no kernel it cannot read
        self.errors: list[str] = []  # the observer keeps no errors: a failure of its own is raised
        self._attached = False

    def start(self) -> None:
        self.detector.attach(self.rt)
        self._attached = True

    def stop(self) -> None:
        if self._attached:
            self._attached = False
            try:
                self.rt.synchronize()
            finally:
                self.detector.detach()

    def reports(self) -> list[RaceReport]:
        return self.detector.reports()


class TrackerDetector:
    """TorchRaceTracker on CUDA, or over the recording twin's host streams (`recording`)."""

    stops_after_call = True

    def __init__(self, *, recording: bool) -> None:
        self.recording = recording
        self.tracker: Any = None
        self.unseen_kernels: dict[str, int] = {}  # kernels whose writes it could not tell
        self.errors: list[str] = []  # the tracker's own failures: what it could not record
        self._running = False

    def start(self) -> None:
        from racecheck.detect.torch_tracker import TorchRaceTracker

        if not self.recording:
            self.tracker = TorchRaceTracker()
            self.tracker.__enter__()
            self._running = True
            return
        from racecheck.perturb import recording

        self.tracker = TorchRaceTracker(
            device_type="cpu",
            current_stream=lambda: recording.current_stream().handle,
            stream_handle=lambda s: s.handle,  # type: ignore[attr-defined]  # a HostStream's
        )
        self.tracker.name_stream(recording.DEFAULT.handle, "default")
        self.tracker.__enter__()
        recording.listen(self.tracker)  # its host events' record and wait, as CUDA's trace would
        self._running = True

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            if self.recording:
                from racecheck.perturb import recording

                recording.unlisten(self.tracker)
            else:
                import torch

                torch.cuda.synchronize()
        finally:
            self.tracker.__exit__(None, None, None)
        self.unseen_kernels = dict(self.tracker.unseen_kernels)
        self.errors = list(dict.fromkeys(self.tracker.errors))[:MAX_ERRORS]

    def reports(self) -> list[RaceReport]:
        return [] if self.tracker is None else self.tracker.reports()
