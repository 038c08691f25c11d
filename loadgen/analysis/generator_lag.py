"""The generator-lag rule's figure: each request's own lateness, the part of its queue delay that loadgen caused
(docs/verdicts.md). Pure numpy/polars over the records.

A request's queue delay (``t_sent − t_intended``) has two causes. While ``load.max_in_flight`` requests are in
flight the request cannot go out: it waits for a slot the server holds (a request the server has not finished)
— the server's lateness, which ``ttft_ms`` and ``e2e_ms`` already count from the intended send. The rest is the
client's own: its loop, its CPU, the hand-off. So per request, ``client_lag_ms`` is ``t_sent − max(t_intended,
F)``, F the last moment before ``t_sent`` when the in-flight count dropped below the cap (a slot came free),
and 0 when the cap was exactly full just before ``t_sent`` (the slot's end stamped after its release). The cap
never full: F is before every send, and the client lag is the queue delay. A process with more requests in flight
than its share of the cap (its worker index or the processes count not as the plan dealt them) breaks the model:
its requests' client lag is their whole queue delay, and summary.json's ``generator_lag`` names the process in
``cap_exceeded_processes`` (the reasons say so too). A request the run's end cut before it was sent
(``cancelled``, its send stamp its cancel stamp) has no send to be late: no client lag (null: left out of the
rule's p99), and no slot held.

The in-flight count is over every request (warm-up and cancelled ones too: each held a slot from its send to
its end; no end stamp: held to the records' end). The cap is per sending process: ``--workers N`` deals
``load.max_in_flight`` over the processes as ``plan/shares.py`` does (the first ``cap % N`` get one more), and
Locust's open loop runs ``max_in_flight`` users dealt over its workers the same way; records carry their
process in ``worker``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from loadgen.plan.shares import split_count

NS_PER_MS = 1e6


def process_caps(max_in_flight: int, processes: int) -> list[int]:
    """Each sending process's share of the cap, as plan/shares.py deals it."""
    n = max(1, processes)
    return [max(1, split_count(max_in_flight, k, n)) for k in range(n)]


