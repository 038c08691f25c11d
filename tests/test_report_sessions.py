"""The report's Reasoning and Sessions sections and the session lane, from synthetic records (pure, fast):
a hand-built session DAG whose every phase, link, stall and culprit is known, and the summary blocks shaped as
analysis writes them (plan.md §2.5)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from loadgen.analysis.metrics import with_request_metrics
from loadgen.analysis.result import RunResult
from loadgen.analysis.spikes import top_culprits
from loadgen.core.records import RequestRecord
from loadgen.records.schema import CHUNK_SCHEMA, REQUEST_SCHEMA, requests_frame
from loadgen.report import session_lane as sl
from loadgen.report.charts import build_charts
from loadgen.report.timeline import choose_window
from loadgen.report.views import RunViews
from loadgen.report.console import print_summary
from loadgen.report.html import render_page
from loadgen.report.session_report import sessions_html
from loadgen.report.wording import fmt
from loadgen.report.writers import summary_markdown

MS = 1_000_000
DATA = Path(__file__).parent / "data"


def call(seq: int, session: int | None, call_: int | None, agent: int, step: int, after: int | None,
         ready: float, wait: float, sent: float, first: float, answer: float | None, done: float,
         prompt: int = 1000, cached: int = 0, kind: str = "tool", error: str | None = None,
         cls: str = "coder") -> RequestRecord:
    """One session call (times in ms since 0): ready → (+wait) intended → sent → first token → first answer →
    done."""
    ok = error is None
    return RequestRecord(
        seq=seq, class_name=cls, warmup=False, t_intended_ns=int((ready + wait) * MS), t_sent_ns=int(sent * MS),
        t_first_token_ns=int(first * MS) if ok else None, t_last_token_ns=int(done * MS) if ok else None,
        t_done_ns=int(done * MS), prompt_tokens_asked=prompt, prompt_tokens=prompt, prompt_tokens_source="server",
        output_tokens_asked=100, output_tokens=100 if ok else 0, output_tokens_source="server", chunks=10,
        error_kind=error, cached_tokens=cached,
        t_first_answer_ns=int(answer * MS) if answer is not None and ok else None,
        reasoning_tokens=40 if answer is not None else 0, session=session, call=call_, agent=agent, step=step,
        after_call=after, t_ready_ns=int(ready * MS), wait_ns=int(wait * MS), wait_kind=kind)


def records() -> pl.DataFrame:
    """Session 0: main calls 0 → 1 (tool wait 200 ms) → 1 spawns sub-agent 1 (calls 2, 3) and sub-agent 2
    (call 4) → join call 5 after the last of them (call 3) → call 6 after a think time. Session 1: one call
    whose 30k-token context (0 cached) is prefilled while call 5 streams: the culprit of its stall. Session 2:
    short, a request outside sessions too."""
    rows = [
        call(0, 0, 0, 0, 0, None, 0, 0, 1, 50, 300, 600, prompt=4000, kind="none"),
        call(1, 0, 1, 0, 1, 0, 600, 200, 801, 850, 1000, 1200, cached=3500),
        call(2, 0, 2, 1, 0, 1, 1200, 0, 1201, 1250, None, 1500, kind="none"),
        call(3, 0, 3, 1, 1, 2, 1500, 100, 1601, 1650, None, 2600),
        call(4, 0, 4, 2, 0, 1, 1200, 0, 1202, 1260, None, 1700, kind="none"),
        call(5, 0, 5, 0, 2, 3, 2600, 0, 2601, 2700, 3000, 5200, cached=4000, kind="none"),
        call(6, 0, 6, 0, 3, 5, 5200, 500, 5702, 5750, None, 6000, kind="think"),
        call(7, 1, 3, 0, 3, 2, 3000, 0, 3100, 3900, None, 4000, prompt=30000, cached=0),
        call(8, 2, 0, 0, 0, None, 100, 0, 100, 150, None, 400, kind="none"),
        call(9, None, None, 0, 0, None, 200, 0, 200, 260, None, 500, cls="chat"),
    ]
    frame = requests_frame(rows).with_columns(pl.col("call").cast(pl.Int64))
    for c in ("agent", "step", "after_call", "t_ready_ns", "wait_ns", "wait_kind"):  # a plain request has none
        frame = frame.with_columns(pl.when(pl.col("session").is_null()).then(None).otherwise(pl.col(c)).alias(c))
    return with_request_metrics(frame)


def stalls() -> pl.DataFrame:
    """Two stalls of call 5 (seq 5) during its answer, the first caused by seq 7's prefill (session 1 call 3),
    the second by nothing loadgen saw; one stall of another session's call."""
    return pl.DataFrame({
        "worker": [0, 0, 0], "seq": [5, 5, 8], "class_name": ["coder"] * 3,
        "t_start_ns": [3100 * MS, 4500 * MS, 200 * MS], "t_end_ns": [3900 * MS, 4700 * MS, 300 * MS],
        "chunk_gap_ms": [800.0, 200.0, 100.0], "excess_ms": [780.0, 180.0, 80.0],
        "prefill_induced": [True, False, False], "cause": ["prefill", "unknown", "unknown"],
        "culprits": [[7], None, None]}, schema_overrides={"culprits": pl.List(pl.Int64)})


