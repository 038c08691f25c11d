"""The simulator's tokenizer: a documented, deterministic rule shared by /tokenize, usage and costing.

Rule: a token is a run of letters/digits/underscore (``\\w+``) or one other non-space character. Whitespace is
not a token. ``"Hello, world!"`` is 4 tokens. Token ids are a stable hash of the token text into the vocabulary.

Chat requests are rendered as: every message costs its content's tokens plus ``MESSAGE_OVERHEAD_TOKENS`` (role
and separators), and the prompt ends with ``GENERATION_PROMPT_TOKENS`` (the assistant header). An assistant
message's ``tool_calls`` add each call's function name and arguments tokens after its content (exactly the
tokens the simulator generated for that call), and a ``tool`` message costs its content like any other.

Generated text is a cycle of words, each emitted as one token ``" word"``, so re-tokenizing the output gives
exactly the number of tokens the engine generated.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Iterable

VOCAB_SIZE = 32000
MESSAGE_OVERHEAD_TOKENS = 4
GENERATION_PROMPT_TOKENS = 2
_TOKEN = re.compile(r"\w+|[^\w\s]")
OUTPUT_WORDS = ("the", "model", "streams", "one", "token", "per", "decode", "step", "while", "prefill",
                "reads", "whole", "prompt", "at", "once", "and", "batches", "share", "time")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def token_ids(tokens: Iterable[str]) -> list[int]:
    return [zlib.crc32(t.encode()) % VOCAB_SIZE for t in tokens]


def _content_text(content: Any) -> str:
    """Message content: a string, or OpenAI's list of parts (only text parts count)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError("message content must be a string or a list of parts")


def message_text(message: dict[str, Any]) -> str:
    """What a message contributes to the prompt: its content, then any tool calls' names and arguments."""
    text = _content_text(message.get("content"))
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return text
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            text += f" {fn.get('name') or ''} {fn.get('arguments') or ''}"
    return text


def chat_tokens(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[str]:
    """The token strings of a rendered chat prompt (special tokens shown as <|role|> markers)."""
    out: list[str] = []
    for message in messages:
        role = str(message.get("role", "user"))
        out += [f"<|{role}|>", "\n"]
        out += tokenize(message_text(message))
        out += ["<|end|>", "\n"]
    if add_generation_prompt:
        out += ["<|assistant|>", "\n"]
    return out


def output_token(index: int) -> str:
    """The text of the index-th generated token (always exactly one token under the rule)."""
    return " " + OUTPUT_WORDS[index % len(OUTPUT_WORDS)]
