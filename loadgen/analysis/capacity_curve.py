"""Capacity from the curve: every objective's value against the load, over all of a sweep's steps, and the load
where it crosses its limit, with an interval. Pure: numpy only, no I/O (docs/verdicts.md, "sweep").

Theory of operation
-------------------
A step judged alone cannot narrow a boundary where the objective sits at its limit over a range of loads; the
steps together can. Each objective is one curve over the load:

* a percentile objective ``metric.pQ <= limit`` as its **exceedance share**, the share of the step's samples
  above the limit: pQ <= limit exactly when that share is <= 1 − Q, so the curve crosses 1 − Q where the
  percentile crosses the limit. Per-token metrics (``itl_ms``) count every token, clustered by its request;
* a request whose value is unknown but already past the limit counts as one sample above it, as every
  step's own objective counts it (analysis/objective_samples.py): a measured request cancelled after waiting
  longer than a ``ttft_ms``, ``e2e_ms`` or ``ttft_answer_ms`` limit, a stream that reasoned and never answered
  (``ttft_answer_ms``) — at an overloaded step the curve would otherwise see only the fast survivors;
* the other objectives as their statistic itself: a mean, the error rate, the goodput ratio, stalls per 1k
  tokens — each a ratio of per-request sums (``ratio_terms``).

The curve is fitted monotone in the load by weighted isotonic regression (non-decreasing for a ``<=`` limit,
non-increasing for a ``>=`` one; each step weighted by its samples; steps at one load pooled) — the max–min
formula (Barlow et al. 1972, Statistical Inference under Order Restrictions, thm 1.4), equal to
``scipy.optimize.isotonic_regression`` and vectorised here over the bootstrap replicates. The crossing is the
load where the fitted curve first exceeds the level, linearly interpolated between the two fitted steps around
it; below the lowest probed load or above the highest it is censored (−∞ / +∞).

The interval: a Poisson block bootstrap over each step's requests (Künsch 1989's blocks with Poisson(1)
weights, as analysis/compare.py weighs requests): consecutive requests (in send order) fall in blocks of about
BLOCK_S seconds (at least MIN_BLOCKS per step), each block takes one weight per replicate, and the curve is
refitted in every replicate. In each replicate, monotonicity alone places the crossing between two probed loads
(``brackets``: the highest that meets the level, the first that exceeds it); the interval runs from the lower
percentile of the first to the upper percentile of the second, at the confidence asked (an end beyond the probed
loads: None). The interpolated crossing is the point estimate, never the interval's whole story: a curve that
jumps from 0 to 100 % between two probes puts every replicate's interpolation on one point.

Why blocks and brackets (tests/test_capacity_coverage.py, in virtual time: 500 seeded step sets drawn from
hour-long replays, the true crossing from a fine grid of them): near capacity the latencies of requests sent
close together move together (one queue), and a weight per request ignored it; the interpolated crossings'
own percentiles were too narrow. 95 % intervals held the truth in 35 % of searches (per request, interpolated),
91 % (20-s blocks, interpolated), 68 % (per request, brackets) and 96 % (20-s blocks, brackets).

The capacity is the lowest crossing over the objectives, its interval that of the replicates' lowest brackets.

**Flat at the limit**: where an objective's fitted point values stay within ±5 % of its limit over two or more
probed loads, the curve says so ("itl_ms.p99 within ±5 % of its limit from 21.8 to 28.5 req/s"); the capacity
there is the interval's lower end (the loads where the curve's upper bound still meets the limit), and the
search does not spend its budget inside the range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from scipy.optimize import isotonic_regression

from loadgen.analysis.compare import RunSamples
from loadgen.core.vocabulary import QUANTILES, ObjectiveId

FLAT_SHARE = 0.05  # an objective within this share of its limit over a range of loads is flat there
BATCH_CELLS = 4_000_000  # replicates × blocks per batch of Poisson weights
MIN_BLOCKS = 10  # a step's requests fall in at least this many blocks (while it has as many requests)
BLOCK_S = 20.0  # seconds of consecutive requests that share one bootstrap weight (see the docstring)


@dataclass(frozen=True)
class CurvePoint:
    """One objective at one step: the curve's value there, its weight (samples) and its bootstrap replicates."""

    objective: str
    comparison: str  # "<=" or ">=": the curve's direction
    threshold: float  # the objective's limit, in its own unit
    level: float  # where the curve crosses: 1 − Q for an exceedance share, else the limit
    kind: str  # "exceedance" | "statistic"
    load: float
    value: float
    weight: float
    replicates: np.ndarray = field(repr=False, compare=False)
    point: Optional[float] = None  # the step's own value of the objective (its unit: a p99 in ms)


