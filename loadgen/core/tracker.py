"""Theory of operation: one ``StreamTracker`` per request, fed ``(bytes, now_ns)`` by a driver.

The hot path (``feed``) is a timestamp and an append: nothing is decoded while the stream runs, so a busy
client does not add parsing time between reading a chunk and stamping the next. ``finish`` decodes the SSE
events (each stamped with the read that completed it), parses the OpenAI chunks, and produces one
``RequestRecord`` and one ``ChunkRecord`` per chunk that carried generated text.

Tokens per chunk: exact from vLLM's ``continuous_usage_stats`` (the running ``completion_tokens``) when every
content chunk has it; otherwise each chunk's local estimate, scaled (largest remainder) so they sum to the
server's final ``usage.completion_tokens``; with no usage at all, the local estimate (flagged ``local``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .openai_stream import Parsed, local_token_weight, parse_event
from .records import ChunkRecord, RequestRecord
from .sse import SseDecoder


@dataclass(slots=True)
class RequestMeta:
    seq: int
    class_name: str
    warmup: bool
    t_intended_ns: int
    prompt_tokens_asked: int
    output_tokens_asked: int
    worker: int = 0


def error_kind_for_status(status: int) -> str:
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    return "protocol"


@dataclass(slots=True)
class _Content:
    t_ns: int
    text: str
    reasoning: bool
    completion_tokens: int | None


class StreamTracker:
    __slots__ = ("meta", "t_sent_ns", "pieces")

    def __init__(self, meta: RequestMeta, t_sent_ns: int) -> None:
        self.meta = meta
        self.t_sent_ns = t_sent_ns
        self.pieces: list[tuple[int, bytes]] = []

    def feed(self, data: bytes, now_ns: int) -> None:
        self.pieces.append((now_ns, data))

    def has_content(self) -> bool:
        """Has any generated text arrived yet? (Parses what came so far; for timeout classification only.)"""
        decoder = SseDecoder()
        return any(parse_event(data).text for t, piece in self.pieces for _, data in decoder.feed(piece, t))

    def finish(self, now_ns: int, status: int = 200, error_kind: str | None = None,
               error_message: str | None = None) -> tuple[RequestRecord, list[ChunkRecord]]:
        """The records of this request; ``error_kind`` is the driver's (connect, timeouts, cancelled)."""
        if status != 200:
            body = b"".join(p for _, p in self.pieces).decode("utf-8", errors="replace")
            return self._record(now_ns, [], Parsed(), status, error_kind or error_kind_for_status(status),
                                error_message or _error_text(body)), []
        contents, summary, stream_error = self._parse()
        kind, message = error_kind, error_message
        if kind is None and stream_error is not None:
            kind, message = stream_error
        tokens = _tokens_per_chunk(contents, summary.completion_tokens)
        m = self.meta
        chunks = [ChunkRecord(m.seq, c.t_ns, n, c.reasoning, m.worker) for c, n in zip(contents, tokens)]
        return self._record(now_ns, chunks, summary, status, kind, message), chunks

    def _parse(self) -> tuple[list[_Content], Parsed, tuple[str, str] | None]:
        decoder = SseDecoder()
        contents: list[_Content] = []
        summary = Parsed()
        error: tuple[str, str] | None = None
        for t, piece in self.pieces:
            for t_event, data in decoder.feed(piece, t):
                p = parse_event(data)
                summary.done = summary.done or p.done
                summary.request_id = summary.request_id or p.request_id
                summary.finish_reason = p.finish_reason or summary.finish_reason
                if p.prompt_tokens is not None:
                    summary.prompt_tokens = p.prompt_tokens
                if p.completion_tokens is not None:
                    summary.completion_tokens = p.completion_tokens
                if p.text:
                    contents.append(_Content(t_event, p.text, p.reasoning, p.completion_tokens))
                if p.error and error is None:
                    error = (error_kind_for_status(p.error_status) if p.error_status else "protocol", p.error)
        if error is None and not summary.done:
            cut = " mid-event" if decoder.pending() else ""
            error = ("protocol", f"stream ended{cut} without [DONE]")
        return contents, summary, error

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
            error_kind=kind, error_message=message, reasoning=any(c.reasoning for c in chunks), worker=m.worker)


def _tokens_per_chunk(contents: list[_Content], total: int | None) -> list[int]:
    running = [c.completion_tokens for c in contents]
    if contents and all(r is not None for r in running):
        out, prev = [], 0
        for r in running:
            out.append(max(1, r - prev))  # type: ignore[operator]
            prev = r  # type: ignore[assignment]
        return out
    weights = [local_token_weight(c.text) for c in contents]
    if total is None or total < len(contents) or sum(weights) == total:
        return weights
    return _scale(weights, total)


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
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        message = err.get("message") if isinstance(err, dict) else None
        return str(message or err)[:300]
    except ValueError:
        return body.strip()[:300] or "(empty body)"
