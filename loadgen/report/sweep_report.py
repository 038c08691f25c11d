"""A sweep's report: sweep.html (throughput and goodput, latency percentiles with the SLO lines, stalls — each
against the load, with the capacity interval, the knee and the saturation point marked), summary.md, junit.xml
(one test case per step, one for the capacity) and the console table. Built from ``SweepResult`` only."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import altair as alt
import polars as pl

from loadgen.core.vocabulary import ObjectiveId
from loadgen.analysis.sweep_result import SweepResult, final_steps, undecided_text
from loadgen.report.charts import WIDE, Chart
from loadgen.report.html import chart_section, e, page
from loadgen.report.sweep_curves import curve_charts, curve_lines
from loadgen.report.writers import fmt, md_escape

LATENCY = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"))
CALL_CLASS = {"pass": "pass", "fail": "fail", "undecided": "inconclusive"}


def load_domain(r: SweepResult) -> list[float]:
    """The tested loads ± half the smallest step between them (± half the load for a single one): the axis
    starts near the lightest load, not at 0, and no point sits on its edge."""
    loads = sorted({s.load for s in r.steps}) or [1.0]
    half = min((b - a for a, b in zip(loads, loads[1:])), default=loads[0] or 1.0) / 2
    return [max(loads[0] - half, 0.0), loads[-1] + half]


def _x(r: SweepResult) -> alt.X:
    """The load axis: ticks at the tested loads (each step a label), over ``load_domain``."""
    return alt.X("load:Q", title="offered load (requests/s)" if r.mode == "rate" else "concurrent users",
                 scale=alt.Scale(zero=False, nice=False, domain=load_domain(r)),
                 axis=alt.Axis(values=sorted({s.load for s in r.steps}), format="~g", labelOverlap="greedy"))


def _marks(r: SweepResult) -> list[alt.TopLevelMixin]:
    """The capacity interval as a band; the knee and the saturation point as labelled rules."""
    out: list[alt.TopLevelMixin] = []
    cap = r.capacity
    if cap.low is not None and cap.high is not None:
        band = pl.DataFrame({"low": [cap.low], "high": [cap.high]})
        out.append(alt.Chart(band).mark_rect(opacity=0.15, color="#2e7d32").encode(x="low:Q", x2="high:Q"))
    points = [(label, value) for label, value in (("knee", r.knee), ("saturation", r.saturation)) if value]
    if points:
        rules = pl.DataFrame({"mark": [p[0] for p in points], "load": [float(p[1]) for p in points]})
        base = alt.Chart(rules)
        out.append(base.mark_rule(strokeDash=[4, 3], color="#555").encode(x="load:Q"))
        out.append(base.mark_text(align="left", dx=3, dy=-4, baseline="top", color="#555").encode(
            x="load:Q", y=alt.value(2), text="mark:N"))
    return out


def _layer(r: SweepResult, main: alt.TopLevelMixin) -> alt.TopLevelMixin:
    return alt.layer(*_marks(r), main).properties(width=WIDE, height=240)


SERIES = {  # name → (stroke dash, point shape, label offset in px): lines that coincide stay told apart
    "completed req/s": ([1, 0], "circle", -8), "goodput req/s": ([6, 3], "triangle-down", 9),
    "offered req/s": ([2, 2], "square", 0)}


def throughput_chart(r: SweepResult) -> alt.TopLevelMixin:
    """Completed, goodput and offered requests/s against the load: each its own dash, point shape and a label
    after its last point (goodput equals completed wherever every request met the SLOs)."""
    rows = [{"load": s.load, "series": name, "per_s": value} for s in final_steps(r.steps)
            for name, value in (("completed req/s", s.requests_per_s), ("goodput req/s", s.goodput_requests_per_s),
                                ("offered req/s", s.offered_per_s)) if value is not None]
    frame = pl.DataFrame(rows, schema={"load": pl.Float64, "series": pl.Utf8, "per_s": pl.Float64})
    names = list(SERIES)
    color = alt.Color("series:N", scale=alt.Scale(domain=names), legend=alt.Legend(orient="top"))
    y = alt.Y("per_s:Q", title="requests/s")
    tooltip = ["load:Q", "series:N", alt.Tooltip("per_s:Q", format=".2f")]
    lines = alt.Chart(frame).mark_line().encode(
        x=_x(r), y=y, color=color, strokeDash=alt.StrokeDash(
            "series:N", scale=alt.Scale(domain=names, range=[v[0] for v in SERIES.values()]), legend=None))
    points = alt.Chart(frame).mark_point(filled=True, size=50).encode(
        x=_x(r), y=y, color=color, tooltip=tooltip, shape=alt.Shape(
            "series:N", scale=alt.Scale(domain=names, range=[v[1] for v in SERIES.values()]), legend=None))
    last = frame.sort("load").group_by("series", maintain_order=True).last()
    labels = [alt.Chart(last.filter(pl.col("series") == name)).mark_text(align="left", dx=7, dy=dy).encode(
        x=_x(r), y=y, text="series:N", color=color) for name, (_, _, dy) in SERIES.items()
        if name in last["series"].to_list()]
    return _layer(r, alt.layer(lines, points, *labels))


def latency_chart(r: SweepResult, metric: str, label: str) -> alt.TopLevelMixin:
    rows = [{"load": s.load, "stat": stat, "ms": s.metrics.get(metric, {}).get(stat)}
            for s in final_steps(r.steps) for stat in ("p50", "p90", "p99")]
    frame = pl.DataFrame([x for x in rows if x["ms"] is not None],
                         schema={"load": pl.Float64, "stat": pl.Utf8, "ms": pl.Float64})
    lines = alt.Chart(frame).mark_line(point=True).encode(
        x=_x(r), y=alt.Y("ms:Q", title=f"{label} (ms)", scale=alt.Scale(type="log")),
        color=alt.Color("stat:N", legend=alt.Legend(orient="top")), tooltip=["load:Q", "stat:N", "ms:Q"])
    limits = slo_lines(r, metric)
    if limits.height:
        rule = alt.Chart(limits).encode(y="ms:Q", tooltip=["objective:N", "ms:Q"])
        rules = rule.mark_rule(color="#c62828", strokeDash=[6, 3])
        names = rule.mark_text(color="#c62828", align="left", baseline="bottom", dy=-3).encode(
            x=alt.value(4), text="label:N")
        return _layer(r, alt.layer(lines, rules, names))
    return _layer(r, lines)


def slo_lines(r: SweepResult, metric: str) -> pl.DataFrame:
    """The metric's limits over every request (no scope), each with its label: ``ttft_ms.p99 ≤ 500 ms``."""
    seen = {o["objective"]: (o["threshold"], SIGNS.get(o.get("comparison", "<="), o.get("comparison", "")))
            for s in r.steps for o in s.objectives if ObjectiveId.of(o) == ObjectiveId(metric, ObjectiveId.of(o).stat)}
    return pl.DataFrame({"objective": list(seen), "ms": [float(v) for v, _ in seen.values()],
                         "label": [f"{name} {sign} {fmt(v)} ms" for name, (v, sign) in seen.items()]},
                        schema={"objective": pl.Utf8, "ms": pl.Float64, "label": pl.Utf8})


