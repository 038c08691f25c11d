"""``loadgen compare BASE NEW``: load both run directories' raw records, compare them (analysis.compare), say the
verdict change first (analysis.compare_basis) and write compare.json / compare.md / compare.html /
compare-junit.xml.

Either side may be a repeat's directory (``loadgen run --repeat N``: repeat.json): its runs' requests are pooled
into one sample (``pool_samples``), its verdict and objectives are the repeat's combined ones.

Exit codes: 0 no metric regressed and the verdict did not get worse; 1 a metric regressed or the verdict got
worse (pass → inconclusive or fail, inconclusive → fail); 2 bad input."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.analysis.compare import (DEFAULT_METRICS, METRICS, MetricComparison, RunSamples, compare, point_figures,
                                      pool_samples, run_samples)
from loadgen.analysis.compare_basis import derived_thresholds, miss_change, verdict_change
from loadgen.analysis.repeat_result import summary_view
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.summary import summarize
from loadgen.report.compare_report import comparison_dict
from loadgen.plan.scenario import Scenario
from loadgen.run.reporting import RunDirError, read_run_info, scan_whole_records, stored_summary
from loadgen.errors import CompareError as CompareError

MIN_REQUESTS = 20


@dataclass
class CompareOptions:
    metrics: tuple[str, ...] = DEFAULT_METRICS
    threshold_pct: float = 10.0
    error_rate_pp: float | None = None  # None: half of slo.error_rate.max (compare_basis.derived_thresholds)
    stall_rate_delta: float | None = None  # stalls per 1k output tokens; None: half of the scenario's stall limit
    confidence: float = 0.95
    replicates: int = 1000
    seed: int = 0
    warnings: list[str] = field(default_factory=list)

    def check(self) -> None:
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise CompareError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
        if not 0.5 <= self.confidence < 1:
            raise CompareError(f"--confidence {self.confidence}: must be in [0.5, 1)")
        if self.replicates < 100:
            raise CompareError(f"--replicates {self.replicates}: at least 100")
        if min(x for x in (self.threshold_pct, self.error_rate_pp, self.stall_rate_delta, 0.0) if x is not None) < 0:
            raise CompareError("thresholds must be >= 0")


def load_run(run_dir: Path) -> tuple[dict[str, Any], RunSamples]:
    info, _, samples = load_run_frames(run_dir)
    return info, samples


@dataclass
class Side:
    """One side of a comparison: run.json (a repeat: its first run's), the samples, the summary (a repeat: its
    combined verdict and objectives) and how many runs it pools."""

    info: dict[str, Any]
    samples: RunSamples
    summary: dict[str, Any]
    runs: int = 1


def load_side(run_dir: Path) -> Side:
    """A run directory, or a repeat's directory (its runs pooled)."""
    repeat = run_dir / "repeat.json"
    if not repeat.exists():
        info, summary, _, samples = _load(run_dir)
        return Side(info, samples, summary)
    try:
        doc = json.loads(repeat.read_text(encoding="utf-8"))
        dirs = [run_dir / r["dir"] for r in doc["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompareError(f"{repeat}: not a loadgen repeat.json ({exc})") from None
    loaded = [_load(d) for d in dirs]
    return Side(loaded[0][0], pool_samples([x[3] for x in loaded]), summary_view(doc), len(loaded))


def load_run_frames(run_dir: Path) -> tuple[dict[str, Any], pl.DataFrame, RunSamples]:
    """run.json, the request records and the bootstrap's samples of one run directory (records read once;
    the run's summary.json and stalls.parquet read back where it wrote them, else the records analysed)."""
    info, _, requests, samples = _load(run_dir)
    return info, requests, samples


def _load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], pl.DataFrame, RunSamples]:
    try:
        info, scenario = read_run_info(run_dir)
        requests, chunks = scan_whole_records(run_dir)
    except RunDirError as exc:
        raise CompareError(str(exc)) from None
    run = RunAnalysis(requests, chunks, scenario.load.steady_state)
    stored = stored_summary(run_dir)
    summary, stalls = stored if stored is not None else _summarized(scenario, requests, chunks, info, run)
    # the sessions the run's end cut short are left out of the bootstrap as summary.json's point value leaves them
    return info, summary, requests, run_samples(requests, chunks, stalls, run, point_figures(summary),
                                                info.get("sessions_not_finished"))


