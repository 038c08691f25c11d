"""``loadgen run --repeat N``: N runs of one scenario with fresh seeds, combined. repeat.json is ``to_dict``.

Across-run figures
------------------
Per metric (each SLO objective's value, the main percentiles, throughput, error rate, stall rate), the N runs'
values give: the mean, the sample standard deviation, the coefficient of variation (sd / |mean|) and a
Student-t confidence interval for the mean, ``mean ± t(1 − α/2, N − 1) · sd / √N`` — the runs are independent
(each its own seed), so this is the interval of what a run of this scenario gives on average. N ≥ 2.

Combined verdict
----------------
- **FAIL** when any objective's across-run interval lies wholly on its failing side (``<=``: low end above the
  limit; ``>=``: high end below it).
- **PASS** when every run PASSed and every objective's across-run interval lies on its passing side (``<=``:
  high end at or below the limit; ``>=``: low end at or above it).
- **INCONCLUSIVE** otherwise, with the reason: the runs that did not pass, the objectives whose interval
  straddles the limit, that lack values in two runs, or that some run did not decide pass.

An objective's own across-run decision follows the same rule: fail when its interval is wholly beyond the limit;
pass when it is on the passing side *and* every run decided it pass; else inconclusive. The across-run interval
measures how much a run's figure moves from run to run, not the evidence inside each run: where every run gives
the same value (no errors in any) it has zero width, and each run's own interval is what says whether the
sample was large enough — hence PASS needs both.

Exit code: the combined verdict's (0 pass, 1 fail, 3 inconclusive); 4 when any run failed on loadgen itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from loadgen.analysis.slo import EXIT_CODES

SCHEMA_VERSION = 1
INTERNAL_EXIT = 4
MAIN_METRICS = {  # across-run metric → its path in summary.json
    "ttft_ms.p50": ("metrics", "ttft_ms", "p50"), "ttft_ms.p99": ("metrics", "ttft_ms", "p99"),
    "itl_ms.p50": ("metrics", "itl_ms", "p50"), "itl_ms.p99": ("metrics", "itl_ms", "p99"),
    "tpot_ms.p50": ("metrics", "tpot_ms", "p50"), "e2e_ms.p50": ("metrics", "e2e_ms", "p50"),
    "e2e_ms.p99": ("metrics", "e2e_ms", "p99"),
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"), "error_rate": ("requests", "error_rate"),
    "stalls_per_1k_tokens": ("stalls", "per_1k_tokens"),
    "prefill_stalls_per_1k_tokens": ("stalls", "prefill_induced_per_1k_tokens"),
}


@dataclass
class Spread:
    """One metric across the runs: each run's value, their mean, sd, CV and the t-interval of the mean."""

    values: list[float | None]
    n: int
    mean: float | None
    sd: float | None
    cv: float | None
    ci_low: float | None
    ci_high: float | None


def spread(values: list[float | None], confidence: float) -> Spread:
    """The across-run figures of ``values`` (None: the run has no value; left out)."""
    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return Spread(list(values), 0, None, None, None, None, None)
    mean = float(x.mean())
    if len(x) < 2:
        return Spread(list(values), 1, mean, None, None, None, None)
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1)) * sd / math.sqrt(len(x))
    cv = sd / abs(mean) if mean else None
    return Spread(list(values), len(x), mean, sd, cv, mean - half, mean + half)


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None  # type: ignore[assignment]
    return doc


@dataclass
class ObjectiveSpread:
    objective: str
    comparison: str
    threshold: float
    spread: Spread
    run_decisions: list[str]
    decision: str  # pass | fail | inconclusive (its across-run interval against the limit)


def _side(comparison: str, threshold: float, s: Spread) -> str:
    if s.ci_low is None or s.ci_high is None:
        return "inconclusive"
    low_ok, high_ok = (s.ci_low >= threshold, s.ci_high >= threshold) if comparison == ">=" else (
        s.ci_high <= threshold, s.ci_low <= threshold)
    return "pass" if low_ok else "inconclusive" if high_ok else "fail"


def objective_spreads(summaries: list[dict[str, Any]], confidence: float) -> list[ObjectiveSpread]:
    """Every objective of the runs (in the first run's order), its values across the runs and its decision."""
    from loadgen.analysis.compare_basis import decision

    names: list[str] = []
    for s in summaries:
        names += [str(o["objective"]) for o in s.get("slo") or [] if o["objective"] not in names]
    out = []
    for name in names:
        found = [next((o for o in s.get("slo") or [] if o["objective"] == name), None) for s in summaries]
        first = next(o for o in found if o is not None)
        sp = spread([o.get("value") if o else None for o in found], confidence)
        comparison, threshold = str(first.get("comparison", "<=")), float(first["threshold"])
        runs = [decision(o) if o else "absent" for o in found]
        side = _side(comparison, threshold, sp)
        out.append(ObjectiveSpread(name, comparison, threshold, sp, runs,
                                   "inconclusive" if side == "pass" and set(runs) != {"pass"} else side))
    return out


