"""OpenAI streaming chunk parsing (chat and completions, vLLM extensions). Pure functions.

A chunk carries generated tokens when any of these is non-empty (``Parsed.text`` holds them, for counting):

- ``delta.content`` (chat) as a string, or as a list of content parts (``[{"type": "text", "text": ...}]``,
  which some gateways send); ``delta.refusal``; ``text`` (completions);
- a reasoning delta (``delta.reasoning_content`` / ``delta.reasoning``): ``Parsed.reasoning``;
- tool calls (``delta.tool_calls[].function.name`` / ``.arguments``, the older ``delta.function_call``): the
  arguments are output tokens the model generates, timed like text (``Parsed.tool``).

Role-only and empty deltas carry none: TTFT is the first chunk that does. An ``error`` member that is null (or
empty) is no error: some gateways send ``"error": null`` in every chunk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loadgen.core.secrets import clip

ERROR_TEXT_CHARS = 2000  # a server's error message, kept whole up to this (the sink clips it after redaction)


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
        _choice(choices[0], out)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        out.prompt_tokens = as_int(usage.get("prompt_tokens"))
        out.completion_tokens = as_int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            out.cached_tokens = as_int(details.get("cached_tokens"))
    return out


def _choice(choice: dict[str, Any], out: Parsed) -> None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = content_text(delta.get("content")) + as_str(delta.get("refusal"))
        tool = tool_text(delta.get("tool_calls")) + function_text(delta.get("function_call"))
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if content or tool:
            out.text, out.tool = content + tool, not content
        elif isinstance(reasoning, str) and reasoning:
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


def function_text(function: Any) -> str:
    """A function call's generated tokens: its name (when given) and its arguments' text."""
    if not isinstance(function, dict):
        return ""
    return as_str(function.get("name")) + as_str(function.get("arguments"))


def tool_text(tool_calls: Any) -> str:
    """The generated tokens of a delta's ``tool_calls`` (each call's function name and argument text)."""
    if not isinstance(tool_calls, list):
        return ""
    return "".join(function_text(call.get("function")) for call in tool_calls if isinstance(call, dict))


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


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_WORD = re.compile(r"\w+|[^\w\s]")


def local_token_weight(text: str) -> int:
    """A local token estimate of a chunk's text: runs of word characters and single punctuation marks."""
    return max(1, len(_WORD.findall(text)))
