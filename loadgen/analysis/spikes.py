"""Theory of operation: prefill-induced tail spikes (DESIGN §5), pure polars over a run's records.

1. Baseline: the median ``itl_ms`` per class. A **stall** is a chunk gap whose excess over what its tokens
   should have taken (``gap − (tokens − 1) × baseline``) is above ``max(spike_factor × baseline, floor)``;
   the floor is ``stalls.min_gap_ms`` or else the scenario's ``itl_ms`` p99 limit.
2. **Prefill windows**: ``[t_first − est_prefill(prompt_tokens), t_first]``, never before ``t_sent``;
   ``est_prefill`` is fitted on this run from each request's own evidence (``prefill.py``).
3. **Attribution** (one rule for every scheduler): a *culprit* of a stall is another request with a long
   prompt (``>= long_prompt_tokens``, default the run's p90) whose prefill window overlaps the gap and
   - finished as the gap ended, within one engine step (``step_tol_ms``): an unchunked prefill ends with the
     very step that ends the victim's gap (vLLM); under prefill-only batches the victim resumes one decode step
     after it (SGLang, TGI); a prompt a bit longer than one ``n_batch`` slice gets its first token one short
     step after the victim resumes (llama.cpp); or
   - alone covers ``overlap_share`` of the gap (a prefill chunked over many steps); or
   - lies inside the gap (within ``step_tol_ms``): one of several prefill batches run back to back while the
     decodes waited (SGLang, TGI).
   The stall is prefill-induced when its culprits' windows together cover ``overlap_share`` of the gap.
   Otherwise it is labelled by what coincides (``CAUSES``); server evidence of a preemption overrides both.
4. **Spike events**: stalls ending within ``group_ms`` of each other are one engine step (many victims).
5. **Figures**: counts per 1k output tokens, the share of tail gaps (>= p99) that are prefill-induced, the
   lift P(stall | long prefill overlaps) / P(stall | none) over all gaps (infinite when every stall overlaps
   one), stalled ms per request, top culprits by prompt length, and Metron's fluidity index; overall and per
   class.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import polars as pl

from loadgen.core.vocabulary import STALL_CAUSES
from loadgen.analysis import metrics as m
from loadgen.analysis.prefill import NS_PER_MS, PrefillFit, fit_prefill, prefill_windows, stall_episodes
from loadgen.analysis.objective_intervals import batch_dispersion
from loadgen.analysis.lift import covered, culprit_pairs, lift, lift_narrow
from loadgen.analysis.run_analysis import ITL_MS, RunAnalysis, gap_ms

# Every label is something that can pause a stream that is already running. Server side: a long prefill
# (named culprits), several prefills admitted at once, an arrival burst (the new requests' prefills), a
# preemption (the server's counter). Client side: loadgen itself fell behind (its sends ran late while the
# in-flight cap was not full), so it read late too. ``unknown``: none of these coincided.
Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)
CAUSES = tuple(STALL_CAUSES)  # the stall causes, each with what it means: core/vocabulary.py
BAND = 0.05  # a stall within ±5 % of its threshold is a near-threshold one (sensitivity)


@dataclass(frozen=True)
class SpikeConfig:
    spike_factor: float = 4.0
    min_gap_ms: float = 0.0  # the floor of the stall threshold
    long_prompt_tokens: int | None = None  # None: the run's p90 prompt length
    overlap_share: float = 0.5
    group_ms: float = 5.0
    burst_factor: float = 4.0
    max_in_flight: int | None = None  # the client's cap: a send held by it is not the client's lag
    fluidity_target_itl_ms: float | None = None
    step_tol_ms: float | None = None  # one engine step; None: max(group_ms, 3 × the median ITL)

    @property
    def tol_ms(self) -> float:
        return self.step_tol_ms if self.step_tol_ms is not None else self.group_ms


# ---- stalls ----------------------------------------------------------------------------------------------
def baselines(gaps: pl.DataFrame) -> dict[str, float]:
    """Median per-token ITL per class (per-token: a chunk of k tokens weighs k)."""
    out = {}
    for (name,), g in gaps.group_by("class_name"):
        per_token = g.select(pl.col("itl_ms").repeat_by("tokens").explode()).to_series()
        out[name] = float(per_token.median()) if len(per_token) else 0.0  # type: ignore[arg-type]
    return dict(sorted(out.items()))  # group_by's order varies: keep summary.json byte-stable


def find_stalls(gaps: Frame, baseline: dict[str, float], cfg: SpikeConfig) -> Frame:
    base = pl.col("class_name").replace_strict(baseline, default=0.0, return_dtype=pl.Float64)
    threshold = pl.max_horizontal(cfg.spike_factor * base, pl.lit(cfg.min_gap_ms))
    return (gaps.with_columns(baseline_itl_ms=base, threshold_ms=threshold,
                              excess_ms=pl.col("chunk_gap_ms") - pl.col("tokens") * base)
            .filter(pl.col("chunk_gap_ms") - (pl.col("tokens") - 1) * pl.col("baseline_itl_ms")
                    > pl.col("threshold_ms"))
            .with_columns(t_start_ns=pl.col("t_ns") - (pl.col("chunk_gap_ms") * NS_PER_MS).cast(pl.Int64))
            .select("worker", "seq", "class_name", "t_start_ns", pl.col("t_ns").alias("t_end_ns"), "tokens",
                    "chunk_gap_ms", "excess_ms", "baseline_itl_ms", "threshold_ms"))


def attribute(stalls: pl.DataFrame, windows: pl.DataFrame, requests: pl.DataFrame,
              cfg: SpikeConfig) -> pl.DataFrame:
    keys = ["worker", "seq", "t_end_ns"]
    pairs = culprit_pairs(stalls, windows, cfg.overlap_share, cfg.tol_ms, cfg.min_gap_ms)
    culprits = (pairs.sort("overlap_ms", "c_seq", descending=[True, False])  # ties by seq: a fixed first culprit
                .group_by(keys).agg(culprits=pl.col("c_seq"), culprit_prompt_tokens=pl.col("c_prompt_tokens"),
                                    overlap_ms=pl.col("overlap_ms"))
                .join(covered(pairs, keys, cfg.overlap_share), on=keys))
    out = stalls.join(culprits, on=keys, how="left").with_columns(
        prefill_induced=pl.col("covered").fill_null(False)).drop("covered")
    out = out.with_columns(  # culprits of a stall that is not prefill-induced are only neighbours: drop them
        [pl.when(pl.col("prefill_induced")).then(pl.col(c)).otherwise(None).alias(c)
         for c in ("culprits", "culprit_prompt_tokens", "overlap_ms")])
    causes = pl.Series(_other_causes(out, requests, cfg), dtype=pl.String)
    return out.with_columns(cause=causes).sort("t_end_ns", "worker", "seq")  # a fixed order: summed later


def _other_causes(stalls: pl.DataFrame, requests: pl.DataFrame, cfg: SpikeConfig) -> list[str]:
    sends = sorted(requests["t_sent_ns"].to_list())
    dones = sorted(requests["t_done_ns"].to_list())
    firsts = sorted(requests["t_first_token_ns"].drop_nulls().to_list())
    intended = sorted(zip(requests["t_intended_ns"].to_list(), requests["t_sent_ns"].to_list()))
    slack_ns = int(cfg.group_ms * NS_PER_MS)
    span_s = max((sends[-1] - sends[0]) / 1e9, 1e-9) if len(sends) > 1 else 1.0
    rate_per_s = len(sends) / span_s
    out = []
    for t0, t1, induced in stalls.select("t_start_ns", "t_end_ns", "prefill_induced").iter_rows():
        if induced:
            out.append("prefill")
            continue
        sent = bisect.bisect_right(sends, t1) - bisect.bisect_left(sends, t0)
        admitted = bisect.bisect_right(firsts, t1 + slack_ns) - bisect.bisect_left(firsts, t1 - slack_ns)
        if admitted >= 3:
            out.append("prefill_burst")
        elif sent >= max(3, cfg.burst_factor * rate_per_s * (t1 - t0) / 1e9):
            out.append("burst")
        elif _client_lagged(intended, sends, dones, t0, t1, cfg.max_in_flight):
            out.append("client_lag")
        else:
            out.append("unknown")
    return out


def _client_lagged(intended: list[tuple[int, int]], sends: list[int], dones: list[int], t0: int, t1: int,
                   cap: int | None) -> bool:
    """A send due during the gap went out more than half the gap late, and not because the in-flight cap
    held it: the client's own loop was behind, so it read the streams late too."""
    lo = bisect.bisect_left(intended, (t0, -1))
    hi = bisect.bisect_right(intended, (t1, math.inf))
    for t_due, t_sent in intended[lo:hi]:
        in_flight = bisect.bisect_right(sends, t_due) - bisect.bisect_right(dones, t_due)
        if t_sent - t_due > (t1 - t0) / 2 and (cap is None or in_flight < cap):
            return True
    return False


