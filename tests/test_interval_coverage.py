"""The verdict's intervals cover what they claim: each interval kind (analysis/intervals.py), as the verdict
computes it, is drawn 2,000 times from a distribution whose true statistic is known, with fixed seeds (so the
test is deterministic), and its nominal 95 % must land within [93 %, 97 %] — more than three standard errors
(√(0.95 × 0.05 / 2000) = 0.49 %) either side. The coverage table in docs/verdicts.md is this test's output."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import polars as pl
import pytest
from scipy import stats

from loadgen.analysis import intervals as iv
from loadgen.analysis import objective_intervals as oi

REPLICATIONS = 2000
LOW, HIGH = 0.93, 0.97


def coverage(draw: Callable[[np.random.Generator], bool], seed: int = 1) -> float:
    rng = np.random.default_rng(seed)
    return sum(draw(rng) for _ in range(REPLICATIONS)) / REPLICATIONS


@pytest.mark.parametrize("n,q", [(400, 0.99), (1000, 0.99), (500, 0.9), (300, 0.5)])
def test_order_statistic_interval_of_a_percentile(n: int, q: float) -> None:
    true = float(stats.lognorm.ppf(q, 1.0))
    got = coverage(lambda r: oi.quantile(r.lognormal(0, 1, n), q, 1e9, 0.95).interval.contains(true))
    assert LOW <= got <= HIGH, got


class _Gaps:
    """What ``token_quantile`` reads of a run: its narrow gaps (request i, t_ns, gap_ns, tokens)."""

    def __init__(self, gaps: pl.DataFrame) -> None:
        self.gaps = gaps


def _clustered_run(r: np.random.Generator, requests: int, tokens: int, tau: float, sigma: float) -> _Gaps:
    """Per-token ITL of ``requests`` streams: each stream's own level (random effect τ) times token noise σ
    (lognormal), so tokens of one stream are correlated; streams overlap in time."""
    level = np.repeat(r.normal(0, tau, requests), tokens)
    gap_ns = np.rint(1e6 * 20 * np.exp(level + r.normal(0, sigma, requests * tokens))).astype(np.int64)
    start = np.repeat(r.uniform(0, 60e9, requests), tokens)
    t_ns = (start + np.cumsum(gap_ns.reshape(requests, tokens), axis=1).ravel()).astype(np.int64)
    return _Gaps(pl.DataFrame({"i": np.repeat(np.arange(requests), tokens).astype(np.uint32), "t_ns": t_ns,
                               "gap_ns": gap_ns, "tokens": np.ones(requests * tokens, dtype=np.uint16)}))


@pytest.mark.parametrize("q,requests,tokens", [(0.9, 200, 50), (0.99, 500, 20)])  # the tails objectives limit
def test_batch_means_interval_of_a_token_percentile(q: float, requests: int, tokens: int) -> None:
    tau, sigma = 0.5, 0.5
    true = 20 * math.exp(float(stats.norm.ppf(q)) * math.sqrt(tau**2 + sigma**2))

    def draw(r: np.random.Generator) -> bool:
        run = _clustered_run(r, requests, tokens, tau, sigma)
        estimate = float(run.gaps["gap_ns"].quantile(q, "linear")) / 1e6  # type: ignore[arg-type]
        judged = oi.token_quantile(run, "itl_ms", q, estimate, 1e9, 0.95)  # type: ignore[arg-type]
        return judged.interval is not None and judged.interval.contains(true)
    got = coverage(draw)
    assert LOW <= got <= HIGH, got


def test_an_independent_interval_on_clustered_tokens_would_not_cover() -> None:
    """Why the batch means: the same clustered tokens taken as independent cover far less than 95 %."""
    q, tau, sigma = 0.9, 0.5, 0.5
    true = 20 * math.exp(float(stats.norm.ppf(q)) * math.sqrt(tau**2 + sigma**2))
    got = coverage(lambda r: iv.quantile_interval(
        _clustered_run(r, 200, 50, tau, sigma).gaps["gap_ns"].to_numpy() / 1e6, q).contains(true))
    assert got < 0.8, got


@pytest.mark.parametrize("mean", [20.0, 50.0, 200.0])
def test_mid_p_poisson_interval_of_a_rate(mean: float) -> None:
    tokens = 40_000.0
    rate_per_1k = 1000 * mean / tokens
    got = coverage(lambda r: oi.rate(int(r.poisson(mean)), tokens, 1e9, "<=", 0.95, 1.0, 1000)
                   .interval.contains(rate_per_1k))
    assert LOW <= got <= HIGH, got


def test_a_bursty_rate_with_its_dispersion_measured() -> None:
    """Stalls come in bursts (one prefill stalls every stream in flight): bursts ~ Poisson, each of a
    geometric number of stalls (mean 5); the dispersion is measured from 20 equal-exposure batches."""
    exposure, rate, batches = 1000.0, 0.4, 20

    def draw(r: np.random.Generator) -> bool:
        bursts = r.poisson(rate * exposure / batches / 5, size=batches)
        counts = np.array([r.geometric(0.2, size=b).sum() for b in bursts], dtype=float)
        d = iv.dispersion(counts, np.full(batches, exposure / batches))
        return iv.poisson_rate_interval(int(counts.sum()), exposure, 0.95, d).contains(rate)
    got = coverage(draw)
    assert LOW <= got <= HIGH, got


@pytest.mark.parametrize("p,n", [(0.01, 1000), (0.3, 200), (0.95, 500)])
def test_mid_p_binomial_interval_of_a_share(p: float, n: int) -> None:
    got = coverage(lambda r: oi.proportion(int(r.binomial(n, p)), n, 2.0, "<=", 0.95).interval.contains(p))
    assert LOW <= got <= HIGH, got


def test_t_interval_of_a_mean() -> None:
    got = coverage(lambda r: iv.mean_interval(r.lognormal(0, 0.5, 200)).contains(math.exp(0.125)))
    assert LOW <= got <= HIGH, got
