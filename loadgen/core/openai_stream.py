"""OpenAI streaming chunk parsing (chat and completions, vLLM extensions). Pure functions.

A chunk carries generated tokens when any of these is non-empty (``Parsed.text`` holds them, for counting):

- ``delta.content`` (chat) as a string, or as a list of content parts (``[{"type": "text", "text": ...}]``,
  which some gateways send); ``delta.refusal``; ``text`` (completions);
- a reasoning delta (``delta.reasoning_content`` / ``delta.reasoning``): ``Parsed.reasoning``;
- tool calls (``delta.tool_calls[].function.name`` / ``.arguments``, the older ``delta.function_call``): the
  arguments are output tokens the model generates, timed like text (``Parsed.tool``); each call's ``index``,
  ``id``, name and argument fragment are kept (``Parsed.calls``) so that the tracker can rebuild the calls.

A delta with both reasoning and content (or a tool call) is ONE chunk of the answer: ``text`` is the content
(and tool text), ``reasoning_text`` the reasoning beside it (vLLM sends ``{"reasoning": " Easy", "content":
"The"}`` when a multi-token step crosses ``</think>``, vllm/reasoning/basic_parsers.py); the tracker counts its
share in the request's reasoning tokens. The server's reasoning count: ``usage.completion_tokens_details
.reasoning_tokens`` (OpenAI, vLLM with a reasoning parser), else SGLang's top-level ``usage.reasoning_tokens``.

Role-only and empty deltas carry none: TTFT is the first chunk that does. An ``error`` member that is null (or
empty) is no error: some gateways send ``"error": null`` in every chunk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loadgen.core.secrets import clip
from loadgen.core.usage_claims import as_count

ERROR_TEXT_CHARS = 2000  # a server's error message, kept whole up to this (the sink clips it after redaction)


@dataclass(frozen=True, slots=True)
class ToolDelta:
    """One fragment of a tool call: the call's index in the answer, its id and name (when this fragment carries
    them, else ""), and the argument text it adds."""
    index: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Parsed:
    text: str = ""
    reasoning: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (prefix-cache hits)
    request_id: str | None = None
    tool: bool = False  # the text is a tool call's name and arguments (output tokens, not the answer's text)
    error: str | None = None  # the server reported an error in the stream, or the chunk is not valid
    error_status: int | None = None
    done: bool = False
    reasoning_text: str = ""  # reasoning beside the content in one event (then ``text`` is the content)
    reasoning_tokens: int | None = None  # the server's count of reasoning tokens (usage details)
    calls: tuple[ToolDelta, ...] = ()  # the tool-call fragments in ``text`` (their names and arguments)


def parse_event(data: str) -> Parsed:
    if data == "[DONE]":
        return Parsed(done=True)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack allows
        return Parsed(error=f"malformed chunk: {clip(data, 80)!r}")
    if not isinstance(obj, dict):
        return Parsed(error=f"chunk is not an object: {clip(data, 80)!r}")
    if obj.get("error"):  # "error": null (or empty) in every chunk is no error
        return error_of(obj["error"])
    out = Parsed(request_id=obj.get("id") if isinstance(obj.get("id"), str) else None)
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        several = several_choices(choices)
        if several:
            return Parsed(error=several)
        _choice(choices[0], out)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        out.prompt_tokens = as_int(usage.get("prompt_tokens"))
        out.completion_tokens = as_int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            out.cached_tokens = as_int(details.get("cached_tokens"))
        out.reasoning_tokens = reasoning_count(usage)
    return out


def several_choices(choices: list[Any]) -> str | None:
    """Why a chunk is not one stream's (``n`` > 1: a server interleaves its choices' chunks, each with its
    ``index``), or None: loadgen times one stream per request, so several choices are an error, never merged."""
    if len(choices) == 1 and not (isinstance(choices[0], dict) and as_int(choices[0].get("index"))):
        return None  # the common chunk: one choice, index 0 (or none): nothing built on the hot path
    indexes = [as_int(c.get("index")) if isinstance(c, dict) else None for c in choices]
    if len(choices) > 1 or any(i for i in indexes if i is not None and i > 0):
        return (f"the server streamed several choices (index {max((i or 0) for i in indexes)}): loadgen times one "
                "stream per request (is n > 1 set in extra_body?)")
    return None


def reasoning_count(usage: dict[str, Any]) -> int | None:
    """The reasoning tokens a chat usage reports: ``completion_tokens_details.reasoning_tokens`` (OpenAI, vLLM),
    else SGLang's top-level ``reasoning_tokens``; None when it reports none."""
    details = usage.get("completion_tokens_details")
    count = as_int(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    return count if count is not None else as_int(usage.get("reasoning_tokens"))


def _choice(choice: dict[str, Any], out: Parsed) -> None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = content_text(delta.get("content")) + as_str(delta.get("refusal"))
        out.calls = tool_deltas(delta.get("tool_calls"), delta.get("function_call"))
        tool = "".join(c.name + c.arguments for c in out.calls)
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) else ""
        if content or tool:  # the answer's (a mixed delta's reasoning rides beside it)
            out.text, out.tool, out.reasoning_text = content + tool, not content, reasoning
        elif reasoning:
            out.text, out.reasoning = reasoning, True
    elif isinstance(choice.get("text"), str):
        out.text = choice["text"]
    reason = choice.get("finish_reason")
    out.finish_reason = reason if isinstance(reason, str) else None


