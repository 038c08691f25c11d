"""The evidence the SLO-miss ledger (analysis/ledger.py) weighs, per missed request, as frames: when loadgen's
own event loop was blocked (client_metrics.parquet's ``loop_lag_ms``), when the server was under pressure
(server_metrics.parquet: its preemption counter rose, its KV cache was full), how busy loadgen's process
was (``cpu_busy_share``), how late the response headers came beyond the run's usual, each request's worst chunk
gap over the limits, whether a gap was the request's alone, and the stalls' excess per cause. Pure polars, no I/O.
"""

from __future__ import annotations

import bisect

import polars as pl

from loadgen.analysis import server_frames
from loadgen.analysis.prefill import NS_PER_MS, PrefillFit
from loadgen.analysis.run_analysis import CHUNK_GAP_MS, ITL_MS, RunAnalysis

KV_FULL = 0.95  # a KV cache at least this full is pressure (plan §1.3)
HEADERS_FIRST = 0.25  # headers count as transport only where they usually come this early in the TTFT
BUSY_LAG_MS = 5.0  # a timer this late says the loop was busy (jitter below it is no block)
SAMPLER_PERIOD_MS = 50.0  # the loop-lag timer's period (drivers/loop_sampler.py PERIOD_NS; a test holds them equal)
SAMPLER_GRAIN_MS = 2.0  # its timer's grain (uvloop rounds to 1 ms; loop_sampler.py KEEP_LAG_MS)
CPU_PERIOD_MS = 1000.0  # the CPU busy share's period (loop_sampler.py HEARTBEAT_NS)
READ_TOL_MS = 25.0  # a block ending this close before a read delayed it (the loop ran the read right after)
ALONE_FACTOR = 2.0  # another stream's gap this many baselines long shares the pause
BURST_FIRSTS = 3  # other requests' first tokens inside a gap that make it a burst (spikes.py's 3)
KEY = ["worker", "seq"]
INTERVAL = {"worker": pl.Int64, "seq": pl.Int64, "a_ns": pl.Int64, "b_ns": pl.Int64}


def loop_blocks(client: pl.DataFrame | None) -> pl.DataFrame:
    """The intervals loadgen's event loop was blocked (b0_ns, b1_ns): a timer that fired ``lag`` late at
    ``t_ns`` says the loop was busy over [t_ns − lag, t_ns]. Two late firings (``BUSY_LAG_MS`` or more) merge
    only where they are one backlog: consecutive stored samples, the later due one ``SAMPLER_PERIOD_MS`` after
    the earlier fired, so at most (period + its lag + the timer's grain) after it. The sampler stores small
    lags once a second only (drivers/loop_sampler.py), so the gap between stored samples says nothing of the
    period: it is the sampler's, not inferred."""
    empty = pl.DataFrame(schema={"b0_ns": pl.Int64, "b1_ns": pl.Int64})
    if client is None or client.is_empty():
        return empty
    samples = client.filter(pl.col("name") == "loop_lag_ms").sort("t_ns")
    lag_ns = (pl.col("value") * NS_PER_MS).cast(pl.Int64)
    busy = pl.col("value") >= BUSY_LAG_MS
    reach_ns = int((SAMPLER_PERIOD_MS + SAMPLER_GRAIN_MS) * NS_PER_MS) + lag_ns
    chained = busy & busy.shift(1) & (pl.col("t_ns") - pl.col("t_ns").shift(1) <= reach_ns)
    raw = (samples.with_columns(chained=chained.fill_null(False)).filter(busy)
           .with_columns(run=(~pl.col("chained")).cum_sum())
           .group_by("run").agg(b0_ns=(pl.col("t_ns") - lag_ns).min(), b1_ns=pl.col("t_ns").max().cast(pl.Int64))
           .drop("run").sort("b0_ns"))
    return _merged(raw, "b0_ns", "b1_ns") if raw.height else empty


