"""Theory of operation: one ``StreamTracker`` per request, fed ``(bytes, now_ns)`` by a driver.

The driver stamps each read before calling ``feed``; ``feed`` decodes the SSE events it completes (each
stamped with that read's time) and parses them at once (~5 µs a chunk). Parsing after the stream ended was
measured too (bench/fidelity.py): streams that end together then parse together, and at 256 streams that
burst held the loop for a whole inter-token interval (chunk-gap p99 error 20 ms); parsing as reads arrive
spreads the same work evenly. Each chunk that carries generated text becomes its ``ChunkRecord`` as it
arrives, so ``finish`` (one ``RequestRecord``) stays cheap when many streams end at once.

Tokens per chunk: exact from vLLM's ``continuous_usage_stats`` (the running ``completion_tokens``) when every
content chunk has it; otherwise each chunk's local estimate, rescaled at ``finish`` (largest remainder) so they
sum to the server's final ``usage.completion_tokens``; with no usage at all, the local estimate (flagged
``local`` in the request record).

Reasoning and tool calls (plan.md §2.4). Every chunk is one event that carries generated text; it is flagged
``reasoning`` when ALL its text is reasoning. A mixed event (reasoning beside content or a tool call, or
``</think>`` then the answer inside one event) is ONE chunk of the answer whose reasoning share is counted in the
request's ``reasoning_tokens``: ``t_first_token_ns`` (TTFT) is the first chunk of any kind, ``t_first_answer_ns``
the first chunk whose tokens are not all reasoning (answer text or a tool call). ``reasoning_tokens`` is the
server's count when it gives one (usage details), else each chunk's share: its tokens split by the local weights
of its parts (reasoning, tool, answer); with a server count, the reasoning parts are rescaled to it and the rest
to the remainder. Inline ``<think>…</think>`` in the content is split out (``think_tags.ThinkSplitter``) when a
stream's first content starts with ``<think>``; the kept answer text (a conversation's next history) leaves
reasoning and tool calls out, and the tool calls are kept apart (``tool_calls``) with their ids and names.

A 200 stream that ends well but in which no event carried a token loadgen reads is a ``protocol`` error naming
its first event (``_no_token``), unless the server says it generated none: never a success without a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from loadgen.core.apis import EVENT_PARSERS, parse_embeddings_body
from loadgen.core.openai_stream import ERROR_TEXT_CHARS, Parsed, ToolDelta, error_of, local_token_weight, weight
from loadgen.core.secrets import CUT, clip
from loadgen.core.records import ChunkRecord, RequestRecord, ToolCall
from loadgen.core.think_tags import ThinkSplitter, tag_excess
from loadgen.core.token_shares import phase_tokens, settle_usage
from loadgen.core.sse import MAX_EVENT_BYTES, SseDecoder
from loadgen.core.usage_claims import Seen, running


@dataclass(slots=True)
class RequestMeta:
    seq: int
    class_name: str
    warmup: bool
    t_intended_ns: int
    prompt_tokens_asked: int
    output_tokens_asked: int
    worker: int = 0
    conversation: int | None = None
    turn: int | None = None
    keep_text: bool = False  # a conversation's turn: its answer is the next turn's history
    # an agentic session's call (plan.md §2.4): copied as they are into the RequestRecord's fields of these names
    session: int | None = None
    call: int | None = None
    agent: int | None = None
    step: int | None = None
    after_call: int | None = None
    t_ready_ns: int | None = None
    wait_ns: int | None = None
    wait_kind: str | None = None
    body_bytes: int | None = None  # the request body's size: bounds the prompt tokens a server may claim
    output_cap: int | None = None  # its max_tokens, a reasoning budget included (None: output_tokens_asked)


def error_kind_for_status(status: int) -> str:
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    return "protocol"


ERROR_BODY_BYTES = 4096  # an error answer's message is cut to 300 characters anyway


class StreamTracker:
    __slots__ = ("meta", "t_sent_ns", "last_read_ns", "_head", "_decoder", "_chunks", "_exact", "_last_count",
                 "_summary", "_error", "_text", "record", "_parse", "_body", "_events", "_first", "_parts", "_calls",
                 "_think", "_opaque", "_chars", "_rejected", "claimed", "after_done")

    def __init__(self, meta: RequestMeta, t_sent_ns: int, max_event_bytes: int = MAX_EVENT_BYTES,
                 api: str = "chat", parse: Callable[[str], Parsed] | None = None, think_tags: bool = True) -> None:
        """``parse``: the event parser, when a driver has a faster one giving the same ``Parsed``; default the
        API's own (``apis.EVENT_PARSERS``). ``think_tags``: split ``<think>…</think>`` out of a stream whose
        first content starts with ``<think>`` (every driver leaves it on: no scenario setting turns it off; a
        stream whose content starts otherwise is never split); False leaves the content as it is."""
        self.meta = meta
        self.t_sent_ns = t_sent_ns
        self.last_read_ns = 0  # for idle timeouts
        self._head = bytearray()  # the body's first bytes: the message of a non-200 answer
        self._decoder = SseDecoder(max_event_bytes)
        self._parse = parse or EVENT_PARSERS.get(api)  # None: an answer that is one JSON body (embeddings)
        self._body: bytearray | None = None if self._parse else bytearray()
        self._chunks: list[ChunkRecord] = []
        self._exact = True  # every content chunk so far carried a running completion_tokens
        self._last_count = 0
        self._summary = Parsed()
        self._error: tuple[str, str] | None = None
        self._text: list[str] | None = [] if meta.keep_text else None
        self._events = False  # any SSE event decoded (none, with a 200: the answer was not an event stream)
        self._first = ""  # the first event's data: named when no event carried a token loadgen reads
        self._parts: list[tuple[int, int, int]] = []  # per chunk: local weights of its reasoning, tool, answer text
        self._calls: dict[int, tuple[str, str, list[str]]] = {}  # tool calls by index: id, name, argument pieces
        self._think: ThinkSplitter | None = ThinkSplitter() if think_tags else None  # None: no more splitting
        self._opaque = False  # a reasoning event without text (a thinking block that streams none)
        self._chars = 0  # characters of generated text received: bounds the output tokens (usage_claims)
        self._rejected: str | None = None  # why a usage claim was not taken (usage_claims.judge)
        self.claimed: tuple[int | None, int | None] = (None, None)  # usage's completion and prompt tokens, unjudged
        self.after_done = 0  # events after the stream's end ([DONE]): not counted
        self.record: RequestRecord | None = None  # set by finish

    @property
    def answer(self) -> str:
        """The generated text (content, not reasoning nor tool calls), kept when ``meta.keep_text``."""
        return "".join(self._text or ())

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The answer's tool calls (id, function name, arguments as streamed), kept when ``meta.keep_text``."""
        if self._text is None:
            return ()
        return tuple(ToolCall(call_id, name, "".join(args)) for call_id, name, args in self._calls.values())

    def feed(self, data: bytes, now_ns: int) -> None:
        self.last_read_ns = now_ns
        if len(self._head) < ERROR_BODY_BYTES:
            self._head += data[:ERROR_BODY_BYTES - len(self._head)]
        parse = self._parse
        if parse is None:  # an answer that is one JSON body (embeddings), not events
            self._feed_body(data)
            return
        for t_event, event in self._decoder.feed(data, now_ns):
            self._event(t_event, parse(event), event)

    def _feed_body(self, data: bytes) -> None:
        assert self._body is not None
        if len(self._body) + len(data) > self._decoder.max_event_bytes:
            self._decoder.overflow = f"an answer over {self._decoder.max_event_bytes} bytes (target.max_event_bytes)"
        elif self._decoder.overflow is None:
            self._body += data

    def _event(self, t_ns: int, p: Parsed, data: str) -> None:
        """One event: ``data`` as received, ``p`` what the API's parser read in it."""
        summary = self._summary
        if summary.done:  # OpenAI's stream ends at [DONE] (WHATWG SSE has no end event): the rest is not counted
            self.after_done += 1
            return
        if not self._events:
            self._events, self._first = True, data
        if p.done:  # the end (OpenAI's [DONE]; the Responses API's response.completed carries usage too)
            summary.done = True
        summary.request_id = summary.request_id or p.request_id
        summary.finish_reason = p.finish_reason or summary.finish_reason
        if p.prompt_tokens is not None:
            summary.prompt_tokens = p.prompt_tokens
        if p.cached_tokens is not None:
            summary.cached_tokens = p.cached_tokens
        if p.reasoning_tokens is not None:
            summary.reasoning_tokens = p.reasoning_tokens
        if p.calls:
            self._add_calls(p.calls)
        held, count = False, p.completion_tokens
        self._chars += len(p.text) + len(p.reasoning_text)
        if count is not None:  # a running count is a claim too: one a stream of this size can hold
            cap = self.meta.output_cap or self.meta.output_tokens_asked
            count = running(count, self._last_count, cap, self._chars, len(self._chunks) + 1)
        if p.text:
            if p.reasoning or p.tool or p.reasoning_text or p.calls or self._think is not None:
                held = not self._chunk(t_ns, *self._split(p), count)
            else:  # the common event: answer text alone
                tokens = self._tokens(count, p.text)
                self._chunks.append(ChunkRecord(self.meta.seq, t_ns, tokens, False, self.meta.worker))
                self._parts.append((0, 0, tokens))
                if self._text is not None:
                    self._text.append(p.text)
        elif p.reasoning:
            self._opaque = True
        if p.completion_tokens is not None:
            summary.completion_tokens = p.completion_tokens  # the final claim is judged at the end
            if count is not None and not held:  # text held back (a tag cut short) counts with the chunk taking it
                self._last_count = count
        if p.error and self._error is None:
            self._error = (error_kind_for_status(p.error_status) if p.error_status else "protocol", p.error)

    def _tokens(self, count: int | None, text: str) -> int:
        """A chunk's tokens: exact from the running count (vLLM's continuous usage stats), else a local estimate."""
        if count is not None:
            return max(1, count - self._last_count)
        self._exact = False
        return local_token_weight(text)

    def _split(self, p: Parsed) -> tuple[str, str, str]:
        """An event's text as (reasoning, tool call, answer) parts."""
        if p.reasoning:
            return p.text, "", ""
        if p.tool:
            return p.reasoning_text, p.text, ""
        cut = len(p.text) - sum(len(c.name) + len(c.arguments) for c in p.calls)
        content, tool, reasoning = p.text[:cut], p.text[cut:], p.reasoning_text
        think = self._think
        if think is not None and content:
            inline, content = think.feed(content)
            reasoning += inline
            if think.state in ("off", "answer"):
                self._think = None
        return reasoning, tool, content

    def _chunk(self, t_ns: int, reasoning: str, tool: str, content: str, count: int | None) -> bool:
        """One chunk of these parts (none if all are empty: text held back); True if it was made."""
        if not (reasoning or tool or content):
            return False
        if count is not None:  # exact; weights only to share a mixed chunk's tokens (regex-free when pure)
            tokens = max(1, count - self._last_count)
            weights = (tokens, 0, 0) if not (tool or content) else (0, tokens, 0) if not (reasoning or content) \
                else (0, 0, tokens) if not (reasoning or tool) else self._weights(reasoning, tool, content)
        else:
            weights = self._weights(reasoning, tool, content)
            self._exact, tokens = False, sum(weights)
        answer = bool(tool or content)
        self._chunks.append(ChunkRecord(self.meta.seq, t_ns, tokens, not answer, self.meta.worker))
        self._parts.append(weights)
        if self._text is not None and content:
            self._text.append(content)
        return True

    @staticmethod
    def _weights(reasoning: str, tool: str, content: str) -> tuple[int, int, int]:
        """Local weights of a chunk's parts (a think tag one token)."""
        return weight(reasoning) - tag_excess(reasoning), weight(tool), weight(content)

    def _add_calls(self, calls: tuple[ToolDelta, ...]) -> None:
        """Tool-call fragments: a call's id and name are its first non-empty ones, its arguments concatenated."""
        for d in calls:
            call = self._calls.get(d.index)
            if call is None:
                call = self._calls[d.index] = (d.id, d.name, [])
            elif (d.id and not call[0]) or (d.name and not call[1]):
                call = self._calls[d.index] = (call[0] or d.id, call[1] or d.name, call[2])
            if self._text is not None and d.arguments:
                call[2].append(d.arguments)

    def _whole_body(self) -> None:
        """A non-streamed answer (embeddings), read when it has ended."""
        p = parse_embeddings_body(bytes(self._body or b""))
        self._summary = p
        if p.error:
            self._error = (error_kind_for_status(p.error_status) if p.error_status else "protocol", p.error)

    def _head_text(self) -> str:
        """The body's first bytes as text; cut short (``CUT``) when the body went on past them."""
        text = self._head.decode("utf-8", errors="replace")
        return text + CUT if len(self._head) >= ERROR_BODY_BYTES else text

    def has_content(self) -> bool:
        """Has any generated text arrived yet?"""
        return bool(self._chunks)

    @property
    def broken(self) -> str | None:
        """Why the rest of this stream cannot be read (an event over the size cap): the driver aborts it."""
        return self._decoder.overflow

    def finish(self, now_ns: int, status: int = 200, error_kind: str | None = None,
               error_message: str | None = None) -> tuple[RequestRecord, list[ChunkRecord]]:
        """The records of this request; ``error_kind`` is the driver's (connect, timeouts, cancelled)."""
        if status != 200:
            self.record = self._record(now_ns, [], Parsed(), status, error_kind or error_kind_for_status(status),
                                       error_message or _error_text(self._head_text()))
            return self.record, []
        kind, message = error_kind, error_message
        if self._body is not None and kind is None and not self._decoder.overflow:
            self._whole_body()
        if self._think is not None:  # a tag's start held back when the stream ended: its text after all
            reasoning, content = self._think.flush()
            self._chunk(self.last_read_ns, reasoning, "", content, None)
        if self._body is None and not self._events and self._error is None and self._head.lstrip()[:1] == b"{":
            self._error = _json_answer(self._head_text())  # a JSON body where events were asked for
        if kind is None and self._decoder.overflow:
            kind, message = "protocol", self._decoder.overflow
        if self._error is not None:  # the server said why: its message, whatever the driver saw after it
            kind, message = self._error[0], self._error[1] + (f" (then: {message})" if message else "")
        if kind is None and not self._summary.done:
            cut = " mid-event" if self._decoder.pending() else ""
            kind, message = "protocol", f"stream ended{cut} without [DONE]"
        self._judge()
        if kind is None and not self._chunks and self._body is None:
            kind, message = self._no_token()
        chunks = self._chunks
        counts = phase_tokens(chunks, self._parts, self._summary, self._exact)
        self.record = self._record(now_ns, chunks, self._summary, status, kind, message, counts)
        return self.record, chunks

    def _judge(self) -> None:
        """The server's usage claims checked against what was asked, sent and received (``usage_claims``)."""
        s, m = self._summary, self.meta
        seen = Seen(m.output_cap or m.output_tokens_asked, m.prompt_tokens_asked, m.body_bytes,
                    m.conversation is not None or m.session is not None, self._chars, len(self._chunks),
                    sum(c.tokens for c in self._chunks))
        self.claimed = (s.completion_tokens, s.prompt_tokens)  # as the server said them: loadgen check's evidence
        self._rejected = settle_usage(s, self._chunks, seen)

    def _no_token(self) -> tuple[str | None, str | None]:
        """A stream that ended well but in which no event carried a token loadgen reads: a success only where the
        server says it generated at most one token (usage ``completion_tokens`` 0, or 1: an end-of-sequence token,
        or a special one such as ``<think>`` that the server's reasoning parser consumed, has no text), or, with no
        usage, where at most one was asked (the preflight's probe); else a ``protocol`` error (the tokens are in a
        member loadgen does not read), never a success without a token (a silent zero)."""
        reported = self._summary.completion_tokens
        if reported in (0, 1) or (reported is None and self.meta.output_tokens_asked <= 1):
            return None, None
        first = f"(first event: {clip(self._first, 120)})"
        if reported is None:
            return "protocol", f"no event carried a token loadgen reads, and no usage says none were generated {first}"
        return "protocol", f"the server reports {reported} output tokens but no event carried one loadgen reads {first}"

    def _record(self, now_ns: int, chunks: list[ChunkRecord], s: Parsed, status: int, kind: str | None,
                message: str | None, counts: tuple[int, int] | None = None) -> RequestRecord:
        """``counts``: (reasoning, tool) tokens of a stream read (None: a status that is not 200, nothing read)."""
        m = self.meta
        output = s.completion_tokens if s.completion_tokens is not None else sum(c.tokens for c in chunks)
        reasoning_tokens, tool_tokens = counts or (None, None)
        parts = self._parts if chunks else []
        first_answer = next((c.t_ns for c in chunks if not c.reasoning), None)
        last_reasoning = next((chunks[i].t_ns for i in range(len(parts) - 1, -1, -1) if parts[i][0]), None)
        reasoned = last_reasoning is not None or (counts is not None and (self._opaque or bool(reasoning_tokens)))
        return RequestRecord(
            seq=m.seq, class_name=m.class_name, warmup=m.warmup, t_intended_ns=m.t_intended_ns,
            t_sent_ns=self.t_sent_ns,
            t_first_token_ns=chunks[0].t_ns if chunks else None,
            t_last_token_ns=chunks[-1].t_ns if chunks else None, t_done_ns=now_ns,
            prompt_tokens_asked=m.prompt_tokens_asked,
            prompt_tokens=s.prompt_tokens if s.prompt_tokens is not None else m.prompt_tokens_asked,
            prompt_tokens_source="server" if s.prompt_tokens is not None else "asked",
            output_tokens_asked=m.output_tokens_asked, output_tokens=output,
            output_tokens_source="server" if s.completion_tokens is not None else "local",
            chunks=len(chunks), request_id=s.request_id, finish_reason=s.finish_reason, http_status=status,
            error_kind=kind, error_message=message, reasoning=reasoned, worker=m.worker,
            conversation=m.conversation, turn=m.turn, cached_tokens=s.cached_tokens,
            t_first_answer_ns=first_answer, t_last_reasoning_ns=last_reasoning, reasoning_tokens=reasoning_tokens,
            tool_tokens=tool_tokens, tool_calls=len(self._calls) if counts is not None else None,
            usage_rejected=self._rejected, **_session_fields(m))


