"""The server's scraped series (``server_metrics.parquet``: t_ns, name, value) as frames and figures: one row
per scrape, the intervals in which the preemption counter rose, the summary's ``server`` block."""

from __future__ import annotations

from typing import Any

import polars as pl


def wide(metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per scrape: t_ns and a column per series."""
    return metrics.pivot(on="name", index="t_ns", values="value", aggregate_function="sum").sort("t_ns")


def preemption_windows(metrics: pl.DataFrame | None) -> list[tuple[int, int]]:
    """(t_prev_ns, t_ns) of every scrape interval in which the preemption counter rose."""
    if metrics is None or metrics.is_empty():
        return []
    p = metrics.filter(pl.col("name") == "preemptions_total").sort("t_ns")
    if p.height < 2:
        return []
    rose = p.with_columns(prev_t=pl.col("t_ns").shift(1), prev_v=pl.col("value").shift(1)).filter(
        pl.col("value") > pl.col("prev_v"))
    return list(zip(rose["prev_t"].to_list(), rose["t_ns"].to_list()))


def summary_of(metrics: pl.DataFrame | None) -> dict[str, Any]:
    if metrics is None or metrics.is_empty():
        return {}
    w = wide(metrics)
    out: dict[str, Any] = {"scrapes": w.height}
    for col in ("running", "waiting", "kv_cache_usage"):
        if col in w.columns:
            out[f"{col}_max"] = float(w[col].max())  # type: ignore[arg-type]
    if "preemptions_total" in w.columns:
        out["preemptions"] = float(w["preemptions_total"].max() - w["preemptions_total"].min())  # type: ignore
    out.update(_prefix_cache(w))
    return out


def _prefix_cache(w: pl.DataFrame) -> dict[str, float]:
    """The server's prefix-cache hit rate over the run: hits / queries (vLLM's token counters), or SGLang's
    own gauge at the last scrape."""
    if {"prefix_cache_queries_total", "prefix_cache_hits_total"} <= set(w.columns):
        queries = float(w["prefix_cache_queries_total"].max() - w["prefix_cache_queries_total"].min())  # type: ignore
        hits = float(w["prefix_cache_hits_total"].max() - w["prefix_cache_hits_total"].min())  # type: ignore
        return {"prefix_cache_hit_rate": hits / queries} if queries > 0 else {}
    if "prefix_cache_hit_rate" in w.columns:
        last = w["prefix_cache_hit_rate"].drop_nulls()
        return {"prefix_cache_hit_rate": float(last[-1])} if len(last) else {}
    return {}
