"""Session figures (issue 38, plan.md §2.5) on a hand-built session DAG whose every time is known: session latency
is the critical path's sum, an agent step that fans out ends at its join, jobs per hour and attainment with their
intervals and ``needed`` in sessions, steady-state cuts whole sessions, and compare bootstraps session_ms. Pure,
exact arithmetic on synthetic records."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from loadgen.analysis import metrics as m
from loadgen.analysis import steady
from loadgen.analysis.compare import compare, point_figures, run_samples
from loadgen.analysis.result import RunResult
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.sessions import SessionFrames
from loadgen.analysis.slo import evaluate
from loadgen.analysis.summary import summarize
from loadgen.analysis.sweep_result import Step
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.plan.scenario import Scenario
from loadgen.plan.slo_spec import Slo
from loadgen.records.schema import chunks_frame, requests_frame

MS = 1_000_000
GOLDEN = Path(__file__).parent / "data" / "golden_run" / "run.json"


def call(seq: int, session: int | None, index: int, agent: int, step: int, after: int | None, ready: int,
         wait: int, done: int, prompt: int = 500, cached: int | None = 0, kind: str = "tool",
         error: str | None = None, tools: int = 0) -> tuple[RequestRecord, list[ChunkRecord]]:
    """One call (ms): released at ``ready``, intended ``ready + wait``, sent 1 ms later, tokens 10 ms after
    intended and 1 ms before ``done``."""
    intended = ready + wait
    record = RequestRecord(
        seq=seq, class_name="agent", warmup=False, t_intended_ns=intended * MS, t_sent_ns=(intended + 1) * MS,
        t_first_token_ns=(intended + 10) * MS, t_last_token_ns=(done - 1) * MS, t_done_ns=done * MS,
        prompt_tokens_asked=prompt, prompt_tokens=prompt, prompt_tokens_source="server", output_tokens_asked=2,
        output_tokens=2, output_tokens_source="server", chunks=2, error_kind=error, cached_tokens=cached,
        t_first_answer_ns=(intended + 10) * MS, reasoning_tokens=0, tool_calls=tools, session=session,
        call=index, agent=agent, step=step, after_call=after, t_ready_ns=ready * MS, wait_ns=wait * MS,
        wait_kind=kind if after is not None else "none")
    return record, [ChunkRecord(seq, (intended + 10) * MS, 1), ChunkRecord(seq, (done - 1) * MS, 1)]


def dag() -> list[tuple[RequestRecord, list[ChunkRecord]]]:
    """Session 0: main 0 → (tool 50 ms) 1, which spawns sub-agent 1 (calls 2 → tool 20 ms → 3) and sub-agent 2
    (call 4); the join 5 is released by 3, the last of them to end; think 100 ms, then 6. Session 1: one call
    that failed. Session 2: one call of 200 ms. seq 99: a request of no session."""
    return [
        call(0, 0, 0, 0, 0, None, 0, 0, 100, prompt=1000, cached=0, tools=1),
        call(1, 0, 1, 0, 1, 0, 100, 50, 300, prompt=1200, cached=1000, tools=2),
        call(2, 0, 2, 1, 0, 1, 300, 0, 500, kind="none", cached=0),
        call(3, 0, 3, 1, 1, 2, 500, 20, 700, cached=400),  # call 2 answered text: its tool result is missing
        call(4, 0, 4, 2, 0, 1, 300, 0, 450, kind="none", cached=0),
        call(5, 0, 5, 0, 2, 3, 700, 0, 900, prompt=1500, cached=1200),  # the join: carries call 1's tool results
        call(6, 0, 6, 0, 3, 5, 900, 100, 1200, prompt=1600, cached=None, kind="think"),
        call(7, 1, 0, 0, 0, None, 200, 0, 300, error="http_5xx"),
        call(8, 2, 0, 0, 0, None, 400, 0, 600),
        call(99, None, 0, 0, 0, None, 50, 0, 150),
    ]


def frames(items: list[tuple[RequestRecord, list[ChunkRecord]]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    req = requests_frame([r for r, _ in items])
    plain = pl.col("session").is_null()
    req = req.with_columns([pl.when(plain).then(None).otherwise(pl.col(c)).alias(c)
                            for c in ("call", "agent", "step", "after_call", "t_ready_ns", "wait_ns", "wait_kind")])
    return req, chunks_frame([c for _, cs in items for c in cs])


@pytest.fixture(scope="module")
def session_frames() -> SessionFrames:
    req = m.with_request_metrics(frames(dag())[0])
    return SessionFrames(req, window_s=3.6, good={"session_ms": 1000.0})


def test_session_ms_is_the_critical_path_sum(session_frames: SessionFrames) -> None:
    s0 = session_frames.sessions.filter(pl.col("session") == 0).row(0, named=True)
    assert s0["session_ms"] == 1200.0 and s0["critical_path"] == [0, 1, 2, 3, 5, 6]
    calls = session_frames.calls.filter(pl.col("session") == 0)
    on_path = calls.filter(pl.col("call").is_in(s0["critical_path"]))
    service = int((on_path["t_done_ns"] - on_path["t_intended_ns"]).sum())
    parts = service + int(on_path.filter(pl.col("after_call").is_not_null())["wait_ns"].sum())
    assert parts == 1200 * MS  # service times 1,030 ms + waits 170 ms (tool 50 + 20, think 100)
    assert (s0["calls"], s0["agents"], s0["ok"]) == (7, 3, True)
    assert s0["cache_hit_ratio"] == 2600 / 5200  # call 6's server said nothing: out of both sums


def test_an_agent_step_that_fans_out_ends_when_its_join_is_ready(session_frames: SessionFrames) -> None:
    steps = session_frames.steps.filter(pl.col("session") == 0).sort("call")
    assert steps["agent_step_ms"].to_list() == [100.0, 550.0, 200.0, 180.0, 150.0, 200.0, 200.0]
    s0 = session_frames.sessions.filter(pl.col("session") == 0).row(0, named=True)
    assert (s0["slowest_step"], s0["slowest_step_ms"]) == (1, 550.0)


def test_jobs_per_hour_attainment_and_the_family_rows(session_frames: SessionFrames) -> None:
    f = session_frames.figures()
    assert (f["count"], f["completed"], f["failed"]) == (3, 2, 1)
    assert f["jobs_per_hour"] == pytest.approx(2 / 3.6 * 3600)
    assert (f["good"], f["attainment"]) == (1, 1 / 3)  # session 0 over 1,000 ms, session 1 failed
    assert f["session_ms"]["count"] == 2 and f["session_ms"]["max"] == 1200.0  # completed sessions only
    assert f["agent_step_ms"]["count"] == 8 and f["tool_calls_missing"] == 1 and f["tool_calls"] == 3
    assert f["tool_waits"]["count"] == 3 and f["tool_waits"]["wait_ms"]["max"] == 50.0
    assert set(session_frames.tables()["session_steps"].columns) == {
        "worker", "session", "agent", "step", "call", "agent_step_ms", "wait_ns", "wait_kind"}


def one_call_sessions(n: int, ok: int) -> SessionFrames:
    """``n`` one-call sessions of 100 ms, the first ``ok`` of them successful, over 3.6 s."""
    items = [call(i, i, 0, 0, 0, None, i, 0, i + 100, error=None if i < ok else "http_5xx") for i in range(n)]
    return SessionFrames(m.with_request_metrics(frames(items)[0]), window_s=3.6)


@pytest.mark.parametrize("n, ok, attainment, jobs, decisions", [
    (200, 200, 0.9, 100_000.0, ("pass", "pass")),
    (200, 100, 0.9, 1_000_000.0, ("fail", "fail")),
    (10, 9, 0.8, 7_000.0, ("inconclusive", "inconclusive")),
])
def test_session_objectives_are_decided_on_intervals_over_sessions(n: int, ok: int, attainment: float, jobs: float,
                                                                   decisions: tuple[str, str]) -> None:
    f = one_call_sessions(n, ok).figures()
    slo = Slo.model_validate({"sessions": {"min_attainment": attainment, "min_jobs_per_hour": jobs}})
    counts = {"completed": n, "failed": 0, "error_rate": 0.0}
    got = {o.objective: o for o in evaluate(slo, {}, counts, n, n, 1.0, samples=object(),  # type: ignore[arg-type]
                                            sessions=f)}
    share, rate = got["sessions.min_attainment"], got["sessions.min_jobs_per_hour"]
    assert (share.decision, rate.decision) == decisions
    assert share.value == ok / n and rate.value == pytest.approx(ok / 3.6 * 3600) and share.samples == n
    assert share.basis == rate.basis == "interval"
    if decisions[0] == "inconclusive":  # how many sessions would decide it, and the note says sessions
        assert share.needed is not None and share.needed > n and re.search(r"needs >= \d+ sessions", share.note)
        assert rate.needed is not None and rate.needed > n


def test_steady_state_cuts_or_keeps_whole_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detected window starts at 250 ms: session 0 (first call at 0 ms, later calls inside the window) is cut
    whole, session 2 (from 400 ms) kept whole; a request of no session is cut on its own time."""
    def window(measured: pl.DataFrame) -> steady.SteadyWindow:
        return steady.SteadyWindow("mser-5", 0, start_ns=250 * MS, end_ns=650 * MS)
    monkeypatch.setattr(steady, "detect", window)
    run = RunAnalysis(*frames(dag()), steady_state="detect")
    cut = dict(zip(run.req["seq"].to_list(), run.req["transient"].to_list()))
    assert [cut[s] for s in range(7)] == [True] * 7 and cut[7] is True and cut[8] is False and cut[99] is True
    assert (run.steady.warmup, run.steady.drain) == (9, 0)  # the counts say what was cut: 7 + 1 + seq 99
    warm = frames(dag())[0].with_columns(warmup=pl.col("seq") == 0)  # the plan marks only the first call
    assert RunAnalysis(warm, frames(dag())[1], "declared").req.filter(pl.col("session") == 0)["warmup"].all()


