"""report.html in a real browser: Debian's chromium driven by Playwright, every request but file:// blocked.
Every chart must render (an SVG each) with no console error; a screenshot is kept for a person to look at
(LOADGEN_SCREENSHOT_DIR, else the test's temporary directory; its path is printed)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from loadgen.analysis.sweep_result import Step, SweepResult, summarize_sweep
from tests import chart_geometry as cg
from tests.run_helpers import run_cli, summary

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _browser_or_skip():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs the Debian package 'chromium'")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return sync_api


def open_report(page_path: Path, screenshot: Path, lane: bool = False) -> dict:
    """Open the page, wait for every chart; ``lane``: also read the session lane's title and the call rows its
    y axis labels (``agent k · step s · call c``). ``geometry``: each chart's axis labels and plot areas
    (tests/chart_geometry.py)."""
    return open_pages([(page_path, screenshot)], lane)[0]


def open_pages(pages: list[tuple[Path, Path]], lane: bool = False) -> list[dict]:
    """``open_report`` for several pages in one browser (a launch costs about a second)."""
    sync_api = _browser_or_skip()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            return [_read_page(browser, page_path, shot, lane) for page_path, shot in pages]
        finally:
            browser.close()


def _read_page(browser, page_path: Path, screenshot: Path, lane: bool) -> dict:
    errors: list[str] = []
    blocked: list[str] = []

    def route(r):  # the network is blocked: only the file itself may load
        if r.request.url.startswith("file://"):
            return r.continue_()
        blocked.append(r.request.url)
        return r.abort()

    context = browser.new_context(viewport={"width": 1100, "height": 900}, offline=True)
    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    page.wait_for_selector("body[data-charts-done]", timeout=60_000)
    charts = page.eval_on_selector_all(
        "div.chart", "els => els.map(e => [e.id, e.dataset.rendered || '', "
                     "e.querySelectorAll('svg, canvas').length])")
    verdict = page.inner_text("#verdict") if page.query_selector("#verdict") else ""
    lane_title = page.inner_text("section:has(#session_lane) h2") if lane else ""
    lane_rows = page.eval_on_selector_all(
        "#session_lane svg text", "els => els.map(e => e.textContent)") if lane else []
    geometry = page.evaluate(cg.GEOMETRY_JS)
    page.screenshot(path=str(screenshot), full_page=True)
    context.close()
    return {"charts": charts, "errors": errors, "blocked": blocked, "verdict": verdict, "lane_title": lane_title,
            "lane_rows": [t for t in lane_rows if re.fullmatch(r"(–\s)*agent \d+ · step \d+ · call \d+", t)],
            "geometry": geometry}


def _shots(tmp_path: Path) -> Path:
    shots = Path(os.environ.get("LOADGEN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    return shots


@pytest.fixture(scope="module")
def aggressor_run(tmp_path_factory) -> Path:
    """aggressor_victim for 8 s (any verdict: too few samples to decide is 3); its report, and copies of it for
    history.html."""
    out = tmp_path_factory.mktemp("browser") / "run"
    res = run_cli("run", "scenarios/aggressor_victim.yaml", "--out", str(out), "--duration", "8",
                  "--set", "load.warmup_s=1", "--no-progress", "--no-png")
    assert res.returncode in (0, 1, 3), res.stderr
    return out


def test_report_renders_offline_in_chromium(aggressor_run, pages):
    out, shots, result = aggressor_run, pages["shots"], pages["report"]
    missed = (json.loads((out / "summary.json").read_text()).get("misses") or {}).get("requests", 0)
    lane = ["miss_lane"] if missed else []  # "Why requests missed" comes before the charts' sections
    assert [c[0] for c in result["charts"]] == [*lane, "ttft_vs_prompt", "itl_cdf", "timeline", "itl_over_time",
                                                "throughput", "lengths"]
    assert all(rendered == "yes" and count == 1 for _, rendered, count in result["charts"]), result["charts"]
    assert result["errors"] == [] and result["blocked"] == []
    assert result["verdict"] == summary(out)["verdict"].upper()
    assert (shots / "report.png").stat().st_size > 50_000
    assert cg.problems(result["geometry"]) == []


def _history_dir(run: Path, root: Path) -> Path:
    """Three copies of the run, started 1 h apart; the last one's TTFT p99 0.01 % higher (noise, not news)."""
    start = dt.datetime(2026, 11, 27, 9, 5, tzinfo=dt.timezone.utc)  # 09:05, 10:05, 11:05 (and no 12-h clock)
    for i in range(3):
        copy = root / f"run{i}"
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.parquet", "charts"))
        info = json.loads((copy / "run.json").read_text())
        info["started_at"] = (start + dt.timedelta(hours=i)).strftime("%Y-%m-%dT%H:%M:%S%z")
        (copy / "run.json").write_text(json.dumps(info))
        doc = summary(copy)
        doc["metrics"]["ttft_ms"]["p99"] = 250.0 * (1.0001 if i == 2 else 1.0)
        (copy / "summary.json").write_text(json.dumps(doc))
    return root


