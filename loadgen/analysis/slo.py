"""SLO objectives → per-objective results → the run's verdict (DESIGN §1 exit codes).

A percentile needs enough samples to exist: p_q needs at least ceil(1 / (1 − q)) (p99: 100, p99.9: 1000);
with fewer the objective is inconclusive, never passed. Verdict: ``inconclusive`` when the generator lagged
(p99 ``client_lag_ms`` above ``slo.max_generator_lag_ms``: its latencies include its own lateness; the queue
delay less the wait for a slot of ``load.max_in_flight`` the server held, analysis/generator_lag.py); else
``fail`` if any objective failed; else ``inconclusive`` if any lacked samples; else ``pass``. A measured
request cancelled after waiting longer than a latency limit has missed it (a censored value:
analysis/objective_samples.py), as a request that reasoned and never answered has.

No PASS without evidence: a scenario without ``slo.error_rate`` is judged by a default one, ``max: 0`` (as in
Locust, any failed request fails the run); and ``evidence`` (below) turns a would-be pass into ``inconclusive``
when the records cannot support it: no measured request completed, measured requests were cancelled (Ctrl-C,
the run's hard end), the run was interrupted or stopped early — and any verdict into ``inconclusive`` when the
records are known to be incomplete (the run did not finish: killed or crashed; the disk filled up) or loadgen
itself failed on some requests (``internal``: exit 4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import polars as pl

from loadgen.core.vocabulary import METRICS, SLO_METRICS, ObjectiveId
from loadgen.plan.slo_spec import ErrorRate, Slo
from loadgen.analysis import intervals as iv
from loadgen.analysis import objective_intervals as oi
from loadgen.analysis.metrics import QUANTILES, describe
from loadgen.analysis.objective_samples import ObjectiveSamples

DEFAULT_ERROR_RATE = ErrorRate(max=0.0)

EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3}


@dataclass
class Objective:
    id: ObjectiveId  # what is judged: (metric, stat), never a string parsed back
    threshold: float
    value: float | None
    samples: int
    passed: bool | None  # None: inconclusive (the interval straddles the limit, or too few samples)
    comparison: str = "<="
    note: str = ""
    ci_low: float | None = None  # the interval of the statistic (None: unbounded on that side, or none)
    ci_high: float | None = None
    confidence: float | None = None
    interval: str = ""  # the interval's method (analysis/intervals.py)
    basis: str = "point"  # "interval" | "observed" | "point": what decided it
    needed: float | None = None  # samples (tokens for a rate per 1k tokens) at which it would be decided

    @property
    def objective(self) -> str:
        return str(self.id)

    @property
    def decision(self) -> str:
        return "inconclusive" if self.passed is None else "pass" if self.passed else "fail"

    @property
    def margin(self) -> float | None:
        """Room left to the limit (positive) or by how much it is missed (negative), in the value's unit."""
        if self.value is None:
            return None
        return self.threshold - self.value if self.comparison == "<=" else self.value - self.threshold

    def as_dict(self) -> dict[str, Any]:
        """summary.json's form: the name, then its parts (``metric``, ``stat``, ``scope`` when it has one), its
        evidence (interval, margin, decision). An infinite value, bound or margin (a statistic that reached a
        miss counted as +inf) is null, as JSON has no infinity, and named in ``infinite``."""
        out: dict[str, Any] = {"objective": str(self.id), **{k: v for k, v in asdict(self).items() if k != "id"},
                               "metric": self.id.metric, "stat": self.id.stat, "decision": self.decision,
                               "margin": self.margin,
                               "margin_pct": None if self.margin is None or not self.threshold
                               else 100 * self.margin / self.threshold}
        infinite = [key for key in ("value", "ci_low", "ci_high", "margin", "margin_pct")
                    if isinstance(out[key], float) and not math.isfinite(out[key])]
        for key in infinite:
            out[key] = None
        if infinite:  # which nulls stand for ±inf (a miss counted as +inf), not for "none"
            out["infinite"] = infinite
        return out | ({"scope": self.id.scope} if self.id.scope else {})