def test_the_summary_has_the_sessions_section_rows_tables_and_objectives() -> None:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["workload"]["classes"][0]["name"] = "agent"
    doc["load"]["steady_state"] = "declared"
    doc["slo"] = {"session_ms": {"p50": 2000}, "agent_step_ms": {"max": 500}, "decision": "point",
                  "error_rate": {"max": 0.5}, "sessions": {"good": {"session_ms": 1000}, "min_attainment": 0.3}}
    summary, tables = summarize(Scenario.model_validate(doc), *frames(dag()), planned=10)
    assert summary["sessions"]["count"] == 3 and summary["sessions"]["attainment"] == 1 / 3
    assert summary["metrics"]["session_ms"]["max"] == 1200.0 and "ttft_answer_ms" not in summary["metrics"]
    assert summary["classes"]["agent"]["metrics"]["agent_step_ms"]["max"] == 550.0
    calls = {o["objective"]: o["passed"] for o in summary["slo"]}
    assert calls["session_ms.p50"] is True and calls["agent_step_ms.max"] is False
    assert calls["sessions.min_attainment"] is True
    assert tables["sessions"].columns == ["session", "class_name", "worker", "calls", "agents", "ok", "session_ms",
                                          "critical_path", "cached_tokens", "prompt_tokens", "cache_hit_ratio",
                                          "slowest_step", "slowest_step_ms", "good"]


