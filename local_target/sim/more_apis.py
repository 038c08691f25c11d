"""The simulator's other APIs: OpenAI's Responses API, Anthropic's Messages API and embeddings. No I/O.

Each request is translated into the chat request the engine already serves (so the same template, token
count, KV and cost model apply), and answered in its own API's shape:

- ``POST /v1/responses``: ``input`` (a string or message items; content parts ``input_text``/``output_text``),
  ``instructions`` (the system prompt), ``max_output_tokens``. Streamed as ``response.created``,
  ``response.output_item.added``, one ``response.output_text.delta`` per chunk, then ``response.completed``
  (or ``response.incomplete`` when ``max_output_tokens`` ended it) carrying ``usage.input_tokens``,
  ``output_tokens`` and ``input_tokens_details.cached_tokens``.
- ``POST /v1/messages``: ``system``, ``messages`` (content a string or ``text`` blocks), ``max_tokens``
  (required). Streamed as ``message_start`` (``usage.input_tokens``: the prompt less what the prefix cache
  held, reported as ``cache_read_input_tokens``), ``content_block_start``, one ``content_block_delta`` per chunk,
  ``content_block_stop``, ``message_delta`` (``stop_reason``, ``usage.output_tokens``), ``message_stop``.
- ``POST /v1/embeddings``: ``input`` (one string, or one list of token ids). The engine prefills it like a
  prompt (one step's worth of compute, batched with whatever runs); the answer, one JSON body, leaves when that
  prefill ends. The vector is 8 numbers derived from the token ids (deterministic, not meaningful).

vLLM's ``ignore_eos``/``min_tokens`` are accepted by all three, as vLLM accepts them.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from .config import EngineConfig
from .openai_api import ApiError, Prepared, prepare

EMBEDDING_DIM = 8


def _text(content: Any, where: str) -> str:
    """A content string or list of text parts (``text``, ``input_text``, ``output_text``) as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content
                        if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"))
    raise ApiError(400, f"{where}: content must be a string or a list of text parts", param=where)


def _extensions(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("model", "stream", "ignore_eos", "min_tokens") if k in body}


def prepare_responses(body: dict[str, Any], cfg: EngineConfig) -> Prepared:
    given = body.get("input")
    if isinstance(given, str):
        messages = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        messages = [{"role": item.get("role", "user"), "content": _text(item.get("content"), f"input[{i}]")}
                    for i, item in enumerate(given) if isinstance(item, dict)]
    else:
        raise ApiError(400, "input: a string or a non-empty list of messages", param="input")
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat = {**_extensions(body), "messages": messages, "max_tokens": body.get("max_output_tokens")}
    return _as(prepare("chat", chat, cfg), "responses")


def prepare_messages(body: dict[str, Any], cfg: EngineConfig) -> Prepared:
    if not isinstance(body.get("max_tokens"), int):
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ApiError(400, "messages: a non-empty list", param="messages")
    messages = [{"role": m.get("role"), "content": _text(m.get("content"), f"messages[{i}]")}
                for i, m in enumerate(given) if isinstance(m, dict)]
    if any(m["role"] not in ("user", "assistant") for m in messages):
        raise ApiError(400, "messages: roles must be user or assistant (the system prompt is `system`)",
                       param="messages")
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text(body["system"], "system")})
    chat = {**_extensions(body), "messages": messages, "max_tokens": body["max_tokens"]}
    return _as(prepare("chat", chat, cfg), "messages")


def prepare_embeddings(body: dict[str, Any], cfg: EngineConfig) -> Prepared:
    given = body.get("input")
    if isinstance(given, list) and len(given) == 1 and isinstance(given[0], str):
        given = given[0]
    if not (isinstance(given, str) or isinstance(given, list) and given and all(isinstance(t, int) for t in given)):
        raise ApiError(400, "input: one string or one list of token ids", param="input")
    prep = prepare("completions", {"model": body.get("model"), "prompt": given, "max_tokens": 1}, cfg)
    return _as(prep, "embeddings")