@pytest.fixture(scope="module")
def lane() -> sl.Lane:
    out = sl.build_lane(records(), stalls())
    assert out is not None
    return out


def test_the_lane_shows_the_slowest_session_one_row_a_call_sub_agents_indented(lane: sl.Lane) -> None:
    assert lane.session == 0 and lane.session_ms == pytest.approx(6000.0)  # last end − first intended
    calls = lane.rows.filter(pl.col("call").is_not_null()).sort("order")
    assert calls["call"].to_list() == [0, 1, 2, 3, 4, 5, 6]
    labels = calls["row"].to_list()
    assert labels[1] == "agent 0 · step 1 · call 1"
    assert labels[2] == f"{sl.INDENT}agent 1 · step 0 · call 2" and labels[4].startswith(sl.INDENT + "agent 2")


def test_each_calls_phases_are_its_record_s_intervals(lane: sl.Lane) -> None:
    def phases(c: int) -> dict[str, float]:
        part = lane.bars.filter(pl.col("call") == c)
        return {p: round(ms, 6) for p, ms in zip(part["phase"], part["ms"])}

    assert phases(1) == {"tool wait": 200.0, "waiting": 1.0, "to first token": 49.0, "reasoning": 150.0,
                         "answer": 200.0}
    assert phases(6) == {"think time": 500.0, "waiting": 2.0, "to first token": 48.0, "answer": 250.0}
    assert phases(0)["reasoning"] == 250.0 and "tool wait" not in phases(0)  # a root waits for nothing
    starts = lane.bars.filter(pl.col("call") == 0).sort("start_s")["start_s"].to_list()
    assert starts[0] == 0.0  # time runs from the session's first intended send


def test_links_show_next_steps_the_fan_out_and_the_join(lane: sl.Lane) -> None:
    kinds = {(p, c): k for p, c, k in lane.links.select("parent", "child", "kind").iter_rows()}
    assert kinds == {(0, 1): "next step", (1, 2): "fan-out", (2, 3): "next step", (1, 4): "fan-out",
                     (3, 5): "join", (5, 6): "next step"}
    join = lane.links.filter(pl.col("kind") == "join").row(0, named=True)
    assert join["x_s"] == pytest.approx(2.6) and join["x2_s"] == pytest.approx(2.6)


def test_a_stall_is_marked_and_linked_to_another_sessions_long_context(lane: sl.Lane) -> None:
    assert lane.stalls.height == 2  # session 2's stall is not on this lane
    culprit_row = "culprit: session 1 call 3 (30000-token context, 0 cached, class coder)"
    assert culprit_row in lane.rows["row"].to_list()
    link = lane.culprit_links.row(0, named=True)
    assert lane.culprit_links.height == 1 and link["culprit_row"] == culprit_row
    assert link["row"] == "agent 0 · step 2 · call 5" and link["t_s"] == pytest.approx(3.9)
    bar = lane.bars.filter(pl.col("row") == culprit_row).row(0, named=True)
    assert bar["phase"] == "culprit prefill" and (bar["start_s"], bar["end_s"]) == pytest.approx((3.1, 3.9))


def test_the_caption_names_the_slowest_step_and_what_explains_it(lane: sl.Lane) -> None:
    # call 1 spawned sub-agents joined at 2.6 s: 2.0 s from its intended send; call 5 took 2.6 s
    assert "Slowest step: agent 0 · step 2 · call 5, 2.60 s" in lane.caption
    assert "answer 2.20 s" in lane.caption and "the largest part: answer" in lane.caption
    assert "2 stalls during it (0.96 s over its usual pace)" in lane.caption
    assert "culprits: session 1 call 3 (30000-token context, 0 cached, class coder)" in lane.caption


def test_a_slowest_step_that_spawned_sub_agents_is_explained_by_them() -> None:
    quick = pl.when(pl.col("seq") == 5).then(3000 * MS)  # call 5 ends at 3.0 s: call 1's step is the slowest
    faster = records().with_columns(t_done_ns=quick.otherwise(pl.col("t_done_ns")),
                                    t_last_token_ns=quick.otherwise(pl.col("t_last_token_ns")))
    lane = sl.build_lane(faster, stalls().filter(pl.col("t_end_ns") < 3000 * MS))
    assert lane is not None
    assert ("Slowest step: agent 0 · step 1 · call 1 (it spawned 2 sub-agents), 1.80 s from its intended send to "
            "its result: waiting 0.00 s, to first token 0.05 s, reasoning 0.15 s, answer 0.20 s, then its 2 "
            "sub-agents until the join 1.40 s; the largest part: its sub-agents.") in lane.caption
    assert "No stall interrupted its stream." in lane.caption


