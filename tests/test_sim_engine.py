"""The engine model without a clock: scheduling, preemption, cost model and presets."""

from __future__ import annotations

import pytest

from local_target.sim import PrefillChunk, build_config, prefill_alone_ms, step_ms
from local_target.sim.engine import Engine, SimRequest
from local_target.sim import tokenizer


def _req(rid: str, prompt: int, out: int) -> SimRequest:
    return SimRequest(rid, prompt, out, out)


def _run_steps(engine: Engine, n: int) -> list:
    steps = []
    for i in range(n):
        step = engine.plan_step()
        if not step:
            break
        steps.append(step)
        engine.finish_step(step, i)
    return steps


def test_whole_prefill_joins_running_decodes_in_one_step():
    engine = Engine(build_config(overrides={"chunked_prefill": False, "max_num_batched_tokens": 2048}))
    for i in range(3):
        engine.add(_req(f"d{i}", 10, 50))
    _run_steps(engine, 2)
    engine.add(_req("long", 8000, 5))  # larger than the budget: admitted whole, alone among prefills
    step = engine.plan_step()
    assert [r.id for r in step.decodes] == ["d0", "d1", "d2"]
    assert [(r.id, c.tokens) for r, c in step.prefills] == [("long", 8000)]


def test_chunked_prefill_splits_a_prompt_within_the_budget():
    engine = Engine(build_config(overrides={"chunked_prefill": True, "max_num_batched_tokens": 512}))
    engine.add(_req("d", 10, 100))
    _run_steps(engine, 2)
    engine.add(_req("long", 2000, 5))
    chunks = []
    for i in range(10):
        step = engine.plan_step()
        assert step.num_tokens <= 512
        chunks += [(c.tokens, c.start) for r, c in step.prefills if r.id == "long"]
        engine.finish_step(step, i)
    assert chunks == [(511, 0), (511, 511), (511, 1022), (467, 1533)]


def test_kv_shortage_preempts_the_newest_request_which_recomputes():
    engine = Engine(build_config(overrides={"kv_cache_tokens": 1000, "max_num_batched_tokens": 4096}))
    for i in range(3):
        engine.add(_req(f"r{i}", 300, 200))
    preempted = [r.id for s in _run_steps(engine, 400) for r in s.preempted]
    assert preempted and preempted[0] == "r2"
    assert engine.num_preemptions == len(preempted)
    assert not engine.has_work()  # everyone finished despite preemption
    assert engine.kv_used == 0


def test_max_num_seqs_caps_the_running_set():
    engine = Engine(build_config(overrides={"max_num_seqs": 2}))
    for i in range(5):
        engine.add(_req(f"r{i}", 10, 5))
    engine.plan_step()
    assert len(engine.running) == 2 and len(engine.waiting) == 3


def test_step_cost_grows_with_tokens_and_attention():
    cfg = build_config()
    base = step_ms(cfg, [], [100])
    assert step_ms(cfg, [PrefillChunk(1000)], [100]) > base
    later_chunk = step_ms(cfg, [PrefillChunk(512, 4096)], [])
    first_chunk = step_ms(cfg, [PrefillChunk(512, 0)], [])
    assert later_chunk > first_chunk  # attention over a longer context costs more


@pytest.mark.parametrize("preset, prompt, low_ms, high_ms", [
    ("t4-phi3-mini", 1000, 0.55 * 1000, 0.75 * 1000),  # prefill ≈0.55–0.75 ms/token
    ("a100-llama-7b", 1024, 43, 49),                     # ≈46 ms for 1024 tokens
])
def test_preset_prefill_matches_published_figures(preset, prompt, low_ms, high_ms):
    assert low_ms <= prefill_alone_ms(build_config(preset), prompt) <= high_ms


@pytest.mark.parametrize("preset, low_ms, high_ms", [
    ("t4-phi3-mini", 33, 42), ("a100-llama-7b", 7, 9), ("h100-llama-8b", 4, 7)])
def test_preset_decode_step_at_batch_one(preset, low_ms, high_ms):
    assert low_ms <= step_ms(build_config(preset), [], [500]) <= high_ms


def test_time_scale_scales_step_durations():
    slow = Engine(build_config(overrides={"time_scale": 1.0}))
    fast = Engine(build_config(overrides={"time_scale": 0.1}))
    for e in (slow, fast):
        e.add(_req("r", 1000, 5))
    assert fast.step_duration_ms(fast.plan_step()) == pytest.approx(slow.step_duration_ms(slow.plan_step()) * 0.1)


