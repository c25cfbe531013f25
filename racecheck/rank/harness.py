"""One test's perturbation and detector, installed around it and read back after it: the one
harness of the catalogue's scenarios (the runtime fixture of scenarios/conftest.py: the runtime's
injector and RaceDetector) and of a project's own suite (project.py: patch mode and
TorchRaceTracker).

A race the detector reports fails the test, with the reports as its failure text: once the test's
call has run (the plugin's pytest_runtest_call asks `after_call`), also when the body failed on
its own (the race explains it), and at the end (`finish`) for a race found later, in a fixture's
teardown. The reports stay RaceReport objects until the test's outcome is written
(ItemTrial.reports; the plugin writes their text).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import pytest

from racecheck.protocol import names
from racecheck.rank.failure_text import race_failure
from racecheck.rank.item_trial import ITEM_TRIAL, ItemTrial

if TYPE_CHECKING:
    from racecheck.detect.report import RaceReport
    from racecheck.device.base import Runtime
    from racecheck.perturb.injector import Injector
    from racecheck.perturb.profiles import Profile


class Perturbation(Protocol):
    """What a test runs under: installed before it, uninstalled after it."""

    def install(self) -> None: ...

    def uninstall(self) -> dict:
        """Uninstall; the fields of the test's outcome that say what it did."""
        ...


class Detector(Protocol):
    """A detector that watches the test (detectors.py)."""

    stops_after_call: bool  # stopped once the call has run, else at the end
    unseen_kernels: dict[str, int]
    errors: list[str]  # what it failed to record (a tracker's own errors)

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def reports(self) -> list[RaceReport]: ...


class Harness:
    """The perturbation and detector of the test whose ItemTrial is `trial`."""

    def __init__(self, trial: ItemTrial, perturbation: Perturbation, detector: Detector | None) -> None:
        self.trial = trial
        self.perturbation = perturbation
        self.detector = detector
        self._raised = 0  # reports that already failed the test

    def start(self) -> None:
        self.perturbation.install()
        if self.detector is not None:
            self.detector.start()

    def after_call(self) -> list[RaceReport]:
        """The reports found by the end of the call that have not failed the test yet."""
        if self.detector is None:
            return []
        if self.detector.stops_after_call:
            self.detector.stop()
        return self._new(self.detector.reports())

    def finish(self) -> list[RaceReport]:
        """Stop the detector and uninstall the perturbation; what they did goes into the trial
        (its outcome's fields and reports). The reports that have not failed the test yet."""
        try:
            if self.detector is not None:
                self.detector.stop()
        finally:
            fields = self.perturbation.uninstall()
        if self.detector is None:
            self.trial.fields = fields
            return []
        kernels = self.detector.unseen_kernels
        errors = self.detector.errors
        self.trial.fields = {
            **fields,
            **({"unseen_kernels": kernels} if kernels else {}),
            **({"detector_errors": errors} if errors else {}),
        }
        self.trial.reports = self.detector.reports()
        return self._new(self.trial.reports)

    def _new(self, reports: list[RaceReport]) -> list[RaceReport]:
        new, self._raised = reports[self._raised :], len(reports)
        return new


HARNESS = pytest.StashKey[Harness]()


def check_call(item: pytest.Item, failure: BaseException | None) -> None:
    """After the call of `item` (`failure`: what its body raised, if it did): fail it with the
    races its harness found by then."""
    harness = item.stash.get(HARNESS, None)
    reports = harness.after_call() if harness is not None else []
    if reports:
        pytest.fail(race_failure(reports, failure), pytrace=False)
    if failure is not None:
        raise failure


class RuntimePerturbation:
    """The injector of `profile` on racecheck's runtime `rt` (racecheck.perturb.injector)."""

    def __init__(self, rt: Runtime, profile: Profile, *, seed: int) -> None:
        self.rt, self.profile, self.seed = rt, profile, seed
        self.injector: Injector | None = None

    def install(self) -> None:
        from racecheck.perturb.injector import install

        self.injector = install(self.rt, self.profile, seed=self.seed)

    def uninstall(self) -> dict:
        """What the injector did in this test, for its outcome: the actions it took by kind (its
        log), so that a profile that never acts on the scenario's path (a rule on a stream it
        never uses) is said to prove nothing, as a project's is."""
        from racecheck.perturb.injector import uninstall

        injector = self.injector
        try:
            uninstall(self.rt, injector)
        finally:
            self.rt.synchronize()
        if injector is None or self.profile.is_off:
            return {}
        return {"actions": dict(collections.Counter(type(f.action).__name__.lower() for f in injector.log))}


@contextlib.contextmanager
def on_runtime(item: pytest.Item, rt: Runtime, *, default: Profile) -> Iterator[Runtime]:
    """The runtime `rt` for the test `item`, with the injector of its block's profile (else the
    test's `default`) installed, seeded by its trial, and with --racecheck-detect the race
    detector attached, for the duration of the block; a race found after the call (a free in a
    fixture's teardown) fails the test at the end."""
    from racecheck.rank.detectors import RuntimeDetector

    trial = item.stash[ITEM_TRIAL]
    seed = item.config.getoption(names.SEED.flag) + trial.trial
    detector = RuntimeDetector(rt) if item.config.getoption(names.DETECT.flag) else None
    harness = Harness(trial, RuntimePerturbation(rt, trial.profile or default, seed=seed), detector)
    item.stash[HARNESS] = harness
    harness.start()
    try:
        yield rt
    finally:
        late = harness.finish()
    if late:
        pytest.fail(race_failure(late, None), pytrace=False)
