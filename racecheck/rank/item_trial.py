"""What the plugin keeps on each collected item (in item.stash, under ITEM_TRIAL): which trial and
arm the item runs and what happened to it. A module of its own, so that the plugin's parts
(plugin.py, project.py) and test code read it without importing each other."""

from __future__ import annotations

import dataclasses

import pytest


@dataclasses.dataclass
class ItemTrial:
    """Per-item data, kept in item.stash: which trial and arm this item runs, and what happened."""

    step: int  # the repeat step (the block's position in the session)
    trial: int
    arm: str
    test: str  # node id without the step's id suffix
    params: str
    outcomes: list = dataclasses.field(default_factory=list)
    signature: str = ""
    message: str = ""
    duration: float = 0.0
    reports: list = dataclasses.field(default_factory=list)  # detector reports attached by fixtures
    perturb: str = ""  # the canonical spec of this block (the schedule's), "" for the options'
    patch: object = None  # project suites: this test's installed PatchMode (project.py)
    tracker: object = None  # project suites with --racecheck-detect: its TorchRaceTracker
    unseen_kernels: dict = dataclasses.field(default_factory=dict)  # its kernels of unknown writes


ITEM_TRIAL = pytest.StashKey[ItemTrial]()
