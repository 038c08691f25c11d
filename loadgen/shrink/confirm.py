"""Confirmation on the real target: the reduced set's scenario (``writers.write_scenario``) run by loadgen itself,
``n`` times, each a fresh run (the embedded simulator started as the run did, or the run's URL), and the victim's
worst chunk gap in each. A run that ends early (the target failed) counts as not reproduced, with its reason."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl
from rich.console import Console

from loadgen.errors import LoadgenError
from loadgen.plan.scenario_file import load_scenario
from loadgen.run.runner import RunOptions, run_scenario

NS_PER_MS = 1e6


@dataclass
class Confirmation:
    gaps_ms: list[float] = field(default_factory=list)  # the victim's worst gap (or TTFT) in each run
    reproduced: int = 0
    errors: list[str] = field(default_factory=list)
    streams: dict[int, list[int]] = field(default_factory=dict)  # the first run's chunk times per row (ns)

    @property
    def runs(self) -> int:
        return len(self.gaps_ms)

    @property
    def target_down(self) -> bool:
        """Every run failed (the target could not be used): no evidence either way."""
        return bool(self.runs) and len(self.errors) == self.runs

    @property
    def rate(self) -> float:
        return self.reproduced / self.runs if self.runs else 0.0


def chunk_times(run_dir: Path) -> dict[int, list[int]]:
    """Each request's content-chunk times in a run directory: seq → sorted ns from the first intended send."""
    t0 = pl.read_parquet(run_dir / "requests.parquet", columns=["t_intended_ns"])["t_intended_ns"].min()
    chunks = pl.read_parquet(run_dir / "chunks.parquet", columns=["seq", "t_ns"]).sort("seq", "t_ns")
    return {int(k[0]): [t - t0 for t in g["t_ns"]]
            for k, g in chunks.group_by("seq", maintain_order=True)}


def worst_gap_ms(times: list[int]) -> float:
    return max(((b - a) / NS_PER_MS for a, b in zip(times, times[1:])), default=0.0)


def ttfts_ms(run_dir: Path) -> dict[int, float]:
    """Each request's time from send to first token (to its end when it got none): seq → ms."""
    req = pl.read_parquet(run_dir / "requests.parquet", columns=["seq", "t_sent_ns", "t_first_token_ns", "t_done_ns"])
    return {int(seq): ((first or done or sent) - sent) / NS_PER_MS
            for seq, sent, first, done in req.iter_rows() if sent is not None}


Times = tuple[dict[int, list[int]], dict[int, float]]  # a run's chunk times and TTFTs per trace row


def run_once(scenario_path: Path, out: Path) -> Times:
    """One run of the scenario by loadgen (quiet, no PNG charts) into ``out``; its chunk times and TTFTs."""
    run_scenario(load_scenario(scenario_path), RunOptions(out=out, progress=False, png=False), Console(quiet=True))
    return chunk_times(out), ttfts_ms(out)


def confirm(scenario_path: Path, victim_row: int, n: int, threshold_ms: float, needed: int,
            deadline: float = float("inf"), progress: Callable[[str], None] = lambda line: None,
            run: Callable[[Path, Path], Times] = run_once, metric: str = "chunk_gap_ms",
            clock: Callable[[], float] = time.monotonic) -> Confirmation:
    """Up to ``n`` runs; stops early once ``needed`` reproductions can no longer be reached, or at ``deadline``
    (a ``clock`` reading: no run starts after it, but the first always runs, so a set confirmed past the deadline
    has one run, not none). ``metric``: the victim's worst chunk gap, or ``ttft_ms`` its TTFT."""
    out = Confirmation()
    for k in range(n):
        if out.reproduced + (n - k) < needed or (k and clock() >= deadline):
            break
        progress(f"confirmation {k + 1}/{n} on the target")
        with tempfile.TemporaryDirectory(prefix="loadgen-shrink-") as tmp:
            try:
                streams, ttfts = run(scenario_path, Path(tmp) / "run")
            except (LoadgenError, OSError) as exc:
                out.gaps_ms.append(0.0)
                out.errors.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
        gap = ttfts.get(victim_row, 0.0) if metric == "ttft_ms" else worst_gap_ms(streams.get(victim_row, []))
        out.gaps_ms.append(gap)
        out.reproduced += gap >= threshold_ms
        if not out.streams:
            out.streams = streams
    return out
