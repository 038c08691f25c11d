"""The report's charts (altair / Vega-Lite), built from the tables in ``views.py`` and ``timeline.py``.

Each builder returns an altair chart; ``build_charts`` returns them in page order with a key (the element id in
report.html and the PNG's file name in charts/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl

from loadgen.report import session_lane
from loadgen.report import timeline as tl
from loadgen.report import views as vw

WIDE = 760
LABEL_SEPARATION_PX = 6  # the least space Vega leaves between two tick labels it shows (it hides the others)
PHASE_COLORS = {"waiting": "#c7c7c7", "prefill": "#f58518", "decode": "#4c78a8", "failed": "#e45756"}
STALL_COLOR = "#d62728"
EXCLUDED_COLOR = "#7f7f7f"  # shading: sends outside the measured set (warm-up, drain)
CLASS_COLORS = ["#4c78a8", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b", "#ff9da6", "#bab0ac"]  # no
# orange or red: those mean prefill and stalls


def class_color() -> alt.Color:
    return alt.Color("class_name:N", title="class", scale=alt.Scale(range=CLASS_COLORS),
                     legend=alt.Legend(orient="top"))


@dataclass
class Chart:
    key: str
    title: str
    chart: alt.TopLevelMixin
    note: str = ""

    def spec(self, validate: bool = False) -> dict[str, Any]:
        """The Vega-Lite spec with its data inline (top-level ``datasets``). Schema validation costs ~0.6 s a
        report, so it is left to the tests (``validate=True``)."""
        if validate or self._spec is None:
            chart = self.chart.configure_axis(labelSeparation=LABEL_SEPARATION_PX)  # labels never run together
            with alt.data_transformers.disable_max_rows():  # views.py keeps every table small
                spec = chart.to_dict(validate=validate)
            self._spec = spec
        return self._spec

    _spec: dict[str, Any] | None = None


def _data(frame: pl.DataFrame) -> pl.DataFrame:
    return frame


def ttft_chart(v: vw.RunViews) -> alt.TopLevelMixin:
    pts = vw.ttft_points(v)
    dots = alt.Chart(_data(pts)).mark_circle(size=28, opacity=0.6).encode(
        x=alt.X("prompt_tokens:Q", title="prompt tokens"),
        y=alt.Y("ttft_service_ms:Q", title="TTFT from send (ms)"),
        color=class_color(),
        tooltip=["seq:Q", "class_name:N", "prompt_tokens:Q", alt.Tooltip("ttft_service_ms:Q", format=".1f"),
                 alt.Tooltip("ttft_ms:Q", format=".1f", title="ttft_ms (from intended send)")])
    line = alt.Chart(_data(vw.prefill_line(v))).mark_line(color="black", strokeDash=[6, 3]).encode(
        x="prompt_tokens:Q", y="prefill_ms:Q",
        tooltip=[alt.Tooltip("prompt_tokens:Q", format=".0f"), alt.Tooltip("prefill_ms:Q", format=".1f")])
    return (dots + line).properties(width=WIDE, height=280)


def itl_cdf_chart(v: vw.RunViews) -> alt.TopLevelMixin:
    """The CDF (body) beside the exceedance 1 − CDF on a log axis (tail: p99 at 10⁻², p99.99 at 10⁻⁴)."""
    data = _data(vw.itl_cdf(v))
    x = alt.X("itl_ms:Q", scale=alt.Scale(type="log"), title="per-token ITL (ms, log scale)")
    tooltip = ["class_name:N", alt.Tooltip("p:Q", format=".5f", title="quantile"),
               alt.Tooltip("itl_ms:Q", format=".2f"), "samples:Q"]
    cdf = alt.Chart(data).mark_line(interpolate="step-after").encode(
        x=x, y=alt.Y("p:Q", title="fraction of tokens ≤ x", scale=alt.Scale(domain=[0, 1])),
        color=class_color(), tooltip=tooltip).properties(width=WIDE // 2 - 30, height=240)
    tail = alt.Chart(data).transform_calculate(exceed="1 - datum.p").mark_line(interpolate="step-after").encode(
        x=x, y=alt.Y("exceed:Q", title="fraction of tokens > x (log)", scale=alt.Scale(type="log")),
        color=class_color(), tooltip=tooltip).properties(width=WIDE // 2 - 30, height=240)
    return alt.hconcat(cdf, tail)


def seconds_axis(start_s: float, end_s: float, width_px: int = WIDE) -> alt.Axis:
    """An axis of seconds over [start_s, end_s]: about one tick per 70 px, with as many decimals as the tick
    step needs (a 6-s window: 0.5-s steps, ".1f"; a 0.3-s one: 0.02-s steps, ".2f"), so its labels never run
    together. The step is the one Vega picks (d3's ticks: 1, 2 or 5 × a power of ten)."""
    count = max(2, width_px // 70)
    raw_s = (end_s - start_s) / count if end_s > start_s else 1.0
    power = 10.0 ** math.floor(math.log10(raw_s))
    ratio = raw_s / power
    step_s = power * (10 if ratio >= 7.07 else 5 if ratio >= 3.16 else 2 if ratio >= 1.41 else 1)
    decimals = min(3, max(0, -math.floor(math.log10(step_s) + 1e-9)))
    return alt.Axis(format=f".{decimals}f", tickCount=count, labelOverlap="greedy", labelFlush=False)


def timeline_chart(v: vw.RunViews, window: tl.Window) -> alt.TopLevelMixin:
    bars = tl.phases(v, window)
    marks, links = tl.stall_marks(v, window)
    x_scale = alt.Scale(domain=[window.start_s, window.end_s], nice=False)
    order = alt.Y("row:N", sort=alt.EncodingSortField("order", op="min"), title=None,
                  axis=alt.Axis(labelLimit=220))
    height = max(120, 14 * bars["seq"].n_unique())
    base = alt.Chart(_data(bars)).mark_bar(height=10, clip=True).encode(
        x=alt.X("start_s:Q", scale=x_scale, title="seconds since the run's start",
                axis=seconds_axis(window.start_s, window.end_s)), x2="end_s:Q", y=order,
        color=alt.Color("phase:N", scale=alt.Scale(domain=list(PHASE_COLORS), range=list(PHASE_COLORS.values())),
                        title="phase", legend=alt.Legend(orient="top")),
        tooltip=["seq:Q", "phase:N", "prompt_tokens:Q", alt.Tooltip("start_s:Q", format=".3f"),
                 alt.Tooltip("end_s:Q", format=".3f"), "error_kind:N"])
    layers: list[Any] = [*excluded_layer(v, x_scale, window.start_s, window.end_s), base]
    if marks.height:
        layers.append(alt.Chart(_data(marks)).mark_bar(height=4, color=STALL_COLOR, clip=True, stroke="white", strokeWidth=0.6).encode(
            x=alt.X("t_start_s:Q", scale=x_scale), x2="t_end_s:Q", y=order,
            tooltip=["seq:Q", alt.Tooltip("chunk_gap_ms:Q", format=".1f", title="gap (ms)"), "cause:N",
                     alt.Tooltip("culprits:N", title="culprits (seq)")]))
    if links.height:
        layers.append(alt.Chart(_data(links)).mark_rule(color=STALL_COLOR, strokeDash=[3, 2], opacity=0.8, clip=True).encode(
            x=alt.X("t_end_s:Q", scale=x_scale), y=order, y2="culprit_row:N",
            tooltip=[alt.Tooltip("seq:Q", title="victim"), alt.Tooltip("culprit:Q", title="culprit")]))
    return alt.layer(*layers).properties(width=WIDE, height=height)


def excluded_layer(v: vw.RunViews, x_scale: alt.Scale, start_s: float, end_s: float) -> list[alt.Chart]:
    """Grey shading over the stretches whose requests no figure counts (declared warm-up, detected warm-up
    and drain: timeline.excluded_spans); none when every request counts."""
    spans = tl.excluded_spans(v, start_s, end_s)
    if spans.is_empty():
        return []
    return [alt.Chart(_data(spans)).mark_rect(color=EXCLUDED_COLOR, opacity=0.18, clip=True).encode(
        x=alt.X("start_s:Q", scale=x_scale), x2="end_s:Q",
        tooltip=[alt.Tooltip("what:N", title="not counted"), alt.Tooltip("requests:Q", title="requests sent"),
                 alt.Tooltip("start_s:Q", format=".2f"), alt.Tooltip("end_s:Q", format=".2f")])]


def itl_time_chart(v: vw.RunViews) -> alt.TopLevelMixin:
    bw = vw.bin_width_s(v.span_s)
    x = alt.X("t_s:Q", scale=alt.Scale(domain=[0, v.span_s]), title="seconds since the run's start")
    itl = alt.Chart(_data(vw.itl_over_time(v, bw))).mark_line(strokeWidth=1.2, clip=True, point=alt.OverlayMarkDef(size=8)).encode(
        x=x, y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="ms (log)"),
        color=alt.Color("series:N", title=f"per {bw:g} s bin", legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=["median ITL", "worst chunk gap"], range=["#4c78a8", STALL_COLOR])),
        tooltip=[alt.Tooltip("t_s:Q", format=".2f"), "series:N", alt.Tooltip("ms:Q", format=".2f")],
    ).properties(width=WIDE, height=220)
    itl = alt.layer(*excluded_layer(v, alt.Scale(domain=[0, v.span_s]), 0.0, v.span_s), itl)
    pre = alt.Chart(_data(vw.prefill_tokens_over_time(v, bw))).mark_area(color="#f58518", opacity=0.7, clip=True, interpolate="step-after").encode(
        x=x, y=alt.Y("prefill_tokens:Q", title="prefill tokens"),
        tooltip=[alt.Tooltip("t_s:Q", format=".2f"), "prefill_tokens:Q"],
    ).properties(width=WIDE, height=110)
    return alt.vconcat(itl, pre, *server_panels(v, x), spacing=6).resolve_scale(color="independent")


