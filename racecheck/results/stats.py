"""Statistics of failure rates over trials: intervals, tests, honest wording and trial planning.

Pure functions of counts (no I/O, no pandas). One interval is used everywhere, so that the words a
report prints, the `ci_low,ci_high` columns of summary.csv and the gate's bounds always agree:

[Note: Wilson everywhere]
    Every interval is the two-sided Wilson score interval at the stated confidence C, without
    continuity correction (what scipy's `binomtest(k, n).proportion_ci(method="wilson")` gives;
    the tests check ours against it). "rate below X at 95%" quotes that interval's upper end, so
    for 0 failures in 10 trials it reads "below 28%" (Wilson: z^2 / (n + z^2) = 0.2775), not the
    26% of a one-sided exact Clopper-Pearson bound nor the 30% of the rule of three. The planning
    functions (`trials_to_bound`, `more_trials_needed`) solve for the same interval, so a plan's
    promise is exactly what the gate later checks. Wilson is computed here in closed form because
    it must accept arrays (a summary's columns) and fractional counts (projections at a rate).

Fisher's exact test comes from `scipy.stats.fisher_exact`; the power of a planned comparison is
summed exactly over the binomial outcomes of both arms, with p-values from `scipy.stats.hypergeom`
(the distribution fisher_exact itself uses), vectorised since a plan evaluates thousands of tables.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _sp

_ALTERNATIVES = ("two-sided", "greater")
# Outcomes of either arm less likely than this are left out of power sums (at most 2e-12 of the
# probability, far below any power one would plan for); it keeps a plan's cost near-linear in n.
_TAIL = 1e-12


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    return float(_sp.norm.ppf(0.5 + confidence / 2.0))


def check_rate(name: str, value: float | None) -> None:
    """ValueError unless `value` is a rate in [0, 1] (None, an option not given, passes)."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a rate in [0, 1], got {value!r}")


