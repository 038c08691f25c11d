"""The SLO-miss ledger: every measured request that missed a limit, with one primary cause and the evidence
that decided it (issue 39; docs/causes.md has the causes and the decision order, ``analysis/ledger_rules.py``
applies it, ``analysis/ledger_evidence.py`` gathers what it weighs).

**Limits**, per metric: the smallest of the scenario's goodput limit on it and its tail-most objective's
limit (max > p999 > p99 > p95 > p90 > p50 > mean). For a percentile objective (TTFT p99 ≤ L) a request
*missed* it when its own value is above L: those are the requests that make the percentile fail. Judged:
ttft_ms, e2e_ms, tpot_ms, ttft_answer_ms (a request that reasoned and never answered missed it whatever
the limit, as its objective counts it: analysis/objective_samples.py), itl_ms and chunk_gap_ms (a request
missed when one of its gaps is over: per token for itl_ms) and errors (any ``error_kind`` but ``cancelled``
at the run's end) always. Session metrics and per-prompt-length TTFT limits are not judged here.

**The decisive metric** of a request that missed several: an error always, else the largest excess relative
to its limit (no answer token: an infinite excess). Its cause decides the request's (ledger_rules.py).

``Ledger.misses`` (misses.parquet) has one row per missed request (``MISS_SCHEMA``); ``Ledger.summary`` is
summary.json's ``misses``: how many missed of how many, the limits, per cause the requests, their share and the
goodput lost (requests that missed a goodput limit or failed) in all and per second of the measured window,
the unexplained share and the top causes. Pure: frames in, frames and dicts out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from loadgen.analysis import ledger_evidence as ev
from loadgen.analysis import ledger_rules as rules
from loadgen.analysis import metrics as m
from loadgen.analysis.objective_samples import CENSORED, censored_wait_ms
from loadgen.analysis.prefill import NS_PER_MS, PrefillFit
from loadgen.analysis.reasoning import never_answered
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.spikes import SpikeAnalysis, attribute

JUDGED = ("ttft_ms", "e2e_ms", "tpot_ms", "ttft_answer_ms", "itl_ms", "chunk_gap_ms")
REQUEST_JUDGED = ("ttft_ms", "e2e_ms", "tpot_ms", "ttft_answer_ms")
TAIL_FIRST = ("max", "p999", "p99", "p95", "p90", "p50", "mean")
COMPONENTS = ("send_lag_ms", "read_lag_ms", "network_ms", "wait_ms", "own_ms", "stall_ms")
MISS_SCHEMA = pl.Schema({
    "worker": pl.Int64, "seq": pl.Int64, "class_name": pl.String, "t_intended_ns": pl.Int64,
    "missed": pl.List(pl.String), "metric": pl.String, "value_ms": pl.Float64, "limit_ms": pl.Float64,
    "excess_ms": pl.Float64, "cause": pl.String, "evidence": pl.String, "culprits": pl.List(pl.Int64),
    **{c: pl.Float64 for c in COMPONENTS}, "good": pl.Boolean,
})
KEY = ["worker", "seq"]
TOP = 3


def limits_of(slo: Any) -> dict[str, float]:
    """Per judged metric: min(goodput limit, the tail-most objective's limit) where either is set."""
    out = {}
    for metric in JUDGED:
        th = getattr(slo, metric, None)
        tail = next((v for k in TAIL_FIRST if th is not None and (v := getattr(th, k)) is not None), None)
        good = getattr(slo.goodput, metric, None) if getattr(slo, "goodput", None) is not None else None
        given = [float(v) for v in (tail, good) if v is not None]
        if given:
            out[metric] = min(given)
    return out


@dataclass
class Ledger:
    misses: pl.DataFrame  # MISS_SCHEMA, one row per missed request (misses.parquet)
    summary: dict[str, Any]  # summary.json's "misses"
    limits: dict[str, float]
    window_s: float

    def of_class(self, name: str, of: int) -> dict[str, Any]:
        """``summary``'s shape for one class (``of``: its measured requests; per second of the run's window)."""
        return summary_of(self.misses.filter(pl.col("class_name") == name), of, self.limits, self.window_s)


def summary_of(misses: pl.DataFrame, of: int, limits: dict[str, float], window_s: float) -> dict[str, Any]:
    """summary.json's ``misses``: by_cause sorted by requests (most first), then name; only causes that
    occurred; ``top``: the first three of them."""
    n = misses.height
    rows = (misses.group_by("cause").agg(requests=pl.len(), goodput_lost=(~pl.col("good")).sum())
            .sort(["requests", "cause"], descending=[True, False]).iter_rows(named=True)) if n else []
    by_cause = {r["cause"]: {"requests": int(r["requests"]), "share": r["requests"] / n,
                             "goodput_lost": int(r["goodput_lost"]),
                             "goodput_lost_per_s": r["goodput_lost"] / window_s if window_s > 0 else 0.0}
                for r in rows}
    return {"requests": n, "of": of, "share": n / of if of else 0.0, "limits": dict(limits), "by_cause": by_cause,
            "unexplained_share": by_cause.get("unknown", {}).get("requests", 0) / n if n else 0.0,
            "top": list(by_cause)[:TOP]}


def miss_ledger(run: RunAnalysis, slo: Any, spike: SpikeAnalysis | None = None, server: pl.DataFrame | None = None,
                client: pl.DataFrame | None = None, max_in_flight: int | None = None) -> Ledger:
    """The ledger of ``run``'s measured requests against ``slo``'s limits. ``spike``: the run's stall analysis
    (its stalls, prefill windows and fit; none: no stall evidence), ``server``: server_metrics.parquet's rows
    (preemptions, KV usage), ``client``: client_metrics.parquet's (loadgen's loop lag; None: not measured),
    ``max_in_flight``: loadgen's in-flight cap (a send it held waited for the server, not for loadgen)."""
    limits = limits_of(slo)
    measured = run.measured
    window_s = m.window_s(measured)
    rows = _missed(run, measured, limits)
    if rows.is_empty():
        return Ledger(pl.DataFrame(schema=MISS_SCHEMA), summary_of(rows, measured.height, limits, window_s), limits,
                      window_s)
    fit = spike.fit if spike is not None and spike.fit is not None else PrefillFit(0.0, 0.0, 0.0, 0)
    rows = _with_evidence(rows, run, spike, server, client, max_in_flight)
    rows = rows.with_columns(own_prefill_ms=fit.ms(pl.col("prefilled").cast(pl.Float64)))
    decided = [_decide(r, limits) for r in rows.iter_rows(named=True)]
    g = slo.goodput
    good = m.is_good(rows, g.ttft_ms if g else None, g.tpot_ms if g else None, g.e2e_ms if g else None)
    misses = _frame(rows, decided, good)
    return Ledger(misses, summary_of(misses, measured.height, limits, window_s), limits, window_s)


def _missed(run: RunAnalysis, measured: pl.DataFrame, limits: dict[str, float]) -> pl.DataFrame:
    """The measured requests that missed something: their columns, ``missed`` (every metric, "error" for a
    failure) and their worst gap (ledger_evidence.worst_gaps)."""
    gaps = ev.worst_gaps(run, limits.get("itl_ms"), limits.get("chunk_gap_ms"))
    rows = measured.join(gaps, on=KEY, how="left", maintain_order="left")
    answer_judged = pl.lit("ttft_answer_ms" in limits)
    rows = rows.with_columns(no_answer=pl.lit(never_answered(rows)) & pl.col("ok") & answer_judged)
    flags = [pl.when(pl.col("error_kind").is_not_null() & (pl.col("error_kind") != "cancelled"))
             .then(pl.lit("error"))]
    flags += [pl.when(pl.col("ok") & (pl.col(k) > limits[k])).then(pl.lit(k))
              for k in REQUEST_JUDGED if k in limits and k in rows.columns]
    flags += [pl.when(pl.col("no_answer")).then(pl.lit("ttft_answer_ms"))]  # never answered: a miss at any limit
    waits = {k: censored_wait_ms(k, rows.columns) for k in CENSORED if k in limits}  # cancelled past a limit
    flags += [pl.when(w > limits[k]).then(pl.lit(k)) for k, w in waits.items()]
    rows = rows.with_columns(**{k: pl.coalesce(k, w) for k, w in waits.items() if k in rows.columns})
    flags += [pl.when(pl.col(flag).fill_null(False)).then(pl.lit(k))
              for k, flag in (("itl_ms", "itl_over"), ("chunk_gap_ms", "gap_over"))]
    return (rows.with_columns(missed=pl.concat_list(flags).list.drop_nulls())
            .filter(pl.col("missed").list.len() > 0))


def _with_evidence(rows: pl.DataFrame, run: RunAnalysis, spike: SpikeAnalysis | None, server: pl.DataFrame | None,
                   client: pl.DataFrame | None, cap: int | None) -> pl.DataFrame:
    """The missed rows with what the rules weigh: the send lag less the part the in-flight cap held (that
    part, ``held_ms``, a wait); loop blocked before the first token, the first answer, the end and in the worst
    gap; server pressure before the first token and in the gap; the transport; the
    class's baseline ITL; the gap's attribution and whether it was the stream's alone; the stalls; the median
    ITL."""
    blocks, pressure, cpu = ev.loop_blocks(client), ev.pressure_windows(server), ev.cpu_windows(client)
    base = dict(spike.summary.get("baseline_itl_ms") or {}) if spike is not None else {
        name: float(run.token_stats(name)["itl_ms"]["p50"] or 0.0) for name in run.classes}  # as spikes.py's
    end_first = pl.coalesce("t_first_token_ns", "t_done_ns")
    connect, headers = ev.network_parts(run.measured)  # (the medians: the run's)
    rows = rows.with_columns(connect_ms=connect.fill_null(0.0), headers_late_ms=headers.fill_null(0.0)).select(
        pl.all(), network_ms=pl.col("connect_ms") + pl.col("headers_late_ms"),
        send_lag_ms=pl.col("queue_delay_ms") - pl.col("connect_ms"),  # the connect's share is the network's
        baseline_ms=pl.col("class_name").replace_strict(base, default=None, return_dtype=pl.Float64),
        prefilled=(pl.col("prompt_tokens") - pl.col("cached_tokens").fill_null(0)).clip(lower_bound=0),
        client_measured=pl.lit(client is not None))
    held = ev.cap_held(rows, run.req, cap)
    rows = rows.with_columns(held_ms=pl.min_horizontal(held["held_ms"], pl.col("send_lag_ms").clip(lower_bound=0.0)),
                             held_in_flight=held["in_flight"])
    rows = rows.with_columns(send_lag_ms=pl.col("send_lag_ms") - pl.col("held_ms"))
    if "t_first_answer_ns" not in rows.columns:
        rows = rows.with_columns(t_first_answer_ns=pl.lit(None, dtype=pl.Int64))
    spans = {"first": end_first, "answer": pl.coalesce("t_first_answer_ns", end_first), "done": pl.col("t_done_ns")}
    for name, end in spans.items():
        iv = rows.select(KEY, a_ns=pl.col("t_sent_ns"), b_ns=end).cast(ev.INTERVAL)  # type: ignore[arg-type]
        rows = rows.with_columns(ev.blocked_ms(iv, blocks)["blocked_ms"].alias(f"read_{name}_ms"))
        if name == "first":
            rows = rows.with_columns(ev.pressure_during(iv, pressure)["pressure"].alias("pressure_first"))
    rows = rows.with_columns(read_first_ms=pl.min_horizontal("read_first_ms", _held_first(rows, run, base, blocks)))
    whole = rows.select(KEY, a_ns="t_intended_ns", b_ns=pl.coalesce("t_done_ns", "t_sent_ns", "t_intended_ns"))
    rows = rows.with_columns(cpu_busy=ev.busy_during(whole.cast(ev.INTERVAL), cpu))  # type: ignore[arg-type]
    left: dict[str, Any] = {"on": KEY, "how": "left", "maintain_order": "left"}  # rows keep their order
    rows = rows.join(_gap_evidence(rows, run, spike, base, blocks, pressure), **left)
    theirs = (spike.stalls.join(rows.select(KEY), on=KEY, how="semi", maintain_order="left") if spike is not None
              else pl.DataFrame())
    rows = rows.join(ev.stall_causes(theirs, blocks, run.req), **left)
    return rows.join(ev.median_itl(run, rows.filter(pl.col("missed").list.contains("tpot_ms"))), **left)


def _held_first(rows: pl.DataFrame, run: RunAnalysis, base: dict[str, float], blocks: pl.DataFrame) -> pl.Expr:
    """How long at most a block held each first token: a response the block held is read with more of it at
    once when it wakes, the first written (the burst + half a step) × the server's pace in the block before;
    one read alone came as it woke or after (half a step); a burst to the response's end, or a one-token
    response, cannot tell (no bound)."""
    burst = ev.burst_after(run, rows.select(KEY, at_ns="t_first_token_ns"), base)
    iv = rows.select(KEY, a_ns="t_sent_ns", b_ns=pl.coalesce("t_first_token_ns", "t_done_ns")).cast(ev.INTERVAL)
    floor_ms = min(base.values()) if base else 0.0
    tol_ns = int(ev.READ_TOL_MS * NS_PER_MS)
    holding = (blocks.join_where(iv.select("b_ns"), pl.col("b0_ns") < pl.col("b_ns"),  # type: ignore[arg-type]
                                 pl.col("b1_ns") >= pl.col("b_ns") - tol_ns)
               .select("b0_ns", "b1_ns").unique()) if not blocks.is_empty() else blocks  # only those paced
    pace = ev.held_pace(iv, ev.block_pace(holding, run, floor_ms))  # type: ignore[arg-type]
    to_end = (pl.col("t_last_token_ns") - pl.col("t_first_token_ns") <= ev.READ_TOL_MS * NS_PER_MS) | (
        pl.col("output_tokens") <= 1)
    at_most = (pl.when(to_end).then(float("inf")).when(pl.lit(burst) == 0).then(0.5 * pl.col("baseline_ms"))
               .otherwise((pl.lit(burst) + 0.5) * pl.lit(pace)))
    return at_most.fill_null(float("inf"))


def _gap_evidence(rows: pl.DataFrame, run: RunAnalysis, spike: SpikeAnalysis | None, base: dict[str, float],
                  blocks: pl.DataFrame, pressure: pl.DataFrame) -> pl.DataFrame:
    """Per missed request with a gap over its limit: the loop blocked in it, server pressure over it, the stall
    attribution's cause and culprits for its server part (analysis/spikes.py's ``attribute`` over the gap less
    the loop's block, without the preemption override), other requests' first tokens in it, and, where
    pressure or an unexplained gap makes it matter, how many other streams decoding across it paused too
    (``alone``: under half)."""
    gaps = rows.filter(pl.col("g1_ns").is_not_null()).select(KEY + ["g0_ns", "g1_ns", "gap_tokens", "class_name",
                                                                     "t_last_token_ns"])
    iv = gaps.select(KEY, a_ns="g0_ns", b_ns="g1_ns")
    held = (ev.burst_after(run, gaps.select(KEY, at_ns="g1_ns"), base) + pl.col("gap_tokens") >= 2) | (
        pl.col("g1_ns") == pl.col("t_last_token_ns"))  # the last chunk cannot tell
    at_most = pl.when(held).then(float("inf")).otherwise(
        0.5 * pl.col("class_name").replace_strict(base, default=None, return_dtype=pl.Float64))
    out = gaps.with_columns(gap_blocked_ms=ev.blocked_ms(iv, blocks)["blocked_ms"],
                            gap_pressure=ev.pressure_during(iv, pressure)["pressure"])
    out = out.with_columns(gap_held_ms=pl.min_horizontal("gap_blocked_ms", at_most.fill_null(float("inf"))))
    out = out.drop("gap_tokens", "class_name", "t_last_token_ns")
    if spike is None or spike.windows is None or spike.cfg is None or gaps.is_empty():
        out = out.with_columns(gap_cause=pl.lit(None, dtype=pl.String),
                               gap_culprits=pl.lit(None, dtype=pl.List(pl.Int64)),
                               gap_culprit_tokens=pl.lit(None, dtype=pl.List(pl.Int64)))
    else:
        # the server's part of the gap: without the time loadgen's loop was blocked (it delayed the culprits'
        # first tokens as much as the victim's reads, so their windows end with the gap still)
        server_part = out.select(KEY, t_start_ns=pl.col("g0_ns") + (pl.col("gap_held_ms") * NS_PER_MS)
                                 .cast(pl.Int64).clip(upper_bound=pl.col("g1_ns") - 1), t_end_ns="g1_ns")
        said = attribute(server_part, spike.windows, run.req, spike.cfg)
        out = out.join(said.select(KEY, gap_cause="cause", gap_culprits="culprits",
                                   gap_culprit_tokens="culprit_prompt_tokens"), on=KEY, how="left",
                       maintain_order="left")
        out = _stacked(out, server_part, run, spike)
    out = out.with_columns(gap_firsts=ev.firsts_in(iv, run.req))
    burst = pl.col("gap_cause").fill_null("unknown").eq("unknown") & (pl.col("gap_firsts") >= ev.BURST_FIRSTS)
    out = out.with_columns(gap_cause=pl.when(burst).then(pl.lit("prefill_burst")).otherwise(pl.col("gap_cause")))
    matters = pl.col("gap_pressure").is_not_null() | pl.col("gap_cause").fill_null("unknown").eq("unknown")
    lone = ev.alone(out.filter(matters).select(KEY + ["g0_ns", "g1_ns"]), run, base)
    return (out.join(lone.select(KEY, gap_alone="alone", gap_decoding="decoding", gap_paused="paused"), on=KEY,
                     how="left", maintain_order="left").drop("g0_ns", "g1_ns"))


def _stacked(out: pl.DataFrame, server_part: pl.DataFrame, run: RunAnalysis, spike: SpikeAnalysis) -> pl.DataFrame:
    """A gap the attribution leaves unexplained whose server part long prompts prefilled together (their first
    tokens in it, their fitted prefills back to back covering ``overlap_share`` of it) is theirs: prefill."""
    if spike.fit is None or spike.cfg is None:
        return out
    long_tokens = int(spike.summary.get("long_prompt_tokens") or spike.cfg.long_prompt_tokens or 1)
    stack = ev.stacked_culprits(server_part, run.req, spike.fit, long_tokens, spike.cfg.overlap_share,
                                spike.cfg.tol_ms).select(*KEY, "s_culprits", "s_tokens", "stacked")
    take = pl.col("stacked") & pl.col("gap_cause").fill_null("unknown").eq("unknown")
    return (out.join(stack, on=KEY, how="left", maintain_order="left")
            .with_columns(gap_cause=pl.when(take).then(pl.lit("prefill")).otherwise(pl.col("gap_cause")),
                          gap_culprits=pl.when(take).then(pl.col("s_culprits")).otherwise(pl.col("gap_culprits")),
                          gap_culprit_tokens=pl.when(take).then(pl.col("s_tokens"))
                          .otherwise(pl.col("gap_culprit_tokens")))
            .drop("s_culprits", "s_tokens", "stacked"))


def _decisive(row: dict[str, Any], limits: dict[str, float]) -> tuple[str, float | None, float | None]:
    """The decisive metric of a missed row, its value and limit (an error always decides)."""
    if "error" in row["missed"]:
        return "error", None, None
    if row["no_answer"]:  # no answer token: over any limit (an infinite excess), no value
        return "ttft_answer_ms", None, limits["ttft_answer_ms"]
    best: tuple[float, str, float, float] | None = None
    for metric in row["missed"]:
        value, limit = ((row["gap_value_ms"], row["gap_limit_ms"]) if metric == row["gap_metric"]
                        else (row.get(metric), limits.get(metric)))
        if metric in ("itl_ms", "chunk_gap_ms") and metric != row["gap_metric"]:
            continue  # the worst gap stands for both gap metrics
        if value is None or not limit:
            continue
        if best is None or (value - limit) / limit > best[0]:
            best = ((value - limit) / limit, metric, value, limit)
    assert best is not None, row["missed"]
    return best[1], best[2], best[3]


def _decide(row: dict[str, Any], limits: dict[str, float]) -> tuple[str, float | None, float | None,
                                                                    rules.Verdict]:
    metric, value, limit = _decisive(row, limits)
    own = row["own_prefill_ms"] or 0.0
    if metric == "error":
        verdict = rules.error(row)
    elif metric == "ttft_answer_ms" and value is None:
        verdict = rules.no_answer(row, limit)  # type: ignore[arg-type]
    elif metric == "ttft_ms":
        verdict = rules.ttft(row, value, limit, own)  # type: ignore[arg-type]
    elif metric in ("itl_ms", "chunk_gap_ms"):
        verdict = rules.gap({**row, "metric": metric, "limit_ms": limit})
    elif metric == "tpot_ms":
        verdict = rules.tpot(row, value, limit)  # type: ignore[arg-type]
    elif metric == "e2e_ms":
        verdict = rules.e2e(row, value, limit, own, "done", row["output_tokens"] or 0)  # type: ignore[arg-type]
    else:  # ttft_answer_ms: its reasoning tokens are decoded before it
        verdict = rules.e2e(row, value, limit, own, "answer",  # type: ignore[arg-type]
                            (row.get("reasoning_tokens") or 0) + 1)
    return metric, value, limit, rules.with_cpu(verdict, row)


def _frame(rows: pl.DataFrame, decided: list[tuple[str, float | None, float | None, rules.Verdict]],
           good: pl.Series) -> pl.DataFrame:
    out = {"worker": rows["worker"], "seq": rows["seq"], "class_name": rows["class_name"],
           "t_intended_ns": rows["t_intended_ns"], "missed": rows["missed"],
           "metric": [d[0] for d in decided], "value_ms": [d[1] for d in decided], "limit_ms": [d[2] for d in decided],
           "excess_ms": [d[1] - d[2] if d[1] is not None and d[2] is not None else None for d in decided],
           "cause": [d[3].cause for d in decided], "evidence": [d[3].evidence for d in decided],
           "culprits": [d[3].culprits for d in decided],
           **{c: [d[3].parts.get(c) for d in decided] for c in COMPONENTS}, "good": good}
    return pl.DataFrame(out, schema=MISS_SCHEMA).sort("t_intended_ns", "worker", "seq")