def two_call_sessions(n: int, slow: float) -> list[tuple[RequestRecord, list[ChunkRecord]]]:
    """``n`` sessions of a call and a follow-up after a tool wait, each call ``slow`` × (100 + 3·i mod 40) ms."""
    out = []
    for i in range(n):
        t0, d = 1000 * i, int(slow * (100 + 3 * (i % 40)))
        out += [call(2 * i, i, 0, 0, 0, None, t0, 0, t0 + d),
                call(2 * i + 1, i, 1, 0, 1, 0, t0 + d, 30, t0 + 2 * d + 30)]
    return out


def test_compare_bootstraps_session_ms_when_both_runs_have_sessions() -> None:
    samples = []
    for slow in (1.0, 2.0):
        req, chunks = frames(two_call_sessions(60, slow))
        samples.append(run_samples(req, chunks, pl.DataFrame(), RunAnalysis(req, chunks, "declared")))
    base, new = samples
    assert base.session_ms is not None and base.session_owner is not None and len(base.session_ms) == 60
    assert new.session_ms is not None
    assert base.session_ms[0] == 230.0 and base.session_owner[0] == 0 and base.session_owner[1] == 2
    assert base.ttft_answer_ms is None  # no request reasoned: not compared by default
    results = {r.metric: r for r in compare(base, new, replicates=200, paired=True)}
    assert "ttft_answer_ms.p50" not in results
    assert results["session_ms.p50"].status == results["session_ms.p90"].status == "regressed"
    assert results["session_ms.p50"].worsening == pytest.approx(np.median(new.session_ms) / np.median(
        base.session_ms) - 1, rel=0.05)


