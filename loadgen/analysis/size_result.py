"""``loadgen size``'s figures: per objective of a pilot run, the samples (and requests, and seconds at the pilot's
request rate) needed to certify it and for ``compare`` to detect a regression; then the run to plan. The
arithmetic is sizing.py's; this module reads the pilot's summary.json and records (RunAnalysis) for it.

Each objective is sized by its kind: a percentile of one sample per request (TTFT, TPOT, E2E, a request's worst
gap: ``quantile``), a percentile of per-token samples (ITL, chunk gaps: ``token quantile``, with the design effect over
requests and over 20 time spans, the larger: ``planned_deff``), a rate (stalls per 1k tokens, goodput
per second: ``rate``, with the pilot's dispersion), a share (error rate, goodput ratio, prompt-aware
violations: ``proportion``) or a mean (``mean``). A statistic decided on what was seen (the largest sample; any
failure against a limit of 0) is ``observed``: no sample size changes it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis import intervals as iv
from loadgen.analysis import sizing
from loadgen.analysis.metrics import window_s
from loadgen.analysis.objective_samples import PHASE_OF
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.sessions import SessionFrames
from loadgen.core.vocabulary import METRICS, QUANTILES, TOKEN_METRICS

STALL_COUNT = {"max_per_1k_tokens": "count", "max_prefill_induced_per_1k_tokens": "prefill_induced"}


@dataclass(frozen=True)
class SizeOptions:
    confidence: float = 0.95
    power: float = 0.8
    regression_pct: float = 10.0  # the regression compare should detect, % of the statistic
    compare_threshold_pct: float = 0.0  # compare's --threshold it must clear
    assurance: float = sizing.ASSURANCE  # the pilot's estimate is taken at its one-sided bound at this level


@dataclass
class SizeRow:
    """One objective's sizing."""

    objective: str
    kind: str  # quantile | token quantile | rate | proportion | mean | observed
    value: float | None
    limit: float
    comparison: str
    pilot_samples: float
    unit: str  # what the samples are: requests, tokens, seconds, sessions, steps (agent steps)
    decision: str | None = None  # pass | fail: what the sized run would certify; None: cannot be decided
    samples: float | None = None  # samples needed, in ``unit``
    requests: int | None = None  # requests needed (tokens and seconds converted at the pilot's rates)
    duration_s: float | None = None  # seconds of measured load at the pilot's request rate
    reliable: bool = True
    deff: float = 1.0  # design effect (token quantiles) or dispersion (rates) the pilot measured
    regression_requests: int | None = None  # per run, for compare to detect the regression
    note: str = ""


@dataclass
class SizeResult:
    pilot: str  # the pilot's run directory
    options: SizeOptions
    request_rate_per_s: float  # the pilot's measured requests per second
    tokens_per_request: float
    rows: list[SizeRow] = field(default_factory=list)
    duration_s: float | None = None  # recommended load.duration_s (measured, after warm-up)
    requests: int | None = None  # recommended load.requests (arrivals, warm-up included)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"pilot": self.pilot, "options": asdict(self.options),
                "request_rate_per_s": self.request_rate_per_s, "tokens_per_request": self.tokens_per_request,
                "objectives": [asdict(r) for r in self.rows],
                "recommended": {"load.duration_s": self.duration_s, "load.requests": self.requests},
                "notes": self.notes}