def as_str(value: Any) -> str:
    """A member of the server's data that should be a string: it, or "" when it is anything else."""
    return value if isinstance(value, str) else ""


def as_dict(value: Any) -> dict[str, Any]:
    """A member of the server's data that should be an object: it, or {} when it is anything else."""
    return value if isinstance(value, dict) else {}


def content_text(content: Any) -> str:
    """A delta's ``content``: a string, or a list of parts (strings or ``{"text": ...}`` objects)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(part if isinstance(part, str) else as_str(part.get("text")) if isinstance(part, dict) else ""
                   for part in content)


def tool_deltas(tool_calls: Any, function_call: Any) -> tuple[ToolDelta, ...]:
    """A delta's tool-call fragments that carry something (an id, a function's name or argument text): each of
    ``tool_calls`` (its ``index``, else its place in the list), then the older ``function_call`` (index 0)."""
    out = []
    calls = tool_calls if isinstance(tool_calls, list) else []
    for i, call in enumerate(calls):
        if isinstance(call, dict):
            index = as_int(call.get("index"))
            out.append(_fragment(i if index is None else index, call.get("id"), call.get("function")))
    out.append(_fragment(0, None, function_call))
    return tuple(d for d in out if d.id or d.name or d.arguments)


def _fragment(index: int, call_id: Any, function: Any) -> ToolDelta:
    function = as_dict(function)
    return ToolDelta(index, as_str(call_id), as_str(function.get("name")), as_str(function.get("arguments")))


def error_of(err: Any) -> Parsed:
    """A server's error (an object with ``message`` and ``code``, or any other JSON value) as a ``Parsed``."""
    status = None
    if isinstance(err, dict):
        code = err.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) else None
        err = err.get("message") or err
    try:
        text = str(err)
    except RecursionError:  # decoded just within the stack's depth, too deep to print again
        text = f"(an error value nested too deeply to print: {type(err).__name__})"
    return Parsed(error=clip(text, ERROR_TEXT_CHARS), error_status=status)


as_int = as_count  # a whole JSON number (``16`` or ``16.0``: RFC 8259 numbers), else None: usage_claims' rule


_WORD = re.compile(r"\w+|[^\w\s]")


def local_token_weight(text: str) -> int:
    """A local token estimate of a chunk's text: runs of word characters and single punctuation marks."""
    return max(1, len(_WORD.findall(text)))


def weight(text: str) -> int:
    """A part's local weight: 0 when it is empty."""
    return local_token_weight(text) if text else 0
