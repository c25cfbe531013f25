"""racecheck.results.stats against independent references (scipy's own Wilson and Fisher, hand
enumeration through the hypergeometric distribution, published values) and by its properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom, binomtest, fisher_exact, hypergeom

from racecheck.results import stats

FAST = settings(max_examples=60, deadline=None)


# ------------------------------------------------------------------------------------ Wilson


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
def test_wilson_matches_scipy(confidence):
    for n in range(1, 31):
        for k in range(n + 1):
            ref = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
            low, high = stats.wilson_interval(k, n, confidence=confidence)
            assert low == pytest.approx(ref.low, abs=1e-12)
            assert high == pytest.approx(ref.high, abs=1e-12)


def test_wilson_published_values():
    assert stats.wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=5e-5))
    low, high = stats.wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=5e-5), pytest.approx(0.7634, abs=5e-5))
    assert stats.wilson_interval(10, 10) == (pytest.approx(0.7225, abs=5e-5), 1.0)


def test_wilson_vectorised_and_edge_cases():
    low, high = stats.wilson_interval(np.array([0, 5, 10]), np.array([10, 10, 10]))
    assert low.shape == (3,) and low[0] == 0.0 and high[2] == 1.0
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    for bad in [(3, 2), (-1, 5)]:
        with pytest.raises(ValueError):
            stats.wilson_interval(*bad)
    for conf in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError):
            stats.wilson_interval(1, 2, confidence=conf)


@FAST
@given(n=st.integers(1, 400), data=st.data(), conf=st.floats(0.5, 0.999))
def test_wilson_contains_estimate_and_is_monotone_in_k(n, data, conf):
    k = data.draw(st.integers(0, n))
    low, high = stats.wilson_interval(k, n, confidence=conf)
    assert 0.0 <= low <= k / n <= high <= 1.0
    if k < n:
        low2, high2 = stats.wilson_interval(k + 1, n, confidence=conf)
        assert low2 >= low and high2 >= high


@FAST
@given(k=st.integers(0, 50), extra=st.integers(0, 50), scale=st.integers(2, 8))
def test_wilson_narrows_with_n(k, extra, scale):
    n = k + extra + 1
    low, high = stats.wilson_interval(k, n)
    low2, high2 = stats.wilson_interval(k * scale, n * scale)  # same estimate, more trials
    assert high2 - low2 < high - low
    assert stats.wilson_interval(0, n + 1)[1] < stats.wilson_interval(0, n)[1]


# ------------------------------------------------------------------------------------ Fisher


def _fisher_by_hand(a, n1, c, n2, alternative):
    """Enumerate every table with the observed margins through hypergeom directly."""
    m = a + c
    support = range(max(0, m - n2), min(m, n1) + 1)
    pmf = {x: hypergeom.pmf(x, n1 + n2, m, n1) for x in support}
    if alternative == "greater":
        return sum(p for x, p in pmf.items() if x >= a)
    return min(1.0, sum(p for p in pmf.values() if p <= pmf[a] * (1 + 1e-7)))


@pytest.mark.parametrize("alternative", ["two-sided", "greater"])
def test_fisher_matches_hand_enumeration(alternative):
    for n1, n2 in [(5, 5), (10, 10), (7, 12)]:
        for a, c in itertools.product(range(n1 + 1), range(n2 + 1)):
            got = stats.fisher_pvalue(a, n1, c, n2, alternative=alternative)
            assert got == pytest.approx(_fisher_by_hand(a, n1, c, n2, alternative), abs=1e-9)


def test_fisher_known_value():
    # 10/10 against 0/10: one table as extreme per side, 1 / C(20, 10) each.
    assert stats.fisher_pvalue(10, 10, 0, 10, alternative="greater") == pytest.approx(1 / math.comb(20, 10))
    assert stats.fisher_pvalue(10, 10, 0, 10) == pytest.approx(2 / math.comb(20, 10))
    with pytest.raises(ValueError):
        stats.fisher_pvalue(1, 2, 0, 2, alternative="less-ish")


@pytest.mark.parametrize("alternative", ["two-sided", "greater"])
def test_vectorised_pvalues_match_scipy_table_by_table(alternative):
    for n in range(1, 9):
        a, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        got = stats._fisher_pvalues(a, c, n, alternative)
        for i, j in itertools.product(range(n + 1), repeat=2):
            ref = fisher_exact([[i, n - i], [j, n - j]], alternative=alternative).pvalue
            assert got[i, j] == pytest.approx(ref, abs=1e-12)


def test_power_matches_brute_force():
    n, pb, pf = 6, 0.7, 0.2
    expected = 0.0
    for a, c in itertools.product(range(n + 1), repeat=2):
        p = fisher_exact([[a, n - a], [c, n - c]], alternative="greater").pvalue
        if p <= 0.05:
            expected += binom.pmf(a, n, pb) * binom.pmf(c, n, pf)
    assert stats.fisher_power(n, pb, pf, alpha=0.05) == pytest.approx(expected, abs=1e-10)


# ----------------------------------------------------------------------------------- wording


def test_describe_rate_wording():
    assert stats.describe_rate(0, 10) == "no failure in 10 trials: rate below 28% at 95%"
    assert stats.describe_rate(7, 10) == "7 of 10 trials failed (70%, 95% CI 40%-89%)"
    assert stats.describe_rate(0, 1) == "no failure in 1 trial: rate below 80% at 95%"
    assert stats.describe_rate(0, 10, confidence=0.9) == ("no failure in 10 trials: rate below 22% at 90%")
    assert stats.describe_rate_short(10, 10) == "10/10 failed (100%, 95% CI 72%-100%)"
    assert stats.describe_rate_short(0, 10) == "0/10 (rate below 28% at 95%)"
    assert stats.describe_rate(0, 0) == "no trials"


def test_format_pct_is_honest_at_the_edges():
    assert stats.format_pct(0.0) == "0%" and stats.format_pct(1.0) == "100%"
    assert stats.format_pct(0.9996) == ">99.9%"
    assert stats.format_pct(0.00001) == "<0.01%"
    assert stats.format_pct(0.0126, rounding="up") == "1.3%"
    assert stats.format_pct(0.2701, rounding="up") == "28%"
    assert stats.format_pct(0.2799, rounding="down") == "27%"


@FAST
@given(n=st.integers(1, 3000))
def test_below_claim_is_true(n):
    # "rate below X" must never understate the Wilson upper bound it quotes.
    high = stats.wilson_interval(0, n)[1]
    shown = stats.describe_rate(0, n).split("below ")[1].split("%")[0]
    assert float(shown) / 100 >= high


# ---------------------------------------------------------------------------------- planning


def test_plan_known_values():
    assert stats.trials_to_bound(0.3) == 9
    assert stats.trials_to_separate(0.9, 0.0) == 5
    assert stats.trials_for_auto() == 9
    assert stats.more_trials_needed(0, 5, bound=0.3) == 4


@FAST
@given(rate=st.floats(0.01, 0.95), conf=st.floats(0.5, 0.995))
def test_trials_to_bound_is_the_fewest(rate, conf):
    n = stats.trials_to_bound(rate, confidence=conf)
    assert stats.wilson_interval(0, n, confidence=conf)[1] <= rate
    if n > 1:
        assert stats.wilson_interval(0, n - 1, confidence=conf)[1] > rate


@FAST
@given(k=st.integers(0, 5), n_extra=st.integers(0, 30), bound=st.floats(0.1, 0.6))
def test_more_clean_trials_is_the_fewest(k, n_extra, bound):
    n = k + n_extra + 1
    m = stats.more_trials_needed(k, n, bound=bound)
    assert m is not None
    assert stats.wilson_interval(k, n + m)[1] <= bound
    if m > 0:
        assert stats.wilson_interval(k, n + m - 1)[1] > bound


def test_more_trials_lower_side_and_unreachable():
    m = stats.more_trials_needed(3, 5, bound=0.5, side="lower")  # observed 60% holds
    assert stats.wilson_interval(0.6 * (5 + m), 5 + m)[0] >= 0.5
    assert stats.wilson_interval(0.6 * (5 + m - 1), 5 + m - 1)[0] < 0.5
    assert stats.more_trials_needed(1, 2, bound=0.5, side="lower") is None  # 50% never clears 50%
    assert stats.more_trials_needed(5, 10, bound=0.3, future_rate=0.4) is None


@settings(max_examples=15, deadline=None)
@given(
    pb=st.floats(0.6, 1.0), pf=st.floats(0.0, 0.2), alpha=st.sampled_from([0.01, 0.05, 0.1]), power=st.floats(0.5, 0.95)
)
def test_trials_to_separate_is_the_fewest(pb, pf, alpha, power):
    n = stats.trials_to_separate(pb, pf, alpha=alpha, power=power)
    assert stats.fisher_power(n, pb, pf, alpha=alpha) >= power
    if n > 1:
        assert stats.fisher_power(n - 1, pb, pf, alpha=alpha) < power


def test_plan_rejects_impossible_targets():
    with pytest.raises(ValueError):
        stats.trials_to_bound(0.0)
    with pytest.raises(ValueError):
        stats.trials_to_bound(1.5)
    with pytest.raises(ValueError):
        stats.trials_to_separate(0.2, 0.2)
    with pytest.raises(ValueError):
        stats.trials_to_separate(0.1, 0.3)  # one-sided: the baseline must fail more
    with pytest.raises(ValueError):
        stats.trials_to_separate(0.9, 0.0, power=1.0)
    assert stats.trials_to_separate(0.1, 0.9, alternative="two-sided") >= 1
