"""Chart-ready tables derived from a run's raw records (pure polars; the charts are in ``charts.py``).

Every time is in seconds since the run's start ``t0`` (the first measured request's intended send), the same
origin as the worst-events table in summary.md. Tables are kept small (binned, deduplicated or quantile-sampled)
so that the report stays a few hundred kilobytes however long the run was.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen.analysis import server_frames as sm
from loadgen.analysis.result import RunResult
from loadgen.analysis.run_analysis import ITL_MS, RunAnalysis, itl_per_token

NS_PER_S = 1e9
MAX_POINTS = 4000  # scatter points per chart; above it a seeded sample (stalls and culprits always kept)
MAX_TIMELINE_ROWS = 60
ITL_FLOOR_MS = 0.01  # the lowest value drawn on a log ITL axis


@dataclass
class RunViews:
    """A run's records with metric columns, its chunk gaps and stalls, and the time origin."""

    requests: pl.DataFrame  # every request (warm-up included), analysis.metrics columns, + t_*_s
    gaps: pl.LazyFrame  # measured, successful requests' chunk gaps, + t_s (lazy: charts keep bins of them)
    chunks: pl.LazyFrame  # the same requests' chunks (t_s, tokens): every token, first chunks included
    stalls: pl.DataFrame  # stalls.parquet, + t_start_s / t_end_s
    result: RunResult
    t0_ns: int
    server: pl.DataFrame | None = None  # server_metrics.parquet, wide (one row per scrape), + t_s
    run: RunAnalysis | None = None  # the records' analysis (the gaps, once)

    @classmethod
    def build(cls, requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame, stalls: pl.DataFrame,
              result: RunResult, server: pl.DataFrame | None = None, run: RunAnalysis | None = None) -> "RunViews":
        run = run or RunAnalysis(requests, chunks)
        req, measured = run.req, run.measured
        t0 = run.t0_ns if run.t0_ns is not None else int(req["t_intended_ns"].min() or 0)  # the declared warm-up's end
        sec = [((pl.col(c) - t0) / NS_PER_S).alias(c.replace("_ns", "_s"))
               for c in ("t_intended_ns", "t_sent_ns", "t_first_token_ns", "t_last_token_ns", "t_done_ns")]
        req = req.with_columns(sec)
        ok_keys = measured.filter(pl.col("ok")).select("worker", "seq")
        gaps = run.wide().with_columns(t_s=(pl.col("t_ns") - t0) / NS_PER_S)
        if stalls.height:
            stalls = stalls.with_columns(t_start_s=(pl.col("t_start_ns") - t0) / NS_PER_S,
                                         t_end_s=(pl.col("t_end_ns") - t0) / NS_PER_S)
        ok_chunks = (run.chunks.join(ok_keys.lazy(), on=["worker", "seq"], how="semi")
                     .select(t_s=(pl.col("t_ns") - t0) / NS_PER_S, tokens="tokens"))
        if server is not None and not server.is_empty():
            server = sm.wide(server).with_columns(t_s=(pl.col("t_ns") - t0) / NS_PER_S)
        else:
            server = None
        return cls(req, gaps, ok_chunks, stalls, result, t0, server, run)

    @property
    def measured_ok(self) -> pl.DataFrame:
        return self.requests.filter(~pl.col("warmup") & pl.col("ok"))

    @property
    def span_s(self) -> float:
        end = self.requests["t_done_s"].max()
        return max(float(end), 1e-3) if end is not None else 1.0  # type: ignore[arg-type]

    def prefill_ms(self, prompt_tokens: pl.Expr) -> pl.Expr:
        """The run's fitted prefill time (analysis.spikes, on the lower envelope of TTFT)."""
        fit = (self.result.stalls or {}).get("prefill_fit") or {}
        a, b, c = (float(fit.get(k, 0.0)) for k in ("a_ms", "b_ms_per_token", "c_ms_per_token2"))
        return (a + b * prompt_tokens + c * prompt_tokens * prompt_tokens).clip(lower_bound=0.0)


