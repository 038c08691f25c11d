"""SLO objectives → per-objective results → the run's verdict (DESIGN §1 exit codes).

A percentile needs enough samples to exist: p_q needs at least ceil(1 / (1 − q)) (p99: 100, p99.9: 1000);
with fewer the objective is inconclusive, never passed. Verdict: ``inconclusive`` when the generator lagged
(p99 ``queue_delay_ms`` above ``slo.max_generator_lag_ms``: its latencies include its own lateness); else
``fail`` if any objective failed; else ``inconclusive`` if any lacked samples; else ``pass``.

No PASS without evidence: a scenario without ``slo.error_rate`` is judged by a default one, ``max: 0`` (as in
Locust, any failed request fails the run); and ``evidence`` (below) turns a would-be pass into ``inconclusive``
when the records cannot support it: no measured request completed, measured requests were cancelled (Ctrl-C,
the run's hard end), the run was interrupted or stopped early — and any verdict into ``inconclusive`` when the
records are known to be incomplete (the run did not finish: killed or crashed; the disk filled up) or loadgen
itself failed on some requests (``internal``: exit 4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import polars as pl

from loadgen.core.vocabulary import SLO_METRICS, ObjectiveId
from loadgen.plan.slo_spec import ErrorRate, Slo
from loadgen.analysis.metrics import QUANTILES, describe

DEFAULT_ERROR_RATE = ErrorRate(max=0.0)

EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3}


@dataclass
class Objective:
    id: ObjectiveId  # what is judged: (metric, stat), never a string parsed back
    threshold: float
    value: float | None
    samples: int
    passed: bool | None  # None: inconclusive (too few samples)
    comparison: str = "<="
    note: str = ""

    @property
    def objective(self) -> str:
        return str(self.id)

    def as_dict(self) -> dict[str, Any]:
        """summary.json's form: the name, then its parts (``metric``, ``stat``, ``scope`` when it has one)."""
        out: dict[str, Any] = {"objective": str(self.id), **{k: v for k, v in asdict(self).items() if k != "id"},
                               "metric": self.id.metric, "stat": self.id.stat}
        return out | ({"scope": self.id.scope} if self.id.scope else {})


def min_samples(stat: str) -> int:
    q = QUANTILES.get(stat)
    return 1 if q is None else math.ceil(round(1 / (1 - q), 6))


def _upper(name: ObjectiveId, value: float | None, threshold: float, samples: int, needed: int) -> Objective:
    if value is None or samples < needed:
        return Objective(name, threshold, value, samples, None, note=f"needs >= {needed} samples")
    return Objective(name, threshold, value, samples, value <= threshold)


def evaluate(slo: Slo, metrics: dict[str, dict[str, Any]], counts: dict[str, Any], good: int,
             total: int, goodput_per_s: float) -> list[Objective]:
    out: list[Objective] = []
    for metric in SLO_METRICS:
        thresholds = getattr(slo, metric)
        for stat, limit in thresholds.items() if thresholds else []:
            m = metrics[metric]
            out.append(_upper(ObjectiveId(metric, stat), m[stat], limit, m["count"], min_samples(stat)))
    attempts = counts["completed"] + counts["failed"]
    rate = _upper(ObjectiveId("error_rate", "max"), counts["error_rate"] if attempts else None,
                  (slo.error_rate or DEFAULT_ERROR_RATE).max, attempts, 1)
    if slo.error_rate is None:
        rate.note = (rate.note + "; " if rate.note else "") + "default (no slo.error_rate): any failure fails"
    out.append(rate)
    if slo.goodput is not None:
        g = slo.goodput
        if g.min_requests_per_s is not None:
            out.append(Objective(ObjectiveId("goodput", "min_requests_per_s"), g.min_requests_per_s, goodput_per_s, total,
                                 goodput_per_s >= g.min_requests_per_s if total else None, ">="))
        if g.min_ratio is not None:
            ratio = good / total if total else None
            out.append(Objective(ObjectiveId("goodput", "min_ratio"), g.min_ratio, ratio, total,
                                 None if ratio is None else ratio >= g.min_ratio, ">="))
    return out