def bare_record(m: RequestMeta, t_sent_ns: int, now_ns: int, status: int, kind: str,
                message: str) -> RequestRecord:
    """A failed request's record from what the driver knows alone (its tracker could not finish: a bug)."""
    return RequestRecord(seq=m.seq, class_name=m.class_name, warmup=m.warmup, t_intended_ns=m.t_intended_ns,
                         t_sent_ns=t_sent_ns, t_first_token_ns=None, t_last_token_ns=None, t_done_ns=now_ns,
                         prompt_tokens_asked=m.prompt_tokens_asked, prompt_tokens=m.prompt_tokens_asked,
                         prompt_tokens_source="asked", output_tokens_asked=m.output_tokens_asked, output_tokens=0,
                         output_tokens_source="local", chunks=0, http_status=status, error_kind=kind,
                         error_message=message, worker=m.worker, conversation=m.conversation, turn=m.turn,
                         **_session_fields(m))


SESSION_FIELDS = ("session", "call", "agent", "step", "after_call", "t_ready_ns", "wait_ns", "wait_kind")


def _session_fields(m: RequestMeta) -> dict[str, Any]:
    """The session meta a record carries as it is (all None for a request outside a session)."""
    return {name: getattr(m, name) for name in SESSION_FIELDS}


def _error_text(body: str) -> str:
    """An error answer's message: a JSON body's ``error.message`` (or ``error``, or ``message``), else the
    text itself (clipped; the record sink clips again after redaction)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack allows: the text itself
        return clip(body.strip(), ERROR_TEXT_CHARS) or "(empty body)"
    err = (obj.get("error") or obj) if isinstance(obj, dict) else obj
    return error_of(err).error or ""


def _json_answer(body: str) -> tuple[str, str]:
    """(error kind, message) of a 200 answer that is one JSON body, not the event stream asked for: the
    server's error if it holds one (some gateways send errors with status 200), else what it is."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        obj = None
    err = obj.get("error") if isinstance(obj, dict) else None
    if err:
        p = error_of(err)
        return error_kind_for_status(p.error_status) if p.error_status else "protocol", p.error or ""
    return "protocol", ("the server answered one JSON body, not an event stream (does it stream? is "
                        f"\"stream\": true ignored?): {clip(body.strip(), 120)}")
