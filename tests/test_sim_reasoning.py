"""The simulator reasons and calls tools (local_target/sim/reasoning.py): every stream shape, served in
process, read back as a client reads it and through loadgen's core tracker, against the simulator's truth."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from local_target.sim import tokenizer

REASONING = {"time_scale": 0.02, "spin_ms": 0.0, "prefix_caching": True, "reasoning.median_tokens.low": 9,
             "reasoning.sigma": 0.3, "tool_call_median_tokens": 14}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"city": {}}}}}]
PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def _serve_and_stream(overrides: dict, requests: list[tuple[str, dict]]) -> tuple[list, list[dict]]:
    """Each (api, body) streamed in turn from one in-process simulator: [(reads [(t_ns, bytes)], api)], trace."""
    from local_target.sim import build_config, serve

    async def go():
        cfg = build_config(overrides={**REASONING, **overrides})
        sim = await serve(cfg, keep_trace=True)
        out = []
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for api, body in requests:
                    async with client.stream("POST", sim.base_url + PATHS[api], json=body) as resp:
                        assert resp.status_code == 200, await resp.aread()
                        out.append(([(time.monotonic_ns(), b) async for b in resp.aiter_raw()], api))
        finally:
            await sim.close()
        return out, sim.runtime.trace.events
    return asyncio.run(go())


def _body(api: str, words: int = 6, max_tokens: int = 40, **asks) -> dict:
    content = " ".join(f"w{i}" for i in range(words))
    if api == "chat":
        return {"model": "llama-2-7b", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **asks}
    if api == "responses":
        return {"model": "llama-2-7b", "input": content, "max_output_tokens": max_tokens, "stream": True,
                "ignore_eos": True, **asks}
    return {"model": "llama-2-7b", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, **asks}


def _events(reads: list) -> list[dict]:
    data = b"".join(b for _, b in reads).decode()
    return [json.loads(line[6:]) for line in data.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def _phases(api: str, events: list[dict], field: str = "reasoning") -> dict[str, str]:
    """The streamed text of each phase, read from the events as a client would (think tags split out)."""
    out = {"reasoning": "", "answer": "", "name": "", "args": ""}
    for e in events:
        if api == "chat":
            delta = e["choices"][0]["delta"] if e["choices"] else {}
            out["reasoning"] += delta.get(field) or ""
            out["answer"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                out["name"] += call["function"].get("name") or ""
                out["args"] += call["function"].get("arguments") or ""
        elif api == "responses":
            kind, item = e["type"], e.get("item") or {}
            key = {"response.reasoning_text.delta": "reasoning", "response.output_text.delta": "answer",
                   "response.function_call_arguments.delta": "args"}.get(kind)
            out[key or "name"] += e.get("delta", "") if key else item.get("name", "")
        elif e["type"] in ("content_block_delta", "content_block_start"):
            d = e.get("delta") or {}
            out["reasoning"] += d.get("thinking", "")
            out["answer"] += d.get("text", "")
            out["args"] += d.get("partial_json", "")
            out["name"] += (e.get("content_block") or {}).get("name", "")
    if field == "think_tags" and out["answer"].startswith("<think>"):
        head, _, tail = out["answer"].partition("</think>")
        out["reasoning"], out["answer"] = head.removeprefix("<think>"), tail
    return out


def _truth(trace: list[dict], kind: str) -> list[dict]:
    return [e for e in trace if e["type"] == kind]


def _track(reads: list, api: str, asked: int):
    from loadgen.core.tracker import RequestMeta, StreamTracker

    tracker = StreamTracker(RequestMeta(0, "c", False, 0, 5, asked, keep_text=True), reads[0][0], api=api)
    for t_ns, data in reads:
        tracker.feed(data, t_ns)
    return tracker.finish(reads[-1][0])


def _check_against_truth(reads: list, api: str, finish: dict, trace: list[dict], field: str = "reasoning"):
    """The stream's contents, and loadgen's core tracker, against the trace's truth for one request."""
    events = _events(reads)
    text = _phases(api, events, field)
    assert tokenizer.count_tokens(text["reasoning"]) == finish["reasoning_tokens"]
    assert tokenizer.count_tokens(text["answer"] + text["name"] + text["args"]) == finish["answer_tokens"]
    assert tokenizer.count_tokens(text["name"] + text["args"]) == finish["tool_tokens"]
    if finish["tool_calls"]:
        assert text["name"] == "get_weather" and isinstance(json.loads(text["args"]), dict)
    record, chunks = _track(reads, api, 40)
    assert record.error_kind is None and record.output_tokens == finish["output_tokens"]
    for name in ("reasoning_tokens", "tool_tokens", "tool_calls"):  # loadgen's counts, where it has them
        if getattr(record, name, None) is not None:
            assert getattr(record, name) == finish[name], name
    write_ns = {(tid, i): t for s in _truth(trace, "step") for tid, i, t in s["tokens"]}
    first_answer = write_ns[(finish["id"], finish["first_answer_index"])]
    if getattr(record, "t_first_answer_ns", None) is not None:  # read no earlier than the truth wrote it
        assert record.t_first_answer_ns >= first_answer
        if api == "chat":
            assert record.t_first_answer_ns == _first_answer_read(reads, field)
    if field != "think_tags":
        assert bool([c for c in chunks if c.reasoning]) == (finish["reasoning_tokens"] > 0)
    return text


