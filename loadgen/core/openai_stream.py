"""OpenAI streaming chunk parsing (chat and completions, vLLM extensions). Pure functions.

A chunk carries generated text when ``delta.content`` (chat), ``text`` (completions), or a reasoning delta
(``delta.reasoning_content`` / ``delta.reasoning``) is a non-empty string. Role-only and empty deltas do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Parsed:
    text: str = ""
    reasoning: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (prefix-cache hits)
    request_id: str | None = None
    error: str | None = None  # the server reported an error in the stream, or the chunk is not valid
    error_status: int | None = None
    done: bool = False


def parse_event(data: str) -> Parsed:
    if data == "[DONE]":
        return Parsed(done=True)
    try:
        obj = json.loads(data)
    except ValueError:
        return Parsed(error=f"malformed chunk: {data[:80]!r}")
    if not isinstance(obj, dict):
        return Parsed(error=f"chunk is not an object: {data[:80]!r}")
    if "error" in obj:
        return _error(obj["error"])
    out = Parsed(request_id=obj.get("id") if isinstance(obj.get("id"), str) else None)
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        _choice(choices[0], out)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        out.prompt_tokens = _int(usage.get("prompt_tokens"))
        out.completion_tokens = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            out.cached_tokens = _int(details.get("cached_tokens"))
    return out


def _choice(choice: dict[str, Any], out: Parsed) -> None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(content, str) and content:
            out.text = content
        elif isinstance(reasoning, str) and reasoning:
            out.text, out.reasoning = reasoning, True
    elif isinstance(choice.get("text"), str):
        out.text = choice["text"]
    reason = choice.get("finish_reason")
    out.finish_reason = reason if isinstance(reason, str) else None


def _error(err: Any) -> Parsed:
    if isinstance(err, dict):
        code = err.get("code")
        status = code if isinstance(code, int) else None
        return Parsed(error=str(err.get("message") or err)[:200], error_status=status)
    return Parsed(error=str(err)[:200])


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_WORD = re.compile(r"\w+|[^\w\s]")


def local_token_weight(text: str) -> int:
    """A local token estimate of a chunk's text: runs of word characters and single punctuation marks."""
    return max(1, len(_WORD.findall(text)))
