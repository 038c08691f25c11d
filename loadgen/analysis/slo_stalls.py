"""The objectives that read the stall analysis or per-request limits: each request's worst gap, the stall rates
(with their sensitivity to the stall threshold), fluidity, and prompt-aware TTFT."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from loadgen.analysis import objective_intervals as oi
from loadgen.analysis.metrics import describe
from loadgen.analysis.objective_samples import ObjectiveSamples, with_misses_estimate
from loadgen.analysis.slo import Objective, decided, min_samples
from loadgen.core.vocabulary import ObjectiveId
from loadgen.plan.slo_spec import Slo

COUNT_OF = {"max_per_1k_tokens": ("count", "per_1k_tokens"),
            "max_prefill_induced_per_1k_tokens": ("prefill_induced", "prefill_induced_per_1k_tokens")}


def stall_objectives(slo: Slo, measured: pl.DataFrame, gaps: pl.DataFrame | pl.LazyFrame,
                     stalls: dict[str, Any], samples: ObjectiveSamples | None = None) -> list[Objective]:
    """Objectives that see stalls: worst gap per request, stall rates, fluidity, prompt-aware TTFT."""
    mode = slo.decision if samples is not None else "point"
    ok = measured.filter(pl.col("ok"))
    out = _ttft_prompt_aware(slo, ok, samples, mode)
    if slo.itl_ms is not None and slo.itl_ms.max_per_request is not None:
        worst = gaps.lazy().join(ok.select("worker", "seq").lazy(), on=["worker", "seq"], how="semi").group_by(
            "worker", "seq").agg(pl.col("chunk_gap_ms").max()).sort("worker", "seq").collect()["chunk_gap_ms"]
        stats = describe(worst)
        limit = slo.itl_ms.max_per_request
        judged = samples.requests(worst, "p99", limit) if samples is not None else None
        out.append(decided(ObjectiveId("itl_ms", "max_per_request"), stats["p99"], limit, stats["count"], judged,
                           mode, min_samples("p99")))
    tokens = int(ok["output_tokens"].sum()) if ok.height else 0
    for key, (count, rate) in COUNT_OF.items():
        limit = getattr(slo.stalls, key)
        if limit is not None:
            out.append(_stall_rate(ObjectiveId("stalls", key), stalls, count, stalls[rate], limit, tokens,
                                   slo.confidence, mode))
    if slo.fluidity is not None and slo.fluidity.min is not None:
        f = stalls.get("fluidity", {})
        index, n = f.get("index"), f.get("tokens", 0)
        o = decided(ObjectiveId("fluidity", "min"), index, slo.fluidity.min, n, None, "point", 1, ">=")
        o.note = o.note or "no interval: decided on its value (tokens on schedule are not independent samples)"
        out.append(o)
    return out


def _stall_rate(oid: ObjectiveId, stalls: dict[str, Any], count: str, value: float, limit: float, tokens: int,
                confidence: float, mode: str) -> Objective:
    """A stall rate's objective: a Poisson interval (over-dispersion measured), decided at the threshold and at
    its ±5 % edges; where the edges decide otherwise, the verdict depends on near-threshold gaps: inconclusive."""
    sens = stalls.get("sensitivity") or {}
    disp = (sens.get("dispersion") or {}).get(count, 1.0)
    events = int(stalls.get(count, round(value * tokens / 1000)))
    judged = oi.rate(events, tokens, limit, "<=", confidence, disp, 1000)
    o = decided(oid, value if tokens else None, limit, tokens, judged, mode, 1000)
    if not sens or not tokens:
        return o
    if mode == "interval":
        edges = {edge: oi.rate(int(sens[edge][count]), tokens, limit, "<=", confidence, disp, 1000).decision
                 for edge in ("low_edge", "high_edge")}
        call = judged.decision
    else:  # point verdicts say so too, and keep their call
        edges = {edge: "pass" if 1000 * sens[edge][count] / tokens <= limit else "fail"
                 for edge in ("low_edge", "high_edge")}
        call = o.decision
    if len({call, *edges.values()}) > 1:
        band, near = sens["band"], sens["near_threshold"][count]
        if mode == "interval":
            o.passed, o.needed = None, None
        o.note = (f"depends on the stall threshold: {near} stall(s) within ±{100 * band:g}% of it; at "
                  f"{1 - band:g}× the threshold {1000 * sens['low_edge'][count] / tokens:.3g} per 1k tokens "
                  f"({edges['low_edge']}), at {1 + band:g}× {1000 * sens['high_edge'][count] / tokens:.3g} "
                  f"({edges['high_edge']})")
    return o


def _ttft_prompt_aware(slo: Slo, ok: pl.DataFrame, samples: ObjectiveSamples | None, mode: str) -> list[Objective]:
    """The scoped TTFT objectives: the share over each request's own limit, and each prompt-length bucket's
    statistics. A cancelled request that waited past its limit has missed it (``ObjectiveSamples.censored``, as
    for the unscoped objectives): over its own limit, and +inf in its bucket."""
    t = slo.ttft_ms
    if t is None:
        return []
    out = []
    if t.base is not None and t.per_prompt_token is not None:
        out.append(_prompt_aware_share(slo, ok, samples, mode))
    low = 0
    for bucket in t.buckets or []:
        in_bucket = (pl.col("prompt_tokens") > low) & (pl.col("prompt_tokens") <= bucket.max_prompt_tokens)
        sub = ok.filter(in_bucket)
        stats = describe(sub["ttft_ms"])
        for stat, limit in bucket.items():
            scope = f"{low + 1}-{bucket.max_prompt_tokens} prompt tokens"
            cut = samples.censored("ttft_ms", limit, in_bucket) if samples is not None else 0
            value = with_misses_estimate(pl.concat([sub["ttft_ms"].cast(pl.Float64), pl.Series([math.inf] * cut)]),
                                         stat) if cut else stats[stat]
            judged = samples.requests(sub["ttft_ms"], stat, limit, cut) if samples is not None else None
            o = decided(ObjectiveId("ttft_ms", stat, scope), value, limit, stats["count"] + cut, judged, mode,
                        min_samples(stat))
            out.append(_with_cut_note(o, cut, "counted as misses (+inf)"))
        low = bucket.max_prompt_tokens
    return out


def _prompt_aware_share(slo: Slo, ok: pl.DataFrame, samples: ObjectiveSamples | None, mode: str) -> Objective:
    """The share of requests whose TTFT exceeded ``base + per_prompt_token × their prompt tokens``."""
    t = slo.ttft_ms
    assert t is not None and t.base is not None and t.per_prompt_token is not None
    limit = t.base + t.per_prompt_token * pl.col("prompt_tokens")
    cut = samples.censored("ttft_ms", limit) if samples is not None else 0
    over = (int(ok.select((pl.col("ttft_ms") > limit).sum()).item()) if ok.height else 0) + cut
    n = ok.height + cut
    needed = -(-1 // t.max_violation_ratio) if t.max_violation_ratio else 1
    judged = oi.proportion(over, n, t.max_violation_ratio, "<=", slo.confidence) if samples else None
    o = decided(ObjectiveId("ttft_ms", "prompt_aware"), over / n if n else None, t.max_violation_ratio, n, judged,
                mode, int(needed))
    o.note = o.note or f"share of requests over {t.base:g} + {t.per_prompt_token:g} ms/prompt token"
    return _with_cut_note(o, cut, "counted over their limit")


def _with_cut_note(o: Objective, cut: int, counted: str) -> Objective:
    """``o`` with its note counting the cancelled requests that waited past their limit (as slo._on_metric's)."""
    if cut:
        said = f"{cut} request(s) cancelled after waiting longer than the limit: {counted}"
        o.note = (o.note + "; " if o.note else "") + said
    return o
