"""The Locust web UI's LLM tab: its table rows (exact percentiles, SLOs and stalls recomputed from the raw
records, not Locust's rounded histogram; the verdict and the requests counted), the live TTFT/ITL series over
time and their Vega-Lite chart, and the page-side script that shows the verdict, the run directory, the link
to report.html and the chart under the table. Pure: records or a RunResult in, rows and data out."""

from __future__ import annotations

from typing import Any

from loadgen.analysis.result import RunResult
from loadgen.plan.scenario import Scenario

LLM_TAB = {"title": "LLM", "key": "llm"}
LLM_TABLE = {"key": "llm", "structure": [
    {"key": "name", "title": "metric / objective"}, {"key": "cls", "title": "class"},
    {"key": "count", "title": "samples"}, {"key": "p50", "title": "p50 (ms)"}, {"key": "p90", "title": "p90 (ms)"},
    {"key": "p99", "title": "p99 (ms)"}, {"key": "max", "title": "max (ms)"}, {"key": "note", "title": "result"}]}
SERIES_BUCKET_S = 2.0  # one point per 2 s of the run, per series
_BLANK = {"cls": "all", "p50": "", "p90": "", "p99": "", "max": ""}


def live_rows(scenario: Scenario, records: list[Any], planned: int | None) -> list[dict[str, Any]]:
    """The LLM tab's rows while the run goes on: the records so far summarised as a finished run would be."""
    from loadgen.analysis.summary import summarize
    from loadgen.records.schema import chunks_frame, requests_frame

    requests = requests_frame([r for r, _ in records])
    chunks = chunks_frame([c for _, cs in records for c in cs])
    summary, _ = summarize(scenario, requests, chunks, planned, ledger=False)  # the tab shows no causes
    return result_rows(RunResult.from_dict(summary), final=False)


def result_rows(result: RunResult, final: bool) -> list[dict[str, Any]]:
    """The rows of a result: the run's (``final``: its summary.json) or the records so far."""
    counts = result.requests
    verdict = result.verdict.upper() if final else f"running: {result.verdict} so far"
    rows = [{"name": "(run) verdict", **_BLANK, "count": counts["completed"], "note": verdict},
            {"name": "(run) requests", **_BLANK, "count": counts["completed"],
             "note": f"{counts['completed']} completed of {counts['planned']} planned; {counts['failed']} failed, "
                     f"{counts['cancelled']} cancelled"}]  # Locust's table sorts by name: "(run)" comes first
    classes = list(result.classes.items())
    blocks = [("all", result.metrics), *((c, b["metrics"]) for c, b in (classes if len(classes) > 1 else []))]
    for cls, metrics in blocks:
        for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            m = metrics[name]
            rows.append({"name": f"latency · {name}", "cls": cls, "count": m["count"],
                         **{k: _ms(m[k]) for k in ("p50", "p90", "p99", "max")}, "note": ""})  # type: ignore
    for o in result.slo:
        state = {True: "pass", False: "FAIL", None: "inconclusive"}[o["passed"]]
        rows.append({"name": f"slo · {o['objective']}", **_BLANK, "count": o["samples"],
                     "note": f"{state}: {_ms(o['value'])} {o['comparison']} {o['threshold']}"})
    st = result.stalls
    rows.append({"name": "stalls", **_BLANK, "count": st["count"], "max": _ms(st.get("worst_gap_ms")),
                 "note": f"{st['prefill_induced']} prefill-induced; {st['per_1k_tokens']:.2f} per 1k tokens"})
    return rows


