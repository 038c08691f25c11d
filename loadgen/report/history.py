"""``loadgen history reports/``: the key percentiles and verdicts of every run under a directory, as trends on one
self-contained HTML page (history.html) and a console table. A repeat (``loadgen run --repeat N``: a directory
with repeat.json) is one entry: its combined verdict, the across-run means, the number of runs and the spread
(coefficient of variation across its runs of TTFT p99 and ITL p99); its runs are not listed on their own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl
from rich.console import Console
from rich.table import Table

from loadgen.report.charts import CLASS_COLORS, Chart
from loadgen.report.console import STYLE, compact
from loadgen.report.fit import fit
from loadgen.report.html import chart_section, e, page

TREND_METRICS = {  # column → (summary path, title)
    "ttft_p50_ms": (("metrics", "ttft_ms", "p50"), "TTFT p50 (ms)"),
    "ttft_p99_ms": (("metrics", "ttft_ms", "p99"), "TTFT p99 (ms)"),
    "itl_p50_ms": (("metrics", "itl_ms", "p50"), "ITL p50 (ms)"),
    "itl_p99_ms": (("metrics", "itl_ms", "p99"), "ITL p99 (ms)"),
    "tpot_p50_ms": (("metrics", "tpot_ms", "p50"), "TPOT p50 (ms)"),
    "e2e_p99_ms": (("metrics", "e2e_ms", "p99"), "E2E p99 (ms)"),
    "output_tokens_per_s": (("throughput", "output_tokens_per_s"), "output tokens/s"),
    "error_rate": (("requests", "error_rate"), "error rate"),
    "prefill_stalls_per_1k_tokens": (("stalls", "prefill_induced_per_1k_tokens"), "prefill-induced stalls / 1k tok"),
}


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)  # type: ignore[assignment]
    return doc


SPREAD_METRICS = {"ttft_p99_cv": "ttft_ms.p99", "itl_p99_cv": "itl_ms.p99"}  # column → repeat.json metric


def _repeat_row(repeat_dir: Path, reports_dir: Path) -> dict[str, Any] | None:
    """A repeat as one row: its combined verdict, the across-run means, its number of runs and CVs."""
    from loadgen.analysis.repeat_result import summary_view

    try:
        doc = json.loads((repeat_dir / "repeat.json").read_text())
        first = json.loads((repeat_dir / doc["runs"][0]["dir"] / "run.json").read_text())
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    view = summary_view(doc)
    row = {"run": repeat_dir.relative_to(reports_dir).as_posix(), "scenario": first.get("scenario", {}).get("name"),
           "started_at": first.get("started_at"), "verdict": doc.get("verdict"), "runs": len(doc["runs"])}
    row.update({col: _get(view, path) for col, (path, _) in TREND_METRICS.items()})
    row.update({col: ((doc.get("metrics") or {}).get(m) or {}).get("cv") for col, m in SPREAD_METRICS.items()})
    return row


def collect_runs(reports_dir: Path) -> pl.DataFrame:
    """One row per run directory (any depth) holding summary.json and run.json, and one per repeat (its runs
    folded into it), oldest first."""
    repeats = sorted(p.parent for p in reports_dir.rglob("repeat.json"))
    rows = [row for row in (_repeat_row(d, reports_dir) for d in repeats) if row is not None]
    for summary_path in sorted(reports_dir.rglob("summary.json")):
        run_dir = summary_path.parent
        if any(run_dir == d or d in run_dir.parents for d in repeats):
            continue  # a repeat's run: its repeat's row stands for it
        try:
            summary = json.loads(summary_path.read_text())
            info = json.loads((run_dir / "run.json").read_text())
        except (OSError, ValueError):
            continue  # not a run directory (or one still being written)
        row = {"run": run_dir.relative_to(reports_dir).as_posix(), "scenario": info.get("scenario", {}).get("name"),
               "started_at": info.get("started_at"), "verdict": summary.get("verdict"),
               "requests": _get(summary, ("requests", "completed")), "runs": 1}
        row.update({col: _get(summary, path) for col, (path, _) in TREND_METRICS.items()})
        rows.append(row)
    schema = {"run": pl.String, "scenario": pl.String, "started_at": pl.String, "verdict": pl.String,
              "requests": pl.Int64, **{c: pl.Float64 for c in TREND_METRICS}, "runs": pl.Int64,
              **{c: pl.Float64 for c in SPREAD_METRICS}}
    frame = pl.DataFrame(rows, schema=schema, strict=False)
    return (frame.with_columns(started=pl.col("started_at").str.to_datetime("%Y-%m-%dT%H:%M:%S%z", strict=False))
            .sort("started", "run"))


def spread_text(r: dict[str, Any]) -> str:
    """A repeat's spread: ``CV TTFT p99 12%, ITL p99 3%``; ``–`` for a single run."""
    if (r.get("runs") or 1) < 2:
        return "–"
    parts = [f"{label} {r[col] * 100:.0f}%" for col, label in (("ttft_p99_cv", "TTFT p99"), ("itl_p99_cv", "ITL p99"))
             if r.get(col) is not None]
    return "CV " + ", ".join(parts) if parts else "–"


TIME_FORMAT = "%d %b %H:%M"  # 24-hour: "27 Nov 09:05" (Vega's default time labels read "10 AM" beside "10:15")
NOISE_SHARE = 0.02  # a panel spans at least ± this share of its metric's median: smaller changes stay small


