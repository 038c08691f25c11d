"""``loadgen compare BASE NEW``: per metric, did NEW regress beyond a threshold? Decided on a bootstrap
confidence interval of the change, computed from both runs' raw records.

Theory of operation
-------------------
Samples within one request are not independent (a stall hits every token after it; one slow prefill sets one
TTFT), so the bootstrap resamples *requests*: a Poisson bootstrap gives each request a weight ~ Poisson(1) per
replicate, and every statistic is computed with those weights — a weighted quantile over the request's values
(TTFT, TPOT, E2E) or over its tokens (ITL: each token carries its request's weight), or a weighted ratio
(error rate, tokens/s, stalls per 1k tokens). Replicate i of BASE is paired with replicate i of NEW to give a
distribution of the change: relative (NEW/BASE − 1) for latencies and throughput, absolute for the error rate
and the stall rate (rare events: a relative change of a near-zero rate says little). When both runs follow one
seeded plan (same scenario and seed) the bootstrap is *paired*: a request's weight follows its plan sequence
number into both runs, so the interval measures the server's change, not the luck of which requests were drawn.
An agentic session's latency (``session_ms``) is one value per session, weighted by its first call's weight: one
Poisson(1) weight per session, paired as that call is. Time to first answer token, the per-phase TPOT (reasoning,
answer), the reasoning share (Σ reasoning / Σ output tokens of the successful requests, a weighted ratio like
tokens/s; relative change, a rise = more of the output spent thinking) and session latency are compared by
default when both runs have them (``FAMILY_METRICS``).

A metric *regressed* when the whole confidence interval of its worsening lies above the threshold (we are
confident it got worse by more than the threshold); *improved* when it lies below −threshold; *unchanged* when
it lies within ±threshold; otherwise *uncertain* (too noisy to tell at this sample size). Only ``regressed``
fails the comparison (exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis import metrics as m
from loadgen.core.vocabulary import QUANTILES, ObjectiveId
from loadgen.analysis.run_analysis import RunAnalysis, itl_per_token
from loadgen.analysis.objective_samples import CENSORED, UNANSWERED_MISS, censored_wait_ms
from loadgen.analysis.reasoning import never_answered
from loadgen.analysis.sessions import SESSION_KEY, session_calls, session_table, step_table


@dataclass(frozen=True)
class MetricSpec:
    name: str
    better: str  # "lower" | "higher"
    change: str  # "relative" | "absolute"
    unit: str


METRICS: dict[str, MetricSpec] = {s.name: s for s in (
    MetricSpec("ttft_ms.p50", "lower", "relative", "ms"), MetricSpec("ttft_ms.p99", "lower", "relative", "ms"),
    MetricSpec("itl_ms.p50", "lower", "relative", "ms"), MetricSpec("itl_ms.p99", "lower", "relative", "ms"),
    MetricSpec("tpot_ms.p50", "lower", "relative", "ms"), MetricSpec("e2e_ms.p50", "lower", "relative", "ms"),
    MetricSpec("e2e_ms.p99", "lower", "relative", "ms"),
    MetricSpec("ttft_answer_ms.p50", "lower", "relative", "ms"),
    MetricSpec("ttft_answer_ms.p99", "lower", "relative", "ms"),
    MetricSpec("tpot_reasoning_ms.p50", "lower", "relative", "ms"),
    MetricSpec("tpot_answer_ms.p50", "lower", "relative", "ms"),
    MetricSpec("reasoning_share", "lower", "relative", "share"),
    MetricSpec("session_ms.p50", "lower", "relative", "ms"), MetricSpec("session_ms.p90", "lower", "relative", "ms"),
    MetricSpec("output_tokens_per_s", "higher", "relative", "tokens/s"),
    MetricSpec("error_rate", "lower", "absolute", "fraction"),
    MetricSpec("stalls_per_1k_tokens", "lower", "absolute", "per 1k tokens"),
    MetricSpec("prefill_stalls_per_1k_tokens", "lower", "absolute", "per 1k tokens"),
)}
DEFAULT_METRICS = ("ttft_ms.p50", "ttft_ms.p99", "itl_ms.p50", "itl_ms.p99", "tpot_ms.p50", "e2e_ms.p99",
                   "output_tokens_per_s", "error_rate", "stalls_per_1k_tokens", "prefill_stalls_per_1k_tokens")
# compared by default when both runs have them: RunSamples' field (None in a run without it) → its statistics
FAMILY_METRICS = {"ttft_answer_ms": ("ttft_answer_ms.p50", "ttft_answer_ms.p99"),
                  "tpot_reasoning_ms": ("tpot_reasoning_ms.p50",), "tpot_answer_ms": ("tpot_answer_ms.p50",),
                  "reasoning_tokens": ("reasoning_share",), "session_ms": ("session_ms.p50", "session_ms.p90")}
BATCH_CELLS = 20_000_000  # replicates × samples per numpy batch (≈160 MB of float64)


@dataclass
class RunSamples:
    """One run's measured requests as arrays, index-aligned: request i's values and its tokens' ITL."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    ok: np.ndarray  # bool per request (measured: warm-up excluded)
    failed: np.ndarray  # bool: ended in an error other than "cancelled"
    counted: np.ndarray  # bool: not cancelled (the error rate's denominator, as in summary.json)
    output_tokens: np.ndarray
    stalls: np.ndarray  # stalls per request
    itl_ms: np.ndarray  # per token
    itl_request: np.ndarray  # index of each token's request
    window_s: float
    seq: np.ndarray  # each request's plan sequence number (pairs requests of two runs of one plan)
    figures: dict[str, float | None] = field(default_factory=dict)  # the summary's values (point_figures)
    prefill_stalls: np.ndarray | None = None  # prefill-induced stalls per request (None: none counted)
    ttft_answer_ms: np.ndarray | None = None  # per request (None: no request reasoned)
    session_ms: np.ndarray | None = None  # per session, NaN where a call failed (None: no session)
    session_owner: np.ndarray | None = None  # per session: its first root call's request, whose weight it takes
    tpot_reasoning_ms: np.ndarray | None = None  # per request (None: no request reasoned), as ttft_answer_ms
    tpot_answer_ms: np.ndarray | None = None
    reasoning_tokens: np.ndarray | None = None  # per request, 0 where none (the reasoning share's numerator)
    # per metric of objective_samples.CENSORED, per request: what its unknown value is at least (a cancelled
    # request's censored wait; +inf for ttft_answer_ms of a stream that reasoned and never answered), NaN: known
    censored_ms: dict[str, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return len(self.ok)


def run_samples(requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame, stalls: pl.DataFrame,
                run: RunAnalysis | None = None, figures: dict[str, float | None] | None = None,
                not_finished: list[int] | None = None) -> RunSamples:
    """The measured requests' samples; ``run``: the records' analysis, when the caller has it (its gaps are
    not computed again); ``figures``: the run's own point values (``point_figures`` of its summary);
    ``not_finished``: the sessions the run's end cut short (run.json ``sessions_not_finished``), left out of the
    session sample as summary.json's session figures leave them out."""
    run = run or RunAnalysis(requests, chunks)
    req = run.measured.with_row_index("i")
    # each gap's request row ``i`` (among every request) to its row among the measured ones
    position = (~run.req["warmup"]).cast(pl.Int64).cum_sum() - 1
    owner = position.gather(run.gaps["i"])
    tokens = run.gaps["tokens"].cast(pl.Int64)
    itl = itl_per_token(run.gaps)
    owners = owner if bool((tokens == 1).all()) else pl.select(owner.repeat_by(tokens).explode()).to_series()
    per_req = (stalls.group_by("worker", "seq").len() if stalls.height
               else pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64, "len": pl.UInt32}))
    n_stalls = req.join(per_req, on=["worker", "seq"], how="left")["len"].fill_null(0)
    induced = (stalls.filter(pl.col("prefill_induced")).group_by("worker", "seq").len()
               if "prefill_induced" in stalls.columns else per_req.head(0))
    n_induced = req.join(induced, on=["worker", "seq"], how="left")["len"].fill_null(0)

    def col(name: str) -> np.ndarray:
        return req[name].cast(pl.Float64).fill_null(np.nan).to_numpy()
    cancelled = (req["error_kind"] == "cancelled").fill_null(False)
    sessions, owner_of = session_samples(req, not_finished) if "session" in run.families else (None, None)
    reasoned = "reasoning" in run.families
    return RunSamples(col("ttft_ms"), col("tpot_ms"), col("e2e_ms"), req["ok"].to_numpy(),
                      (~req["ok"] & ~cancelled).to_numpy(), (~cancelled).to_numpy(),
                      req["output_tokens"].fill_null(0).to_numpy().astype(float), n_stalls.to_numpy().astype(float),
                      itl.to_numpy(), owners.to_numpy().astype(np.int64), m.window_s(req), req["seq"].to_numpy(),
                      dict(figures or {}), n_induced.to_numpy().astype(float),
                      col("ttft_answer_ms") if reasoned else None, sessions, owner_of,
                      col("tpot_reasoning_ms") if reasoned else None, col("tpot_answer_ms") if reasoned else None,
                      req["reasoning_tokens"].fill_null(0).to_numpy().astype(float) if reasoned else None,
                      censored_waits(req))


