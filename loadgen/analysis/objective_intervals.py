"""Each objective's interval, decision and samples needed, from the run's own samples (analysis/intervals.py
says which interval fits which statistic and why).

Request-level statistics (TTFT, TPOT, E2E, a request's worst gap) are one sample per measured, successful
request: independent enough for order statistics. Token-level ones (per-token ITL, chunk gaps) are read from the
run's narrow gaps (``RunAnalysis.gaps``) without widening them: the share at or below the estimate per request
and per time batch gives the design effect, and the two order statistics are two quantiles of the integer gaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen.analysis import intervals as iv
from loadgen.analysis.run_analysis import RunAnalysis, itl_per_token

@dataclass(frozen=True)
class Judged:
    """What the samples say about one objective."""

    interval: iv.Interval | None
    decision: iv.Decision
    basis: str  # "interval" | "observed" (the largest sample, a count against a zero limit)
    needed: float | None = None  # samples (or exposure) at which today's estimate would be decided


def observed(value: float | None, limit: float, comparison: str) -> Judged:
    """A statistic no interval can improve on (the largest sample; any failure against a zero limit)."""
    if value is None:
        return Judged(None, "undecided", "observed")
    ok = value <= limit if comparison == "<=" else value >= limit
    return Judged(None, "pass" if ok else "fail", "observed")


def quantile(values: np.ndarray, q: float, limit: float, confidence: float) -> Judged:
    """A percentile of independent samples (one per request)."""
    x = values[~np.isnan(values)]
    interval = iv.quantile_interval(x, q, confidence)
    decision = iv.decide("<=", limit, interval)
    needed = None
    if decision == "undecided" and len(x):
        needed = iv.quantile_samples_needed(float((x <= limit).mean()), q, confidence)
    return Judged(interval, decision, "interval", needed)


def mean(values: np.ndarray, limit: float, confidence: float, clusters: np.ndarray | None = None) -> Judged:
    x = values[~np.isnan(values)]
    interval = iv.mean_interval(values, confidence, clusters)
    decision = iv.decide("<=", limit, interval)
    needed = None
    if decision == "undecided" and interval.low is not None and interval.high is not None and len(x):
        half, gap = (interval.high - interval.low) / 2, abs(float(x.mean()) - limit)
        needed = math.ceil(len(x) * (half / gap) ** 2) if gap > 0 else None
    return Judged(interval, decision, "interval", needed)


def proportion(k: int, n: int, limit: float, comparison: str, confidence: float) -> Judged:
    """A share of requests (error rate, goodput ratio, prompt-aware violations): exact binomial."""
    if n == 0:
        return Judged(None, "undecided", "interval")
    interval = iv.binomial_interval(k, n, confidence)
    decision = iv.decide(comparison, limit, interval)
    needed = iv.proportion_samples_needed(k / n, limit, confidence) if decision == "undecided" else None
    return Judged(interval, decision, "interval", needed)


def rate(events: int, exposure: float, limit: float, comparison: str, confidence: float,
         dispersion: float = 1.0, scale: float = 1.0) -> Judged:
    """Events per ``scale`` units of exposure (stalls per 1k tokens: scale 1000); ``needed`` in exposure units."""
    units = exposure / scale
    interval = iv.poisson_rate_interval(events, units, confidence, dispersion)
    if units <= 0:
        return Judged(interval, "undecided", "interval")
    decision = iv.decide(comparison, limit, interval)
    needed = None
    if decision == "undecided":
        more = iv.rate_exposure_needed(events / units, limit, confidence, dispersion=dispersion)
        needed = None if more is None else more * scale
    return Judged(interval, decision, "interval", needed)


# ---- token-level samples: the run's narrow gaps ------------------------------------------------------------
OFFSETS = (0.001, 0.002, 0.003, 0.005, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7,
           1.0)  # candidate bounds: the quantile at q ± offset × √(q(1 − q)), the limit, the extremes


def token_quantile(run: RunAnalysis, metric: str, q: float, estimate: float | None, limit: float,
                   confidence: float) -> Judged:
    """A percentile of per-token ITL or of chunk gaps, by inverting the order-statistic test with the design
    effect measured at each candidate bound: x bounds the q-quantile from above when the samples at or below
    x, counted on the effective sample size n / deff(x), reach the upper rank; from below when they fall short
    of the lower rank. Tokens above a p99 come in bursts (one long prefill slows every stream at once) while
    those above a limit far out may not: the decision is the test at the limit itself, with the limit's own
    design effect. Read off the narrow gaps in one pass per grouping (the rows' bin among the candidates)."""
    g = run.gaps
    if g.is_empty() or estimate is None:
        return Judged(None, "undecided", "interval")
    one_token = metric == "chunk_gap_ms" or bool((g["tokens"] == 1).all())
    if one_token:  # the integers sorted (4 B a row), the few candidates made floats
        ordered, scale = g["gap_ns"].sort(), 1e6
        value, weight, n = pl.col("gap_ns") / 1e6, None, float(g.height)
    else:
        ordered, scale = itl_per_token(g).sort(), 1.0
        value, weight = pl.col("gap_ns") / 1e6 / pl.col("tokens"), pl.col("tokens")
        n = float(len(ordered))
    spread = math.sqrt(q * (1 - q))
    shares = sorted({0.0, 1.0, *(min(max(q + sign * d * spread, 0.0), 1.0) for d in OFFSETS for sign in (-1, 1))})
    last = len(ordered) - 1
    picked = ordered.gather(sorted({round(p * last) for p in shares})).to_list()
    del ordered
    candidates = sorted({float(x) / scale for x in picked} | {float(limit)})
    counts = [_below_counts(g, key, value, weight, candidates) for key in (pl.col("i"), _time_batch(g))]
    bounds = [_bound_test(n, q, confidence, [(c[:, j], sizes) for c, sizes in counts])
              for j in range(len(candidates))]
    upper = _crossing(candidates, [b[3] for b in bounds], first=True)
    lower = _crossing(candidates, [b[4] for b in bounds], first=False)
    at_limit = bounds[candidates.index(float(limit))]
    deff = at_limit[2]
    interval = iv.Interval(lower, upper, confidence, f"order statistics, batch means (deff {deff:.2g} at the limit)")
    decision: iv.Decision = "pass" if at_limit[0] else "fail" if at_limit[1] else "undecided"
    needed = None
    if decision == "undecided":
        share = float(counts[0][0][:, candidates.index(float(limit))].sum()) / n
        needed = iv.quantile_samples_needed(share, q, confidence, deff=deff)
    return Judged(interval, decision, "interval", needed)


def _below_counts(g: pl.DataFrame, key: pl.Expr, value: pl.Expr, weight: pl.Expr | None,
                  candidates: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster (rows) and candidate (columns): the samples (weighted) at or below the candidate; and each
    cluster's samples."""
    edges = pl.Series(candidates, dtype=pl.Float64)
    per = (g.lazy().group_by(key.alias("k"), pl.lit(edges).search_sorted(value, side="left").alias("b"))
           .agg(w=pl.len() if weight is None else weight.cast(pl.Int64).sum()).collect())
    _, cluster = np.unique(per["k"].to_numpy(), return_inverse=True)
    table = np.zeros((int(cluster.max()) + 1 if len(cluster) else 0, len(candidates) + 1))
    np.add.at(table, (cluster, per["b"].to_numpy().astype(np.int64)), per["w"].to_numpy().astype(float))
    cum = np.cumsum(table, axis=1)  # bin b holds values in (edge[b-1], edge[b]]: at or below edge j
    return cum[:, :-1], cum[:, -1]


def _bound_test(n: float, q: float, confidence: float,
                below: list[tuple[np.ndarray, np.ndarray]]) -> tuple[bool, bool, float, float | None, float | None]:
    """At one candidate x, given per grouping the clusters' samples at or below x and their sizes: (x is at or
    above the upper bound, x is below the lower bound, the design effect, and by how many effective samples
    the count clears the upper rank / falls short of the lower one — None where n_eff has no such rank)."""
    total = float(below[0][0].sum())
    deff = max(_kish(b, sizes, n) for b, sizes in below)
    lo, hi = iv.order_ranks(n / deff, q, confidence)
    count = total / deff  # the samples at or below x, on the effective sample size
    over_hi = None if hi is None else count - hi
    under_lo = None if lo is None else lo - count
    return over_hi is not None and over_hi >= 0, under_lo is not None and under_lo > 0, deff, over_hi, under_lo


def _crossing(xs: list[float], margins: list[float | None], first: bool) -> float | None:
    """Where ``margins`` (by candidate, increasing x for the upper bound's, decreasing for the lower's) turns
    from negative to non-negative (upper) or from positive to non-positive (lower), interpolated linearly
    between the two candidates around it (the grid's own step would widen the interval)."""
    pairs = list(zip(xs, margins))
    if first:
        for (x0, m0), (x1, m1) in zip([(None, None)] + pairs, pairs):
            if m1 is not None and m1 >= 0:
                return x1 if x0 is None or m0 is None or m1 == m0 else x0 + (0 - m0) / (m1 - m0) * (x1 - x0)
        return None
    best = None
    for (x0, m0), (x1, m1) in zip(pairs, pairs[1:] + [(None, None)]):
        if m0 is not None and m0 > 0:
            best = x0 if x1 is None or m1 is None or m1 > 0 or m0 == m1 else x0 + m0 / (m0 - m1) * (x1 - x0)
    return best


def _kish(below: np.ndarray, sizes: np.ndarray, n: float) -> float:
    """Kish's design effect of the share ``below.sum() / n`` over clusters of ``sizes`` holding ``below`` each
    (the ratio estimator's variance over the binomial one, at least 1)."""
    k = len(below)
    p = float(below.sum()) / n
    if k < 2 or p <= 0.0 or p >= 1.0:
        return 1.0
    var = k / (k - 1) * float(np.sum((below - p * sizes) ** 2)) / n**2
    return max(1.0, var / (p * (1 - p) / n))


FINE_BINS = 1000  # time batches are built from this many equal spans, merged to equal exposure


def _time_batch(g: pl.DataFrame) -> pl.Expr:
    """Each row's time batch (from its ``t_ns``): ``TIME_BATCHES`` consecutive spans of the run holding about
    equal tokens each, so that every batch carries a like share of the exposure (a batch that read almost
    nothing would make a count's dispersion unstable)."""
    t0, t1 = int(g["t_ns"].min()), int(g["t_ns"].max())  # type: ignore[arg-type]
    width = max(1, (t1 - t0 + FINE_BINS) // FINE_BINS)
    per = (g.lazy().group_by(((pl.col("t_ns") - t0) // width).alias("f"))
           .agg(e=pl.col("tokens").cast(pl.Int64).sum()).sort("f").collect())
    cum = per["e"].cum_sum()
    total = max(int(per["e"].sum()), 1)
    # the fine bins where each batch's share of the tokens begins: their start times are the batches' edges
    edges = [t0 + int(per["f"][int((cum < total * k / iv.TIME_BATCHES).sum())]) * width
             for k in range(1, iv.TIME_BATCHES)]
    return pl.lit(pl.Series(edges, dtype=pl.Int64)).search_sorted(pl.col("t_ns"), side="right")


def batch_dispersion(event_t_ns: pl.Series, g: pl.DataFrame) -> float:
    """The dispersion of events (stalls, by when they ended) over the run's time batches, exposure the tokens
    read in each batch."""
    if g.is_empty() or event_t_ns.is_empty():
        return 1.0
    batch = _time_batch(g)
    # in batch order: group_by's order varies with the thread count, and the χ² sum with it (summary.json
    # byte-stable across rebuilds)
    exposure = (g.lazy().group_by(batch.alias("b")).agg(e=pl.col("tokens").cast(pl.Int64).sum())
                .sort("b").collect())
    events = pl.DataFrame({"t_ns": event_t_ns}).lazy().group_by(batch.alias("b")).agg(n=pl.len()).collect()
    joined = exposure.join(events, on="b", how="left", maintain_order="left").with_columns(
        pl.col("n").fill_null(0))
    return iv.dispersion(joined["n"].to_numpy().astype(float), joined["e"].to_numpy().astype(float))


def token_mean(run: RunAnalysis, metric: str, limit: float, confidence: float) -> Judged:
    """The mean per-token ITL (gap time over tokens) or chunk gap: a ratio estimator over requests, Student's t
    with one degree of freedom per request less one."""
    g = run.gaps
    size = pl.col("tokens").cast(pl.Int64) if metric == "itl_ms" else pl.lit(1)
    per = (g.lazy().group_by("i").agg(s=(pl.col("gap_ns") / 1e6).sum(), m=size.sum())
           .sort("i").collect())  # in request order: the sums below in a fixed order
    k, n = per.height, float(per["m"].sum())
    if k < 2 or n == 0:
        return Judged(None, "undecided", "interval")
    mean_ms = float(per["s"].sum()) / n
    se = math.sqrt(k / (k - 1) * float(((per["s"] - mean_ms * per["m"]) ** 2).sum()) / n**2)
    t = float(iv.stats.t.ppf(1 - (1 - confidence) / 2, k - 1))
    interval = iv.Interval(mean_ms - t * se, mean_ms + t * se, confidence, "Student t, batch means")
    decision = iv.decide("<=", limit, interval)
    gap = abs(mean_ms - limit)
    needed = math.ceil(n * (t * se / gap) ** 2) if decision == "undecided" and gap > 0 else None
    return Judged(interval, decision, "interval", needed)