# ---- one step: its objectives as ratios of per-request sums ----------------------------------------------
def ratio_terms(o: dict[str, Any], s: RunSamples) -> Optional[tuple[np.ndarray, np.ndarray, float, str]]:
    """(numerator, denominator) per request, the level and the kind of objective ``o`` (a summary's ``slo``
    entry) on run ``s``; None where the curve cannot reach it (a scope, a session figure: the steps' own calls
    judge it)."""
    oid, limit, ok = ObjectiveId.of(o), float(o["threshold"]), s.ok
    if oid.scope:
        return None
    if oid.stat in QUANTILES and o.get("comparison", "<=") == "<=":
        if oid.metric == "itl_ms":
            keep = ~np.isnan(s.itl_ms)
            above = np.bincount(s.itl_request[keep], weights=(s.itl_ms[keep] > limit).astype(float),
                                minlength=s.n)
            return above, np.bincount(s.itl_request[keep], minlength=s.n).astype(float), \
                1.0 - QUANTILES[oid.stat], "exceedance"
        values = getattr(s, oid.metric, None) if oid.metric in _PER_REQUEST else None
        if values is None:
            return None
        seen = ok & ~np.isnan(values)
        over = seen & (np.nan_to_num(values) > limit)
        missed = _missed(s, oid.metric, limit)  # a miss the step's own objective counts: one sample, above
        return (over | missed).astype(float), (seen | missed).astype(float), 1.0 - QUANTILES[oid.stat], \
            "exceedance"
    if oid.stat == "mean" and oid.metric in _PER_REQUEST and getattr(s, oid.metric, None) is not None:
        values = getattr(s, oid.metric)
        seen = ok & ~np.isnan(values)
        return np.where(seen, np.nan_to_num(values), 0.0), seen.astype(float), limit, "statistic"
    okf, tokens = ok.astype(float), s.output_tokens * ok
    ratios = {("error_rate", "max"): (s.failed.astype(float), s.counted.astype(float)),
              ("stalls", "max_per_1k_tokens"): (s.stalls, tokens / 1000),
              ("stalls", "max_prefill_induced_per_1k_tokens"): (
                  s.prefill_stalls if s.prefill_stalls is not None else np.zeros(s.n), tokens / 1000),
              ("goodput", "min_ratio"): (okf, np.ones(s.n))}  # the good share: ``good`` replaces okf
    terms = ratios.get((oid.metric, oid.stat))
    return None if terms is None else (terms[0], terms[1], limit, "statistic")


def _missed(s: RunSamples, metric: str, limit: float) -> np.ndarray:
    """Per request: a value unknown but already past ``limit`` (``RunSamples.censored_ms``: a request cancelled
    after waiting longer, a stream never answered) — a miss of ``metric``'s objective, as every step counts it
    (analysis/objective_samples.py)."""
    at_least = (s.censored_ms or {}).get(metric)
    if at_least is None:
        return np.zeros(s.n, dtype=bool)
    return at_least > limit  # NaN (known): never


_PER_REQUEST = ("ttft_ms", "tpot_ms", "e2e_ms", "ttft_answer_ms", "tpot_reasoning_ms", "tpot_answer_ms")