def test_session_and_step_percentiles_take_one_sample_per_session_and_per_step() -> None:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["workload"]["classes"][0]["name"] = "agent"
    doc["load"]["steady_state"] = "declared"
    doc["slo"] = {"session_ms": {"p50": 5000}, "agent_step_ms": {"p50": 190}, "error_rate": {"max": 0.5}}
    summary, _ = summarize(Scenario.model_validate(doc), *frames(dag()), planned=10)
    got = {o["objective"]: o for o in summary["slo"]}
    session, step = got["session_ms.p50"], got["agent_step_ms.p50"]
    assert session["basis"] == step["basis"] == "interval"
    assert (session["samples"], step["samples"]) == (2, 8)  # completed sessions; their successful steps
    assert session["decision"] == "inconclusive" and session["needed"] is not None and session["needed"] > 2
    assert re.search(r"needs >= \d+ sessions", session["note"]) and re.search(r"needs >= \d+ steps", step["note"])


def test_a_session_the_runs_end_cut_short_is_neither_a_job_nor_a_failure() -> None:
    """A closed loop's last session of each user is cut by the run's end: counted apart (``cut_at_end``), not
    as a completed job (too short) nor as a failed one (nothing failed; an 18-s run read 33 % attainment)."""
    req = m.with_request_metrics(frames(dag())[0])
    f = SessionFrames(req, window_s=3.6, not_finished=[2]).figures()
    assert (f["count"], f["completed"], f["failed"], f["cut_at_end"]) == (2, 1, 1, 1)
    assert f["session_ms"]["count"] == 1 and f["jobs_per_hour"] == pytest.approx(1 / 3.6 * 3600)


def test_a_sweep_steps_figures_carry_the_session_figures_when_the_run_has_them() -> None:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["workload"]["classes"][0]["name"] = "agent"
    doc["load"]["steady_state"] = "declared"
    summary, _ = summarize(Scenario.model_validate(doc), *frames(dag()), planned=10)
    step = Step.from_result(RunResult.from_dict(summary), 4, 10.0, 1, 12.0, [], "pass", None, None, None)
    assert step.metrics["session_ms"]["p50"] == summary["metrics"]["session_ms"]["p50"]
    assert step.metrics["agent_step_ms"]["p99"] is not None and "ttft_answer_ms" not in step.metrics
    assert step.jobs_per_hour == summary["sessions"]["jobs_per_hour"] and "jobs/h" in step.line("concurrency")


def test_loadgen_size_sizes_session_objectives_in_sessions_and_converts_them_to_requests() -> None:
    """`loadgen size` on a pilot with sessions: a session percentile is sized on one sample per completed
    session and converted at the pilot's calls per session (two here), attainment in sessions, jobs per hour as
    a rate over the window (before, session_ms was read as a request column and raised)."""
    from loadgen.analysis.size_result import SizeOptions, size_run

    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["workload"]["classes"][0]["name"] = "agent"
    doc["load"]["steady_state"] = "declared"
    doc["slo"] = {"session_ms": {"p90": 420}, "sessions": {"good": {"session_ms": 400}, "min_attainment": 0.5,
                                                           "min_jobs_per_hour": 1000}}
    scenario = Scenario.model_validate(doc)
    req, chunks = frames(two_call_sessions(60, 1.0))
    run = RunAnalysis(req, chunks, scenario.load.steady_state)
    summary, _ = summarize(scenario, req, chunks, planned=120, run=run)
    rows = {r.objective: r for r in size_run("pilot", summary, run, SizeOptions()).rows}
    p90, share, jobs = rows["session_ms.p90"], rows["sessions.min_attainment"], rows["sessions.min_jobs_per_hour"]
    assert (p90.kind, p90.unit, p90.pilot_samples) == ("quantile", "sessions", 60.0)
    assert p90.samples is not None and p90.requests == math.ceil(2 * p90.samples)
    assert share.unit == "sessions" and share.samples is not None and share.requests == math.ceil(2 * share.samples)
    assert (jobs.kind, jobs.unit) == ("rate", "seconds") and jobs.duration_s is not None and jobs.duration_s > 0


