"""Property tests (hypothesis) of the layers a stream goes through: SSE decoding, chunk parsing, the tracker.
Inputs are drawn from grammars of what servers send; the HTTP layer's are in tests/test_properties_http.py.
The number of examples is the profile's (tests/conftest.py; HYPOTHESIS_PROFILE=ci for many more)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import example, given, strategies as st

from loadgen.core import RequestMeta, SseDecoder, StreamTracker
from loadgen.core.apis import APIS, EVENT_PARSERS, parse_embeddings_body
from loadgen.core.openai_stream import Parsed, parse_event
from loadgen.core.tracker import _error_text, _json_answer
from loadgen.drivers.fast_parse import parse_chunk

BOM = b"\xef\xbb\xbf"
# a field's value: any text without line breaks, with multi-byte UTF-8 (é, CJK, emoji, a BOM) drawn often
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=8) | \
    st.sampled_from(["", " ", "é", "東京", "🙂 ok", " lead", "x:y", "[DONE]", "\ufeff", '{"a": 1}'])


@dataclass
class SseStream:
    data: bytes
    events: list[str]  # the data of each event a WHATWG parser dispatches
    ends: list[int]  # per event: how many bytes complete it (up to the first byte of its blank line's ending)


@st.composite
def _line(draw) -> tuple[bytes, str | None]:
    """One line of an event, as servers write it: (its bytes, the data it adds, or None)."""
    kind = draw(st.sampled_from(["data", "data", "data", "comment", "event", "id", "retry", "other"]))
    value = draw(TEXT)
    raw = value.encode()
    if kind == "data":
        forms = [b"data: " + raw] + ([b"data:" + raw] if not value.startswith(" ") else []) + \
            ([b"data"] if not value else [])
        return draw(st.sampled_from(forms)), value
    if kind == "comment":  # keep-alives: ":" alone, ": ping", ":" + anything
        return b":" + raw, None
    name = {"other": b"x-extra"}.get(kind, kind.encode())
    return name + draw(st.sampled_from([b": ", b":"])) + raw, None


@st.composite
def sse_streams(draw) -> SseStream:
    """WHATWG HTML §9.2.5 (the event stream's grammar): lines end in LF, CRLF or CR (one style, or mixed); an
    event is fields, comments and `data` lines, ended by a blank line; one UTF-8 BOM may lead the stream."""
    style = draw(st.sampled_from(["\n", "\r\n", "\r", "mixed"]))
    server_like = draw(st.booleans())  # events of one `data: ` line each, LF: what servers write
    out, events, ends = bytearray(), [], []
    if draw(st.booleans()):
        out += BOM
    prev_end = ""
    for _ in range(draw(st.integers(0, 6))):
        if server_like:
            lines = [(b"data: " + (value := draw(TEXT)).encode(), value)]
        else:
            lines = draw(st.lists(_line(), max_size=4))
        for i, (raw, _) in enumerate([*lines, (b"", None)]):
            end = style if style != "mixed" else draw(st.sampled_from(["\n", "\r\n", "\r"]))
            if server_like:
                end = "\n"
            if prev_end == "\r" and not raw and end == "\n":  # CR then LF would be one CRLF ending
                end = "\r\n"
            out += raw
            if i == len(lines):  # the blank line: the event is complete at its ending's first byte
                data = [value for _, value in lines if value is not None]
                if data:
                    events.append("\n".join(data))
                    ends.append(len(out) + 1)
            out += end.encode()
            prev_end = end
    if draw(st.booleans()):  # a last event cut short: its lines (no blank line) are never dispatched
        end = b"\n" if style == "mixed" else style.encode()
        out += end.join(raw or b"x" for raw, _ in draw(st.lists(_line(), min_size=1, max_size=2)))
        out += draw(st.sampled_from([b"", end]))
    return SseStream(bytes(out), events, ends)


@st.composite
def splits(draw, data: bytes) -> list[bytes]:
    """``data`` cut into reads at random offsets (anywhere: inside a UTF-8 character, between CR and LF)."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=8)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def _decode(pieces: list[bytes]) -> list[tuple[int, str]]:
    decoder = SseDecoder()
    return [event for i, piece in enumerate(pieces) for event in decoder.feed(piece, i)]


@given(sse_streams())
@example(SseStream(b"data: \r\r", [""], [8]))  # found by this test: a last event ended by CRs was never dispatched
def test_any_event_stream_decodes_to_its_events(stream: SseStream) -> None:
    """WHATWG HTML §9.2.6: the decoder dispatches exactly the events the stream holds, however its lines end,
    whatever the comments and other fields around them, with one leading BOM dropped."""
    assert [data for _, data in _decode([stream.data])] == stream.events


@given(st.data())
def test_any_split_gives_the_same_events_stamped_by_the_read_that_completed_them(data: st.DataObject) -> None:
    """Reads end anywhere (mid-line, mid-character, between CR and LF, inside the BOM): the events are the
    same, each stamped with the read holding the byte that completed it (the token's arrival time)."""
    stream = data.draw(sse_streams())
    pieces = data.draw(splits(stream.data))
    starts = [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    read_of = [max(i for i, s in enumerate(starts) if s < end) for end in stream.ends]
    assert _decode(pieces) == list(zip(read_of, stream.events))


# ---- chunk layer: drivers/fast_parse.parse_chunk against core/openai_stream.parse_event --------------------

WRONG = st.sampled_from([None, 0, 7, -1, True, 2.5, "", "x y", [], [1], {}, {"a": 1}])
WORDS = st.sampled_from(["", " tok", "é\n", "東", '{"city": "Pa', "\ud800"]) | st.text(max_size=5)


def _chunks(wrong: bool) -> st.SearchStrategy[dict]:
    """Chat chunks with every member loadgen reads present or not; ``wrong``: any member may be of another
    type (and numbers huge, fractional or NaN), ``error`` anything, else as servers type them."""
    def v(good: st.SearchStrategy) -> st.SearchStrategy:
        return good | WRONG if wrong else good
    count = st.integers(-2, 2**70) | st.floats() if wrong else st.integers(0, 10**6)
    function = st.fixed_dictionaries({}, optional={"name": v(WORDS), "arguments": v(WORDS)})
    call = st.fixed_dictionaries({}, optional={"index": v(st.integers(0, 3)), "id": WORDS,
                                               "type": st.just("function"), "function": v(function)})
    part = WORDS | st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                         optional={"text": v(WORDS)})
    delta = st.fixed_dictionaries({}, optional={
        "role": st.just("assistant"), "content": v(st.none() | WORDS | st.lists(v(part), max_size=3)),
        "reasoning_content": v(WORDS), "reasoning": v(WORDS), "refusal": v(st.none() | WORDS),
        "tool_calls": v(st.lists(v(call), max_size=2)), "function_call": v(function)})
    choice = st.fixed_dictionaries({}, optional={
        "index": st.just(0), "delta": v(delta), "text": v(WORDS), "logprobs": st.none(),
        "finish_reason": v(st.none() | st.sampled_from(["stop", "length", "tool_calls"]))})
    usage = st.fixed_dictionaries({}, optional={
        "prompt_tokens": v(count), "completion_tokens": v(count), "total_tokens": count,
        "prompt_tokens_details": v(st.none() | st.fixed_dictionaries({}, optional={"cached_tokens": v(count)})),
        "completion_tokens_details": v(st.none() | st.fixed_dictionaries({}, optional={"reasoning_tokens": v(count)})),
        "reasoning_tokens": v(count)})  # SGLang's, top level
    failure = st.fixed_dictionaries({"message": v(WORDS)}, optional={
        "code": v(st.sampled_from([400, 429, 500, "500"])), "type": st.just("server_error")})
    error = st.none() | st.just({}) | st.just("") | st.just(False) | WORDS | failure if wrong else \
        st.none() | st.none() | st.none() | failure
    return st.fixed_dictionaries({"object": st.just("chat.completion.chunk")}, optional={
        "id": v(WORDS), "choices": v(st.lists(v(choice), max_size=2)), "usage": v(st.none() | usage),
        "error": error, "timings": st.just({"predicted_n": 3}), "system_fingerprint": st.none(),
        "provider_specific_fields": st.just({})})


THINK = st.sampled_from(["<think>", "<thi", "nk>", "</think>", "</th", "ink>\n", "<think>hm</think>ok"])
DELTAS = st.fixed_dictionaries({"content": WORDS | THINK}) | st.fixed_dictionaries({"reasoning_content": WORDS}) | \
    st.fixed_dictionaries({"reasoning": WORDS, "content": WORDS | THINK}) | \
    st.fixed_dictionaries({"reasoning_content": WORDS, "tool_calls": st.lists(st.fixed_dictionaries(
        {"index": st.integers(0, 1), "id": WORDS, "function": st.fixed_dictionaries({"name": WORDS})}), max_size=2)}) | \
    st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": WORDS}))}) | \
    st.fixed_dictionaries({"tool_calls": st.lists(st.fixed_dictionaries({"index": st.just(0), "function":
                                                  st.fixed_dictionaries({"arguments": WORDS})}), max_size=1)})
