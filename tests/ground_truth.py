"""Score stall attribution against the simulator's ground truth (its trace of every engine step)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from local_target.sim import read_trace


@dataclass
class Score:
    truth: int
    predicted: int
    hits: int
    missed: list[tuple[int, int, int]]
    wrong: list[tuple[int, int, int]]

    @property
    def precision(self) -> float:
        return self.hits / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        return self.hits / self.truth if self.truth else 1.0


def truth_pairs(run_dir: Path, long_prompt_tokens: int, min_step_ms: float) -> set[tuple[int, int, int]]:
    """(victim seq, token index, culprit seq) from a real run's simulator trace (``truth_pairs_of``)."""
    requests = pl.read_parquet(run_dir / "requests.parquet")
    seq_of = dict(zip(requests["request_id"].to_list(), requests["seq"].to_list()))
    return truth_pairs_of(read_trace(run_dir / "sim_trace.jsonl"), seq_of, long_prompt_tokens, min_step_ms)


def truth_pairs_of(trace: list[dict[str, Any]], seq_of: dict[str, int], long_prompt_tokens: int,
                   min_step_ms: float) -> set[tuple[int, int, int]]:
    """(victim seq, token index, culprit seq): the victim's gap before that token (from the step that emitted
    its previous token to the step that emitted this one) held steps prefilling the culprit's long prompt that
    together lasted longer than ``min_step_ms``. One rule for every scheduler: in a mixed batch (vLLM,
    llama.cpp) the gap is the prefill's own step; under prefill-only batches (SGLang, TGI) it is the prefill
    batch plus the decode step after it. ``trace``: the simulator's events (local_target/sim/trace.py);
    ``seq_of``: engine request id → loadgen seq."""
    prompt_of = {e["id"]: e["prompt_tokens"] for e in trace if e["type"] == "request"}
    steps = sorted((e for e in trace if e["type"] == "step"), key=lambda e: e["t_end_ns"])
    ends = [e["t_end_ns"] for e in steps]
    emitted: dict[str, dict[int, int]] = {}  # request → token index → step end
    for e in steps:
        for rid, index, _ in e["tokens"]:
            emitted.setdefault(rid, {})[index] = e["t_end_ns"]
    pairs = set()
    for rid, tokens in emitted.items():
        for index, t_end in tokens.items():
            t_prev = tokens.get(index - 1)
            if index == 0 or t_prev is None or rid not in seq_of:
                continue
            held: dict[str, float] = {}
            for e in steps[bisect.bisect_right(ends, t_prev):bisect.bisect_right(ends, t_end)]:
                for c, _, _ in e["prefill"]:
                    if c != rid and prompt_of[c] >= long_prompt_tokens and c in seq_of:
                        held[c] = held.get(c, 0.0) + (e["t_end_ns"] - e["t_start_ns"]) / 1e6
            pairs |= {(seq_of[rid], index, seq_of[c]) for c, ms in held.items() if ms > min_step_ms}
    return pairs


def predicted_pairs(run_dir: Path) -> set[tuple[int, int, int]]:
    return predicted_pairs_of(pl.read_parquet(run_dir / "chunks.parquet"), pl.read_parquet(run_dir / "stalls.parquet"))


def predicted_pairs_of(chunks: pl.DataFrame, stalls: pl.DataFrame) -> set[tuple[int, int, int]]:
    """(victim seq, token index, culprit seq) of every prefill-induced stall loadgen attributed."""
    chunks = chunks.sort("seq", "t_ns").with_columns(index=pl.int_range(pl.len()).over("seq"))
    induced = stalls.filter(pl.col("prefill_induced"))
    joined = induced.join(chunks.select("seq", pl.col("t_ns").alias("t_end_ns"), "index"), on=["seq", "t_end_ns"])
    return {(s, i, c) for s, i, cs in joined.select("seq", "index", "culprits").iter_rows() for c in cs}


def score(run_dir: Path, long_prompt_tokens: int, min_step_ms: float) -> Score:
    truth, pred = truth_pairs(run_dir, long_prompt_tokens, min_step_ms), predicted_pairs(run_dir)
    return score_pairs(truth, pred, pl.read_parquet(run_dir / "requests.parquet"))


def score_pairs(truth: set[tuple[int, int, int]], pred: set[tuple[int, int, int]], requests: pl.DataFrame) -> Score:
    """Precision and recall of ``pred`` against ``truth``, judged on the victims loadgen measured (warm-up and
    failed requests are not analysed)."""
    measured = set(requests.filter(~pl.col("warmup") & pl.col("error_kind").is_null())["seq"].to_list())
    truth = {p for p in truth if p[0] in measured}
    hits = truth & pred
    return Score(len(truth), len(pred), len(hits), sorted(truth - pred)[:20], sorted(pred - truth)[:20])