def group_events(stalls: pl.DataFrame, group_ms: float) -> pl.DataFrame:
    if stalls.is_empty():
        return pl.DataFrame(schema={"event": pl.Int64, "t_start_ns": pl.Int64, "t_end_ns": pl.Int64,
                                    "victims": pl.UInt32, "max_gap_ms": pl.Float64, "prefill_induced": pl.Boolean,
                                    "culprits": pl.List(pl.Int64), "cause": pl.String})
    s = stalls.sort("t_end_ns").with_columns(
        event=(pl.col("t_end_ns").diff().fill_null(0) > group_ms * NS_PER_MS).cum_sum().cast(pl.Int64))
    return (s.group_by("event", maintain_order=True)
            .agg(t_start_ns=pl.col("t_start_ns").min(), t_end_ns=pl.col("t_end_ns").max(), victims=pl.len(),
                 max_gap_ms=pl.col("chunk_gap_ms").max(), prefill_induced=pl.col("prefill_induced").any(),
                 culprits=pl.col("culprits").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
                 cause=pl.col("cause").mode().sort().first()))  # a tie: by name (mode's order varies)


# ---- figures ---------------------------------------------------------------------------------------------
def figures(stalls: pl.DataFrame, events: pl.DataFrame, gaps: pl.DataFrame | pl.LazyFrame, requests: pl.DataFrame,
            windows: pl.DataFrame, cfg: SpikeConfig, run: RunAnalysis | None = None,
            narrow: pl.DataFrame | None = None) -> dict[str, Any]:
    """The stall figures of one set of gaps (a frame, or a lazy one: only the tail is materialised; with
    ``run`` and its ``narrow`` rows of these gaps, the lift is counted on those)."""
    ok = requests.filter(pl.col("ok"))
    ktok = max(float(ok["output_tokens"].sum()) / 1000, 1e-9)
    induced = stalls.filter(pl.col("prefill_induced"))
    if run is not None:
        p99, tail = _tail(run, narrow if narrow is not None else run.gaps)
    else:
        lazy = gaps.lazy()
        p99 = lazy.select(pl.col("chunk_gap_ms").quantile(0.99)).collect().item()
        tail = (lazy.filter(pl.col("chunk_gap_ms") >= p99) if p99 is not None else lazy.head(0)).select(
            "worker", "seq", "t_ns").collect()
    tail_induced = tail.join(induced.select("worker", "seq", pl.col("t_end_ns").alias("t_ns")),
                             on=["worker", "seq", "t_ns"], how="semi").height
    stalled = stalls.group_by("worker", "seq").agg(ms=pl.col("excess_ms").sum())
    per_req = ok.select("worker", "seq").join(stalled, on=["worker", "seq"], how="left")["ms"].fill_null(0.0)
    return {
        "count": stalls.height, "prefill_induced": induced.height,
        "per_1k_tokens": stalls.height / ktok, "prefill_induced_per_1k_tokens": induced.height / ktok,
        "events": events.height, "events_per_1k_tokens": events.height / ktok,
        "prefill_induced_events_per_1k_tokens": events.filter(pl.col("prefill_induced")).height / ktok,
        **_lift_fields(lift(gaps, stalls, windows, cfg.overlap_share, cfg.tol_ms, cfg.min_gap_ms) if run is None
                       else lift_narrow(run, narrow if narrow is not None else run.gaps, stalls, windows,
                                        cfg.overlap_share, cfg.tol_ms, cfg.min_gap_ms)),
        "tail_gaps": tail.height, "tail_prefill_induced_share": tail_induced / tail.height if tail.height else None,
        "stalled_ms_per_request": {"mean": float(per_req.mean()) if len(per_req) else 0.0,  # type: ignore[arg-type]
                                   "max": float(per_req.max()) if len(per_req) else 0.0},  # type: ignore[arg-type]
        "by_cause": dict(sorted(stalls.group_by("cause").len().iter_rows())) if stalls.height else {},
        "worst_gap_ms": float(stalls["chunk_gap_ms"].max()) if stalls.height else None,  # type: ignore[arg-type]
    }