class PilotFigures:
    """What the pilot measured, per objective kind (the summary for counts, the records for samples)."""

    def __init__(self, summary: dict[str, Any], run: RunAnalysis) -> None:
        self.summary, self.run = summary, run
        self.ok = run.measured.filter(pl.col("ok"))
        self.rate_per_s = float(summary["throughput"].get("requests_per_s") or 0.0)
        tokens = int(self.ok["output_tokens"].sum()) if self.ok.height else 0
        self.tokens = tokens
        self.tokens_per_request = tokens / self.ok.height if self.ok.height else 0.0
        counts = summary["requests"]
        self.warmup = int(counts.get("warmup") or 0)  # arrivals before the measured window (warm-up, transient)
        measured_sent = counts["sent"] - self.warmup
        self.arrivals_per_measured = measured_sent / counts["completed"] if counts["completed"] else 1.0
        self.sessions = SessionFrames(run.measured, window_s(run.measured)) if "session" in run.families else None
        self.calls_per = {"requests": 1.0, "tokens": 1 / self.tokens_per_request if tokens else math.inf}
        if self.sessions is not None and self.sessions.sessions.height:  # a session's (a step's) calls, on average
            calls = float(self.sessions.calls.height)
            self.calls_per.update(sessions=calls / self.sessions.sessions.height,
                                  steps=calls / max(self.sessions.steps.height, 1))

    def request_values(self, metric: str, stat: str, scope: str | None) -> np.ndarray:
        """One value per measured, successful request: the metric, or its worst gap (``max_per_request``)."""
        if stat == "max_per_request":
            g = self.run.gaps
            worst = g.group_by("i").agg((pl.col("gap_ns").max() / 1e6).alias("v"))
            return worst["v"].to_numpy().astype(float)
        basis = METRICS[metric].basis if metric in METRICS else "request"
        if basis in ("session", "step"):  # one value per completed session (agent step)
            frames = self.sessions
            if frames is None:
                return np.array([], dtype=float)
            frame = frames.sessions if basis == "session" else frames.steps
            done = frames.sessions.filter(pl.col("ok")).select("worker", "session")
            frame = frame.join(done, on=["worker", "session"], how="semi").filter(pl.col("ok"))
            return frame[metric].cast(pl.Float64).to_numpy()
        ok = self.ok
        if scope:
            low, high = (int(x) for x in scope.split()[0].split("-"))
            ok = ok.filter(pl.col("prompt_tokens").is_between(low, high))
        return ok[metric].cast(pl.Float64).to_numpy()

    def token_samples(self, metric: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Per-token samples: values, weights (tokens a gap covers) and clusters (request, time span)."""
        g = self.run.phase_gaps(PHASE_OF[metric]) if metric in PHASE_OF else self.run.gaps  # a phase's ITL
        gap_ms = g["gap_ns"].to_numpy() / 1e6
        tokens = g["tokens"].to_numpy().astype(float)
        one_token = metric == "chunk_gap_ms" or bool((tokens == 1).all())
        values, weights = (gap_ms, np.ones(len(gap_ms))) if one_token else (gap_ms / tokens, tokens)
        clusters = [g["i"].to_numpy(), iv.time_batches(g["t_ns"].to_numpy(), tokens)]
        return values, weights, clusters


def weighted_deff(below: np.ndarray, clusters: list[np.ndarray], w: np.ndarray) -> float:
    """Kish's design effect of the weighted share ``below``, the largest over the groupings (the verdict's own:
    ``intervals.weighted_design_effect``)."""
    return iv.weighted_design_effect(below, clusters, w)


def planned_deff(values: np.ndarray, weights: np.ndarray, clusters: list[np.ndarray], q: float, limit: float,
                 assurance: float = sizing.ASSURANCE) -> float:
    """The design effect to size per-token samples with: the verdict decides at the limit with the design
    effect of the share at or below the limit (objective_intervals.token_quantile), so the pilot's there, taken
    at its one-sided bound at ``assurance`` (a variance ratio over k requests that hold samples above the
    limit: × k / χ²(1 − a; k))."""
    at = limit
    deff = weighted_deff((values <= at).astype(float), clusters, weights)
    k = len(np.unique(clusters[0][values > at])) if clusters else 0
    if assurance <= 0.5 or k < 2:
        return deff
    return deff * k / float(iv.stats.chi2.ppf(1 - assurance, k))


def size_objective(o: dict[str, Any], pilot: PilotFigures, opts: SizeOptions) -> SizeRow:
    """One summary.json ``slo`` entry sized."""
    metric, stat = o.get("metric", ""), o.get("stat", "")
    row = SizeRow(o["objective"], "observed", o.get("value"), float(o["threshold"]), o.get("comparison", "<="),
                  float(o.get("samples") or 0), "requests")
    if o.get("basis") == "observed" or stat in ("max", "min") and metric != "error_rate" and \
            metric != "fluidity" or (metric == "error_rate" and row.limit == 0):
        row.note = "decided on what was seen (no interval): no sample size changes it"
        return row
    if metric == "fluidity":
        row.note = "no interval (decided on its value)"
        return row
    if stat in QUANTILES or stat == "max_per_request":
        return _quantile_row(row, o, pilot, opts)
    if metric == "stalls":
        return _stall_row(row, stat, pilot, opts)
    if stat == "mean":
        return _mean_row(row, o, opts)
    if metric == "goodput" and stat == "min_requests_per_s":
        return _goodput_rate_row(row, o, opts)
    if metric == "sessions" and stat == "min_jobs_per_hour":
        return _jobs_rate_row(row, pilot, opts)
    if metric == "sessions":
        row.unit = "sessions"
    return _proportion_row(row, o, opts)


def _quantile_row(row: SizeRow, o: dict[str, Any], pilot: PilotFigures, opts: SizeOptions) -> SizeRow:
    metric, stat = o["metric"], o["stat"]
    q = QUANTILES.get(stat, 0.99)  # a request's worst gap is judged at its p99
    if metric in TOKEN_METRICS and stat != "max_per_request":
        values, weights, clusters = pilot.token_samples(metric)
        row.kind, row.unit = "token quantile", "tokens"
        row.deff = planned_deff(values, weights, clusters, q, row.limit, opts.assurance)
    else:
        values = pilot.request_values(metric, stat, o.get("scope"))
        values = values[~np.isnan(values)]
        weights, row.kind = np.ones(len(values)), "quantile"
        row.unit = {"session": "sessions", "step": "steps"}.get(METRICS[metric].basis, "requests") \
            if metric in METRICS else "requests"
    n = float(weights.sum())
    row.pilot_samples = n
    if n == 0:
        row.note = "no samples in the pilot"
        return row
    p_at_limit = float((weights * (values <= row.limit)).sum()) / n
    _fill(row, sizing.quantile_needed(p_at_limit, n, q, opts.confidence, opts.power, row.deff,
                                              opts.assurance), pilot)
    unit_var = sizing.quantile_unit_variance(values, q, row.deff, None if row.unit == "requests" else weights)
    _regression(row, unit_var, pilot, opts)
    return row


def _stall_row(row: SizeRow, stat: str, pilot: PilotFigures, opts: SizeOptions) -> SizeRow:
    stalls = pilot.summary.get("stalls") or {}
    count = STALL_COUNT.get(stat, "count")
    disp = float(((stalls.get("sensitivity") or {}).get("dispersion") or {}).get(count, 1.0))
    events = float(stalls.get(count, 0))
    exposure_k = pilot.tokens / 1000
    row.kind, row.unit, row.deff, row.pilot_samples = "rate", "tokens", disp, float(pilot.tokens)
    need = sizing.rate_needed(events, exposure_k, row.limit, row.comparison, opts.confidence, opts.power, disp,
                             opts.assurance)
    _fill(row, sizing.Need(None if need.n is None else need.n * 1000, need.direction, need.reliable, need.note),
          pilot)
    rate = events / exposure_k if exposure_k else 0.0
    _regression(row, sizing.rate_unit_variance(rate, opts.regression_pct / 100, disp) / 1000, pilot, opts)
    return row


def _proportion_row(row: SizeRow, o: dict[str, Any], opts: SizeOptions) -> SizeRow:
    n = int(o.get("samples") or 0)
    k = round((row.value or 0.0) * n)
    row.kind = "proportion"
    need = sizing.proportion_needed(k, n, row.limit, row.comparison, opts.confidence, opts.power,
                                    opts.assurance)
    row.decision, row.samples, row.reliable, row.note = need.direction, need.n, need.reliable, need.note
    p = k / n if n else 0.0
    bad = p if row.comparison == "<=" else 1 - p  # the share a regression would grow
    row.regression_requests = _ceil(sizing.regression_n(sizing.proportion_unit_variance(bad),
                                                        _change(opts), opts.confidence, opts.power))
    return row


def _mean_row(row: SizeRow, o: dict[str, Any], opts: SizeOptions) -> SizeRow:
    row.kind = "mean"
    lo, hi, value = o.get("ci_low"), o.get("ci_high"), row.value
    if lo is None or hi is None or value is None:
        row.note = "no interval in the pilot"
        return row
    need = sizing.mean_needed(value, (hi - lo) / 2, int(row.pilot_samples), row.limit, row.comparison,
                              opts.confidence, opts.power, opts.assurance)
    row.decision, row.samples, row.reliable, row.note = need.direction, need.n, need.reliable, need.note
    if value:
        za = float(iv.stats.norm.ppf(1 - (1 - opts.confidence) / 2))
        cv2 = ((hi - lo) / 2 / za) ** 2 * row.pilot_samples / value**2
        row.regression_requests = _ceil(sizing.regression_n(cv2, _change(opts), opts.confidence, opts.power))
    return row


def _goodput_rate_row(row: SizeRow, o: dict[str, Any], opts: SizeOptions) -> SizeRow:
    rate = row.value or 0.0
    window_s = float(o.get("samples") or 0) / rate if rate else 0.0
    row.kind, row.unit, row.pilot_samples = "rate", "seconds", window_s
    need = sizing.rate_needed(rate * window_s, window_s, row.limit, row.comparison, opts.confidence, opts.power,
                             assurance=opts.assurance)
    row.decision, row.samples, row.reliable, row.note = need.direction, need.n, need.reliable, need.note
    row.duration_s = need.n
    row.requests = _ceil(None if need.n is None else need.n * rate)
    return row


def _jobs_rate_row(row: SizeRow, pilot: PilotFigures, opts: SizeOptions) -> SizeRow:
    """Jobs per hour: completed sessions over the measured window, a Poisson rate like goodput's."""
    frames = pilot.sessions
    if frames is None or not frames.window_s:
        row.note = "no sessions in the pilot"
        return row
    done, hours = float(frames.sessions["ok"].sum()), frames.window_s / 3600
    row.kind, row.unit, row.pilot_samples = "rate", "seconds", frames.window_s
    need = sizing.rate_needed(done, hours, row.limit, row.comparison, opts.confidence, opts.power,
                             assurance=opts.assurance)
    row.decision, row.reliable, row.note = need.direction, need.reliable, need.note
    row.samples = row.duration_s = None if need.n is None else need.n * 3600
    row.requests = _ceil(None if need.n is None else need.n * 3600 * pilot.rate_per_s)
    return row


