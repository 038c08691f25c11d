"""The miss lane: every request that missed a limit as a mark at its intended send time, one row per cause,
coloured by cause (misses.parquet's rows; analysis/ledger.py decides each cause, docs/causes.md says how). A
cluster of one colour is an episode of one cause: a queue building up, a preemption storm, a client hiccup."""

from __future__ import annotations

import altair as alt
import polars as pl

from loadgen.report.charts import WIDE, Chart
from loadgen.report.misses_report import cause_meanings
from loadgen.report.views import MAX_POINTS, NS_PER_S, sample

# one colour per cause, in decision order (the palette's orange and red keep their meaning elsewhere: prefill
# and stalls; grey is unexplained)
CAUSE_COLORS = {"server_error": "#e45756", "network": "#9d755d", "client_lag": "#b279a2", "preemption": "#72b7b2",
                "prefill": "#f58518", "prefill_burst": "#ffbf79", "burst": "#eeca3b", "queueing": "#4c78a8",
                "own_prompt": "#54a24b", "load": "#88d27a", "unknown": "#bab0ac"}
EXTRA_COLORS = ["#17becf", "#bcbd22", "#8c564b", "#e377c2"]  # a cause the palette does not know yet


def lane_points(misses: pl.DataFrame, t0_ns: int) -> pl.DataFrame:
    """One row per miss (a seeded sample above ``MAX_POINTS``): t_s (its intended send, seconds since the run's
    start), cause, seq, class_name, metric, value_ms, limit_ms, evidence, culprits (as text)."""
    cols = [c for c in ("value_ms", "limit_ms") if c in misses.columns]
    points = misses.select(
        (pl.col("t_intended_ns") - t0_ns) / NS_PER_S, "cause", "seq", "class_name",
        pl.col("metric").fill_null(""), *cols, pl.col("evidence").fill_null(""),
        culprits=pl.col("culprits").cast(pl.List(pl.String)).list.join(", ").fill_null(""),
    ).rename({"t_intended_ns": "t_s"}).sort("t_s")
    return sample(points, MAX_POINTS)


def colours(causes: list[str]) -> tuple[list[str], list[str]]:
    """The causes present in decision order, and their colours."""
    known = list(cause_meanings())
    ordered = sorted(set(causes), key=lambda c: (known.index(c) if c in known else len(known), c))
    extra = iter(EXTRA_COLORS * (1 + len(ordered)))
    return ordered, [CAUSE_COLORS.get(c) or next(extra) for c in ordered]


def lane_chart(points: pl.DataFrame, span_s: float) -> alt.TopLevelMixin:
    domain, palette = colours(points["cause"].to_list())
    x = alt.X("t_s:Q", scale=alt.Scale(domain=[0, max(span_s, float(points["t_s"].max() or 0.0))], padding=6),
              title="intended send, seconds since the run's start")
    tooltip = ["seq:Q", "class_name:N", "cause:N", "metric:N", alt.Tooltip("value_ms:Q", format=",.1f"),
               alt.Tooltip("limit_ms:Q", format=",.1f"), "evidence:N", alt.Tooltip("culprits:N", title="culprits")]
    return alt.Chart(points).mark_tick(thickness=2, size=14, opacity=0.8).encode(
        x=x, y=alt.Y("cause:N", sort=domain, title=None),
        color=alt.Color("cause:N", scale=alt.Scale(domain=domain, range=palette), legend=None),
        tooltip=tooltip).properties(width=WIDE, height=max(40, 22 * len(domain)))


def miss_lane(misses: pl.DataFrame | None, t0_ns: int, span_s: float) -> Chart | None:
    """The lane's chart for report.html's "Why requests missed" section; None: no miss (or no ledger)."""
    if misses is None or misses.is_empty():
        return None
    points = lane_points(misses, t0_ns)
    note = ("One mark per request that missed a limit, at its intended send, on its cause's row; hover for the "
            "evidence that decided it.")
    if points.height < misses.height:
        note += f" {points.height:,} of the {misses.height:,} misses shown (a seeded sample)."
    return Chart("miss_lane", "Misses over time, by cause", lane_chart(points, span_s), note)