# ---- the whole analysis ------------------------------------------------------------------------------------
@dataclass
class SpikeAnalysis:
    stalls: pl.DataFrame  # one row per stall (stalls.parquet)
    events: pl.DataFrame
    summary: dict[str, Any]
    per_class: dict[str, dict[str, Any]]
    # what the SLO-miss ledger reuses (analysis/ledger.py): the long prompts' prefill windows, the prefill fit
    # and the configuration with its engine step filled in
    windows: pl.DataFrame | None = None
    fit: PrefillFit | None = None
    cfg: SpikeConfig | None = None


def config_from(slo: Any, max_in_flight: int | None) -> SpikeConfig:
    st = slo.stalls
    floor = st.min_gap_ms
    if floor is None and slo.itl_ms is not None:
        floor = next((v for k, v in ((k, getattr(slo.itl_ms, k)) for k in ("p99", "p999", "max", "p95", "p90"))
                      if v is not None), None)
    return SpikeConfig(spike_factor=st.spike_factor, min_gap_ms=floor or 0.0, long_prompt_tokens=st.long_prompt_tokens,
                       overlap_share=st.overlap_share, group_ms=st.group_ms, max_in_flight=max_in_flight,
                       fluidity_target_itl_ms=slo.fluidity.target_itl_ms if slo.fluidity else None)


