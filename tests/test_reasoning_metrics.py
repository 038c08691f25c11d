"""Reasoning metrics (issue 38, plan.md §2.5) on hand-built records whose every value is known: time to first
answer token, time spent reasoning, TPOT and ITL per phase (the gap ending at the first answer chunk in
neither), reasoning and answer counts, the reasoning share, and that a run without reasoning has none of
them. Pure and exact."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from loadgen.analysis import metrics as m
from loadgen.analysis.compare import RunSamples, compare, point_figures, run_samples
from loadgen.analysis.objective_samples import ObjectiveSamples
from loadgen.analysis.reasoning import reasoning_figures
from loadgen.analysis.result import RunResult
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.slo import evaluate
from loadgen.analysis.summary import summarize
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.core.vocabulary import family_metrics
from loadgen.plan.scenario import Scenario
from loadgen.plan.slo_spec import Slo
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.report.console import print_summary
from loadgen.report.session_report import reasoning_headline, sessions_html, sessions_markdown

MS = 1_000_000
GOLDEN = Path(__file__).parent / "data" / "golden_run" / "run.json"


def stream(seq: int, intended: int, chunks: list[tuple[int, int, bool]], reasoning_tokens: int,
           first_answer: int | None, last_reasoning: int | None, cls: str = "think",
           tool_calls: int = 0, tool_tokens: int = 0) -> tuple[RequestRecord, list[ChunkRecord]]:
    """A request (times in ms) and its chunks ``(t_ms, tokens, reasoning flag)``."""
    out = sum(n for _, n, _ in chunks)
    record = RequestRecord(
        seq=seq, class_name=cls, warmup=False, t_intended_ns=intended * MS, t_sent_ns=(intended + 1) * MS,
        t_first_token_ns=chunks[0][0] * MS, t_last_token_ns=chunks[-1][0] * MS, t_done_ns=(chunks[-1][0] + 1) * MS,
        prompt_tokens_asked=10, prompt_tokens=10, prompt_tokens_source="server", output_tokens_asked=out,
        output_tokens=out, output_tokens_source="server", chunks=len(chunks), reasoning=reasoning_tokens > 0,
        t_first_answer_ns=None if first_answer is None else first_answer * MS,
        t_last_reasoning_ns=None if last_reasoning is None else last_reasoning * MS,
        reasoning_tokens=reasoning_tokens, tool_tokens=tool_tokens, tool_calls=tool_calls)
    return record, [ChunkRecord(seq, t * MS, n, r) for t, n, r in chunks]


def records() -> tuple[pl.DataFrame, pl.DataFrame]:
    """seq 0: reasoning 10→12→15 ms, then a MIXED chunk at 20 ms (1 reasoning + 2 answer tokens: one chunk flagged
    answer, its reasoning token counted), answer 24, 30 ms — 10 tokens, 5 reasoning. seq 1: interleaved — an
    answer token at 110, reasoning (2 tokens) at 113, answer at 117 (a tool call: 1 call, 1 token). seq 2 (class
    chat): no reasoning, answer at 205 and 208 ms."""
    items = [
        stream(0, 0, [(10, 1, True), (12, 2, True), (15, 1, True), (20, 3, False), (24, 2, False), (30, 1, False)],
               5, 20, 20),
        stream(1, 100, [(110, 1, False), (113, 2, True), (117, 1, False)], 2, 110, 113, tool_calls=1,
               tool_tokens=1),
        stream(2, 200, [(205, 1, False), (208, 1, False)], 0, 205, None, cls="chat"),
    ]
    return requests_frame([r for r, _ in items]), chunks_frame([c for _, cs in items for c in cs])


def test_each_request_metric_follows_its_definition() -> None:
    req = m.with_request_metrics(records()[0])
    rows = {r["seq"]: r for r in req.iter_rows(named=True)}
    assert [rows[s]["ttft_ms"] for s in (0, 1, 2)] == [10.0, 10.0, 5.0]  # first token of any kind
    assert [rows[s]["ttft_answer_ms"] for s in (0, 1, 2)] == [20.0, 10.0, 5.0]
    assert [rows[s]["reasoning_ms"] for s in (0, 1, 2)] == [10.0, 0.0, None]  # only requests that reasoned
    assert rows[0]["tpot_reasoning_ms"] == 10.0 / 4 and rows[1]["tpot_reasoning_ms"] == 3.0
    assert rows[2]["tpot_reasoning_ms"] is None
    assert [rows[s]["tpot_answer_ms"] for s in (0, 1, 2)] == [10.0 / 4, 7.0, 3.0]
    assert [rows[s]["answer_tokens"] for s in (0, 1, 2)] == [5, 2, 2]


def test_itl_per_phase_splits_at_the_first_answer_chunk_and_the_transition_gap_is_in_neither() -> None:
    run = RunAnalysis(*records(), steady_state="declared")
    stats = run.token_stats()
    # reasoning: seq 0's gaps before 20 ms: 2 ms over 2 tokens (1, 1) and 3 ms over 1 (3); 15→20 is the transition
    assert stats["itl_reasoning_ms"]["count"] == 3 and stats["itl_reasoning_ms"]["mean"] == pytest.approx(5 / 3)
    assert stats["itl_reasoning_ms"]["max"] == 3.0
    # answer: seq 0 (2, 2, 6), seq 1 after its first answer — the interleaved reasoning chunk too (1.5, 1.5, 4),
    # seq 2 (3)
    assert stats["itl_answer_ms"]["count"] == 7 and stats["itl_answer_ms"]["mean"] == pytest.approx(20 / 7)
    assert stats["itl_answer_ms"]["max"] == 6.0
    # every gap, transition included, is still in itl_ms (9 + 3 + 1 tokens after the first chunks)
    assert stats["itl_ms"]["count"] == 3 + 3 + 3 + 3 + 1
    assert run.phase_gaps("reasoning").height + run.phase_gaps("answer").height == run.gaps.height - 1


def test_counts_and_share_per_run_and_per_class() -> None:
    req = m.with_request_metrics(records()[0])
    figures = reasoning_figures(req, ["think", "chat"])
    assert figures is not None
    assert (figures["reasoning_tokens"], figures["answer_tokens"], figures["tool_tokens"],
            figures["tool_calls"], figures["requests_with_reasoning"]) == (7, 9, 1, 1, 2)
    assert figures["reasoning_share"] == 7 / 16
    assert figures["classes"]["think"]["reasoning_share"] == 7 / 14
    assert figures["classes"]["chat"]["reasoning_share"] == 0.0


def test_the_metric_table_has_the_reasoning_rows_only_when_a_request_reasoned() -> None:
    run = RunAnalysis(*records(), steady_state="declared")
    table = m.metric_table(run.measured, token_stats=run.token_stats(), kinds=run.families)
    assert set(table) == set(family_metrics("latency", "reasoning"))
    assert table["reasoning_tokens"]["count"] == 3 and table["answer_tokens"]["mean"] == 3.0
    plain_req, plain_chunks = records()
    plain_req = plain_req.with_columns(reasoning_tokens=pl.lit(0, dtype=pl.Int64))
    plain = RunAnalysis(plain_req, plain_chunks, steady_state="declared")
    assert plain.families == ("latency",)
    assert set(m.metric_table(plain.measured, token_stats=plain.token_stats(), kinds=plain.families)) == set(
        family_metrics("latency"))
    assert reasoning_figures(plain.measured, ["think"]) is None


def test_answer_objectives_are_judged_on_their_own_samples() -> None:
    run = RunAnalysis(*records(), steady_state="declared")
    table = m.metric_table(run.measured, token_stats=run.token_stats(), kinds=run.families)
    slo = Slo.model_validate({"ttft_answer_ms": {"p50": 50, "max": 15}, "itl_answer_ms": {"max": 5},
                              "error_rate": {"max": 0.5}, "decision": "point"})
    samples = ObjectiveSamples(run.measured.filter(pl.col("ok")), run, slo.confidence)
    calls = {o.objective: (o.value, o.passed) for o in evaluate(slo, table, m.request_counts(run.measured), 3, 3,
                                                                  1.0, samples)}
    assert calls["ttft_answer_ms.p50"] == (10.0, True) and calls["ttft_answer_ms.max"] == (20.0, False)
    assert calls["itl_answer_ms.max"] == (6.0, False)
    interval = Slo.model_validate({"itl_answer_ms": {"p50": 100}})
    judged = evaluate(interval, table, m.request_counts(run.measured), 3, 3, 1.0,
                      ObjectiveSamples(run.measured.filter(pl.col("ok")), run, interval.confidence))
    itl = next(o for o in judged if o.objective == "itl_answer_ms.p50")
    assert itl.samples == 7 and itl.basis == "interval"


def test_an_answer_objective_on_a_run_without_reasoning_is_undecided_not_an_error() -> None:
    req, chunks = records()
    run = RunAnalysis(req.with_columns(reasoning_tokens=pl.lit(0, dtype=pl.Int64)), chunks, "declared")
    table = m.metric_table(run.measured, token_stats=run.token_stats(), kinds=run.families)
    slo = Slo.model_validate({"ttft_answer_ms": {"p90": 100}})
    o = next(o for o in evaluate(slo, table, m.request_counts(run.measured), 3, 3, 1.0) if o.id.metric ==
             "ttft_answer_ms")
    assert o.passed is None and o.samples == 0 and "no reasoning figures" in o.note


def test_the_summary_carries_the_reasoning_section_and_rows() -> None:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["load"]["steady_state"] = "declared"
    doc["slo"] = {"ttft_answer_ms": {"p50": 50}, "decision": "point", "error_rate": {"max": 0.5}}
    doc["workload"]["classes"][0]["name"] = "think"
    scenario = Scenario.model_validate(doc)
    summary, tables = summarize(scenario, *records(), planned=3)
    assert summary["reasoning"]["reasoning_tokens"] == 7 and summary["sessions"] is None
    assert summary["metrics"]["ttft_answer_ms"]["p50"] == 10.0
    assert summary["classes"]["think"]["metrics"]["itl_reasoning_ms"]["count"] == 3
    assert {o["objective"]: o["passed"] for o in summary["slo"]}["ttft_answer_ms.p50"] is True
    assert set(tables) == {"stalls", "misses"}  # no session tables: no session ran


def thinking_run(n: int, think_ms: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``n`` requests a second apart: first token at +10 ms, reasoning for ``think_ms`` (+ i mod 7), then 2
    answer chunks."""
    items = []
    for i in range(n):
        t0, answer = 1000 * i, 1000 * i + 10 + think_ms + i % 7
        items.append(stream(i, t0, [(t0 + 10, 1, True), (answer - 1, 3, True), (answer, 1, False),
                                    (answer + 5, 1, False)], 4, answer, answer - 1))
    return requests_frame([r for r, _ in items]), chunks_frame([c for _, cs in items for c in cs])


