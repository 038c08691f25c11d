"""Multi-turn conversations: the plan, the bodies with history, the simulator's prefix cache, and runs whose
TTFT per turn is checked against the simulator's ground truth."""

from __future__ import annotations

import json

import polars as pl
import pytest

from local_target.sim import build_config
from local_target.sim import tokenizer
from local_target.sim.engine import Engine, SimRequest
from local_target.sim.prefix_cache import PrefixCache, block_hashes
from loadgen.core import RequestMeta, StreamTracker
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.schedule import build_plan
from loadgen.plan.workload import Prompt, request_body
from tests.run_helpers import ROOT, SIM_TRACE, records, run_cli, summary, trace_per_request

MULTI_TURN = ROOT / "scenarios" / "multi_turn.yaml"


def _scenario(load: dict, **conversation) -> Scenario:
    conv = {"turns": {"dist": "uniform", "min": 2, "max": 4}, "think_time_s": 0.5, **conversation}
    return Scenario.model_validate({"name": "c", "seed": 5, "load": load, "workload": {"classes": [
        {"name": "talk", "prompt_tokens": {"dist": "fixed", "value": 30}, "output_tokens": {"dist": "fixed",
         "value": 7}, "conversation": conv}]}})


# ---- the plan -------------------------------------------------------------------------------------------
def test_an_open_loop_plan_lists_every_turn_after_its_conversation_start():
    plan = build_plan(_scenario({"arrival": "constant", "rate_per_s": 2, "requests": 5},
                                first_prompt_tokens={"dist": "fixed", "value": 900}))
    reqs = plan.requests
    assert [r.seq for r in reqs] == list(range(len(reqs)))
    by_conv: dict[int, list] = {}
    for r in reqs:
        by_conv.setdefault(r.conversation, []).append(r)
    assert sorted(by_conv) == [0, 1, 2, 3, 4]
    for conv, turns in by_conv.items():
        assert [t.turn for t in turns] == list(range(len(turns))) and 2 <= len(turns) <= 4
        assert turns[0].prompt_tokens == 900 and all(t.prompt_tokens == 30 for t in turns[1:])
        assert turns[0].think_ns == 0 and all(t.think_ns == 500_000_000 for t in turns[1:])
        assert {t.t_intended_offset_ns for t in turns} == {int(conv * 0.5 * 1e9)}
    assert build_plan(_scenario({"arrival": "constant", "rate_per_s": 2, "requests": 5})).requests[3] == \
        build_plan(_scenario({"arrival": "constant", "rate_per_s": 2, "requests": 5})).requests[3]


def test_the_hard_end_leaves_room_for_the_longest_conversation_think_time():
    plan = build_plan(_scenario({"arrival": "constant", "rate_per_s": 1, "requests": 3, "drain_timeout_s": 10}))
    longest = max(sum(r.think_ns for r in plan.requests if r.conversation == c) for c in range(3)) / 1e9
    assert plan.hard_end_s(10) == pytest.approx(2.0 + longest + 10)


def test_exponential_think_times_are_seeded_and_have_the_mean():
    plan = build_plan(_scenario({"arrival": "constant", "rate_per_s": 10, "requests": 2000},
                                think_time_dist="exponential", think_time_s=2.0))
    thinks = [r.think_ns / 1e9 for r in plan.requests if r.turn > 0]
    assert sum(thinks) / len(thinks) == pytest.approx(2.0, rel=0.05)
    assert len(set(thinks)) > 100


def test_a_closed_loop_unit_is_the_conversation():
    plan = build_plan(_scenario({"arrival": "concurrency", "concurrency": 2, "duration_s": 5}))
    unit = plan.unit(7)
    assert plan.requests is None and plan.conversational
    assert [t.turn for t in unit] == list(range(len(unit))) and {t.conversation for t in unit} == {7}


@pytest.mark.parametrize("turns, message", [({"dist": "lognormal", "median": 3, "sigma": 1}, "needs a max"),
                                            ({"dist": "fixed", "value": 5000}, "at most 1000")])
def test_turns_must_be_bounded(tmp_path, turns, message):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "c", "load": {"arrival": "poisson", "rate_per_s": 1, "duration_s": 2},
                                "workload": {"classes": [{"name": "t", "prompt_tokens": {"dist": "fixed",
                                             "value": 9}, "output_tokens": {"dist": "fixed", "value": 9},
                                             "conversation": {"turns": turns}}]}}))
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


