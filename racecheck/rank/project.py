"""The plugin's part for project suites (`--racecheck-patch`): suites that use torch.cuda and
torch.distributed directly rather than racecheck's runtime. Each test runs in the per-test harness
(harness.py) with patch mode (racecheck.perturb.patch) as its perturbation, the test's block's
profile seeded by the trial, and with --racecheck-detect TorchRaceTracker as its detector
(detectors.py); what the perturbation did goes into the test's outcome event (`actions`,
`delayed`).

The systematic schedule's enumeration (racecheck.perturb.systematic) is read from and written to
the folder given with --racecheck-handoffs (the runner's OUT/handoffs), else kept in memory.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from racecheck.perturb.patch_actions import PatchUnavailable, actions_factory
from racecheck.perturb.profiles import Profile, check_where
from racecheck.protocol import names
from racecheck.rank.harness import HARNESS, Harness
from racecheck.rank.item_trial import ItemTrial

if TYPE_CHECKING:
    from racecheck.perturb.patch import PatchMode


def configure_project(config: pytest.Config, profiles: list[Profile]) -> ProjectTests:
    """Per-test patch mode and detection for a project suite whose tests run `profiles`; a profile
    or the detector that cannot act here is a usage error, in one line."""
    acting = [p for p in profiles if not p.is_off]
    for profile in acting:
        try:
            check_where(profile, patch_mode=True)
        except ValueError as exc:
            raise pytest.UsageError(f"{names.SCHEDULE.flag}: {exc}") from None
    detect = config.getoption(names.DETECT.flag)
    factory = None
    if acting or detect:
        try:
            factory = actions_factory(need=f"the profile {acting[0].to_spec()!r}" if acting else "--detect")
        except PatchUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None
    return ProjectTests(factory=factory, handoffs_dir=config.getoption(names.HANDOFFS.flag), detect=detect)


class ProjectTests:
    """Per-test patch mode and detection for one pytest session."""

    def __init__(self, *, factory, handoffs_dir: str | None, detect: bool) -> None:
        from racecheck.perturb.systematic import HandoffStore

        self.factory = factory
        self.store = HandoffStore(handoffs_dir) if handoffs_dir else None
        self.memory: dict[tuple, list[str]] = {}  # the enumerations, without a folder
        self.detect = detect
        self.rank = int(os.environ.get("RANK", "0"))
        self._cuda = None if factory is None else factory.__name__ == "CudaActions"

    @property
    def cuda(self) -> bool:
        """Whether the tests run on CUDA (asked of torch only once the suite has imported it)."""
        if self._cuda is None:
            torch = sys.modules.get("torch")
            if torch is None:
                return False
            self._cuda = bool(torch.cuda.is_available())
        return self._cuda

    # -- systematic enumeration ------------------------------------------------------------
    def load(self, arm: str, test: str) -> list[str] | None:
        if self.store is not None:
            return self.store.load(arm, test, self.rank)
        return self.memory.get((arm, test))

    def save(self, arm: str, test: str, keys: list[str]) -> None:
        if self.store is not None:
            self.store.save(arm, test, self.rank, keys)
        else:
            self.memory[(arm, test)] = keys

    def plan(self, profile: Profile, *, arm: str, test: str, trial: int) -> tuple[str, ...] | None:
        """The keys a systematic trial delays; None: this trial records them (trial 0, or no
        enumeration exists yet, e.g. a shard that starts past trial 0)."""
        from racecheck.perturb.systematic import selection

        if profile.systematic is None or profile.systematic.at:
            return None
        keys = self.load(arm, test) if trial > 0 else None
        if keys is None:
            return None
        return tuple(keys[i] for i in selection(trial, len(keys), pairs=profile.systematic.pairs))

    # -- one test --------------------------------------------------------------------------
    def start(self, item: pytest.Item, t: ItemTrial, *, seed: int) -> Harness:
        """The harness of the test whose ItemTrial is `t`, started: patch mode with the block's
        profile (off without one) and, with --racecheck-detect, the tracker."""
        from racecheck.rank.detectors import TrackerDetector

        profile = t.profile or Profile("off")
        t.perturb = profile.to_spec()
        detector = None
        if self.detect:  # on CUDA, or over patch mode's CPU twin (tests)
            detector = TrackerDetector(recording=self.factory.__name__ == "RecordingActions")
        harness = Harness(t, PatchPerturbation(self, t, profile, seed=seed), detector)
        item.stash[HARNESS] = harness
        harness.start()
        return harness


class PatchPerturbation:
    """Patch mode for one test (nothing for a profile that is off); uninstalled, what it did."""

    def __init__(self, project: ProjectTests, t: ItemTrial, profile: Profile, *, seed: int) -> None:
        self.project, self.t, self.profile, self.seed = project, t, profile, seed
        self.patch: PatchMode | None = None

    def install(self) -> None:
        from racecheck.perturb.patch import PatchMode

        if self.profile.is_off:
            return
        t, project = self.t, self.project
        plan = project.plan(self.profile, arm=t.arm, test=t.test, trial=t.trial)
        patch = PatchMode(self.profile, seed=self.seed, rank=project.rank, actions=project.factory(), plan=plan)
        self.patch = patch.install()

    def uninstall(self) -> dict:
        patch, self.patch = self.patch, None
        if patch is None:
            return {
                "perturb": self.t.perturb or "off",
                "actions": {"sleep": 0, "pressure": 0, "poison": 0},
                "delayed": [],
            }
        patch.uninstall()
        recording = patch.systematic is not None and patch.plan is None
        if recording:
            self.project.save(self.t.arm, self.t.test, list(patch.handoffs))
        delayed = list(patch.plan) if patch.systematic is not None and patch.plan else []
        fields: dict[str, object] = {"perturb": self.t.perturb, "actions": dict(patch.counts), "delayed": delayed}
        if recording:
            fields["handoffs"] = len(patch.handoffs)
        return fields
