"""Usage is the server's claim: ONE rule, here, decides which counts a stream's records take (docs/servers.md,
"Usage is a claim"). Pure functions; the tracker asks.

A count is a JSON number (RFC 8259 §6 does not tell integers from other numbers): an integer, or a number with
a zero fraction (``16.0``), is that count; anything else (a string, a bool, null, ``16.5``, NaN) is no count.
The counts are OpenAI's usage object's: ``completion_tokens`` every token generated (reasoning included:
``completion_tokens_details.reasoning_tokens`` is a part of it), ``prompt_tokens`` the prompt's tokens
(``prompt_tokens_details.cached_tokens`` a part of them); the other APIs' counts map onto them (core/apis.py).

A claim is taken where it is possible, else the records keep what loadgen counted itself and say why
(``RequestRecord.usage_rejected``):

- ``completion_tokens`` (and each running count, vLLM's ``continuous_usage_stats``, never below the count before
  it): at least one per chunk that carried text (a token streams whole: a count under the chunks is the
  misreport loadgen check names), at most ``output_bound``: the ``max_tokens`` asked
  (a server stops there; hidden reasoning fits under it; the chunks seen where a server ignored it), or, where
  nothing capped the output, what arrived — a token that is not special holds at
  least one UTF-8 byte of text, a character at most four bytes, and special tokens (end of sequence, think tags,
  tool-call markup) hold none: one per chunk and ``OUTPUT_SLACK_TOKENS`` more. Rejected: the chunks' own count.
- ``prompt_tokens``: at least 0, at most ``prompt_bound``: the request body's UTF-8 bytes (each prompt token is
  at least one byte of it) plus ``PROMPT_TEMPLATE_TOKENS`` for the chat template's own tokens; where the body's
  size is unknown, ``PROMPT_ESTIMATE_FACTOR`` times the asked length plus the same (a request carrying a history
  has no asked bound). Rejected: the asked length (``prompt_tokens_source`` "asked").
- ``cached_tokens``: 0 to the prompt's tokens; ``reasoning_tokens``: 0 to the output tokens. Rejected: none.

So no claim makes a figure negative, or larger than what was asked or received: memory and time stay bounded by
the plan and the bytes read, whatever a server says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OUTPUT_SLACK_TOKENS = 16  # special tokens with no text beyond one per chunk (end of sequence, think tags, ...)
BYTES_PER_CHAR = 4  # UTF-8: a character is at most four bytes, and a token that is not special at least one
PROMPT_TEMPLATE_TOKENS = 1024  # the chat template's own tokens (roles, special tokens, a default system prompt)
PROMPT_ESTIMATE_FACTOR = 8  # the asked (estimated) prompt length may be this far under the server's count


def as_count(value: Any) -> int | None:
    """A JSON number that is a whole count (``16`` or ``16.0``, any sign or size: the rule judges it), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def output_bound(asked: int, chars: int, chunks: int) -> int:
    """The most output tokens a stream can have generated: ``asked`` (max_tokens: a server stops there; more
    chunks than that only where the server ignored it), else what arrived (``chars`` characters of text in
    ``chunks`` chunks)."""
    if asked > 0:
        return max(asked, chunks)
    return BYTES_PER_CHAR * chars + chunks + OUTPUT_SLACK_TOKENS


def prompt_bound(asked: int, body_bytes: int | None, history: bool) -> int | None:
    """The most prompt tokens a request can have sent (None: no bound known)."""
    if body_bytes:
        return body_bytes + PROMPT_TEMPLATE_TOKENS
    if history:
        return None
    return PROMPT_ESTIMATE_FACTOR * max(asked, 0) + PROMPT_TEMPLATE_TOKENS


@dataclass(frozen=True, slots=True)
class Judged:
    """The counts a request's records take, and why a claim was not taken (None: every claim was)."""

    completion_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    rejected: str | None
    chunk_cap: int | None = None  # the chunks' tokens scaled down to this (running counts over the bound)


@dataclass(frozen=True, slots=True)
class Seen:
    """What loadgen knows of a request without the server's word: asked, sent and received."""

    output_asked: int
    prompt_asked: int
    body_bytes: int | None
    history: bool
    chars: int  # characters of generated text received (answer, reasoning and tool calls)
    chunks: int  # chunks that carried it
    counted: int  # the chunks' own output-token count


def _outside(claim: int, low: int, high: int | None) -> bool:
    return claim < low or (high is not None and claim > high)


def shown(claim: int) -> str:
    """A claimed count as text: whole, or its head and its number of digits when it is huge."""
    text = str(claim)
    return text if len(text) <= 20 else f"{text[:6]}… ({len(text.lstrip('-'))} digits)"


def judge(completion: int | None, prompt: int | None, cached: int | None, reasoning: int | None,
          seen: Seen) -> Judged:
    """The rule (module doc) applied to a request's final claims."""
    notes: list[str] = []
    low, high = seen.chunks, output_bound(seen.output_asked, seen.chars, seen.chunks)
    kept = min(seen.counted, high)
    if completion is not None and _outside(completion, low, high):
        notes.append(f"usage.completion_tokens {shown(completion)}, possible {low}..{high} (max_tokens "
                     f"{seen.output_asked}; {seen.chars} characters in {seen.chunks} chunks): {kept} "
                     "counted from the chunks")
        completion = None
    chunk_cap = None
    if completion is None and seen.counted > high:  # running counts taken that the stream's end rules out
        notes.append(f"the running counts come to {seen.counted} tokens, {high} possible: the chunks scaled to it")
        chunk_cap = high
    p_high = prompt_bound(seen.prompt_asked, seen.body_bytes, seen.history)
    if prompt is not None and _outside(prompt, 0, p_high):
        sent = f"a body of {seen.body_bytes} bytes" if seen.body_bytes else f"{seen.prompt_asked} tokens asked"
        notes.append(f"usage.prompt_tokens {shown(prompt)}, possible 0..{p_high} ({sent}): the asked "
                     f"{seen.prompt_asked} kept")
        prompt = None
    prompt_known = prompt if prompt is not None else seen.prompt_asked
    if cached is not None and _outside(cached, 0, prompt_known):
        notes.append(f"usage cached_tokens {shown(cached)}, possible 0..{prompt_known}: dropped")
        cached = None
    output_known = completion if completion is not None else kept
    if reasoning is not None and _outside(reasoning, 0, output_known):
        notes.append(f"usage reasoning_tokens {shown(reasoning)}, possible 0..{output_known}: dropped")
        reasoning = None
    return Judged(completion, prompt, cached, reasoning, "; ".join(notes) or None, chunk_cap)


def running(count: int | None, last: int, asked: int, chars: int, chunks: int) -> int | None:
    """A running output count (vLLM's continuous usage stats) taken, or None where impossible: below the count
    before it, or over ``output_bound`` of what has arrived so far."""
    if count is None or count < last or count > output_bound(asked, chars, chunks):
        return None
    return count