def _step(load: float, done: float, good: float, ttft_p99: float, tpot_p90: float) -> Step:
    objectives = [{"objective": "ttft_ms.p99", "metric": "ttft_ms", "stat": "p99", "threshold": 500.0,
                   "comparison": "<=", "call": "pass" if ttft_p99 <= 500 else "fail", "value": ttft_p99}]
    call = "pass" if ttft_p99 <= 500 else "fail"
    metrics = {"ttft_ms": {"p50": ttft_p99 / 3, "p90": ttft_p99 / 1.5, "p99": ttft_p99},
               "itl_ms": {"p50": 20.0, "p90": 30.0, "p99": 45.0},
               "tpot_ms": {"p50": tpot_p90 * 0.8, "p90": tpot_p90, "p99": tpot_p90 * 1.3}}
    return Step(load, 10.0, 1, 10.5, call, False, call, objectives, None, done, done * 120, good, load,
                int(done * 10), 0, metrics, 0.4, 0.2, run_dir=f"steps/{load:g}")


def synthetic_sweep(out: Path) -> SweepResult:
    """Five rate steps 2..10 req/s: goodput equal to completed up to 6 (the lines coincide there), the TTFT p99
    limit 500 ms crossed at 8."""
    steps = [_step(2, 2.0, 2.0, 150, 18), _step(4, 4.0, 4.0, 180, 20), _step(6, 5.9, 5.9, 260, 24),
             _step(8, 7.2, 5.0, 700, 31), _step(10, 7.0, 3.1, 1900, 40)]
    return summarize_sweep("synthetic", "rate", steps, None, 0.1, 0.95, "the capacity is bracketed", 55.0, out)


@pytest.fixture(scope="module")
def pages(aggressor_run, tmp_path_factory) -> dict:
    """The run's report.html, history.html over three copies of the run and sweep.html of a synthetic sweep,
    opened in one browser (a launch costs a second or more)."""
    from loadgen.report.history import collect_runs, render_history, trend_chart
    from loadgen.report.sweep_report import render_html

    root = tmp_path_factory.mktemp("pages")
    shots = _shots(root)
    reports = _history_dir(aggressor_run, root / "reports")
    runs = collect_runs(reports)
    (root / "history.html").write_text(render_history(runs, root / "history.html", reports))
    pareto = [{"load": 2.0}, {"load": 4.0}, {"load": 6.0}, {"load": 8.0}]  # 10 req/s: fewer tokens/s than 8
    (root / "sweep.html").write_text(render_html(synthetic_sweep(root), pareto=pareto))
    report, history, sweep = open_pages([(aggressor_run / "report.html", shots / "report.png"),
                                         (root / "history.html", shots / "history.png"),
                                         (root / "sweep.html", shots / "sweep.png")])
    print(f"screenshots: {shots / 'report.png'}, {shots / 'history.png'}, {shots / 'sweep.png'}")
    return {"report": report, "history": history, "sweep": sweep, "shots": shots,
            "history_spec": json.dumps(trend_chart(runs).to_dict())}