# ---- bodies and the answer kept -------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_turn_body_carries_the_history_then_the_new_message(api):
    s = _scenario({"arrival": "poisson", "rate_per_s": 1, "requests": 1})
    s.target.api = api
    history = [("first question", "first answer"), ("second question", "second answer")]
    body = request_body(s, "m", s.workload.classes[0], Prompt("be brief", "third question", 3), 7, True, history)
    if api == "chat":
        assert [(m["role"], m["content"]) for m in body["messages"]] == [
            ("system", "be brief"), ("user", "first question"), ("assistant", "first answer"),
            ("user", "second question"), ("assistant", "second answer"), ("user", "third question")]
    else:
        assert body["prompt"] == ("be brief\nfirst question\nfirst answer\nsecond question\nsecond answer\n"
                                  "third question")


def test_the_tracker_keeps_a_turns_answer_and_reads_cached_tokens():
    tracker = StreamTracker(RequestMeta(0, "c", False, 0, 10, 2, conversation=3, turn=1, keep_text=True), 1)
    for text, n in ((" hello", 1), (" world", 2)):
        event = {"id": "x", "choices": [{"delta": {"content": text}}],
                 "usage": {"prompt_tokens": 10, "completion_tokens": n, "prompt_tokens_details": {"cached_tokens": 8}}}
        tracker.feed(f"data: {json.dumps(event)}\n\n".encode(), 10 + n)
    tracker.feed(b"data: [DONE]\n\n", 20)
    record, _ = tracker.finish(21)
    assert tracker.answer == " hello world"
    assert (record.conversation, record.turn, record.cached_tokens) == (3, 1, 8)