def server_panels(v: vw.RunViews, x: alt.X) -> list[alt.TopLevelMixin]:
    """The server's own series (its /metrics, when scraped): requests running / waiting, then KV-cache usage
    with a red rule at every scrape interval in which the server preempted."""
    queues, kv = vw.server_queues(v), vw.server_kv(v)
    panels: list[alt.TopLevelMixin] = []
    if queues.height:
        panels.append(alt.Chart(_data(queues)).mark_line(interpolate="step-after", clip=True).encode(
            x=x, y=alt.Y("requests:Q", title="server requests"),
            color=alt.Color("series:N", title="server /metrics", legend=alt.Legend(orient="right"),
                            scale=alt.Scale(domain=["requests running", "requests waiting"],
                                            range=["#54a24b", "#9d755d"])),
            tooltip=[alt.Tooltip("t_s:Q", format=".2f"), "series:N", "requests:Q"],
        ).properties(width=WIDE, height=110))
    if kv.height:
        line = alt.Chart(_data(kv)).mark_line(color="#72b7b2", interpolate="step-after", clip=True).encode(
            x=x, y=alt.Y("kv_cache_pct:Q", title="KV cache %", scale=alt.Scale(domain=[0, 100])),
            tooltip=[alt.Tooltip("t_s:Q", format=".2f"), alt.Tooltip("kv_cache_pct:Q", format=".1f")])
        rules = alt.Chart(_data(kv.filter(pl.col("preemptions") > 0))).mark_rule(color=STALL_COLOR, clip=True).encode(
            x=x, tooltip=[alt.Tooltip("t_s:Q", format=".2f"), alt.Tooltip("preemptions:Q", title="preemptions")])
        panels.append((line + rules).properties(width=WIDE, height=90))
    return panels


