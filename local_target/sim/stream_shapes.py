"""The Responses and Messages streams, chunk by chunk (the same calls as ``openai_api.ChunkFormatter``). No I/O.

- OpenAI Responses (member lists of openai-python ``types/responses``): ``response.created``; one output item per
  phase, each opened by ``response.output_item.added`` — a ``reasoning`` item streamed as
  ``response.reasoning_text.delta`` (vLLM's shape; OpenAI's own models stream only a summary), a ``message``
  item as ``response.output_text.delta``, a ``function_call`` item (its ``name`` and ``call_id`` whole in the
  ``added`` event) as ``response.function_call_arguments.delta``; then ``response.completed`` (or
  ``response.incomplete``) with ``usage.output_tokens_details.reasoning_tokens``.
- Anthropic Messages (anthropic-sdk-python ``types/raw_*``): ``message_start``; one content block per phase —
  ``thinking`` (``thinking_delta``s, then one ``signature_delta`` just before its ``content_block_stop``),
  ``text`` (``text_delta``), ``tool_use`` (``id``, ``name``, ``input: {}`` in ``content_block_start``, then
  ``input_json_delta`` fragments, the first ``""``); ``message_delta`` (``stop_reason`` ``tool_use``,
  ``end_turn`` or ``max_tokens``; ``usage.output_tokens`` counts thinking too) and ``message_stop``.

A request that neither reasons nor calls a tool streams exactly as before: its message item or text block
opens with the first token.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .openai_api import NO_PLAN, Prepared
from .reasoning import PhasePlan


def _sse(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj}, separators=(',', ':'))}\n\n".encode()


def signature(request_id: str) -> str:
    """The thinking block's opaque signature (Anthropic's is a base64 token the client sends back)."""
    return base64.b64encode(f"sim-signature-{request_id}".encode()).decode()


class _Blocks:
    """One open output item / content block at a time; a new phase closes the old one and opens its own."""

    def __init__(self, prep: Prepared, request_id: str, created: int, plan: PhasePlan = NO_PLAN,
                 field: str = "", engine: str = "") -> None:
        self.prep, self.id, self.created, self.plan = prep, request_id, created, plan
        self.cached_tokens: int | None = None
        self._tokens, self._finish = 0, "stop"
        self._kind: str | None = None
        self._index = -1

    def _note(self, finish_reason: str | None, completion_tokens: int) -> None:
        self._tokens, self._finish = completion_tokens, finish_reason or self._finish

    def _switch(self, kind: str, **opening: Any) -> bytes:
        if self._kind == kind:
            return b""
        out = self._close()
        self._kind, self._index = kind, self._index + 1
        return out + self._open(kind, **opening)

    def _open(self, kind: str, **opening: Any) -> bytes:
        raise NotImplementedError

    def _close(self) -> bytes:
        return b""

    def _opens_with_text(self) -> bool:
        return not self.plan.reasoning_tokens and self.plan.tool is None

    @property
    def _tool_called(self) -> bool:
        return bool(self.plan.counts(self._tokens)["tool_calls"])


class ResponsesFormatter(_Blocks):
    def _response(self, status: str, with_usage: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                               "model": self.prep.model, "usage": None}
        if with_usage:
            out["usage"] = {"input_tokens": self.prep.prompt_tokens, "output_tokens": self._tokens,
                            "total_tokens": self.prep.prompt_tokens + self._tokens,
                            "input_tokens_details": {"cached_tokens": self.cached_tokens or 0},
                            "output_tokens_details": {
                                "reasoning_tokens": self.plan.counts(self._tokens)["reasoning_tokens"]}}
        return out

    def _item_id(self) -> str:
        return {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[self._kind or "message"] + self.id

    def _open(self, kind: str, **opening: Any) -> bytes:
        item: dict[str, Any] = {"id": self._item_id(), "type": kind, "status": "in_progress"}
        if kind == "message":
            item = {"id": item["id"], "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        elif kind == "reasoning":
            item.update(summary=[], content=[])
        else:
            item.update(arguments="", call_id=opening["call_id"], name=opening["name"])
        return _sse("response.output_item.added", {"output_index": self._index, "item": item})

    def start(self) -> bytes:
        out = _sse("response.created", {"response": self._response("in_progress", False)})
        return out + (self._switch("message") if self._opens_with_text() else b"")

    def reasoning(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._switch("reasoning") + _sse("response.reasoning_text.delta", {
            "item_id": self._item_id(), "output_index": self._index, "content_index": 0, "delta": text})

    def content(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._switch("message") + _sse("response.output_text.delta", {
            "item_id": self._item_id(), "output_index": self._index, "content_index": 0, "delta": text})

    def tool_start(self, call_id: str, name: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._switch("function_call", call_id=call_id, name=name)

    def tool_args(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return _sse("response.function_call_arguments.delta",
                    {"item_id": self._item_id(), "output_index": self._index, "delta": text})

    def final_usage(self, completion_tokens: int) -> bytes:
        return b""

    def done(self) -> bytes:
        if self._finish == "length" and not self._tool_called:
            response = {**self._response("incomplete", True), "incomplete_details": {"reason": "max_output_tokens"}}
            return _sse("response.incomplete", {"response": response})
        return _sse("response.completed", {"response": self._response("completed", True)})


class AnthropicFormatter(_Blocks):
    def start(self) -> bytes:
        cached = self.cached_tokens or 0
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.prep.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prep.prompt_tokens - cached, "output_tokens": 1,
                             "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}
        out = _sse("message_start", {"message": message})
        return out + (self._switch("text") if self._opens_with_text() else b"")

    def _open(self, kind: str, **opening: Any) -> bytes:
        block: dict[str, Any] = {"type": kind, "text": ""}
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "tool_use":
            block = {"type": "tool_use", "id": opening["call_id"].replace("call_", "toolu_"),
                     "name": opening["name"], "input": {}}
        return _sse("content_block_start", {"index": self._index, "content_block": block})

    def _close(self) -> bytes:
        if self._kind is None:
            return b""
        out = b""
        if self._kind == "thinking":
            out = self._delta({"type": "signature_delta", "signature": signature(self.id)})
        return out + _sse("content_block_stop", {"index": self._index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", {"index": self._index, "delta": delta})

    def reasoning(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._switch("thinking") + self._delta({"type": "thinking_delta", "thinking": text})

    def content(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._switch("text") + self._delta({"type": "text_delta", "text": text})

    def tool_start(self, call_id: str, name: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        out = self._switch("tool_use", call_id=call_id, name=name)
        return out + self._delta({"type": "input_json_delta", "partial_json": ""})

    def tool_args(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._note(finish_reason, completion_tokens)
        return self._delta({"type": "input_json_delta", "partial_json": text})

    def final_usage(self, completion_tokens: int) -> bytes:
        return b""

    def done(self) -> bytes:
        reason = "tool_use" if self._tool_called else "max_tokens" if self._finish == "length" else "end_turn"
        return (self._close()
                + _sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": None},
                                         "usage": {"output_tokens": self._tokens}})
                + _sse("message_stop", {}))


def full_response(prep: Prepared, request_id: str, created: int, plan: PhasePlan, generated: int,
                  finish_reason: str, cached_tokens: int | None, field: str = "", engine: str = "") -> dict[str, Any]:
    """A non-streamed answer of the Responses or Messages API."""
    reasoning, text, arguments = plan.texts(generated)
    called = plan.tool is not None and plan.counts(generated)["tool_calls"]
    if prep.kind == "responses":
        fmt = ResponsesFormatter(prep, request_id, created, plan)
        fmt.cached_tokens, fmt._tokens = cached_tokens, generated
        out = fmt._response("incomplete" if finish_reason == "length" and not called else "completed", True)
        items: list[dict[str, Any]] = []
        if reasoning:
            items.append({"type": "reasoning", "id": "rs_" + request_id, "summary": [],
                          "content": [{"type": "reasoning_text", "text": reasoning}]})
        if called and plan.tool is not None:
            items.append({"type": "function_call", "id": "fc_" + request_id, "status": "completed",
                          "call_id": plan.tool.call_id, "name": plan.tool.name, "arguments": arguments})
        else:
            items.append({"type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]})
        out["output"] = items
        return out
    cached = cached_tokens or 0
    blocks: list[dict[str, Any]] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": signature(request_id)})
    if called and plan.tool is not None:
        blocks.append({"type": "tool_use", "id": plan.tool.call_id.replace("call_", "toolu_"),
                       "name": plan.tool.name, "input": json.loads(arguments)})
    else:
        blocks.append({"type": "text", "text": text})
    reason = "tool_use" if called else "max_tokens" if finish_reason == "length" else "end_turn"
    return {"id": request_id, "type": "message", "role": "assistant", "model": prep.model, "content": blocks,
            "stop_reason": reason, "stop_sequence": None,
            "usage": {"input_tokens": prep.prompt_tokens - cached, "output_tokens": generated,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}


FORMATTERS = {"responses": ResponsesFormatter, "messages": AnthropicFormatter}