def test_a_session_asked_for_and_a_run_without_sessions() -> None:
    assert sl.build_lane(records(), stalls(), asked=2).session == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="no such session"):
        sl.build_lane(records(), stalls(), asked=9)
    plain = records().with_columns(session=pl.lit(None, dtype=pl.Int64))
    assert sl.build_lane(plain, stalls()) is None


def test_the_lane_chart_is_valid_vega_lite(lane: sl.Lane) -> None:
    spec = sl.lane_chart(lane).to_dict(validate=True)
    assert len(spec["layer"]) == 4  # bars, release links, stall marks, culprit links


def test_top_culprits_name_a_session_call() -> None:
    top = top_culprits(stalls(), records())
    assert [(c["seq"], c["label"], c["cached_tokens"]) for c in top] == [(7, "session 1 call 3", 0)]
    plain = records().with_columns(session=pl.lit(None, dtype=pl.Int64), call=pl.lit(None, dtype=pl.Int64))
    assert "label" not in top_culprits(stalls(), plain)[0] and "session" not in top_culprits(stalls(), plain)[0]


def _stats(p50: float, p99: float, count: int = 10) -> dict[str, float | int | None]:
    return {"count": count, "mean": (p50 + p99) / 2, "p50": p50, "p90": p99 * 0.9, "p95": p99 * 0.95, "p99": p99,
            "p999": p99, "max": p99}


def result_with(reasoning: bool = True, sessions: bool = True) -> RunResult:
    """The golden run's summary with reasoning and session blocks shaped as analysis writes them."""
    data = json.loads((DATA / "golden_summary.json").read_text())
    data["metrics"]["ttft_answer_ms"] = _stats(900.0, 2400.0)
    data["metrics"]["reasoning_tokens"] = _stats(500.0, 1500.0)
    data["classes"]["victim"]["metrics"]["ttft_answer_ms"] = _stats(1200.0, 3100.0)
    share = {"reasoning_share": 0.62, "reasoning_tokens": 6200, "answer_tokens": 3800, "tool_tokens": 400,
             "tool_calls": 12, "requests_with_reasoning": 28, "requests": 30}
    if reasoning:
        data["reasoning"] = {**share, "classes": {"victim": {**share, "requests": 28},
                                                  "aggressor": {**share, "reasoning_share": 0.0, "requests": 2,
                                                                "requests_with_reasoning": 0}}}
    if sessions:
        data["sessions"] = {
            "count": 9, "completed": 8, "failed": 1, "calls_mean": 6.5, "agents_mean": 1.75,
            "session_ms": _stats(8000.0, 21000.0, 8), "agent_step_ms": _stats(700.0, 4100.0, 52),
            "jobs_per_hour": 240.0, "good": 7, "attainment": 0.875, "cache_hit_ratio": {**_stats(0.83, 0.97, 8),
                                                                                        "mean": 0.8},
            "tool_calls": 31, "tool_calls_missing": 1,
            "tool_waits": {"count": 30, "wait_ms": _stats(380.0, 1900.0, 30)}, "window_s": 120.0}
    result = RunResult.from_dict(data)
    return result


def test_summary_md_has_the_reasoning_and_sessions_sections() -> None:
    md = summary_markdown(result_with(), "agentic")
    reasoning = md.split("### Reasoning")[1].split("###")[0]
    assert "Reasoning: 62% of output tokens (6200 reasoning, 3800 answer; 12 tool calls (400 tokens))" in reasoning
    assert "as MLPerf LoadGen counts a reasoning fragment as the first token" in reasoning
    victim = next(line for line in reasoning.splitlines() if line.startswith("| victim"))
    ttft = json.loads((DATA / "golden_summary.json").read_text())["classes"]["victim"]["metrics"]["ttft_ms"]
    assert victim == f"| victim | 28/28 | 62% | {fmt(ttft['p50'])} | {fmt(ttft['p99'])} | 1200 | 3100 |"
    assert "| aggressor | 0/2 | 0% |" in reasoning and "| – | – |" in reasoning  # no first-answer figures there
    sessions = md.split("### Sessions")[1]
    assert ("Sessions: 9 (8 completed with every call successful, 1 failed); "
            "6.5 calls and 1.75 agents per session; 240 jobs per hour; attainment 88% (sessions good by "
            "slo.sessions.good); 30 tool waits, median 380 ms; 31 tool calls, 1 tool turn answered with text "
            "instead.") in sessions
    assert "| session (ms) | 8 | 14500 | 8000 | 18900 | 21000 | 21000 |" in sessions
    assert "| cache hit per session | 8 | 80% | 83% | 87% | 97% | 97% |" in sessions
    assert "| tool wait (ms) | 30 |" in sessions and "| agent step (ms) | 52 |" in sessions