def analyze(all_requests: pl.DataFrame, measured: pl.DataFrame, run: RunAnalysis, cfg: SpikeConfig,
            preemptions: list[tuple[int, int]] | None = None) -> SpikeAnalysis:
    """``all_requests`` (warm-up included: its prefills can stall measured streams) and the ``measured`` ones,
    with metric columns (analysis.metrics); ``run``'s gaps are the measured, successful requests'."""
    ok = measured.filter(pl.col("ok"))
    ok_gaps = run.wide()
    # a class's per-token median ITL: its described p50 (polars' median is its linear 0.5 quantile)
    base = {name: float(run.token_stats(name)["itl_ms"]["p50"] or 0.0) for name in run.classes}
    if cfg.step_tol_ms is None:
        one_token = bool((run.gaps["tokens"] == 1).all())  # then each chunk's itl is its one token's
        median = (run.token_stats()["itl_ms"]["p50"] if one_token
                  else _median(run.gaps.select(ITL_MS).to_series())) if run.gaps.height else None
        cfg = replace(cfg, step_tol_ms=max(cfg.group_ms, 3 * float(median or 0.0)))
    found = _collect_stalls(run, base, cfg)
    prompt_p90 = ok["prompt_tokens"].quantile(0.9) if ok.height else None
    long_tokens = cfg.long_prompt_tokens or int(prompt_p90 or 1)
    longs = all_requests.filter((pl.col("prompt_tokens") >= long_tokens) & pl.col("t_first_token_ns").is_not_null())
    # the evidence of prefill work is every step far longer than a decode step, whether or not it is long
    # enough to count as a stall against the SLO's floor (the first slice of a sliced prompt often is not)
    slow = _collect_stalls(run, base, replace(cfg, min_gap_ms=0.0)) if cfg.min_gap_ms else found
    episodes = stall_episodes(all_requests, slow, cfg.tol_ms, cuts=longs)
    fit = fit_prefill(ok, episodes)
    windows = prefill_windows(all_requests, fit, long_tokens, episodes)
    stalls = confirm_preemptions(attribute(found, windows, all_requests, cfg), preemptions or [])
    near = sensitivity(run, base, cfg, windows, all_requests, stalls)
    events = group_events(stalls, cfg.group_ms)
    stalls = _with_event_ids(stalls, cfg.group_ms)
    summary = figures(stalls, events, ok_gaps, ok, windows, cfg, run)
    names = sorted(set(ok["class_name"].to_list()))
    per_class = {names[0]: dict(summary)} if len(names) == 1 else {}  # one class: its figures are the run's
    summary.update(baseline_itl_ms=dict(sorted(base.items())), long_prompt_tokens=long_tokens,
                   spike_factor=cfg.spike_factor, min_gap_ms=cfg.min_gap_ms, step_tol_ms=cfg.tol_ms,
                   prefill_fit=fit.as_dict(), top_culprits=top_culprits(stalls, all_requests),
                   worst=worst_stall(stalls, all_requests),
                   worst_events=worst_events(events, all_requests, ok, t0_ns=run.t0_ns),
                   sensitivity=near)
    if cfg.fluidity_target_itl_ms:
        summary["fluidity"] = m.fluidity(ok, run.chunks, cfg.fluidity_target_itl_ms)
    for name in names if len(names) > 1 else []:
        c_ok = ok.filter(pl.col("class_name") == name)
        c_stalls = stalls.filter(pl.col("class_name") == name)
        c_gaps = run.class_gaps(name)
        per_class[name] = figures(c_stalls, group_events(c_stalls, cfg.group_ms), run.wide(c_gaps), c_ok, windows,
                                  cfg, run, c_gaps)
    return SpikeAnalysis(stalls, events, summary, per_class, windows, fit, cfg)


