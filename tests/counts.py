"""Judging a count at the resolution a count has (tests that compare a measured event count with a limit)."""

from __future__ import annotations

import math


def poisson_quantile(mean: float, q: float) -> int:
    """The smallest count k with P(X <= k) >= q for X ~ Poisson(mean). Terms in log space, so a large mean
    (whose e^-mean underflows) still ends."""
    if mean <= 0:
        return 0
    k, cdf = 0, 0.0
    while True:
        cdf += math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1))
        if cdf >= q:
            return k
        k += 1
