"""`loadgen ui` in a browser: start a run from Locust's web UI, watch the LLM tab's exact TTFT percentiles,
stop it, and find the run directory. The screenshot of the LLM tab is kept (LOADGEN_SCREENSHOT_DIR, else the
test's temporary directory)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.run_helpers import ROOT
from tests.test_report_browser import CHROMIUM, FLAGS, _browser_or_skip

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # polling an observable condition, bounded


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_start_watch_llm_tab_and_stop_from_the_web_ui(tmp_path):
    sync_api = _browser_or_skip()
    port, reports = _free_port(), tmp_path / "reports"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "ui", "scenarios/smoke.yaml", "--port", str(port),
                             "--reports", str(reports), "--no-png", "--set", "load.duration_s=60",
                             "--set", "load.warmup_s=0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    shots = Path(os.environ.get("LOADGEN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    try:
        _wait_until(lambda: _up(f"http://127.0.0.1:{port}/") or proc.poll() is not None, 60, "the web UI")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1300, "height": 950})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_role("button", name="START").click()
            page.get_by_role("tab", name="LLM").click()
            ttft_p50 = ("() => [...document.querySelectorAll('tr')].some(tr => { const c = [...tr.cells]"
                        ".map(td => td.innerText); return c[0] === 'latency · ttft_ms' && "
                        "c[1] === 'all' && parseFloat(c[3]) > 0; })")
            page.wait_for_function(ttft_p50, timeout=30_000)
            page.screenshot(path=str(shots / "locust_llm_tab.png"), full_page=True)
            stats = httpx.get(f"http://127.0.0.1:{port}/stats/requests", timeout=5).json()
            chat = next(row for row in stats["stats"] if row["name"] == "chat")  # Locust's own table, fed by
            assert chat["num_requests"] > 0 and chat["method"] == "POST"  # the request event (TTFT as time)
            page.get_by_role("button", name="STOP").click()
            _wait_until(lambda: any(reports.glob("*/report.html")), 60, "the run directory's report (written last)")
            browser.close()
        print(f"screenshot: {shots / 'locust_llm_tab.png'}")
        assert errors == []
        run_dir = next(reports.glob("*/report.html")).parent
        assert {"requests.parquet", "chunks.parquet", "report.html", "junit.xml"} <= {p.name for p in run_dir.iterdir()}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