def sensitivity(run: RunAnalysis, baseline: dict[str, float], cfg: SpikeConfig, windows: pl.DataFrame,
                requests: pl.DataFrame, stalls: pl.DataFrame) -> dict[str, Any]:
    """How much the stall counts hang on the threshold: the stalls (and prefill-induced ones) the threshold
    would find at (1 − BAND) and (1 + BAND) of itself, those within ±BAND of it, and the counts' dispersion over
    time batches (stalls come in bursts: analysis/intervals.py)."""
    low = replace(cfg, spike_factor=cfg.spike_factor * (1 - BAND), min_gap_ms=cfg.min_gap_ms * (1 - BAND))
    near = attribute(_collect_stalls(run, baseline, low), windows, requests, low)
    ratio = ((pl.col("chunk_gap_ms") - (pl.col("tokens") - 1) * pl.col("baseline_itl_ms"))
             / (pl.col("threshold_ms") / (1 - BAND)))
    near = near.with_columns(ratio=ratio)

    def counts(frame: pl.DataFrame) -> dict[str, int]:
        return {"count": frame.height, "prefill_induced": int(frame["prefill_induced"].sum())}
    induced = stalls.filter(pl.col("prefill_induced"))["t_end_ns"] if stalls.height else stalls["t_end_ns"]
    return {"band": BAND, "near_threshold": counts(near.filter(pl.col("ratio") <= 1 + BAND)),
            "low_edge": counts(near), "high_edge": counts(near.filter(pl.col("ratio") > 1 + BAND)),
            "dispersion": {"count": batch_dispersion(stalls["t_end_ns"], run.gaps),
                           "prefill_induced": batch_dispersion(induced, run.gaps)}}