def live_series(records: list[Any], bucket_s: float = SERIES_BUCKET_S) -> list[dict[str, Any]]:
    """TTFT and ITL p50/p99 per ``bucket_s`` of the run (by completion), for the tab's chart: TTFT from the
    intended time (as ``ttft_ms``), ITL as each chunk's gap over its tokens (as ``itl_ms``); measured,
    successful requests only. Points: ``{"t_s", "series", "ms"}``."""
    import polars as pl

    from loadgen.records.schema import chunks_frame, requests_frame

    req = requests_frame([r for r, _ in records]).filter(
        pl.col("error_kind").is_null() & ~pl.col("warmup") & pl.col("t_first_token_ns").is_not_null())
    if req.is_empty():
        return []
    t0_ns = req["t_intended_ns"].min()
    ttft = req.select(t_s=((pl.col("t_done_ns") - t0_ns) / 1e9 // bucket_s) * bucket_s,
                      ms=(pl.col("t_first_token_ns") - pl.col("t_intended_ns")) / 1e6)
    chunks = chunks_frame([c for _, cs in records for c in cs]).join(req.select("seq"), on="seq").sort("seq", "t_ns")
    itl = chunks.with_columns(gap=pl.col("t_ns").diff().over("seq")).filter(
        pl.col("gap").is_not_null() & (pl.col("tokens") > 0)).select(
        t_s=((pl.col("t_ns") - t0_ns) / 1e9 // bucket_s) * bucket_s, ms=pl.col("gap") / pl.col("tokens") / 1e6)
    points = []
    for name, frame in (("TTFT", ttft), ("ITL", itl)):
        agg = frame.group_by("t_s").agg(p50=pl.col("ms").quantile(0.5, "linear"),
                                        p99=pl.col("ms").quantile(0.99, "linear")).sort("t_s")
        for row in agg.iter_rows(named=True):
            points += [{"t_s": row["t_s"], "series": f"{name} {q}", "ms": round(row[q], 3)} for q in ("p50", "p99")]
    return points


def chart_spec() -> dict[str, Any]:
    """Vega-Lite: TTFT and ITL p50/p99 over the run, one panel each (their scales differ by ~10x)."""
    return {"facet": {"row": {"field": "metric", "type": "nominal", "title": None}},
            "resolve": {"scale": {"y": "independent"}},
            "transform": [{"calculate": "split(datum.series, ' ')[0]", "as": "metric"}],
            "spec": {"width": 900, "height": 160, "mark": {"type": "line", "point": True},
                     "encoding": {"x": {"field": "t_s", "type": "quantitative", "title": "time into the run (s)"},
                                  "y": {"field": "ms", "type": "quantitative", "title": "ms"},
                                  "color": {"field": "series", "type": "nominal", "title": None},
                                  "tooltip": [{"field": "series"}, {"field": "t_s"}, {"field": "ms"}]}}}


def load_note(scenario: Scenario, users: int) -> str:
    """What Locust's users mean for this scenario (shown in the tab)."""
    load = scenario.load
    if load.concurrency:
        return (f"closed loop: each Locust user keeps one request in flight, so the start form's users are the "
                f"concurrency (the scenario's: {load.concurrency}); ramp-up starts them that many per second")
    return (f"open loop: the plan sets the pace ({load.arrival}, {load.rate_per_s} req/s); Locust's users only carry "
            f"its requests ({users}, enough never to hold one back), so the start form asks for no users or ramp-up")


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


# The page side: under Locust's LLM tab (``?tab=llm``), the verdict, the run directory, the link to report.html
# and the chart, from /llm/state.json every 2 s, whatever Locust's own polling does (it stops with the runner).
PANEL_JS = r"""
(function () {
  var drawn = null, spec = null, panel = null;
  function el(tag, text) { var e = document.createElement(tag); if (text) e.textContent = text; return e; }
  function ensure() {
    if (panel) return panel;
    panel = el('section'); panel.id = 'llm-panel';
    panel.style.cssText = 'font:14px sans-serif;margin:8px 24px 24px;padding:12px 16px;border:1px solid #ccc;';
    ['llm-verdict', 'llm-load', 'llm-run', 'llm-chart'].forEach(function (id) {
      var d = el('div'); d.id = id; d.style.margin = '4px 0'; panel.appendChild(d); });
    document.body.appendChild(panel); return panel;
  }
  function startForm(s) {  // open loop: Locust 2.x only disables the users and ramp-up fields; hide them
    var inputs = ['userCount', 'spawnRate'].map(function (n) { return document.querySelector('input[name=' + n + ']'); });
    if (!inputs[0]) return false;
    if (s.open_loop) inputs.forEach(function (i) { if (i) (i.closest('.MuiFormControl-root') || i).style.display = 'none'; });
    return true;
  }
  function render(s) {
    var p = ensure(), form = startForm(s);
    p.style.display = (form || /[?&]tab=llm\b/.test(location.search)) ? 'block' : 'none';
    ['llm-verdict', 'llm-run', 'llm-chart'].forEach(function (id) { p.querySelector('#' + id).hidden = form; });
    p.querySelector('#llm-verdict').textContent = 'verdict: ' + s.verdict + '  (' + s.completed + ' of ' +
      (s.planned === null ? '?' : s.planned) + ' requests completed)';
    p.querySelector('#llm-load').textContent = s.load;
    var run = p.querySelector('#llm-run'); run.textContent = s.run_dir ? 'run directory: ' + s.run_dir + '  ' : '';
    if (s.report) { var a = el('a', 'report.html'); a.href = s.report; a.target = '_blank'; a.id = 'llm-report';
      run.appendChild(a); }
    var key = JSON.stringify(s.series);  // drawn again only when a point changed (a few dozen points)
    if (!window.vegaEmbed || !s.series.length || key === drawn) return;
    drawn = key;
    var full = Object.assign({}, spec, {data: {values: s.series}});
    vegaEmbed('#llm-chart', full, {renderer: 'svg', actions: false}).catch(function () { drawn = null; });
  }
  function poll() {
    fetch('llm/state.json').then(function (r) { return r.json(); }).then(function (s) {
      spec = s.spec; render(s); }).catch(function () {});
  }
  poll(); setInterval(poll, 2000);
})();
"""