def padded_domains(long: pl.DataFrame) -> pl.DataFrame:
    """Per metric, the y range each panel must show: [min(values, median·0.98), max(values, median·1.02)], so
    a change under 2 % of the median (noise) never fills the panel; a metric that is 0 everywhere spans [0, 1]."""
    stats = long.group_by("metric").agg(lo=pl.col("value").min(), hi=pl.col("value").max(),
                                         mid=pl.col("value").median())
    pad = pl.col("mid").abs() * NOISE_SHARE
    flat_zero = (pl.col("lo") == 0) & (pl.col("hi") == 0)
    low = pl.when(flat_zero).then(0.0).otherwise(pl.min_horizontal("lo", pl.col("mid") - pad))
    return stats.select("metric", low=low,
                        high=pl.when(flat_zero).then(1.0).otherwise(pl.max_horizontal("hi", pl.col("mid") + pad)))


def trend_chart(runs: pl.DataFrame) -> alt.TopLevelMixin:
    """One panel per metric against the start time; each panel's y range padded (``padded_domains``) by two
    invisible points at its ends, since a faceted chart's independent scales cannot take a domain each."""
    long = runs.unpivot(index=["run", "scenario", "started_at", "verdict"], on=list(TREND_METRICS),
                        variable_name="metric", value_name="value").drop_nulls("value")
    long = long.with_columns(metric=pl.col("metric").replace({k: t for k, (_, t) in TREND_METRICS.items()}),
                             pad=pl.lit(False))
    first = long["started_at"].min() if long.height else None
    ends = padded_domains(long).unpivot(index="metric", on=["low", "high"], value_name="value").select(
        "metric", "value", started_at=pl.lit(first), pad=pl.lit(True))
    data = pl.concat([long, ends], how="diagonal_relaxed")
    x = alt.X("started_at:T", title="run started", axis=alt.Axis(format=TIME_FORMAT, labelAngle=0, tickCount=4))
    y = alt.Y("value:Q", title=None, scale=alt.Scale(zero=False))
    tooltip = ["run:N", "scenario:N", alt.Tooltip("started_at:T", format=TIME_FORMAT, title="started"), "metric:N",
               alt.Tooltip("value:Q", format=".4g"), "verdict:N"]
    base = alt.Chart().encode(x=x, y=y).transform_filter("!datum.pad")
    lines = base.mark_line(opacity=0.6).encode(
        color=alt.Color("scenario:N", scale=alt.Scale(range=CLASS_COLORS), legend=alt.Legend(orient="top")))
    dots = base.mark_point(filled=True, size=45).encode(
        color=alt.Color("scenario:N", scale=alt.Scale(range=CLASS_COLORS)), tooltip=tooltip,
        shape=alt.Shape("verdict:N", scale=alt.Scale(domain=["pass", "fail", "inconclusive"],
                                                     range=["circle", "cross", "triangle"]),
                        legend=alt.Legend(orient="top")))
    span = alt.Chart().transform_filter("datum.pad").mark_point(opacity=0).encode(x=x, y=y)
    return (span + lines + dots).properties(width=420, height=150).facet(
        facet=alt.Facet("metric:N", title=None, sort=[t for _, t in TREND_METRICS.values()]), data=data,
        columns=2).resolve_scale(y="independent")


def runs_table(runs: pl.DataFrame, out_dir: Path, reports_dir: Path) -> str:
    rows = []
    for r in runs.sort("started", "run", descending=True).iter_rows(named=True):
        report = reports_dir / r["run"] / "report.html"
        link = os.path.relpath(report, out_dir) if report.exists() else None
        name = f"<a href=\"{e(link)}\">{e(r['run'])}</a>" if link else e(r["run"])
        rows.append(f"<tr><td>{name}</td><td class=\"text\">{e(r['scenario'])}</td><td>{e(r['started_at'])}</td>"
                    f"<td class=\"{e(r['verdict'])}\">{e(r['verdict'])}</td>"
                    + "".join(f"<td>{_num(r[c])}</td>" for c in ("ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s"))
                    + f"<td>{r['runs'] or 1}</td><td class=\"text\">{e(spread_text(r))}</td></tr>")
    return ("<table><tr><th>run</th><th>scenario</th><th>started</th><th>verdict</th><th>TTFT p99 (ms)</th>"
            "<th>ITL p99 (ms)</th><th>tokens/s</th><th>runs</th><th>spread</th></tr>" + "".join(rows) + "</table>")


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def render_history(runs: pl.DataFrame, out_path: Path, reports_dir: Path) -> str:
    chart = Chart("trends", "Trends", trend_chart(runs),
                  "Each point is a run; its shape is the run's verdict. Lines join runs of one scenario.")
    counts = runs.group_by("verdict").len()
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.iter_rows()))
    return page("loadgen history",
                f"<h1>loadgen history</h1><p class=\"meta\">{runs.height} runs under {e(reports_dir)}: {e(tally)}.</p>"
                + chart_section(chart) + "<h2>Runs</h2>" + runs_table(runs, out_path.parent, reports_dir))


def print_history(console: Console, runs: pl.DataFrame, last: int = 20) -> None:
    table = Table(box=None, pad_edge=False)
    for col in ("run", "scenario", "verdict", "TTFT p99", "ITL p99", "tokens/s", "runs", "spread"):
        table.add_column(col, justify="left" if col in ("run", "scenario", "verdict", "spread") else "right")
    for r in runs.tail(last).iter_rows(named=True):
        table.add_row(r["run"], r["scenario"] or "?", f"[{STYLE.get(r['verdict'], '')}]{r['verdict']}[/]",
                      compact(r["ttft_p99_ms"]), compact(r["itl_p99_ms"]), compact(r["output_tokens_per_s"]),
                      str(r["runs"] or 1), spread_text(r))
    console.print(fit(console, table, ("run", "scenario", "verdict")))  # stacked, not cut, at 80 columns