def _tail(run: RunAnalysis, gaps: pl.DataFrame) -> tuple[float | None, pl.DataFrame]:
    """The gaps' p99 chunk gap (polars' default, nearest: one of them) and the gaps at or past it, found on
    the integer gaps (gap_ns → ms is monotone: the same rank, the same rows)."""
    if gaps.is_empty():
        return None, pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64, "t_ns": pl.Int64})
    at = gaps.select(pl.col("gap_ns").quantile(0.99, interpolation="nearest")).item()
    p99 = gap_ms([int(at)], gaps.schema["gap_ns"])[0]
    return p99, run.wide(gaps.filter(pl.col("gap_ns") >= int(at))).select("worker", "seq", "t_ns").collect()


def _median(values: pl.Series) -> float:
    return float(values.median()) if len(values) else 0.0  # type: ignore[arg-type]


def _collect_stalls(run: RunAnalysis, baseline: dict[str, float], cfg: SpikeConfig) -> pl.DataFrame:
    """``find_stalls`` over the run's gaps: the narrow rows it can keep first, then its own columns for those;
    in stream then time order."""
    subset = run.stall_candidates(baseline, cfg.spike_factor, cfg.min_gap_ms)
    return find_stalls(run.wide(subset).collect(), baseline, cfg).sort("worker", "seq", "t_end_ns",
                                                                         maintain_order=True)


def with_step_tolerance(cfg: SpikeConfig, gaps: pl.DataFrame) -> SpikeConfig:
    """One engine step, for "finished with the gap": 3 × the run's median ITL (a decode step and the delivery
    jitter around it), at least ``group_ms``."""
    if cfg.step_tol_ms is not None:
        return cfg
    median = gaps["itl_ms"].median() if gaps.height else None
    return replace(cfg, step_tol_ms=max(cfg.group_ms, 3 * float(median or 0.0)))  # type: ignore[arg-type]


def confirm_preemptions(stalls: pl.DataFrame, windows: list[tuple[int, int]]) -> pl.DataFrame:
    """Server evidence (vLLM's preemption counter, scraped): a stall that overlaps a scrape interval in which
    the counter rose is labelled "preemption", not prefill (a preempted request stalls from the step that
    evicted it until it is recomputed). The resolution is the scrape period (``--server-metrics-period``)."""
    if stalls.is_empty() or not windows:
        return stalls
    w = pl.DataFrame(windows, schema={"p0_ns": pl.Int64, "p1_ns": pl.Int64}, orient="row")
    keys = ["worker", "seq", "t_end_ns"]
    hit = (stalls.select(*keys, "t_start_ns")
           .join_where(w, pl.col("p0_ns") < pl.col("t_end_ns"), pl.col("p1_ns") > pl.col("t_start_ns"))
           .select(keys).unique().with_columns(preempted=pl.lit(True)))
    out = stalls.join(hit, on=keys, how="left").with_columns(pl.col("preempted").fill_null(False))
    nulls = [pl.when(pl.col("preempted")).then(None).otherwise(pl.col(c)).alias(c)
             for c in ("culprits", "culprit_prompt_tokens", "overlap_ms")]
    return out.with_columns(
        *nulls, prefill_induced=pl.col("prefill_induced") & ~pl.col("preempted"),
        cause=pl.when(pl.col("preempted")).then(pl.lit("preemption")).otherwise(pl.col("cause")),
    ).drop("preempted")