def verdict(objectives: list[Objective], lag_p99_ms: float | None, max_lag_ms: float) -> tuple[str, list[str]]:
    """The verdict and the reasons behind it (for the console and summary)."""
    reasons = []
    if lag_p99_ms is not None and lag_p99_ms > max_lag_ms:
        reasons.append(f"the generator lagged: p99 queue_delay_ms {lag_p99_ms:.1f} > {max_lag_ms:g} "
                       f"(raise max_in_flight, lower the rate, or use more workers)")
        return "inconclusive", reasons
    failed = [o for o in objectives if o.passed is False]
    if failed:
        return "fail", [f"{o.objective} = {_fmt(o.value)} (limit {o.comparison} {o.threshold:g})" for o in failed]
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
                    "is unknown)")
    if counts["completed"] == 0:
        weak.append("no measured request completed")
    if result == "pass" and weak:
        return "inconclusive", weak
    return result, reasons + weak


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def stall_objectives(slo: Slo, measured: pl.DataFrame, gaps: pl.DataFrame | pl.LazyFrame,
                     stalls: dict[str, Any]) -> list[Objective]:
    """Objectives that see stalls: worst gap per request, stall rates, fluidity, prompt-aware TTFT."""
    ok = measured.filter(pl.col("ok"))
    out = _ttft_prompt_aware(slo, ok)
    if slo.itl_ms is not None and slo.itl_ms.max_per_request is not None:
        worst = gaps.lazy().join(ok.select("worker", "seq").lazy(), on=["worker", "seq"], how="semi").group_by(
            "worker", "seq").agg(pl.col("chunk_gap_ms").max()).collect()["chunk_gap_ms"]
        stats = describe(worst)
        out.append(_upper(ObjectiveId("itl_ms", "max_per_request"), stats["p99"], slo.itl_ms.max_per_request, stats["count"],
                          min_samples("p99")))
    tokens = int(ok["output_tokens"].sum()) if ok.height else 0
    for key, value in (("max_per_1k_tokens", stalls["per_1k_tokens"]),
                       ("max_prefill_induced_per_1k_tokens", stalls["prefill_induced_per_1k_tokens"])):
        limit = getattr(slo.stalls, key)
        if limit is not None:
            out.append(_upper(ObjectiveId("stalls", key), value, limit, tokens, 1000))
    if slo.fluidity is not None and slo.fluidity.min is not None:
        f = stalls.get("fluidity", {})
        index, n = f.get("index"), f.get("tokens", 0)
        out.append(Objective(ObjectiveId("fluidity", "min"), slo.fluidity.min, index, n,
                             None if index is None else index >= slo.fluidity.min, ">="))
    return out


def _ttft_prompt_aware(slo: Slo, ok: pl.DataFrame) -> list[Objective]:
    t = slo.ttft_ms
    if t is None:
        return []
    out = []
    if t.base is not None and t.per_prompt_token is not None:
        limit = t.base + t.per_prompt_token * pl.col("prompt_tokens")
        over = ok.select((pl.col("ttft_ms") > limit).mean()).item() if ok.height else None
        needed = math.ceil(1 / t.max_violation_ratio) if t.max_violation_ratio else 1
        o = _upper(ObjectiveId("ttft_ms", "prompt_aware"), over, t.max_violation_ratio, ok.height, needed)
        o.note = o.note or f"share of requests over {t.base:g} + {t.per_prompt_token:g} ms/prompt token"
        out.append(o)
    low = 0
    for bucket in t.buckets or []:
        sub = ok.filter((pl.col("prompt_tokens") > low) & (pl.col("prompt_tokens") <= bucket.max_prompt_tokens))
        stats = describe(sub["ttft_ms"])
        for stat, limit in bucket.items():
            scope = f"{low + 1}-{bucket.max_prompt_tokens} prompt tokens"
            out.append(_upper(ObjectiveId("ttft_ms", stat, scope), stats[stat], limit, stats["count"],
                              min_samples(stat)))
        low = bucket.max_prompt_tokens
    return out