def _summarized(scenario: Scenario, requests: pl.DataFrame, chunks: pl.LazyFrame, info: dict[str, Any],
                run: RunAnalysis) -> tuple[dict[str, Any], pl.DataFrame]:
    summary, tables = summarize(scenario, requests, chunks, info.get("planned"),
                                {"sessions_not_finished": info.get("sessions_not_finished", [])}, run=run)
    return summary, tables["stalls"]


def same_plan(base: dict[str, Any], new: dict[str, Any]) -> bool:
    """Two runs of one seeded plan: same workload, arrivals and seed (the target and SLOs may differ)."""
    keys = ("seed", "workload", "load")
    return all(base["scenario"].get(k) == new["scenario"].get(k) for k in keys)


def _warnings(base: Side, new: Side) -> list[str]:
    (bi, bs), (ni, ns) = (base.info, base.samples), (new.info, new.samples)
    out = [f"the {label} side pools the requests of {side.runs} repeated runs" for label, side in
           (("base", base), ("new", new)) if side.runs > 1]
    if bi["scenario"]["name"] != ni["scenario"]["name"]:
        out.append(f"different scenarios: {bi['scenario']['name']!r} vs {ni['scenario']['name']!r}")
    if bi.get("seed") != ni.get("seed") and base.runs == new.runs == 1:
        out.append(f"different seeds ({bi.get('seed')} vs {ni.get('seed')}): the request mix differs too")
    for label, s in (("base", bs), ("new", ns)):
        if int(s.ok.sum()) < MIN_REQUESTS:
            out.append(f"the {label} run has only {int(s.ok.sum())} successful requests: intervals are wide")
    return out


@dataclass
class Comparison:
    """NEW against BASE: per metric, the bootstrap interval of the change and whether it regressed."""

    doc: dict[str, Any]  # compare.json
    results: list[MetricComparison]

    @property
    def regressed(self) -> bool:
        return bool(self.doc["regressed"])

    @property
    def verdict_worse(self) -> bool:
        return bool(self.doc["verdict_change"]["worse"])

    @property
    def exit_code(self) -> int:
        """loadgen compare's exit code: 1 when a metric regressed or the verdict got worse, else 0."""
        return int(self.doc["exit_code"])


def compare_runs(base_dir: Path, new_dir: Path, opts: CompareOptions) -> tuple[dict[str, Any], list[MetricComparison]]:
    opts.check()
    base, new = load_side(base_dir), load_side(new_dir)
    paired = base.runs == new.runs == 1 and same_plan(base.info, new.info)
    given = {"error_rate": None if opts.error_rate_pp is None else opts.error_rate_pp / 100,
             "stalls_per_1k_tokens": opts.stall_rate_delta, "prefill_stalls_per_1k_tokens": opts.stall_rate_delta}
    derived = derived_thresholds([base.info["scenario"], new.info["scenario"]], given)
    thresholds = {"relative": opts.threshold_pct / 100, **{k: v["value"] for k, v in derived.items()}}
    results = compare(base.samples, new.samples, opts.metrics, thresholds, opts.confidence, opts.replicates,
                      opts.seed, paired)
    meta = {"confidence": opts.confidence, "replicates": opts.replicates, "paired": paired,
            "threshold_pct": opts.threshold_pct, "thresholds": derived, "runs": {"base": base.runs, "new": new.runs},
            "warnings": _warnings(base, new) + opts.warnings, "misses": miss_change(base.summary, new.summary)}
    change = verdict_change(base.summary, new.summary)
    return comparison_dict(change, results, str(base_dir), str(new_dir), meta), results
