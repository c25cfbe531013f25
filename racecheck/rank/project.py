"""The plugin's part for project suites (`--racecheck-patch`): suites that use torch.cuda and
torch.distributed directly rather than racecheck's runtime. Around every test it installs patch
mode (racecheck.perturb.patch) with the test's block's profile, seeded by the trial, and with
--racecheck-detect it runs the test under TorchRaceTracker; what the perturbation did goes into
the test's outcome event (`actions`, `delayed`).

The systematic schedule's enumeration (racecheck.perturb.systematic) is read from and written to
the folder given with --racecheck-handoffs (the runner's OUT/handoffs), else kept in memory.
"""

from __future__ import annotations

import os
import sys

import pytest

from racecheck.perturb.patch_actions import PatchUnavailable, actions_factory
from racecheck.perturb.profiles import Profile, rank_profile
from racecheck.protocol import names


def configure_project(config: pytest.Config, specs: list) -> ProjectTests:
    """Register per-test patch mode and detection for a project suite whose tests run the
    profiles `specs`; a profile or the detector that cannot act here is a usage error, in one line."""
    from racecheck.perturb.patch import PatchMode

    acting = [s for s in specs if s and not rank_profile(s).is_off]
    for spec in acting:
        try:
            PatchMode(rank_profile(spec), actions=object())  # the grammar check alone; nothing is installed
        except ValueError as exc:
            raise pytest.UsageError(f"{names.SCHEDULE.flag}: {exc}") from None
    detect = config.getoption(names.DETECT.flag)
    factory = None
    if acting or detect:
        try:
            factory = actions_factory(need=f"the profile {acting[0]!r}" if acting else "--detect")
        except PatchUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None
    project = ProjectTests(factory=factory, handoffs_dir=config.getoption(names.HANDOFFS.flag), detect=detect)
    config.pluginmanager.register(project, "racecheck-project")
    return project


class ProjectTests:
    """Per-test patch mode and detection for one pytest session (a plugin object)."""

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
    def _load(self, arm: str, test: str) -> list[str] | None:
        if self.store is not None:
            return self.store.load(arm, test, self.rank)
        return self.memory.get((arm, test))

    def _save(self, arm: str, test: str, keys: list[str]) -> None:
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
        keys = self._load(arm, test) if trial > 0 else None
        if keys is None:
            return None
        return tuple(keys[i] for i in selection(trial, len(keys), pairs=profile.systematic.pairs))

    # -- one test --------------------------------------------------------------------------
    def start(self, t, *, spec: str, seed: int) -> None:
        """Install patch mode (and the tracker) for the test whose ItemTrial is `t`."""
        from racecheck.perturb.patch import PatchMode

        profile = rank_profile(spec)
        t.perturb = profile.to_spec()
        t.patch = None
        if not profile.is_off:
            plan = self.plan(profile, arm=t.arm, test=t.test, trial=t.trial)
            t.patch = PatchMode(profile, seed=seed, rank=self.rank, actions=self.factory(), plan=plan)
            t.patch.install()
        if self.detect:
            t.tracker = self.factory.start_tracker()

    def stop_tracker(self, t) -> list[str]:
        """End the test's tracker (once); the texts of its reports."""
        tracker, t.tracker = t.tracker, None
        if tracker is None:
            return []
        self.factory.stop_tracker(tracker)
        t.unseen_kernels = dict(getattr(tracker, "unseen_kernels", {}))  # kernels it could not read
        return [r.text() for r in tracker.reports()]

    def finish(self, t) -> dict:
        """Uninstall the test's patch; the fields its outcome event gets."""
        self.stop_tracker(t)
        detector = {"unseen_kernels": t.unseen_kernels} if t.unseen_kernels else {}
        patch, t.patch = t.patch, None
        if patch is None:
            return {
                "perturb": t.perturb or "off",
                "actions": {"sleep": 0, "pressure": 0, "poison": 0},
                "delayed": [],
                **detector,
            }
        patch.uninstall()
        if patch.systematic is not None and patch.plan is None:
            self._save(t.arm, t.test, list(patch.handoffs))
        delayed = list(patch.plan) if patch.systematic is not None and patch.plan else []
        fields = {"perturb": t.perturb, "actions": dict(patch.counts), "delayed": delayed, **detector}
        if patch.systematic is not None and patch.plan is None:
            fields["handoffs"] = len(patch.handoffs)
        return fields

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        from racecheck.rank.item_trial import ITEM_TRIAL

        t = item.stash.get(ITEM_TRIAL, None)
        try:
            result = yield
        finally:
            texts = self.stop_tracker(t) if t is not None else []
            if t is not None:
                t.reports.extend(texts)
        if texts:  # the reports are the test's failure text
            pytest.fail(_joined(texts), pytrace=False)
        return result


def _joined(texts: list[str]) -> str:
    head = f"racecheck --detect: {len(texts)} race report(s)"
    return "\n\n".join([head, *texts])
