"""Steady state: the warm-up and drain transients of a run, detected with MSER-5, and the window they leave.

The rule (docs/verdicts.md, "Steady state"), applied to the requests after the declared warm-up:

1. **The series.** Each successful request's ``e2e_ms`` (from its intended send: queueing, prefill and decode,
   every phase a transient touches), as its mid-rank within its own class scaled to (0, 1), in the order of the
   intended sends. Ranks make the rule blind to the latencies' heavy tail (one slow request is one rank, not an
   outlier that MSER would cut away) and to the mix of classes.
2. **MSER-5** (White 1997; Franklin & White 2008). The series in batches of 5 (means of 5 consecutive values;
   a remainder of fewer than 5 is left out of the statistic, never out of the window); for each truncation of
   ``d`` batches, MSER(d) = Σ_{j>d} (Z_j − Z̄_d)² / (k − d)², over ``d`` in the first half of the ``k`` batches
   only; d* = argmin (the first, on ties). MSER needs ``MIN_BATCHES`` (20 batches: 100 requests) or says
   nothing.
3. **A truncation must be meaningful.** MSER alone cuts by chance: with an early run of slow requests in a
   stationary series (queue episodes, an outlier batch) the minimum moves off 0. d* is kept only where the cut
   part's mean rank lies outside the ``1 − ALPHA`` (99.99 %) prediction interval of a mean over as many
   consecutive requests of the kept part: the kept part is cut into ``w`` windows of ``L`` requests (``L`` the
   cut length, at most a ``MIN_WINDOWS``-th of the kept part; the cut's first ``L`` requests are tested), and
   |m_cut − m̄| > t_{w−1}(1 − ALPHA/2) · s · √(1 + 1/w). Windows of the cut's own length carry the run's own
   autocorrelation at that scale. By simulation (bench/steady_state.py, docs/verdicts.md) a stationary series
   loses requests in at most 0.4 % of runs (M/M/1 queues at 80–90 % load), nominally ALPHA.
4. **Not reached.** A minimum on the search's edge (half the series) that differs from the rest (3.), or after which
   the series still trends (Kendall's τ over the means of ``TREND_SEGMENTS`` consecutive parts of the second
   half; a trend inflates the windows' spread in 3.), both at ``EDGE_ALPHA`` (1 %: this flags, it cuts
   nothing): the transient lasts at least half the run, or it never settled (an overload's queue grows to its
   end). Nothing is cut; ``reached: false``.
5. **Drain**: the same, on the reversed series of what the warm-up left (its own first half searched).

``steady_state: declared`` (load.steady_state) skips all of it: the window is the declared warm-up's end to
the last send, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

BATCH = 5  # MSER-5: batch means of 5 observations
MIN_BATCHES = 20  # below 100 successful requests the rule says nothing (too noisy to cut anything)
MIN_WINDOWS = 20  # kept-part windows (at least) the significance test compares the cut part with
ALPHA = 0.0001  # two-sided: the nominal chance that a steady run loses its first (or last) requests
EDGE_ALPHA = 0.01  # a minimum on the search's edge: "not reached" at this level (it flags, it cuts nothing)
TREND_SEGMENTS = 10  # a half that still trends: Kendall's τ over the means of 10 consecutive parts


@dataclass(frozen=True)
class Cut:
    """One end's truncation: ``requests`` cut (0: none), MSER's d* in batches, and why."""

    requests: int
    batches: int
    reason: str
    reached: bool = True


@dataclass(frozen=True)
class SteadyWindow:
    """The requests a run's figures are taken over: intended sends from ``start_ns`` to ``end_ns`` (None: no
    bound), ``warmup``/``drain`` requests cut at either end by detection (the declared warm-up aside);
    ``origin_ns``: the first intended send after the declared warm-up (the run's time origin)."""

    method: str  # "mser-5" or "declared"
    origin_ns: int | None
    start_ns: int | None = None
    end_ns: int | None = None
    warmup: int = 0  # requests (any outcome) cut before the window by detection
    drain: int = 0  # requests cut after it
    reached: bool | None = None  # steady state reached (None: not tested — declared, or too few requests)
    reason: str = ""

    @property
    def transient(self) -> int:
        return self.warmup + self.drain

    def outside(self, t_intended_ns: pl.Expr) -> pl.Expr:
        """True for a request outside the window (cut by detection)."""
        out = pl.lit(False)
        if self.start_ns is not None:
            out = out | (t_intended_ns < self.start_ns)
        if self.end_ns is not None:
            out = out | (t_intended_ns > self.end_ns)
        return out

    def seconds(self, t_ns: int | None) -> float | None:
        """``t_ns`` in seconds since the origin (None: unbounded, or no origin)."""
        return None if t_ns is None or self.origin_ns is None else (t_ns - self.origin_ns) / 1e9

    def as_dict(self) -> dict[str, Any]:
        """summary.json's ``steady_state``: the window's bounds in seconds since the origin (None: unbounded),
        the requests cut at each end, whether steady state was reached, and why."""
        return {"method": self.method, "series": SERIES if self.method == "mser-5" else None,
                "reached": self.reached, "start_s": self.seconds(self.start_ns), "end_s": self.seconds(self.end_ns),
                "warmup_requests": self.warmup, "drain_requests": self.drain, "transient_requests": self.transient,
                "reason": self.reason}


SERIES = "e2e_ms, ranked within its class, by intended send"


def declared(measured: pl.DataFrame) -> SteadyWindow:
    """``load.steady_state: declared``: every request after the declared warm-up."""
    return SteadyWindow("declared", _origin(measured), reason="load.steady_state: declared (the declared "
                        "warm-up only)")


def _origin(measured: pl.DataFrame) -> int | None:
    first = measured["t_intended_ns"].min() if measured.height else None
    return None if first is None else int(first)  # type: ignore[arg-type]


def mser(batches: np.ndarray, limit: int) -> np.ndarray:
    """MSER(d) for d = 0..limit over batch means ``batches`` (White 1997)."""
    z = batches - batches.mean()
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    kept = len(z) - np.arange(len(z), dtype=np.float64)
    return ((s2 - s1 * s1 / kept) / kept**2)[: limit + 1]


def batch_means(series: np.ndarray, size: int = BATCH) -> np.ndarray:
    k = len(series) // size
    return series[: k * size].reshape(k, size).mean(axis=1)


def meaningful(cut: np.ndarray, kept: np.ndarray, alpha: float = ALPHA) -> bool:
    """Is ``cut``'s mean outside the ``1 − alpha`` prediction interval of the mean of as many consecutive
    values of ``kept``? (its first L values tested, L at most a MIN_WINDOWS-th of ``kept``)."""
    length = min(len(cut), len(kept) // MIN_WINDOWS)
    if length < 1:
        return False
    w = len(kept) // length
    windows = kept[: w * length].reshape(w, length).mean(axis=1)
    spread = float(windows.std(ddof=1))
    gap = abs(float(cut[:length].mean()) - float(windows.mean()))
    if spread == 0.0:
        return gap > 0.0
    return gap > float(stats.t.ppf(1 - alpha / 2, w - 1)) * spread * float(np.sqrt(1 + 1 / w))


def truncation(series: np.ndarray) -> Cut:
    """MSER-5's meaningful truncation of the front of ``series`` (in values, a multiple of 5)."""
    z = batch_means(series)
    if len(z) < MIN_BATCHES:
        return Cut(0, 0, f"{len(series)} requests: MSER-5 needs {MIN_BATCHES * BATCH}", reached=True)
    limit = len(z) // 2
    d = int(np.argmin(mser(z, limit)))
    if d == 0:
        return Cut(0, 0, "MSER-5: no truncation")
    cut, kept = series[: d * BATCH], series[d * BATCH:]
    differs = meaningful(cut, kept)
    if d == limit and (meaningful(cut, kept, EDGE_ALPHA) or still_moving(kept, alpha=EDGE_ALPHA)):
        return Cut(0, d, "MSER-5's minimum is at half the run (the search's edge): the transient lasts at least "
                   "that long, or the latencies still trend", reached=False)
    if not differs:
        return Cut(0, d, f"MSER-5's minimum at {d} batches is within the run's own variation (α = {ALPHA:g})")
    return Cut(d * BATCH, d, f"MSER-5: {d} batches of {BATCH}")


def still_moving(kept: np.ndarray, segments: int = TREND_SEGMENTS, alpha: float = ALPHA) -> bool:
    """Do the means of ``segments`` consecutive parts of ``kept`` trend (Kendall's τ, exact, p < alpha)?"""
    size = len(kept) // segments
    if size < 1:
        return False
    means = kept[: size * segments].reshape(segments, size).mean(axis=1)
    if np.ptp(means) == 0.0:
        return False
    return bool(stats.kendalltau(np.arange(segments), means).pvalue < alpha)


def class_ranks(ok: pl.DataFrame, value: str = "e2e_ms") -> np.ndarray:
    """Each request's mid-rank of ``value`` within its class, scaled to (0, 1), in the frame's order."""
    ranked = ok.select((pl.col(value).rank("average").over("class_name")
                        / (pl.len().over("class_name") + 1)).alias("r"))
    return ranked["r"].to_numpy().astype(np.float64)


def detect(measured: pl.DataFrame) -> SteadyWindow:
    """The steady window of ``measured`` (the requests after the declared warm-up, metric columns added)."""
    origin = _origin(measured)
    ok = measured.filter(pl.col("ok") & pl.col("e2e_ms").is_not_null()).sort("t_intended_ns", maintain_order=True)
    if ok.height < MIN_BATCHES * BATCH:
        return SteadyWindow("mser-5", origin, reason=f"{ok.height} successful requests: MSER-5 needs "
                            f"{MIN_BATCHES * BATCH} to detect a transient (nothing cut)")
    series = class_ranks(ok)
    head = truncation(series)
    if not head.reached:
        return SteadyWindow("mser-5", origin, reached=False, reason=f"warm-up: {head.reason} (nothing cut)")
    tail = truncation(series[head.requests:][::-1])
    if not tail.reached:
        return SteadyWindow("mser-5", origin, reached=False, reason=f"drain: {tail.reason} (nothing cut)")
    times = ok["t_intended_ns"]
    start = int(times[head.requests]) if head.requests else None
    end = int(times[ok.height - 1 - tail.requests]) if tail.requests else None
    window = SteadyWindow("mser-5", origin, start, end, reached=True,
                          reason=f"warm-up: {head.reason}; drain: {tail.reason}")
    early = pl.col("t_intended_ns") < (start if start is not None else origin or 0)
    cut = measured.select(early.sum().alias("warmup"), window.outside(pl.col("t_intended_ns")).sum().alias("all"))
    warmup, cut_all = (int(x) for x in cut.row(0))
    return replace(window, warmup=warmup, drain=cut_all - warmup)
