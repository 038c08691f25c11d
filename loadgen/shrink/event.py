"""The event to shrink and the requests that could have caused it: what ``loadgen shrink`` reads of a run
directory (run.json, the records, stalls.parquet) and the seed set its search starts from.

- **The event** is a chunk gap of one stream (the *victim*), or its TTFT: ``--stall N`` is row N of
  stalls.parquet as written (0-based; default: the worst stall, the largest ``chunk_gap_ms``, and of the
  victims of that one engine step with the same gap the one sent last: ``worst_stall``); ``--request SEQ``
  that request's worst chunk gap (a stall's row when it is one, with its culprits), or its TTFT (send to first
  token) when the ledger (misses.parquet) says TTFT was the metric it missed by, or it streamed under two
  chunks.
- **The seed set**: the victim, the stall's culprits, and every request in flight at any time during
  ``[event start − horizon, event end]``; the horizon holds the culprits' prefills (their longest time from send
  to first token, at least ``MIN_HORIZON_S``). Each keeps its intended send time and its achieved lengths (what
  the server counted: ``prompt_tokens``, ``output_tokens``), so offsets between them are the run's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.errors import InputError
from loadgen.plan.scenario import Scenario
from loadgen.run.reporting import RunDirError, read_run_info, read_whole_records

MIN_HORIZON_S = 1.0
TIE_SHARE = 0.99  # victims of one spike event whose gaps are within 1 % of the worst: the same stall
NS_PER_MS = 1_000_000


class ShrinkError(InputError):
    """A run or event that cannot be shrunk (exit 2): not a run directory, no such stall or request."""


@dataclass(frozen=True, slots=True)
class Item:
    """One request of the run, as a reproduction sends it."""

    worker: int
    seq: int
    class_name: str
    t_intended_ns: int  # the run's clock: offsets between items are the run's own
    prompt_tokens: int  # achieved (the server's count), the chat template included
    output_tokens: int


@dataclass(frozen=True)
class Event:
    label: str  # "stall-3", "request-812": names the output directory
    victim: Item
    t_start_ns: int
    t_end_ns: int
    gap_ms: float
    culprits: tuple[int, ...]  # seq of the stall's culprits (empty: none attributed)
    cause: str | None  # the stall attribution's cause, where the gap is a stall
    metric: str = "chunk_gap_ms"  # or "ttft_ms": gap_ms is then the victim's TTFT (send to first token)


@dataclass
class RunRecords:
    run_dir: Path
    info: dict[str, Any]
    scenario: Scenario
    requests: pl.DataFrame
    chunks: pl.DataFrame
    stalls: pl.DataFrame | None


def read_run(run_dir: Path) -> RunRecords:
    if not run_dir.is_dir():
        raise ShrinkError(f"{run_dir}: not a directory (give a run directory: loadgen run's output)")
    try:
        info, scenario = read_run_info(run_dir)
        requests, chunks = read_whole_records(run_dir)
    except RunDirError as exc:
        raise ShrinkError(str(exc)) from None
    try:
        stalls: pl.DataFrame | None = pl.read_parquet(run_dir / "stalls.parquet")
    except (OSError, pl.exceptions.PolarsError):
        stalls = None
    return RunRecords(run_dir, info, scenario, requests, chunks, stalls)


def item_of(row: dict[str, Any]) -> Item:
    ok = row["error_kind"] is None
    prompt = row["prompt_tokens"] or row["prompt_tokens_asked"]
    output = row["output_tokens"] if ok and row["output_tokens"] else row["output_tokens_asked"]
    return Item(int(row["worker"]), int(row["seq"]), str(row["class_name"]), int(row["t_intended_ns"]),
                max(1, int(prompt)), max(1, int(output)))


def select_event(run: RunRecords, stall: int | None, request: int | None) -> Event:
    """The event ``--stall``/``--request`` names (neither: the worst stall); ShrinkError for a bad one."""
    if stall is not None and request is not None:
        raise ShrinkError("give --stall or --request, not both")
    if request is not None:
        return _request_event(run, request)
    stalls = run.stalls
    if stalls is None or stalls.is_empty():
        raise ShrinkError(f"{run.run_dir}: the run has no stalls (stalls.parquet is missing or empty): "
                          "nothing to shrink; give --request SEQ for one request's worst gap")
    if stall is None:
        stall = worst_stall(stalls, run.requests)
    if not 0 <= stall < stalls.height:
        raise ShrinkError(f"--stall {stall}: the run has {stalls.height} stalls (0 to {stalls.height - 1})")
    row = stalls.row(stall, named=True)
    victim = _request_row(run, int(row["worker"]), int(row["seq"]))
    return Event(f"stall-{stall}", item_of(victim), int(row["t_start_ns"]), int(row["t_end_ns"]),
                 float(row["chunk_gap_ms"]), tuple(int(c) for c in row.get("culprits") or []), row.get("cause"))


def worst_stall(stalls: pl.DataFrame, requests: pl.DataFrame) -> int:
    """The row of the largest gap; among the victims of its spike event (the same engine step) whose gap is
    within ``TIE_SHARE`` of it, the one sent last: the latest-sent victim is still decoding when the culprit
    comes with the least other load keeping it busy, so its reproduction needs the fewest requests."""
    rows = stalls.with_row_index("row")
    top = rows.row(int(rows["chunk_gap_ms"].arg_max() or 0), named=True)
    same = pl.col("event") == top["event"] if "event" in rows.columns else pl.col("t_end_ns") == top["t_end_ns"]
    ties = (rows.filter(same & (pl.col("chunk_gap_ms") >= TIE_SHARE * top["chunk_gap_ms"]))
            .join(requests.select("worker", "seq", "t_intended_ns"), on=["worker", "seq"], how="left"))
    return int(ties.sort("t_intended_ns", "row", nulls_last=False)["row"][-1])


def _request_row(run: RunRecords, worker: int, seq: int) -> dict[str, Any]:
    rows = run.requests.filter((pl.col("worker") == worker) & (pl.col("seq") == seq))
    if rows.is_empty():
        raise ShrinkError(f"{run.run_dir}: no request with seq {seq} in requests.parquet")
    return rows.row(0, named=True)


def _ttft_miss(run: RunRecords, worker: int, seq: int) -> dict[str, Any] | None:
    """misses.parquet's row of the request when its decisive metric is TTFT (the ledger's; none: None)."""
    try:
        misses = pl.read_parquet(run.run_dir / "misses.parquet")
        hit = misses.filter((pl.col("worker") == worker) & (pl.col("seq") == seq) & (pl.col("metric") == "ttft_ms"))
    except (OSError, pl.exceptions.PolarsError):
        return None
    return None if hit.is_empty() else hit.row(0, named=True)


def _ttft_event(seq: int, row: dict[str, Any], miss: dict[str, Any] | None) -> Event:
    """The TTFT from the send (not from the intended send, as the ledger measures): the send lag is loadgen's,
    which a reproduction does not replay, so a TTFT miss the ledger blames on the client is refused."""
    t_end = row["t_first_token_ns"] or row["t_done_ns"]
    if t_end is None or row["t_sent_ns"] is None:
        raise ShrinkError(f"--request {seq}: it was never sent or never ended, so it has no TTFT to shrink")
    if (miss or {}).get("cause") == "client_lag":  # measured from the send, the event would not be the miss
        raise ShrinkError(f"--request {seq}: its TTFT miss is loadgen's own lag (client_lag: "
                          f"{str((miss or {}).get('evidence') or 'sent or read late')[:160]}), not the target's: "
                          "nothing on the target to reproduce")
    culprits = tuple(int(c) for c in (miss or {}).get("culprits") or [])
    return Event(f"request-{seq}-ttft", item_of(row), int(row["t_sent_ns"]), int(t_end),
                 (t_end - row["t_sent_ns"]) / NS_PER_MS, culprits, (miss or {}).get("cause"), "ttft_ms")


def _request_event(run: RunRecords, seq: int) -> Event:
    """The request's worst chunk gap; its TTFT when the ledger's decisive metric for it is TTFT, or when it
    streamed under two chunks."""
    rows = run.requests.filter(pl.col("seq") == seq)
    if rows.is_empty():
        raise ShrinkError(f"--request {seq}: no request with that seq in requests.parquet")
    row = rows.row(0, named=True)
    victim = item_of(row)
    miss = _ttft_miss(run, victim.worker, seq)
    times = sorted(run.chunks.filter((pl.col("worker") == victim.worker) & (pl.col("seq") == seq))["t_ns"])
    if miss is not None or len(times) < 2:
        return _ttft_event(seq, row, miss)
    gap_ns, t_end = max((b - a, b) for a, b in zip(times, times[1:]))
    culprits: tuple[int, ...] = ()
    cause = None
    if run.stalls is not None and not run.stalls.is_empty():
        hit = run.stalls.filter((pl.col("worker") == victim.worker) & (pl.col("seq") == seq)
                                & (pl.col("t_end_ns") == t_end))
        if not hit.is_empty():
            culprits = tuple(int(c) for c in hit["culprits"][0] or [])
            cause = hit["cause"][0]
    return Event(f"request-{seq}", victim, t_end - gap_ns, t_end, gap_ns / NS_PER_MS, culprits, cause)


def seed_set(run: RunRecords, event: Event) -> list[Item]:
    """The victim, the culprits and every request in flight during [start − horizon, end], in send order."""
    req = run.requests
    culprit_rows = req.filter(pl.col("seq").is_in(list(event.culprits)))
    ttfts = (culprit_rows["t_first_token_ns"] - culprit_rows["t_sent_ns"]).drop_nulls()
    horizon_ns = max(int(MIN_HORIZON_S * 1e9), int(ttfts.max()) if len(ttfts) else 0)  # type: ignore[arg-type]
    t_done = pl.col("t_done_ns").fill_null(pl.col("t_sent_ns"))
    flying = req.filter((pl.col("t_sent_ns") <= event.t_end_ns) & (t_done >= event.t_start_ns - horizon_ns))
    rows = pl.concat([flying, culprit_rows]).unique(["worker", "seq"]).sort("t_intended_ns", "worker", "seq")
    items = [item_of(r) for r in rows.iter_rows(named=True)]
    if event.victim not in items:
        items.append(event.victim)
    return sorted(items, key=lambda i: (i.t_intended_ns, i.worker, i.seq))