SIGNS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}


def stalls_chart(r: SweepResult) -> alt.TopLevelMixin:
    rows = [{"load": s.load, "series": name, "per_1k": value} for s in final_steps(r.steps)
            for name, value in (("stalls", s.stalls_per_1k_tokens),
                                ("prefill-induced", s.prefill_induced_per_1k_tokens)) if value is not None]
    frame = pl.DataFrame(rows, schema={"load": pl.Float64, "series": pl.Utf8, "per_1k": pl.Float64})
    lines = alt.Chart(frame).mark_line(point=True).encode(
        x=_x(r), y=alt.Y("per_1k:Q", title="per 1k output tokens"),
        color=alt.Color("series:N", legend=alt.Legend(orient="top")), tooltip=["load:Q", "series:N", "per_1k:Q"])
    return _layer(r, lines)


LOAD_KEYS = ("load", "concurrency", "rate")


def _load_of(entry: Any) -> float | None:
    """A ``pareto`` entry's load: the entry itself, or its first of LOAD_KEYS (None: no load to draw)."""
    if not isinstance(entry, dict):
        return float(entry) if isinstance(entry, (int, float)) else None
    return next((float(entry[k]) for k in LOAD_KEYS if isinstance(entry.get(k), (int, float))), None)


def pareto_frame(r: SweepResult, pareto: list[Any]) -> pl.DataFrame:
    """Every step with a TPOT p90 and output tokens/s: tokens/s per user (MLPerf: 1000 / TPOT p90) against
    output tokens/s, and whether it is on sweep.json's ``pareto`` (its loads, or dicts with ``load`` (or
    ``concurrency``, ``rate``) and optionally the two figures, which then win over the step's)."""
    front = {load: p for p in pareto if (load := _load_of(p)) is not None}
    rows = []
    for s in final_steps(r.steps):
        given = front.get(s.load) if isinstance(front.get(s.load), dict) else {}
        tpot = s.metrics.get("tpot_ms", {}).get("p90")
        per_user = given.get("tokens_per_s_per_user") or (1000.0 / tpot if tpot else None)
        total = given.get("output_tokens_per_s") or s.output_tokens_per_s
        if per_user is not None and total is not None:
            rows.append({"load": s.load, "per_user": float(per_user), "output_per_s": float(total),
                         "set": "Pareto front" if s.load in front else "dominated", "label": f"{s.load:g} {r.unit}"})
    return pl.DataFrame(rows, schema={"load": pl.Float64, "per_user": pl.Float64, "output_per_s": pl.Float64,
                                      "set": pl.Utf8, "label": pl.Utf8})