def _first_answer_read(reads: list, field: str) -> int:
    """When the read came that completed the first chat event carrying answer text or a tool call."""
    for k in range(1, len(reads) + 1):
        text = _phases("chat", _events(reads[:k]), field)
        if text["answer"] or text["name"]:
            return reads[k - 1][0]
    raise AssertionError("no answer")


@pytest.mark.parametrize("field, mixed", [("reasoning_content", False), ("reasoning", False), ("think_tags", False),
                                          ("reasoning", True)])
def test_chat_streams_reasoning_in_each_shape_and_counts_match_the_truth(field, mixed):
    reads, trace = _serve_and_stream({"reasoning.stream_field": field, "reasoning.mixed_boundary": mixed},
                                     [("chat", _body("chat", reasoning_effort="low"))])
    finish, = _truth(trace, "finish")
    assert finish["reasoning_tokens"] > 0 and finish["answer_tokens"] == 40 - finish["reasoning_tokens"]
    text = _check_against_truth(reads[0][0], "chat", finish, trace, field)
    events = [e for e in _events(reads[0][0]) if e["choices"]]
    both = [e for e in events if e["choices"][0]["delta"].get("content") and e["choices"][0]["delta"].get(field)]
    assert len(both) == (1 if mixed and field != "think_tags" else 0)
    assert text["answer"] == "".join(tokenizer.output_token(i) for i in range(finish["answer_tokens"]))
    usage = _events(reads[0][0])[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == finish["reasoning_tokens"]
    if field == "think_tags":
        assert _events(reads[0][0])[1]["choices"][0]["delta"]["content"].startswith("<think>")


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_responses_and_messages_stream_reasoning_then_a_tool_call(api):
    asks = ({"reasoning": {"effort": "low"}, "tools": [{"type": "function", "name": "get_weather"}],
             "tool_choice": "required"} if api == "responses" else
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "tool_choice": {"type": "any"},
             "tools": [{"name": "get_weather", "input_schema": {"properties": {"city": {}}}}]})
    think = {"reasoning": asks["reasoning"]} if api == "responses" else {"thinking": asks["thinking"]}
    reads, trace = _serve_and_stream({"reasoning.median_tokens.medium": 9},
                                     [(api, _body(api, **asks)), (api, _body(api)), (api, _body(api, **think))])
    tool, plain, thought = _truth(trace, "finish")
    assert tool["reasoning_tokens"] > 0 and tool["tool_calls"] == 1 and tool["answer_tokens"] == tool["tool_tokens"]
    _check_against_truth(reads[0][0], api, tool, trace)
    last = _events(reads[0][0])[-2 if api == "messages" else -1]
    if api == "responses":
        assert last["type"] == "response.completed"
        assert last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == tool["reasoning_tokens"]
    else:
        assert last["delta"]["stop_reason"] == "tool_use" and last["usage"]["output_tokens"] == tool["output_tokens"]
        kinds = [e["delta"]["type"] for e in _events(reads[0][0]) if e["type"] == "content_block_delta"]
        assert kinds.index("signature_delta") == tool["reasoning_tokens"]  # after every thinking delta
    assert (plain["reasoning_tokens"], plain["tool_calls"]) == (0, 0)  # asks nothing: none
    _check_against_truth(reads[1][0], api, plain, trace)
    assert thought["reasoning_tokens"] > 0 and thought["answer_tokens"] == 40 - thought["reasoning_tokens"]
    text = _check_against_truth(reads[2][0], api, thought, trace)
    assert text["answer"] == "".join(tokenizer.output_token(i) for i in range(thought["answer_tokens"]))


ASK_TOOL = {"chat": {"tools": TOOLS, "tool_choice": "required"},
            "responses": {"tools": [{"type": "function", "name": "get_weather",
                                     "parameters": {"properties": {"city": {}}}}], "tool_choice": "required"},
            "messages": {"tools": [{"name": "get_weather", "input_schema": {"properties": {"city": {}}}}],
                         "tool_choice": {"type": "any"}}}


