"""The simulator's scheduler personalities, step by step (no clock): how each engine batches a long prompt
with the running decodes, read from its scheduler's source (local_target/sim/engine.py)."""

from __future__ import annotations

import pytest

from local_target.sim import build_config
from local_target.sim.dialects import render_template, template_tokens
from local_target.sim.engine import Engine, SimRequest
from local_target.sim.runtime import EngineRuntime
from local_target.sim.trace import TraceWriter
from local_target.sim import tokenizer


def _engine(name: str, **overrides) -> Engine:
    engine = Engine(build_config(overrides={"engine": name, **overrides}))
    for i in range(3):
        engine.add(SimRequest(f"d{i}", 10, 50, 50))
    for t in range(2):  # the three decodes are running
        engine.finish_step(engine.plan_step(), t)
    return engine


def _shape(step) -> tuple[list[str], list[tuple[str, int]]]:
    return [r.id for r in step.decodes], [(r.id, c.tokens) for r, c in step.prefills]


def test_sglang_runs_a_prefill_only_batch_and_the_decodes_resume_after_it():
    engine = _engine("sglang", max_num_batched_tokens=16384)
    engine.add(SimRequest("long", 8000, 5, 5))
    prefill = engine.plan_step()
    assert _shape(prefill) == ([], [("long", 8000)])  # the decodes wait
    engine.finish_step(prefill, 10)
    assert _shape(engine.plan_step()) == (["d0", "d1", "d2", "long"], [])


def test_sglang_chunks_run_back_to_back_before_any_decode():
    engine = _engine("sglang", chunked_prefill=True, max_num_batched_tokens=4096)
    engine.add(SimRequest("long", 10000, 5, 5))
    shapes = []
    for t in range(4):
        step = engine.plan_step()
        shapes.append(_shape(step))
        engine.finish_step(step, 10 + t)
    assert shapes == [([], [("long", 4096)]), ([], [("long", 4096)]), ([], [("long", 1808)]),
                      (["d0", "d1", "d2", "long"], [])]


def test_llamacpp_slices_a_prompt_into_n_batch_pieces_alongside_the_decodes():
    engine = _engine("llamacpp", max_num_batched_tokens=2048, max_num_seqs=4)
    engine.add(SimRequest("long", 2100, 5, 5))
    first = engine.plan_step()
    assert _shape(first) == (["d0", "d1", "d2"], [("long", 2045)])
    engine.finish_step(first, 10)
    second = engine.plan_step()  # the rest: a short step, the long prompt's first token at its end
    assert _shape(second) == (["d0", "d1", "d2"], [("long", 55)])
    assert ("long", 0) in [(r.id, index) for r, index in engine.finish_step(second, 11)]


def test_tgi_defers_a_new_prefill_batch_for_max_waiting_tokens_decode_steps():
    engine = _engine("tgi", max_waiting_tokens=3, waiting_served_ratio=1.2)
    engine.add(SimRequest("new", 100, 5, 5))  # 1 waiting < 1.2 × 3 running: not yet
    shapes = []
    for t in range(4):
        step = engine.plan_step()
        shapes.append(_shape(step))
        engine.finish_step(step, 10 + t)
    decoding = (["d0", "d1", "d2"], [])
    assert shapes == [decoding, decoding, decoding, ([], [("new", 100)])]


def test_tgi_prefills_at_once_when_the_queue_outweighs_the_batch():
    engine = _engine("tgi", max_waiting_tokens=20, waiting_served_ratio=1.0)
    for i in range(3):
        engine.add(SimRequest(f"n{i}", 100, 5, 5))
    assert _shape(engine.plan_step()) == ([], [("n0", 100), ("n1", 100), ("n2", 100)])


