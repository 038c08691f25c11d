"""How many of a stream's output tokens each chunk holds, and how many were reasoning and tool calls.

A chunk's tokens are exact when the server sent a running count (vLLM's ``continuous_usage_stats``); otherwise
local estimates (``openai_stream.local_token_weight`` of its text), rescaled here so that they sum to the server's
``completion_tokens`` (largest remainder). A chunk holds up to three parts, weighed locally: reasoning, tool-call
and answer text (one event may carry reasoning beside content: vLLM's multi-token steps across ``</think>``).
With the server's reasoning count (usage ``completion_tokens_details.reasoning_tokens``, Responses
``output_tokens_details.reasoning_tokens``, SGLang's ``usage.reasoning_tokens``) the reasoning parts are scaled to
it and the other parts to the rest, so that per-phase token rates follow the server's split. The server's counts
are first settled by ``usage_claims``' rule (``settle_usage``): an impossible claim is not shared out. Pure functions.
"""

from __future__ import annotations

from loadgen.core.records import ChunkRecord
from loadgen.core.openai_stream import Parsed
from loadgen.core.usage_claims import Seen, judge


def settle_usage(s: Parsed, chunks: list[ChunkRecord], seen: Seen) -> str | None:
    """The server's usage claims judged by ``usage_claims``' rule: ``s`` keeps the counts taken, the chunks are
    scaled down where running counts the stream's end rules out; why a claim was not taken (None: all were)."""
    j = judge(s.completion_tokens, s.prompt_tokens, s.cached_tokens, s.reasoning_tokens, seen)
    s.completion_tokens = j.completion_tokens
    s.prompt_tokens = j.prompt_tokens
    s.cached_tokens = j.cached_tokens
    s.reasoning_tokens = j.reasoning_tokens
    if j.chunk_cap is not None:
        for chunk, n in zip(chunks, scale([c.tokens for c in chunks], j.chunk_cap)):
            chunk.tokens = n
    return j.rejected


def phase_tokens(chunks: list[ChunkRecord], parts: list[tuple[int, int, int]], s: Parsed,
                  exact: bool) -> tuple[int, int]:
    """(reasoning, tool) tokens of a stream's chunks, their local estimates first rescaled to the server's totals
    (not ``exact``): with the server's reasoning count, the reasoning parts to it and the others to the rest; else
    the chunks to ``completion_tokens``. A server's count is taken unless fewer than the chunks that carried
    reasoning (SGLang says 0 when it did not separate the reasoning itself: inline ``<think>`` then counts)."""
    total, server = s.completion_tokens, s.reasoning_tokens
    if not any(r or t for r, t, _ in parts):  # answer text alone (most streams): nothing to share out
        if not exact:
            _rescale(chunks, total)
        return (server if server is not None and (total is None or total - server >= len(parts)) else 0), 0
    n_reasoning = sum(1 for r, _, _ in parts if r)
    n_other = len(parts) - sum(1 for _, t, a in parts if not (t or a))
    usable = server is not None and server >= n_reasoning and (total is None or total - server >= n_other)
    shares: list[int] | None = None
    if not exact and usable and total is not None and n_reasoning and n_other:
        assert server is not None
        shares = _split_rescale(chunks, parts, server, total)
    elif not exact:
        _rescale(chunks, total)
    if shares is None:
        shares = [_share(c.tokens, r, t + a) for c, (r, t, a) in zip(chunks, parts)]
    tool = sum(_share(c.tokens - r, t, a) for c, r, (_, t, a) in zip(chunks, shares, parts))
    return (server if usable and server is not None else sum(shares)), tool


def _share(tokens: int, mine: int, others: int) -> int:
    """A chunk's tokens that belong to the part of local weight ``mine`` beside parts of weight ``others`` (at
    least one each when both are there and the chunk has two tokens or more)."""
    if not mine:
        return 0
    if not others:
        return tokens
    return min(tokens - 1, max(1, round(tokens * mine / (mine + others)))) if tokens > 1 else 0


def _split_rescale(chunks: list[ChunkRecord], parts: list[tuple[int, int, int]], reasoning: int,
                   total: int) -> list[int]:
    """Reasoning parts scaled to the server's ``reasoning`` count and the other parts to ``total`` less it; each
    chunk's tokens their sum. Returns each chunk's reasoning share."""
    r_scaled = iter(_scale_to([r for r, _, _ in parts if r], reasoning))
    o_scaled = iter(_scale_to([t + a for _, t, a in parts if t or a], total - reasoning))
    shares = []
    for chunk, (r, t, a) in zip(chunks, parts):
        mine = next(r_scaled) if r else 0
        chunk.tokens = mine + (next(o_scaled) if t or a else 0)
        shares.append(mine)
    return shares


def _scale_to(weights: list[int], total: int) -> list[int]:
    return weights if sum(weights) == total else scale(weights, total)


def _rescale(chunks: list[ChunkRecord], total: int | None) -> None:
    """Local estimates scaled to the server's total, when it reported one that can be shared out."""
    weights = [c.tokens for c in chunks]
    if total is None or total < len(chunks) or sum(weights) == total:
        return
    for chunk, n in zip(chunks, scale(weights, total)):
        chunk.tokens = n


def scale(weights: list[int], total: int) -> list[int]:
    """Integers proportional to ``weights``, each >= 1, summing to ``total`` (largest remainder)."""
    spare = total - len(weights)
    raw = [w / sum(weights) * spare for w in weights]
    out = [1 + int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out
