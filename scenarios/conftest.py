"""Fixtures shared by every scenario suite: the process world, a runtime per test with the
perturbation (and, with --racecheck-detect, the race detector) installed, and the scenario's own
definition (scenario.toml)."""

import dataclasses
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


@dataclasses.dataclass
class _Detection:
    """The detector of one test, and how many of its reports already failed the test."""

    detector: object
    raised: int = 0


_DETECTION = pytest.StashKey[_Detection]()


@pytest.fixture
def runtime(request, world, scenario, racecheck_perturb, racecheck_seed, racecheck_detect, racecheck_reports):
    """The runtime with this test's perturbation installed (its block's, from the runner's
    schedule, else $RACECHECK_PERTURB, else the scenario's default profile) and, with --racecheck-detect, the
    happens-before detector attached for the test. Every detector report is appended to
    `racecheck_reports` (the outcome record's `reports`) and fails the test with the report as its
    failure text: in the call phase when found by then (pytest_runtest_call below), else in this
    fixture's teardown."""
    from racecheck.perturb.injector import resolve_spec
    from racecheck.scenario_kit.harness import perturbation

    spec = resolve_spec(racecheck_perturb, scenario.default_perturb)
    detection = None
    if racecheck_detect:
        from racecheck.detect import RaceDetector

        detection = request.node.stash[_DETECTION] = _Detection(RaceDetector())
    with perturbation(world, spec, seed=racecheck_seed):
        if detection is None:
            yield world
        else:
            with detection.detector.attached(world):
                yield world
                world.synchronize()  # inside: the detector sees the host learn of completion
    world.synchronize()
    if detection is None:
        return
    reports = detection.detector.reports()
    racecheck_reports.extend(r.text() for r in reports)
    if len(reports) > detection.raised:  # found after the call phase (frees in teardown)
        from racecheck.detect import render

        pytest.fail(render(reports[detection.raised :]), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """With the detector on, a race it found fails the test once the test body has run, with the
    report as the failure text (also when the body failed on its own: the race explains it)."""
    detection = item.stash.get(_DETECTION, None)
    if detection is None:
        return (yield)
    try:
        result = yield
        failure = None
    except (KeyboardInterrupt, pytest.skip.Exception):
        raise
    except BaseException as exc:  # pytest.fail's outcome is a BaseException too
        result, failure = None, exc
    reports = detection.detector.reports()
    if not reports:
        if failure is not None:
            raise failure
        return result
    from racecheck.detect import render

    detection.raised = len(reports)
    text = render(reports)
    if failure is not None:
        first = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
        text += f"\n\nThe test body failed too: {type(failure).__name__}: {first}"
    pytest.fail(text, pytrace=False)