def _drain(engine: Engine) -> tuple[int, int]:
    """Run ``engine`` until it is idle, checking its KV books every step: (preemptions, most running at once)."""
    most = 0
    for t in range(10_000):
        if not engine.has_work():
            break
        step = engine.plan_step()
        most = max(most, len(engine.running))
        held = sum(r.kv_tokens + r.reserved for r in engine.running)
        assert engine.kv_used == held <= engine.cfg.kv_cache_tokens
        engine.finish_step(step, t)
    assert not engine.has_work() and engine.kv_used == 0  # everyone finished and freed all they held
    return engine.num_preemptions, most


@pytest.mark.parametrize(("name", "preempted", "most_running"),
                         [("vllm", 2, 3), ("sglang", 2, 3), ("llamacpp", 0, 2), ("tgi", 0, 2)])
def test_kv_shortage_preempts_on_vllm_and_sglang_and_queues_on_llamacpp_and_tgi(name: str, preempted: int,
                                                                                 most_running: int) -> None:
    """Five 300 + 200-token requests in a 1,000-token KV cache: vLLM and SGLang admit what the prompts need and
    preempt as the outputs grow; llama.cpp (a slot's context is its own) and TGI (the router admits only what the
    block allocator can hold: prompt + max_new_tokens) admit two, whose 500 tokens each fit, and never preempt."""
    engine = Engine(build_config(overrides={"engine": name, "kv_cache_tokens": 1000,
                                            "max_num_batched_tokens": 4096}))
    assert engine.cfg.reserves_kv == (name in ("llamacpp", "tgi"))
    for i in range(5):
        engine.add(SimRequest(f"r{i}", 300, 200, 200))
    assert _drain(engine) == (preempted, most_running)


def test_a_reservation_is_held_whole_until_the_request_ends_or_is_aborted() -> None:
    """TGI reserves max_tokens, not the output it will produce: a request that stops after 10 of 400 tokens holds
    all 700 until it finishes; the next one waits for them. An abort frees the reservation too."""
    engine = Engine(build_config(overrides={"engine": "tgi", "kv_cache_tokens": 1000}))
    short, waiter = SimRequest("short", 300, 400, 10), SimRequest("waiter", 300, 400, 400)
    engine.add(short)
    engine.add(waiter)
    engine.finish_step(engine.plan_step(), 0)
    assert engine.running == [short] and engine.kv_used == 700 and short.kv_tokens + short.reserved == 700
    for t in range(1, 10):  # its 9 decodes draw on the reservation: the books do not move
        engine.finish_step(engine.plan_step(), t)
    assert short.finish_reason == "stop" and engine.running == [] and engine.kv_used == 0
    engine.finish_step(engine.plan_step(), 10)
    assert engine.running == [waiter] and engine.kv_used == 700
    engine.abort(waiter)
    assert engine.kv_used == 0 and waiter.kv_tokens == waiter.reserved == 0


@pytest.mark.parametrize("name", ["vllm", "sglang", "llamacpp", "tgi"])
def test_the_trace_opens_with_the_engine_and_whether_it_reserves_kv(name: str) -> None:
    """The truth (truth_causes.py) reads a wait on a full cache as queueing where KV is reserved: the trace
    says which engine ran."""
    trace = TraceWriter(keep_in_memory=True)
    EngineRuntime(build_config(overrides={"engine": name}), trace)
    assert trace.events == [{"type": "engine", "engine": name, "reserves_kv": name in ("llamacpp", "tgi")}]


@pytest.mark.parametrize("messages", [[{"role": "user", "content": "Hello, world!"}],
                                      [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "a b\nc <d>"}],
                                      [{"role": "user", "content": "fix it"},  # a session's tool round trip
                                       {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type":
                                        "function", "function": {"name": "run_tests", "arguments": '{"a": "b c"}'}}]},
                                       {"role": "tool", "tool_call_id": "c1", "content": "2 failed"}]])
def test_the_llamacpp_and_tgi_templates_count_like_the_chat_rule(messages):
    assert len(template_tokens(render_template(messages))) == len(tokenizer.chat_tokens(messages))