def sample(frame: pl.DataFrame, n: int = MAX_POINTS, seed: int = 0) -> pl.DataFrame:
    return frame if frame.height <= n else frame.sample(n, seed=seed).sort(frame.columns[0])


# ---- TTFT vs prompt length ----------------------------------------------------------------------------
def ttft_points(v: RunViews) -> pl.DataFrame:
    ok = v.measured_ok.filter(pl.col("t_first_token_ns").is_not_null())
    return sample(ok.select("seq", "class_name", "prompt_tokens", "ttft_ms", "ttft_service_ms"))


def prefill_line(v: RunViews, points: int = 80) -> pl.DataFrame:
    ok = v.measured_ok
    if ok.is_empty():
        return pl.DataFrame(schema={"prompt_tokens": pl.Float64, "prefill_ms": pl.Float64})
    lo, hi = float(ok["prompt_tokens"].min()), float(ok["prompt_tokens"].max())  # type: ignore[arg-type]
    xs = pl.DataFrame({"prompt_tokens": [lo + (hi - lo) * i / (points - 1) for i in range(points)]})
    return xs.with_columns(prefill_ms=v.prefill_ms(pl.col("prompt_tokens")))


# ---- ITL distribution ---------------------------------------------------------------------------------
def _cdf_probabilities() -> list[float]:
    body = [i / 200 for i in range(1, 199)]
    tail = [1 - 10 ** (-(2 + i / 20)) for i in range(0, 61)]  # 0.99 … 0.99999
    return sorted(set(body + tail))


def itl_cdf(v: RunViews) -> pl.DataFrame:
    """Per class, the per-token ITL at ~260 probabilities (dense in the tail)."""
    rows = []
    probs = _cdf_probabilities()
    assert v.run is not None
    for name in v.run.classes:
        samples = _itl_array(v.run.class_gaps(name))
        if len(samples) < 2:
            continue
        # linear, as the summary; the array is this function's own: partitioned in place, not copied
        qs = pl.DataFrame({"p": probs, "itl_ms": np.quantile(samples, probs, overwrite_input=True)})
        rows.append(qs.with_columns(class_name=pl.lit(name), samples=pl.lit(len(samples))))
    if not rows:
        return pl.DataFrame(schema={"p": pl.Float64, "itl_ms": pl.Float64, "class_name": pl.String,
                                    "samples": pl.Int64})
    return pl.concat(rows).filter(pl.col("itl_ms") > 0).sort("class_name", "p")


def _itl_array(gaps: pl.DataFrame) -> np.ndarray:
    """Per-token ITL as a numpy array of its own: where every chunk carried one token, made from the integer
    gaps in place (one float array; checked against polars' own floats on a head, else theirs, copied)."""
    if gaps.height and bool((gaps["tokens"] == 1).all()):
        values = gaps["gap_ns"].to_numpy().astype(np.float64)
        values *= 1 / 1e6
        head = gaps.head(1000).select(ITL_MS).to_series().to_numpy()
        if np.array_equal(values[:len(head)], head):
            return values
    return itl_per_token(gaps).to_numpy(writable=True)


# ---- over time ----------------------------------------------------------------------------------------
def bin_width_s(span_s: float, bins: int = 300) -> float:
    """A round bin width giving about ``bins`` bins over the span (≥ 10 ms)."""
    raw = max(span_s / bins, 0.01)
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300):
        if step >= raw:
            return step
    return raw