def good_requests(s: RunSamples, goodput: Any) -> np.ndarray:
    """DistServe's good requests: OK and within each of the goodput limits given (as analysis/capacity.py)."""
    good = s.ok.copy()
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        limit = getattr(goodput, metric, None) if goodput is not None else None
        if limit is not None:
            good &= np.nan_to_num(getattr(s, metric), nan=0.0) <= limit
    return good.astype(float)


def blocks_of(s: RunSamples, block_s: float) -> np.ndarray:
    """Each request's block: runs of consecutive requests (by plan sequence: send order) about ``block_s`` of
    the step's window long, at least MIN_BLOCKS of them while there are requests enough."""
    n = s.n
    count = max(1, min(n, max(MIN_BLOCKS, int(np.ceil(s.window_s / block_s)) if block_s > 0 else n)))
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(s.seq, kind="stable")] = np.arange(n)
    return rank * count // max(1, n)


def step_points(slo: list[dict[str, Any]], s: RunSamples, load: float, goodput: Any = None,
                replicates: int = 1000, seed: int = 0, block_s: float = BLOCK_S) -> list[CurvePoint]:
    """Each objective of one step that the curve reaches, with its value and its Poisson-bootstrap replicates:
    one Poisson(1) weight per block of consecutive requests per replicate (``block_s`` 0: per request)."""
    terms = []
    for o in slo:
        t = ratio_terms(o, s)
        if t is not None and ObjectiveId.of(o) == ObjectiveId("goodput", "min_ratio"):
            t = (good_requests(s, goodput), t[1], t[2], t[3])
        if t is not None:
            terms.append((o, t))
    if not terms:
        return []
    block = blocks_of(s, block_s)
    count = int(block.max()) + 1 if s.n else 0
    nums, dens = np.zeros((len(terms), replicates)), np.zeros((len(terms), replicates))
    rng, batch = np.random.default_rng(seed), max(1, BATCH_CELLS // max(1, replicates))
    for lo in range(0, count, batch):
        w = rng.poisson(1.0, size=(replicates, min(batch, count - lo))).astype(np.float64)
        for k, (_, (num, den, _, _)) in enumerate(terms):
            nums[k] += w @ np.bincount(block, weights=num, minlength=count)[lo:lo + batch]
            dens[k] += w @ np.bincount(block, weights=den, minlength=count)[lo:lo + batch]
    out = []
    for k, (o, (num, den, level, kind)) in enumerate(terms):
        total = float(den.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            reps = nums[k] / dens[k]
        value = float(num.sum()) / total if total > 0 else float("nan")
        out.append(CurvePoint(str(o["objective"]), str(o.get("comparison", "<=")), float(o["threshold"]), level,
                              kind, load, value, total, reps, o.get("value")))
    return out


# ---- the fit: monotone in the load, every replicate at once ------------------------------------------------
def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing weighted least-squares fit of each row of ``y`` (replicates × loads; weights ``w`` > 0
    per load): scipy's pool-adjacent-violators, row by row (a sweep has a few tens of steps, a thousand rows)."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    weights = np.asarray(w, dtype=float)
    return np.array([isotonic_regression(row, weights=weights).x for row in y]).reshape(y.shape)


def crossings(loads: np.ndarray, fitted: np.ndarray, level: float) -> np.ndarray:
    """Per row of ``fitted`` (non-decreasing over ``loads``), the load where it first exceeds ``level``,
    linearly interpolated between the fitted steps around it; −inf: above it at the lowest load, +inf: never."""
    fitted = np.atleast_2d(fitted)
    above = fitted > level
    first = above.argmax(axis=1)
    out = np.where(above.any(axis=1), np.where(first == 0, -np.inf, np.nan), np.inf)
    inside = np.isnan(out)
    if inside.any():
        r, i = np.nonzero(inside)[0], first[inside]
        f0, f1, x0, x1 = fitted[r, i - 1], fitted[r, i], loads[i - 1], loads[i]
        out[inside] = x0 + (level - f0) / (f1 - f0) * (x1 - x0)
    return out


def brackets(loads: np.ndarray, fitted: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``fitted``, the probed loads around its crossing: the highest that meets the level below the
    first that exceeds it (−inf: none), and that first one (+inf: none). Monotonicity alone places the crossing
    between them; where between is the interpolation's guess."""
    fitted = np.atleast_2d(fitted)
    above = fitted > level
    first = above.argmax(axis=1)
    ext = np.concatenate([[-np.inf], loads, [np.inf]])
    hit = above.any(axis=1)
    return np.where(hit, ext[first], ext[-2]), np.where(hit, ext[first + 1], np.inf)


def interval_of(values: np.ndarray, confidence: float) -> tuple[Optional[float], Optional[float]]:
    """The percentile interval of ``values`` (order statistics, so ±inf stay ±inf); an infinite end: None."""
    ordered = np.sort(values[~np.isnan(values)])
    if not len(ordered):
        return None, None
    alpha = (1 - confidence) / 2
    lo = ordered[int(np.floor(alpha * len(ordered)))]
    hi = ordered[max(0, int(np.ceil((1 - alpha) * len(ordered))) - 1)]
    return (float(lo) if np.isfinite(lo) else None), (float(hi) if np.isfinite(hi) else None)


def _finite(x: float) -> Optional[float]:
    return float(x) if np.isfinite(x) else None


@dataclass
class ObjectiveCurve:
    """One objective over the sweep's loads: its points, the monotone fit, the crossing and its interval."""

    objective: str
    comparison: str
    threshold: float
    level: float
    kind: str
    loads: list[float]
    values: list[float]
    weights: list[float]
    fitted: list[float]
    crossing: Optional[float]  # None: beyond the probed loads (``side`` says which)
    side: str  # "inside" | "below" (fails at the lowest load) | "above" (meets it at the highest)
    low: Optional[float]
    high: Optional[float]
    flat: Optional[tuple[float, float]] = None  # the loads over which its value is within ±5 % of its limit
    replicates: np.ndarray = field(default_factory=lambda: np.zeros((2, 0)), repr=False, compare=False)  # brackets

    def flat_text(self, unit: str) -> str:
        if self.flat is None:
            return ""
        return (f"{self.objective} within ±{FLAT_SHARE * 100:g} % of its limit from {self.flat[0]:g} to "
                f"{self.flat[1]:g} {unit}")

    def meets(self, load: float) -> bool:
        """Whether the monotone fit meets the level at the probed ``load`` (True where it has no point there)."""
        if load not in self.loads:
            return True
        fitted = self.fitted[self.loads.index(load)]
        return fitted >= self.level if self.comparison == ">=" else fitted <= self.level

    def as_dict(self) -> dict[str, Any]:
        """sweep.json's ``curves`` entry (docs/verdicts.md, "sweep")."""
        return {"objective": self.objective, "comparison": self.comparison, "threshold": self.threshold,
                "level": self.level, "kind": self.kind, "crossing": self.crossing, "side": self.side,
                "low": self.low, "high": self.high, "flat": list(self.flat) if self.flat else None,
                "points": [{"load": x, "value": v, "fitted": f, "weight": w} for x, v, f, w in
                           zip(self.loads, self.values, self.fitted, self.weights)]}


def _pooled(points: list[CurvePoint]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """Points with samples, pooled per load (weighted means): loads, values, weights, replicates (rows: one
    per replicate) and the steps' own values (pooled alike; NaN where none)."""
    loads = sorted({p.load for p in points if p.weight > 0 and np.isfinite(p.value)})
    vals, wts, reps, own = [], [], [], []
    for x in loads:
        at = [p for p in points if p.load == x and p.weight > 0 and np.isfinite(p.value)]
        w = np.array([p.weight for p in at])
        vals.append(float(np.average([p.value for p in at], weights=w)))
        wts.append(float(w.sum()))
        filled = np.array([np.where(np.isfinite(p.replicates), p.replicates, p.value) for p in at])
        reps.append(np.average(filled, axis=0, weights=w))
        known = [(p.point, p.weight) for p in at if p.point is not None]
        own.append(float(np.average([k[0] for k in known], weights=[k[1] for k in known])) if known
                   else float("nan"))
    return np.array(loads), np.array(vals), np.array(wts), np.array(reps).T.reshape(-1, len(loads)), own


def flat_range(loads: np.ndarray, own: list[float], weights: np.ndarray, threshold: float,
               sign: float) -> Optional[tuple[float, float]]:
    """The widest run of two or more probed loads over which the monotone fit of the steps' own values stays
    within ±FLAT_SHARE of the limit (None: none)."""
    keep = ~np.isnan(own)
    if threshold <= 0 or keep.sum() < 2:
        return None
    x, fit = loads[keep], sign * isotonic(sign * np.asarray(own)[keep], weights[keep])[0]
    near = np.abs(fit / threshold - 1) <= FLAT_SHARE
    best, start = None, None
    for i, flag in enumerate(list(near) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= 2 and (best is None or x[i - 1] - x[start] > best[1] - best[0]):
                best = (float(x[start]), float(x[i - 1]))
            start = None
    return best


def objective_curve(points: list[CurvePoint], confidence: float) -> Optional[ObjectiveCurve]:
    """The curve of one objective's points (from every step); None: no step had samples for it."""
    loads, values, weights, reps, own = _pooled(points)
    if not len(loads):
        return None
    first = points[0]
    sign = -1.0 if first.comparison == ">=" else 1.0  # a ">=" limit: the negated curve is non-decreasing
    fitted = sign * isotonic(sign * values, weights)[0]
    point = crossings(loads, sign * fitted, sign * first.level)[0]
    below, above = brackets(loads, isotonic(sign * reps, weights), sign * first.level)
    low, high = interval_of(below, confidence)[0], interval_of(above, confidence)[1]
    side = "inside" if np.isfinite(point) else "below" if point < 0 else "above"
    return ObjectiveCurve(first.objective, first.comparison, first.threshold, first.level, first.kind,
                          [float(x) for x in loads], [float(v) for v in values], [float(w) for w in weights],
                          [float(f) for f in fitted], _finite(point), side, low, high,
                          flat_range(loads, own, weights, first.threshold, sign), np.array([below, above]))


def curves_of(points: list[CurvePoint], confidence: float) -> list[ObjectiveCurve]:
    """One curve per objective, in the order the objectives first appear."""
    names = list(dict.fromkeys(p.objective for p in points))
    out = [objective_curve([p for p in points if p.objective == n], confidence) for n in names]
    return [c for c in out if c is not None]


@dataclass(frozen=True)
class CurveCapacity:
    """The lowest crossing over the objectives and the percentile interval of the replicates' minimum."""

    estimate: Optional[float]  # None: beyond the probed loads
    low: Optional[float]
    high: Optional[float]
    objective: str  # the objective whose crossing is lowest
    flat: str  # that objective's flat range in words ("" if none)
    crossing: Optional[float] = None  # that objective's crossing (at a flat limit the estimate is not it)
    flat_range: Optional[tuple[float, float]] = None  # the loads over which it is flat at its limit
    side: str = "inside"  # that objective's side: "inside" | "below" | "above" (ObjectiveCurve.side)


def capacity_of_curves(curves: list[ObjectiveCurve], confidence: float, unit: str) -> Optional[CurveCapacity]:
    if not curves:
        return None
    lowest = min(curves, key=lambda c: c.crossing if c.crossing is not None else
                 (-np.inf if c.side == "below" else np.inf))
    estimate = lowest.crossing
    reps = np.min(np.array([c.replicates for c in curves]), axis=0)  # [2, replicates]: each bracket's min
    low, high = interval_of(reps[0], confidence)[0], interval_of(reps[1], confidence)[1]
    if lowest.flat is not None:  # flat at its limit: the capacity is the range's edge at the confidence asked
        estimate = low if low is not None else estimate
    return CurveCapacity(estimate, low, high, lowest.objective, lowest.flat_text(unit), lowest.crossing,
                         lowest.flat, lowest.side)