SERVER_CHUNK = st.fixed_dictionaries(  # the common shapes: one choice with one delta member, usage or not
    {"id": st.just("chatcmpl-1"), "object": st.just("chat.completion.chunk"),
     "choices": st.lists(st.fixed_dictionaries({"index": st.just(0), "delta": DELTAS, "finish_reason": st.none()}),
                         min_size=1, max_size=1)},
    optional={"usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 99),
                                              "completion_tokens": st.integers(0, 99)}), "error": st.none()})
CHUNK = SERVER_CHUNK | _chunks(wrong=False) | _chunks(wrong=True)


@st.composite
def chunk_texts(draw) -> str:
    """A chunk's JSON as sent (ASCII-escaped or raw UTF-8), now and then cut short or not an object at all;
    as the SSE decoder hands it on (bytes that are not UTF-8, a lone surrogate's, become U+FFFD)."""
    obj = draw(CHUNK if draw(st.integers(0, 19)) != 19 else st.sampled_from([[], [1], "x", 3, None]))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([None, (",", ":")])))
    if draw(st.integers(0, 9)) == 9:
        text = text[:draw(st.integers(0, len(text) - 1))]
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


@given(chunk_texts())
def test_the_fast_parser_agrees_with_the_core_on_any_chunk(data: str) -> None:
    """The hot path's msgspec parser gives the core's result on any chunk, well formed or not, and neither
    raises (tests/test_core.py checks a fixed random corpus of 5,000 too)."""
    assert parse_chunk(data) == parse_event(data)


