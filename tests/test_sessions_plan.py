"""Sessions in the plan (plan/schedule.py ``Plan.session``, plan/sessions.py) and their bodies
(plan/session_bodies.py): graphs drawn from the class's template are reproducible from the seed and valid
DAGs with the asked fan-out and join; an open-loop plan counts sessions as arrivals, every call of a session
shares its start and its warm-up, and the hard end covers the critical path's waits; bodies carry the
transcript, tool results, tools and reasoning knobs in each API's shape."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.schedule import Plan
from loadgen.plan.session_bodies import new_messages, session_body, session_tag
from loadgen.plan.sessions import SessionCall, SessionPlan, check_session, critical_wait_ns
from loadgen.plan.workload import Prompt, PromptFactory, request_body

TRACES = Path(__file__).parent / "data" / "agent_traces"
TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


def scenario(session: dict[str, Any] | None = None, load: dict[str, Any] | None = None, api: str = "chat",
             **cls: Any) -> Scenario:
    klass = {"name": "coder", "prompt_tokens": {"dist": "uniform", "min": 50, "max": 200},
             "output_tokens": {"dist": "fixed", "value": 40}, "shared_prefix_tokens": 100, **cls}
    if session is not None:
        klass["session"] = session
    return Scenario.model_validate({
        "name": "s", "seed": 7, "target": {"api": api},
        "load": load or {"arrival": "poisson", "rate_per_s": 2, "duration_s": 20, "warmup_s": 5},
        "workload": {"classes": [klass]}})


TEMPLATE = {"steps": {"dist": "uniform", "min": 2, "max": 6}, "turns": {"dist": "uniform", "min": 1, "max": 3},
            "think_time_s": 2.0, "think_time_dist": "exponential", "tool_wait_s": 0.4,
            "tool_wait_dist": "exponential", "first_prompt_tokens": {"dist": "fixed", "value": 3000},
            "subagents": {"probability": 0.4, "width": {"dist": "uniform", "min": 2, "max": 4},
                          "steps": {"dist": "uniform", "min": 1, "max": 3}}}


def test_the_same_seed_gives_the_same_sessions_and_another_seed_others():
    a, b = Plan(scenario(TEMPLATE)), Plan(scenario(TEMPLATE))
    assert [a.session(i)[0] for i in range(20)] == [b.session(i)[0] for i in range(20)]
    other = Plan(scenario(TEMPLATE).model_copy(update={"seed": 8}))
    assert [a.session(i)[0] for i in range(20)] != [other.session(i)[0] for i in range(20)]


CLOSED = {"arrival": "concurrency", "concurrency": 4, "duration_s": 10}


def test_synthetic_sessions_are_valid_graphs_with_fan_out_and_joins():
    plan = Plan(scenario(TEMPLATE, CLOSED))
    spawned = joins = 0
    for i in range(200):
        s, reqs = plan.session(i)
        check_session(s, "test")
        assert s.calls[0].prompt_tokens == 3000 and s.calls[0].parents == ()  # the task, the one root
        for c in s.calls:
            if c.agent and c.step == 0:  # a sub-agent starts fresh from a main step that ends in a tool call
                spawner = s.calls[c.parents[0]]
                assert c.context is None and spawner.agent == 0 and spawner.tool_turn
                spawned += 1
            if len(c.parents) > 1:  # a join: its context (the spawner) and each sub-agent's last call
                subs = {s.calls[p].agent for p in c.parents[1:]}
                assert c.context == c.parents[0] and c.agent == 0 and len(subs) == len(c.parents) - 1
                joins += 1
        assert [r.call for r in reqs] == list(range(len(s.calls))) and {r.session for r in reqs} == {i}
    assert spawned > 50 and joins > 20


def test_a_fixed_template_gives_the_exact_graph():
    fixed = {"steps": {"dist": "fixed", "value": 3}, "turns": {"dist": "fixed", "value": 2}, "think_time_s": 1.5,
             "tool_wait_s": 0.25, "subagents": {"probability": 1.0, "width": {"dist": "fixed", "value": 2},
                                                "steps": {"dist": "fixed", "value": 1}}}
    s, _ = Plan(scenario(fixed)).session(0)
    got = [(c.parents, c.context, c.wait_ns, c.wait_kind, c.agent, c.step, c.tool_turn) for c in s.calls]
    q, t = 250_000_000, 1_500_000_000
    assert got == [
        ((), None, 0, "none", 0, 0, True), ((0,), None, 0, "none", 1, 0, False), ((0,), None, 0, "none", 2, 0, False),
        ((0, 1, 2), 0, q, "tool", 0, 1, True), ((3,), None, 0, "none", 3, 0, False),
        ((3,), None, 0, "none", 4, 0, False), ((3, 4, 5), 3, q, "tool", 0, 2, False),  # turn 1 ends in text
        ((6,), 6, t, "think", 0, 3, True), ((7,), None, 0, "none", 5, 0, False), ((7,), None, 0, "none", 6, 0, False),
        ((7, 8, 9), 7, q, "tool", 0, 4, True), ((10,), None, 0, "none", 7, 0, False),
        ((10,), None, 0, "none", 8, 0, False), ((10, 11, 12), 10, q, "tool", 0, 5, False)]
    assert critical_wait_ns(s.calls) == 4 * q + t


def test_open_loop_arrivals_are_sessions_whole_in_warm_up_or_not():
    plan = Plan(scenario(TEMPLATE))
    assert plan.sessional and plan.requests is not None and plan.offsets_s is not None
    assert len({r.session for r in plan.requests}) == len(plan.offsets_s)  # rate_per_s counts sessions
    assert [r.seq for r in plan.requests] == list(range(len(plan.requests)))
    by_session: dict[int, list[Any]] = {}
    for r in plan.requests:
        by_session.setdefault(r.session, []).append(r)
    for i, calls in by_session.items():
        assert {(r.t_intended_offset_ns, r.warmup) for r in calls} == {(int(plan.offsets_s[i] * 1e9),
                                                                         plan.offsets_s[i] < 5)}
    assert any(r.warmup for r in plan.requests) and not all(r.warmup for r in plan.requests)


def test_the_hard_end_covers_every_sessions_critical_path_of_waits():
    plan = Plan(scenario(TEMPLATE))
    assert plan.offsets_s is not None
    longest = max(critical_wait_ns(plan.session(i)[0].calls) for i in range(len(plan.offsets_s)))
    assert plan.hard_end_s(30.0) == pytest.approx(plan.offsets_s[-1] + longest / 1e9 + 30.0)
    assert longest > 2e9  # think times and tool waits add up along the path


def test_a_closed_loop_plan_gives_sessions_one_by_one():
    plan = Plan(scenario(TEMPLATE, {"arrival": "concurrency", "concurrency": 4, "duration_s": 10}))
    assert plan.sessional and plan.requests is None
    s, reqs = plan.session(3)
    assert s.index == 3 and len(reqs) == len(s.calls) and not any(r.warmup for r in reqs)
    assert plan.unit(3) == reqs


def test_a_trace_class_takes_sessions_in_file_order_with_their_own_block_text():
    base = scenario({"trace": {"path": str(TRACES / "weka_traces.jsonl"), "format": "weka"}}, {"arrival": "concurrency", "concurrency": 2, "duration_s": 5})
    plan = Plan(base)
    sources = [plan.session(i)[0].source for i in range(4)]
    assert sources == ["weka:7c3e9a10-f4a", "weka:2b81d0c4-6e7", "weka:e05a7f3b-1d2", "weka:7c3e9a10-f4a"]
    same = [r.blocks for r in plan.session(0)[1]] == [r.blocks for r in plan.session(3)[1]]
    assert same and plan.session(0)[1][0].block_tokens == 64
    drawn = scenario({"trace": {"path": str(TRACES / "weka_traces.jsonl"), "format": "weka", "sample": "random"}},
                     {"arrival": "concurrency", "concurrency": 2, "duration_s": 5})
    picks = [Plan(drawn).session(i)[0].source for i in range(30)]
    assert picks == [Plan(drawn).session(i)[0].source for i in range(30)] and len(set(picks)) == 3
    assert picks != [sources[i % 3] for i in range(30)]  # drawn by the seed, not in file order
    busted = Plan(base.model_copy(update={"workload": base.workload.model_copy(update={"classes": [
        base.workload.classes[0].model_copy(update={"cache_bust": True})]})}))
    assert {b for r in busted.session(0)[1] for b in r.blocks or ()}.isdisjoint(
        {b for r in busted.session(3)[1] for b in r.blocks or ()})


@pytest.mark.parametrize("change,message", [
    ({"session": {"steps": {"dist": "fixed", "value": 2}}, "conversation": {"turns": {"dist": "fixed", "value": 2}}},
     "session and conversation exclude each other"),
    ({"session": {"steps": {"dist": "fixed", "value": 2}, "trace": {"path": "x.json", "format": "weka"}}},
     "session.trace gives the sessions"),
    ({"session": {"think_time_s": 1}}, "session needs steps"),
    ({"session": {"steps": {"dist": "uniform", "min": 1, "max": 5000}}}, "session.steps needs a max"),
    ({"tools": TOOLS, "api": "completions"}, "tools need target.api chat, responses or messages"),
    ({"reasoning": {"budget_tokens": 100}, "api": "messages"}, "budget_tokens >= 1024"),
])
def test_bad_session_fields_are_refused_in_one_line(change, message):
    api = change.pop("api", "chat")
    with pytest.raises(ValueError, match=message):
        scenario(api=api, **change)


def test_check_session_names_what_is_wrong():
    call = SessionCall(0, (), None, 0, "none", 0, 0, 5, 5, False)
    bad = SessionPlan(0, "c", (call, SessionCall(1, (0,), 3, 0, "none", 0, 1, 5, 5, False)), "x")
    with pytest.raises(ScenarioError, match="x: call 1's context 3 is not one of its ancestors"):
        check_session(bad, "x")
    with pytest.raises(ScenarioError, match="parents \\[1\\] must be distinct earlier calls"):
        check_session(SessionPlan(0, "c", (SessionCall(0, (1,), None, 0, "none", 0, 0, 5, 5, False),), "x"), "x")


# ---- bodies --------------------------------------------------------------------------------------------
CALL = SimpleNamespace(id="call_1", name="run_tests", arguments='{"path": "a"}')
TRANSCRIPT = [{"role": "user", "content": "task"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "run_tests", "arguments": '{"path": "a"}'}}]}]


def req(sc: Scenario, **fields: Any) -> Any:
    plan = Plan(sc)
    return plan.session(0)[1][0].__class__(**{**vars_of(plan.session(0)[1][0]), **fields})


def vars_of(r: Any) -> dict[str, Any]:
    return {f: getattr(r, f) for f in r.__slots__}


def test_tool_results_answer_the_context_calls_tool_calls_and_a_join_carries_the_sub_agents():
    sc = scenario(TEMPLATE)
    r = req(sc, context=0, parents=(0,))
    prompt = Prompt("sys", "pytest output", 10)
    assert new_messages(r, prompt, [CALL], []) == [{"role": "tool", "tool_call_id": "call_1",
                                                    "content": "pytest output"}]
    joined = [SimpleNamespace(agent=1, answer="found A"), SimpleNamespace(agent=2, answer="found B")]
    two = [CALL, SimpleNamespace(id="call_2", name="x", arguments="{}")]
    assert [m["content"] for m in new_messages(r, prompt, two, joined)] == [
        "sub-agent 1: found A", "sub-agent 2: found B\n\npytest output"]
    assert new_messages(r, prompt, [], joined) == [  # the server answered in text: a user message
        {"role": "user", "content": "sub-agent 1: found A\n\nsub-agent 2: found B\n\npytest output"}]


def test_a_chat_body_has_the_transcript_tools_a_forced_tool_call_and_reasoning_knobs():
    sc = scenario(TEMPLATE, tools=TOOLS, reasoning={"effort": "low", "budget_tokens": 500})
    cls = sc.workload.classes[0]
    new = [{"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    body = session_body(sc, "m", cls, Prompt("sys", "ok", 3), TRANSCRIPT, new, 40, True, False)
    assert body["messages"] == [{"role": "system", "content": "sys"}, *TRANSCRIPT, *new]
    assert (body["max_tokens"], body["reasoning_effort"], body["tool_choice"]) == (540, "low", "required")
    assert body["tools"] == [{"type": "function", "function": {"name": "run_tests", "description": "",
                                                               "parameters": {"type": "object"}}}]
    last = session_body(sc, "m", cls, Prompt("sys", "ok", 3), TRANSCRIPT, new, 40, False, False)
    assert "tool_choice" not in last  # a final step may answer in text
    off = scenario(TEMPLATE, reasoning={"enabled": False})
    plain = request_body(off, "m", off.workload.classes[0], Prompt(None, "hi", 1), 40, False)
    assert plain["chat_template_kwargs"] == {"enable_thinking": False} and plain["max_tokens"] == 40


def test_responses_and_messages_bodies_carry_tool_calls_and_results_in_their_shapes():
    new = [{"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    sc = scenario(TEMPLATE, api="responses", tools=TOOLS, reasoning={"effort": "high", "budget_tokens": 100})
    body = session_body(sc, "m", sc.workload.classes[0], Prompt("sys", "ok", 3), TRANSCRIPT, new, 40, True, False)
    assert body["input"] == [{"role": "user", "content": "task"},
                             {"type": "function_call", "call_id": "call_1", "name": "run_tests",
                              "arguments": '{"path": "a"}'},
                             {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    assert (body["instructions"], body["max_output_tokens"], body["reasoning"]) == ("sys", 140, {"effort": "high"})
    assert body["tools"][0]["name"] == "run_tests" and body["tool_choice"] == "required"
    sc = scenario(TEMPLATE, api="messages", tools=TOOLS, reasoning={"budget_tokens": 2048})
    body = session_body(sc, "m", sc.workload.classes[0], Prompt("sys", "ok", 3), TRANSCRIPT, new, 40, True, False)
    assert body["messages"] == [{"role": "user", "content": "task"},
                                {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                                   "name": "run_tests", "input": {"path": "a"}}]},
                                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                              "content": "ok"}]}]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048} and body["max_tokens"] == 2088
    assert body["tools"][0]["input_schema"] == {"type": "object"} and "tool_choice" not in body  # thinking: auto


def test_cache_bust_tags_a_session_and_cache_bust_calls_tags_each_call():
    per_session = scenario(TEMPLATE, cache_bust=True)
    cls = per_session.workload.classes[0]
    plan = Plan(per_session)
    a, b = plan.session(0)[1][:2]
    assert session_tag(7, cls, a) == session_tag(7, cls, b) != session_tag(7, cls, plan.session(1)[1][0])
    per_call = scenario({**TEMPLATE, "cache_bust_calls": True})
    pc = per_call.workload.classes[0]
    assert session_tag(7, pc, a) != session_tag(7, pc, b)
    assert session_tag(7, scenario(TEMPLATE).workload.classes[0], a) is None


class WordCounter:
    exact = True

    async def count(self, system: str | None, user: str) -> int:
        return len(user.split()) + (len(system.split()) if system else 0)


def test_a_later_call_is_its_new_message_and_the_sub_agents_blocks_are_the_same_text():
    sc = scenario(TEMPLATE, cache_bust=True)
    factory = PromptFactory(sc, WordCounter())
    asyncio.run(factory.prepare_classes())
    plan = Plan(sc)
    first, later = plan.session(0)[1][:2]
    p0, p1 = asyncio.run(factory.build(first)), asyncio.run(factory.build(later))
    assert p0.system == p1.system and p0.system.startswith("session ")  # one tag for the session's calls
    assert (p0.tokens, p1.tokens) == (first.prompt_tokens, later.prompt_tokens)  # the root: system prompt included
    assert p1.user.split()[0] == "req"  # a later call: its new message alone, tagged
    traced = scenario({"trace": {"path": str(TRACES / "7c3e9a10-f4a.json"), "format": "weka"}},
                      {"arrival": "concurrency", "concurrency": 1, "duration_s": 5})
    tf = PromptFactory(traced, WordCounter())
    asyncio.run(tf.prepare_classes())
    calls = Plan(traced).session(0)[1]
    subs = [asyncio.run(tf.build(calls[k])).user.split() for k in (2, 4, 5)]
    assert subs[0][:128] == subs[1][:128] == subs[2][:128] and subs[0][128:192] != subs[1][128:192]


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_the_simulator_takes_a_session_call_in_each_api_and_sees_the_same_prompt(api):
    """The seam with local_target/sim: a session call's body (transcript with a tool call and its result) is
    accepted in every API, asks for the tool and the reasoning, and renders to the chat body's prompt tokens."""
    from local_target.sim.config import EngineConfig
    from local_target.sim.more_apis import prepare_messages, prepare_responses
    from local_target.sim.openai_api import prepare
    cfg = EngineConfig()
    new = [{"role": "tool", "tool_call_id": "call_1", "content": "3 passed"}]

    def body(api: str) -> dict[str, Any]:
        sc = scenario(TEMPLATE, api=api, tools=TOOLS, reasoning={"effort": "low", "budget_tokens": 1024})
        return session_body(sc, cfg.model, sc.workload.classes[0], Prompt("sys", "3 passed", 3), TRANSCRIPT, new,
                            40, True, False)
    chat = prepare("chat", body("chat"), cfg)
    prep = {"chat": lambda b: prepare("chat", b, cfg), "responses": lambda b: prepare_responses(b, cfg),
            "messages": lambda b: prepare_messages(b, cfg)}[api](body(api))
    assert prep.tokens == chat.tokens and prep.max_tokens == 1064
    assert [t.name for t in prep.asks.tools] == ["run_tests"]
    # Anthropic's extended thinking allows tool_choice auto only; the others force the tool call
    assert (prep.asks.tool_choice, prep.asks.effort or prep.asks.budget_tokens) == (
        "auto" if api == "messages" else "required", 1024 if api == "messages" else "low")