def _merged(frame: pl.DataFrame, a: str, b: str, slack_ns: int = 0) -> pl.DataFrame:
    """Intervals (sorted by ``a``) that overlap or lie within ``slack_ns`` of each other merged."""
    run = (pl.col(a) > pl.col(b).cum_max().shift(1) + slack_ns).fill_null(True).cum_sum()
    return (frame.with_columns(run=run).group_by("run").agg(pl.col(a).min(), pl.col(b).max())
            .drop("run").sort(a))


def blocked_ms(intervals: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Per (worker, seq, a_ns, b_ns): the ms of [a_ns, b_ns] during which the loop was blocked, counting only the
    blocks that ended as the interval did (within ``READ_TOL_MS``): a response read at ``b_ns`` was read late
    by a block it waited out; one that ended well before was over before the server had written it."""
    if intervals.is_empty() or blocks.is_empty():
        return intervals.with_columns(blocked_ms=pl.lit(0.0))
    tol_ns = int(READ_TOL_MS * NS_PER_MS)
    hit = (intervals.join_where(blocks, pl.col("b0_ns") < pl.col("b_ns"), pl.col("b1_ns") > pl.col("a_ns"),
                                pl.col("b1_ns") >= pl.col("b_ns") - tol_ns)
           .sort(KEY + ["a_ns", "b_ns", "b0_ns"]).group_by(KEY + ["a_ns", "b_ns"])  # summed in order
           .agg(blocked_ms=((pl.min_horizontal("b_ns", "b1_ns") - pl.max_horizontal("a_ns", "b0_ns")) / 1e6).sum()))
    return (intervals.join(hit, on=KEY + ["a_ns", "b_ns"], how="left", maintain_order="left")
            .with_columns(pl.col("blocked_ms").fill_null(0.0)))


def cpu_windows(client: pl.DataFrame | None) -> pl.DataFrame:
    """loadgen's CPU busy share (c0_ns, c1_ns, share): each ``cpu_busy_share`` sample covers the wall time since
    the previous one (the first: ``CPU_PERIOD_MS`` before it), drivers/loop_sampler.py's ``_cpu_sample``."""
    schema = {"c0_ns": pl.Int64, "c1_ns": pl.Int64, "share": pl.Float64}
    if client is None or client.is_empty():
        return pl.DataFrame(schema=schema)
    cpu = client.filter(pl.col("name") == "cpu_busy_share").sort("t_ns")
    first_ns = pl.col("t_ns") - int(CPU_PERIOD_MS * NS_PER_MS)
    return cpu.select(c0_ns=pl.col("t_ns").shift(1).fill_null(first_ns).cast(pl.Int64),
                      c1_ns=pl.col("t_ns").cast(pl.Int64), share=pl.col("value").cast(pl.Float64))


def busy_during(intervals: pl.DataFrame, windows: pl.DataFrame) -> pl.Series:
    """Per (worker, seq, a_ns, b_ns): the largest CPU busy share of the windows (``cpu_windows``) overlapping it
    (null: none measured)."""
    if intervals.is_empty() or windows.is_empty():
        return pl.Series("cpu_busy", [None] * intervals.height, dtype=pl.Float64)
    keys = KEY + ["a_ns", "b_ns"]
    hit = (intervals.join_where(windows, pl.col("c0_ns") < pl.col("b_ns"), pl.col("c1_ns") > pl.col("a_ns"))
           .group_by(keys).agg(cpu_busy=pl.col("share").max()))
    return intervals.join(hit, on=keys, how="left", maintain_order="left")["cpu_busy"]


def pressure_windows(server: pl.DataFrame | None) -> pl.DataFrame:
    """The scrape intervals (p0_ns, p1_ns, what) with server pressure: the preemption counter rose in it, or
    the KV cache was at least ``KV_FULL`` full at either of its scrapes."""
    schema = {"p0_ns": pl.Int64, "p1_ns": pl.Int64, "what": pl.String}
    rows = [(a, b, "its preemption counter rose") for a, b in server_frames.preemption_windows(server)]
    if server is not None and not server.is_empty():
        kv = server.filter(pl.col("name") == "kv_cache_usage").sort("t_ns")
        kv = kv.with_columns(prev_t=pl.col("t_ns").shift(1), prev_v=pl.col("value").shift(1)).drop_nulls("prev_t")
        for a, b, v, pv in kv.select("prev_t", "t_ns", "value", "prev_v").iter_rows():
            if max(v, pv) >= KV_FULL:
                rows.append((a, b, f"its KV cache was {max(v, pv):.0%} full"))
    return pl.DataFrame(rows, schema=schema, orient="row")


def pressure_during(intervals: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per (worker, seq, a_ns, b_ns): what server pressure overlapped it (null: none): a preemption first, else
    the fullest KV cache."""
    if intervals.is_empty() or windows.is_empty():
        return intervals.with_columns(pressure=pl.lit(None, dtype=pl.String))
    hit = (intervals.join_where(windows, pl.col("p0_ns") < pl.col("b_ns"), pl.col("p1_ns") > pl.col("a_ns"))
           .group_by(KEY + ["a_ns", "b_ns"])
           .agg(pressure=pl.col("what").sort_by(~pl.col("what").str.contains("preemption"), pl.col("what"),
                                                descending=[False, True]).first()))
    return intervals.join(hit, on=KEY + ["a_ns", "b_ns"], how="left", maintain_order="left")


def network_parts(measured: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
    """Per request, the transport's parts: ``connect`` — the connect (and TLS) time that made its send late (the
    connection is opened before ``t_sent``: at most the send lag); ``headers`` — how much later than the run's
    median its response headers came, counted only where the server sends its headers before the first token
    (their median under ``HEADERS_FIRST`` of the median ttft_service_ms). 0 for records without these columns."""
    connect = (pl.min_horizontal(pl.col("connect_ns").fill_null(0) / 1e6, pl.col("queue_delay_ms"))
               .clip(lower_bound=0.0) if "connect_ns" in measured.columns else pl.lit(0.0))
    if "t_headers_ns" not in measured.columns or measured["t_headers_ns"].null_count() == measured.height:
        return connect, pl.lit(0.0)
    ok = measured.filter(pl.col("ok"))
    headers = (pl.col("t_headers_ns") - pl.col("t_sent_ns")) / 1e6
    med_h, med_s = ok.select(headers.median(), pl.col("ttft_service_ms").median()).row(0)
    if med_h is None or med_s is None or med_h >= HEADERS_FIRST * med_s:
        return connect, pl.lit(0.0)
    return connect, (headers - med_h).clip(lower_bound=0.0).fill_null(0.0)


def worst_gaps(run: RunAnalysis, itl_limit: float | None, gap_limit: float | None) -> pl.DataFrame:
    """Per measured request with a chunk gap over a limit (per token for itl_ms): whether it missed itl_ms and
    chunk_gap_ms, and its worst gap (largest excess over the limit, relative): its metric, value, limit, the
    gap's start and end, ms and tokens."""
    ratios = []
    if itl_limit is not None:
        ratios.append((ITL_MS - itl_limit) / itl_limit)
    if gap_limit is not None:
        ratios.append((CHUNK_GAP_MS - gap_limit) / gap_limit)
    if not ratios or run.gaps.is_empty():
        return pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64, "itl_over": pl.Boolean,
                                    "gap_over": pl.Boolean, "gap_metric": pl.String, "gap_value_ms": pl.Float64,
                                    "gap_limit_ms": pl.Float64, "g0_ns": pl.Int64, "g1_ns": pl.Int64,
                                    "gap_ms": pl.Float64, "gap_tokens": pl.Int64})
    itl_r = ratios[0] if itl_limit is not None else pl.lit(-1.0)
    gap_r = ratios[-1] if gap_limit is not None else pl.lit(-1.0)
    over = (run.gaps.lazy().with_columns(itl_r=itl_r, gap_r=gap_r).filter((pl.col("itl_r") > 0) | (pl.col("gap_r") > 0))
            .collect())
    is_itl = pl.col("itl_r") >= pl.col("gap_r")
    worst = (over.with_columns(r=pl.max_horizontal("itl_r", "gap_r")).sort("r", descending=True)
             .group_by("i", maintain_order=True)
             .agg(itl_over=(pl.col("itl_r") > 0).any(), gap_over=(pl.col("gap_r") > 0).any(),
                  gap_metric=pl.when(is_itl).then(pl.lit("itl_ms")).otherwise(pl.lit("chunk_gap_ms")).first(),
                  gap_value_ms=pl.when(is_itl).then(ITL_MS).otherwise(CHUNK_GAP_MS).first(),
                  gap_limit_ms=pl.when(is_itl).then(pl.lit(itl_limit)).otherwise(pl.lit(gap_limit)).first()
                  .cast(pl.Float64),
                  g0_ns=(pl.col("t_ns") - pl.col("gap_ns").cast(pl.Int64)).first(), g1_ns=pl.col("t_ns").first(),
                  gap_ms=CHUNK_GAP_MS.first(), gap_tokens=pl.col("tokens").cast(pl.Int64).first()))
    return run.with_keys(worst).drop("i")


