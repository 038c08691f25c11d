"""report.html in a real browser: Debian's chromium driven by Playwright, every request but file:// blocked.
Every chart must render (an SVG each) with no console error; a screenshot is kept for a person to look at
(LOADGEN_SCREENSHOT_DIR, else the test's temporary directory; its path is printed)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

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
    y axis labels (``agent k · step s · call c``)."""
    sync_api = _browser_or_skip()
    errors: list[str] = []
    blocked: list[str] = []

    def route(r):  # the network is blocked: only the file itself may load
        if r.request.url.startswith("file://"):
            return r.continue_()
        blocked.append(r.request.url)
        return r.abort()

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
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
            verdict = page.inner_text("#verdict")
            lane_title = page.inner_text("section:has(#session_lane) h2") if lane else ""
            lane_rows = page.eval_on_selector_all(
                "#session_lane svg text", "els => els.map(e => e.textContent)") if lane else []
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return {"charts": charts, "errors": errors, "blocked": blocked, "verdict": verdict, "lane_title": lane_title,
            "lane_rows": [t for t in lane_rows if re.fullmatch(r"(–\s)*agent \d+ · step \d+ · call \d+", t)]}


def test_report_renders_offline_in_chromium(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/aggressor_victim.yaml", "--out", str(out), "--duration", "8",
                  "--set", "load.warmup_s=1", "--no-progress", "--no-png")
    assert res.returncode in (0, 1, 3), res.stderr  # 8 s: any verdict (too few samples to decide is 3)
    shots = Path(os.environ.get("LOADGEN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    result = open_report(out / "report.html", shots / "report.png")
    print(f"screenshot: {shots / 'report.png'}")
    missed = (json.loads((out / "summary.json").read_text()).get("misses") or {}).get("requests", 0)
    lane = ["miss_lane"] if missed else []  # "Why requests missed" comes before the charts' sections
    assert [c[0] for c in result["charts"]] == [*lane, "ttft_vs_prompt", "itl_cdf", "timeline", "itl_over_time",
                                                "throughput", "lengths"]
    assert all(rendered == "yes" and count == 1 for _, rendered, count in result["charts"]), result["charts"]
    assert result["errors"] == [] and result["blocked"] == []
    assert result["verdict"] == summary(out)["verdict"].upper()
    assert (shots / "report.png").stat().st_size > 50_000


@pytest.fixture(scope="module")
def agentic_run(agentic_short_run: Path) -> Path:
    """conftest.py's short agentic run (8 s, 4 agents, the server ten times as fast), shared with the truth
    tests: its report.html holds the session lane."""
    return agentic_short_run


def test_the_session_lane_renders_in_chromium_one_row_a_call(agentic_run: Path, tmp_path: Path) -> None:
    shots = Path(os.environ.get("LOADGEN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    result = open_report(agentic_run / "report.html", shots / "session_lane.png", lane=True)
    print(f"screenshot: {shots / 'session_lane.png'}")
    assert result["charts"][-1][0] == "session_lane"
    assert all(rendered == "yes" and count == 1 for _, rendered, count in result["charts"]), result["charts"]
    assert result["errors"] == [] and result["blocked"] == []
    chosen = int(re.search(r"Session lane: session (\d+)", result["lane_title"]).group(1))  # type: ignore[union-attr]
    calls = pl.read_parquet(agentic_run / "requests.parquet").filter(pl.col("session") == chosen)
    assert calls.height >= 2 and len(result["lane_rows"]) == calls.height, result["lane_rows"]
    assert sorted(int(r.rsplit(" ", 1)[1]) for r in result["lane_rows"]) == sorted(calls["call"].to_list())
