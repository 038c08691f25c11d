"""How many samples a run needs (``loadgen size``): to certify an objective, and for ``compare`` to detect a
regression. Pure arithmetic on a pilot's figures (``size_pilot.py`` reads them from a run).

Theory of operation
-------------------
**Certifying** an objective means its interval (analysis/intervals.py) lands wholly on one side of the limit:
PASS when the pilot's estimate is on the good side, FAIL when on the bad side. For each statistic the chance of
that at n samples — the *power* — is computed from the same decision rule the verdict uses, not a normal
approximation of it, and n is the smallest sample size whose power is at least ``power``:

- a percentile: the order-statistic interval's upper end is at or below the limit when at least ⌈u⌉ of the
  n samples are (u the upper rank, ``order_ranks``), and its lower end above the limit when fewer than ⌊l⌋ are;
  the count at or below the limit is Binomial(n, p), p the share of the pilot's samples at or below it. For
  autocorrelated samples (per-token ITL, chunk gaps) the ranks are on n / deff samples: n is sized on that
  effective count and multiplied back by the pilot's design effect (measured at the limit).
- a proportion: the mid-p binomial interval's end is past the limit exactly when the count is past a cut-off
  found on the binomial at the limit; the count is Binomial(n, p̂).
- a rate: the same on the mid-p Poisson interval, counts scaled by the dispersion D. The verdict measures D
  again in the run it judges (20 time batches, widened by (t/z)²), so D there is random even for a Poisson
  process: the power is averaged over that estimate's distribution (χ² with 19 degrees of freedom, a 16-point
  quadrature), around the pilot's own dispersion.
- a mean: Student's t, as a normal approximation from the pilot's interval.

**The pilot is a sample too.** Sizing at its point estimate would miss the target power about half the time the
pilot flatters the margin. So the estimate is first moved toward the limit by ``z(ASSURANCE)`` of its own
standard error (the pilot's one-sided 80 % bound on the margin); when that bound crosses the limit the pilot
cannot tell which side the objective is on: n is then sized at the point estimate and flagged ``reliable:
false`` (run a longer pilot, or let ``load.until: decided`` find the length).

**Detecting a regression of X %** in ``compare``, whose rule is that the interval of the change lies wholly
beyond its threshold T: the change to detect is X − T, both runs of n samples, two-sided at ``confidence``:
n = 2 (z₁₋α/₂ + z₁₋β)² Var₁ / (X − T)², Var₁ the variance of one sample's contribution to the relative change:
q(1 − q) deff / (f ξ)² for a percentile ξ with density f (f from the pilot's quantiles at q ± (1 − q)/4: the
local density), D (r₁ + r₂) / (2 r²) per unit of exposure for a rate r (r₁ = r, r₂ = r(1 + X)), p(1 − p)/p² for a
proportion, and the squared coefficient of variation for a mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
from scipy import optimize, stats

from loadgen.analysis import intervals as iv

Direction = Literal["pass", "fail"]
ASSURANCE = 0.8  # the pilot's estimate is taken at its one-sided 80 % bound toward the limit
MAX_SAMPLES = 10**9  # past this a decision is not practical: reported as such
DISPERSION_DF = iv.TIME_BATCHES - 1
QUADRATURE = 16


@dataclass(frozen=True)
class Need:
    """Samples needed to certify one objective: ``n`` (None: cannot be decided), the way it would be decided,
    whether the pilot could tell that way reliably, and why when not."""

    n: float | None
    direction: Direction | None
    reliable: bool = True
    note: str = ""


def _z(level: float) -> float:
    return float(stats.norm.ppf(level))


def smallest_n(power_at: Callable[[int], float], target: float, start: int) -> int | None:
    """The smallest n (searched from ``start``, doubling then bisecting) with ``power_at(n) >= target``; None past
    MAX_SAMPLES."""
    lo, hi = 0, max(1, start)
    while power_at(hi) < target:
        lo, hi = hi, hi * 2
        if hi > MAX_SAMPLES:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_at(mid) >= target else (mid, hi)
    return hi


# ---- the power of each interval's decision ---------------------------------------------------------------
def quantile_power(m: int, p: float, q: float, confidence: float, direction: Direction) -> float:
    """The chance that m independent samples, a share p of them at or below the limit, decide the q-quantile
    ``direction`` (conservative: whole ranks, rounded against the decision)."""
    lo, hi = iv.order_ranks(m, q, confidence)
    if direction == "pass":
        return 0.0 if hi is None else float(stats.binom.sf(math.ceil(hi) - 1, m, p))
    return 0.0 if lo is None else float(stats.binom.cdf(math.floor(lo) - 1, m, p))


def proportion_power(n: int, p: float, limit: float, comparison: str, confidence: float,
                     direction: Direction) -> float:
    """The chance that n trials with success chance p give a mid-p binomial interval wholly on ``direction``'s
    side of ``limit``."""
    a = (1 - confidence) / 2
    sd = math.sqrt(n * max(limit * (1 - limit), p * (1 - p), 1 / n))
    centre = n * (limit + p) / 2
    k = np.arange(max(0, int(centre - 12 * sd - 12)), min(n, int(centre + 12 * sd + 12)) + 1)
    mid = stats.binom.cdf(k - 1, n, limit) + stats.binom.pmf(k, n, limit) / 2  # rising in k
    low_side = (comparison == "<=") == (direction == "pass")  # decided by a count below the cut-off
    if low_side:
        ok = k[mid <= a] if comparison == "<=" else k[mid < a]
        return float(stats.binom.cdf(ok.max(), n, p)) if ok.size else 0.0
    ok = k[mid > 1 - a] if comparison == "<=" else k[mid >= 1 - a]
    return float(stats.binom.sf(ok.min() - 1, n, p)) if ok.size else 0.0


def _poisson_cut(lam: float, level: float) -> float:
    """The (fractional) count k at which the mid-p Poisson CDF at ``lam`` reaches ``level``."""
    f = lambda k: iv.poisson_mid_cdf(k, lam) - level  # noqa: E731 - rising in k
    if f(0.0) >= 0:
        return 0.0
    hi = lam + 20 * math.sqrt(lam + 1) + 20
    return float(optimize.brentq(f, 0.0, hi))


def _widen() -> float:
    """The verdict's widening of a measured dispersion, (t/z)² at its degrees of freedom (intervals.py)."""
    return iv.dispersion_widening(DISPERSION_DF)