def _as(prep: Prepared, kind: str) -> Prepared:
    prep.kind = kind  # type: ignore[assignment]
    prep.include_usage = prep.continuous_usage = False
    return prep


def embedding_response(prep: Prepared, model: str, request_id: str) -> dict[str, Any]:
    seed = zlib.crc32(" ".join(prep.tokens).encode())
    vector = [((seed >> (4 * i)) % 2001 - 1000) / 1000 for i in range(EMBEDDING_DIM)]
    return {"id": request_id, "object": "list", "model": model, "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": prep.prompt_tokens, "total_tokens": prep.prompt_tokens}}


def _sse(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj}, separators=(',', ':'))}\n\n".encode()


class ResponsesFormatter:
    """The Responses API's stream, chunk by chunk (the same calls as ``openai_api.ChunkFormatter``)."""

    def __init__(self, prep: Prepared, request_id: str, created: int) -> None:
        self.prep, self.id, self.created = prep, request_id, created
        self.cached_tokens: int | None = None
        self._tokens, self._finish = 0, "stop"

    def _response(self, status: str, with_usage: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                               "model": self.prep.model, "usage": None}
        if with_usage:
            out["usage"] = {"input_tokens": self.prep.prompt_tokens, "output_tokens": self._tokens,
                            "total_tokens": self.prep.prompt_tokens + self._tokens,
                            "input_tokens_details": {"cached_tokens": self.cached_tokens or 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}
        return out

    def start(self) -> bytes:
        item = {"id": "msg_" + self.id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        return (_sse("response.created", {"response": self._response("in_progress", False)})
                + _sse("response.output_item.added", {"output_index": 0, "item": item}))

    def content(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._tokens, self._finish = completion_tokens, finish_reason or self._finish
        return _sse("response.output_text.delta", {"item_id": "msg_" + self.id, "output_index": 0,
                                                   "content_index": 0, "delta": text})

    def done(self) -> bytes:
        if self._finish == "length":
            response = {**self._response("incomplete", True), "incomplete_details": {"reason": "max_output_tokens"}}
            return _sse("response.incomplete", {"response": response})
        return _sse("response.completed", {"response": self._response("completed", True)})


class AnthropicFormatter:
    """Anthropic's Messages stream, chunk by chunk (the same calls as ``openai_api.ChunkFormatter``)."""

    def __init__(self, prep: Prepared, request_id: str, created: int) -> None:
        self.prep, self.id = prep, request_id
        self.cached_tokens: int | None = None
        self._tokens, self._finish = 0, "stop"

    def start(self) -> bytes:
        cached = self.cached_tokens or 0
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.prep.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prep.prompt_tokens - cached, "output_tokens": 1,
                             "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}
        return (_sse("message_start", {"message": message})
                + _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))

    def content(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._tokens, self._finish = completion_tokens, finish_reason or self._finish
        return _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})

    def done(self) -> bytes:
        reason = "max_tokens" if self._finish == "length" else "end_turn"
        return (_sse("content_block_stop", {"index": 0})
                + _sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": None},
                                         "usage": {"output_tokens": self._tokens}})
                + _sse("message_stop", {}))


def full_response(prep: Prepared, request_id: str, created: int, text: str, finish_reason: str,
                  completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """A non-streamed answer of the Responses or Messages API."""
    if prep.kind == "responses":
        fmt = ResponsesFormatter(prep, request_id, created)
        fmt.cached_tokens, fmt._tokens = cached_tokens, completion_tokens
        out = fmt._response("incomplete" if finish_reason == "length" else "completed", True)
        out["output"] = [{"type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        return out
    cached = cached_tokens or 0
    return {"id": request_id, "type": "message", "role": "assistant", "model": prep.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens" if finish_reason == "length" else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": prep.prompt_tokens - cached, "output_tokens": completion_tokens,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}


PREPARE = {"responses": prepare_responses, "messages": prepare_messages, "embeddings": prepare_embeddings}
FORMATTERS = {"responses": ResponsesFormatter, "messages": AnthropicFormatter}
