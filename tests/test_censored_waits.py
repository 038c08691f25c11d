"""A measured request cancelled after waiting longer than a latency limit has missed that limit: its value is at
least its wait (censored; analysis/objective_samples.py's ``CENSORED``), counted as a miss (+inf) of every
objective on a metric whose value the wait bounds (ttft_ms, ttft_service_ms, ttft_answer_ms, e2e_ms), in the
verdict and in the miss ledger; one cancelled below the limit stays unknown. A dead endpoint (accepts, never
answers) FAILs: 12 of 12 missed is a p99 over the limit at 95 % on the order statistics' lower end."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen import api
from loadgen.analysis.summary import summarize
from loadgen.core.records import RequestRecord
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.report.wording import interval_words, value_words
from tests.conftest import scenario_file
from tests.run_helpers import run_cli, summary

MS = 1_000_000
DEAD = """\
name: dead
target: {base_url: "http://127.0.0.1:9/v1", model: m}
load: {arrival: constant, rate_per_s: 2.4, duration_s: 5, drain_timeout_s: 1, warmup_s: 0}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 16}, output_tokens: {dist: fixed, value: 8}}]
slo: {ttft_ms: {p99: 2000}, max_generator_lag_ms: 1000}
"""


def _cancelled(seq: int, due_ms: float, end_ms: float) -> RequestRecord:
    """A request sent when due that had no byte back until the run's end cut it at ``end_ms``."""
    due, end = int(due_ms * MS), int(end_ms * MS)
    return RequestRecord(seq, "c", False, due, due, None, None, end, 16, 16, "asked", 8, 0, "local", 0,
                         http_status=200, error_kind="cancelled",
                         error_message="still in flight 1 s after the last send (load.drain_timeout_s): cut at the "
                                       "run's end")


def _summary(tmp_path: Path, records: list[RequestRecord], *sets: str) -> dict:
    scenario = api.load_scenario(scenario_file(tmp_path, DEAD), list(sets) + ["load.steady_state=declared"])
    requests = requests_frame(records)
    s, _ = summarize(scenario, requests, chunks_frame([]), len(records))
    return s


def test_twelve_requests_cut_after_waiting_past_the_limit_fail_it(tmp_path: Path) -> None:
    records = [_cancelled(i, 400 * i, 10_000) for i in range(12)]  # each waited 5.6–10 s > 2 s
    s = _summary(tmp_path, records)
    ttft = next(o for o in s["slo"] if o["objective"] == "ttft_ms.p99")
    assert s["verdict"] == "fail" and ttft["decision"] == "fail" and ttft["samples"] == 12
    assert "12 request(s) cancelled after waiting longer than the limit: counted as misses (+inf)" in ttft["note"]
    assert s["reasons"][0].startswith("ttft_ms.p99 = ")
    assert s["misses"]["requests"] == 12 and s["misses"]["of"] == 12
    # summary.json writes +inf as null (JSON has none) and says which nulls are +inf; the views show ∞, never
    # the "unbounded below" of a null lower end
    assert ttft["value"] is None and {"value", "ci_low"} <= set(ttft["infinite"])
    assert (value_words(ttft), interval_words(ttft)) == ("∞", "[∞, ∞)")


def test_only_the_requests_whose_wait_passed_the_limit_count(tmp_path: Path) -> None:
    """8 cut after 3 s (misses), 4 after 1 s (unknown: their TTFT may still have met 2 s): 8 of 8 known."""
    records = [_cancelled(i, 0, 3_000) for i in range(8)] + [_cancelled(8 + i, 0, 1_000) for i in range(4)]
    s = _summary(tmp_path, records, "slo.e2e_ms={p50: 2500}", "slo.tpot_ms={p99: 50}")
    by = {o["objective"]: o for o in s["slo"]}
    assert by["ttft_ms.p99"]["samples"] == 8 and by["ttft_ms.p99"]["decision"] == "fail"
    assert by["e2e_ms.p50"]["samples"] == 8 and by["e2e_ms.p50"]["decision"] == "fail"  # 3 s > 2.5 s
    assert by["tpot_ms.p99"]["samples"] == 0  # a wait bounds no time per token: unknown, as before
    assert s["misses"]["requests"] == 8


@pytest.mark.slow
def test_a_dead_endpoint_fails_with_each_request_that_waited_past_the_limit_missed(server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_cli("run", str(scenario_file(tmp_path, DEAD)), "--out", str(out), "--no-progress", "--no-png",
                  "--base-url", server.url("silent"), "--slo", "ttft_ms.p99=2000", timeout=120)
    s = summary(out)
    waited = [o for o in s["slo"] if o["objective"] == "ttft_ms.p99"][0]
    assert res.returncode == 1 and s["verdict"] == "fail", res.stdout
    assert s["requests"]["cancelled"] == 12 and waited["decision"] == "fail"
    assert "none of 12 requests missed a limit" not in res.stdout and "(−∞" not in res.stdout
    assert s["misses"]["requests"] == waited["samples"] >= 8  # those due in the first 4 s waited > 2 s


@pytest.mark.parametrize("ttft", ["{buckets: [{max_prompt_tokens: 100, p99: 2000}]}",
                                  "{base: 1000, per_prompt_token: 10, max_violation_ratio: 0.01}"])
def test_a_dead_endpoint_judged_only_on_scoped_ttft_objectives_fails(tmp_path: Path, ttft: str) -> None:
    """The prompt-aware objectives count the cancelled requests as the unscoped ones do: 12 cut after 5.6–10 s of
    waiting have missed a 2 s bucket p99 (+inf in their bucket) and their own 1000 + 10 × 16 ms limit."""
    records = [_cancelled(i, 400 * i, 10_000) for i in range(12)]
    s = _summary(tmp_path, records, f"slo.ttft_ms={ttft}")
    (o,) = [o for o in s["slo"] if o["metric"] == "ttft_ms"]
    assert o["objective"] in ("ttft_ms[1-100 prompt tokens].p99", "ttft_ms.prompt_aware"), o["objective"]
    assert s["verdict"] == "fail" and o["decision"] == "fail" and o["samples"] == 12
    assert "12 request(s) cancelled after waiting longer than the limit: counted " in o["note"]


def test_a_scoped_objective_counts_only_its_own_cut_requests_past_their_own_limit(tmp_path: Path) -> None:
    """Bucket 1-16 holds the 16-token requests; bucket 17-100 none. Cut after 3 s: past the 1-16 bucket's 2 s p99,
    past 1000 + 10 × 16 = 1160 ms each; cut after 1 s: unknown for both (it might have met them)."""
    records = [_cancelled(i, 0, 3_000) for i in range(8)] + [_cancelled(8 + i, 0, 1_000) for i in range(4)]
    buckets = "{max_prompt_tokens: 16, p99: 2000}, {max_prompt_tokens: 100, p99: 2000}"
    by = {o["objective"]: o for o in _summary(tmp_path, records, f"slo.ttft_ms={{buckets: [{buckets}]}}")["slo"]}
    assert by["ttft_ms[1-16 prompt tokens].p99"]["samples"] == 8
    assert by["ttft_ms[17-100 prompt tokens].p99"]["samples"] == 0
    objectives = _summary(tmp_path, records, "slo.ttft_ms={base: 1000, per_prompt_token: 10}")["slo"]
    share = next(o for o in objectives if o["objective"] == "ttft_ms.prompt_aware")
    assert share["samples"] == 8 and share["value"] == 1.0