# ---- tracker layer ---------------------------------------------------------------------------------------

@st.composite
def chat_streams(draw) -> bytes:
    """A chat stream: random chunks (text, list parts, reasoning, tool calls, "error": null, usage), keep-alive
    comments, LF or CRLF, then [DONE] (or not)."""
    end = draw(st.sampled_from([b"\n", b"\r\n"]))
    events = [draw(chunk_texts()) for _ in range(draw(st.integers(0, 6)))]
    if draw(st.integers(0, 4)) != 4:
        events.append("[DONE]")
    out = b""
    for event in events:
        if draw(st.integers(0, 5)) == 5:
            out += b": keep-alive" + end + end
        out += b"data: " + event.encode() + end + end
    return out


def _track(pieces: list[bytes], parse=None):
    meta = RequestMeta(seq=1, class_name="p", warmup=False, t_intended_ns=0, prompt_tokens_asked=8,
                       output_tokens_asked=8, keep_text=True)
    tracker = StreamTracker(meta, t_sent_ns=10, parse=parse)
    for piece in pieces:
        tracker.feed(piece, 20)
    record, chunks = tracker.finish(30)
    return record, chunks, tracker.answer


@given(st.data())
def test_a_stream_gives_the_same_records_however_it_is_read_and_parsed(data: st.DataObject) -> None:
    """The record (tokens, chunks, error, text) of a stream does not depend on where reads end, nor on which
    parser the driver hands the tracker; nothing raises, whatever the server sent."""
    stream = data.draw(chat_streams())
    whole = _track([stream])
    assert _track(data.draw(splits(stream))) == whole
    assert _track(data.draw(splits(stream)), parse=parse_chunk) == whole
    record, chunks, _ = whole
    assert record.chunks == len(chunks) and (record.error_kind is None) == (record.error_message is None)