def alone(gaps: pl.DataFrame, run: RunAnalysis, baseline: dict[str, float]) -> pl.DataFrame:
    """Per gap (worker, seq, g0_ns, g1_ns): the other streams ``decoding`` across it, how many of those
    ``paused`` (a gap longer than ``ALONE_FACTOR`` baselines overlapping it), and ``alone``: under half of them
    did, or none was decoding (a pause of one stream, not of the batch)."""
    if gaps.is_empty():
        return gaps.with_columns(decoding=pl.lit(0, pl.Int64), paused=pl.lit(0, pl.Int64), alone=pl.lit(True))
    ok = run.req.filter(pl.col("ok") & pl.col("t_first_token_ns").is_not_null()).select(
        pl.col("worker").alias("o_worker"), pl.col("seq").alias("o_seq"), "t_first_token_ns", "t_last_token_ns")
    g = gaps.select(KEY + ["g0_ns", "g1_ns"])
    other = ~((pl.col("o_worker") == pl.col("worker")) & (pl.col("o_seq") == pl.col("seq")))
    across = g.join_where(ok, pl.col("t_first_token_ns") < pl.col("g0_ns"),
                          pl.col("t_last_token_ns") > pl.col("g1_ns")).filter(other)
    decoding = across.group_by(KEY + ["g0_ns", "g1_ns"]).agg(decoding=pl.len())
    slow = run.wide(run.stall_candidates(baseline, ALONE_FACTOR, 0.0)).select(
        pl.col("worker").alias("o_worker"), pl.col("seq").alias("o_seq"),
        s0_ns=pl.col("t_ns") - (pl.col("chunk_gap_ms") * NS_PER_MS).cast(pl.Int64), s1_ns=pl.col("t_ns")).collect()
    keys = KEY + ["g0_ns", "g1_ns"]
    paused = (g.join_where(slow, pl.col("s0_ns") < pl.col("g1_ns"), pl.col("s1_ns") > pl.col("g0_ns"))
              .join(across.select(keys + ["o_worker", "o_seq"]), on=keys + ["o_worker", "o_seq"], how="semi",
                    maintain_order="left")
              .group_by(keys).agg(paused=pl.struct("o_worker", "o_seq").n_unique()))
    return (gaps.join(decoding, on=keys, how="left", maintain_order="left")
            .join(paused, on=keys, how="left", maintain_order="left")
            .with_columns(pl.col("decoding", "paused").fill_null(0).cast(pl.Int64))
            .with_columns(alone=(pl.col("paused") < 0.5 * pl.col("decoding")) | (pl.col("decoding") == 0)))