def itl_over_time(v: RunViews, bw_s: float) -> pl.DataFrame:
    """Per time bin: the median per-token ITL and the worst chunk gap that ended in it."""
    if v.run is not None and v.run.gaps.is_empty():
        return pl.DataFrame(schema={"t_s": pl.Float64, "series": pl.String, "ms": pl.Float64})
    assert v.run is not None
    per_bin = _itl_per_bin(v.run.gaps, v.t0_ns, bw_s)
    lo, hi = per_bin["b"].min(), per_bin["b"].max()
    # every bin present, empty ones null: a line breaks there instead of drawing across a stall
    grid = pl.DataFrame({"b": pl.int_range(lo, hi + 1, eager=True)})  # type: ignore[arg-type]
    binned = grid.join(per_bin, on="b", how="left").select(pl.col("b") * bw_s, "median_itl_ms", "max_gap_ms")
    # a log axis cannot draw 0 (tokens that arrived in one read have a 0 ms gap): floor at 0.01 ms
    return binned.rename({"b": "t_s"}).unpivot(index="t_s", variable_name="series", value_name="ms").with_columns(
        series=pl.col("series").replace({"median_itl_ms": "median ITL", "max_gap_ms": "worst chunk gap"}),
        ms=pl.col("ms").clip(lower_bound=ITL_FLOOR_MS))


