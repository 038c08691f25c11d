"""The generation APIs loadgen speaks, and the parsing of the ones that are not OpenAI's chat/completions
(those are ``openai_stream.py``). Pure functions over decoded SSE events or a response body.

| ``target.api`` | path | streamed events | usage |
| --- | --- | --- | --- |
| chat | /chat/completions | ``choices[0].delta.content`` (and ``tool_calls``, see ``openai_stream.py``) | ``usage.prompt_tokens``/``completion_tokens`` |
| completions | /completions | ``choices[0].text`` | same |
| responses | /responses | ``response.output_text.delta`` ``{delta}`` (and ``refusal``, ``function_call_arguments``, ``reasoning_text``, ``reasoning_summary_text``; a ``function_call`` item's name in ``output_item.added``) … ``response.completed`` (the end) | ``response.usage.input_tokens``/``output_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens_details.reasoning_tokens`` |
| messages | /messages (Anthropic) | ``content_block_delta`` ``{delta: {text}}`` (``thinking``, a tool's ``partial_json``; a ``tool_use`` block's name in ``content_block_start``) … ``message_stop`` (the end) | ``message_start.message.usage.input_tokens`` (+ cache reads and writes), ``message_delta.usage.output_tokens`` |
| embeddings | /embeddings | not streamed: one JSON body | ``usage.prompt_tokens`` |

Anthropic's ``input_tokens`` leaves out the prompt tokens read from (or written to) its cache; loadgen's
``prompt_tokens`` is the whole prompt (their sum) and ``cached_tokens`` the cache reads.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from loadgen.core.openai_stream import Parsed, ToolDelta, as_dict, as_int, as_str, error_of, parse_event
from loadgen.core.secrets import clip

APIS = ("chat", "completions", "responses", "messages", "embeddings")
PATHS = {"chat": "/chat/completions", "completions": "/completions", "responses": "/responses",
         "messages": "/messages", "embeddings": "/embeddings"}
CHAT_LIKE = {"chat", "responses", "messages"}  # the prompt is a list of messages (a chat template applies)
ANTHROPIC_VERSION = "2023-06-01"


def _typed_events(parse: Callable[[Any, dict[str, Any]], Parsed]) -> Callable[[str], Parsed]:
    """A parser of events that are JSON objects with a ``type``: ``parse(type, event)`` sees objects only (their
    members may be anything: every access checks the type, so no event a server sends can raise)."""
    def parse_event_data(data: str) -> Parsed:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the stack allows
            return Parsed(error=f"malformed event: {clip(data, 80)!r}")
        if not isinstance(obj, dict):
            return Parsed(error=f"event is not an object: {clip(data, 80)!r}")
        return parse(obj.get("type"), obj)
    parse_event_data.__doc__ = parse.__doc__
    return parse_event_data


@_typed_events
def parse_responses_event(kind: Any, obj: dict[str, Any]) -> Parsed:
    """One event of the OpenAI Responses API's stream."""
    if kind in ("response.output_text.delta", "response.refusal.delta"):
        return Parsed(text=as_str(obj.get("delta")))
    if kind == "response.function_call_arguments.delta":  # a tool call's arguments: generated tokens
        delta = as_str(obj.get("delta"))
        return Parsed(text=delta, tool=True, calls=_call(obj.get("output_index"), None, "", delta))
    if kind == "response.output_item.added":  # a function call's name (and call_id) arrive whole in its item
        return _responses_item(obj)
    if kind == "response.reasoning_text.delta" or kind == "response.reasoning_summary_text.delta":
        return Parsed(text=as_str(obj.get("delta")), reasoning=True)
    if kind in ("error", "response.failed"):
        return error_of(obj.get("error") or as_dict(obj.get("response")).get("error") or obj)
    response = obj.get("response")
    if not isinstance(response, dict):
        return Parsed()
    out = Parsed(request_id=response.get("id") if isinstance(response.get("id"), str) else None)
    usage = response.get("usage")
    if isinstance(usage, dict):
        out.prompt_tokens, out.completion_tokens = as_int(usage.get("input_tokens")), as_int(usage.get("output_tokens"))
        out.cached_tokens = as_int(as_dict(usage.get("input_tokens_details")).get("cached_tokens"))
        out.reasoning_tokens = as_int(as_dict(usage.get("output_tokens_details")).get("reasoning_tokens"))
    if kind == "response.completed":
        out.done, out.finish_reason = True, "stop"
    elif kind == "response.incomplete":
        out.done, out.finish_reason = True, "length"
    return out


def _responses_item(obj: dict[str, Any]) -> Parsed:
    """``response.output_item.added``: a ``function_call`` item's name is generated output (as chat counts
    ``function.name``); other items carry no tokens yet."""
    item = as_dict(obj.get("item"))
    if item.get("type") != "function_call":
        return Parsed()
    name, arguments = as_str(item.get("name")), as_str(item.get("arguments"))
    return Parsed(text=name + arguments, tool=True,
                  calls=_call(obj.get("output_index"), item.get("call_id"), name, arguments))