def _fill(row: SizeRow, need: sizing.Need, pilot: PilotFigures) -> None:
    row.decision, row.samples, row.reliable, row.note = need.direction, need.n, need.reliable, need.note


def _change(opts: SizeOptions) -> float:
    return (opts.regression_pct - opts.compare_threshold_pct) / 100


def _regression(row: SizeRow, unit_variance: float, pilot: PilotFigures, opts: SizeOptions) -> None:
    n = sizing.regression_n(unit_variance, _change(opts), opts.confidence, opts.power)
    row.regression_requests = _ceil(None if n is None else _as_requests(n, row.unit, pilot))


def _as_requests(samples: float, unit: str, pilot: PilotFigures) -> float:
    """Samples in ``unit`` as requests: tokens at the pilot's tokens per request, sessions (steps) at its calls
    per session (step)."""
    return samples * pilot.calls_per.get(unit, 1.0)


def _ceil(x: float | None) -> int | None:
    return None if x is None or not math.isfinite(x) else math.ceil(x)


def size_run(pilot_dir: str, summary: dict[str, Any], run: RunAnalysis, opts: SizeOptions) -> SizeResult:
    """Every objective of the pilot sized, and the run that certifies them all: the longest duration needed."""
    pilot = PilotFigures(summary, run)
    result = SizeResult(pilot_dir, opts, pilot.rate_per_s, pilot.tokens_per_request)
    for o in summary.get("slo", []):
        row = size_objective(o, pilot, opts)
        if row.samples is not None and row.requests is None:
            row.requests = _ceil(_as_requests(row.samples, row.unit, pilot))
        if row.requests is not None and row.duration_s is None and pilot.rate_per_s:
            row.duration_s = row.requests / pilot.rate_per_s
        result.rows.append(row)
    sized = [r for r in result.rows if r.duration_s is not None and r.requests is not None]
    if sized:
        longest = max(sized, key=lambda r: r.duration_s or 0.0)
        result.duration_s = math.ceil(longest.duration_s or 0.0)
        needed = max(r.requests or 0 for r in sized)
        result.requests = math.ceil(needed * pilot.arrivals_per_measured) + pilot.warmup
    if any(not r.reliable for r in result.rows):
        result.notes.append("?: the pilot is too short to tell that objective's side (its estimate is within its "
                            "own noise of the limit): run a longer pilot (--pilot-duration), or let load.until: decided "
                            "find the length")
    return result
