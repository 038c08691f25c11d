"""Score stall attribution against the simulator's ground truth (its trace of every engine step)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    """(victim seq, token index, culprit seq): the step that emitted the victim's token held a prefill of the
    culprit's long prompt and lasted longer than ``min_step_ms``."""
    requests = pl.read_parquet(run_dir / "requests.parquet")
    seq_of = dict(zip(requests["request_id"].to_list(), requests["seq"].to_list()))
    prompt_of = {e["id"]: e["prompt_tokens"] for e in read_trace(run_dir / "sim_trace.jsonl") if e["type"] == "request"}
    pairs = set()
    for e in read_trace(run_dir / "sim_trace.jsonl"):
        if e["type"] != "step" or (e["t_end_ns"] - e["t_start_ns"]) / 1e6 <= min_step_ms:
            continue
        culprits = [rid for rid, _, _ in e["prefill"] if prompt_of[rid] >= long_prompt_tokens]
        for rid, index, _ in e["tokens"]:
            for c in culprits:
                if c != rid and index > 0 and rid in seq_of and c in seq_of:
                    pairs.add((seq_of[rid], index, seq_of[c]))
    return pairs


def predicted_pairs(run_dir: Path) -> set[tuple[int, int, int]]:
    chunks = pl.read_parquet(run_dir / "chunks.parquet").sort("seq", "t_ns").with_columns(
        index=pl.int_range(pl.len()).over("seq"))
    stalls = pl.read_parquet(run_dir / "stalls.parquet").filter(pl.col("prefill_induced"))
    joined = stalls.join(chunks.select("seq", pl.col("t_ns").alias("t_end_ns"), "index"), on=["seq", "t_end_ns"])
    return {(s, i, c) for s, i, cs in joined.select("seq", "index", "culprits").iter_rows() for c in cs}


def score(run_dir: Path, long_prompt_tokens: int, min_step_ms: float) -> Score:
    truth, pred = truth_pairs(run_dir, long_prompt_tokens, min_step_ms), predicted_pairs(run_dir)
    # only judge victims loadgen measured (warm-up and failed requests are not analysed)
    requests = pl.read_parquet(run_dir / "requests.parquet")
    measured = set(requests.filter(~pl.col("warmup") & pl.col("error_kind").is_null())["seq"].to_list())
    truth = {p for p in truth if p[0] in measured}
    hits = truth & pred
    return Score(len(truth), len(pred), len(hits), sorted(truth - pred)[:20], sorted(pred - truth)[:20])