# ---- totality: no bytes a server sends make a parser (or the tracker) raise ----------------------------------
# A parser that raises on a server's event is a request counted `internal` and exit 4, a loadgen bug: every API's
# events are drawn from grammars where each member is present, absent or of another type, and any JSON at all.

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats() |
                    st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=12)
# a member of another type than the API's: a string, a number, a list, null, an object (nested), a boolean
OTHER = st.sampled_from([None, "", "x", 0, 5, -1, 2**64, 2.5, True, [], ["x"], {}, {"a": {"b": [1]}}]) | JSON


def _member(good: st.SearchStrategy) -> st.SearchStrategy:
    return good | OTHER


def _object(kind: st.SearchStrategy, **members: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """An event object: its ``type``, then each member present (of its type or another) or absent."""
    return st.fixed_dictionaries({"type": kind}, optional={k: _member(v) for k, v in members.items()})


COUNT = st.integers(0, 10**6)
FAILURE = st.fixed_dictionaries({}, optional={"type": st.just("overloaded_error"), "message": _member(WORDS),
                                              "code": _member(st.sampled_from([400, 429, 500, "500"]))})
ANTHROPIC_USAGE = st.fixed_dictionaries({}, optional={
    "input_tokens": _member(COUNT), "output_tokens": _member(COUNT), "cache_read_input_tokens": _member(COUNT),
    "cache_creation_input_tokens": _member(COUNT)})
ANTHROPIC_EVENTS = (
    _object(st.just("message_start"), message=st.fixed_dictionaries({}, optional={
        "id": _member(WORDS), "usage": _member(ANTHROPIC_USAGE), "content": _member(st.just([]))})) |
    _object(st.just("content_block_start"), index=st.integers(0, 3), content_block=st.fixed_dictionaries(
        {"type": st.sampled_from(["tool_use", "thinking", "redacted_thinking", "text"])},
        optional={"id": _member(WORDS), "name": _member(WORDS), "data": WORDS, "thinking": WORDS})) |
    _object(st.just("content_block_delta"), index=st.just(0), delta=st.fixed_dictionaries({}, optional={
        "type": _member(st.sampled_from(["text_delta", "thinking_delta", "input_json_delta", "signature_delta"])),
        "text": _member(WORDS), "thinking": _member(WORDS), "partial_json": _member(WORDS)})) |
    _object(st.just("message_delta"), delta=st.fixed_dictionaries({}, optional={
        "stop_reason": _member(st.sampled_from(["end_turn", "max_tokens", "tool_use", "stop_sequence", "odd"]))}),
        usage=ANTHROPIC_USAGE) |
    _object(st.just("error"), error=FAILURE) |
    _object(st.sampled_from(["message_stop", "ping", "content_block_start", "content_block_stop"]) | OTHER,
            index=st.just(0), content_block=JSON))
RESPONSES_USAGE = st.fixed_dictionaries({}, optional={
    "input_tokens": _member(COUNT), "output_tokens": _member(COUNT),
    "input_tokens_details": _member(st.fixed_dictionaries({}, optional={"cached_tokens": _member(COUNT)})),
    "output_tokens_details": _member(st.fixed_dictionaries({}, optional={"reasoning_tokens": _member(COUNT)}))})
RESPONSE = st.fixed_dictionaries({}, optional={"id": _member(WORDS), "status": _member(WORDS),
                                               "usage": _member(RESPONSES_USAGE), "error": _member(FAILURE)})
RESPONSES_EVENTS = (
    _object(st.sampled_from(["response.output_text.delta", "response.refusal.delta",
                             "response.function_call_arguments.delta", "response.reasoning_text.delta",
                             "response.reasoning_summary_text.delta"]), delta=WORDS, item_id=WORDS,
            output_index=st.integers(0, 2)) |
    _object(st.just("response.output_item.added"), output_index=st.integers(0, 2), item=st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "message", "reasoning"])},
        optional={"call_id": _member(WORDS), "name": _member(WORDS), "arguments": _member(WORDS)})) |
    _object(st.sampled_from(["response.created", "response.in_progress", "response.completed",
                             "response.incomplete", "response.failed", "response.output_item.added"]) | OTHER,
            response=RESPONSE) |
    _object(st.just("error"), error=FAILURE, message=WORDS, code=st.just("server_error")))