def censored_waits(req: pl.DataFrame) -> dict[str, np.ndarray]:
    """``RunSamples.censored_ms`` of the measured requests ``req``, by objective_samples' own definitions (the
    misses every step's objectives count: a wait past the limit, a stream never answered)."""
    out = {k: req.select(censored_wait_ms(k, req.columns).alias("w"))["w"].cast(pl.Float64).fill_null(np.nan)
           .to_numpy() for k in CENSORED}
    unanswered = (never_answered(req) & req["ok"]).to_numpy()
    out[UNANSWERED_MISS] = np.where(unanswered, np.inf, out[UNANSWERED_MISS])
    return out


def session_samples(req: pl.DataFrame, not_finished: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per measured session (``req``: the measured requests with their row ``i``) but those the run's end cut
    short (``not_finished``: summary.json's session figures leave them out too): its session_ms (NaN where a
    call failed) and the row of its first call, whose bootstrap weight the session takes — one Poisson weight
    per session, paired across runs of one plan as that call's sequence number is."""
    calls = session_calls(req).filter(~pl.col("session").is_in(not_finished or []))
    table = session_table(calls, step_table(calls))
    first = (calls.sort("t_intended_ns").group_by(SESSION_KEY).agg(owner=pl.col("i").first()))
    joined = table.join(first, on=SESSION_KEY, how="left", maintain_order="left")
    values = joined.select(pl.when(pl.col("ok")).then(pl.col("session_ms"))).to_series()
    return values.cast(pl.Float64).fill_null(np.nan).to_numpy(), joined["owner"].to_numpy().astype(np.int64)


def point_figures(summary: dict[str, Any]) -> dict[str, float | None]:
    """Each comparable metric's value as the run's summary states it (one value per statistic: compare's point
    estimate is the summary's figure, its interval the bootstrap's)."""
    out: dict[str, float | None] = {}
    for name in METRICS:
        if "." in name:
            oid = ObjectiveId.parse(name)
            out[name] = (summary.get("metrics", {}).get(oid.metric) or {}).get(oid.stat)
    out["output_tokens_per_s"] = (summary.get("throughput") or {}).get("output_tokens_per_s")
    out["error_rate"] = (summary.get("requests") or {}).get("error_rate")
    out["reasoning_share"] = (summary.get("reasoning") or {}).get("reasoning_share")
    out["stalls_per_1k_tokens"] = (summary.get("stalls") or {}).get("per_1k_tokens")
    out["prefill_stalls_per_1k_tokens"] = (summary.get("stalls") or {}).get("prefill_induced_per_1k_tokens")
    return out


def pool_samples(runs: list[RunSamples]) -> RunSamples:
    """Several runs' requests as one sample (a repeat's runs pooled): arrays joined, each run's token owners
    shifted to its requests' place, the windows added (throughput = all tokens / all measured seconds), plan
    sequence numbers made unique per run; no stated figures (the pooled statistic is computed)."""
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(r, name) for r in runs])
    offsets = np.cumsum([0] + [r.n for r in runs[:-1]])

    def optional(name: str, shift: bool = False) -> np.ndarray | None:
        parts = [getattr(r, name) for r in runs]
        if any(p is None for p in parts):
            return None
        return np.concatenate([p + o for p, o in zip(parts, offsets)] if shift else parts)
    seq_span = max((int(r.seq.max()) + 1 for r in runs if r.n), default=0)
    return RunSamples(cat("ttft_ms"), cat("tpot_ms"), cat("e2e_ms"), cat("ok"), cat("failed"), cat("counted"),
                      cat("output_tokens"), cat("stalls"), cat("itl_ms"),
                      np.concatenate([r.itl_request + o for r, o in zip(runs, offsets)]),
                      float(sum(r.window_s for r in runs)),
                      np.concatenate([r.seq + i * seq_span for i, r in enumerate(runs)]), {},
                      np.concatenate([r.prefill_stalls if r.prefill_stalls is not None else np.zeros(r.n)
                                      for r in runs]),
                      optional("ttft_answer_ms"), optional("session_ms"), optional("session_owner", shift=True),
                      optional("tpot_reasoning_ms"), optional("tpot_answer_ms"), optional("reasoning_tokens"),
                      {k: np.concatenate([r.censored_ms[k] for r in runs]) for k in runs[0].censored_ms}
                      if all(r.censored_ms is not None for r in runs) else None)  # type: ignore[union-attr]


