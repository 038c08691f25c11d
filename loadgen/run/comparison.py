"""``loadgen compare BASE NEW``: load both run directories' raw records, compare them (analysis.compare) and
write compare.md / compare.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.analysis.compare import (DEFAULT_METRICS, METRICS, MetricComparison, RunSamples, compare, point_figures,
                                      run_samples)
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
    error_rate_pp: float = 1.0
    stall_rate_delta: float = 0.5  # stalls per 1k output tokens
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
        if min(self.threshold_pct, self.error_rate_pp, self.stall_rate_delta) < 0:
            raise CompareError("thresholds must be >= 0")


def load_run(run_dir: Path) -> tuple[dict[str, Any], RunSamples]:
    info, _, samples = load_run_frames(run_dir)
    return info, samples


def load_run_frames(run_dir: Path) -> tuple[dict[str, Any], pl.DataFrame, RunSamples]:
    """run.json, the request records and the bootstrap's samples of one run directory (records read once;
    the run's summary.json and stalls.parquet read back where it wrote them, else the records analysed)."""
    try:
        info, scenario = read_run_info(run_dir)
        requests, chunks = scan_whole_records(run_dir)
    except RunDirError as exc:
        raise CompareError(str(exc)) from None
    run = RunAnalysis(requests, chunks)
    stored = stored_summary(run_dir)
    summary, stalls = stored if stored is not None else _summarized(scenario, requests, chunks, info, run)
    return info, requests, run_samples(requests, chunks, stalls, run, point_figures(summary))


def _summarized(scenario: Scenario, requests: pl.DataFrame, chunks: pl.LazyFrame, info: dict[str, Any],
                run: RunAnalysis) -> tuple[dict[str, Any], pl.DataFrame]:
    summary, tables = summarize(scenario, requests, chunks, info.get("planned"), run=run)
    return summary, tables["stalls"]


def same_plan(base: dict[str, Any], new: dict[str, Any]) -> bool:
    """Two runs of one seeded plan: same workload, arrivals and seed (the target and SLOs may differ)."""
    keys = ("seed", "workload", "load")
    return all(base["scenario"].get(k) == new["scenario"].get(k) for k in keys)


def _warnings(base: tuple[dict[str, Any], RunSamples], new: tuple[dict[str, Any], RunSamples]) -> list[str]:
    (bi, bs), (ni, ns) = base, new
    out = []
    if bi["scenario"]["name"] != ni["scenario"]["name"]:
        out.append(f"different scenarios: {bi['scenario']['name']!r} vs {ni['scenario']['name']!r}")
    if bi.get("seed") != ni.get("seed"):
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
    def exit_code(self) -> int:
        """loadgen compare's exit code: 1 when a metric regressed, else 0."""
        return 1 if self.regressed else 0


def compare_runs(base_dir: Path, new_dir: Path, opts: CompareOptions) -> tuple[dict[str, Any], list[MetricComparison]]:
    opts.check()
    base, new = load_run(base_dir), load_run(new_dir)
    paired = same_plan(base[0], new[0])
    thresholds = {"relative": opts.threshold_pct / 100, "error_rate": opts.error_rate_pp / 100,
                  "stalls_per_1k_tokens": opts.stall_rate_delta}
    results = compare(base[1], new[1], opts.metrics, thresholds, opts.confidence, opts.replicates, opts.seed,
                      paired)
    meta = {"confidence": opts.confidence, "replicates": opts.replicates, "paired": paired,
            "threshold_pct": opts.threshold_pct, "error_rate_pp": opts.error_rate_pp,
            "stall_rate_delta": opts.stall_rate_delta, "warnings": _warnings(base, new) + opts.warnings}
    return comparison_dict(results, str(base_dir), str(new_dir), meta), results
