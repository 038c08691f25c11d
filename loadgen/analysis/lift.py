"""Culprit pairs and the lift of a run's stalls (DESIGN §5; ``spikes.py`` has the theory): which prefill
windows can explain a gap, and P(stall | a long prefill covers the gap) / P(stall | none) over every gap.

Most gaps overlap no prefill window at all: the lift pairs only the gaps that overlap the windows' union (found
by one ``search_sorted``) with the windows, a part at a time, and counts the rest with semi-joins.
"""

from __future__ import annotations

import math

import polars as pl

from loadgen.analysis.prefill import NS_PER_MS
from loadgen.analysis.run_analysis import CHUNK_GAP_MS, RunAnalysis

LIFT_PART_ROWS = 250_000  # gaps near a prefill paired with the windows at a time (bounds the pairs' memory)
SCAN_ROWS = 2_000_000  # gaps tested against the windows' union at a time


def culprit_pairs(intervals: pl.DataFrame, windows: pl.DataFrame, share: float, tol_ms: float,
                  min_inside_ms: float = 0.0) -> pl.DataFrame:
    """(interval, window of another request) pairs where that prefill finished with the interval (within
    ``tol_ms``, one engine step), or its window alone covers ``share`` of it, or lies inside it and is itself
    as long as a stall (``min_inside_ms``: several short prefill batches in a row are a burst, not culprits)."""
    w = windows.select(pl.col("worker").alias("c_worker"), pl.col("seq").alias("c_seq"),
                       pl.col("prompt_tokens").alias("c_prompt_tokens"), "w_start_ns", "w_end_ns")
    pairs = intervals.join_where(w, pl.col("w_start_ns") < pl.col("t_end_ns"),
                                 pl.col("w_end_ns") > pl.col("t_start_ns"))
    overlap_ms = (pl.min_horizontal("t_end_ns", "w_end_ns") - pl.max_horizontal("t_start_ns", "w_start_ns")) / 1e6
    gap_ms = (pl.col("t_end_ns") - pl.col("t_start_ns")) / 1e6
    tol_ns = int(tol_ms * NS_PER_MS)
    ends_with_gap = (pl.col("w_end_ns") - pl.col("t_end_ns")).abs() <= tol_ns
    inside = ((pl.col("w_start_ns") >= pl.col("t_start_ns") - tol_ns) & (pl.col("w_end_ns") <= pl.col("t_end_ns"))
              & (pl.col("w_end_ns") - pl.col("w_start_ns") >= int(min_inside_ms * NS_PER_MS)))
    return (pairs.with_columns(overlap_ms=overlap_ms)
            .filter(~((pl.col("c_seq") == pl.col("seq")) & (pl.col("c_worker") == pl.col("worker"))))
            .filter(ends_with_gap | (pl.col("overlap_ms") >= share * gap_ms) | inside))


def covered(pairs: pl.DataFrame, keys: list[str], share: float) -> pl.DataFrame:
    """Per interval: do its culprits' windows together cover ``share`` of it? (Their hull: they reach the
    gap's end, or run back to back inside it.)"""
    hull_ms = (pl.min_horizontal(pl.col("t_end_ns").first(), pl.col("w_end_ns").max())
               - pl.max_horizontal(pl.col("t_start_ns").first(), pl.col("w_start_ns").min())) / 1e6
    gap_ms = (pl.col("t_end_ns").first() - pl.col("t_start_ns").first()) / 1e6
    return pairs.group_by(keys).agg(covered=hull_ms >= share * gap_ms)


def lift(gaps: pl.DataFrame | pl.LazyFrame, stalls: pl.DataFrame, windows: pl.DataFrame, share: float,
         tol_ms: float, min_inside_ms: float = 0.0) -> float | None:
    """P(stall | a long prefill covers the gap) / P(stall | none): ``math.inf`` when no gap stalled without a
    long prefill; None when no gap had one, or none of those stalled. The culprit rule runs only on the gaps
    that overlap the union of the prefill windows (a few of every gap; the rest cannot be covered)."""
    intervals = gaps.lazy().select("worker", "seq", t_start_ns=pl.col("t_ns") - (pl.col("chunk_gap_ms") * NS_PER_MS)
                                   .cast(pl.Int64), t_end_ns=pl.col("t_ns"))
    keys = ["worker", "seq", "t_end_ns"]
    near = _overlapping(intervals, windows).collect(engine="streaming")
    hit = covered(culprit_pairs(near, windows, share, tol_ms, min_inside_ms), keys, share).filter(
        pl.col("covered")).select(keys)
    stall_keys = stalls.select(keys).unique()

    def rows(among: pl.DataFrame | None) -> int:  # the gap rows whose key is in ``among`` (all: None)
        frame = intervals if among is None else intervals.join(among.lazy(), on=keys, how="semi")
        return int(frame.select(pl.len()).collect(engine="streaming").item())
    return _lift_of(rows(None), rows(stall_keys), rows(hit.unique()), rows(stall_keys.join(hit, on=keys, how="semi")))


