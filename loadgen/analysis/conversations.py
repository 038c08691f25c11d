"""Multi-turn figures from the records: per turn index (requests, TTFT, prompt length, prefix-cache hits) and
per conversation (turns sent, failures, duration). Pure polars over the measured requests (warm-up excluded).

A conversation ends at its first failed turn (the driver has no answer to continue from), so ``turns`` counts
the turns sent; ``failed`` the conversations one of whose turns failed. ``cached_tokens`` is the server's
``usage.prompt_tokens_details.cached_tokens`` (null where it did not say).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from loadgen.analysis.metrics import describe


def conversation_figures(measured: pl.DataFrame) -> dict[str, Any] | None:
    """``{"conversations": {...}, "turns": [{turn, requests, ok, ttft_ms, ...}, ...]}``; None: no conversation."""
    conv = measured.filter(pl.col("conversation").is_not_null())
    if conv.is_empty():
        return None
    return {"conversations": _per_conversation(conv), "turns": _per_turn(conv)}


def _per_turn(conv: pl.DataFrame) -> list[dict[str, Any]]:
    out = []
    for (turn,), rows in sorted(conv.group_by("turn"), key=lambda kv: kv[0][0]):
        ok = rows.filter(pl.col("ok"))
        cached = ok["cached_tokens"].drop_nulls()
        prompts = ok.filter(pl.col("cached_tokens").is_not_null())["prompt_tokens"]
        hit = float(cached.sum() / prompts.sum()) if len(cached) and prompts.sum() else None
        out.append({"turn": int(turn), "requests": rows.height, "ok": ok.height,
                    "ttft_ms": _stats(ok["ttft_ms"]), "ttft_service_ms": _stats(ok["ttft_service_ms"]),
                    "prompt_tokens_mean": float(ok["prompt_tokens"].mean()) if ok.height else None,  # type: ignore
                    "cached_tokens_mean": float(cached.mean()) if len(cached) else None,  # type: ignore
                    "cache_hit_ratio": hit})
    return out


def _stats(values: pl.Series) -> dict[str, float | None]:
    d = describe(values)
    return {k: d[k] for k in ("p50", "p90", "p99", "mean")}  # type: ignore[misc]


def _per_conversation(conv: pl.DataFrame) -> dict[str, Any]:
    per = conv.group_by("worker", "conversation").agg(
        turns=pl.len(), failed=(~pl.col("ok")).any(),
        duration_s=(pl.col("t_done_ns").max() - pl.col("t_intended_ns").min()) / 1e9).sort("worker", "conversation")
    done = per.filter(~pl.col("failed"))
    return {"count": per.height, "failed": int(per["failed"].sum()),
            "turns_mean": float(per["turns"].mean()), "turns_max": int(per["turns"].max()),  # type: ignore
            "duration_s": _stats(done["duration_s"])}
