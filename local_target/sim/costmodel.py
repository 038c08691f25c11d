"""Step time of one engine iteration, from the roofline shape in ``EngineConfig``'s docstring. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from .config import EngineConfig


@dataclass(frozen=True)
class PrefillChunk:
    """``tokens`` prompt tokens prefilled in one step, starting at context position ``start``."""

    tokens: int
    start: int = 0


def attention_work(chunk: PrefillChunk) -> float:
    """Σ over the chunk's tokens of their context position (causal attention): tokens × mean position."""
    return chunk.tokens * (chunk.start + (chunk.tokens + 1) / 2)


def step_ms(cfg: EngineConfig, prefills: list[PrefillChunk], decode_contexts: list[int]) -> float:
    """Modelled duration (ms, before ``time_scale``) of a step with these prefill chunks and decodes.

    ``decode_contexts`` holds each decoding sequence's context length (prompt + generated so far).
    """
    prefill_tokens = sum(c.tokens for c in prefills)
    decode_ms = cfg.compute_ms_per_token if cfg.decode_ms_per_token is None else cfg.decode_ms_per_token
    kv_tokens = sum(decode_contexts) + sum(c.start + c.tokens for c in prefills)
    return (cfg.overhead_ms
            + cfg.compute_ms_per_token * prefill_tokens
            + decode_ms * len(decode_contexts)
            + cfg.attention_ms_per_token2 * sum(attention_work(c) for c in prefills)
            + cfg.weights_read_ms
            + cfg.kv_read_ms_per_token * kv_tokens)


def prefill_alone_ms(cfg: EngineConfig, prompt_tokens: int) -> float:
    """TTFT an idle engine gives a prompt that fits one step (the low-load model tests compare against)."""
    if cfg.splits_prompts and prompt_tokens > cfg.max_num_batched_tokens:
        total, start = 0.0, 0
        while start < prompt_tokens:
            n = min(cfg.max_num_batched_tokens, prompt_tokens - start)
            total += step_ms(cfg, [PrefillChunk(n, start)], [])
            start += n
        return total
    return step_ms(cfg, [PrefillChunk(prompt_tokens, 0)], [])