def min_samples(stat: str) -> int:
    q = QUANTILES.get(stat)
    return 1 if q is None else math.ceil(round(1 / (1 - q), 6))


def decided(oid: ObjectiveId, value: float | None, limit: float, samples: int, judged: oi.Judged | None,
            mode: str, min_needed: int = 1, comparison: str = "<=") -> Objective:
    """One objective with its evidence. ``mode`` "interval": the interval decides (an observed statistic — the
    largest sample, a zero limit — decides on what was seen); "point": the value alone, given ``min_needed``
    samples."""
    iv = judged.interval if judged is not None else None
    o = Objective(oid, limit, value, samples, None, comparison,
                  ci_low=iv.low if iv else None, ci_high=iv.high if iv else None,
                  confidence=iv.confidence if iv else None, interval=iv.method if iv else "",
                  needed=judged.needed if judged is not None else None)
    if mode == "point" or judged is None:
        o.basis = "point"
        if value is None or samples < min_needed:
            o.note = f"needs >= {min_needed} samples"
        else:
            o.passed = value <= limit if comparison == "<=" else value >= limit
        return o
    o.basis = judged.basis
    o.passed = {"pass": True, "fail": False}.get(judged.decision)
    if o.passed is None:
        o.note = _undecided_note(o)
    return o


def _undecided_note(o: Objective) -> str:
    """Why the interval does not decide, and what would: the samples a missing end of a percentile's interval
    needs (exact), else the estimate of those that decide — never a count at or below the samples it has as if
    more of them were what is missing."""
    if o.value is None or o.samples == 0:
        return "no samples"
    side = f"{100 * (o.confidence or 0):g}% interval {_fmt(o.ci_low)}–{_fmt(o.ci_high)} straddles the limit"
    unit = "tokens" if o.id.metric == "stalls" else "sessions" if o.id.metric in ("sessions", "session_ms") \
        else "steps" if o.id.metric == "agent_step_ms" else "samples"
    end, n = _missing_end(o)
    if end and n is not None and n > o.samples:
        return side + f": needs >= {n} {unit} for its {end} end (has {o.samples})"
    if o.needed is not None and o.needed > o.samples:
        return side + f": needs >= {math.ceil(o.needed)} {unit} to decide (has {o.samples})"
    if end:
        return side + f": its {o.samples} {unit} count as fewer (they come in streams): needs more for its {end} end"
    gap = abs(o.value - o.threshold) / abs(o.threshold) if o.threshold else None
    where = "on the limit" if not gap else f"{gap:.1%} from the limit"
    return side + f": the estimate sits {where}; more {unit} than its {o.samples} narrow the interval"


def _missing_end(o: Objective) -> tuple[str, int | None]:
    """The end of the interval that would decide the way the estimate leans, when it is missing ("upper" or
    "lower", else ""), and for a percentile the fewest samples that give it one (analysis/intervals.py's ranks)."""
    assert o.value is not None
    below = o.value <= o.threshold
    end = "upper" if below == (o.comparison == "<=") else "lower"
    if (o.ci_high if end == "upper" else o.ci_low) is not None:
        return "", None
    q = QUANTILES.get(o.id.stat or "")
    return end, None if q is None or o.confidence is None else samples_for_end(q, o.confidence, end == "upper")