def test_overrides_and_unknown_fields():
    cfg = build_config("t4-phi3-mini", overrides={"chunked_prefill": True, "faults.error_rate": 0.5})
    assert cfg.chunked_prefill and cfg.faults.error_rate == 0.5 and cfg.weights_read_ms == 32.0
    with pytest.raises(ValueError, match="unknown preset"):
        build_config("tpu-v9")
    with pytest.raises(ValueError, match="kv_cache_tokenz"):
        build_config(overrides={"kv_cache_tokenz": 5})


@pytest.mark.parametrize("text, tokens", [
    ("Hello, world!", ["Hello", ",", "world", "!"]),
    ("  a  b\n", ["a", "b"]),
    ("x=1.5", ["x", "=", "1", ".", "5"]),
    ("", []),
])
def test_tokenizer_rule(text, tokens):
    assert tokenizer.tokenize(text) == tokens
    assert tokenizer.count_tokens(text) == len(tokens)


def test_chat_template_overhead_and_output_tokens_are_single_tokens():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    expected = 2 * tokenizer.MESSAGE_OVERHEAD_TOKENS + 4 + tokenizer.GENERATION_PROMPT_TOKENS
    assert len(tokenizer.chat_tokens(messages)) == expected
    text = "".join(tokenizer.output_token(i) for i in range(57))
    assert tokenizer.count_tokens(text) == 57


# ---- reasoning and tool calls: the phase plan (local_target/sim/reasoning.py) ------------------------------
def _plans(asks, n: int = 200, max_tokens: int = 4000, seed: int = 7, **overrides):
    import random

    from local_target.sim.reasoning import draw_plan

    cfg, rng = build_config(overrides=overrides), random.Random(seed)
    return [draw_plan(asks, rng, cfg, max_tokens, f"r{i}") for i in range(n)]