def pareto_chart(frame: pl.DataFrame) -> alt.TopLevelMixin:
    x = alt.X("per_user:Q", title="tokens/s per user (1000 / TPOT p90)", scale=alt.Scale(zero=False))
    y = alt.Y("output_per_s:Q", title="output tokens/s", scale=alt.Scale(zero=False))
    color = alt.Color("set:N", title=None, scale=alt.Scale(domain=["Pareto front", "dominated"],
                                                         range=["#4c78a8", "#bbbbbb"]), legend=alt.Legend(orient="top"))
    tooltip = ["label:N", alt.Tooltip("per_user:Q", format=".1f"), alt.Tooltip("output_per_s:Q", format=".0f"), "set:N"]
    on_front = frame.filter(pl.col("set") == "Pareto front").sort("per_user")
    front = alt.Chart(on_front).mark_line().encode(x=x, y=y, order="per_user:Q", color=color)
    dots = alt.Chart(frame).mark_point(filled=True, size=60).encode(x=x, y=y, color=color, tooltip=tooltip)
    names = alt.Chart(frame).mark_text(align="left", dx=6, dy=-6, color="#444").encode(x=x, y=y, text="label:N")
    layers = [front] if on_front.height >= 2 else []  # one step on the front: a point, no line to draw
    return alt.layer(*layers, dots, names).properties(width=WIDE, height=260)


def sweep_charts(r: SweepResult, pareto: list[Any] | None = None) -> list[Chart]:
    charts = [Chart("throughput", "Throughput and goodput vs load", throughput_chart(r),
                    "The green band is the capacity interval; dashed rules mark the knee and saturation. Goodput "
                    "(dashed, triangles) counts the requests that met every SLO: it lies on completed (solid, "
                    "circles) wherever none missed.")]
    charts += [Chart(f"latency_{m}", f"{label} percentiles vs load", latency_chart(r, m, label),
                     "Red dashed lines: the scenario's SLO limits, each named.") for m, label in LATENCY]
    charts.append(Chart("stalls", "Stalls per 1k output tokens vs load", stalls_chart(r)))
    charts += curve_charts(r)
    frame = pareto_frame(r, pareto or [])
    if pareto and (frame["set"] == "Pareto front").any():
        charts.append(Chart("pareto", "Pareto front: tokens/s per user vs output tokens/s", pareto_chart(frame),
                            "Each point a load; on the line, the loads no other load beats on both figures "
                            "(MLPerf's interactivity against throughput)."))
    return charts


def points_text(r: SweepResult) -> str:
    """The knee and the saturation point in words: never a bare None."""
    knee = f"knee at {r.knee:g} {r.unit}" if r.knee is not None else "no knee"
    sat = f"saturated from {r.saturation:g} {r.unit}" if r.saturation is not None else "not saturated"
    return f"{knee}, {sat}"


def headline(r: SweepResult) -> str:
    cap = r.capacity.text(r.unit)
    extra = f"; attainment capacity {r.attainment_capacity.text(r.unit)}" if r.attainment_capacity else ""
    return f"capacity {cap}{extra}"


def steps_table_rows(r: SweepResult) -> list[list[str]]:
    rows = []
    for s in r.steps:
        m = s.metrics
        call = s.call + (", saturated" if s.saturated else "") + \
            (f" ({'; '.join(s.undecided_reasons())})" if s.call == "undecided" else "")
        rows.append([f"{s.load:g}" + (" (again)" if s.attempt > 1 else ""), f"{s.duration_s:g}", call,
                     fmt(s.requests_per_s), fmt(s.goodput_requests_per_s),
                     fmt(m.get("ttft_ms", {}).get("p99")), fmt(m.get("itl_ms", {}).get("p99")),
                     fmt(m.get("tpot_ms", {}).get("p99")), fmt(s.stalls_per_1k_tokens), s.run_dir])
    return rows


STEP_HEAD = ["load", "seconds", "call", "done req/s", "goodput req/s", "TTFT p99", "ITL p99", "TPOT p99", "stalls/1k",
             "run"]


