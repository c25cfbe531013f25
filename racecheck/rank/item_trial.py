"""What the plugin keeps on each collected item (in item.stash, under ITEM_TRIAL): which trial and
arm the item runs and what happened to it. A module of its own, so that the plugin's parts
(plugin.py, harness.py, project.py) and test code read it without importing each other."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from racecheck.detect.report import RaceReport
    from racecheck.perturb.profiles import Profile


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
    racecheck_frame: str = ""  # where racecheck's own instruments raised the failure, if they did
    duration: float = 0.0
    perturb: str = ""  # the canonical spec of this block, "" where the test's own default decides
    profile: Profile | None = None  # that spec, parsed once for the session (None: no spec)
    # What its harness (harness.py) found and did: the detector's reports, written as text with
    # the outcome, and the outcome's fields of the perturbation (patch mode's actions) and the
    # detector (kernels whose writes it could not tell).
    reports: list[RaceReport] = dataclasses.field(default_factory=list)
    fields: dict = dataclasses.field(default_factory=dict)


ITEM_TRIAL = pytest.StashKey[ItemTrial]()