def _with_event_ids(stalls: pl.DataFrame, group_ms: float) -> pl.DataFrame:
    if stalls.is_empty():
        return stalls.with_columns(event=pl.lit(None, dtype=pl.Int64))
    return stalls.sort("t_end_ns").with_columns(
        event=(pl.col("t_end_ns").diff().fill_null(0) > group_ms * NS_PER_MS).cum_sum().cast(pl.Int64))


def top_culprits(stalls: pl.DataFrame, requests: pl.DataFrame, n: int = 10) -> list[dict[str, Any]]:
    """The culprits of prefill-induced stalls, longest prefill first: seq, stalls, stalled_ms, prompt_tokens
    (as prefilled: less the cached tokens), class_name and, for an agentic session's call, session, call,
    agent, step, cached_tokens and ``label`` "session S call C" — a late call's long context named as such."""
    induced = stalls.filter(pl.col("prefill_induced"))
    if induced.is_empty():
        return []
    extra = [c for c in ("session", "call", "agent", "step", "cached_tokens")  # where the run has them
             if c in requests.columns and requests[c].null_count() < requests.height]
    rows = (induced.select(pl.col("culprits").alias("seq"), "excess_ms").explode("seq")
            .group_by("seq").agg(stalls=pl.len(), stalled_ms=pl.col("excess_ms").sum())
            .join(requests.select("seq", "prompt_tokens", "class_name", *extra), on="seq", how="left")
            .sort(["prompt_tokens", "stalled_ms", "seq"], descending=[True, True, False]).head(n))
    if "session" in extra and "call" in extra and rows["session"].null_count() < rows.height:
        rows = rows.with_columns(label=pl.when(pl.col("session").is_not_null())
                                 .then(pl.format("session {} call {}", "session", "call")))
    return rows.to_dicts()


def worst_events(events: pl.DataFrame, requests: pl.DataFrame, measured: pl.DataFrame,
                 n: int = 10, t0_ns: int | None = None) -> list[dict[str, Any]]:
    """The worst spike events, ``at_s`` seconds since ``t0_ns`` (the run's origin: the first send after the
    declared warm-up; default the first measured request's)."""
    if events.is_empty():
        return []
    t0 = t0_ns if t0_ns is not None else measured["t_intended_ns"].min() if measured.height else 0
    prompts = dict(zip(requests["seq"].to_list(), requests["prompt_tokens"].to_list()))
    out = []
    for e in events.sort("max_gap_ms", "t_end_ns", descending=[True, False]).head(n).iter_rows(named=True):
        out.append({"at_s": (e["t_end_ns"] - t0) / 1e9, "victims": e["victims"], "max_gap_ms": e["max_gap_ms"],
                    "cause": e["cause"], "culprits": [{"seq": c, "prompt_tokens": prompts.get(c)}
                                                      for c in e["culprits"]]})
    return out


def _lift_fields(value: float | None) -> dict[str, Any]:
    """JSON has no infinity: an infinite lift is ``lift: null, lift_infinite: true``."""
    infinite = value is not None and math.isinf(value)
    return {"lift": None if infinite else value, "lift_infinite": infinite}


def worst_stall(stalls: pl.DataFrame, requests: pl.DataFrame) -> dict[str, Any] | None:
    """The longest stall: its gap, and its culprit (the longest-overlapping prefill) or its cause."""
    if stalls.is_empty():
        return None
    worst = stalls.sort(-pl.col("chunk_gap_ms"), "t_end_ns", "worker", "seq").row(0, named=True)  # ties: earliest
    out: dict[str, Any] = {"gap_ms": worst["chunk_gap_ms"], "cause": worst["cause"], "culprit": None,
                           "culprit_prompt_tokens": None}
    if worst["prefill_induced"]:
        culprit = worst["culprits"][0]
        prompt = requests.filter(pl.col("seq") == culprit)["prompt_tokens"].to_list()
        out.update(culprit=culprit, culprit_prompt_tokens=prompt[0] if prompt else None)
    return out
