"""The simulator's OpenAI-compatible API over real loopback sockets."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from local_target.sim import tokenizer
from tests.sim_client import chat_body, stream

FAST = {"time_scale": 0.05}


def _stream_one(base_url: str, path: str, body: dict):
    async def go():
        async with httpx.AsyncClient(timeout=30) as client:
            return await stream(client, base_url + path, body)
    return asyncio.run(go())


def test_chat_stream_chunks_validate_against_openai_types(start_sim):
    sim = start_sim(**FAST)
    body = chat_body("llama-2-7b", 20, 12, stream_options={"include_usage": True, "continuous_usage_stats": True})
    s = _stream_one(sim.base_url, "/chat/completions", body)
    chunks = [ChatCompletionChunk.model_validate(e) for _, e in s.events if isinstance(e, dict)]
    assert s.done and s.events[-1][1] == "[DONE]"
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 12
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 20 + tokenizer.MESSAGE_OVERHEAD_TOKENS + tokenizer.GENERATION_PROMPT_TOKENS
    assert [c.usage.completion_tokens for c in content] == list(range(1, 13))  # continuous usage stats


def test_completions_stream_and_non_stream_validate(start_sim):
    sim = start_sim(**FAST)
    body = {"model": "llama-2-7b", "prompt": "one two three", "max_tokens": 5, "ignore_eos": True}
    s = _stream_one(sim.base_url, "/completions", {**body, "stream": True})
    events = [e for _, e in s.events if isinstance(e, dict)]
    # openai's Completion has no streaming variant: mid-stream chunks carry finish_reason null, which it refuses
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    chunks = [Completion.model_validate(_with_reason(e)) for e in events[:-1]] + [Completion.model_validate(events[-1])]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == s.text and tokenizer.count_tokens(s.text) == 5
    full = httpx.post(sim.base_url + "/completions", json=body, timeout=30).json()
    assert Completion.model_validate(full).usage.prompt_tokens == 3
    chat = httpx.post(sim.base_url + "/chat/completions", timeout=30, json={**chat_body("llama-2-7b", 3, 4),
                                                                            "stream": False}).json()
    assert ChatCompletion.model_validate(chat).choices[0].message.content == s.text[:len(chat["choices"][0]["message"]["content"])]


def _with_reason(event: dict) -> dict:
    return {**event, "choices": [{**event["choices"][0], "finish_reason": "stop"}]}


def test_openai_client_streams_from_the_simulator(start_sim):
    sim = start_sim(**FAST)
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused")
    assert [m.id for m in client.models.list()] == ["llama-2-7b"]
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="llama-2-7b", messages=[{"role": "user", "content": "hi"}], max_tokens=7, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert tokenizer.count_tokens("".join(parts)) == 7


def test_output_stops_early_without_ignore_eos_and_honours_min_tokens(start_sim):
    sim = start_sim(natural_output_median=5, natural_output_sigma=0.1, **FAST)
    body = {"model": "llama-2-7b", "prompt": "x", "max_tokens": 50}
    early = httpx.post(sim.base_url + "/completions", json=body, timeout=30).json()
    assert early["choices"][0]["finish_reason"] == "stop" and early["usage"]["completion_tokens"] < 50
    forced = httpx.post(sim.base_url + "/completions", json={**body, "min_tokens": 20}, timeout=30).json()
    assert forced["usage"]["completion_tokens"] >= 20


def test_tokenize_matches_usage(start_sim):
    sim = start_sim(**FAST)
    root = sim.base_url.removesuffix("/v1")
    messages = [{"role": "user", "content": "How long is this prompt, exactly?"}]
    count = httpx.post(root + "/tokenize", json={"model": "llama-2-7b", "messages": messages}).json()["count"]
    usage = httpx.post(sim.base_url + "/chat/completions", timeout=30, json={
        "model": "llama-2-7b", "messages": messages, "max_tokens": 2}).json()["usage"]
    assert usage["prompt_tokens"] == count == 8 + tokenizer.MESSAGE_OVERHEAD_TOKENS + tokenizer.GENERATION_PROMPT_TOKENS
    plain = httpx.post(root + "/tokenize", json={"prompt": "a, b", "return_token_strs": True}).json()
    assert plain["count"] == 3 and plain["token_strs"] == ["a", ",", "b"]


def test_max_chunk_tokens_coalesces_tokens_per_chunk(start_sim):
    sim = start_sim(max_chunk_tokens=4, **FAST)
    s = _stream_one(sim.base_url, "/chat/completions", chat_body("llama-2-7b", 5, 10))
    pieces = [tokenizer.count_tokens(e["choices"][0]["delta"]["content"]) for _, e in s.events
              if isinstance(e, dict) and e["choices"] and e["choices"][0]["delta"].get("content")]
    assert pieces == [4, 4, 2]


@pytest.mark.parametrize("method, path, body, status, param", [
    ("POST", "/chat/completions", "not json", 400, None),
    ("POST", "/chat/completions", {"model": "llama-2-7b"}, 400, "messages"),
    ("POST", "/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("POST", "/chat/completions", {"model": "llama-2-7b", "messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 10**6}, 400, "max_tokens"),
    ("POST", "/chat/completions", {"model": "llama-2-7b", "messages": [{"role": "robot", "content": "x"}]},
     400, "messages"),
    ("POST", "/completions", {"model": "llama-2-7b", "prompt": "x", "n": 2}, 400, "n"),
    ("POST", "/completions", {"model": "llama-2-7b", "prompt": "x", "stream_options": {"include_usage": True}},
     400, "stream_options"),
    ("POST", "/completions", {"model": "llama-2-7b", "prompt": ""}, 400, "prompt"),
    ("GET", "/chat/completions", None, 405, None),
    ("GET", "/nowhere", None, 404, None),
])
def test_bad_requests_get_openai_style_json_errors(start_sim, method, path, body, status, param):
    sim = start_sim(**FAST)
    kwargs = {"content": body} if isinstance(body, str) else {"json": body} if body is not None else {}
    resp = httpx.request(method, sim.base_url + path, timeout=30, **kwargs)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["message"] and {"type", "param", "code"} <= error.keys()
    if param:
        assert error["param"].startswith(param)


def test_metrics_parse_with_prometheus_parser_and_count_tokens(start_sim):
    sim = start_sim(**FAST)
    _stream_one(sim.base_url, "/chat/completions", chat_body("llama-2-7b", 10, 6))
    text = httpx.get(sim.base_url.removesuffix("/v1") + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:iteration_tokens_total"):
        assert name in families, name
    value = {s.name: s.value for f in families.values() for s in f.samples}
    assert value["vllm:generation_tokens_total"] == 6 and value["vllm:prompt_tokens_total"] == 16
    assert value["vllm:time_to_first_token_seconds_count"] == 1
    assert value["vllm:inter_token_latency_seconds_count"] == 5


def test_fault_injection_error_rate_and_429(start_sim):
    sim = start_sim(**{"faults.error_rate": 1.0, **FAST})
    assert httpx.post(sim.base_url + "/completions", json={"model": "llama-2-7b", "prompt": "x"}).status_code == 500
    sim = start_sim(**{"faults.queue_429_over": 0, "max_num_seqs": 1, **FAST})

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*[stream(client, sim.base_url + "/chat/completions",
                                                 chat_body("llama-2-7b", 5, 30)) for _ in range(6)])
    statuses = [s.status for s in asyncio.run(burst())]
    assert 429 in statuses and 200 in statuses


def test_fault_injection_disconnect_and_malformed(start_sim):
    sim = start_sim(**{"faults.disconnect_rate": 1.0, **FAST})
    cut = _stream_one(sim.base_url, "/chat/completions", chat_body("llama-2-7b", 5, 40))
    assert not cut.done and len(cut.content_times) < 40
    sim = start_sim(**{"faults.malformed_rate": 1.0, **FAST})
    bad = _stream_one(sim.base_url, "/chat/completions", chat_body("llama-2-7b", 5, 10))
    raw = [e for _, e in bad.events if isinstance(e, str) and e != "[DONE]"]
    assert bad.done and len(raw) == 1
    with pytest.raises(ValueError):
        json.loads(raw[0])


def test_fault_injection_engine_stall_shows_in_trace(start_sim):
    sim = start_sim(**{"faults.stall_ms": 200, "faults.stall_every_s": 0.05, "time_scale": 0.2})
    s = _stream_one(sim.base_url, "/chat/completions", chat_body("llama-2-7b", 5, 60))
    sim.stop()
    from local_target.sim import read_trace
    stalls = [e for e in read_trace(sim.trace_path) if e["type"] == "step" and e["stall_ms"] > 0]
    assert stalls and all(e["stall_ms"] == pytest.approx(40.0) for e in stalls)
    gaps = [b - a for a, b in zip(s.content_times, s.content_times[1:])]
    assert max(gaps) / 1e6 > 40
