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

vLLM's ``ignore_eos``/``min_tokens`` are accepted by all three, as vLLM accepts them. Reasoning and tools
(``reasoning.py``): Responses ``reasoning.effort`` and ``tools``/``tool_choice``, Messages ``thinking`` and
``tools``/``tool_choice``; a session's transcript comes back as Responses ``function_call`` /
``function_call_output`` items or Anthropic ``tool_use`` / ``tool_result`` blocks, translated to the chat
``tool_calls`` / ``tool`` messages the tokenizer counts. The streams themselves are ``stream_shapes.py``'s.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from .config import EngineConfig
from .openai_api import ApiError, Prepared, asks_of, prepare
from .reasoning import messages_asks, responses_asks
from .stream_shapes import FORMATTERS, full_response

__all__ = ["FORMATTERS", "PREPARE", "embedding_response", "full_response"]

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
        messages = []
        for i, item in enumerate(given):
            if isinstance(item, dict):
                _responses_item(messages, item, f"input[{i}]")
    else:
        raise ApiError(400, "input: a string or a non-empty list of messages", param="input")
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat = {**_extensions(body), "messages": messages, "max_tokens": body.get("max_output_tokens")}
    prep = _as(prepare("chat", chat, cfg), "responses")
    prep.asks = asks_of(responses_asks, body, "responses")
    return prep


def _call(call_id: Any, name: Any, arguments: str) -> dict[str, Any]:
    return {"id": str(call_id), "type": "function", "function": {"name": str(name), "arguments": arguments}}


def _responses_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """One ``input`` item as chat messages: a message, a ``function_call`` (the assistant's tool call, joined to
    the assistant message before it) or a ``function_call_output`` (a ``tool`` message); reasoning items are
    dropped, as chat templates drop earlier reasoning."""
    kind = item.get("type", "message")
    if kind == "function_call":
        call = _call(item.get("call_id"), item.get("name"), str(item.get("arguments", "")))
        if messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                         "content": output if isinstance(output, str) else json.dumps(output)})
    elif kind == "message":
        messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"), where)})


def prepare_messages(body: dict[str, Any], cfg: EngineConfig) -> Prepared:
    if not isinstance(body.get("max_tokens"), int):
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ApiError(400, "messages: a non-empty list", param="messages")
    if any(not isinstance(m, dict) or m.get("role") not in ("user", "assistant") for m in given):
        raise ApiError(400, "messages: roles must be user or assistant (the system prompt is `system`)",
                       param="messages")
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(given):
        messages += _anthropic_message(m, f"messages[{i}]")
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text(body["system"], "system")})
    chat = {**_extensions(body), "messages": messages, "max_tokens": body["max_tokens"]}
    prep = _as(prepare("chat", chat, cfg), "messages")
    prep.asks = asks_of(messages_asks, body, "messages")
    return prep


def _anthropic_message(m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: ``tool_result`` blocks become ``tool`` messages, an assistant's
    ``tool_use`` blocks its ``tool_calls`` (the input re-serialized: the same tokens), thinking blocks drop."""
    content = m.get("content")
    if not isinstance(content, list):
        return [{"role": m["role"], "content": _text(content, where)}]
    blocks = [b for b in content if isinstance(b, dict)]
    out = [{"role": "tool", "tool_call_id": str(b.get("tool_use_id")), "content": _result_text(b.get("content"))}
           for b in blocks if b.get("type") == "tool_result"]
    text = _text([b for b in blocks if b.get("type") == "text"], where)
    calls = [_call(b.get("id"), b.get("name"), json.dumps(b.get("input", {}), separators=(",", ":")))
             for b in blocks if b.get("type") == "tool_use"]
    if text or calls or not out:
        out.append({"role": m["role"], "content": text, **({"tool_calls": calls} if calls else {})})
    return out


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


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


PREPARE = {"responses": prepare_responses, "messages": prepare_messages, "embeddings": prepare_embeddings}
