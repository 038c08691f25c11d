"""report.html, its charts and their PNGs, `loadgen report --window`, escaping, and determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from loadgen.report.charts import Chart, build_charts
from loadgen.report.html import json_for_script, render_page
from loadgen.report.timeline import choose_window, parse_window, stall_marks
from loadgen.analysis.result import RunResult
from loadgen.report.views import RunViews
from loadgen.records.scan import load_records

from tests.run_helpers import records, run_cli, summary

CHART_KEYS = ["ttft_vs_prompt", "itl_cdf", "timeline", "itl_over_time", "throughput", "lengths"]


@pytest.fixture(scope="module")
def stall_run(tmp_path_factory) -> Path:
    """A short aggressor/victim run: long prefills stall the victims, so every chart has something to show (its
    seeded plan sends its three aggressors 2.2-3.4 s in: 6 s hold them all, as 10 did)."""
    out = tmp_path_factory.mktemp("report") / "run"
    res = run_cli("run", "scenarios/aggressor_victim.yaml", "--out", str(out), "--duration", "6",
                  "--set", "load.warmup_s=1", "--no-progress")
    assert res.returncode in (0, 1, 3), res.stderr  # 6 s decide few objectives: any verdict will do here
    assert summary(out)["stalls"]["prefill_induced"] > 0
    return out


def views(run_dir: Path) -> RunViews:
    requests, chunks = load_records(run_dir)
    return RunViews.build(requests, chunks, pl.read_parquet(run_dir / "stalls.parquet"),
                          RunResult.from_dict(summary(run_dir)))


@pytest.mark.slow
def test_report_html_embeds_every_chart_and_no_external_resource(stall_run):
    page = (stall_run / "report.html").read_text()
    for key in CHART_KEYS:
        assert f'<div id="{key}" class="chart">' in page and f'data-chart="{key}"' in page
    assert "window.vegaEmbed" in page  # the Vega bundle is inline ...
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.DOTALL)
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", markup)  # ... and nothing is fetched
    assert 'id="slo"' in page and "stalls.max_prefill_induced_per_1k_tokens" in page


def test_charts_are_valid_vega_lite_and_exported_as_png_for_summary_md(stall_run):
    v = views(stall_run)
    charts = build_charts(v, choose_window(v))
    assert [c.key for c in charts] == CHART_KEYS
    for c in charts:
        c.spec(validate=True)  # raises on a spec the Vega-Lite schema rejects
    md = (stall_run / "summary.md").read_text()
    for key in CHART_KEYS:
        png = stall_run / "charts" / f"{key}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert f"](charts/{key}.png)" in md


def test_timeline_window_links_each_prefill_stall_to_its_culprit_row(stall_run):
    v = views(stall_run)
    w = choose_window(v)
    worst = v.stalls.filter(pl.col("prefill_induced")).sort("chunk_gap_ms", descending=True).row(0, named=True)
    assert w.start_s <= worst["t_start_s"] and worst["t_end_s"] <= w.end_s
    marks, links = stall_marks(v, w)
    assert worst["seq"] in marks["seq"].to_list()
    link = links.filter((pl.col("seq") == worst["seq"]) & (pl.col("t_end_s") == worst["t_end_s"]))
    assert set(link["culprit"].to_list()) == set(worst["culprits"])
    culprit = v.requests.filter(pl.col("seq") == worst["culprits"][0]).row(0, named=True)
    assert link["culprit_row"][0].startswith(f"#{culprit['seq']} aggressor ({culprit['prompt_tokens']} tok)")


@pytest.mark.slow
def test_report_window_flag_and_bad_windows(stall_run):
    res = run_cli("report", str(stall_run), "--window", "2:4", "--no-png")
    assert res.returncode in (0, 1, 3), res.stderr  # the verdict of a 10 s run is no matter here
    page = (stall_run / "report.html").read_text()
    spec = json.loads(re.search(r'data-chart="timeline">(.*?)</script>', page).group(1))
    domains = {json.dumps(layer["encoding"]["x"]["scale"]["domain"]) for layer in spec["layer"]}
    assert domains == {"[2.0, 4.0]"}
    for bad, message in (("4:2", "START < END"), ("x:3", "numbers"), ("3", "START:END")):
        res = run_cli("report", str(stall_run), "--window", bad, "--no-png")
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(ValueError):
        parse_window("-1:2")


@pytest.mark.slow
def test_rebuilding_twice_gives_identical_views(stall_run):
    assert run_cli("report", str(stall_run), "--no-png").returncode in (0, 1, 3)
    first = [(stall_run / n).read_bytes() for n in ("summary.json", "summary.md", "junit.xml")]
    assert run_cli("report", str(stall_run), "--no-png").returncode in (0, 1, 3)
    assert first == [(stall_run / n).read_bytes() for n in ("summary.json", "summary.md", "junit.xml")]


HOSTILE = '</script><img src=x onerror=alert(1)>&"'


def test_text_from_the_scenario_or_server_is_escaped(stall_run):
    s = summary(stall_run)
    s["reasons"] = [HOSTILE]
    s["target"]["model"] = HOSTILE
    s["slo"][0]["objective"] = HOSTILE
    v = views(stall_run)
    chart = Chart("ttft_vs_prompt", HOSTILE, build_charts(v, choose_window(v))[0].chart, note=HOSTILE)
    page = render_page(RunResult.from_dict(s), HOSTILE, HOSTILE, [chart])
    assert HOSTILE not in page and "<img src=x" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&amp;&quot;" in page
    assert json.loads(json_for_script({"k": HOSTILE})) == {"k": HOSTILE}
    assert "</" not in json_for_script({"k": HOSTILE})


def test_throughput_over_time_counts_every_output_token(stall_run):
    from loadgen.report.views import throughput_over_time

    v = views(stall_run)
    bw_s = 0.5
    counted = throughput_over_time(v, bw_s)["output_tokens_per_s"].sum() * bw_s
    assert round(counted) == v.measured_ok["output_tokens"].sum()


def test_itl_over_time_stays_drawable_on_a_log_axis_when_tokens_arrive_together(stall_run):
    """A real server may send several tokens in one read (0 ms gaps): a 0 would blank the whole log-scale chart."""
    from loadgen.report.views import ITL_FLOOR_MS, itl_over_time

    requests, chunks = records(stall_run)
    # tokens arrive three to a read: two of every three chunk gaps are 0 ms, so bin medians are 0
    merged = (chunks.sort("worker", "seq", "t_ns")
              .with_columns(i=pl.int_range(pl.len()).over("worker", "seq") // 3)
              .with_columns(t_ns=pl.col("t_ns").first().over("worker", "seq", "i")).drop("i"))
    v = RunViews.build(requests, merged, pl.read_parquet(stall_run / "stalls.parquet"),
                       RunResult.from_dict(summary(stall_run)))
    ms = itl_over_time(v, 0.1)["ms"].drop_nulls()
    assert ms.min() >= ITL_FLOOR_MS and (ms == ITL_FLOOR_MS).any()


def test_an_hour_of_server_scrapes_is_binned_keeping_peaks_and_every_preemption():
    """7,200 scrapes (an hour at 0.5 s) would be most of report.html: past 600 they are drawn per time bin,
    the bin's highest gauge (a spike is not averaged away) and every preemption counted."""
    from types import SimpleNamespace

    from loadgen.report import views as vw

    n = 7200
    server = pl.DataFrame({"t_s": [i * 0.5 for i in range(n)], "running": [8.0] * n,
                           "waiting": [90.0 if i == 4321 else 0.0 for i in range(n)],
                           "kv_cache_usage": [0.99 if i == 777 else 0.5 for i in range(n)],
                           "preemptions_total": [float(i // 1000) for i in range(n)]})
    v = SimpleNamespace(server=server, span_s=3600.0)
    queues, kv = vw.server_queues(v), vw.server_kv(v)
    assert kv.height <= 2 * vw.MAX_SERVER_ROWS and queues.height <= 4 * vw.MAX_SERVER_ROWS
    assert queues.filter(pl.col("series") == "requests waiting")["requests"].max() == 90.0
    assert kv["kv_cache_pct"].max() == pytest.approx(99.0) and kv["preemptions"].sum() == 7.0
    assert kv["t_s"].is_sorted() and kv["t_s"].max() < 3600.0
    short = SimpleNamespace(server=server.head(100), span_s=50.0)
    assert vw.server_kv(short).height == 100  # a short run's scrapes as they are