def _itl_per_bin(gaps: pl.DataFrame, t0_ns: int, bw_s: float, passes: int = 8) -> pl.DataFrame:
    """Per bin ``b``: the median ITL and the worst chunk gap, on the narrow gaps, a range of bins a pass (a
    median holds its bin's values: a pass holds an eighth of the run's). The worst gap_ns in ms is the worst
    chunk_gap_ms (one division, monotone)."""
    b = (((pl.col("t_ns") - t0_ns) / NS_PER_S) / bw_s).floor().cast(pl.Int64)
    ends = gaps.select(pl.col("t_ns").min().alias("lo"), pl.col("t_ns").max().alias("hi")).row(0)
    lo, hi = pl.DataFrame({"t_ns": list(ends)}).select(b)["t_ns"].to_list()  # b grows with t_ns
    step = max(1, (hi - lo + passes) // passes)
    out = []
    bin_ns = bw_s * NS_PER_S
    for first in range(lo, hi + 1, step):  # the t_ns range (a bin wider each side) first, then the exact bins
        near = ((pl.col("t_ns") >= t0_ns + int((first - 1) * bin_ns))
                & (pl.col("t_ns") < t0_ns + int((first + step + 1) * bin_ns)))
        part = gaps.filter(near).lazy().with_columns(b=b).filter((pl.col("b") >= first) & (pl.col("b") < first + step))
        out.append(part.group_by("b").agg(median_itl_ms=ITL_MS.median(), max_gap_ms=pl.col("gap_ns").max() / 1e6)
                   .collect())
    return pl.concat(out)


def prefill_tokens_over_time(v: RunViews, bw_s: float) -> pl.DataFrame:
    """Per time bin: prompt tokens whose (estimated) prefill overlaps the bin — the load that stalls decodes."""
    r = v.requests.filter(pl.col("t_first_token_ns").is_not_null())
    if r.is_empty():
        return pl.DataFrame(schema={"t_s": pl.Float64, "prefill_tokens": pl.Int64})
    start = pl.max_horizontal(pl.col("t_first_token_s") - v.prefill_ms(pl.col("prompt_tokens").cast(pl.Float64))
                              / 1e3, pl.col("t_sent_s"))
    spans = r.select("prompt_tokens", b0=(start / bw_s).floor().cast(pl.Int64),
                     b1=(pl.col("t_first_token_s") / bw_s).floor().cast(pl.Int64))
    per_bin = (spans.with_columns(b=pl.int_ranges("b0", pl.col("b1") + 1)).explode("b")
               .group_by("b").agg(prefill_tokens=pl.col("prompt_tokens").sum()))
    return per_bin.select(t_s=pl.col("b") * bw_s, prefill_tokens="prefill_tokens").sort("t_s")


def throughput_over_time(v: RunViews, bw_s: float) -> pl.DataFrame:
    """Per time bin: output tokens/s, requests in flight (at the bin's middle) and completions/s."""
    chunks_t = v.chunks
    n_bins = int(v.span_s / bw_s) + 1
    grid = pl.DataFrame({"b": list(range(n_bins))})
    tokens = (chunks_t.group_by(b=(pl.col("t_s") / bw_s).floor().cast(pl.Int64)).agg(tok=pl.col("tokens").sum())
              .collect(engine="streaming"))
    done = (v.requests.filter(pl.col("ok")).group_by(b=(pl.col("t_done_s") / bw_s).floor().cast(pl.Int64))
            .agg(done=pl.len()))
    sends = sorted(v.requests["t_sent_s"].to_list())
    ends = sorted(v.requests["t_done_s"].to_list())
    in_flight = [bisect.bisect_right(sends, (b + 0.5) * bw_s) - bisect.bisect_right(ends, (b + 0.5) * bw_s)
                 for b in range(n_bins)]
    out = (grid.join(tokens, on="b", how="left").join(done, on="b", how="left").fill_null(0)
           .with_columns(in_flight=pl.Series(in_flight), t_s=pl.col("b") * bw_s))
    return out.select("t_s", output_tokens_per_s=pl.col("tok") / bw_s, completed_per_s=pl.col("done") / bw_s,
                      in_flight="in_flight")


MAX_SERVER_ROWS = 600  # scrapes drawn as they are; a longer run's are binned (an hour at 0.5 s: 7,200)


def _per_bin(v: RunViews, frame: pl.DataFrame, aggs: list[pl.Expr]) -> pl.DataFrame:
    """``frame`` (one row per scrape) as it is, or, past ``MAX_SERVER_ROWS`` rows, aggregated per time bin of
    the run's other timelines and stamped at the bin's start."""
    if frame.height <= MAX_SERVER_ROWS:
        return frame
    bw = bin_width_s(v.span_s)
    return (frame.group_by(b=(pl.col("t_s") / bw).floor()).agg(aggs).sort("b")
            .select((pl.col("b") * bw).alias("t_s"), *frame.columns[1:]))


def server_queues(v: RunViews) -> pl.DataFrame:
    """The server's requests running and waiting at each scrape, or each bin's highest (long format for one
    colour per series)."""
    cols = [c for c in ("running", "waiting") if v.server is not None and c in v.server.columns]
    if v.server is None or not cols:
        return pl.DataFrame(schema={"t_s": pl.Float64, "series": pl.String, "requests": pl.Float64})
    return (_per_bin(v, v.server.select("t_s", *cols), [pl.col(c).max() for c in cols])
            .unpivot(index="t_s", variable_name="series", value_name="requests")
            .with_columns(series="requests " + pl.col("series")).drop_nulls())


def server_kv(v: RunViews) -> pl.DataFrame:
    """KV-cache usage (%) at each scrape and the preemptions counted since the previous scrape (binned: each
    bin's highest usage and every preemption in it)."""
    if v.server is None or "kv_cache_usage" not in v.server.columns:
        return pl.DataFrame(schema={"t_s": pl.Float64, "kv_cache_pct": pl.Float64, "preemptions": pl.Float64})
    pre = (pl.col("preemptions_total").diff().fill_null(0.0).clip(lower_bound=0.0)
           if "preemptions_total" in v.server.columns else pl.lit(0.0))
    per_scrape = v.server.select("t_s", kv_cache_pct=pl.col("kv_cache_usage") * 100.0, preemptions=pre)
    return _per_bin(v, per_scrape, [pl.col("kv_cache_pct").max(), pl.col("preemptions").sum()])


# ---- asked vs achieved lengths ------------------------------------------------------------------------
def lengths(v: RunViews) -> pl.DataFrame:
    ok = v.measured_ok
    parts = [ok.select("class_name", pl.lit(kind).alias("kind"), asked=pl.col(f"{kind}_tokens_asked"),
                       achieved=pl.col(f"{kind}_tokens")) for kind in ("prompt", "output")]
    return (pl.concat(parts).drop_nulls().group_by("kind", "class_name", "asked", "achieved").agg(requests=pl.len())
            .sort("kind", "asked"))