def _overlapping(intervals: pl.LazyFrame, windows: pl.DataFrame) -> pl.LazyFrame:
    """The intervals that overlap the union of ``windows`` (a superset of those that overlap one window)."""
    if windows.is_empty():
        return intervals.head(0)
    union = (windows.select("w_start_ns", "w_end_ns").sort("w_start_ns")
             .with_columns(run=(pl.col("w_start_ns") > pl.col("w_end_ns").cum_max().shift(1)).fill_null(True)
                           .cum_sum())
             .group_by("run").agg(u0=pl.col("w_start_ns").min(), u1=pl.col("w_end_ns").max()).sort("u0"))
    u0, u1 = union["u0"], union["u1"]
    j = pl.lit(u1).search_sorted(pl.col("t_start_ns"), side="right")  # the first union part ending after it
    start = pl.lit(u0).gather(j.clip(upper_bound=len(u0) - 1))
    return intervals.filter((j < len(u0)) & (start < pl.col("t_end_ns")))


def lift_narrow(run: RunAnalysis, gaps: pl.DataFrame, stalls: pl.DataFrame, windows: pl.DataFrame, share: float,
                tol_ms: float, min_inside_ms: float = 0.0) -> float | None:
    """``lift`` over narrow gaps of ``run`` (keyed by request row ``i``): the same counts, each a semi-join
    on two integer columns instead of the wide rows."""
    def intervals(part: pl.DataFrame) -> pl.LazyFrame:
        return part.lazy().select("i", t_start_ns=pl.col("t_ns") - (CHUNK_GAP_MS * NS_PER_MS).cast(pl.Int64),
                                  t_end_ns=pl.col("t_ns"))
    near = pl.concat([_overlapping(intervals(gaps.slice(at, SCAN_ROWS)), windows).collect()  # a slice at a time
                      for at in range(0, max(gaps.height, 1), SCAN_ROWS)])
    ends = gaps.lazy().select("i", t_end_ns="t_ns")
    keys = ["worker", "seq", "t_end_ns"]
    parts = max(1, near.height // LIFT_PART_ROWS)  # a key's rows share ``i``: each part holds them all
    hit = pl.concat([
        covered(culprit_pairs(run.with_keys(part).drop("i"), windows, share, tol_ms, min_inside_ms), keys,
                share).filter(pl.col("covered")).select(keys)
        for part in near.with_columns(part=pl.col("i") % parts).partition_by("part", include_key=False)
    ] or [pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64, "t_end_ns": pl.Int64})])
    by_i = run.ok_index.lazy()

    def rows(among: pl.DataFrame | None) -> int:  # the gap rows whose key is in ``among`` (all: None)
        if among is None:
            return gaps.height
        narrow_keys = among.lazy().join(by_i, on=["worker", "seq"]).select("i", "t_end_ns").unique()
        # the (unique) keys joined to the gap rows: a row per gap row with one of them (the keys are the hash
        # table's side, the gaps stream past it)
        return int(narrow_keys.join(ends, on=["i", "t_end_ns"], how="inner").select(pl.len())
                   .collect(engine="streaming").item())
    stall_keys = stalls.select(keys).unique()
    return _lift_of(rows(None), rows(stall_keys), rows(hit.unique()), rows(stall_keys.join(hit, on=keys, how="semi")))


def _lift_of(n_all: int, s_all: int, n_hit: int, s_hit: int) -> float | None:
    """P(stall | a long prefill covers the gap) / P(stall | none), from the gap and stall counts of each side
    (None: no covered gap stalled; infinite: every stall is covered)."""
    with_ = s_hit / n_hit if n_hit else None
    without = (s_all - s_hit) / (n_all - n_hit) if n_all - n_hit else None
    if not with_:
        return None
    return with_ / without if without else math.inf