def firsts_in(intervals: pl.DataFrame, requests: pl.DataFrame) -> pl.Series:
    """Per (worker, seq, a_ns, b_ns): how many other requests got their first token in (a_ns, b_ns] — a batch of
    prefills the engine ran while this stream waited (spikes.py counts those ending with the gap only; under
    prefill-only batches, TGI and SGLang, they end one decode step before it)."""
    firsts = requests.filter(pl.col("t_first_token_ns").is_not_null()).select(
        pl.col("worker").alias("f_worker"), pl.col("seq").alias("f_seq"), "t_first_token_ns")
    if intervals.is_empty() or firsts.is_empty():
        return pl.Series("firsts", [0] * intervals.height, dtype=pl.Int64)
    other = ~((pl.col("f_worker") == pl.col("worker")) & (pl.col("f_seq") == pl.col("seq")))
    keys = KEY + ["a_ns", "b_ns"]
    hit = (intervals.join_where(firsts, pl.col("t_first_token_ns") > pl.col("a_ns"),
                                pl.col("t_first_token_ns") <= pl.col("b_ns"))
           .filter(other).group_by(keys).agg(firsts=pl.len().cast(pl.Int64)))
    return intervals.join(hit, on=keys, how="left", maintain_order="left")["firsts"].fill_null(0)


