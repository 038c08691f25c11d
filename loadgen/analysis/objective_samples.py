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
# A measured request cancelled (the run's end, its hard end, Ctrl-C) before its value was known: that value is at
# least its wait (censored), from the metric's start to the cancel stamp (t_done_ns). The metrics whose value must
# be at least the wait, by (start, the stamp that would have ended it: None, the request's end):
CENSORED = {"ttft_ms": ("t_intended_ns", "t_first_token_ns"), "e2e_ms": ("t_intended_ns", None),
            "ttft_service_ms": ("t_sent_ns", "t_first_token_ns"),
            "ttft_answer_ms": ("t_intended_ns", "t_first_answer_ns")}


def censored_wait_ms(metric: str, columns: list[str]) -> pl.Expr:
    """Per request: the wait its ``metric`` already exceeds when it was cancelled before that value was known
    (null otherwise; a request never sent has waited 0 since its send)."""
    start, end = CENSORED[metric]
    if end is not None and end not in columns:
        return pl.lit(None, dtype=pl.Float64)
    unknown = pl.col("error_kind") == "cancelled"
    if end is not None:
        unknown = unknown & pl.col(end).is_null()
    return pl.when(unknown).then((pl.col("t_done_ns") - pl.col(start)) / 1e6).otherwise(None)


class ObjectiveSamples:
    """``ok``: the measured, successful requests (with metric columns); ``run``: the records' analysis (its
    narrow gaps are the token-level samples); ``confidence``: the intervals' level; ``sessions`` and ``steps``:
    one row per session and per agent step (analysis/sessions.py; the session and step metrics' samples);
    ``cut``: the measured requests cancelled before they ended (their censored waits, ``CENSORED``)."""

    def __init__(self, ok: pl.DataFrame, run: RunAnalysis, confidence: float,
                 sessions: pl.DataFrame | None = None, steps: pl.DataFrame | None = None,
                 cut: pl.DataFrame | None = None) -> None:
        self.ok = ok
        self.run = run
        self.confidence = confidence
        self.sessions = sessions
        self.steps = steps
        self.cut = cut

    def censored(self, metric: str, limit: float | pl.Expr | None, where: pl.Expr | None = None) -> int:
        """The cancelled requests whose wait already exceeds ``limit`` of ``metric``: each a miss of it. A scoped
        objective's: ``where`` picks its requests (a prompt-length bucket), ``limit`` may be each one's own (an
        expression over the request's columns: the prompt-aware TTFT limit)."""
        if limit is None or metric not in CENSORED or self.cut is None or self.cut.is_empty():
            return 0
        cut = self.cut.filter(where) if where is not None else self.cut
        over = cut.select((censored_wait_ms(metric, cut.columns) > limit).fill_null(False).sum()).item()
        return int(over or 0)

    def values(self, metric: str, limit: float | None = None) -> pl.Series:
        """One value per sample of a request, session or step metric (sessions and steps whose calls all
        succeeded); with ``limit``, +inf for each cancelled request that had waited past it."""
        over = self.censored(metric, limit)
        base = self._values(metric)
        return pl.concat([base.cast(pl.Float64), pl.Series(metric, [math.inf] * over, dtype=pl.Float64)]) \
            if over else base

    def _values(self, metric: str) -> pl.Series:
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

    def misses(self, metric: str, limit: float | None = None) -> int:
        """Samples of ``metric``'s objectives that are a miss: the requests that reasoned and never answered,
        for ``ttft_answer_ms``, whatever the limit (the summary's percentiles leave them out); with ``limit``, the
        cancelled requests that had waited past it too (``censored``)."""
        unanswered = int(never_answered(self.ok).sum()) if metric == UNANSWERED_MISS else 0
        return unanswered + self.censored(metric, limit)

    def estimate(self, metric: str, stat: str, described: float | None, limit: float | None = None) -> float | None:
        """``stat`` of ``metric``'s objective samples: the summary's figure (``described``) unless some samples
        are misses (then over every sample, misses as +inf: the percentile is linear between ranks as the
        summary's, +inf once it reaches a miss; the mean and max are +inf)."""
        if not self.misses(metric, limit):
            return described
        return with_misses_estimate(self.values(metric, limit), stat)

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
        values = self.values(metric, limit).cast(pl.Float64).to_numpy()
        if stat == "mean":
            if self.misses(metric, limit):  # a mean over a +inf sample: no interval brings it under any limit
                return oi.observed(math.inf, limit, "<=")
            return oi.mean(values, limit, c)
        return oi.quantile(values, QUANTILES[stat], limit, c)

    def requests(self, values: pl.Series, stat: str, limit: float, missed: int = 0) -> oi.Judged:
        """A statistic of one value per request (a bucket's TTFT, each request's worst gap); ``missed``: the
        scope's cancelled requests that waited past ``limit`` (``censored``), each a further +inf sample."""
        x = np.concatenate([values.cast(pl.Float64).to_numpy(), np.full(missed, math.inf)])
        if stat == "max":
            return oi.observed(float(x.max()) if len(x) else None, limit, "<=")
        if stat == "mean":
            if missed:  # a mean over a +inf sample: no interval brings it under any limit
                return oi.observed(math.inf, limit, "<=")
            return oi.mean(x, limit, self.confidence)
        return oi.quantile(x, QUANTILES[stat], limit, self.confidence)


def with_misses_estimate(values: pl.Series, stat: str) -> float | None:
    """``stat`` over ``values`` that hold misses as +inf: a percentile linear between ranks as the summary's, +inf
    once it reaches a miss; the mean and max are +inf."""
    if stat not in QUANTILES:
        return math.inf
    x = np.sort(values.drop_nulls().cast(pl.Float64).to_numpy())
    x = x[~np.isnan(x)]
    return at_rank(x, (len(x) - 1) * QUANTILES[stat] + 1)
