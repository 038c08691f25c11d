"""What a server's stream can do to the parsers and the tracker: never make them raise (a request counted
``internal``, exit 4), never pass for a success without a token (the silent zero). The random inputs are in
tests/test_properties.py; these are the cases found in review, pinned."""

from __future__ import annotations

import json

import pytest

from loadgen.core import RequestMeta, StreamTracker
from loadgen.core.apis import EVENT_PARSERS, parse_anthropic_event, parse_embeddings_body, parse_responses_event
from loadgen.core.openai_stream import Parsed, error_of
from loadgen.core.secrets import CUT
from loadgen.core.tracker import _error_text, _json_answer
from loadgen.drivers.fast_parse import parse_chunk


@pytest.mark.parametrize("event", [
    {"type": "message_start", "message": "x"}, {"type": "message_start", "message": {"usage": [1]}},
    {"type": "message_delta", "delta": "x"}, {"type": "message_delta", "delta": {}, "usage": 3},
    {"type": "content_block_delta", "delta": ["x"]}, {"type": "error", "error": None},
])
def test_an_anthropic_event_of_wrong_member_types_is_parsed(event):
    assert parse_anthropic_event(json.dumps(event)).text == ""


@pytest.mark.parametrize("event", [
    {"type": "response.failed", "response": "x"}, {"type": "response.failed", "response": {"error": None}},
    {"type": "response.completed", "response": {"usage": "x"}},
    {"type": "response.completed", "response": {"usage": {"input_tokens_details": 4}}},
    {"type": "response.output_text.delta", "delta": {"text": "x"}},
])
def test_a_responses_event_of_wrong_member_types_is_parsed(event):
    assert parse_responses_event(json.dumps(event)).text == ""


@pytest.mark.parametrize("data", ["[" * 3000, '{"a": ' * 3000, '{"error": ' + "[" * 5000])
def test_json_nested_past_the_stack_is_a_malformed_event_not_a_crash(data):
    for parse in (*EVENT_PARSERS.values(), parse_chunk):
        assert parse(data).error.startswith(("malformed", "chunk is not", "event is not"))
    assert parse_chunk(data) == EVENT_PARSERS["chat"](data)
    assert parse_embeddings_body(data.encode()).error.startswith("the answer is not JSON")
    assert _error_text(data).startswith(data[:20]) and _json_answer(data)[0] == "protocol"


def test_an_error_value_too_deep_to_print_is_named_not_raised():
    """JSON decoded just within the stack's depth can be too deep to print one frame further down."""
    value: list = []
    for _ in range(5000):
        value = [value]
    assert error_of({"message": value, "code": 500}) == Parsed(
        error="(an error value nested too deeply to print: list)", error_status=500)


# ---- the silent zero: a clean end, no token read ------------------------------------------------------------

def _track(api: str, events: list[object], asked: int = 5):
    tracker = StreamTracker(RequestMeta(0, "a", False, 0, 5, asked), 1, api=api)
    for n, e in enumerate(events):
        tracker.feed(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode(), 10 + n)
    return tracker.finish(100)


UNKNOWN = {"id": "c1", "choices": [{"index": 0, "delta": {"text": "tok"}}]}  # tokens in a member loadgen does not read