def stacked_culprits(gaps: pl.DataFrame, requests: pl.DataFrame, fit: PrefillFit, long_tokens: int, share: float,
                     tol_ms: float) -> pl.DataFrame:
    """Per gap (worker, seq, t_start_ns, t_end_ns): the long prompts of other requests whose first token came in
    it (to one engine step after its end), longest prefill first (``s_culprits``, ``s_tokens``), and ``stacked``:
    their fitted prefills, run back to back, cover ``share`` of it — several long prompts prefilled in one engine
    step, the step costing their sum, where each one's own window covers too little of the gap."""
    tol_ns = int(tol_ms * NS_PER_MS)
    computed = pl.col("prompt_tokens") - pl.col("cached_tokens").fill_null(0)
    longs = (requests.filter(pl.col("t_first_token_ns").is_not_null() & (computed >= long_tokens))
             .select(pl.col("worker").alias("c_worker"), pl.col("seq").alias("c_seq"),
                     pl.col("t_first_token_ns").alias("c_first_ns"), c_tokens=computed,
                     c_ms=fit.ms(computed.cast(pl.Float64))))
    keys = KEY + ["t_start_ns", "t_end_ns"]
    other = ~((pl.col("c_worker") == pl.col("worker")) & (pl.col("c_seq") == pl.col("seq")))
    hit = (gaps.join_where(longs, pl.col("c_first_ns") > pl.col("t_start_ns"),
                           pl.col("c_first_ns") <= pl.col("t_end_ns") + tol_ns).filter(other)
           .sort("c_ms", "c_seq", descending=[True, False])  # equal prompts: by seq, not by the join's order
           .group_by(keys, maintain_order=True).agg(s_culprits=pl.col("c_seq"), s_tokens=pl.col("c_tokens"),
                                                    s_ms=pl.col("c_ms").sum()))
    return (gaps.join(hit, on=keys, how="left", maintain_order="left")
            .with_columns(stacked=(pl.col("s_ms") >= share * (pl.col("t_end_ns") - pl.col("t_start_ns")) / 1e6)
                          .fill_null(False)))


