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
def token_quantile(run: RunAnalysis, metric: str, q: float, estimate: float | None, limit: float,
                   confidence: float) -> Judged:
    """A percentile of per-token ITL or of chunk gaps: order statistics on the effective sample size. Read off
    the narrow gaps in streaming queries (a byte a row for the share below the estimate; an hour's 19 M rows
    are never widened)."""
    g = run.gaps
    if g.is_empty() or estimate is None:
        return Judged(None, "undecided", "interval")
    one_token = metric == "chunk_gap_ms" or bool((g["tokens"] == 1).all())
    value = pl.col("gap_ns") / 1e6 if one_token else pl.col("gap_ns") / 1e6 / pl.col("tokens")
    weight = None if one_token else pl.col("tokens")
    n = float(g.height if one_token else g["tokens"].sum())
    deff = max(_deff(g, pl.col("i"), value <= estimate, weight),
               _deff(g, _time_batch(g), value <= estimate, weight))
    n_eff = n / deff
    lo, hi = iv.order_ranks(n_eff, q, confidence)
    method = f"order statistics, batch means (deff {deff:.2g})"

    def at(rank: float | None) -> float | None:
        if rank is None:
            return None
        share = min(max((rank - 1) / max(math.floor(n_eff) - 1, 1), 0.0), 1.0)
        if one_token:
            return float(g.select(pl.col("gap_ns").quantile(share, "linear")).item()) / 1e6
        return float(itl_per_token(g).quantile(share, "linear") or 0.0)
    interval = iv.Interval(at(lo), at(hi), confidence, method)
    decision = iv.decide("<=", limit, interval)
    needed = None
    if decision == "undecided":
        hits = (value <= limit).cast(pl.UInt16)
        at_limit = float(g.lazy().select((hits if weight is None else hits * weight).sum()).collect().item())
        needed = iv.quantile_samples_needed(at_limit / n, q, confidence, deff=deff)
    return Judged(interval, decision, "interval", needed)


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


def _deff(g: pl.DataFrame, key: pl.Expr, below: pl.Expr, weight: pl.Expr | None) -> float:
    """Kish's design effect of the (``weight``ed, else counted) share of rows where ``below`` holds, clusters
    given by ``key``."""
    hits = below.cast(pl.UInt16)
    sums = (g.lazy().group_by(key.alias("k"))
            .agg(s=(hits if weight is None else hits * weight).sum(),
                 m=pl.len() if weight is None else weight.sum()).collect())
    k, n = sums.height, float(sums["m"].sum())
    if k < 2 or n == 0:
        return 1.0
    p = float(sums["s"].sum()) / n
    if p in (0.0, 1.0):
        return 1.0
    var = k / (k - 1) * float(((sums["s"] - p * sums["m"]) ** 2).sum()) / n**2
    return max(1.0, var / (p * (1 - p) / n))


def batch_dispersion(event_t_ns: pl.Series, g: pl.DataFrame) -> float:
    """The dispersion of events (stalls, by when they ended) over the run's time batches, exposure the tokens
    read in each batch."""
    if g.is_empty() or event_t_ns.is_empty():
        return 1.0
    batch = _time_batch(g)
    exposure = g.lazy().group_by(batch.alias("b")).agg(e=pl.col("tokens").cast(pl.Int64).sum()).collect()
    events = pl.DataFrame({"t_ns": event_t_ns}).lazy().group_by(batch.alias("b")).agg(n=pl.len()).collect()
    joined = exposure.join(events, on="b", how="left").with_columns(pl.col("n").fill_null(0))
    return iv.dispersion(joined["n"].to_numpy().astype(float), joined["e"].to_numpy().astype(float))


def token_mean(run: RunAnalysis, metric: str, limit: float, confidence: float) -> Judged:
    """The mean per-token ITL (gap time over tokens) or chunk gap: a ratio estimator over requests, Student's t
    with one degree of freedom per request less one."""
    g = run.gaps
    size = pl.col("tokens").cast(pl.Int64) if metric == "itl_ms" else pl.lit(1)
    per = g.lazy().group_by("i").agg(s=(pl.col("gap_ns") / 1e6).sum(), m=size.sum()).collect()
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