def test_reasoning_lengths_are_seeded_per_effort_and_capped_by_budget_and_max_tokens():
    from local_target.sim.reasoning import Asks

    lengths = {e: [p.reasoning_tokens for p in _plans(Asks(effort=e))] for e in ("minimal", "low", "medium", "high")}
    assert lengths["medium"] == [p.reasoning_tokens for p in _plans(Asks(effort="medium"))]  # same seed, same draws
    assert lengths["medium"] != [p.reasoning_tokens for p in _plans(Asks(effort="medium"), seed=8)]
    assert set(lengths["minimal"]) == {0}
    medians = [sorted(v)[len(v) // 2] for v in (lengths["low"], lengths["medium"], lengths["high"])]
    assert medians[0] == pytest.approx(128, rel=0.2) and medians[1] == pytest.approx(512, rel=0.2)
    assert medians[2] == pytest.approx(2048, rel=0.2)
    budget = [p.reasoning_tokens for p in _plans(Asks(on=True, budget_tokens=300), **{"reasoning.sigma": 1.0})]
    assert max(budget) == 300 and min(budget) < 300
    short = _plans(Asks(effort="high"), max_tokens=50)
    assert max(p.reasoning_tokens for p in short) == 49  # max_tokens counts reasoning and answer: one is left


def test_a_request_that_asks_nothing_draws_nothing_unless_the_config_sets_a_default():
    import random

    from local_target.sim.reasoning import NO_ASKS, Asks, draw_plan

    rng = random.Random(3)
    plan = draw_plan(NO_ASKS, rng, build_config(), 100, "r")
    assert not plan.active and rng.random() == random.Random(3).random()  # the stream stays as it was
    assert [p.effort for p in _plans(NO_ASKS, 3, **{"reasoning.default_effort": "low"})] == ["low"] * 3
    assert not any(p.active for p in _plans(Asks(off=True), 3, **{"reasoning.default_effort": "low"}))


@pytest.mark.parametrize("args_tokens", [8, 9, 10, 31, 200])
def test_tool_arguments_are_one_json_object_of_exactly_the_drawn_tokens(args_tokens):
    import json

    from local_target.sim.reasoning import PhasePlan, ToolPlan

    tool = ToolPlan("web-search", "query", "call_1", len(tokenizer.tokenize("web-search")), args_tokens)
    plan = PhasePlan(5, tool, "low")
    texts = [plan.token_text(i) for i in range(5 + tool.tokens)]
    assert all(tokenizer.count_tokens(t) == 1 for t in texts)  # every generated token is one token
    assert "".join(texts[5:5 + tool.name_tokens]) == "web-search"
    arguments = "".join(texts[5 + tool.name_tokens:])
    assert arguments == tool.arguments() and tokenizer.count_tokens(arguments) == args_tokens
    assert list(json.loads(arguments)) == ["query"]
    assert plan.counts(5 + tool.tokens) == {"reasoning_tokens": 5, "answer_tokens": tool.tokens,
                                            "tool_tokens": tool.tokens, "tool_calls": 1, "first_answer_index": 5}
    assert plan.counts(3)["first_answer_index"] is None and plan.counts(7)["tool_calls"] == 0


def test_tool_choice_auto_calls_with_the_configured_probability_and_required_always():
    from local_target.sim.reasoning import Asks, Tool

    tools = (Tool("get_weather", "city"),)
    auto = [p.tool is not None for p in _plans(Asks(tools=tools), 400, tool_call_probability=0.25)]
    assert sum(auto) / len(auto) == pytest.approx(0.25, abs=0.07)
    assert all(p.tool is not None for p in _plans(Asks(tools=tools, tool_choice="required"), 20))
    assert not any(p.tool is not None for p in _plans(Asks(tools=tools, tool_choice="none"), 20))
    cramped = _plans(Asks(effort="high", tools=tools, tool_choice="required"), 20, max_tokens=60)
    assert all(p.reasoning_tokens + p.tool.tokens <= 60 for p in cramped if p.tool)  # fits in max_tokens


@pytest.mark.parametrize("api, body, want", [
    ("chat", {"reasoning_effort": "high"}, ("high", False, None)),
    ("chat", {"reasoning_effort": "none"}, (None, True, None)),
    ("chat", {"chat_template_kwargs": {"enable_thinking": False}}, (None, True, None)),
    ("chat", {"chat_template_kwargs": {"enable_thinking": True}}, ("medium", False, None)),
    ("responses", {"reasoning": {"effort": "low"}}, ("low", False, None)),
    ("messages", {"thinking": {"type": "enabled", "budget_tokens": 2000}}, ("medium", False, 2000)),
    ("messages", {"thinking": {"type": "disabled"}}, (None, True, None)),
])
def test_each_api_s_reasoning_request_fields(api, body, want):
    from local_target.sim import reasoning

    asks = {"chat": reasoning.chat_asks, "responses": reasoning.responses_asks,
            "messages": reasoning.messages_asks}[api](body)
    assert (asks.resolved_effort(None), asks.off, asks.budget_tokens) == want


@pytest.mark.parametrize("api, body, param", [
    ("chat", {"reasoning_effort": "extreme"}, "reasoning_effort"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0]"),
    ("chat", {"tools": [], "tool_choice": "sometimes"}, "tool_choice"),
    ("messages", {"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
])
def test_unusable_reasoning_and_tool_fields_name_the_field(api, body, param):
    from local_target.sim import reasoning

    with pytest.raises(reasoning.AskError) as err:
        {"chat": reasoning.chat_asks, "messages": reasoning.messages_asks}[api](body)
    assert err.value.param == param


def test_tool_calls_and_tool_messages_count_in_the_prompt():
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "rain, 4 C"}]
    tokens = tokenizer.chat_tokens(messages)
    assert tokens[6:6 + 9] == ["<|assistant|>", "\n", "get_weather", "{", '"', "city", '"', ":", '"']
    assert len(tokens) == 3 * tokenizer.MESSAGE_OVERHEAD_TOKENS + 2 + 10 + 4 + tokenizer.GENERATION_PROMPT_TOKENS


def test_prefix_cache_holds_what_was_generated_so_dropped_reasoning_ends_the_next_hit():
    from local_target.sim.reasoning import PhasePlan

    engine = Engine(build_config(overrides={"prefix_caching": True, "block_size_tokens": 4}))
    first = tokenizer.chat_tokens([{"role": "user", "content": " ".join(f"w{i}" for i in range(20))}])
    plan = PhasePlan(12, None, "medium")
    engine.add(SimRequest("a", len(first), 30, 30, tokens=first, plan=plan))
    _run_steps(engine, 40)
    _, answer, _ = plan.texts(30)
    resent = tokenizer.chat_tokens([{"role": "user", "content": " ".join(f"w{i}" for i in range(20))},
                                    {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}])
    engine.add(SimRequest("b", len(resent), 5, 5, tokens=resent))
    step = engine.plan_step()
    assert step.prefills[0][0].cached_tokens == len(first) // 4 * 4  # the prompt's blocks, not the answer's