def stall_causes(stalls: pl.DataFrame, blocks: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """Per request (worker, seq): its stalls as a struct list (cause, excess_ms, t_end_ns, culprits), a stall
    during which loadgen's loop was blocked for its whole excess the client's (``client_lag``), an unexplained
    one in which ``BURST_FIRSTS`` other requests got their first token a ``prefill_burst``."""
    schema = {"worker": pl.Int64, "seq": pl.Int64,
              "stalls": pl.List(pl.Struct({"cause": pl.String, "excess_ms": pl.Float64, "t_end_ns": pl.Int64,
                                           "culprits": pl.List(pl.Int64)}))}
    if stalls.is_empty():
        return pl.DataFrame(schema=schema)
    iv = stalls.select(KEY, a_ns="t_start_ns", b_ns="t_end_ns").unique(maintain_order=True)
    blocked = blocked_ms(iv, blocks).with_columns(firsts=firsts_in(iv, requests)).rename(
        {"a_ns": "t_start_ns", "b_ns": "t_end_ns"})
    late = pl.col("blocked_ms") >= pl.col("excess_ms")
    burst = (pl.col("cause") == "unknown") & (pl.col("firsts") >= BURST_FIRSTS)
    culprits = pl.when(late).then(pl.lit([], dtype=pl.List(pl.Int64))).otherwise(
        pl.col("culprits").fill_null(pl.lit([], dtype=pl.List(pl.Int64))))
    return (stalls.join(blocked, on=KEY + ["t_start_ns", "t_end_ns"], how="left", maintain_order="left")
            .with_columns(cause=pl.when(late).then(pl.lit("client_lag")).when(burst).then(pl.lit("prefill_burst"))
                          .otherwise(pl.col("cause")),
                          culprits=culprits)
            .group_by(KEY).agg(stalls=pl.struct("cause", "excess_ms", "t_end_ns", "culprits")))


def block_pace(blocks: pl.DataFrame, run: RunAnalysis, floor_ms: float) -> pl.DataFrame:
    """Per block (b0_ns, b1_ns): ``pace_ms``, the server's time per token while loadgen's loop was blocked — the
    block's length over the median of the tokens each stream decoding across it read as it ended (what the
    server wrote meanwhile); at least ``floor_ms`` (the usual pace). A server in loadgen's own process (the
    embedded simulator) is slowed by a CPU-bound block too."""
    if blocks.is_empty() or run.gaps.is_empty():
        return blocks.with_columns(pace_ms=pl.lit(floor_ms))
    tol_ns = int(READ_TOL_MS * NS_PER_MS)
    first = pl.lit(run.req["t_first_token_ns"]).gather(pl.col("i"))
    last = pl.lit(run.req["t_last_token_ns"]).gather(pl.col("i"))
    woke = (run.gaps.lazy().join_where(blocks.lazy(), pl.col("t_ns") >= pl.col("b1_ns") - tol_ns,
                                       pl.col("t_ns") <= pl.col("b1_ns") + tol_ns)
            .filter((first < pl.col("b0_ns")) & (last > pl.col("b1_ns") + tol_ns))
            .group_by("b0_ns", "b1_ns", "i").agg(pl.col("tokens").cast(pl.Int64).sum())
            .group_by("b0_ns", "b1_ns").agg(wrote=pl.col("tokens").median()).collect())
    pace = ((pl.col("b1_ns") - pl.col("b0_ns")) / 1e6 / pl.col("wrote")).clip(lower_bound=floor_ms)
    return (blocks.join(woke, on=["b0_ns", "b1_ns"], how="left", maintain_order="left")
            .with_columns(pace_ms=pace.fill_null(floor_ms)).drop("wrote"))


def held_pace(intervals: pl.DataFrame, paced: pl.DataFrame) -> pl.Series:
    """Per (worker, seq, a_ns, b_ns): the pace (``block_pace``) of the block that held a read at ``b_ns`` (the
    last one ending within ``READ_TOL_MS`` of it); null where none did."""
    tol_ns = int(READ_TOL_MS * NS_PER_MS)
    keys = KEY + ["a_ns", "b_ns"]
    if intervals.is_empty() or paced.is_empty():
        return pl.Series("pace_ms", [None] * intervals.height, dtype=pl.Float64)
    hit = (intervals.join_where(paced, pl.col("b0_ns") < pl.col("b_ns"), pl.col("b1_ns") >= pl.col("b_ns") - tol_ns)
           .sort("b1_ns").group_by(keys).agg(pl.col("pace_ms").last()))
    return intervals.join(hit, on=keys, how="left", maintain_order="left")["pace_ms"]


def burst_after(run: RunAnalysis, at: pl.DataFrame, baseline: dict[str, float]) -> pl.Series:
    """Per row of ``at`` (worker, seq, at_ns: a chunk's read): the tokens of the chunks read right after it, each
    under half its class's baseline ITL after the previous one. A response the loop's block held is read at
    once when it wakes, several tokens together; a chunk read alone was written as the block ended or after."""
    rows = at.join(run.ok_index, on=KEY, how="left", maintain_order="left")
    if rows.is_empty():
        return pl.Series("burst", [], dtype=pl.Int64)
    half_ns = pl.lit(run.meta["class_name"]).gather(pl.col("i")).replace_strict(
        baseline, default=0.0, return_dtype=pl.Float64) * NS_PER_MS / 2
    later = (pl.col("t_ns") > pl.col("at_ns")) | ((pl.col("t_ns") == pl.col("at_ns")) & (pl.col("gap_ns") < half_ns))
    after = (run.gaps.join(rows.select("i").drop_nulls().unique(), on="i", how="semi", maintain_order="left")
             .join(rows.select("i", "at_ns").drop_nulls(), on="i", maintain_order="left")
             .filter(later)  # (chunks read in the same instant after it too)
             .with_columns(slow=(pl.col("gap_ns") >= half_ns).cum_sum().over("i", "at_ns"))
             .filter(pl.col("slow") == 0).group_by("i", "at_ns").agg(burst=pl.col("tokens").cast(pl.Int64).sum()))
    return rows.join(after, on=["i", "at_ns"], how="left", maintain_order="left")["burst"].fill_null(0)


def median_itl(run: RunAnalysis, keys: pl.DataFrame) -> pl.DataFrame:
    """Per request in ``keys`` (worker, seq): its median per-token ITL (a chunk of k tokens weighs k)."""
    rows = run.ok_index.join(keys.select(KEY), on=KEY, how="semi", maintain_order="left")
    if rows.is_empty():
        return pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64, "median_itl_ms": pl.Float64})
    per = (run.gaps.join(rows.select("i"), on="i", how="semi", maintain_order="left")
           .group_by("i").agg(median_itl_ms=ITL_MS.repeat_by(pl.col("tokens").cast(pl.Int64)).explode().median()))
    return rows.join(per, on="i", how="left", maintain_order="left").drop("i")