DEEP = "[" * 3000  # json.loads and msgspec raise RecursionError on it (not a ValueError)


@st.composite
def any_event(draw) -> str:
    """An event's data: an event of one of the APIs (wrong member types included), a chat chunk, any JSON, an
    object with a known ``type`` and anything else, or text that is not JSON."""
    obj = draw(ANTHROPIC_EVENTS | RESPONSES_EVENTS | CHUNK | JSON |
               st.builds(lambda kind, rest: {**rest, "type": kind},
                         st.sampled_from(["message_start", "message_delta", "response.failed", "error"]),
                         st.dictionaries(st.sampled_from(["message", "delta", "usage", "response", "error"]),
                                         JSON | OTHER, max_size=3)))
    if draw(st.integers(0, 9)) == 9:
        return draw(st.sampled_from(["", "[DONE]", "{", "nan", DEEP, "{\"a\":" * 3000])) + draw(TEXT)
    return json.dumps(obj, ensure_ascii=draw(st.booleans()))




@given(any_event())
@example(DEEP)
@example('{"error": ' + "[" * 3000)
@example('{"type": "message_start", "message": "x"}')
@example('{"type": "message_delta", "delta": "x"}')
@example('{"type": "response.failed", "response": "x"}')
@example('{"type": "response.completed", "response": {"usage": "x"}}')
def test_no_event_makes_a_parser_raise(data: str) -> None:
    """Every API's event parser, the fast chunk parser and the embeddings body parser return a ``Parsed`` on any
    event data (a server's wrong types and JSON nested past the interpreter's stack included), and an error
    answer's body gives a message: none raises."""
    for parse in EVENT_PARSERS.values():
        assert isinstance(parse(data), Parsed)
    assert parse_chunk(data) == parse_event(data)  # the hot path's parser agrees on anything too
    assert isinstance(parse_embeddings_body(data.encode("utf-8", "surrogatepass")), Parsed)
    assert isinstance(_error_text(data), str) and isinstance(_json_answer(data)[1], str)


@given(st.sampled_from(sorted(APIS)), st.lists(any_event(), max_size=5), st.sampled_from([200, 200, 500, 429]))
@example("messages", [DEEP, '{"type": "message_stop"}'], 200)
@example("embeddings", [DEEP], 200)
@example("chat", [DEEP], 500)
def test_no_stream_makes_the_tracker_raise(api: str, events: list[str], status: int) -> None:
    """Whatever events (or body) a server sends, with whatever status, the tracker of every API finishes with a
    record whose error kind and message go together, its chunks counted."""
    tracker = StreamTracker(RequestMeta(seq=1, class_name="p", warmup=False, t_intended_ns=0, prompt_tokens_asked=8,
                                        output_tokens_asked=8, keep_text=True), t_sent_ns=10, api=api)
    for i, data in enumerate(events):
        tracker.feed(b"data: " + data.replace("\n", " ").encode("utf-8", "surrogatepass") + b"\n\n", 20 + i)
    record, chunks = tracker.finish(100, status)
    assert record.chunks == len(chunks) and (record.error_kind is None) == (record.error_message is None)
    # never a silent zero: a success has tokens, or the server says it generated at most one (a stop token)
    assert record.error_kind is not None or chunks or record.output_tokens in (0, 1)
