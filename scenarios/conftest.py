"""Fixtures shared by every scenario suite: the process world, a runtime per test with the
perturbation (and, with --racecheck-detect, the race detector) installed, and the scenario's own
definition (scenario.toml)."""

import os
from pathlib import Path

import pytest

from racecheck.suites.catalogue import load_scenario


@pytest.fixture(scope="module")
def scenario(request):
    """The definition of the scenario whose folder holds the test module."""
    return load_scenario(Path(request.path).parent)


@pytest.fixture(scope="module")
def world(scenario):
    """The runtime of the process world torchrun / racecheck run started, whose size WORLD_SIZE
    says (`--world-size`, or the GPUs of the machine, may differ from the scenario's world_size);
    without a launcher, a world of the scenario's size. A world below its min_world_size fails."""
    from racecheck.scenario_kit.harness import WorldError, init_world

    size = int(os.environ.get("WORLD_SIZE") or scenario.world_size)
    if size < scenario.min_world_size:
        pytest.fail(
            f"{scenario.name} needs at least {scenario.min_world_size} ranks (its min_world_size), "
            f"this world has {size}",
            pytrace=False,
        )
    try:
        return init_world(size)
    except WorldError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def runtime(request, world, scenario):
    """The runtime with this test's perturbation installed (its block's, from the runner's
    schedule, else the scenario's default profile) and, with --racecheck-detect, the
    happens-before detector attached for the test: the per-test harness (racecheck.rank.harness),
    whose reports fail the test."""
    from racecheck.rank.harness import on_runtime

    with on_runtime(request.node, world, default=scenario.default_profile):
        yield world