def cap_held(rows: pl.DataFrame, requests: pl.DataFrame, cap: int | None) -> pl.DataFrame:
    """Per row of ``rows`` (t_intended_ns, t_sent_ns), in order: ``held_ms``, the part of its send lag the
    in-flight cap (``load.max_in_flight``) held it — where ``cap`` requests were in flight at its due time
    (spikes.py's ``_client_lagged`` test), from then to the last completion before it went out (the slot it
    took) — and ``in_flight`` then. The server's slowness filled the cap: that part is a wait, not loadgen's."""
    n = rows.height
    if cap is None or n == 0:
        return pl.DataFrame({"held_ms": [0.0] * n, "in_flight": [0] * n},
                            schema={"held_ms": pl.Float64, "in_flight": pl.Int64})
    sends = sorted(requests["t_sent_ns"].drop_nulls().to_list())
    dones = sorted(requests["t_done_ns"].drop_nulls().to_list())
    held, flying = [], []
    for due, sent in rows.select("t_intended_ns", "t_sent_ns").iter_rows():
        in_flight = bisect.bisect_right(sends, due) - bisect.bisect_right(dones, due)
        freed = dones[bisect.bisect_right(dones, sent) - 1] if bisect.bisect_right(dones, sent) else due
        held.append(max(0, min(freed, sent) - due) / 1e6 if in_flight >= cap else 0.0)
        flying.append(in_flight)
    return pl.DataFrame({"held_ms": held, "in_flight": flying}, schema={"held_ms": pl.Float64, "in_flight": pl.Int64})
