"""The LLM tab's pure parts (rows from a result, the TTFT/ITL series, what the users mean) and no warning
about a setting the user never made in ``loadgen run --engine locust``."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.result import RunResult
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.plan.scenario_file import load_scenario
from loadgen.report.llm_tab import chart_spec, live_series, load_note, result_rows
from tests.run_helpers import ROOT, run_cli, summary


def _record(seq: int, intended_ms: float, ttft_ms: float, gaps_ms: list[float]) -> tuple[RequestRecord, list]:
    ns = 1_000_000
    t0, first = int(intended_ms * ns), int((intended_ms + ttft_ms) * ns)
    times = [first]
    for gap in gaps_ms:
        times.append(times[-1] + int(gap * ns))
    rec = RequestRecord(seq=seq, class_name="chat", warmup=False, t_intended_ns=t0, t_sent_ns=t0,
                        t_first_token_ns=first, t_last_token_ns=times[-1], t_done_ns=times[-1],
                        prompt_tokens_asked=100, prompt_tokens=100, prompt_tokens_source="asked",
                        output_tokens_asked=len(times), output_tokens=len(times), output_tokens_source="local",
                        chunks=len(times))
    return rec, [ChunkRecord(seq=seq, t_ns=t, tokens=1) for t in times]


def test_series_are_ttft_from_the_intended_time_and_itl_per_token_by_bucket():
    records = [_record(0, 0, 100, [10, 10]), _record(1, 500, 300, [30, 30]), _record(2, 2500, 50, [5, 5])]
    points = {(p["t_s"], p["series"]): p["ms"] for p in live_series(records, bucket_s=2.0)}
    assert points[(0.0, "TTFT p50")] == pytest.approx(200.0)  # (100 + 300) / 2: the first two end before 2 s
    assert points[(2.0, "TTFT p50")] == pytest.approx(50.0)
    assert points[(0.0, "ITL p50")] == pytest.approx(20.0) and points[(2.0, "ITL p99")] == pytest.approx(5.0)
    assert {p["series"] for p in live_series(records)} == {"TTFT p50", "TTFT p99", "ITL p50", "ITL p99"}
    assert live_series([]) == []
    spec = chart_spec()  # the page embeds it as JSON and feeds it live_series' points: every field it reads is there
    encoded = {e["field"] for e in spec["spec"]["encoding"].values() if isinstance(e, dict)}
    assert json.loads(json.dumps(spec)) == spec and encoded <= set(live_series(records)[0]), encoded


def test_final_rows_carry_the_runs_verdict_and_counts():
    result = RunResult.from_dict(json.loads((ROOT / "tests" / "data" / "golden_summary.json").read_text()))
    rows = {r["name"]: r for r in result_rows(result, final=True) if r["cls"] == "all"}
    assert rows["(run) verdict"]["note"] == result.verdict.upper()
    assert rows["(run) requests"]["count"] == result.requests["completed"]
    assert rows["latency · ttft_ms"]["count"] == result.metrics["ttft_ms"]["count"]
    assert result_rows(result, final=False)[0]["note"] == f"running: {result.verdict} so far"


def test_the_note_says_what_the_users_mean():
    sc = load_scenario(ROOT / "scenarios" / "smoke.yaml")
    assert load_note(sc, 64).startswith("open loop") and "64" in load_note(sc, 64)


@pytest.mark.slow
def test_locust_run_warns_about_no_spawn_rate_the_user_never_set(tmp_path):
    proc = run_cli("run", "scenarios/smoke.yaml", "--engine", "locust", "--no-png", "--out", str(tmp_path / "r"),
                   "--set", "load.duration_s=1", "--set", "load.warmup_s=0", timeout=120)
    assert summary(tmp_path / "r")["requests"]["completed"] > 0, proc.stderr
    assert "spawn rate" not in proc.stderr.lower(), proc.stderr