def dispersion_draws(dispersion: float) -> np.ndarray:
    """The dispersion the judged run will measure, as QUADRATURE equally likely values: around the pilot's
    (taken as the true one, unwidened), χ²(19)/19 scatter, widened by (t/z)² and floored at 1 as the verdict's."""
    widen = _widen()
    true = max(1.0, dispersion / widen)
    u = (np.arange(QUADRATURE) + 0.5) / QUADRATURE
    return np.maximum(1.0, true * widen * stats.chi2.ppf(u, DISPERSION_DF) / DISPERSION_DF)


def rate_power(exposure: float, rate: float, limit: float, comparison: str, confidence: float,
               direction: Direction, dispersion: float = 1.0) -> float:
    """The chance that ``exposure`` (in the rate's unit) of a process at ``rate`` gives a mid-p Poisson interval
    wholly on ``direction``'s side of ``limit``, averaged over the dispersion the run will measure."""
    a = (1 - confidence) / 2
    true = max(1.0, dispersion / _widen())
    mean = rate * exposure / true  # events / D_true: Poisson (quasi-Poisson counts)
    out = []
    for d in dispersion_draws(dispersion):
        lam = limit * exposure / d  # the limit's expected (scaled) count
        low_side = (comparison == "<=") == (direction == "pass")
        cut = _poisson_cut(lam, a if low_side else 1 - a) * d / true  # in Poisson(mean) units
        out.append(stats.poisson.cdf(math.floor(cut), mean) if low_side
                   else stats.poisson.sf(math.ceil(cut) - 1, mean))
    return float(np.mean(out))


# ---- samples needed ---------------------------------------------------------------------------------------
def _shifted(estimate: float, se: float, limit: float, assurance: float) -> tuple[float, bool]:
    """The estimate moved toward the limit by z(assurance) standard errors (none at 0.5); False when that
    crosses it."""
    moved = estimate - math.copysign(_z(assurance) * se, estimate - limit)
    if (moved - limit) * (estimate - limit) <= 0:
        return estimate, False
    return moved, True


