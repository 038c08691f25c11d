"""Every file of a run directory that is a view of its records: summary.json, summary.md, junit.xml,
stalls.parquet, misses.parquet, report.html and charts/*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from loadgen.core.secrets import write_text
from loadgen.analysis.advice_result import Advice
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.report.advice_report import html_section
from loadgen.report.charts import build_charts
from loadgen.report.html import render_page, write_pngs
from loadgen.report.miss_lane import miss_lane
from loadgen.report.shrink_report import ShrinkEntry, shrink_section
from loadgen.report.timeline import choose_window
from loadgen.report.views import RunViews
from loadgen.report.writers import write_all
from loadgen.analysis.result import RunResult


def write_reports(run_dir: Path, result: RunResult, name: str, tables: dict[str, pl.DataFrame],
                  requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame,
                  window: tuple[float, float] | None = None, png: bool = True, server: pl.DataFrame | None = None,
                  advice: Advice | None = None, run: RunAnalysis | None = None,
                  shrinks: list[ShrinkEntry] | None = None) -> None:
    """``run``: the records' analysis the summary was made from (its gaps are not computed again); ``shrinks``:
    the run's ``loadgen shrink`` reproductions (RUN/shrink-*/), for the "Smallest reproduction" section."""
    charts, images, views = _charts(run_dir, result, tables.get("stalls", pl.DataFrame()), requests, chunks, window,
                                    png, server, run)
    write_all(run_dir, result, name, tables, images)
    _write_page(run_dir, result, name, charts, advice, views, tables.get("misses"), shrinks)


def write_report_page(run_dir: Path, result: RunResult, name: str, stalls: pl.DataFrame, requests: pl.DataFrame,
                      chunks: pl.DataFrame | pl.LazyFrame, png: bool = True, server: pl.DataFrame | None = None,
                      advice: Advice | None = None, misses: pl.DataFrame | None = None,
                      shrinks: list[ShrinkEntry] | None = None) -> None:
    """report.html (and its PNGs) alone, for a summary already written (``result``, ``stalls``, ``misses``:
    summary.json, stalls.parquet and misses.parquet read back): ``loadgen advise`` adds its section without the
    run analysed again."""
    charts, _, views = _charts(run_dir, result, stalls, requests, chunks, None, png, server, None)
    _write_page(run_dir, result, name, charts, advice, views, misses, shrinks)


def _charts(run_dir: Path, result: RunResult, stalls: pl.DataFrame, requests: pl.DataFrame,
            chunks: pl.DataFrame | pl.LazyFrame, window: tuple[float, float] | None, png: bool,
            server: pl.DataFrame | None, run: RunAnalysis | None) -> tuple[list[Any], list[tuple[str, str]], RunViews]:
    views = RunViews.build(requests, chunks, stalls, result, server, run)
    charts = build_charts(views, choose_window(views, window))
    images = []
    if png:
        images = [(c.title, p.relative_to(run_dir).as_posix())
                  for c, p in zip(charts, write_pngs(charts, run_dir / "charts"))]
    return charts, images, views


def _write_page(run_dir: Path, result: RunResult, name: str, charts: list[Any], advice: Advice | None,
                views: RunViews, misses: pl.DataFrame | None, shrinks: list[ShrinkEntry] | None = None) -> None:
    """report.html; ``misses``: the ledger's rows (misses.parquet), for the worst misses and the miss lane."""
    advice_html = (html_section(advice) if advice is not None else "") + shrink_section(shrinks or [])
    lane = miss_lane(misses, views.t0_ns, views.span_s)
    write_text(run_dir / "report.html", render_page(result, name, run_dir.name, charts, advice_html,
                                                    misses, views.t0_ns, lane))
