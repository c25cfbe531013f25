"""Fixtures shared by every scenario suite: the process world, a runtime per test with the
perturbation installed, and the scenario's own definition (scenario.toml)."""

import os
from pathlib import Path

import pytest

from racecheck.trials.catalogue import load_scenario


@pytest.fixture(scope="module")
def scenario(request):
    """The definition of the scenario whose folder holds the test module."""
    return load_scenario(Path(request.path).parent)


@pytest.fixture(scope="module")
def world(scenario):
    """The runtime of a process world of the scenario's size (started by torchrun / racecheck run);
    RACECHECK_WORLD_SIZE overrides the size, for machines with fewer GPUs than the scenario's."""
    from racecheck.harness import WorldError, init_world

    try:
        return init_world(int(os.environ.get("RACECHECK_WORLD_SIZE") or scenario.world_size))
    except WorldError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def runtime(world, scenario, racecheck_perturb, racecheck_seed):
    """The runtime with this test's perturbation installed (the scenario's default profile unless
    --racecheck-perturb says otherwise)."""
    from racecheck.harness import perturbation

    spec = scenario.default_perturb if racecheck_perturb is None else racecheck_perturb
    with perturbation(world, spec, seed=racecheck_seed):
        yield world
    world.synchronize()
