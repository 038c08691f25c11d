"""The run's samples an objective is judged on, and which interval each statistic gets (the objectives are
built in analysis/slo.py; the intervals are analysis/intervals.py's)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from loadgen.analysis import objective_intervals as oi
from loadgen.analysis.intervals import at_rank
from loadgen.analysis.reasoning import never_answered
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.core.vocabulary import METRICS, QUANTILES, TOKEN_METRICS

PHASE_OF = {"itl_reasoning_ms": "reasoning", "itl_answer_ms": "answer"}  # a phase's ITL: that phase's gaps
UNANSWERED_MISS = "ttft_answer_ms"  # a request that reasoned and never answered: +inf in this objective's samples


class ObjectiveSamples:
    """``ok``: the measured, successful requests (with metric columns); ``run``: the records' analysis (its
    narrow gaps are the token-level samples); ``confidence``: the intervals' level; ``sessions`` and ``steps``:
    one row per session and per agent step (analysis/sessions.py; the session and step metrics' samples)."""

    def __init__(self, ok: pl.DataFrame, run: RunAnalysis, confidence: float,
                 sessions: pl.DataFrame | None = None, steps: pl.DataFrame | None = None) -> None:
        self.ok = ok
        self.run = run
        self.confidence = confidence
        self.sessions = sessions
        self.steps = steps

    def values(self, metric: str) -> pl.Series:
        """One value per sample of a request, session or step metric (sessions and steps whose calls all
        succeeded)."""
        basis = METRICS[metric].basis
        if basis in ("session", "step"):
            frame = self.sessions if basis == "session" else self.steps
            if frame is None or self.sessions is None:
                return pl.Series(metric, [], dtype=pl.Float64)
            done = self.sessions.filter(pl.col("ok")).select("worker", "session")
            return frame.join(done, on=["worker", "session"], how="semi").filter(pl.col("ok"))[metric]
        if metric not in self.ok.columns:
            return pl.Series(metric, [], dtype=pl.Float64)
        if metric == UNANSWERED_MISS:  # never answered: the longest wait of all, not no wait
            waits = pl.Series(metric, [math.inf] * self.ok.height, dtype=pl.Float64)
            return waits.zip_with(never_answered(self.ok), self.ok[metric].cast(pl.Float64))
        return self.ok[metric]

    def misses(self, metric: str) -> int:
        """Samples of ``metric``'s objectives that are a miss whatever the limit: the requests that reasoned and
        never answered, for ``ttft_answer_ms`` (the summary's percentiles leave them out); 0 otherwise."""
        return int(never_answered(self.ok).sum()) if metric == UNANSWERED_MISS else 0

    def estimate(self, metric: str, stat: str, described: float | None) -> float | None:
        """``stat`` of ``metric``'s objective samples: the summary's figure (``described``) unless some samples
        are misses (then over every sample, misses as +inf: the percentile is linear between ranks as the
        summary's, +inf once it reaches a miss; the mean and max are +inf)."""
        if not self.misses(metric):
            return described
        if stat not in QUANTILES:
            return math.inf
        x = np.sort(self.values(metric).drop_nulls().cast(pl.Float64).to_numpy())
        x = x[~np.isnan(x)]
        return at_rank(x, (len(x) - 1) * QUANTILES[stat] + 1)

    def metric(self, metric: str, stat: str, estimate: float | None, limit: float) -> oi.Judged:
        """The evidence on ``metric``'s ``stat`` against an upper ``limit``; ``estimate``: the summary's value."""
        c = self.confidence
        if stat == "max":
            return oi.observed(estimate, limit, "<=")
        if metric in TOKEN_METRICS:
            run, name = (self.run.phase_run(PHASE_OF[metric]), "itl_ms") if metric in PHASE_OF else (self.run, metric)
            if stat == "mean":
                return oi.token_mean(run, name, limit, c)
            return oi.token_quantile(run, name, QUANTILES[stat], estimate, limit, c)
        values = self.values(metric).cast(pl.Float64).to_numpy()
        if stat == "mean":
            if self.misses(metric):  # a mean over a +inf sample: no interval brings it under any limit
                return oi.observed(math.inf, limit, "<=")
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