# ---- weighted statistics: w has shape (replicates, requests) --------------------------------------------
def weighted_quantile(values: np.ndarray, owner: np.ndarray, w: np.ndarray, q: float) -> np.ndarray:
    """Per replicate, the smallest value whose cumulative weight reaches q of the total (owner[j] = the request
    whose weight value j carries). NaN values are ignored; NaN when a replicate has no weight."""
    keep = ~np.isnan(values)
    values, owner = values[keep], owner[keep]
    order = np.argsort(values, kind="stable")
    values, owner = values[order], owner[order]
    out = np.full(w.shape[0], np.nan)
    if len(values) == 0:
        return out
    step = max(1, BATCH_CELLS // len(values))
    for lo in range(0, w.shape[0], step):
        cw = np.cumsum(w[lo:lo + step, owner], axis=1)
        total = cw[:, -1]
        idx = np.array([np.searchsorted(row, q * t, side="left") for row, t in zip(cw, total)])
        out[lo:lo + step] = np.where(total > 0, values[np.minimum(idx, len(values) - 1)], np.nan)
    return out


def statistic(name: str, s: RunSamples, w: np.ndarray) -> np.ndarray:
    """The metric ``name`` of run ``s`` under each replicate's request weights."""
    ok = s.ok.astype(float)
    if "." in name:
        oid = ObjectiveId.parse(name)
        metric, stat = oid.metric, oid.stat
        if metric == "itl_ms":
            return weighted_quantile(s.itl_ms, s.itl_request, w, QUANTILES[stat])
        if metric == "session_ms":
            if s.session_ms is None or s.session_owner is None:
                return np.full(w.shape[0], np.nan)
            return weighted_quantile(s.session_ms, s.session_owner, w, QUANTILES[stat])
        if getattr(s, metric) is None:  # a family this run does not have
            return np.full(w.shape[0], np.nan)
        values = np.where(s.ok, getattr(s, metric), np.nan)
        return weighted_quantile(values, np.arange(s.n), w, QUANTILES[stat])
    with np.errstate(invalid="ignore", divide="ignore"):
        if name == "output_tokens_per_s":
            return (w @ (s.output_tokens * ok)) / s.window_s
        if name == "reasoning_share":
            if s.reasoning_tokens is None:
                return np.full(w.shape[0], np.nan)
            return (w @ (s.reasoning_tokens * ok)) / (w @ (s.output_tokens * ok))
        if name == "error_rate":
            return (w @ s.failed.astype(float)) / (w @ s.counted.astype(float))
        if name in ("stalls_per_1k_tokens", "prefill_stalls_per_1k_tokens"):
            counted = s.stalls if name == "stalls_per_1k_tokens" else s.prefill_stalls
            counts = np.zeros(s.n) if counted is None else counted
            return (w @ counts) / ((w @ (s.output_tokens * ok)) / 1000)
    raise KeyError(name)


def _change(spec: MetricSpec, base: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The worsening, positive = worse: relative (fraction) or absolute."""
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = new / base - 1 if spec.change == "relative" else new - base
    return delta if spec.better == "lower" else -delta


@dataclass
class MetricComparison:
    metric: str
    base: float | None
    new: float | None
    worsening: float | None  # point estimate; relative (fraction) or absolute, positive = worse
    ci_low: float | None
    ci_high: float | None
    threshold: float
    status: str  # regressed | improved | unchanged | uncertain | no data
    spec: MetricSpec

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "base": self.base, "new": self.new, "worsening": self.worsening,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "threshold": self.threshold, "status": self.status,
                "better": self.spec.better, "change": self.spec.change, "unit": self.spec.unit}


def status_of(ci_low: float, ci_high: float, threshold: float) -> str:
    if ci_low > threshold:
        return "regressed"
    if ci_high < -threshold:
        return "improved"
    if -threshold <= ci_low and ci_high <= threshold:
        return "unchanged"
    return "uncertain"


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _point(name: str, s: RunSamples) -> float:
    """The run's value of ``name``: its summary's figure where it has one, else computed from the samples."""
    stated = s.figures.get(name)
    return float(stated) if stated is not None else float(statistic(name, s, np.ones((1, s.n)))[0])


def compare_metric(name: str, base: RunSamples, new: RunSamples, w_base: np.ndarray, w_new: np.ndarray,
                   threshold: float, confidence: float) -> MetricComparison:
    spec = METRICS[name]
    point_b, point_n = _point(name, base), _point(name, new)
    change = _change(spec, statistic(name, base, w_base), statistic(name, new, w_new))
    change = change[np.isfinite(change)]
    point = float(_change(spec, np.array([point_b]), np.array([point_n]))[0])
    if len(change) < 0.9 * len(w_base) or not np.isfinite(point):
        return MetricComparison(name, _finite(point_b), _finite(point_n), _finite(point), None, None, threshold,
                                "no data", spec)
    alpha = (1 - confidence) / 2
    lo, hi = (float(x) for x in np.quantile(change, [alpha, 1 - alpha]))
    return MetricComparison(name, float(point_b), float(point_n), point, lo, hi, threshold,
                            status_of(lo, hi, threshold), spec)


def poisson_weights(base: RunSamples, new: RunSamples, replicates: int, paired: bool,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate, a Poisson(1) weight per request. Paired (two runs of one seeded plan): one weight per plan
    sequence number, given to that request in both runs, so the change measures the server and not the draw of
    requests; otherwise independent weights per run."""
    if not paired:
        return (rng.poisson(1.0, size=(replicates, base.n)).astype(np.float64),
                rng.poisson(1.0, size=(replicates, new.n)).astype(np.float64))
    seqs, index = np.unique(np.concatenate([base.seq, new.seq]), return_inverse=True)
    w = rng.poisson(1.0, size=(replicates, len(seqs))).astype(np.float64)
    return w[:, index[:base.n]], w[:, index[base.n:]]


def compare(base: RunSamples, new: RunSamples, metrics: tuple[str, ...] = DEFAULT_METRICS,
            thresholds: dict[str, float] | None = None, confidence: float = 0.95, replicates: int = 1000,
            seed: int = 0, paired: bool = False) -> list[MetricComparison]:
    """Compare every metric (the defaults, and the reasoning and session figures where both runs have them:
    ``FAMILY_METRICS``). ``thresholds``: "relative" (a fraction, e.g. 0.10), and per absolute metric
    ("error_rate": a fraction, "stalls_per_1k_tokens" and "prefill_stalls_per_1k_tokens": stalls per 1k
    tokens; run/comparison.py derives these from the scenario's own limits, analysis/compare_basis.py)."""
    limits = {"relative": 0.10, "error_rate": 0.01, "stalls_per_1k_tokens": 0.5, "prefill_stalls_per_1k_tokens": 0.5,
              **(thresholds or {})}
    if metrics == DEFAULT_METRICS:
        metrics = metrics + tuple(n for family, names in FAMILY_METRICS.items()
                                  if getattr(base, family) is not None and getattr(new, family) is not None
                                  for n in names)
    rng = np.random.default_rng(seed)
    w_base, w_new = poisson_weights(base, new, replicates, paired, rng)
    out = []
    for name in metrics:
        spec = METRICS[name]
        limit = limits["relative"] if spec.change == "relative" else limits[name]
        out.append(compare_metric(name, base, new, w_base, w_new, limit, confidence))
    return out
