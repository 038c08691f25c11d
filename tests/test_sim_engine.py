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