def test_compare_gains_time_to_first_answer_when_both_runs_reasoned() -> None:
    sides = []
    for think_ms in (100, 300):
        req, chunks = thinking_run(50, think_ms)
        sides.append(run_samples(req, chunks, pl.DataFrame(), RunAnalysis(req, chunks, "declared")))
    base, new = sides
    assert base.ttft_answer_ms is not None and base.ttft_answer_ms[0] == 110.0 and base.session_ms is None
    results = {r.metric: r for r in compare(base, new, replicates=200, paired=True)}
    assert "session_ms.p50" not in results
    assert results["ttft_answer_ms.p50"].status == "regressed" and results["ttft_ms.p50"].status == "unchanged"


def scenario_of(cls: str, slo: dict[str, object]) -> Scenario:
    doc = json.loads(GOLDEN.read_text())["scenario"]
    doc["load"]["steady_state"] = "declared"
    doc["slo"] = slo
    doc["workload"]["classes"][0]["name"] = cls
    return Scenario.model_validate(doc)


def with_unanswered(n: int, silent: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``thinking_run(n, 100)`` (answers 110-116 ms after the intended send) and ``silent`` more requests that
    reasoned until their max_tokens and never produced an answer token (t_first_answer_ns null)."""
    items = []
    for i in range(n, n + silent):
        t0 = 1000 * i
        items.append(stream(i, t0, [(t0 + 10, 1, True), (t0 + 400, 5, True)], 6, None, t0 + 400))
    req, chunks = thinking_run(n, 100)
    return (pl.concat([req, requests_frame([r for r, _ in items])], how="vertical_relaxed"),
            pl.concat([chunks, chunks_frame([c for _, cs in items for c in cs])], how="vertical_relaxed"))


def test_a_request_that_reasoned_and_never_answered_is_counted_and_misses_the_answer_objective() -> None:
    """50 answered within 116 ms, 20 that thought until max_tokens and never answered: the percentiles describe
    the 50 answered (and the reasoning section counts the 20 left out); the objective ttft_answer_ms.p90 <= 10 s,
    which the 50 meet by far, FAILS on intervals: 20 of 70 (29 %) never got an answer, so the p90 wait is
    unbounded. On point values, the p50 is over all 70 samples and the max is a miss."""
    req, chunks = with_unanswered(50, 20)
    summary, _ = summarize(scenario_of("think", {"ttft_answer_ms": {"p90": 10_000}, "error_rate": {"max": 0.5}}),
                           req, chunks, planned=70)
    assert summary["reasoning"]["requests_without_answer"] == 20 and summary["reasoning"]["requests"] == 70
    assert summary["classes"]["think"]["metrics"]["ttft_answer_ms"]["count"] == 50
    row = summary["metrics"]["ttft_answer_ms"]
    assert row["count"] == 50 and row["max"] == 116.0  # descriptive: the answered requests only
    o = {o["objective"]: o for o in summary["slo"]}["ttft_answer_ms.p90"]
    assert o["decision"] == "fail" and o["samples"] == 70 and o["basis"] == "interval"
    assert o["value"] is None and o["ci_high"] is None and "20 request(s) reasoned and never answered" in o["note"]
    json.dumps(summary, allow_nan=False)  # no infinity reaches summary.json

    run = RunAnalysis(req, chunks, steady_state="declared")
    table = m.metric_table(run.measured, token_stats=run.token_stats(), kinds=run.families)
    point = Slo.model_validate({"ttft_answer_ms": {"p50": 116, "max": 1_000_000}, "decision": "point"})
    got = {o.objective: o for o in evaluate(point, table, m.request_counts(run.measured), 70, 70, 1.0,
                                            ObjectiveSamples(run.measured.filter(pl.col("ok")), run, 0.95))}
    # p50 over 70 samples (20 of them +inf): between the 35th and 36th, higher than over the 50 answered
    answered = sorted(run.measured.filter(pl.col("ok"))["ttft_answer_ms"].drop_nulls().to_list())
    assert got["ttft_answer_ms.p50"].value == pytest.approx((answered[34] + answered[35]) / 2)
    assert got["ttft_answer_ms.p50"].value > table["ttft_answer_ms"]["p50"]
    assert got["ttft_answer_ms.p50"].passed is True and got["ttft_answer_ms.max"].passed is False


def test_the_reasoning_section_says_how_many_requests_never_answered() -> None:
    req, chunks = with_unanswered(50, 10)
    summary, _ = summarize(scenario_of("think", {"error_rate": {"max": 0.5}}), req, chunks, planned=60)
    result = RunResult.from_dict(summary)
    assert "10 of them never produced an answer token" in reasoning_headline(result)
    console = Console(file=io.StringIO(), width=200)
    print_summary(console, result, "run")
    assert "10 of them never produced an answer token" in console.file.getvalue()  # type: ignore[attr-defined]
    clean, _ = summarize(scenario_of("think", {"error_rate": {"max": 0.5}}), *thinking_run(50, 100), planned=50)
    assert clean["reasoning"]["requests_without_answer"] == 0
    assert "never produced" not in reasoning_headline(RunResult.from_dict(clean))


def plain_tool_run(calls: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Requests of a plain class (no reasoning, no session), a second apart: request i calls ``calls[i]`` tools,
    8 tokens each, beside 2 answer-text tokens."""
    items = [stream(i, 1000 * i, [(1000 * i + 10, 2, False), (1000 * i + 20, 8 * k or 1, False)], 0,
                    1000 * i + 10, None, cls="chat", tool_calls=k, tool_tokens=8 * k) for i, k in enumerate(calls)]
    return requests_frame([r for r, _ in items]), chunks_frame([c for _, cs in items for c in cs])


def test_tool_calls_are_reported_in_a_run_without_reasoning_or_sessions() -> None:
    scenario = scenario_of("chat", {"error_rate": {"max": 0.5}})
    summary, _ = summarize(scenario, *plain_tool_run([0, 1, 3, 0, 2]), planned=5)
    assert summary["reasoning"] is None and summary["sessions"] is None
    assert summary["tools"] == {"requests_with_tool_calls": 3, "tool_calls": 6, "tool_tokens": 48}
    result = RunResult.from_dict(summary)
    line = "Tool calls: 6 calls (48 tokens, counted as output) in 3 successful requests."
    console = Console(file=io.StringIO(), width=200)
    print_summary(console, result, "run")
    assert line in console.file.getvalue()  # type: ignore[attr-defined]
    assert line in "\n".join(sessions_markdown(result, str)) and line in sessions_html(result)
    none, _ = summarize(scenario, *plain_tool_run([0, 0, 0]), planned=3)
    assert none["tools"] is None and "Tool calls" not in "\n".join(sessions_markdown(RunResult.from_dict(none), str))


def test_compare_gains_the_reasoning_share_and_tpot_per_phase_when_both_runs_reasoned() -> None:
    """BASE: 50 requests thinking ~100 ms over 4 reasoning tokens of 6; NEW thinks ~300 ms (reasoning TPOT ×3,
    answer TPOT the same 5 ms) and, in a third run, 8 reasoning tokens of 10 (share 4/6 → 8/10: +20 %)."""
    def side(think_ms: int, more_reasoning: int = 0) -> RunSamples:
        req, chunks = thinking_run(50, think_ms)
        req = req.with_columns(reasoning_tokens=pl.col("reasoning_tokens") + more_reasoning,
                               output_tokens=pl.col("output_tokens") + more_reasoning)
        run = RunAnalysis(req, chunks, "declared")
        summary, _ = summarize(scenario_of("think", {"error_rate": {"max": 0.5}}), req, chunks, planned=50, run=run)
        return run_samples(req, chunks, pl.DataFrame(), run, point_figures(summary))
    base, slower, wordier = side(100), side(300), side(100, 4)
    got = {r.metric: r for r in compare(base, slower, replicates=200, paired=True)}
    assert got["tpot_reasoning_ms.p50"].status == "regressed" and got["tpot_answer_ms.p50"].status == "unchanged"
    assert got["tpot_answer_ms.p50"].base == 5.0 and got["reasoning_share"].status == "unchanged"
    assert got["reasoning_share"].base == pytest.approx(4 / 6)
    share = {r.metric: r for r in compare(base, wordier, replicates=200, paired=True)}["reasoning_share"]
    assert share.new == pytest.approx(8 / 10) and share.worsening == pytest.approx(0.2)
    assert share.status == "regressed"
    plain_req, plain_chunks = plain_tool_run([0, 1, 0])
    plain = run_samples(plain_req, plain_chunks, pl.DataFrame(), RunAnalysis(plain_req, plain_chunks, "declared"))
    assert plain.reasoning_tokens is None and plain.tpot_answer_ms is None
    names = {r.metric for r in compare(plain, plain, replicates=50)}
    assert not names & {"reasoning_share", "tpot_answer_ms.p50", "tpot_reasoning_ms.p50"}