def combined_verdict(verdicts: list[str], objectives: list[ObjectiveSpread]) -> tuple[str, list[str]]:
    """The combined verdict (module docstring) and its reasons."""
    failing = [o for o in objectives if o.decision == "fail"]
    if failing:
        return "fail", [f"{o.objective}: across-run interval {_ci(o.spread)} wholly beyond the limit "
                        f"{o.comparison} {o.threshold:g}" for o in failing]
    reasons = [f"run {i + 1} ({v})" for i, v in enumerate(verdicts) if v != "pass"]
    reasons = [f"not every run passed: {', '.join(reasons)}"] if reasons else []
    for o in objectives:
        if o.decision == "pass":
            continue
        if o.spread.ci_low is None:
            why = f"values in {o.spread.n} run(s), an interval needs 2"
        elif _side(o.comparison, o.threshold, o.spread) == "pass":
            undecided = [f"run {i + 1} {d}" for i, d in enumerate(o.run_decisions) if d != "pass"]
            why = f"across-run interval {_ci(o.spread)} passes, but not in every run ({', '.join(undecided)})"
        else:
            why = f"across-run interval {_ci(o.spread)} straddles the limit {o.comparison} {o.threshold:g}"
        reasons.append(f"{o.objective}: {why}")
    return ("inconclusive", reasons) if reasons else ("pass", [])


def _ci(s: Spread) -> str:
    return f"[{s.ci_low:.4g}, {s.ci_high:.4g}]"


@dataclass
class RepeatResult:
    name: str
    confidence: float
    runs: list[dict[str, Any]]  # each: dir (relative to the repeat's directory), seed, verdict, exit_code
    metrics: dict[str, Spread]
    objectives: list[ObjectiveSpread]
    verdict: str
    reasons: list[str]
    wall_s: float = 0.0
    started_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = field(default=None, compare=False)  # not serialised

    @property
    def exit_code(self) -> int:
        if any(r.get("exit_code") == INTERNAL_EXIT for r in self.runs):
            return INTERNAL_EXIT
        return EXIT_CODES[self.verdict]

    @property
    def seeds(self) -> list[int]:
        return [int(r["seed"]) for r in self.runs]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "repeat", "name": self.name, "verdict": self.verdict, "reasons": self.reasons,
                "exit_code": self.exit_code, "repeat": len(self.runs), "seeds": self.seeds,
                "confidence": self.confidence, "interval": "student-t over the runs' values",
                "runs": self.runs, "objectives": [asdict(o) for o in self.objectives],
                "metrics": {k: asdict(v) for k, v in self.metrics.items()}, "wall_s": self.wall_s,
                "started_at": self.started_at, **self.extra, "schema_version": SCHEMA_VERSION}


def combine(name: str, runs: list[dict[str, Any]], summaries: list[dict[str, Any]], confidence: float = 0.95,
            wall_s: float = 0.0) -> RepeatResult:
    """The runs (dir, seed, verdict, exit_code each) and their summary.json dicts, combined."""
    metrics = {k: spread([_get(s, path) for s in summaries], confidence) for k, path in MAIN_METRICS.items()}
    objectives = objective_spreads(summaries, confidence)
    verdict, reasons = combined_verdict([str(s.get("verdict")) for s in summaries], objectives)
    started = next((s.get("started_at") for s in summaries if s.get("started_at")), None)
    return RepeatResult(name, confidence, runs, metrics, objectives, verdict, reasons, wall_s, started)


def summary_view(doc: dict[str, Any]) -> dict[str, Any]:
    """A repeat.json as the parts of a summary.json that ``compare`` and ``history`` read: the combined verdict,
    its objectives (value: the across-run mean; decision: the across-run one) and the main figures' means."""
    slo = [{"objective": o["objective"], "decision": o["decision"], "value": o["spread"]["mean"],
            "threshold": o["threshold"], "comparison": o["comparison"]} for o in doc.get("objectives", [])]
    view: dict[str, Any] = {"verdict": doc.get("verdict"), "slo": slo, "started_at": doc.get("started_at")}
    for metric, path in MAIN_METRICS.items():
        node = view
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = ((doc.get("metrics") or {}).get(metric) or {}).get("mean")
    return view