def test_metric_rows_carry_their_unit_and_only_the_rows_the_run_has() -> None:
    md = summary_markdown(result_with(), "agentic")
    assert "| metric | unit | count |" in md and "| ttft_answer_ms | ms |" in md
    assert "| reasoning_tokens | tokens | 10 |" in md and "| session_ms |" not in md
    page = render_page(result_with(), "agentic", "run", [])
    assert "<td>reasoning_tokens</td><td>tokens</td>" in page and "<td>session_ms</td>" not in page


def test_a_run_without_reasoning_or_sessions_shows_neither_section() -> None:
    plain = result_with(reasoning=False, sessions=False)
    md = summary_markdown(plain, "plain")
    assert "### Reasoning" not in md and "### Sessions" not in md
    assert sessions_html(plain) == "" and 'id="sessions"' not in render_page(plain, "plain", "run", [])


def test_the_console_and_the_page_show_both_sections() -> None:
    out = io.StringIO()
    print_summary(Console(file=out, width=120, color_system=None), result_with(), "runs/x")
    text = out.getvalue()
    assert "reasoning (ms): TTFT counts thinking, answer does not" in text
    assert "agent step (ms)" in text and "attainment 88%" in text and "metrics (ms; *_tokens rows in tokens)" in text
    assert "14500" in text and "1200" in text  # whole numbers from 100 up
    page = render_page(result_with(), "agentic", "run", [])
    assert page.index('id="reasoning"') < page.index('id="sessions"') < page.index("<h2>Tail spikes</h2>")
    assert "<td>cache hit per session</td><td>8</td><td>80%</td><td>83%</td>" in page


def test_a_class_name_is_inert_in_every_section() -> None:
    result = result_with()
    assert result.reasoning is not None
    result.reasoning["classes"] = {"<b>x|y</b>": result.reasoning["classes"]["victim"]}
    assert "<b>x" not in sessions_html(result) and "&lt;b&gt;x" in sessions_html(result)
    md = summary_markdown(result, "n")
    assert "\\<b\\>" not in md and "&lt;b&gt;x\\|y&lt;/b&gt;" in md


def test_the_worst_events_name_a_culprit_that_is_a_session_call() -> None:
    result = result_with()
    result.stalls["top_culprits"] = top_culprits(stalls(), records())
    result.stalls["worst_events"] = [{"at_s": 3.9, "victims": 1, "max_gap_ms": 800.0, "cause": "prefill",
                                      "culprits": [{"seq": 7, "prompt_tokens": 30000}, {"seq": 3, "prompt_tokens": 1}]}]
    assert "| #7 session 1 call 3 (30000), #3 (1) |" in summary_markdown(result, "n")
    assert "#7 session 1 call 3 (30000), #3 (1)" in render_page(result, "n", "run", [])


def test_the_page_ends_with_the_session_lane_when_the_run_has_sessions() -> None:
    """The records through RunViews, as report/build.py does: the lane is the last chart, its caption the note."""
    requests = records().select(list(REQUEST_SCHEMA))
    chunks = pl.DataFrame([{"seq": r["seq"], "t_ns": t, "tokens": 1, "reasoning": False, "worker": 0}
                           for r in requests.iter_rows(named=True) if r["t_first_token_ns"] is not None
                           for t in range(r["t_first_token_ns"], r["t_done_ns"] + 1, 50 * MS)], schema=CHUNK_SCHEMA)
    views = RunViews.build(requests, chunks, stalls(), result_with())
    charts = build_charts(views, choose_window(views))
    assert [c.key for c in charts][-1] == "session_lane" and len(charts) == 7
    assert charts[-1].title == "Session lane: session 0 (coder), the slowest"
    assert charts[-1].note.startswith("Session took 6.00 s. Slowest step: agent 0 · step 2 · call 5")
    page = render_page(result_with(), "agentic", "run", charts[-1:])
    assert '<div id="session_lane" class="chart"></div>' in page and "Slowest step: agent 0" in page
    plain = views.requests.with_columns(session=pl.lit(None, dtype=pl.Int64))
    assert "session_lane" not in [c.key for c in build_charts(
        RunViews.build(plain.select(list(REQUEST_SCHEMA)), chunks, stalls(), result_with()), choose_window(views))]
