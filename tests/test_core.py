"""The streaming core: SSE decoding, OpenAI chunk parsing, token counting, error classification."""

from __future__ import annotations

import json

import pytest

from loadgen.core import RequestMeta, SseDecoder, StreamTracker
from loadgen.core.records import ToolCall
from loadgen.core.think_tags import ThinkSplitter
from loadgen.core.token_shares import scale as _scale


def _chunk(content=None, role=None, finish=None, usage=None, reasoning=None, cid="chatcmpl-1", choices=True):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    obj = {"id": cid, "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
    if usage:
        obj["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _meta(asked_out=16):
    return RequestMeta(seq=7, class_name="chat", warmup=False, t_intended_ns=1000, prompt_tokens_asked=20,
                       output_tokens_asked=asked_out)


# (bytes of one network read, its receive time)
PACKETS = [
    (_chunk(role="assistant", content="") + _chunk(content=" Hello"), 5_000),
    (_chunk(content=" big world", usage=None), 6_000),
    (b": keep-alive comment\r\n\r\n" + _chunk(content="!", finish="stop"), 7_500),
    (_chunk(choices=False, usage=(20, 4)) + b"data: [DONE]\n\n", 8_000),
]


def _run(reads):
    tracker = StreamTracker(_meta(), t_sent_ns=2_000)
    for data, t in reads:
        tracker.feed(data, t)
    return tracker.finish(9_000)


def test_records_of_a_plain_stream():
    record, chunks = _run(PACKETS)
    assert [(c.t_ns, c.tokens) for c in chunks] == [(5_000, 1), (6_000, 2), (7_500, 1)]
    assert record.t_first_token_ns == 5_000 and record.t_last_token_ns == 7_500 and record.t_done_ns == 9_000
    assert (record.output_tokens, record.output_tokens_source) == (4, "server")
    assert (record.prompt_tokens, record.prompt_tokens_source) == (20, "server")
    assert record.finish_reason == "stop" and record.error_kind is None and record.request_id == "chatcmpl-1"


def test_identical_records_when_split_at_every_offset():
    """Each packet split in two at every byte offset (both halves read at the packet's time)."""
    expected = _run(PACKETS)
    for p, (data, t) in enumerate(PACKETS):
        for cut in range(len(data) + 1):
            reads = PACKETS[:p] + [(data[:cut], t), (data[cut:], t)] + PACKETS[p + 1:]
            assert _run(reads) == expected, (p, cut)


def test_crlf_and_cr_line_endings_split_anywhere():
    stream = b"data: a\r\n\r\ndata: b\r\rdata: c\ndata: d\n\n"
    for cut in range(len(stream) + 1):
        d = SseDecoder()
        events = d.feed(stream[:cut], 1) + d.feed(stream[cut:], 1)
        assert [e for _, e in events] == ["a", "b", "c\nd"], cut


def test_continuous_usage_gives_exact_tokens_per_chunk():
    reads = [(_chunk(role="assistant", content="", usage=(9, 0)) + _chunk(content=" a b c", usage=(9, 3)), 10),
             (_chunk(content=" d", usage=(9, 4)), 20),
             (_chunk(content=" e f", finish="length", usage=(9, 6)) + b"data: [DONE]\n\n", 30)]
    record, chunks = _run(reads)
    assert [c.tokens for c in chunks] == [3, 1, 2] and record.output_tokens == 6


def test_local_counts_are_scaled_to_the_server_total():
    reads = [(_chunk(content="aaa bbb") + _chunk(content="c"), 10),
             (_chunk(content="dd", finish="stop") + _chunk(choices=False, usage=(5, 6)) + b"data: [DONE]\n\n", 20)]
    _, chunks = _run(reads)
    assert sum(c.tokens for c in chunks) == 6 and all(c.tokens >= 1 for c in chunks)


def test_without_usage_tokens_are_counted_locally_and_flagged():
    record, chunks = _run([(_chunk(content="one two") + _chunk(content=", three") + b"data: [DONE]\n\n", 10)])
    assert [c.tokens for c in chunks] == [2, 2]
    assert record.output_tokens_source == "local" and record.prompt_tokens_source == "asked"
    assert record.prompt_tokens == 20


def test_reasoning_deltas_count_as_first_token_and_are_flagged():
    record, chunks = _run([(_chunk(role="assistant", content=""), 10), (_chunk(reasoning="hmm"), 20),
                           (_chunk(content="yes") + b"data: [DONE]\n\n", 30)])
    assert record.t_first_token_ns == 20 and record.reasoning and chunks[0].reasoning and not chunks[1].reasoning


@pytest.mark.parametrize("reads, kind, message", [
    ([(_chunk(content="a") + b'data: {"error": {"message": "engine died", "code": 500}}\n\n', 10)],
     "http_5xx", "engine died"),
    ([(_chunk(content="a") + b"data: {broken\n\n" + b"data: [DONE]\n\n", 10)], "protocol", "malformed"),
    ([(_chunk(content="a"), 10)], "protocol", "without [DONE]"),
    ([(_chunk(content="a") + b"data: {\"id\": 1", 10)], "protocol", "mid-event"),
])
def test_stream_errors_are_classified_and_keep_the_chunks(reads, kind, message):
    record, chunks = _run(reads)
    assert record.error_kind == kind and message in record.error_message
    assert len(chunks) == 1  # what arrived is kept


@pytest.mark.parametrize("status, kind", [(429, "http_429"), (400, "http_4xx"), (404, "http_4xx"),
                                          (500, "http_5xx"), (503, "http_5xx")])
def test_http_error_status(status, kind):
    tracker = StreamTracker(_meta(), 0)
    tracker.feed(b'{"error": {"message": "nope", "type": "x"}}', 5)
    record, chunks = tracker.finish(6, status=status)
    assert (record.error_kind, record.error_message, record.http_status, chunks) == (kind, "nope", status, [])


def test_driver_errors_win_and_has_content():
    tracker = StreamTracker(_meta(), 0)
    tracker.feed(_chunk(role="assistant", content=""), 5)
    assert not tracker.has_content()
    tracker.feed(_chunk(content="x"), 6)
    assert tracker.has_content()
    record, _ = tracker.finish(9, error_kind="timeout_idle", error_message="no bytes for 30 s")
    assert record.error_kind == "timeout_idle"


@pytest.mark.parametrize("weights, total", [([1, 1, 1], 7), ([3, 1], 4), ([5, 5, 1], 20), ([1], 1)])
def test_scale_keeps_total_and_minimum(weights, total):
    out = _scale(weights, total)
    assert sum(out) == total and min(out) >= 1


def test_a_line_over_the_cap_stops_buffering_and_says_why():
    dec = SseDecoder(max_event_bytes=1024)
    assert dec.feed(b'data: {"a": 1}\n\n', 1) == [(1, '{"a": 1}')]
    for _ in range(100):  # a line that never ends: 100 x 512 bytes
        assert dec.feed(b"x" * 512, 2) == []
    assert dec.overflow == "a line over 1024 bytes (target.max_event_bytes)"
    assert len(dec._buf) == 0 and dec.feed(b"\n\ndata: late\n\n", 3) == []  # nothing after it is decoded


def test_an_event_of_many_data_lines_over_the_cap_is_refused():
    dec = SseDecoder(max_event_bytes=1024)
    events = dec.feed(b"data: ok\n\n" + b"data: " + b"y" * 600 + b"\n" + b"data: " + b"y" * 600 + b"\n\n", 1)
    assert events == [(1, "ok")] and dec.overflow == "an event over 1024 bytes (target.max_event_bytes)"


def test_the_tracker_reports_an_overflow_as_a_protocol_error():
    tracker = StreamTracker(_meta(), t_sent_ns=0, max_event_bytes=1024)
    tracker.feed(_chunk(content="hi", usage=(20, 1)), 10)
    tracker.feed(b"data: " + b"z" * 4096, 20)
    assert tracker.broken == "a line over 1024 bytes (target.max_event_bytes)"
    record, chunks = tracker.finish(30)
    assert (record.error_kind, record.error_message, len(chunks)) == ("protocol", tracker.broken, 1)


def _random_chunk(rng) -> str:
    """A chunk with every member loadgen reads present or not, of the right type or another one."""
    def value(*good):
        if good and rng.random() < 0.8:
            return rng.choice(good)
        return rng.choice([None, 0, 7, -1, True, 2.5, "", "x y", [], [1], {}, {"a": 1}])

    def maybe(obj: dict, key: str, *good) -> None:
        if rng.random() < 0.7:
            obj[key] = value(*good)
    delta: dict = {}
    for key in ("content", "reasoning_content", "reasoning"):
        maybe(delta, key, " tok", "é\n")
    if rng.random() < 0.3:
        delta["content"] = value([{"type": "text", "text": " a"}, " b"], [{"type": "image_url"}], [{"text": 3}])
    if rng.random() < 0.2:
        maybe(delta, "refusal", "no")
    if rng.random() < 0.3:
        function: dict = {}
        maybe(function, "name", "get_weather")
        maybe(function, "arguments", '{"city": "Pa', "")
        maybe(delta, "tool_calls", [{"index": 0, "id": "call_1", "type": "function", "function": function}],
              [{"index": 0, "function": function}, {"index": 1}], [3])
        maybe(delta, "function_call", function)
    choice: dict = {}
    maybe(choice, "delta", delta, delta)
    maybe(choice, "text", " word")
    maybe(choice, "finish_reason", "stop", "length")
    usage: dict = {}
    maybe(usage, "prompt_tokens", 12, 0)
    maybe(usage, "completion_tokens", 3, 40)
    maybe(usage, "prompt_tokens_details", {"cached_tokens": rng.choice([8, None, "8", True])})
    if rng.random() < 0.3:
        maybe(usage, "completion_tokens_details", {"reasoning_tokens": rng.choice([5, None, 0, "5"])})
        maybe(usage, "reasoning_tokens", 4, 0)
    chunk: dict = {"object": "chat.completion.chunk", "model": "m"}
    maybe(chunk, "id", "chatcmpl-1")
    maybe(chunk, "choices", [choice], [choice, choice], [choice])
    maybe(chunk, "usage", usage, usage)
    if rng.random() < 0.15:
        chunk["error"] = value({"message": "boom", "code": 500}, "bad", None)
    text = json.dumps(chunk)
    return text if rng.random() > 0.03 else text[:rng.randrange(len(text))]  # now and then cut short


def test_the_fast_chunk_parser_agrees_with_the_core_on_any_chunk():
    """The drivers parse chat chunks with msgspec (drivers/fast_parse.py); on any input, well-formed or not,
    it must give what the core's parse_event gives."""
    import random

    from loadgen.core.openai_stream import parse_event
    from loadgen.drivers.fast_parse import parse_chunk

    rng = random.Random(5)
    corpus = ["[DONE]", "", "null", "[1]", '{"choices": {"0": {}}}', '{"choices": [{"delta": "x"}]}']
    corpus += [_random_chunk(rng) for _ in range(5000)]
    for data in corpus:
        assert parse_chunk(data) == parse_event(data), data
    import msgspec

    from loadgen.drivers import fast_parse

    def decoded(data: str) -> bool:
        try:
            return fast_parse._decode(data).error is msgspec.UNSET
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
    fast = [d for d in corpus if decoded(d)]
    # the fast path is exercised (a third of the chunks hold two choices: an error in both parsers, issue 50)
    assert len(fast) > 1000 and sum(1 for d in fast if parse_event(d).text) > 300


def test_whole_events_take_the_shortcut_and_decode_as_line_by_line(monkeypatch):
    """Feeds of whole one-line events are split on blank lines without the line loop; on any stream, cut
    anywhere or at event boundaries, the events are the ones the line-by-line decoder gives."""
    import random

    rng = random.Random(9)
    pieces = [b"data: {\"a\": 1}\n\n", b"data: x\n\n", b"data: [DONE]\n\n", b": comment\n\n", b"data:tight\n\n",
              b"data: one\ndata: two\n\n", b"event: e\ndata: y\n\n", b"data: crlf\r\n\r\n", b"\n", b"data: \xc3\xa9\n\n",
              b"data: \xff\xfe bad\n\n", b"data: \xc3\n\ndata: \xa9\n\n"]

    def decode(stream: bytes, cuts: list[int]) -> list[tuple[int, str]]:
        dec, out, start = SseDecoder(), [], 0
        for i, end in enumerate([*cuts, len(stream)]):
            out += dec.feed(stream[start:end], i)
            start = end
        return out
    shortcut = 0
    real = SseDecoder._whole_events

    def counted(self, chunk, now_ns):
        nonlocal shortcut
        events = real(self, chunk, now_ns)
        shortcut += events is not None
        return events
    for _ in range(400):
        stream = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        bounds = [i + 2 for i in range(len(stream) - 1) if stream[i:i + 2] == b"\n\n"]
        cuts = sorted(set(rng.sample(bounds, min(len(bounds), 3)) if rng.random() < 0.5
                          else [rng.randrange(len(stream)) for _ in range(3)]))
        monkeypatch.setattr(SseDecoder, "_whole_events", counted)
        fast = decode(stream, cuts)
        monkeypatch.setattr(SseDecoder, "_whole_events", lambda self, chunk, now_ns: None)
        assert fast == decode(stream, cuts), (stream, cuts)
    assert shortcut > 100


# ---- reasoning and tool calls (issue 38) -----------------------------------------------------------------------

def _delta(t_ns: int, usage: dict | None = None, **delta) -> tuple[bytes, int]:
    obj: dict = {"id": "c", "choices": [{"index": 0, "delta": delta}] if delta else []}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n", t_ns


def _phases(reads, keep_text=True, **tracker):
    meta = RequestMeta(seq=1, class_name="c", warmup=False, t_intended_ns=0, prompt_tokens_asked=5,
                       output_tokens_asked=50, keep_text=keep_text)
    t = StreamTracker(meta, t_sent_ns=100, **tracker)
    for data, t_ns in [*reads, (b"data: [DONE]\n\n", 900)]:
        t.feed(data, t_ns)
    record, chunks = t.finish(1_000)
    return record, chunks, t


THINK_CUT = [_delta(200, content="<thi"), _delta(300, content="nk>Let me"), _delta(400, content=" think</th"),
             _delta(500, content="ink>\n\nHi"), _delta(600, content=" there"),
             _delta(700, usage={"prompt_tokens": 5, "completion_tokens": 12})]


def test_inline_think_tags_are_reasoning_wherever_events_and_reads_cut_them():
    """llama-server --reasoning-format none: the tags cut between events ("<thi" + "nk>", "</th" + "ink>");
    the held start of a tag goes with the event that completes it; "</think>" then the answer in one event is one
    answer chunk whose reasoning share counts; the kept answer (a conversation's next history) has no think part."""
    record, chunks, t = _phases(THINK_CUT)
    assert [(c.t_ns, c.reasoning) for c in chunks] == [(300, True), (400, True), (500, False), (600, False)]
    assert (record.t_first_token_ns, record.t_first_answer_ns, record.t_last_reasoning_ns) == (300, 500, 500)
    assert t.answer == "\n\nHi there" and record.reasoning and sum(c.tokens for c in chunks) == 12
    # local weights (a tag one token) 3 | 1 | 1+1 | 1, scaled to 12: 5 | 2 | 3 | 2, of which 5 + 2 + 2 reasoning
    assert [c.tokens for c in chunks] == [5, 2, 3, 2] and record.reasoning_tokens == 9
    whole = b"".join(data for data, _ in THINK_CUT)
    for cut in range(1, len(whole)):  # one read cut anywhere: the same records as event by event at that time
        assert _phases([(whole[:cut], 300), (whole[cut:], 300)])[:2] == _phases([(whole, 300)])[:2]


@pytest.mark.parametrize("pieces", [["<think>ab</think>cd"], ["<", "think>a", "b</", "think", ">c", "d"],
                                    ["<think>", "ab", "</think>", "cd"], ["<think>ab</think", ">cd"]])
def test_the_think_splitter_gives_the_same_parts_however_the_text_is_cut(pieces):
    splitter = ThinkSplitter()
    parts = [splitter.feed(p) for p in pieces] + [splitter.flush()]
    assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == ("<think>ab</think>", "cd")


@pytest.mark.parametrize("pieces, answer", [(["Use <think>", " tags"], "Use <think> tags"),
                                            (["<th"], "<th"), (["<b>", "<think>x</think>"], "<b><think>x</think>")])
def test_a_stream_that_does_not_open_with_think_is_left_as_it_is(pieces, answer):
    record, chunks, t = _phases([_delta(200 + i, content=p) for i, p in enumerate(pieces)])
    assert t.answer == answer and not record.reasoning and record.reasoning_tokens == 0
    assert record.t_first_answer_ns == record.t_first_token_ns is not None


def test_think_splitting_can_be_turned_off():
    record, _, t = _phases(THINK_CUT, think_tags=False)
    assert t.answer == "<think>Let me think</think>\n\nHi there" and not record.reasoning


MIXED = [_delta(200, reasoning="a b c"), _delta(300, reasoning=" d e", content="X Y"), _delta(400, content=" Z")]


def test_a_delta_with_reasoning_and_content_is_one_answer_chunk_its_reasoning_counted():
    """vLLM's multi-token step across </think>: one chunk flagged answer (ITL), its reasoning share in the
    request's reasoning tokens (local weights 3 | 2+2 | 1 scaled to 20: 7 | 10 | 3, of which 7 + 5 reasoning)."""
    record, chunks, t = _phases([*MIXED, _delta(500, usage={"prompt_tokens": 5, "completion_tokens": 20})])
    assert [(c.t_ns, c.tokens, c.reasoning) for c in chunks] == [(200, 7, True), (300, 10, False), (400, 3, False)]
    assert (record.t_first_answer_ns, record.t_last_reasoning_ns, record.reasoning_tokens) == (300, 300, 12)
    assert t.answer == "X Y Z" and record.reasoning


def test_the_servers_reasoning_count_splits_the_chunks_tokens():
    """With usage.completion_tokens_details.reasoning_tokens, reasoning parts are scaled to it and the rest to
    the remainder: reasoning 3 + 2 -> 15 (9 + 6), answer 2 + 1 -> 5 (3 + 2)."""
    usage = {"prompt_tokens": 5, "completion_tokens": 20, "completion_tokens_details": {"reasoning_tokens": 15}}
    record, chunks, _ = _phases([*MIXED, _delta(500, usage=usage)])
    assert [c.tokens for c in chunks] == [9, 9, 2] and record.reasoning_tokens == 15
    hidden = {"prompt_tokens": 5, "completion_tokens": 30, "reasoning_tokens": 27}  # SGLang's, hidden reasoning
    record, chunks, _ = _phases([_delta(200, content="Paris."), _delta(300, usage=hidden)])
    assert (sum(c.tokens for c in chunks), record.reasoning_tokens, record.reasoning) == (30, 27, True)


def test_tool_calls_are_kept_with_their_ids_names_and_arguments():
    """Parallel calls by index; a delta with content and a tool call keeps the call out of the answer text."""
    call = [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get", "arguments": ""}}]
    reads = [_delta(200, content="Sure.", tool_calls=call),
             _delta(300, tool_calls=[{"index": 1, "id": "call_b", "function": {"name": "put"}}]),
             _delta(400, tool_calls=[{"index": 0, "function": {"arguments": '{"k": '}}]),
             _delta(500, tool_calls=[{"index": 1, "id": None, "function": {"name": None, "arguments": "{}"}}]),
             _delta(600, tool_calls=[{"index": 0, "function": {"arguments": "1}"}}]),
             _delta(700, usage={"prompt_tokens": 5, "completion_tokens": 14})]
    record, chunks, t = _phases(reads)
    assert t.tool_calls == (ToolCall("call_a", "get", '{"k": 1}'), ToolCall("call_b", "put", "{}"))
    assert t.answer == "Sure." and record.tool_calls == 2 and record.t_first_answer_ns == 200
    assert 0 < record.tool_tokens < 14 and record.reasoning_tokens == 0
    record, _, t = _phases(reads, keep_text=False)
    assert t.tool_calls == () and record.tool_calls == 2  # counted always, kept for session calls only


def test_an_anthropic_thinking_block_without_text_marks_reasoning():
    events = [{"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5}}},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "redacted_thinking", "data": "x"}},
              {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
              {"type": "message_stop"}]
    t = StreamTracker(_meta(), t_sent_ns=1, api="messages")
    for i, e in enumerate(events):
        t.feed(b"data: " + json.dumps(e).encode() + b"\n\n", 10 + i)
    record, chunks = t.finish(20)
    assert record.reasoning and [c.reasoning for c in chunks] == [False] and record.t_last_reasoning_ns is None



def test_a_session_calls_place_is_copied_into_its_record_whatever_its_end():
    from loadgen.core.tracker import bare_record
    place = {"session": 3, "call": 5, "agent": 1, "step": 2, "after_call": 4, "t_ready_ns": 800, "wait_ns": 200,
             "wait_kind": "tool"}
    meta = RequestMeta(seq=9, class_name="agent", warmup=False, t_intended_ns=1_000, prompt_tokens_asked=5,
                       output_tokens_asked=5, keep_text=True, **place)
    tracker = StreamTracker(meta, t_sent_ns=1_000)
    tracker.feed(_chunk(content="ok") + _chunk(choices=False, usage=(5, 1)) + b"data: [DONE]\n\n", 1_500)
    records = [tracker.finish(2_000)[0], StreamTracker(meta, 1_000).finish(2_000, 500)[0],
               bare_record(meta, 1_000, 2_000, 0, "internal", "bug")]
    for record in records:
        assert {k: getattr(record, k) for k in place} == place
    assert (records[0].reasoning_tokens, records[0].tool_calls, records[1].reasoning_tokens) == (0, 0, None)
