"""report.html: one self-contained page (Vega, Vega-Lite and vega-embed inlined from vl-convert-python; no CDN,
no network) and the same charts as PNG files in charts/ for summary.md.

Everything that came from the scenario or the server (names, model, error messages, reasons) is HTML-escaped;
chart specs are embedded as JSON in ``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped, so
no value can close the script element.
"""

from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.report.charts import Chart
from loadgen.report.conversation_report import conversations_html
from loadgen.report.misses_report import misses_html
from loadgen.report.session_report import sessions_html
from loadgen.report.writers import COLS, culprit_words, fmt, rows_of, target_line
from loadgen.core.vocabulary import METRICS
from loadgen.report.fit import legend
from loadgen.analysis.figures import result_line
from loadgen.report.wording import (decision_words, interval_words, margin_words, throughput_words,
                                    value_words)
from loadgen.analysis.result import RunResult

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1040px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:right} th:first-child,td:first-child{text-align:left}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.pass{background:#2e7d32} .fail{background:#c62828} .inconclusive{background:#b26a00}
td.pass,td.fail,td.inconclusive{color:#fff;text-align:center} .note{color:#555;font-size:13px;margin:2px 0 6px}
.meta{color:#555} .finding{color:#b26a00;font-weight:600} td.text{text-align:left} .chart-error{color:#c62828;font-weight:600} ul{margin:4px 0}
"""

RENDER_JS = """(function(){
  var specs = document.querySelectorAll('script[type="application/json"][data-chart]');
  var pending = [];
  specs.forEach(function(node){
    var target = document.getElementById(node.dataset.chart);
    var spec = JSON.parse(node.textContent);
    pending.push(vegaEmbed(target, spec, {renderer: 'svg', actions: false}).then(function(){
      target.dataset.rendered = 'yes';
    }).catch(function(err){
      target.innerHTML = '<p class="chart-error">chart failed to render</p>';
      console.error('chart ' + node.dataset.chart + ': ' + err);
    }));
  });
  Promise.all(pending).then(function(){ document.body.dataset.chartsDone = String(pending.length); });
})();"""


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega + vega-lite + vega-embed as one script (vl-convert ships it; ~0.9 MB), safe to inline."""
    import vl_convert

    return re.sub(r"</(script)", r"<\\/\1", vl_convert.javascript_bundle(), flags=re.IGNORECASE)


def json_for_script(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def slo_table(result: RunResult) -> str:
    if not result.slo:
        return "<p>No SLO objectives in this scenario.</p>"
    rows = []
    for o in result.slo:
        state = {True: "pass", False: "fail", None: "inconclusive"}[o["passed"]]
        rows.append(f"<tr><td><code>{e(o['objective'])}</code></td><td>{e(value_words(dict(o)))}</td>"
                    f"<td>{e(interval_words(dict(o)))}</td>"
                    f"<td>{e(o['comparison'])} {e(fmt(o['threshold']))}</td><td>{e(margin_words(dict(o)))}</td>"
                    f"<td>{e(o['samples'])}</td>"
                    f"<td class=\"{state}\" title=\"{e(o.get('note') or '')}\">{state}</td></tr>")
    words = decision_words(result)
    return ((f"<p class=\"decision\">{e(words)}.</p>" if words else "") +
            "<table id=\"slo\"><tr><th>objective</th><th>value</th><th>interval</th><th>threshold</th>"
            "<th>margin</th><th>samples</th><th>result</th></tr>" + "".join(rows) + "</table>")


def metrics_table(result: RunResult) -> str:
    head = "<tr><th>metric</th><th>unit</th>" + "".join(f"<th>{c}</th>" for c in COLS) + "</tr>"
    body = "".join(f"<tr><td>{row}</td><td>{METRICS[row].unit}</td>"
                   + "".join(f"<td>{e(fmt(result.metrics[row][c]))}</td>" for c in COLS) + "</tr>"
                   for row in rows_of(result))
    shown = legend(rows_of(result))  # the rows that look alike told apart (core/vocabulary.py LOOK_ALIKE)
    return f"<table>{head}{body}</table>" + (f"<p class=\"note\" id=\"legend\">{e(shown)}</p>" if shown else "")


def stalls_section(result: RunResult) -> str:
    st = result.stalls or {}
    if not st:
        return ""
    share = st.get("tail_prefill_induced_share")
    out = [f"<p><b>{e(result.stall_headline)}.</b></p><p>Stalls per 1k output tokens: "
           f"{st['per_1k_tokens']:.2f}, prefill-induced {st['prefill_induced_per_1k_tokens']:.2f}; spike events "
           f"{st['events']}; share of tail gaps (≥ p99) that are prefill-induced: {e(fmt(share))}. A stall is a gap "
           f"above max({st['spike_factor']:g} × the class's median ITL, {st['min_gap_ms']:g} ms); a long prompt "
           f"has ≥ {e(st['long_prompt_tokens'])} tokens.</p>"]
    if st.get("worst_events"):
        out.append("<table><tr><th>at (s)</th><th>victims</th><th>worst gap (ms)</th><th>cause</th>"
                   "<th>culprits (prompt tokens)</th></tr>")
        for ev in st["worst_events"]:
            culprits = culprit_words(ev["culprits"], st)
            out.append(f"<tr><td>{ev['at_s']:.1f}</td><td>{ev['victims']}</td><td>{ev['max_gap_ms']:.0f}</td>"
                       f"<td class=\"text\">{e(ev['cause'])}</td><td class=\"text\">{e(culprits)}</td></tr>")
        out.append("</table>")
    return "<h2>Tail spikes</h2>" + "".join(out)


def header(result: RunResult, name: str, run_name: str) -> str:
    verdict = result.verdict
    req = result.requests
    reasons = "".join(f"<li>{e(r)}</li>" for r in result.reasons)
    return (f"<h1>loadgen: {e(name)} <span class=\"badge {verdict}\" id=\"verdict\">{e(verdict.upper())}</span></h1>"
            f"<p class=\"meta\">run {e(run_name)} · {e(target_line(result.target or {}, str))}</p>"
            + (f"<ul>{reasons}</ul>" if reasons else "")
            + "".join(f"<p class=\"meta\">Note: {e(n)}</p>" for n in result.notes)
            + "".join(f"<p class=\"finding\">Finding: {e(f['summary'])}</p>" for f in result.findings)
            + f"<p>{req['completed']} completed, {req['failed']} failed, {req['cancelled']} cancelled "
              f"(of {e(fmt(req['planned']))} planned); {e(throughput_words(result))} over {result.window_s:.1f} s.</p>"
            + (f"<p id=\"figures\">{e(quoted)}</p>" if (quoted := result_line(result)) else ""))


def chart_section(chart: Chart, level: int = 2) -> str:
    note = f"<p class=\"note\">{e(chart.note)}</p>" if chart.note else ""
    return (f"<section><h{level}>{e(chart.title)}</h{level}>{note}<div id=\"{chart.key}\" class=\"chart\"></div>"
            f"<script type=\"application/json\" data-chart=\"{chart.key}\">{json_for_script(chart.spec())}</script>"
            "</section>")


def page(title: str, body: str) -> str:
    """A self-contained page: the Vega bundle inline, then ``body`` (its charts render after it loads)."""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(title)}</title><style>{CSS}</style><script>{vega_bundle()}</script></head><body>"
            f"{body}<script>{RENDER_JS}</script></body></html>")


def render_page(result: RunResult, name: str, run_name: str, charts: list[Chart], advice_html: str = "",
                misses: pl.DataFrame | None = None, t0_ns: int = 0, miss_lane: Chart | None = None) -> str:
    """The run's page; ``advice_html``: the advice section (``loadgen advise`` wrote advice.json); ``misses``:
    misses.parquet's rows (the worst misses), ``t0_ns`` the run's time origin, ``miss_lane`` their lane chart
    (report/miss_lane.py), all in the "Why requests missed" section."""
    lane_html = chart_section(miss_lane, 3) if miss_lane is not None else ""
    return page(f"loadgen: {name} — {result.verdict}",
                header(result, name, run_name) + "<h2>SLOs</h2>" + slo_table(result)
                + "<h2>Latency</h2>" + metrics_table(result) + conversations_html(result) + sessions_html(result)
                + stalls_section(result) + misses_html(result, misses, t0_ns, lane_html)
                + advice_html
                + "".join(chart_section(c) for c in charts))


def write_pngs(charts: list[Chart], out_dir: Path) -> list[Path]:
    import vl_convert

    out_dir.mkdir(exist_ok=True)
    paths = []
    for c in charts:
        path = out_dir / f"{c.key}.png"
        path.write_bytes(vl_convert.vegalite_to_png(c.spec(), scale=1.5))
        paths.append(path)
    return paths
