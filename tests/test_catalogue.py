"""The race catalogue as a labelled benchmark: every scenario has a race arm and a safe arm, a
default profile that parses, a world size it can show the race at, and a README that cites its
public source and names every arm. Reads the scenario folders only (no test session starts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from racecheck.perturb.profiles import parse_profile
from racecheck.suites.catalogue import find_catalogue, load_catalogue

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
CATALOGUE = load_catalogue(find_catalogue(str(SCENARIOS)))


def test_the_catalogue_holds_at_least_eleven_scenarios():
    assert len(CATALOGUE) >= 11, sorted(CATALOGUE)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_scenario_is_labelled(name):
    scenario = CATALOGUE[name]
    expects = {arm.expect for arm in scenario.arms.values()}
    assert {"race", "safe"} <= expects, f"{name}: needs a race arm and a safe arm, has {expects}"
    assert not parse_profile(scenario.default_perturb).is_off, f"{name}: the default profile is off"
    assert 1 <= scenario.min_world_size <= scenario.world_size
    assert set(scenario.default_arms) <= set(scenario.arms)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_readme_cites_its_source_and_every_arm(name):
    readme = (SCENARIOS / name / "README.md").read_text()
    # A public report: owner/repository with an issue or pull-request number.
    assert re.search(r"[\w.-]+/[\w.-]+(?: PR)? ?#\d+", readme), f"{name}: no repository#number cited"
    for arm in CATALOGUE[name].arms:
        assert f"`{arm}`" in readme, f"{name}: README does not describe arm {arm!r}"
