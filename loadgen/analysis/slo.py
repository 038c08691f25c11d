"""SLO objectives → per-objective results → the run's verdict (DESIGN §1 exit codes).

A percentile needs enough samples to exist: p_q needs at least ceil(1 / (1 − q)) (p99: 100, p99.9: 1000);
with fewer the objective is inconclusive, never passed. Verdict: ``inconclusive`` when the generator lagged
(p99 ``queue_delay_ms`` above ``slo.max_generator_lag_ms``: its latencies include its own lateness); else
``fail`` if any objective failed; else ``inconclusive`` if any lacked samples; else ``pass``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..scenario import Slo
from .metrics import QUANTILES

EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3}


@dataclass
class Objective:
    objective: str
    threshold: float
    value: float | None
    samples: int
    passed: bool | None  # None: inconclusive (too few samples)
    comparison: str = "<="
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def min_samples(stat: str) -> int:
    q = QUANTILES.get(stat)
    return 1 if q is None else math.ceil(round(1 / (1 - q), 6))


def _upper(name: str, value: float | None, threshold: float, samples: int, needed: int) -> Objective:
    if value is None or samples < needed:
        return Objective(name, threshold, value, samples, None, note=f"needs >= {needed} samples")
    return Objective(name, threshold, value, samples, value <= threshold)


def evaluate(slo: Slo, metrics: dict[str, dict[str, Any]], counts: dict[str, Any], good: int,
             total: int, goodput_per_s: float) -> list[Objective]:
    out: list[Objective] = []
    for metric in ("ttft_ms", "ttft_service_ms", "itl_ms", "chunk_gap_ms", "tpot_ms", "e2e_ms"):
        thresholds = getattr(slo, metric)
        for stat, limit in thresholds.items() if thresholds else []:
            m = metrics[metric]
            out.append(_upper(f"{metric}.{stat}", m[stat], limit, m["count"], min_samples(stat)))
    if slo.error_rate is not None:
        attempts = counts["completed"] + counts["failed"]
        out.append(_upper("error_rate.max", counts["error_rate"], slo.error_rate.max, attempts, 1))
    if slo.goodput is not None:
        g = slo.goodput
        if g.min_requests_per_s is not None:
            out.append(Objective("goodput.min_requests_per_s", g.min_requests_per_s, goodput_per_s, total,
                                 goodput_per_s >= g.min_requests_per_s if total else None, ">="))
        if g.min_ratio is not None:
            ratio = good / total if total else None
            out.append(Objective("goodput.min_ratio", g.min_ratio, ratio, total,
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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
