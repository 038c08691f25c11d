"""Reasoning figures of a run (issue 38): how many output tokens were reasoning, answer and tool calls, and the
reasoning share, over the measured successful requests, for the run and per class (summary.json ``reasoning``).

Counts are the records' own: ``reasoning_tokens`` (the server's usage details where it gave them, else the
reasoning chunks' tokens), ``tool_tokens`` and ``tool_calls``; ``answer_tokens`` = output − reasoning tokens
(tool-call tokens are answer-phase output). The per-request distributions (time to first answer, per-phase
TPOT and ITL) are metric rows (core/vocabulary.py, family ``reasoning``); these are the run-level figures
(``FIGURES["reasoning_share"]``). Pure polars over the records.

A request that reasoned but never produced an answer token (``t_first_answer_ns`` null with reasoning tokens:
it thought until ``max_tokens``, finish_reason ``length``) has no time to first answer: it is counted
(``requests_without_answer``), left out of the ``ttft_answer_ms`` percentiles, and a miss for a
``ttft_answer_ms`` objective (analysis/objective_samples.py).

Tool calls (``tools``): a run's tool-call figures whenever a measured successful request called a tool, with or
without reasoning or sessions (``tool_figures``).
"""

from __future__ import annotations

from typing import Any

import polars as pl


def never_answered(frame: pl.DataFrame) -> pl.Series:
    """Per request: it reasoned but no answer token came (no ``t_first_answer_ns``; all False in records
    written before issue 38)."""
    if "t_first_answer_ns" not in frame.columns or "reasoning_tokens" not in frame.columns:
        return pl.Series("never_answered", [False] * frame.height, dtype=pl.Boolean)
    return frame.select((pl.col("t_first_answer_ns").is_null() & (pl.col("reasoning_tokens").fill_null(0) > 0))
                        .alias("never_answered")).to_series()


def reasoning_counts(ok: pl.DataFrame) -> dict[str, Any]:
    """``reasoning_share`` (Σ reasoning / Σ output tokens; None without output), ``reasoning_tokens``,
    ``answer_tokens``, ``tool_tokens``, ``tool_calls``, ``requests_with_reasoning``,
    ``requests_without_answer`` (reasoned, no answer token: ``never_answered``), ``requests``."""
    reasoned = ok["reasoning_tokens"].fill_null(0)
    output = int(ok["output_tokens"].fill_null(0).sum())
    thinking = int(reasoned.sum())
    return {"reasoning_share": thinking / output if output else None, "reasoning_tokens": thinking,
            "answer_tokens": output - thinking, "tool_tokens": int(ok["tool_tokens"].fill_null(0).sum()),
            "tool_calls": int(ok["tool_calls"].fill_null(0).sum()),
            "requests_with_reasoning": int((reasoned > 0).sum()),
            "requests_without_answer": int(never_answered(ok).sum()), "requests": ok.height}


def reasoning_figures(measured: pl.DataFrame, classes: list[str]) -> dict[str, Any] | None:
    """The run's counts and each class's (``classes``: the scenario's, in order); None when no measured request
    reasoned (the summary then has no ``reasoning`` section)."""
    if "reasoning_tokens" not in measured.columns:
        return None
    ok = measured.filter(pl.col("ok"))
    if not bool((ok["reasoning_tokens"].fill_null(0) > 0).any()):
        return None
    per_class = {name: reasoning_counts(ok.filter(pl.col("class_name") == name)) for name in classes}
    return {**reasoning_counts(ok), "classes": per_class}


def tool_figures(measured: pl.DataFrame) -> dict[str, int] | None:
    """summary.json's ``tools``: over the measured successful requests, ``requests_with_tool_calls``,
    ``tool_calls`` and ``tool_tokens`` (tool-call tokens, counted in output_tokens too); None when none called
    a tool (records before issue 38: None)."""
    if "tool_calls" not in measured.columns:
        return None
    ok = measured.filter(pl.col("ok"))
    calls = ok["tool_calls"].fill_null(0)
    if not bool((calls > 0).any()):
        return None
    return {"requests_with_tool_calls": int((calls > 0).sum()), "tool_calls": int(calls.sum()),
            "tool_tokens": int(ok["tool_tokens"].fill_null(0).sum()) if "tool_tokens" in ok.columns else 0}
