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

A 200 stream that ends well but in which no event carried a token loadgen reads is a ``protocol`` error naming
its first event (``_no_token``), unless the server says it generated none: never a success without a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from loadgen.core.apis import EVENT_PARSERS, parse_embeddings_body
from loadgen.core.openai_stream import ERROR_TEXT_CHARS, Parsed, error_of, local_token_weight
from loadgen.core.secrets import CUT, clip
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.core.sse import MAX_EVENT_BYTES, SseDecoder


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
                 "_summary", "_error", "_text", "record", "_parse", "_body", "_events", "_first")

    def __init__(self, meta: RequestMeta, t_sent_ns: int, max_event_bytes: int = MAX_EVENT_BYTES,
                 api: str = "chat", parse: Callable[[str], Parsed] | None = None) -> None:
        """``parse``: the event parser, when a driver has a faster one giving the same ``Parsed``; default the
        API's own (``apis.EVENT_PARSERS``)."""
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
        self.record: RequestRecord | None = None  # set by finish

    @property
    def answer(self) -> str:
        """The generated text (content, not reasoning), kept when ``meta.keep_text``."""
        return "".join(self._text or ())

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
        if p.text:
            count = p.completion_tokens
            if count is not None:  # exact: the running count (vLLM's continuous usage stats)
                tokens = max(1, count - self._last_count)
            else:
                self._exact, tokens = False, local_token_weight(p.text)
            self._chunks.append(ChunkRecord(self.meta.seq, t_ns, tokens, p.reasoning, self.meta.worker))
            if self._text is not None and not p.reasoning and not p.tool:
                self._text.append(p.text)
        if p.completion_tokens is not None:
            summary.completion_tokens = self._last_count = p.completion_tokens
        if p.error and self._error is None:
            self._error = (error_kind_for_status(p.error_status) if p.error_status else "protocol", p.error)

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
        if self._body is None and not self._events and self._error is None and self._head.lstrip()[:1] == b"{":
            self._error = _json_answer(self._head_text())  # a JSON body where events were asked for
        if kind is None and self._decoder.overflow:
            kind, message = "protocol", self._decoder.overflow
        if self._error is not None:  # the server said why: its message, whatever the driver saw after it
            kind, message = self._error[0], self._error[1] + (f" (then: {message})" if message else "")
        if kind is None and not self._summary.done:
            cut = " mid-event" if self._decoder.pending() else ""
            kind, message = "protocol", f"stream ended{cut} without [DONE]"
        if kind is None and not self._chunks and self._body is None:
            kind, message = self._no_token()
        chunks = self._chunks
        if not self._exact:
            _rescale(chunks, self._summary.completion_tokens)
        self.record = self._record(now_ns, chunks, self._summary, status, kind, message)
        return self.record, chunks

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
                message: str | None) -> RequestRecord:
        m = self.meta
        output = s.completion_tokens if s.completion_tokens is not None else sum(c.tokens for c in chunks)
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
            error_kind=kind, error_message=message, reasoning=any(c.reasoning for c in chunks), worker=m.worker,
            conversation=m.conversation, turn=m.turn, cached_tokens=s.cached_tokens, **_session_fields(m))


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


def _rescale(chunks: list[ChunkRecord], total: int | None) -> None:
    """Local estimates scaled to the server's total, when it reported one that can be shared out."""
    weights = [c.tokens for c in chunks]
    if total is None or total < len(chunks) or sum(weights) == total:
        return
    for chunk, n in zip(chunks, _scale(weights, total)):
        chunk.tokens = n


def _scale(weights: list[int], total: int) -> list[int]:
    """Integers proportional to ``weights``, each >= 1, summing to ``total`` (largest remainder)."""
    spare = total - len(weights)
    raw = [w / sum(weights) * spare for w in weights]
    out = [1 + int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out


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
