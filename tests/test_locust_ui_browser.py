"""`loadgen ui` in a browser: the start form of an open-loop scenario (no users or ramp-up to fill in), a run
started from Locust's web UI that ends by itself, the LLM tab's exact TTFT percentiles while it runs and, once
it has ended, its verdict and completed count equal to the run's summary.json (it froze short of them before),
the panel's run directory and report.html link served by the UI, the same for a second run stopped from the
page, and a clean Ctrl-C (one line, exit 3, no
traceback). Screenshots of the form and the LLM tab are kept (LOADGEN_SCREENSHOT_DIR, else the test's
temporary directory)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.run_helpers import start_cli, summary, wait_for
from tests.test_report_browser import CHROMIUM, FLAGS, _browser_or_skip

pytestmark = pytest.mark.browser
ROW = ("(name) => { for (const tr of document.querySelectorAll('tr')) { const c = [...tr.cells].map(td => td.innerText);"
       " if (c[0] === name) return c; } return null; }")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_run_from_the_web_ui_ends_with_the_runs_state_and_ctrl_c_is_clean(tmp_path):
    sync_api = _browser_or_skip()
    port, reports = _free_port(), tmp_path / "reports"
    proc = start_cli("ui", "scenarios/smoke.yaml", "--port", str(port), "--reports", str(reports), "--no-png",
                     "--set", "load.duration_s=4", "--set", "load.warmup_s=0")
    shots = Path(os.environ.get("LOADGEN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: _up(url) or proc.poll() is not None, 60, "the web UI")
        assert proc.poll() is None, proc.communicate()
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1300, "height": 950})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            # open loop: the plan sets the pace, so the form shows no users or ramp-up, and says why
            page.wait_for_function("() => document.getElementById('llm-load')?.innerText.includes('open loop')")
            assert not page.locator("input[name=userCount]").is_visible()
            assert not page.locator("input[name=spawnRate]").is_visible()
            page.screenshot(path=str(shots / "locust_start_form.png"), full_page=True)
            page.get_by_role("button", name="START").click()
            page.get_by_role("tab", name="LLM").click()
            page.wait_for_function(f"() => {{ const c = ({ROW})('latency · ttft_ms'); "
                                   "return c && c[1] === 'all' && parseFloat(c[3]) > 0; }", timeout=30_000)
            stats = httpx.get(f"{url}stats/requests", timeout=5).json()
            chat = next(row for row in stats["stats"] if row["name"] == "chat")  # Locust's own table, fed by
            assert chat["num_requests"] > 0 and chat["method"] == "POST"  # the request event (TTFT as time)
            wait_for(lambda: any(reports.glob("*/report.html")), 60, "the run's end (report.html is written last)")
            run_dir = next(reports.glob("*/report.html")).parent
            counts, verdict = summary(run_dir)["requests"], summary(run_dir)["verdict"]
            # the tab's last state is the run's: Locust's page polls until its runner stops
            page.wait_for_function(f"() => {{ const c = ({ROW})('(run) requests'); "
                                   f"return c && c[2] === '{counts['completed']}'; }}", timeout=15_000)
            assert page.evaluate(ROW, "(run) verdict")[7] == verdict.upper()
            page.wait_for_function("() => document.querySelector('#llm-chart svg') && "
                                   "document.getElementById('llm-report')", timeout=15_000)
            panel = page.locator("#llm-panel").inner_text()
            assert f"verdict: {verdict.upper()} ({counts['completed']} of {counts['planned']}" in panel
            assert str(run_dir) in panel
            page.screenshot(path=str(shots / "locust_llm_tab.png"), full_page=True)
            report = httpx.get(url + page.locator("#llm-report").get_attribute("href"), timeout=10)
            assert report.status_code == 200 and report.text == (run_dir / "report.html").read_text()
            # a second run, stopped from the page: its last state is that run's too (written after the Stop)
            page.get_by_role("button", name="NEW").click()
            page.get_by_role("button", name="START").click()
            page.get_by_role("tab", name="LLM").click()
            page.wait_for_function(f"() => ({ROW})('(run) verdict')?.[7].startsWith('running')", timeout=30_000)
            page.get_by_role("button", name="STOP").click()
            wait_for(lambda: len(list(reports.glob("*/report.html"))) == 2, 60, "the stopped run's report.html")
            stopped = summary(max(reports.glob("*/report.html")).parent)["requests"]
            page.wait_for_function(f"() => ({ROW})('(run) requests')?.[2] === '{stopped['completed']}'",
                                   timeout=15_000)
            browser.close()
        print(f"screenshots: {shots}/locust_*.png")
        assert errors == []
        assert {"requests.parquet", "chunks.parquet", "report.html", "junit.xml"} <= {p.name for p in run_dir.iterdir()}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert err.strip().splitlines()[-1] == "stopped (Ctrl-C)" and proc.returncode == 3, (proc.returncode, err)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
