"""racecheck.scenario_kit.harness's numerical verdict: a NaN anywhere (a poisoned block read by the update) fails it."""

from __future__ import annotations

import math

import pytest
import torch

from racecheck.scenario_kit.harness import check_parity, update_errors

INITIAL = {"w": torch.zeros(3)}
REFERENCE = {"w": torch.ones(3)}
NAN = torch.tensor([1.0, float("nan"), 1.0])


@pytest.mark.parametrize("replicas", [[torch.ones(3), NAN], [NAN, torch.ones(3) * 1.5]], ids=["nan-last", "nan-first"])
def test_a_nan_in_any_replica_is_the_worst_error(replicas):
    (error,) = update_errors(INITIAL, [{"w": r} for r in replicas], REFERENCE)
    assert math.isnan(error.rel_error)
    with pytest.raises(AssertionError, match="parameter 'w' update off by nan%"):
        check_parity(losses=[1.0], ref_losses=[1.0], errors=[error], rtol=1e-4)


def test_the_worst_replica_counts():
    (error,) = update_errors(INITIAL, [{"w": torch.ones(3) * 1.1}, {"w": torch.ones(3) * 1.5}], REFERENCE)
    assert error.rel_error == pytest.approx(0.5)