def _events(t_sent: np.ndarray, t_done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The in-flight count's steps in time order (ends before sends at one instant): times and counts after."""
    times = np.concatenate([t_done, t_sent])
    steps = np.concatenate([-np.ones(len(t_done), dtype=np.int64), np.ones(len(t_sent), dtype=np.int64)])
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def _lag_of_process(t_int: np.ndarray, t_sent: np.ndarray, t_done: np.ndarray, cap: int) -> tuple[np.ndarray, bool]:
    """Client lag (ns, float) of one process's requests, in their order, and whether the cap model held (no
    send found more than ``cap`` requests in flight; else the lag is the whole queue delay)."""
    sends, dones = np.sort(t_sent), np.sort(t_done)
    times, count = _events(sends, dones)
    prior = np.concatenate([[0], count[:-1]])
    freed = times[(prior >= cap) & (count < cap)]  # each moment a slot came free
    flying = np.searchsorted(sends, t_sent, "left") - np.searchsorted(dones, t_sent, "right")
    k = np.searchsorted(freed, t_sent, "right") - 1
    last_free = freed[np.maximum(k, 0)] if len(freed) else np.zeros(len(t_sent), dtype=np.int64)
    last_free = np.where(k >= 0, last_free, np.iinfo(np.int64).min)
    start = np.maximum(t_int, last_free)
    if np.any(flying > cap):
        return (t_sent - t_int).astype(np.float64), False
    return np.where(flying >= cap, 0.0, (t_sent - start).astype(np.float64)), True


def _columns(rows: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t_intended, t_sent and t_done (ns) of requests with a send stamp; no end: held past the records' end."""
    end = max(int(rows["t_done_ns"].max() or 0), int(rows["t_sent_ns"].max() or 0)) + 1  # type: ignore[arg-type]
    return (rows["t_intended_ns"].to_numpy().astype(np.int64), rows["t_sent_ns"].to_numpy().astype(np.int64),
            rows["t_done_ns"].fill_null(end).to_numpy().astype(np.int64))


def _sent(requests: pl.DataFrame) -> pl.DataFrame:
    """The requests that went out: a send stamp, and not one the run's end cut while it waited (never sent: the
    engine stamps its send at its cancel, asyncio_engine._record)."""
    never = (pl.col("t_sent_ns") == pl.col("t_done_ns")) & (pl.col("error_kind") == "cancelled") \
        if "error_kind" in requests.columns else pl.lit(False)
    return requests.filter(pl.col("t_sent_ns").is_not_null() & ~never.fill_null(False))


def client_lag_ms(requests: pl.DataFrame, max_in_flight: int, processes: int = 1) -> pl.Series:
    """Per request of ``requests`` (every request of the run), in order: its client lag in ms (null: no send
    stamp, or cut by the run's end before it was sent)."""
    return _client_lags(requests, max_in_flight, processes)[0]


def _client_lags(requests: pl.DataFrame, max_in_flight: int, processes: int) -> tuple[pl.Series, list[int]]:
    """``client_lag_ms``, and the processes (worker index) whose in-flight count exceeded their share of the cap."""
    out = np.full(requests.height, np.nan)
    rows = _sent(requests.with_row_index("row")).filter(pl.col("t_intended_ns").is_not_null())
    caps, exceeded = process_caps(max_in_flight, processes), []
    for (worker,), part in sorted(rows.partition_by("worker", as_dict=True).items()):
        t_int, t_sent, t_done = _columns(part)
        cap = caps[int(worker)] if 0 <= int(worker) < len(caps) else caps[-1]
        lag_ns, held = _lag_of_process(t_int, t_sent, t_done, cap)
        out[part["row"].to_numpy()] = lag_ns / NS_PER_MS
        exceeded += [] if held else [int(worker)]
    return pl.Series("client_lag_ms", out, dtype=pl.Float64).fill_nan(None), exceeded


def cap_full_share(requests: pl.DataFrame, max_in_flight: int, processes: int, start_ns: int, end_ns: int) -> float:
    """The share of [start_ns, end_ns) during which a sending process had its whole cap in flight (the busiest
    process's share)."""
    if end_ns <= start_ns or requests.is_empty():
        return 0.0
    caps, best = process_caps(max_in_flight, processes), 0.0
    rows = _sent(requests)
    for (worker,), part in rows.partition_by("worker", as_dict=True).items():
        _, t_sent, t_done = _columns(part)
        cap = caps[int(worker)] if 0 <= int(worker) < len(caps) else caps[-1]
        times, count = _events(t_sent, t_done)
        a, b = np.clip(times, start_ns, end_ns), np.clip(np.append(times[1:], end_ns), start_ns, end_ns)
        full = float(np.sum(np.where(count >= cap, b - a, 0)))
        best = max(best, full / (end_ns - start_ns))
    return min(best, 1.0)


def lag_figures(req: pl.DataFrame, max_in_flight: int, processes: int, limit_ms: float) -> dict[str, Any]:
    """summary.json's ``generator_lag``: the rule's figure (p99 ``client_lag_ms`` over the measured requests)
    beside the queue delay it is taken from, the cap and the share of the measured window it was full."""
    lag, exceeded = _client_lags(req, max_in_flight, processes)
    measured = req.with_columns(client_lag_ms=lag).filter(~pl.col("warmup"))
    share = 0.0
    if measured.height:
        start = int(measured["t_intended_ns"].min())  # type: ignore[arg-type]
        ends = measured.select(pl.max_horizontal("t_done_ns", "t_sent_ns")).to_series()
        share = cap_full_share(req, max_in_flight, processes, start, int(ends.max()))  # type: ignore[arg-type]
    return {"client_lag_p99_ms": _p99(measured, "client_lag_ms"),
            "queue_delay_p99_ms": _p99(measured, "queue_delay_ms"), "limit_ms": limit_ms,
            "max_in_flight": max_in_flight, "processes": max(1, processes), "cap_full_share": share,
            "cap_exceeded_processes": exceeded}


def _p99(measured: pl.DataFrame, column: str) -> float | None:
    """The p99 of ``column`` over the measured requests (nulls left out), linear between ranks as
    metrics.describe's: the summary's ``queue_delay_ms.p99`` is the same figure."""
    if column not in measured.columns or measured[column].drop_nulls().is_empty():
        return None
    return float(measured[column].quantile(0.99, interpolation="linear"))  # type: ignore[arg-type]


def cap_note(figures: dict[str, Any]) -> str | None:
    """The reason line on the cap (None: nothing to say): a process that held more requests than its share of
    it (the cap model did not hold there), and when the cap, not loadgen, made the queue delay (its p99 over the
    limit while the client lag's is not)."""
    notes = [note for note in (_exceeded_note(figures), _full_note(figures)) if note]
    return "; ".join(notes) if notes else None


def _exceeded_note(figures: dict[str, Any]) -> str | None:
    """The processes whose in-flight count passed their share of the cap: their whole queue delay was counted."""
    exceeded = figures.get("cap_exceeded_processes") or []
    if not exceeded:
        return None
    which = ", ".join(str(k) for k in exceeded)
    return (f"sending process(es) {which} had more requests in flight than their share of load.max_in_flight "
            f"({figures['max_in_flight']} over {figures['processes']} process(es)): the per-process cap model did "
            "not hold, so their whole queue delay counts as loadgen's own lateness (client_lag_ms)")


def _full_note(figures: dict[str, Any]) -> str | None:
    """The reason line when the cap, not loadgen, made the queue delay (None otherwise)."""
    queue, own, limit = figures.get("queue_delay_p99_ms"), figures.get("client_lag_p99_ms"), figures["limit_ms"]
    if queue is None or queue <= limit or own is None or own > limit:
        return None
    split = f", dealt over {figures['processes']} processes" if figures.get("processes", 1) > 1 else ""
    return (f"load.max_in_flight ({figures['max_in_flight']}{split}) was full for "
            f"{100 * figures['cap_full_share']:.0f} % of the run: requests waited for a slot the server held "
            f"(p99 queue_delay_ms {queue:.1f}, of it loadgen's own lateness p99 {own:.1f} ms); that wait counts "
            "in ttft_ms and e2e_ms, measured from the intended send")
