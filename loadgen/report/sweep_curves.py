"""A sweep's capacity curves in words and charts: per objective, its value at every probed load, the monotone
fit, the level it must not cross and the crossing with its interval (sweep.json ``curves``,
analysis/capacity_curve.py). Built from ``SweepResult`` only."""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from loadgen.analysis.sweep_result import SweepResult
from loadgen.report.charts import WIDE, Chart

SIGN = {"<=": "≤", ">=": "≥"}


def _v(curve: dict[str, Any], value: float | None) -> str:
    """A curve's value as read: a share of samples in %, a statistic in its own unit."""
    if value is None:
        return "n/a"
    return f"{value + 0.0:.2%}" if curve.get("kind") == "exceedance" else f"{value + 0.0:.3g}"  # never "-0"


def crossing_text(curve: dict[str, Any], unit: str) -> str:
    """Where one curve crosses its limit, with its interval: "crosses at 27.1 req/s (24.9–28.6)"."""
    low, high = curve.get("low"), curve.get("high")
    span = f"{'below' if low is None else f'{low:.4g}'}–{'beyond' if high is None else f'{high:.4g}'}"
    if curve.get("side") == "above":
        return "meets it at every probed load"
    if curve.get("side") == "below":
        return "misses it at every probed load"
    return f"crosses at {curve['crossing']:.4g} {unit} (interval {span})"


def curve_line(curve: dict[str, Any], unit: str) -> str:
    """One objective's curve on one line: its limit, the crossing and the fitted value at each load."""
    name, limit = curve["objective"], f"{SIGN.get(curve['comparison'], curve['comparison'])} {curve['threshold']:g}"
    what = (f"share above {curve['threshold']:g} (crosses at {curve['level']:.2%})"
            if curve.get("kind") == "exceedance" else "value")
    points = ", ".join(f"{p['load']:g}: {_v(curve, p['fitted'])}" for p in curve.get("points", []))
    flat = curve.get("flat")
    tail = f"; within ±5 % of its limit from {flat[0]:g} to {flat[1]:g} {unit}" if flat else ""
    return f"{name} {limit}: {crossing_text(curve, unit)}{tail} — {what} by load, fitted: {points}"


def curve_lines(r: SweepResult) -> list[str]:
    return [curve_line(c, r.unit) for c in r.curves]


def curve_chart(r: SweepResult, curve: dict[str, Any]) -> alt.TopLevelMixin:
    """The measured value at each probed load (points), the monotone fit (line), the level (red rule) and the
    crossing's interval (band) with its estimate (rule)."""
    title = "share of samples above the limit" if curve.get("kind") == "exceedance" else curve["objective"]
    frame = pl.DataFrame([{"load": p["load"], "measured": p["value"], "fitted": p["fitted"]}
                          for p in curve.get("points", [])],
                         schema={"load": pl.Float64, "measured": pl.Float64, "fitted": pl.Float64})
    x = alt.X("load:Q", title="offered load (requests/s)" if r.mode == "rate" else "concurrent users",
              scale=alt.Scale(zero=False))
    layers: list[alt.TopLevelMixin] = []
    low, high = curve.get("low"), curve.get("high")
    loads = frame["load"].to_list() or [0.0]
    if curve.get("side") == "inside" or low is not None or high is not None:
        band = pl.DataFrame({"low": [low if low is not None else min(loads)],
                             "high": [high if high is not None else max(loads)]})
        layers.append(alt.Chart(band).mark_rect(opacity=0.15, color="#2e7d32").encode(x="low:Q", x2="high:Q"))
    if curve.get("crossing") is not None:
        layers.append(alt.Chart(pl.DataFrame({"load": [curve["crossing"]]})).mark_rule(color="#2e7d32").encode(
            x="load:Q"))
    y = alt.Y("value:Q", title=title)
    long = frame.unpivot(["measured", "fitted"], index="load", variable_name="series")
    layers.append(alt.Chart(long.filter(pl.col("series") == "fitted")).mark_line(color="#4c78a8").encode(
        x=x, y=y))
    layers.append(alt.Chart(long.filter(pl.col("series") == "measured")).mark_point(filled=True).encode(
        x=x, y=y, tooltip=["load:Q", alt.Tooltip("value:Q", format=".4g")]))
    layers.append(alt.Chart(pl.DataFrame({"value": [curve["level"]]})).mark_rule(
        color="#c62828", strokeDash=[6, 3]).encode(y="value:Q"))
    return alt.layer(*layers).properties(width=WIDE, height=200)


def curve_charts(r: SweepResult) -> list[Chart]:
    return [Chart(f"curve_{i}", f"{c['objective']} against the load: {crossing_text(c, r.unit)}",
                  curve_chart(r, c), "Points: each probed load's value; line: the monotone fit; red dashed: the "
                  "level it must not cross; green: the crossing and its interval.")
            for i, c in enumerate(r.curves) if c.get("points")]
