"""One vocabulary (core/vocabulary.py), held against every module that uses its words: the scenario's SLO
fields, the summary's metric tables and objectives, the report's rows, compare's statistics and the stall causes.
A metric added in one place and not the others fails here, naming where."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from loadgen.analysis import compare, metrics, spikes
from loadgen.analysis.result import MissFigures, StallFigures
from loadgen.analysis import sweep_result
from loadgen.analysis.result import ReasoningFigures, RunResult, SessionFigures
from loadgen.core.vocabulary import (COMPARABLE_METRICS, FAMILIES, FIGURES, LIMIT_STATS, METRICS, QUANTILES,
                                     SLO_METRICS, STALL_CAUSES, STATS, CAUSES, ObjectiveId, family_metrics, metric_rows)
from loadgen.plan.slo_spec import Slo, Thresholds
from loadgen.report import writers
from tests.run_helpers import run_cli

DATA = Path(__file__).parent / "data"


def test_the_scenarios_slo_fields_are_the_slo_metrics_and_their_statistics() -> None:
    def limits(annotation: object) -> bool:
        kinds = getattr(annotation, "__args__", (annotation,))
        return any(isinstance(k, type) and issubclass(k, Thresholds) for k in kinds)

    latency_fields = [name for name, field in Slo.model_fields.items() if limits(field.annotation)]
    assert latency_fields == list(SLO_METRICS)
    assert set(Thresholds.model_fields) == set(LIMIT_STATS)


def test_the_tables_rows_and_comparisons_take_their_names_from_the_vocabulary() -> None:
    assert writers.ROWS == tuple(METRICS)
    basis_order = ("request", "token", "session", "step")
    assert metrics.REQUEST_METRICS + metrics.TOKEN_METRICS == tuple(sorted(
        (n for n in METRICS if METRICS[n].basis in ("request", "token")),
        key=lambda n: (basis_order.index(METRICS[n].basis), list(METRICS).index(n))))
    for name in compare.METRICS:
        if "." in name:
            oid = ObjectiveId.parse(name)
            assert oid.metric in COMPARABLE_METRICS and oid.stat in QUANTILES, name
    for names in compare.FAMILY_METRICS.values():
        assert set(names) <= set(compare.METRICS)
    assert set(sweep_result.STEP_METRICS) <= set(METRICS)
    assert spikes.CAUSES == tuple(STALL_CAUSES)


def test_a_stalls_cause_and_a_requests_cause_read_the_same() -> None:
    """One registry of causes (the ledger's decision order), the stall causes its subset with its meanings."""
    assert all(STALL_CAUSES[c] == CAUSES[c] for c in STALL_CAUSES) and list(CAUSES)[-1] == "unknown"
    assert list(CAUSES)[:2] == ["server_error", "network"]


def test_every_metric_has_a_family_unit_and_basis_and_only_the_families_rows_depend_on_the_run() -> None:
    assert {m.family for m in METRICS.values()} == set(FAMILIES)
    assert all(m.unit in ("ms", "tokens") and m.name.endswith("_" + m.unit) for m in METRICS.values())
    assert all(m.basis in ("session", "step") for m in METRICS.values() if m.family == "session")
    assert metric_rows({"e2e_ms": {}, "ttft_answer_ms": {}, "ttft_ms": {}}) == ("ttft_ms", "e2e_ms", "ttft_answer_ms")
    assert family_metrics("latency") == tuple(n for n in METRICS if METRICS[n].family == "latency")


def test_ttft_says_it_counts_a_reasoning_token_as_the_first_token() -> None:
    text = METRICS["ttft_ms"].description
    assert "reasoning" in text and "MLPerf" in text and "ttft_answer_ms" in text


def test_every_run_level_figure_is_a_typed_key_of_the_summary() -> None:
    sections = {"reasoning": ReasoningFigures, "sessions": SessionFigures}
    for figure in FIGURES.values():
        section, key = figure.where.split(".")
        assert section in RunResult.__dataclass_fields__ and key in sections[section].__annotations__, figure


@pytest.mark.parametrize("name", ["ttft_ms.p99", "itl_ms.max_per_request", "stalls.max_per_1k_tokens",
                                  "ttft_ms[1-512 prompt tokens].p99", "goodput.min_requests_per_s"])
def test_an_objective_name_is_its_identity_written_out(name: str) -> None:
    assert str(ObjectiveId.parse(name)) == name


@pytest.mark.parametrize("name", ["ttft_ms", "p99", ".p99", "ttft_ms.", "ttft_ms[a[b]].p99"])
def test_a_name_that_is_no_objective_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not an objective name"):
        ObjectiveId.parse(name)


def test_only_an_unscoped_percentile_of_a_comparable_metric_is_bootstrapped() -> None:
    assert ObjectiveId("ttft_ms", "p99").bootstrappable
    assert not ObjectiveId("ttft_ms", "p99", "1-512 prompt tokens").bootstrappable
    assert not ObjectiveId("ttft_service_ms", "p99").bootstrappable and not ObjectiveId("itl_ms", "max").bootstrappable


def test_a_runs_summary_carries_each_objectives_identity_and_every_metrics_statistics(tmp_path: Path) -> None:
    """The recorded golden run, summarised now: every objective has its (metric, stat) beside its name, and each
    metric table has the vocabulary's statistics; the stalls' causes are the vocabulary's."""
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "golden_run", run_dir)
    run_cli("report", str(run_dir), "--no-png", timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["slo"] and all(str(ObjectiveId(o["metric"], o["stat"], o.get("scope", ""))) == o["objective"]
                                  for o in summary["slo"])
    assert all(ObjectiveId.of(o) == ObjectiveId.parse(o["objective"]) for o in summary["slo"])
    assert set(family_metrics("latency")) <= set(summary["metrics"]) <= set(METRICS)
    assert set(summary["metrics"]) == set(family_metrics("latency"))  # no reasoning, no session: their rows absent
    assert all(tuple(table) == STATS for table in summary["metrics"].values())
    causes = set(pl.read_parquet(run_dir / "stalls.parquet")["cause"].to_list())
    assert causes and causes <= set(STALL_CAUSES)
    misses = pl.read_parquet(run_dir / "misses.parquet")  # the ledger's causes, the one registry's
    assert set(misses["cause"].to_list()) <= set(CAUSES) and set(summary["misses"]["by_cause"]) <= set(CAUSES)
    assert set(summary["misses"]) == set(MissFigures.__annotations__)
    assert set(summary["stalls"]) <= set(StallFigures.__annotations__)  # the typed result names every figure