def agent_scenario(slo: dict[str, object] | None = None) -> Scenario:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["workload"]["classes"][0]["name"] = "agent"
    doc["load"]["steady_state"] = "declared"
    if slo is not None:
        doc["slo"] = slo
    return Scenario.model_validate(doc)


def test_a_class_leaves_out_the_sessions_the_runs_end_cut_short_as_the_run_does() -> None:
    """One class: its session_ms and agent_step_ms rows are the run's, both without session 2 (cut by the end;
    its one call succeeded, so it would read as a completed 200-ms session)."""
    summary, _ = summarize(agent_scenario(), *frames(dag()), planned=10, extra={"sessions_not_finished": [2]})
    per_class = summary["classes"]["agent"]["metrics"]
    for name in ("session_ms", "agent_step_ms"):
        assert per_class[name] == summary["metrics"][name]
    assert summary["metrics"]["session_ms"]["count"] == 1 and summary["metrics"]["session_ms"]["max"] == 1200.0
    assert per_class["agent_step_ms"]["count"] == 7  # session 0's steps; session 2's one step is out


def with_cut_sessions(n: int, cut: int, slow: float) -> tuple[pl.DataFrame, pl.DataFrame, list[int]]:
    """``two_call_sessions(n, slow)`` and ``cut`` more sessions whose follow-up the run's end never sent: their
    one call ended 20 ms after it was sent (a complete session would take 230 ms or more)."""
    items = two_call_sessions(n, slow)
    t0 = 1000 * n
    items += [call(2 * n + k, n + k, 0, 0, 0, None, t0 + 10 * k, 0, t0 + 10 * k + 20) for k in range(cut)]
    req, chunks = frames(items)
    return req, chunks, list(range(n, n + cut))


def test_compare_bootstraps_the_sessions_its_point_value_is_over_without_those_the_end_cut_short() -> None:
    """BASE has 80 sessions cut short by the run's end beside 60 whole ones; NEW the same 60 whole ones. The
    point (summary.json's figures, cut sessions out) says session_ms did not change; the bootstrap must draw
    from the same sessions, so its interval holds the point (with the cut sessions in it, BASE's median would
    fall to ~20 ms and the interval would sit far above 0)."""
    scenario = agent_scenario({"error_rate": {"max": 0.5}})
    sides = []
    for cut in (80, 0):
        req, chunks, unfinished = with_cut_sessions(60, cut, 1.0)
        run = RunAnalysis(req, chunks, "declared")
        summary, _ = summarize(scenario, req, chunks, planned=None, run=run,
                               extra={"sessions_not_finished": unfinished})
        assert summary["metrics"]["session_ms"]["count"] == 60 and summary["sessions"]["cut_at_end"] == cut
        sides.append(run_samples(req, chunks, pl.DataFrame(), run, point_figures(summary), unfinished))
    base, new = sides
    assert base.session_ms is not None and len(base.session_ms) == 60  # the cut sessions are not in the sample
    assert float(np.nanmax(base.session_ms)) >= 230.0 and float(np.nanmin(base.session_ms)) >= 230.0
    result = {r.metric: r for r in compare(base, new, replicates=300, paired=False)}["session_ms.p50"]
    assert result.worsening == 0.0 and result.ci_low is not None and result.ci_high is not None
    assert result.ci_low <= result.worsening <= result.ci_high
