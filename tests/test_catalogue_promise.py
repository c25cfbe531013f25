"""The README's promise about the catalogue, checked through `racecheck run` as a user runs it:
every scenario's race arm fails and every safe arm passes under its profile, all scenarios and
arms in one run of one trial (read from summary.csv). A module of its own: it is the suite's
longest test, and under `pytest -n` (--dist loadfile) a module runs in one process, so the other
promises (test_readme_promises.py) run beside it in another.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from run_kit import racecheck

from racecheck.runner.trial_log import read_log
from racecheck.suites.catalogue import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"

pytestmark = pytest.mark.usefixtures("fast_sessions")


def _catalogue_arms() -> dict[tuple[str, str], str]:
    """{(scenario, arm): expect} of every scenario.toml under scenarios/."""
    arms = {}
    for toml in sorted(SCENARIOS.glob("*/scenario.toml")):
        scenario = load_scenario(toml.parent)
        arms.update({(scenario.name, arm): spec.expect for arm, spec in scenario.arms.items()})
    return arms


@pytest.mark.slow
def test_every_race_arm_of_the_catalogue_fails_and_every_safe_arm_passes_in_one_run(tmp_path):
    """`racecheck run --scenario all --arms all`: each scenario under its default profile, one
    trial per arm (about 70 s on the 2-core CPU machine, one session per scenario)."""
    out = tmp_path / "out"
    res = racecheck(
        "run", "--scenario", "all", "--arms", "all", "--trials", 1, "--backend", "sim", "--out", out, "-q", cwd=ROOT
    )
    assert res.code == 0, res
    rows = pd.read_csv(out / "summary.csv", keep_default_na=False)
    trials = rows[rows.test == "*"]
    got = {(r.scenario, r.arm): (r.expect, int(r.failures), int(r.trials)) for r in trials.itertuples()}
    expected = _catalogue_arms()
    assert set(got) == set(expected), "every arm of every scenario ran"
    assert len({s for s, _ in expected}) == 11 and sum(e == "race" for e in expected.values()) == 12
    wrong = [
        f"{scenario}/{arm} ({expect}): {failures}/{ran} failed"
        for (scenario, arm), (expect, failures, ran) in sorted(got.items())
        if ran != 1 or failures != (1 if expect == "race" else 0) or expect != expected[scenario, arm]
    ]
    assert not wrong, "\n".join(wrong)
    # The motivating scenario under its default profile (rs_window): every parametrization of the
    # baseline fails, not just one (the window it opens, not luck, makes the collision), and each
    # failure's replay line names the scenario and the arm.
    motivating = [r for r in read_log(out / "trials.jsonl") if r.scenario == "main_grad_reuse"]
    assert {r.outcome for r in motivating if r.arm == "baseline"} == {"failed"}
    assert len({r.test for r in motivating if r.arm == "baseline"}) == 4
    assert {r.outcome for r in motivating if r.arm == "fixed"} == {"passed"}
    assert all("--scenario main_grad_reuse --arms baseline" in r.replay for r in motivating if r.arm == "baseline")
    # Each record says what the injector did: the scenario's own profile acted (rs_window holds and
    # delays), so no note says that a profile never acted.
    assert all(r.actions and sum(r.actions.values()) > 0 for r in motivating)
    assert "never acted" not in res.out