def _bound(estimate: float, limit: float, assurance: float,
           interval_at: Callable[[float], iv.Interval]) -> tuple[float, bool]:
    """The end toward the limit of the pilot's interval at two-sided level 2·assurance − 1 (one-sided at
    ``assurance``); the estimate itself and False when that end is at or past the limit (the pilot cannot tell).
    Assurance 0.5: the estimate as measured."""
    if assurance <= 0.5:
        return estimate, True
    interval = interval_at(2 * assurance - 1)
    end = interval.low if estimate > limit else interval.high
    if end is None or (end - limit) * (estimate - limit) <= 0:
        return estimate, False
    return end, True


def exact_binomial(k: int, n: int, confidence: float) -> iv.Interval:
    """Clopper-Pearson's interval (exact, never short: the pilot's bound errs toward the limit)."""
    a = (1 - confidence) / 2
    low = 0.0 if k <= 0 else float(stats.beta.ppf(a, k, n - k + 1))
    high = 1.0 if k >= n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return iv.Interval(low, high, confidence, "Clopper-Pearson")


def exact_poisson(events: float, exposure: float, confidence: float, dispersion: float = 1.0) -> iv.Interval:
    """Garwood's interval of a rate, counts scaled by the dispersion (gamma quantiles: fractional counts)."""
    a, d = (1 - confidence) / 2, max(1.0, dispersion)
    k, e = events / d, exposure / d
    low = 0.0 if k <= 0 else float(stats.gamma.ppf(a, k)) / e
    return iv.Interval(low, float(stats.gamma.ppf(1 - a, k + 1)) / e, confidence, "Garwood")


UNRELIABLE = "the pilot cannot tell its side at its assurance: sized at its estimate, which may be too few"
ON_LIMIT = "cannot be decided: the estimate sits on the limit"


def _direction(estimate: float, limit: float, comparison: str) -> Direction | None:
    """Which way a run would be certified where the pilot's estimate points (None: it sits on the limit)."""
    if estimate == limit:
        return None
    return "pass" if (estimate <= limit if comparison == "<=" else estimate >= limit) else "fail"


def quantile_needed(p_at_limit: float, pilot_n: float, q: float, confidence: float, power: float,
                    deff: float = 1.0, assurance: float = ASSURANCE) -> Need:
    """Samples (n, design effect included) to certify the q-quantile, from a pilot of ``pilot_n`` samples of
    which a share ``p_at_limit`` was at or below the limit."""
    if p_at_limit == q:
        return Need(None, None, False, ON_LIMIT)
    direction: Direction = "pass" if p_at_limit > q else "fail"
    n_eff = max(1, round(pilot_n / max(1.0, deff)))
    p, reliable = _bound(p_at_limit, q, assurance, lambda c: exact_binomial(round(p_at_limit * n_eff), n_eff, c))
    start = iv.quantile_samples_needed(p, q, confidence, power) or 1
    m = smallest_n(lambda m: quantile_power(m, p, q, confidence, direction), power, start)
    n = None if m is None else math.ceil(m * max(1.0, deff))
    return Need(n, direction, reliable, "" if reliable else UNRELIABLE)


def proportion_needed(k: int, pilot_n: int, limit: float, comparison: str, confidence: float,
                      power: float, assurance: float = ASSURANCE) -> Need:
    """Trials to certify a share limit (error rate, goodput ratio) from a pilot of k in ``pilot_n``."""
    if pilot_n <= 0:
        return Need(None, None, False, "no samples in the pilot")
    p_hat = k / pilot_n
    direction = _direction(p_hat, limit, comparison)
    if direction is None:
        return Need(None, None, False, ON_LIMIT)
    p, reliable = _bound(p_hat, limit, assurance, lambda c: exact_binomial(k, pilot_n, c))
    start = iv.proportion_samples_needed(p, limit, confidence, power) or 1
    n = smallest_n(lambda n: proportion_power(n, p, limit, comparison, confidence, direction), power, start)
    return Need(n, direction, reliable, "" if reliable else UNRELIABLE)