def test_history_page_reads_24h_times_and_keeps_noise_small(pages):
    result = pages["history"]
    geometry = result["geometry"]
    assert result["errors"] == [] and result["blocked"] == [] and geometry
    assert cg.problems(geometry) == []
    times = [t for labels in cg.axis_labels(geometry, "trends", "run started") for t in labels]
    assert times and all(re.fullmatch(r"\d\d [A-Z][a-z]{2} \d\d:\d\d", t) for t in times), times
    assert pages["history_spec"].count('"format": "%d %b %H:%M"') >= 2  # the axis and the tooltip, 24-hour
    domains = cg.domains(geometry, "trends", "Y")
    assert len(domains) >= 6, geometry  # a panel per metric the runs have
    for low, high in domains:  # every panel: TTFT p99's 0.01 % change must not fill it
        assert high - low >= 0.03 * max(abs(low), abs(high), 1e-9), (low, high)


def test_sweep_page_axes_lines_and_limits_are_readable(pages, tmp_path):
    from loadgen.report.sweep_report import sweep_charts

    result = pages["sweep"]
    geometry = result["geometry"]
    assert result["errors"] == [] and result["blocked"] == [] and geometry
    assert cg.problems(geometry) == []
    for chart in ("throughput", "latency_ttft_ms", "stalls"):  # loads 2..10: the axis spans 1..11, not 0..
        [(low, high)] = cg.domains(geometry, chart, "X")  # (Vega words the domain to a digit or two: 1e+1)
        assert 0 < low < 2 and high >= 10, (chart, low, high)
    ends = cg.mark_boxes(geometry, "throughput", r"(completed|goodput|offered) req/s")
    assert sorted(ends) == ["completed req/s", "goodput req/s", "offered req/s"], ends
    assert not any(cg.run_together(p, q) for i, p in enumerate(ends.values()) for q in list(ends.values())[i + 1:])
    assert len(set(cg.line_dashes(geometry, "throughput"))) == 3  # each series its own dash
    assert "ttft_ms.p99 ≤ 500 ms" in cg.mark_texts(geometry, "latency_ttft_ms")  # the limit, named
    assert "pareto" in [c["id"] for c in geometry]
    assert sorted(cg.mark_texts(geometry, "pareto")) == sorted(f"{x} req/s" for x in (2, 4, 6, 8, 10))
    assert "pareto" not in [c.key for c in sweep_charts(synthetic_sweep(tmp_path), None)]  # no list, no chart


@pytest.fixture(scope="module")
def agentic_run(agentic_short_run: Path) -> Path:
    """conftest.py's short agentic run (8 s, 4 agents, the server ten times as fast), shared with the truth
    tests: its report.html holds the session lane."""
    return agentic_short_run


def test_the_session_lane_renders_in_chromium_one_row_a_call(agentic_run: Path, tmp_path: Path) -> None:
    shots = _shots(tmp_path)
    result = open_report(agentic_run / "report.html", shots / "session_lane.png", lane=True)
    print(f"screenshot: {shots / 'session_lane.png'}")
    assert result["charts"][-1][0] == "session_lane"
    assert all(rendered == "yes" and count == 1 for _, rendered, count in result["charts"]), result["charts"]
    assert result["errors"] == [] and result["blocked"] == []
    chosen = int(re.search(r"Session lane: session (\d+)", result["lane_title"]).group(1))  # type: ignore[union-attr]
    calls = pl.read_parquet(agentic_run / "requests.parquet").filter(pl.col("session") == chosen)
    assert calls.height >= 2 and len(result["lane_rows"]) == calls.height, result["lane_rows"]
    assert sorted(int(r.rsplit(" ", 1)[1]) for r in result["lane_rows"]) == sorted(calls["call"].to_list())
    assert cg.problems(result["geometry"]) == []  # every chart of the agentic report too