def render_html(r: SweepResult, pareto: list[Any] | None = None) -> str:
    """``pareto``: sweep.json's list of steps on the Pareto front (default: ``r.pareto`` when the result has
    one); no Pareto chart without it."""
    pareto = pareto if pareto is not None else getattr(r, "pareto", None)
    code = {0: "pass", 1: "fail", 3: "inconclusive"}.get(r.exit_code, "inconclusive")
    head = "".join(f"<th>{h}</th>" for h in STEP_HEAD)
    body = []
    for s, row in zip(r.steps, steps_table_rows(r)):
        cells = [f"<td>{e(row[0])}</td>", f"<td>{e(row[1])}</td>",
                 f"<td class=\"{CALL_CLASS[s.call]}\">{e(row[2])}</td>"]
        cells += [f"<td>{e(v)}</td>" for v in row[3:-1]]
        cells.append(f"<td class=\"text\"><a href=\"{e(row[-1])}/report.html\">{e(row[-1])}</a></td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    reasons = "".join(f"<li>{e(x)}</li>" for x in r.reasons)
    top = (f"<h1>loadgen sweep: {e(r.name)} <span class=\"badge {code}\" id=\"verdict\">{e(headline(r))}</span>"
           f"</h1><p class=\"meta\">{len(r.steps)} steps in {r.wall_s:.0f} s; each objective judged at "
           f"{r.confidence:.0%} confidence; {e(points_text(r))}; "
           f"stopped: {e(r.stop_reason)}</p>" + (f"<ul>{reasons}</ul>" if reasons else ""))
    curves = "".join(f"<li>{e(x)}</li>" for x in curve_lines(r))
    top += f"<h2>Capacity curves</h2><ul id=\"curves\">{curves}</ul>" if curves else ""
    table = f"<h2>Steps</h2><table id=\"steps\"><tr>{head}</tr>{''.join(body)}</table>"
    return page(f"loadgen sweep: {r.name}", top + table + "".join(chart_section(c) for c in sweep_charts(r, pareto)))


def summary_markdown(r: SweepResult) -> str:
    lines = [f"# loadgen sweep: {md_escape(r.name)}", "", f"**{md_escape(headline(r))}** (exit {r.exit_code})", ""]
    lines += [f"- {md_escape(x)}" for x in r.reasons]
    lines += [f"- {md_escape(points_text(r))}; stopped: {md_escape(r.stop_reason)}"]
    lines += [f"- curve: {md_escape(x)}" for x in curve_lines(r)]
    lines += ["",
              "| " + " | ".join(STEP_HEAD) + " |", "|" + "---|" * len(STEP_HEAD)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in steps_table_rows(r)]
    return "\n".join(lines) + "\n"


def junit_xml(r: SweepResult) -> bytes:
    """One test case per step (failure: an objective failed with confidence; skipped: undecided) and one for the
    capacity against --require."""
    suite = ET.Element("testsuite", name=f"loadgen.sweep.{r.name}", tests=str(len(r.steps) + 1),
                       failures=str(sum(s.call == "fail" for s in r.steps) + (r.exit_code == 1)), errors="0",
                       skipped=str(sum(s.call == "undecided" for s in r.steps) + (r.exit_code == 3)),
                       time=f"{r.wall_s:.3f}")
    for s in r.steps:
        case = ET.SubElement(suite, "testcase", classname=f"loadgen.sweep.{r.name}.step",
                             name=f"{s.load:g} {r.unit}" + (" (again)" if s.attempt > 1 else ""),
                             time=f"{s.wall_s:.3f}")
        bad = [_objective_text(o) if o["call"] == "fail" else undecided_text(o) for o in s.objectives
               if o["call"] != "pass"]
        if s.call == "fail":
            ET.SubElement(case, "failure", message="; ".join(bad) or "saturated", type="SLOViolation").text = \
                "\n".join(bad)
        elif s.call == "undecided":
            ET.SubElement(case, "skipped", message="undecided: " + "; ".join(bad))
    case = ET.SubElement(suite, "testcase", classname=f"loadgen.sweep.{r.name}", name="capacity", time="0")
    if r.exit_code == 1:
        ET.SubElement(case, "failure", message=headline(r), type="CapacityBelowRequirement").text = \
            "\n".join(r.reasons)
    elif r.exit_code == 3:
        ET.SubElement(case, "skipped", message="; ".join(r.reasons) or "undecided")
    root = ET.Element("testsuites", name="loadgen", time=f"{r.wall_s:.3f}")
    root.append(suite)
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")


def _objective_text(o: dict[str, Any]) -> str:
    ci = f" [{fmt(o['ci_low'])}, {fmt(o['ci_high'])}]" if o.get("ci_low") is not None else ""
    return f"{o['objective']} = {fmt(o['value'])}{ci} {o['call']} (limit {o['comparison']} {fmt(o['threshold'])})"