def wilson_interval(failures, trials, *, confidence: float = 0.95):
    """Two-sided Wilson score interval `(low, high)` for `failures` out of `trials`.

    Accepts scalars or arrays (and fractional failures, for projections). With no trials the
    interval is the uninformative (0, 1). Scalars in, floats out.
    """
    z = _z(confidence)
    k = np.asarray(failures, dtype=float)
    n = np.asarray(trials, dtype=float)
    if np.any(n < 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 <= failures <= trials, got {failures!r} of {trials!r}")
    with np.errstate(invalid="ignore", divide="ignore"):
        denom = n + z * z
        centre = (k + z * z / 2.0) / denom
        half = z / denom * np.sqrt(k * (n - k) / n + z * z / 4.0)
        low = np.where(k <= 0, 0.0, np.clip(centre - half, 0.0, 1.0))
        high = np.where(k >= n, 1.0, np.clip(centre + half, 0.0, 1.0))
    low = np.where(n == 0, 0.0, low)
    high = np.where(n == 0, 1.0, high)
    if low.ndim == 0:
        return float(low), float(high)
    return low, high


def fisher_pvalue(
    failures_a: int, trials_a: int, failures_b: int, trials_b: int, *, alternative: str = "two-sided"
) -> float:
    """Fisher's exact test of arm a against arm b; `greater`: arm a fails more often than arm b."""
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")
    for k, n in ((failures_a, trials_a), (failures_b, trials_b)):
        if not 0 <= k <= n:
            raise ValueError(f"need 0 <= failures <= trials, got {k} of {n}")
    table = [[failures_a, trials_a - failures_a], [failures_b, trials_b - failures_b]]
    return float(_sp.fisher_exact(table, alternative=alternative).pvalue)


# ---------------------------------------------------------------------------------------- wording


def format_pct(rate: float, *, rounding: str = "nearest") -> str:
    """A rate as a percentage: whole percents from 10%, finer below; `up`/`down` round outward
    (for bounds that a sentence claims), and `nearest` never shows 0% or 100% for a rate that is
    not exactly 0 or 1."""
    value = float(rate) * 100.0
    if value in (0.0, 100.0):
        return f"{value:.0f}%"
    decimals = 0 if value >= 10.0 else (1 if value >= 1.0 else 2)
    scale = 10**decimals
    if rounding == "up":
        shown = math.ceil(round(value * scale, 9)) / scale
    elif rounding == "down":
        shown = math.floor(round(value * scale, 9)) / scale
    else:
        shown = round(value * scale) / scale
        if shown >= 100.0 and value < 100.0:
            return "99.9%" if value < 99.95 else ">99.9%"
        if shown <= 0.0 < value:
            return "<0.01%" if value < 0.005 else f"{value:.2f}%"
    return f"{shown:.{decimals}f}%"


def _conf(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def describe_rate(failures: int, trials: int, *, confidence: float = 0.95) -> str:
    """One honest sentence, e.g. "no failure in 10 trials: rate below 28% at 95%" or
    "7 of 10 trials failed (70%, 95% CI 40%-89%)" (Wilson, see [Note: Wilson everywhere])."""
    if trials == 0:
        return "no trials"
    low, high = wilson_interval(failures, trials, confidence=confidence)
    noun = "trial" if trials == 1 else "trials"
    if failures == 0:
        return f"no failure in {trials} {noun}: rate below {format_pct(high, rounding='up')} at {_conf(confidence)}"
    return (
        f"{failures} of {trials} {noun} failed ({format_pct(failures / trials)}, "
        f"{_conf(confidence)} CI {format_pct(low)}-{format_pct(high)})"
    )


def describe_rate_short(failures: int, trials: int, *, confidence: float = 0.95) -> str:
    """The compact form for tables: "10/10 failed (100%, 95% CI 72%-100%)" or
    "0/10 (rate below 28% at 95%)"."""
    if trials == 0:
        return "0/0 (no trials)"
    low, high = wilson_interval(failures, trials, confidence=confidence)
    if failures == 0:
        return f"0/{trials} (rate below {format_pct(high, rounding='up')} at {_conf(confidence)})"
    return (
        f"{failures}/{trials} failed ({format_pct(failures / trials)}, {_conf(confidence)} CI "
        f"{format_pct(low)}-{format_pct(high)})"
    )


# --------------------------------------------------------------------------------------- planning


def trials_to_bound(rate_max: float, *, confidence: float = 0.95) -> int:
    """Fewest trials that, all passing, put the Wilson upper bound at `confidence` at or below
    `rate_max` (the gate's pass condition for a fixed arm)."""
    check_rate("rate_max", rate_max)
    if rate_max <= 0.0:
        raise ValueError("rate_max must be above 0: no finite number of trials bounds a rate at 0")
    z2 = _z(confidence) ** 2
    # Wilson's upper end for 0 of n is z^2 / (n + z^2); solve for n, then settle float rounding
    # against the interval function itself so that the plan and the gate agree to the last trial.
    n = max(1, math.ceil(z2 * (1.0 - rate_max) / rate_max))
    while n > 1 and wilson_interval(0, n - 1, confidence=confidence)[1] <= rate_max:
        n -= 1
    while wilson_interval(0, n, confidence=confidence)[1] > rate_max:
        n += 1
    return n


def more_trials_needed(
    failures: int,
    trials: int,
    *,
    bound: float,
    confidence: float = 0.95,
    side: str = "upper",
    future_rate: float | None = None,
    limit: int = 10_000_000,
) -> int | None:
    """Fewest further trials after which the Wilson interval meets `bound`, or None if none will.

    `side="upper"`: the upper end must come down to `bound` (a fixed arm); the further trials fail
    at `future_rate` (default 0: all clean). `side="lower"`: the lower end must rise to `bound`
    (a baseline); the further trials fail at `future_rate` (default: the observed rate). Returns 0
    when the condition already holds.
    """
    if side not in ("upper", "lower"):
        raise ValueError(f"side must be 'upper' or 'lower', got {side!r}")
    check_rate("bound", bound)
    if future_rate is None:
        future_rate = 0.0 if side == "upper" else (failures / trials if trials else 0.0)
    check_rate("future_rate", future_rate)

    def met(extra: int) -> bool:
        k, n = failures + future_rate * extra, trials + extra
        low, high = wilson_interval(k, n, confidence=confidence)
        return high <= bound if side == "upper" else low >= bound

    if met(0):
        return 0
    # In the limit the interval shrinks onto future_rate; if that is not strictly inside the
    # bound, no number of further trials meets it.
    if (side == "upper" and future_rate >= bound) or (side == "lower" and future_rate <= bound):
        return None
    hi = 1
    while not met(hi):
        hi *= 2
        if hi > limit:
            return None
    lo = hi // 2  # met(lo) is False (lo == 0 or a failed doubling step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if met(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _fisher_pvalues(a: np.ndarray, c: np.ndarray, n: int, alternative: str) -> np.ndarray:
    """Fisher p-values for tables [[a, n-a], [c, n-c]] (equal arms), elementwise, as
    scipy.stats.fisher_exact computes them (tests check the two agree table by table)."""
    m = a + c  # failures in both arms: the margin the test conditions on
    if alternative == "greater":
        p = _sp.hypergeom.sf(a - 1, 2 * n, m, n)
    else:
        p = np.empty(a.shape, dtype=float)
        for margin in np.unique(m):
            support = np.arange(0, min(margin, n) + 1)
            pmf = _sp.hypergeom.pmf(support, 2 * n, margin, n)
            order = np.sort(pmf)
            cum = np.cumsum(order)
            sel = m == margin
            # Sum of the probabilities of tables no more likely than the observed one (scipy's
            # relative tolerance of 1e-14 for ties).
            idx = np.searchsorted(order, pmf[a[sel]] * (1 + 1e-14), side="right") - 1
            p[sel] = cum[idx]
        # A margin of 0 or 2n leaves one possible table: scipy answers 1.
        p[(m == 0) | (m == 2 * n)] = 1.0
    return np.minimum(p, 1.0)


def _snap(p: float, eps: float = 1e-15) -> float:
    return 0.0 if p < eps else 1.0 if p > 1.0 - eps else p


def fisher_power(
    trials: int, p_baseline: float, p_fixed: float, *, alpha: float = 0.05, alternative: str = "greater"
) -> float:
    """Exact probability that Fisher's test at `alpha` rejects with `trials` per arm, summed over
    both arms' binomial outcomes (see `_TAIL` for the negligible mass left out)."""
    check_rate("p_baseline", p_baseline)
    check_rate("p_fixed", p_fixed)
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")
    n = int(trials)
    if n < 1:
        return 0.0
    # Rates within double rounding of 0 or 1 are point masses; scipy's binomial pmf overflows on
    # subnormal rates, and no trial count could tell them from 0 or 1 anyway.
    p_baseline, p_fixed = _snap(p_baseline), _snap(p_fixed)

    def support(p: float) -> np.ndarray:
        lo = int(_sp.binom.ppf(_TAIL, n, p)) if 0 < p < 1 else round(n * p)
        hi = int(_sp.binom.isf(_TAIL, n, p)) if 0 < p < 1 else round(n * p)
        return np.arange(max(lo - 1, 0), min(hi + 1, n) + 1)

    xb, xf = support(p_baseline), support(p_fixed)
    a, c = np.meshgrid(xb, xf, indexing="ij")
    weight = np.outer(_sp.binom.pmf(xb, n, p_baseline), _sp.binom.pmf(xf, n, p_fixed))
    reject = _fisher_pvalues(a, c, n, alternative) <= alpha
    return float(weight[reject].sum())


def trials_to_separate(
    p_baseline: float,
    p_fixed: float,
    *,
    alpha: float = 0.05,
    power: float = 0.9,
    alternative: str = "greater",
    max_trials: int = 5000,
) -> int:
    """Fewest trials per arm for which Fisher's exact test (one-sided `greater` by default: the
    baseline fails more often) rejects at `alpha` with at least `power`, when the arms' true
    failure rates are `p_baseline` and `p_fixed`. Power is not monotone in n (the test is
    discrete), so every n from 1 is checked: the answer n meets the target and n-1 does not."""
    for name, value in (("alpha", alpha), ("power", power)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    if _snap(p_baseline) == _snap(p_fixed) or (alternative == "greater" and p_baseline < p_fixed):
        raise ValueError(
            f"no number of trials separates a baseline rate of {p_baseline} from a "
            f"fixed rate of {p_fixed} ({alternative})"
        )
    for n in range(1, max_trials + 1):
        if fisher_power(n, p_baseline, p_fixed, alpha=alpha, alternative=alternative) >= power:
            return n
    raise ValueError(f"more than {max_trials} trials per arm would be needed")


# The `--trials auto` policy, in one place (see trials_for_auto).
AUTO_BOUND, AUTO_CONFIDENCE = 0.30, 0.95
AUTO_BASELINE_RATE, AUTO_FIXED_RATE, AUTO_ALPHA, AUTO_POWER = 0.9, 0.0, 0.05, 0.9


def trials_for_auto(
    *,
    bound: float = AUTO_BOUND,
    confidence: float = AUTO_CONFIDENCE,
    baseline_rate: float = AUTO_BASELINE_RATE,
    fixed_rate: float = AUTO_FIXED_RATE,
    alpha: float = AUTO_ALPHA,
    power: float = AUTO_POWER,
) -> int:
    """Trials per arm for `--trials auto`: enough that a clean fixed arm is bounded at or below
    `bound` at `confidence` (Wilson; 9 for 30% at 95%) AND that a baseline failing at
    `baseline_rate` is told from a fix failing at `fixed_rate` by one-sided Fisher at `alpha` with
    `power` (5 for 90% vs 0%). The defaults give 9."""
    return max(
        trials_to_bound(bound, confidence=confidence),
        trials_to_separate(baseline_rate, fixed_rate, alpha=alpha, power=power),
    )