def rate_needed(events: float, exposure: float, limit: float, comparison: str, confidence: float, power: float,
                dispersion: float = 1.0, assurance: float = ASSURANCE) -> Need:
    """Exposure (the pilot's unit) to certify a rate limit, from ``events`` over ``exposure`` in the pilot."""
    if exposure <= 0:
        return Need(None, None, False, "no exposure in the pilot")
    r_hat = events / exposure
    direction = _direction(r_hat, limit, comparison)
    if direction is None:
        return Need(None, None, False, ON_LIMIT)
    r, reliable = _bound(r_hat, limit, assurance, lambda c: exact_poisson(events, exposure, c, dispersion))
    start = iv.rate_exposure_needed(r, limit, confidence, power, dispersion) or 1.0
    unit = max(start / 1000, 1e-9)  # searched in steps of a thousandth of the first guess
    steps = smallest_n(lambda s: rate_power(s * unit, r, limit, comparison, confidence, direction, dispersion),
                       power, 1000)
    return Need(None if steps is None else steps * unit, direction, reliable, "" if reliable else UNRELIABLE)


def mean_needed(estimate: float, half_width: float, pilot_n: int, limit: float, comparison: str,
                confidence: float, power: float, assurance: float = ASSURANCE) -> Need:
    """Samples to certify a mean, from the pilot's t interval (its half width at ``confidence``)."""
    if pilot_n < 2 or half_width <= 0:
        return Need(None, None, False, "no interval in the pilot")
    direction = _direction(estimate, limit, comparison)
    if direction is None:
        return Need(None, None, False, ON_LIMIT)
    za = _z(1 - (1 - confidence) / 2)
    se = half_width / za
    value, reliable = _shifted(estimate, se, limit, assurance)
    n = pilot_n * ((za + _z(power)) * se / abs(value - limit)) ** 2
    return Need(math.ceil(n), direction, reliable, "" if reliable else UNRELIABLE)


# ---- compare: detecting a regression ------------------------------------------------------------------------
def regression_n(unit_variance: float, change: float, confidence: float, power: float) -> float | None:
    """Samples per run for compare to tell a relative change ``change`` (X − T, a fraction) from none, each
    sample adding ``unit_variance`` to the relative change's variance."""
    if change <= 0 or not math.isfinite(unit_variance) or unit_variance <= 0:
        return None
    return 2 * (_z(1 - (1 - confidence) / 2) + _z(power)) ** 2 * unit_variance / change**2


def quantile_unit_variance(values: np.ndarray, q: float, deff: float = 1.0,
                           weights: np.ndarray | None = None) -> float:
    """q(1 − q) deff / (f ξ)²: one sample's share of the variance of the q-quantile's relative change, f the
    local density from the quantiles at q ± (1 − q)/4 (the pilot's own samples; a secant over a wider window
    underestimates a falling density: ± (1 − q)/2 gives an exponential's f 9 % low)."""
    h = min(q, 1 - q) / 4
    lo, mid, hi = _weighted_quantiles(values, [q - h, q, q + h], weights)
    if not (hi > lo and mid > 0):
        return math.inf
    f_xi = 2 * h * mid / (hi - lo)
    return q * (1 - q) * max(1.0, deff) / f_xi**2


def _weighted_quantiles(values: np.ndarray, qs: list[float], weights: np.ndarray | None) -> list[float]:
    x = values[~np.isnan(values)]
    if weights is None:
        return [float(v) for v in np.quantile(x, qs)] if len(x) else [math.nan] * len(qs)
    w = weights[~np.isnan(values)].astype(float)
    order = np.argsort(x, kind="stable")
    cum = np.cumsum(w[order])
    return [float(x[order][min(int(np.searchsorted(cum, s * cum[-1])), len(x) - 1)]) for s in qs]


def rate_unit_variance(rate: float, change: float, dispersion: float = 1.0) -> float:
    """A rate's relative-change variance per unit of exposure (both runs' Poisson noise, averaged)."""
    if rate <= 0:
        return math.inf
    return max(1.0, dispersion) * (rate + rate * (1 + change)) / (2 * rate**2)


def proportion_unit_variance(p: float) -> float:
    return math.inf if p <= 0 else (1 - p) / p
