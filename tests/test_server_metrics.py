"""The server's /metrics scraped during a run, and stall causes confirmed by it."""

from __future__ import annotations

import asyncio

import httpx
import polars as pl
import pytest

from loadgen.analysis.spikes import confirm_preemptions
from loadgen.analysis.server_frames import preemption_windows
from loadgen.core.prom_text import parse
from loadgen.drivers.scrape import Scraper
from tests.run_helpers import run_cli, summary

VLLM_TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 4.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 10.0
vllm:iteration_tokens_total_sum{model_name="m"} 900.0
vllm:iteration_tokens_total_count{model_name="m"} 10.0
# TYPE other_metric gauge
other_metric 1.0
"""


def test_parse_reads_vllm_names_old_and_new_and_sums_label_sets():
    assert parse(VLLM_TEXT) == {"running": 5.0, "waiting": 7.0, "kv_cache_usage": 0.5, "preemptions_total": 4.0,
                                "iteration_tokens_sum": 900.0, "iteration_tokens_count": 10.0}


def test_a_stall_overlapping_a_preemption_is_labelled_preemption_not_prefill():
    metrics = pl.DataFrame({"t_ns": [0, 500, 1000, 1500], "name": ["preemptions_total"] * 4,
                            "value": [0.0, 0.0, 1.0, 1.0]})
    assert preemption_windows(metrics) == [(500, 1000)]
    stalls = pl.DataFrame({"worker": [0, 0], "seq": [1, 2], "t_start_ns": [600, 1100], "t_end_ns": [900, 1400],
                           "prefill_induced": [True, True], "culprits": [[7], [8]],
                           "culprit_prompt_tokens": [[9000], [9000]], "overlap_ms": [[1.0], [1.0]],
                           "cause": ["prefill", "prefill"]})
    out = confirm_preemptions(stalls, preemption_windows(metrics)).sort("seq")
    assert out["cause"].to_list() == ["preemption", "prefill"]
    assert out["prefill_induced"].to_list() == [False, True] and out["culprits"].to_list() == [None, [8]]


@pytest.mark.slow
def test_preemption_heavy_run_is_confirmed_by_the_server(preemption_heavy_run):
    out = preemption_heavy_run  # conftest.py: chat.yaml on a 9,000-token KV cache at 8 requests/s, 15 s
    metrics = pl.read_parquet(out / "server_metrics.parquet")
    assert {"running", "waiting", "kv_cache_usage", "preemptions_total"} <= set(metrics["name"].unique())
    s = summary(out)
    assert s["server"]["preemptions"] > 10 and s["server"]["kv_cache_usage_max"] > 0.9
    by_cause = s["stalls"]["by_cause"]
    assert by_cause.get("preemption", 0) >= 0.8 * s["stalls"]["count"] and s["stalls"]["prefill_induced"] == 0
    page = (out / "report.html").read_text()  # the server's series under the ITL chart
    assert "kv_cache_pct" in page and "requests waiting" in page and "preempted a request" in page


@pytest.mark.slow
def test_no_server_metrics_flag_scrapes_nothing(tmp_path):
    out = tmp_path / "off"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress", "--no-png", "--duration", "2",
                  "--no-server-metrics")
    assert res.returncode in (0, 1, 3), res.stderr
    assert not (out / "server_metrics.parquet").exists() and summary(out)["server"] == {}
    assert "kv_cache_pct" not in (out / "report.html").read_text()


@pytest.mark.parametrize("status, body, why", [(404, "not found", "HTTP 404"),
                                               (200, "# just text\nup 1\n", "no series of a known engine")])
def test_a_target_without_vllm_metrics_is_skipped_with_one_warning(status, body, why):
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(status, text=body)

    scraper = Scraper("http://t/metrics", {}, period_s=0.01)

    async def scrape() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await scraper.run(client, asyncio.Event())  # returns by itself: nothing to scrape

    asyncio.run(scrape())
    assert calls == ["/metrics"] and scraper.rows == [] and why in (scraper.warning or "")