def _transcript(api: str, first: dict, name: str, arguments: str) -> dict:
    """The next call as a client sends it: the history, the assistant's tool call, the tool's result."""
    if api == "chat":
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
        return {**first, "messages": first["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny and 21 C"}]}
    if api == "responses":
        return {**first, "input": [{"role": "user", "content": first["input"]},
                                   {"type": "function_call", "call_id": "c1", "name": name, "arguments": arguments},
                                   {"type": "function_call_output", "call_id": "c1", "output": "sunny and 21 C"}]}
    return {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": name,
                                           "input": json.loads(arguments)}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny and 21 C"}]}]}


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_tool_call_sent_back_is_counted_in_the_next_prompt_and_hits_the_prefix_cache(api):
    first = _body(api, words=40, **ASK_TOOL[api])
    reads, trace = _serve_and_stream({}, [(api, first)])
    text = _phases(api, _events(reads[0][0]))
    finish, = _truth(trace, "finish")
    assert finish["tool_calls"] == 1
    words = finish["tool_tokens"] - 1 - 8  # the name's token, and {"city":""}
    assert json.loads(text["args"]) == {"city": "".join(tokenizer.output_token(i) for i in range(words))}
    reads, trace = _serve_and_stream({}, [(api, first), (api, _transcript(api, first, text["name"], text["args"]))])
    one, two = _truth(trace, "request")
    assert two["prompt_tokens"] == (  # the assistant message (its tool call) and the tool message, each + 4
        one["prompt_tokens"] + finish["tool_tokens"] + 2 * tokenizer.MESSAGE_OVERHEAD_TOKENS + 4)
    cached = _truth(trace, "finish")[1]["cached_tokens"]
    assert cached == (one["prompt_tokens"] + finish["tool_tokens"]) // 16 * 16  # through the tool call
    assert cached > one["prompt_tokens"]
    if api == "chat":
        assert _events(reads[1][0])[-1]["usage"]["prompt_tokens"] == two["prompt_tokens"]
        assert _events(reads[0][0])[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_and_tool_chunks_and_answers_validate_against_openai_types():
    stream = _body("chat", reasoning_effort="low", tools=TOOLS, tool_choice="required")
    reads, trace = _serve_and_stream({}, [("chat", stream), ("chat", {**stream, "stream": False,
                                                                      "stream_options": None})])
    chunks = [ChatCompletionChunk.model_validate(e) for e in _events(reads[0][0])]
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].type == "function"
    full = ChatCompletion.model_validate_json(b"".join(b for _, b in reads[1][0]))
    truth = _truth(trace, "finish")[1]
    call = full.choices[0].message.tool_calls[0]
    assert full.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments)
    assert tokenizer.count_tokens(call.function.name + call.function.arguments) == truth["tool_tokens"]
    assert tokenizer.count_tokens(full.choices[0].message.model_extra["reasoning"]) == truth["reasoning_tokens"]
    assert full.usage.completion_tokens_details.reasoning_tokens == truth["reasoning_tokens"] > 0


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_non_streamed_answers_carry_the_reasoning_and_the_tool_call(api):
    think = {"reasoning": {"effort": "low"}} if api == "responses" else {
        "thinking": {"type": "enabled", "budget_tokens": 1024}}
    body = {**_body(api, **ASK_TOOL[api], **think), "stream": False}
    reads, trace = _serve_and_stream({"reasoning.median_tokens.medium": 9}, [(api, body)])
    full, truth = json.loads(b"".join(b for _, b in reads[0][0])), _truth(trace, "finish")[0]
    parts = full["output"] if api == "responses" else full["content"]
    assert [p["type"] for p in parts] == (["reasoning", "function_call"] if api == "responses" else
                                          ["thinking", "tool_use"])
    thought = parts[0]["content"][0]["text"] if api == "responses" else parts[0]["thinking"]
    call = parts[1]
    arguments = call["arguments"] if api == "responses" else json.dumps(call["input"], separators=(",", ":"))
    assert tokenizer.count_tokens(thought) == truth["reasoning_tokens"] > 0
    assert tokenizer.count_tokens(call["name"] + arguments) == truth["tool_tokens"] and json.loads(arguments)
    if api == "responses":
        assert full["usage"]["output_tokens_details"]["reasoning_tokens"] == truth["reasoning_tokens"]
    else:
        assert full["stop_reason"] == "tool_use" and parts[0]["signature"]
