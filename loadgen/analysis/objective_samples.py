"""The run's samples an objective is judged on, and which interval each statistic gets (the objectives are
built in analysis/slo.py; the intervals are analysis/intervals.py's)."""

from __future__ import annotations

import polars as pl

from loadgen.analysis import objective_intervals as oi
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.core.vocabulary import QUANTILES, TOKEN_METRICS


class ObjectiveSamples:
    """``ok``: the measured, successful requests (with metric columns); ``run``: the records' analysis (its
    narrow gaps are the token-level samples); ``confidence``: the intervals' level."""

    def __init__(self, ok: pl.DataFrame, run: RunAnalysis, confidence: float) -> None:
        self.ok = ok
        self.run = run
        self.confidence = confidence

    def metric(self, metric: str, stat: str, estimate: float | None, limit: float) -> oi.Judged:
        """The evidence on ``metric``'s ``stat`` against an upper ``limit``; ``estimate``: the summary's value."""
        c = self.confidence
        if stat == "max":
            return oi.observed(estimate, limit, "<=")
        if metric in TOKEN_METRICS:
            if stat == "mean":
                return oi.token_mean(self.run, metric, limit, c)
            return oi.token_quantile(self.run, metric, QUANTILES[stat], estimate, limit, c)
        values = self.ok[metric].cast(pl.Float64).to_numpy()
        if stat == "mean":
            return oi.mean(values, limit, c)
        return oi.quantile(values, QUANTILES[stat], limit, c)

    def requests(self, values: pl.Series, stat: str, limit: float) -> oi.Judged:
        """A statistic of one value per request (a bucket's TTFT, each request's worst gap)."""
        x = values.cast(pl.Float64).to_numpy()
        if stat == "max":
            return oi.observed(float(x.max()) if len(x) else None, limit, "<=")
        if stat == "mean":
            return oi.mean(x, limit, self.confidence)
        return oi.quantile(x, QUANTILES[stat], limit, self.confidence)