# ---- the simulator's prefix cache -----------------------------------------------------------------------
def _tokens(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_a_shared_prefix_is_reused_by_whole_blocks_and_the_last_token_is_always_computed():
    engine = Engine(build_config(overrides={"prefix_caching": True, "block_size_tokens": 16}))
    first = SimRequest("a", 100, 3, 3, tokens=_tokens(100))
    engine.add(first)
    while engine.has_work():
        engine.finish_step(engine.plan_step(), 0)
    same_start = SimRequest("b", 120, 3, 3, tokens=_tokens(100) + _tokens(20, "x"))
    exact_copy = SimRequest("c", 96, 3, 3, tokens=_tokens(96))
    for req in (same_start, exact_copy):
        engine.add(req)
        step = engine.plan_step()
        (admitted, chunk), = [(r, c) for r, c in step.prefills if r is req]
        assert chunk.start == req.cached_tokens and chunk.tokens == req.prompt_tokens - req.cached_tokens
        engine.finish_step(step, 0)
    assert same_start.cached_tokens == 96  # 6 whole blocks of 16
    assert exact_copy.cached_tokens == 80  # all 96 are cached, but the last token must be computed: 5 blocks


def test_a_finished_answer_is_cached_for_the_next_turn():
    cfg = build_config(overrides={"prefix_caching": True, "block_size_tokens": 4})
    engine = Engine(cfg)
    turn1 = tokenizer.chat_tokens([{"role": "user", "content": "tell me about the sea"}])
    req = SimRequest("t1", len(turn1), 12, 12, tokens=turn1)
    engine.add(req)
    while engine.has_work():
        engine.finish_step(engine.plan_step(), 0)
    answer = "".join(tokenizer.output_token(i) for i in range(12))
    turn2 = tokenizer.chat_tokens([{"role": "user", "content": "tell me about the sea"},
                                   {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}])
    nxt = SimRequest("t2", len(turn2), 2, 2, tokens=turn2)
    engine.add(nxt)
    engine.plan_step()
    assert nxt.cached_tokens == (len(turn1) + 12) // 4 * 4  # the history up to the answer's last whole block


def test_the_prefix_cache_evicts_the_least_recently_used_blocks():
    cache = PrefixCache(block_size=2, capacity_blocks=3)
    a, b = block_hashes(_tokens(4, "a"), 2), block_hashes(_tokens(4, "b"), 2)
    cache.insert(a)
    assert cache.use(a + [0], 6) == 4
    cache.insert(b)  # 4 blocks > 3: a's first block, the oldest, goes
    assert cache.match_tokens(a) == 0 and cache.match_tokens(b) == 4 and len(cache) == 3
    assert (cache.queries_tokens, cache.hits_tokens) == (6, 4)


# ---- runs against the simulator's truth -----------------------------------------------------------------
def _ttft_by_turn(run_dir) -> pl.DataFrame:
    """Per turn: the median TTFT loadgen measured (first token read − sent) and the simulator's truth (first
    token written − request arrived)."""
    truth = trace_per_request(run_dir)
    requests, _ = records(run_dir)
    rows = requests.filter(pl.col("error_kind").is_null()).with_columns(
        measured_ms=(pl.col("t_first_token_ns") - pl.col("t_sent_ns")) / 1e6,
        truth_ms=pl.col("request_id").map_elements(
            lambda rid: (truth[rid]["tokens"][0][1] - truth[rid]["arrival"]) / 1e6, return_dtype=pl.Float64))
    return rows.with_columns(over_first_ms=pl.col("truth_ms") - pl.col("truth_ms").sort_by("turn").first()
                             .over("conversation")).group_by("turn").agg(
        pl.col("measured_ms").median(), pl.col("truth_ms").median(), pl.col("over_first_ms").median(),
        pl.len().alias("n")).sort("turn")


@pytest.mark.timing
@pytest.mark.parametrize("caching", [True, False])
def test_ttft_by_turn_matches_the_truth_and_falls_only_with_prefix_caching(tmp_path, caching):
    out = tmp_path / "run"
    proc = run_cli("run", str(MULTI_TURN), "--out", str(out), "--no-png", "--set", "load.duration_s=14",
                   "--set", "load.rate_per_s=0.5", "--set", f"target.simulator.prefix_caching={str(caching).lower()}", *SIM_TRACE)
    assert proc.returncode in (0, 1, 3), proc.stderr
    by_turn = _ttft_by_turn(out)
    assert by_turn["turn"].to_list() == [0, 1, 2, 3, 4] and min(by_turn["n"]) >= 4
    # 1.5 ms of loopback, HTTP and SSE parsing beside the embedded simulator on 2 cores (measured: 0.6-1.06 ms
    # over the truth at the median, CI at ab2bfe9 read 1.06 against a 1.05 ms bound), plus the client's own
    # lateness in this run: a loop late by X ms at its sends (queue_delay_ms p99, measured) reads up to X ms late
    # too (a shared 2-core machine measured 1.32 ms once)
    tolerance_ms = 1.5 + summary(out)["metrics"]["queue_delay_ms"]["p99"]
    for turn, measured, truth in by_turn.select("turn", "measured_ms", "truth_ms").iter_rows():
        assert measured == pytest.approx(truth, abs=tolerance_ms), f"turn {turn}"
    first, later = by_turn["truth_ms"][0], by_turn["truth_ms"][1:]
    if caching:
        assert later.max() < 0.25 * first  # a follow-up prefills its new tokens only
    else:  # every follow-up prefills the whole, longer, history again: slower than its own first turn
        assert by_turn["over_first_ms"][1:].min() > 0
    figures = summary(out)["conversations"]
    assert [t["turn"] for t in figures["turns"]] == [0, 1, 2, 3, 4] and figures["conversations"]["failed"] == 0
    hit = [t["cache_hit_ratio"] for t in figures["turns"]]
    assert (hit[0] == 0 and min(hit[1:]) > 0.9) if caching else hit == [None] * 5
    if caching:
        assert summary(out)["server"]["prefix_cache_hit_rate"] > 0.5


@pytest.mark.slow
def test_a_closed_loop_user_holds_one_conversation_at_a_time(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", str(MULTI_TURN), "--out", str(out), "--no-png", "--set", "load.arrival=concurrency",
                   "--set", "load.concurrency=2", "--set", "load.duration_s=6")
    assert proc.returncode in (0, 1, 3), proc.stderr
    requests, _ = records(out)
    for _, rows in requests.sort("t_sent_ns").group_by("conversation"):
        assert rows["turn"].to_list() == list(range(rows.height))  # turns in order, none skipped
        assert rows["prompt_tokens"].is_sorted()  # the history grows
        sent, done = rows["t_sent_ns"].to_list(), rows["t_done_ns"].to_list()
        assert all(s >= d for s, d in zip(sent[1:], done))  # a turn waits for the previous answer
    assert 2 <= requests["conversation"].n_unique()


@pytest.mark.slow
def test_locust_users_are_conversations(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", str(MULTI_TURN), "--engine", "locust", "--out", str(out), "--no-png",
                   "--set", "load.duration_s=8")
    assert proc.returncode in (0, 1, 3), proc.stderr
    requests, _ = records(out)
    assert requests["error_kind"].null_count() == requests.height
    for _, rows in requests.sort("t_sent_ns").group_by("conversation"):
        assert rows["turn"].to_list() == list(range(rows.height))
        assert rows["cached_tokens"][1:].min() is None or rows["cached_tokens"][1:].min() > rows["prompt_tokens"][0] / 2
    figures = summary(out)["conversations"]
    assert figures["conversations"]["count"] == requests["conversation"].n_unique() >= 3
