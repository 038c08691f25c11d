"""Confidence intervals for the verdict's objectives, the decision rule, and the samples a decision needs.

Theory of operation
-------------------
Every objective is a limit on a statistic of the run's samples; one run's p99 is one noisy draw of it. Each
statistic gets the interval fit for it (two-sided, at ``confidence``, default 95 %):

- **a percentile** (distribution-free, order statistics): of n independent samples, the count B below the true
  q-quantile is Binomial(n, q), so [X₍ₗ₎, X₍ᵤ₎] with P(l ≤ B < u) ≥ confidence covers it whatever the
  distribution (Hahn & Meeker, *Statistical Intervals*, §5.2). An upper end needs enough samples: p99 at 95 %
  needs n ≥ 367 (below that X₍ₙ₎ is not far enough out), so a p99 limit cannot PASS on fewer; a lower end
  exists much sooner, so a clear FAIL can be called early.
- **a percentile of autocorrelated samples** (per-token ITL, chunk gaps: the gaps of one stream, and of the
  streams one engine step stalls together, are not independent): the same ranks, computed for an *effective*
  sample size n / deff. The design effect deff is the variance of the share of samples at or below the
  estimate, measured from batch means — per request and per time batch, the larger — over its variance were
  the samples independent (Kish's design effect with the ratio estimator's variance; batch means as in
  Law & Kelton, *Simulation Modeling and Analysis*, §9.5.3).
- **a rate of events** (stalls per 1k output tokens; good requests per second): Garwood's exact Poisson
  interval, chi-square quantiles (Garwood 1936). Stalls come in bursts (one long prefill stalls every stream in
  flight), so the count is over-dispersed: the dispersion D (Pearson's χ²/df of the counts in time batches) scales
  the evidence down, events/D over exposure/D (a quasi-Poisson interval), never below D = 1.
- **a proportion** (error rate, goodput ratio, prompt-aware violations): Clopper-Pearson's exact binomial
  interval, beta quantiles (Clopper & Pearson 1934).
- **a mean**: Student's t over the samples, or over per-cluster ratios where samples come in clusters.

The decision (``decide``): for a ``<=`` limit, PASS when the whole interval is at or below it, FAIL when the whole
interval is above it, otherwise UNDECIDED — and the samples needed to decide are estimated from the current
estimate (``*_needed``: a normal approximation of the same test, at a stated power; at power 0.5 it is the
sample size at which today's estimate would just be decided).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import optimize, special, stats

Decision = Literal["pass", "fail", "undecided"]
TIME_BATCHES = 20  # batch means over time: this many equal spans of the run
MIN_BATCH_EVENTS = 10  # fewer events than this: the dispersion cannot be measured, taken as 1


@dataclass(frozen=True)
class Interval:
    low: float | None  # None: unbounded below (too few samples for a lower end)
    high: float | None  # None: unbounded above (too few samples for an upper end)
    confidence: float
    method: str

    def contains(self, x: float) -> bool:
        return (self.low is None or self.low <= x) and (self.high is None or x <= self.high)


def _alpha(confidence: float) -> float:
    return (1.0 - confidence) / 2.0


def order_ranks(n: float, q: float, confidence: float) -> tuple[float | None, float | None]:
    """Fractional 1-based ranks (l, u) of the order statistics that bound the q-quantile of n samples: B, the
    count below it, is Binomial(n, q); l solves P(B <= l - 1) = α/2 and u solves P(B <= u - 1) = 1 - α/2 on
    the binomial CDF interpolated linearly between integers (Hutson's fractional order statistics: coverage near
    the nominal level, where whole ranks overshoot it by up to the CDF's step). None where n is too small for
    that end. A non-integer n (an effective sample size) is rounded down."""
    m = int(math.floor(n))
    if m < 1:
        return None, None
    a = _alpha(confidence)
    low, high = _cdf_root(m, q, a) + 1.0, _cdf_root(m, q, 1 - a) + 1.0
    return (low if low >= 1 else None), (high if high <= m else None)


@functools.lru_cache(maxsize=65536)
def _cdf_root(m: int, q: float, level: float) -> float:
    """The real k where the Binomial(m, q) CDF, interpolated linearly between integers, reaches ``level``
    (special.bdtr is the CDF; bdtrik its continuous inverse, a first guess refined on the integers)."""
    guess = float(special.bdtrik(level, m, q))
    k = max(0, min(m, int(math.ceil(guess)) if math.isfinite(guess) else 0))
    while k < m and float(special.bdtr(k, m, q)) < level:  # the smallest integer with CDF(k) >= level
        k += 1
    while k > 0 and float(special.bdtr(k - 1, m, q)) >= level:
        k -= 1
    hi, lo = float(special.bdtr(k, m, q)), float(special.bdtr(k - 1, m, q)) if k > 0 else 0.0
    return k - 1 + (level - lo) / (hi - lo) if hi > lo else float(k)


def at_rank(x: np.ndarray, rank: float) -> float:
    """The sorted samples' value at a fractional 1-based rank (>= 1; linear between neighbours; +inf past the last
    finite one, where a miss is counted as +inf). Rank (n − 1)·q + 1 is the linear q-quantile polars and numpy
    give (the summary's percentiles), so objectives over samples holding +inf misses use it too."""
    i = int(math.floor(rank))
    if i >= len(x):
        return float(x[-1])
    if not math.isfinite(x[i]):
        return float(x[i - 1]) if rank == i else float(x[i])
    return float(x[i - 1] + (rank - i) * (x[i] - x[i - 1]))


def quantile_interval(values: np.ndarray, q: float, confidence: float = 0.95) -> Interval:
    """Distribution-free interval of the q-quantile of independent samples (NaN ignored)."""
    x = np.sort(values[~np.isnan(values)])
    lo, hi = order_ranks(len(x), q, confidence)
    return Interval(None if lo is None else at_rank(x, lo), None if hi is None else at_rank(x, hi),
                    confidence, "order statistics")


def time_batches(t_ns: np.ndarray, weights: np.ndarray | None = None, batches: int = TIME_BATCHES) -> np.ndarray:
    """Each sample's time batch: the run's span cut in ``batches`` consecutive parts of about equal exposure
    (``weights``, e.g. tokens; equal counts without), as the verdict's batches are
    (``objective_intervals._time_batch``)."""
    if len(t_ns) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(t_ns, kind="stable")
    w = np.ones(len(t_ns)) if weights is None else weights.astype(float)
    cum = np.cumsum(w[order])
    edges = [float(t_ns[order][min(int(np.searchsorted(cum, cum[-1] * k / batches)), len(cum) - 1)])
             for k in range(1, batches)]
    return np.searchsorted(np.array(edges), t_ns, side="right").astype(np.int64)


def weighted_design_effect(below: np.ndarray, clusters: list[np.ndarray], w: np.ndarray | None = None) -> float:
    """Kish's design effect of the (``w``-weighted) share ``below`` (0/1 per sample) when samples come in
    clusters — the ratio estimator's variance over the binomial one —, the largest over the groupings; 1.0
    when it cannot be measured or is below 1."""
    w = np.ones(len(below)) if w is None else w.astype(float)
    n = float(w.sum())
    p = float((below * w).sum()) / n if n else 0.0
    if n == 0 or p in (0.0, 1.0):
        return 1.0
    out = 1.0
    for c in clusters:
        _, inverse = np.unique(c, return_inverse=True)
        k = int(inverse.max()) + 1 if len(inverse) else 0
        if k < 2:
            continue
        sums = np.bincount(inverse, weights=below * w, minlength=k)
        sizes = np.bincount(inverse, weights=w, minlength=k)
        var = k / (k - 1) * float(np.sum((sums - p * sizes) ** 2)) / n**2
        out = max(out, var / (p * (1 - p) / n))
    return out


def poisson_rate_interval(events: int, exposure: float, confidence: float = 0.95,
                          dispersion: float = 1.0) -> Interval:
    """The mid-p exact interval of a rate (events per unit of exposure; Lancaster's mid-p on Garwood's Poisson
    tails: coverage near the nominal level where Garwood's own overshoots it); over-dispersed counts
    (``dispersion`` D > 1) count as events/D over exposure/D."""
    if exposure <= 0:
        return Interval(None, None, confidence, "mid-p Poisson")
    d = max(1.0, dispersion)
    k, e = events / d, exposure / d
    a = _alpha(confidence)
    low = 0.0 if k == 0 else _poisson_mid_root(k, 1 - a) / e
    high = _poisson_mid_root(k, a) / e
    return Interval(low, high, confidence, "mid-p Poisson" + (f", dispersion {d:.2g}" if d > 1 else ""))


def poisson_mid_cdf(k: float, lam: float) -> float:
    """P(X < k) + P(X = k) / 2 for X ~ Poisson(λ), k possibly fractional (the CDF's continuous extension through
    the regularised gamma function): the mid-p tail both the interval and the sizing invert."""
    pmf = math.exp(k * math.log(lam) - lam - math.lgamma(k + 1)) if lam > 0 else float(k == 0)
    return float(special.gammaincc(k + 1, lam)) - pmf / 2


@functools.lru_cache(maxsize=4096)
def _poisson_mid_root(k: float, level: float) -> float:
    """The mean λ at which P(X < k) + P(X = k) / 2 = ``level`` (X ~ Poisson(λ); k may be fractional: the CDF's
    continuous extension through the regularised gamma function)."""
    def mid(lam: float) -> float:
        return poisson_mid_cdf(k, lam) - level
    high = max(10.0, 4 * (k + 10))
    return float(optimize.brentq(mid, 1e-12, high)) if mid(1e-12) > 0 else 0.0


def dispersion(event_batches: np.ndarray, exposure_batches: np.ndarray) -> float:
    """Pearson's χ²/df of event counts per batch against a common rate (1.0: Poisson; never below 1; 1.0 when
    there are too few events or batches to tell)."""
    total, exposure = float(event_batches.sum()), float(exposure_batches.sum())
    keep = exposure_batches > 0
    if total < MIN_BATCH_EVENTS or keep.sum() < 3 or exposure <= 0:
        return 1.0
    expected = total * exposure_batches[keep] / exposure
    df = int(keep.sum()) - 1
    chi2 = float(np.sum((event_batches[keep] - expected) ** 2 / expected))
    return max(1.0, chi2 / df * dispersion_widening(df))


def dispersion_widening(df: int) -> float:
    """A dispersion estimated from ``df`` + 1 batches, widened as Student's t widens the normal ((t/z)²,
    quasi-Poisson)."""
    return (float(stats.t.ppf(0.975, df)) / float(stats.norm.ppf(0.975))) ** 2


@functools.lru_cache(maxsize=4096)
def binomial_interval(k: int, n: int, confidence: float = 0.95) -> Interval:
    """The mid-p exact interval of a proportion k/n (Clopper-Pearson's binomial tails with half the observed
    point's probability: coverage near the nominal level; Agresti & Gottard 2007)."""
    if n <= 0:
        return Interval(None, None, confidence, "mid-p binomial")
    a = _alpha(confidence)

    def mid(p: float, level: float) -> float:
        return float(stats.binom.cdf(k - 1, n, p) + stats.binom.pmf(k, n, p) / 2) - level
    low = 0.0 if k == 0 else float(optimize.brentq(mid, 1e-15, 1 - 1e-15, args=(1 - a,)))
    high = 1.0 if k == n else float(optimize.brentq(mid, 1e-15, 1 - 1e-15, args=(a,)))
    return Interval(low, high, confidence, "mid-p binomial")


def mean_interval(values: np.ndarray, confidence: float = 0.95, clusters: np.ndarray | None = None) -> Interval:
    """Student's t interval of the mean; with ``clusters``, of the ratio estimator over cluster sums."""
    x = values[~np.isnan(values)]
    if len(x) < 2:
        return Interval(None, None, confidence, "Student t")
    mean = float(x.mean())
    if clusters is None:
        se, df, method = float(x.std(ddof=1)) / math.sqrt(len(x)), len(x) - 1, "Student t"
    else:
        c = clusters[~np.isnan(values)]
        _, inverse, sizes = np.unique(c, return_inverse=True, return_counts=True)
        k = len(sizes)
        if k < 2:
            return Interval(None, None, confidence, "Student t, batch means")
        sums = np.bincount(inverse, weights=x, minlength=k)
        var = k / (k - 1) * float(np.sum((sums - mean * sizes) ** 2)) / len(x) ** 2
        se, df, method = math.sqrt(var), k - 1, "Student t, batch means"
    t = float(stats.t.ppf(1 - _alpha(confidence), df))
    return Interval(mean - t * se, mean + t * se, confidence, method)


def decide(comparison: str, limit: float, interval: Interval) -> Decision:
    """PASS when the whole interval meets the limit, FAIL when the whole interval misses it."""
    lo, hi = interval.low, interval.high
    if comparison == ">=":
        return "pass" if lo is not None and lo >= limit else "fail" if hi is not None and hi < limit \
            else "undecided"
    return "pass" if hi is not None and hi <= limit else "fail" if lo is not None and lo > limit else "undecided"


# ---- how many samples a decision needs (normal approximations of the same tests) --------------------------
def _z(confidence: float, power: float) -> tuple[float, float]:
    return float(stats.norm.ppf(1 - _alpha(confidence))), float(stats.norm.ppf(power))


def proportion_samples_needed(p: float, limit: float, confidence: float = 0.95, power: float = 0.5,
                              deff: float = 1.0) -> int | None:
    """Samples for a share estimated at ``p`` to be told apart from ``limit`` (None: p is the limit)."""
    if p == limit:
        return None
    za, zb = _z(confidence, power)
    p = min(max(p, 0.0), 1.0)
    n = ((za * math.sqrt(limit * (1 - limit)) + zb * math.sqrt(p * (1 - p))) / (p - limit)) ** 2
    return max(1, math.ceil(n * max(1.0, deff)))


def quantile_samples_needed(p_at_limit: float, q: float, confidence: float = 0.95, power: float = 0.5,
                            deff: float = 1.0) -> int | None:
    """Samples for the q-quantile to be decided against a limit at which the samples' CDF is ``p_at_limit``
    (the q-quantile is under the limit ⇔ more than q of the samples are at or below it)."""
    return proportion_samples_needed(p_at_limit, q, confidence, power, deff)


def rate_exposure_needed(rate: float, limit: float, confidence: float = 0.95, power: float = 0.5,
                         dispersion: float = 1.0) -> float | None:
    """Exposure (in the rate's unit) for a rate estimated at ``rate`` to be told apart from ``limit``."""
    if rate == limit or limit < 0:
        return None
    za, zb = _z(confidence, power)
    d = max(1.0, dispersion)
    if limit == 0:
        return None
    return d * ((za * math.sqrt(limit) + zb * math.sqrt(max(rate, 0.0))) / (rate - limit)) ** 2