def _usage(n: int) -> dict:
    return {"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}


def test_tokens_the_server_reports_but_no_event_carried_are_a_protocol_error():
    """Issue case 7: five chunks whose tokens are in ``delta.text``, usage 5, [DONE]: not a success of 0 chunks."""
    record, chunks = _track("chat", [UNKNOWN] * 5 + [_usage(5), "[DONE]"])
    assert (record.error_kind, record.chunks, record.t_first_token_ns, chunks) == ("protocol", 0, None, [])
    assert record.error_message == ("the server reports 5 output tokens but no event carried one loadgen reads "
                                    f"(first event: {json.dumps(UNKNOWN)})")


def test_no_token_read_and_no_usage_is_a_protocol_error_naming_the_first_event():
    long_first = {**UNKNOWN, "system_fingerprint": "f" * 200}
    record, _ = _track("completions", [long_first] + [UNKNOWN] * 4 + ["[DONE]"])
    assert record.error_kind == "protocol"
    assert record.error_message == ("no event carried a token loadgen reads, and no usage says none were generated "
                                    f"(first event: {json.dumps(long_first)[:120]}{CUT})")


@pytest.mark.parametrize("api, events", [
    ("messages", [{"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5}}},
                  {"type": "content_block_delta", "delta": {"type": "text", "content": "tok"}},
                  {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
                  {"type": "message_stop"}]),
    ("responses", [{"type": "response.created", "response": {"id": "r"}},
                   {"type": "response.output_text.chunk", "text": "tok"},
                   {"type": "response.completed", "response": {"id": "r", "usage": {"output_tokens": 3}}}]),
])
def test_every_api_reports_tokens_it_could_not_read(api, events):
    record, _ = _track(api, events)
    assert record.error_kind == "protocol" and record.error_message.startswith("the server reports 3 output tokens")


@pytest.mark.parametrize("api, events", [
    ("chat", [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, _usage(0), "[DONE]"]),
    # an immediate end of sequence: servers count the stop token, which has no text
    ("chat", [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, _usage(1), "[DONE]"]),
    # one token asked, a special one the server's reasoning parser consumed (<think>): counted, no text
    ("chat", [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, _usage(1), "[DONE]"]),
    ("completions", [{"id": "c", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}, _usage(0),
                     "[DONE]"]),
    ("responses", [{"type": "response.created", "response": {"id": "r"}},
                   {"type": "response.completed", "response": {"id": "r", "usage": {"output_tokens": 0}}}]),
    ("messages", [{"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5}}},
                  {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 0}},
                  {"type": "message_stop"}]),
])
def test_an_answer_the_server_says_is_empty_stays_a_success(api, events):
    record, chunks = _track(api, events)
    assert (record.error_kind, record.error_message, chunks) == (None, None, [])
    assert record.output_tokens == (1 if _usage(1) in events else 0)


@pytest.mark.parametrize("asked", [0, 1])
def test_one_token_asked_without_usage_may_come_back_without_text(asked):
    """The preflight's probe asks one token; a server that sends no usage may answer it with none loadgen reads
    (an end of sequence, a consumed <think>): not an answer the probe can call broken. Two asked: it is."""
    events = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": "length"}]},
              "[DONE]"]
    assert _track("chat", events, asked=asked)[0].error_kind is None
    assert _track("chat", events, asked=2)[0].error_kind == "protocol"


@pytest.mark.parametrize("api, events", [
    ("chat", [{"id": "c", "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}, _usage(1), "[DONE]"]),
    ("responses", [{"type": "response.reasoning_text.delta", "delta": "hm"},
                   {"type": "response.completed", "response": {"id": "r", "usage": {"output_tokens": 1}}}]),
    ("messages", [{"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "hm"}},
                  {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
                  {"type": "message_stop"}]),
    ("chat", [{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"name": "f", "arguments": "{}"}}]}}]}, _usage(2), "[DONE]"]),
    # a function call whose name alone came (its item), and an Anthropic tool_use block with empty input
    ("responses", [{"type": "response.output_item.added", "output_index": 0,
                    "item": {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}},
                   {"type": "response.completed", "response": {"id": "r", "usage": {"output_tokens": 1}}}]),
    ("messages", [{"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t",
                                                                               "name": "f", "input": {}}},
                  {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 1}},
                  {"type": "message_stop"}]),
])
def test_reasoning_or_a_tool_call_alone_is_an_answer(api, events):
    record, chunks = _track(api, events)
    assert record.error_kind is None and len(chunks) == 1 and record.t_first_token_ns == 10