def _call(index: Any, call_id: Any, name: str, arguments: str) -> tuple[ToolDelta, ...]:
    """One tool-call fragment at ``index`` (the output item's or content block's; 0 when not a number)."""
    return (ToolDelta(as_int(index) or 0, as_str(call_id), name, arguments),)


ANTHROPIC_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


@_typed_events
def parse_anthropic_event(kind: Any, obj: dict[str, Any]) -> Parsed:
    """One event of Anthropic's Messages API stream."""
    if kind == "content_block_delta":
        delta = as_dict(obj.get("delta"))
        if delta.get("type") == "thinking_delta":
            return Parsed(text=as_str(delta.get("thinking")), reasoning=True)
        if delta.get("type") == "input_json_delta":  # a tool_use block's input: generated tokens
            partial = as_str(delta.get("partial_json"))
            return Parsed(text=partial, tool=True, calls=_call(obj.get("index"), None, "", partial))
        return Parsed(text=as_str(delta.get("text")))  # text_delta; signature_delta and others carry no text
    if kind == "content_block_start":
        return _anthropic_block(obj)
    if kind == "message_start":
        message = as_dict(obj.get("message"))
        out = Parsed(request_id=message.get("id") if isinstance(message.get("id"), str) else None)
        usage = message.get("usage")
        if isinstance(usage, dict):
            fresh, read = as_int(usage.get("input_tokens")), as_int(usage.get("cache_read_input_tokens")) or 0
            written = as_int(usage.get("cache_creation_input_tokens")) or 0
            out.prompt_tokens = None if fresh is None else fresh + read + written
            out.cached_tokens = read if "cache_read_input_tokens" in usage else None
        return out
    if kind == "message_delta":
        reason = as_dict(obj.get("delta")).get("stop_reason")
        usage = as_dict(obj.get("usage"))
        return Parsed(finish_reason=ANTHROPIC_STOP.get(reason, reason) if isinstance(reason, str) else None,
                      completion_tokens=as_int(usage.get("output_tokens")))
    if kind == "message_stop":
        return Parsed(done=True)
    if kind == "error":
        return error_of(obj.get("error") or obj)
    return Parsed()


def _anthropic_block(obj: dict[str, Any]) -> Parsed:
    """``content_block_start``: a ``tool_use`` block's name is generated output (its ``id`` is what a tool
    result answers); a ``thinking`` or ``redacted_thinking`` block marks reasoning even when no text follows
    (``display: omitted`` sends only a ``signature_delta``; a redacted block arrives whole and opaque): a reasoning
    event without text, which counts no chunk (its tokens are only in ``message_delta``'s ``output_tokens``)."""
    block = as_dict(obj.get("content_block"))
    kind = block.get("type")
    if kind == "tool_use":
        name = as_str(block.get("name"))
        return Parsed(text=name, tool=True, calls=_call(obj.get("index"), block.get("id"), name, ""))
    if kind in ("thinking", "redacted_thinking"):
        return Parsed(reasoning=True)
    return Parsed()


def parse_embeddings_body(body: bytes) -> Parsed:
    """A whole /embeddings answer: done when it holds at least one embedding."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return Parsed(error=f"the answer is not JSON: {clip(body.decode('utf-8', 'replace'), 80)!r}")
    if not isinstance(obj, dict):
        return Parsed(error="the answer is not a JSON object")
    if obj.get("error"):  # null or empty: no error
        return error_of(obj["error"])
    data = obj.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "embedding" not in data[0]:
        return Parsed(error="the answer has no data[].embedding")
    usage = as_dict(obj.get("usage"))
    return Parsed(prompt_tokens=as_int(usage.get("prompt_tokens")), completion_tokens=0, done=True,
                  finish_reason="stop", request_id=obj.get("id") if isinstance(obj.get("id"), str) else None)


EVENT_PARSERS: dict[str, Callable[[str], Parsed]] = {
    "chat": parse_event, "completions": parse_event, "responses": parse_responses_event,
    "messages": parse_anthropic_event}


def probe_body(api: str, model: str, text: str, stream: bool) -> dict[str, Any]:
    """A one-token request of ``api`` (embeddings: the text embedded), for the checks before a run."""
    if api == "embeddings":
        return {"model": model, "input": text}
    body: dict[str, Any] = {"model": model, "stream": stream}
    messages = [{"role": "user", "content": text}]
    if api == "chat":
        body.update(messages=messages, max_tokens=1)
    elif api == "completions":
        body.update(prompt=text, max_tokens=1)
    elif api == "responses":
        body.update(input=messages, max_output_tokens=1)
    else:
        body.update(messages=messages, max_tokens=1)
    if stream and api in ("chat", "completions"):
        body["stream_options"] = {"include_usage": True}
    return body


def usage_prompt_tokens(api: str, answer: Any) -> int | None:
    """The prompt's length in a non-streamed answer's usage (None: not there)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return None
    if api == "responses":
        return as_int(usage.get("input_tokens"))
    if api == "messages":
        fresh = as_int(usage.get("input_tokens"))
        cached = (as_int(usage.get("cache_read_input_tokens")) or 0) + (as_int(usage.get("cache_creation_input_tokens"))
                                                                       or 0)
        return None if fresh is None else fresh + cached
    return as_int(usage.get("prompt_tokens"))
