"""The streaming core: SSE decoding, OpenAI chunk parsing, token counting, error classification."""

from __future__ import annotations

import json

import pytest

from loadgen.core import RequestMeta, SseDecoder, StreamTracker
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


def _meta(asked_out=3):
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
    assert len(fast) > 1000 and sum(1 for d in fast if parse_event(d).text) > 500  # the fast path is exercised


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