def samples_for_end(q: float, confidence: float, upper: bool) -> int | None:
    """The fewest independent samples whose order statistics bound the q-quantile from above (``upper``) or
    below at ``confidence`` (None: more than 2^24)."""
    def has(n: int) -> bool:
        return iv.order_ranks(n, q, confidence)[1 if upper else 0] is not None

    lo, hi = 1, 1 << 24
    if not has(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if has(mid) else (mid + 1, hi)
    return lo


def evaluate(slo: Slo, metrics: dict[str, dict[str, Any]], counts: dict[str, Any], good: int,
             total: int, goodput_per_s: float, samples: "ObjectiveSamples | None" = None,
             sessions: dict[str, Any] | None = None) -> list[Objective]:
    """The objectives on percentiles, the error rate, goodput and sessions; ``samples``: the run's samples, for
    their intervals (without them, every objective is decided on its value: ``slo.decision: point``);
    ``sessions``: summary.json's ``sessions`` figures (None: the run had no session)."""
    mode = slo.decision if samples is not None else "point"
    out: list[Objective] = []
    for metric in SLO_METRICS:
        thresholds = getattr(slo, metric)
        for stat, limit in thresholds.items() if thresholds else []:
            if metric not in metrics:  # a family the run does not have (no reasoning, no session)
                out.append(Objective(ObjectiveId(metric, stat), limit, None, 0, None,
                                     note=f"no samples: the run has no {METRICS[metric].family} figures"))
                continue
            out.append(_on_metric(ObjectiveId(metric, stat), metrics[metric], limit, samples, mode))
    attempts = counts["completed"] + counts["failed"]
    limit = (slo.error_rate or DEFAULT_ERROR_RATE).max
    value = counts["error_rate"] if attempts else None
    judged = None if samples is None else oi.observed(value, limit, "<=") if limit == 0 else \
        oi.proportion(counts["failed"], attempts, limit, "<=", slo.confidence)
    rate = decided(ObjectiveId("error_rate", "max"), value, limit, attempts, judged, mode)
    if slo.error_rate is None:
        rate.note = (rate.note + "; " if rate.note else "") + "default (no slo.error_rate): any failure fails"
    out.append(rate)
    if slo.goodput is not None:
        out += _goodput(slo, good, total, goodput_per_s, samples, mode)
    if slo.sessions is not None:
        out += _sessions(slo, sessions or {}, samples is not None, mode)
    return out


def _on_metric(oid: ObjectiveId, row: dict[str, Any], limit: float, samples: "ObjectiveSamples | None",
               mode: str) -> Objective:
    """An objective on a metric's statistic (``row``: the summary's metric row). Its samples may hold misses the
    row leaves out (``ObjectiveSamples.misses``: requests that reasoned and never answered, for
    ``ttft_answer_ms``; requests cancelled after waiting past the limit, for the metrics a wait bounds): then its
    value and sample count are over them too, and its note says so."""
    misses = samples.misses(oid.metric, limit) if samples is not None else 0
    value = samples.estimate(oid.metric, oid.stat, row[oid.stat], limit) if samples is not None else row[oid.stat]
    judged = samples.metric(oid.metric, oid.stat, value, limit) if samples is not None else None
    o = decided(oid, value, limit, row["count"] + misses, judged, mode, min_samples(oid.stat))
    cut = samples.censored(oid.metric, limit) if samples is not None else 0
    said = ([f"{misses - cut} request(s) reasoned and never answered"] if misses > cut else []) + \
        ([f"{cut} request(s) cancelled after waiting longer than the limit"] if cut else [])
    if said:
        o.note = (o.note + "; " if o.note else "") + " and ".join(said) + ": counted as misses (+inf)"
    return o


def _sessions(slo: Slo, figures: dict[str, Any], intervals: bool, mode: str) -> list[Objective]:
    """``slo.sessions``: the share of good sessions (exact binomial) and completed sessions per hour (Poisson
    rate over the measured window), both with ``needed`` in sessions."""
    s, out = slo.sessions, []
    assert s is not None
    n, good, done, window_s = (figures.get("count", 0), figures.get("good", 0), figures.get("completed", 0),
                               figures.get("window_s", 0.0))
    if s.min_attainment is not None:
        judged = oi.proportion(good, n, s.min_attainment, ">=", slo.confidence) if intervals else None
        out.append(decided(ObjectiveId("sessions", "min_attainment"), good / n if n else None, s.min_attainment, n,
                           judged, mode, 1, ">="))
    if s.min_jobs_per_hour is not None:
        judged = oi.rate(done, window_s, s.min_jobs_per_hour, ">=", slo.confidence, scale=3600.0) \
            if intervals and window_s else None
        if judged is not None and judged.needed is not None:  # seconds of exposure → sessions, as ``samples``
            judged = replace(judged, needed=judged.needed * n / window_s)
        out.append(decided(ObjectiveId("sessions", "min_jobs_per_hour"), figures.get("jobs_per_hour") if n else None,
                           s.min_jobs_per_hour, n, judged, mode, 1, ">="))
    return out


def _goodput(slo: Slo, good: int, total: int, goodput_per_s: float, samples: "ObjectiveSamples | None",
             mode: str) -> list[Objective]:
    g, out = slo.goodput, []
    assert g is not None
    if g.min_requests_per_s is not None:
        window_s = good / goodput_per_s if goodput_per_s else 0.0
        judged = None if samples is None or not window_s else \
            oi.rate(good, window_s, g.min_requests_per_s, ">=", slo.confidence)
        if judged is not None and judged.needed is not None:  # seconds of exposure → requests, as ``samples``
            judged = replace(judged, needed=judged.needed * total / window_s)
        out.append(decided(ObjectiveId("goodput", "min_requests_per_s"), goodput_per_s if total else None,
                           g.min_requests_per_s, total, judged, mode, 1, ">="))
    if g.min_ratio is not None:
        judged = None if samples is None else oi.proportion(good, total, g.min_ratio, ">=", slo.confidence)
        out.append(decided(ObjectiveId("goodput", "min_ratio"), good / total if total else None, g.min_ratio,
                           total, judged, mode, 1, ">="))
    return out


def verdict(objectives: list[Objective], lag_p99_ms: float | None, max_lag_ms: float) -> tuple[str, list[str]]:
    """The verdict and the reasons behind it (for the console and summary); ``lag_p99_ms``: p99 client_lag_ms,
    loadgen's own lateness (analysis/generator_lag.py)."""
    reasons = []
    if lag_p99_ms is not None and lag_p99_ms > max_lag_ms:
        reasons.append(f"the generator lagged: p99 client_lag_ms {lag_p99_ms:.1f} > {max_lag_ms:g} (loadgen sent "
                       "late while a slot of load.max_in_flight was free: lower the rate, or use more workers)")
        return "inconclusive", reasons
    failed = [o for o in objectives if o.passed is False]
    if failed:
        return "fail", [f"{o.objective} = {_fmt(o.value)} (limit {o.comparison} {o.threshold:g}{_ci(o)})"
                        for o in failed]
    unknown = [o for o in objectives if o.passed is None]
    if unknown:
        return "inconclusive", [f"{o.objective}: {o.samples} samples, {o.note}" for o in unknown]
    return "pass", []


def evidence(result: str, reasons: list[str], counts: dict[str, Any],
             run: dict[str, Any]) -> tuple[str, list[str]]:
    """The verdict after asking whether the records can carry it (``run``: run.json's finished/interrupted,
    a disk error, requests cut at the run's end)."""
    incomplete = []
    if run.get("finished") is False:
        incomplete.append("the run did not finish (run.json: finished false — loadgen was killed or crashed); "
                          "these are the records up to its last flush")
    if run.get("disk_error"):
        incomplete.append(f"records could not be written: {run['disk_error']}")
    internal = (counts.get("errors_by_kind") or {}).get("internal", 0)
    if internal:
        incomplete.append(f"{internal} measured request(s) failed on a bug in loadgen (error_kind internal; exit "
                          "4): please report it with their error_message")
    if incomplete:
        return "inconclusive", incomplete + reasons
    weak = []
    if run.get("stopped_early"):
        weak.append(str(run["stopped_early"]))
    if run.get("interrupted"):
        weak.append("the run was interrupted before its plan ended")
    if counts["cancelled"]:
        weak.append(f"{counts['cancelled']} measured request(s) were cancelled before they ended (their latency "
                    "is unknown; a wait past a latency limit counts as a miss of it)")
    if counts["completed"] == 0:
        weak.append("no measured request completed")
    if result == "pass" and weak:
        return "inconclusive", weak
    return result, reasons + weak


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _ci(o: Objective) -> str:
    if o.basis != "interval" or o.confidence is None:
        return ""
    return f"; {100 * o.confidence:g}% interval {_fmt(o.ci_low)}–{_fmt(o.ci_high)}"
