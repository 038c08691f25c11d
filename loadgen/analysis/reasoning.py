"""Reasoning figures of a run (issue 38): how many output tokens were reasoning, answer and tool calls, and the
reasoning share, over the measured successful requests, for the run and per class (summary.json ``reasoning``).

Counts are the records' own: ``reasoning_tokens`` (the server's usage details where it gave them, else the
reasoning chunks' tokens), ``tool_tokens`` and ``tool_calls``; ``answer_tokens`` = output − reasoning tokens
(tool-call tokens are answer-phase output). The per-request distributions (time to first answer, per-phase
TPOT and ITL) are metric rows (core/vocabulary.py, family ``reasoning``); these are the run-level figures
(``FIGURES["reasoning_share"]``). Pure polars over the records.
"""

from __future__ import annotations

from typing import Any

import polars as pl


def reasoning_counts(ok: pl.DataFrame) -> dict[str, Any]:
    """``reasoning_share`` (Σ reasoning / Σ output tokens; None without output), ``reasoning_tokens``,
    ``answer_tokens``, ``tool_tokens``, ``tool_calls``, ``requests_with_reasoning``, ``requests``."""
    reasoned = ok["reasoning_tokens"].fill_null(0)
    output = int(ok["output_tokens"].fill_null(0).sum())
    thinking = int(reasoned.sum())
    return {"reasoning_share": thinking / output if output else None, "reasoning_tokens": thinking,
            "answer_tokens": output - thinking, "tool_tokens": int(ok["tool_tokens"].fill_null(0).sum()),
            "tool_calls": int(ok["tool_calls"].fill_null(0).sum()),
            "requests_with_reasoning": int((reasoned > 0).sum()), "requests": ok.height}


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