def throughput_chart(v: vw.RunViews) -> alt.TopLevelMixin:
    bw = max(vw.bin_width_s(v.span_s, bins=150), 0.25)
    data = _data(vw.throughput_over_time(v, bw))
    x = alt.X("t_s:Q", scale=alt.Scale(domain=[0, v.span_s]), title="seconds since the run's start")
    tokens = alt.Chart(data).mark_line(color="#4c78a8", clip=True).encode(
        x=x, y=alt.Y("output_tokens_per_s:Q", title="output tokens/s"),
        tooltip=[alt.Tooltip("t_s:Q", format=".2f"), alt.Tooltip("output_tokens_per_s:Q", format=".0f"),
                 alt.Tooltip("completed_per_s:Q", format=".2f")]).properties(width=WIDE, height=160)
    in_flight = alt.Chart(data).mark_line(color="#54a24b", interpolate="step-after", clip=True).encode(
        x=x, y=alt.Y("in_flight:Q", title="requests in flight"),
        tooltip=[alt.Tooltip("t_s:Q", format=".2f"), "in_flight:Q"]).properties(width=WIDE, height=110)
    return alt.vconcat(tokens, in_flight, spacing=6)


def lengths_chart(v: vw.RunViews) -> alt.TopLevelMixin:
    table = vw.lengths(v)
    panels = []
    for kind in ("prompt", "output"):
        part = table.filter(pl.col("kind") == kind)
        hi = float(max(part["asked"].max() or 1, part["achieved"].max() or 1))  # type: ignore[type-var]
        diag = alt.Chart(_data(pl.DataFrame({"asked": [0.0, hi], "achieved": [0.0, hi]}))).mark_line(
            color="#999", strokeDash=[4, 3]).encode(x="asked:Q", y="achieved:Q")
        dots = alt.Chart(_data(part)).mark_circle(opacity=0.7).encode(
            x=alt.X("asked:Q", title=f"{kind} tokens asked"), y=alt.Y("achieved:Q", title=f"{kind} tokens achieved"),
            size=alt.Size("requests:Q", legend=None, scale=alt.Scale(range=[20, 160])), color=class_color(),
            tooltip=["class_name:N", "asked:Q", "achieved:Q", "requests:Q"])
        panels.append((diag + dots).properties(width=WIDE // 2 - 40, height=220))
    return alt.hconcat(*panels)


def excluded_note(v: vw.RunViews, start_s: float, end_s: float) -> str:
    """The chart's note on its grey shading (none where nothing is shaded between start_s and end_s)."""
    spans = tl.excluded_spans(v, start_s, end_s)
    if spans.is_empty():
        return ""
    parts = ", ".join(f"{w} ({n} requests)" for w, n in spans.select("what", "requests").iter_rows())
    return f" Grey: sends that no figure counts: {parts} (docs/verdicts.md, Steady state)."


def build_charts(v: vw.RunViews, window: tl.Window) -> list[Chart]:
    """The page's charts; the session lane last, in a run with agentic sessions (``session_lane.py``)."""
    lane = session_lane.build_lane(v.requests, v.stalls)
    if lane is None:
        return _run_charts(v, window)
    title = f"Session lane: session {lane.session} ({lane.class_name}), the slowest"
    return [*_run_charts(v, window), Chart("session_lane", title, session_lane.lane_chart(lane), lane.caption)]


def _run_charts(v: vw.RunViews, window: tl.Window) -> list[Chart]:
    fit = (v.result.stalls or {}).get("prefill_fit") or {}
    return [
        Chart("ttft_vs_prompt", "TTFT vs prompt tokens", ttft_chart(v),
              f"Dashed: the fitted prefill time (lower envelope), {fit.get('a_ms', 0):.2f} ms + "
              f"{fit.get('b_ms_per_token', 0) * 1e3:.3f} µs/token · P + {fit.get('c_ms_per_token2', 0) * 1e6:.4f} "
              "ns/token² · P². Points above it waited in a queue or shared steps with other prefills."),
        Chart("itl_cdf", "ITL distribution per class", itl_cdf_chart(v),
              "Per-token inter-token latency; a long flat top is the tail of stalls."),
        Chart("timeline", "Request timeline", timeline_chart(v, window),
              f"Window: {window.why}. Red bars: stalls; dashed red lines link a stall to the long prompt whose "
              "prefill caused it." + excluded_note(v, window.start_s, window.end_s)),
        Chart("itl_over_time", "ITL over time, with prefill load underneath", itl_time_chart(v),
              "Red spikes (the worst chunk gap) that line up with an orange peak are prefills admitted into "
              "the running batch." + (" Below, the server's own /metrics: requests running and waiting, KV-cache "
                                      "usage, and a red rule wherever it preempted a request (a stall there is "
                                      "labelled preemption, not prefill)." if v.server is not None else "")
              + excluded_note(v, 0.0, v.span_s)),
        Chart("throughput", "Throughput and requests in flight", throughput_chart(v)),
        Chart("lengths", "Asked vs achieved lengths", lengths_chart(v),
              "On the dashed diagonal, the server processed exactly the asked length."),
    ]
