"""The request timeline of one time window: each request a row with its phases as bars (waiting, prefill,
decode), its stalls marked, and a link from each prefill-induced stall to the row of the long prompt that
caused it.

The window defaults to the worst prefill-induced spike event (else the worst stall, else the run's first
seconds); ``loadgen report --window START:END`` picks another, in seconds since the run's start.

``excluded_spans``: the stretches of the run whose requests no figure counts (the declared warm-up, and the
warm-up and drain that steady-state detection cut: analysis/steady.py), shaded on the report's timelines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from loadgen.report.views import MAX_TIMELINE_ROWS, RunViews

DEFAULT_SPAN_S = 6.0


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    why: str  # shown under the chart: how the window was chosen


def parse_window(text: str) -> tuple[float, float]:
    """'START:END' in seconds since the run's start → (start, end); ValueError naming the problem."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"--window {text!r}: expected START:END in seconds, e.g. 30:40")
    try:
        start, end = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--window {text!r}: START and END must be numbers of seconds") from None
    if not 0 <= start < end:
        raise ValueError(f"--window {text!r}: need 0 <= START < END")
    return start, end


def choose_window(v: RunViews, asked: tuple[float, float] | None = None) -> Window:
    if asked is not None:
        return Window(asked[0], asked[1], f"the window asked for ({asked[0]:g}–{asked[1]:g} s)")
    s = v.stalls
    if s.height:
        induced = s.filter(pl.col("prefill_induced"))
        pick = (induced if induced.height else s).sort("chunk_gap_ms", descending=True).row(0, named=True)
        t0, t1 = pick["t_start_s"], pick["t_end_s"]
        span = max(DEFAULT_SPAN_S, 3 * (t1 - t0))
        mid = (t0 + t1) / 2
        start = max(0.0, mid - span / 2)
        kind = "prefill-induced stall" if pick["prefill_induced"] else f"stall ({pick['cause']})"
        return Window(start, start + span, f"around the worst {kind}: {pick['chunk_gap_ms']:.0f} ms gap in "
                      f"request #{pick['seq']} at {t1:.1f} s")
    return Window(0.0, min(DEFAULT_SPAN_S, v.span_s), "the run's first seconds (no stalls)")


def _rows(v: RunViews, w: Window) -> pl.DataFrame:
    """Requests active in the window; if too many, those in its stalls (victims and culprits) first."""
    r = v.requests.filter((pl.col("t_sent_s") < w.end_s) & (pl.col("t_done_s") > w.start_s))
    s = _stalls_in(v, w)
    involved = set(s["seq"].to_list()) | {c for cs in s["culprits"].drop_nulls().to_list() for c in cs} \
        if s.height else set()
    r = r.with_columns(involved=pl.col("seq").is_in(list(involved)))
    r = r.sort(["involved", "t_sent_s"], descending=[True, False]).head(MAX_TIMELINE_ROWS).sort("t_sent_s")
    label = pl.format("#{} {} ({} tok)", "seq", "class_name", pl.col("prompt_tokens").fill_null(
        pl.col("prompt_tokens_asked")))
    return r.with_columns(row=label, order=pl.int_range(pl.len()))


def _stalls_in(v: RunViews, w: Window) -> pl.DataFrame:
    if v.stalls.is_empty():
        return v.stalls
    return v.stalls.filter((pl.col("t_end_s") > w.start_s) & (pl.col("t_start_s") < w.end_s))


def phases(v: RunViews, w: Window) -> pl.DataFrame:
    """Bars: one per request phase, clipped to the window. Phase prefill = the fitted prefill time before the
    first token; waiting = sent until then (queueing in the server); decode = first to last token."""
    r = _rows(v, w)
    pre_s = v.prefill_ms(pl.col("prompt_tokens").cast(pl.Float64)) / 1e3
    prefill_start = pl.max_horizontal(pl.col("t_first_token_s") - pre_s, pl.col("t_sent_s"))
    spans = [("waiting", pl.col("t_sent_s"), prefill_start),
             ("prefill", prefill_start, pl.col("t_first_token_s")),
             ("decode", pl.col("t_first_token_s"), pl.col("t_last_token_s").fill_null(pl.col("t_done_s")))]
    failed = r.filter(pl.col("t_first_token_s").is_null()).select(
        "seq", "row", "order", "prompt_tokens", "error_kind", phase=pl.lit("failed"), start_s="t_sent_s",
        end_s="t_done_s")
    ok = r.filter(pl.col("t_first_token_s").is_not_null())
    parts = [ok.select("seq", "row", "order", "prompt_tokens", "error_kind", phase=pl.lit(name), start_s=a, end_s=b)
             for name, a, b in spans]
    return (pl.concat([*parts, failed]).filter(pl.col("end_s") > pl.col("start_s"))
            .with_columns(start_s=pl.col("start_s").clip(w.start_s, w.end_s),
                          end_s=pl.col("end_s").clip(w.start_s, w.end_s))
            .filter(pl.col("end_s") > pl.col("start_s")))


def stall_marks(v: RunViews, w: Window) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(stalls on shown rows, links victim → culprit row at the stall's end)."""
    rows = _rows(v, w).select("seq", "row", "order")
    s = _stalls_in(v, w)
    if s.is_empty():
        empty = pl.DataFrame(schema={"t_end_s": pl.Float64, "row": pl.String, "culprit_row": pl.String})
        return empty, empty
    marks = s.join(rows, on="seq").select(
        "seq", "row", "t_start_s", "t_end_s", "chunk_gap_ms", "cause", "prefill_induced",
        culprits=pl.col("culprits").cast(pl.List(pl.String)).list.join(", ").fill_null("–"))
    links = (s.filter(pl.col("prefill_induced")).select("seq", "t_end_s", culprit=pl.col("culprits"))
             .explode("culprit").join(rows, on="seq")
             .join(rows.select(culprit="seq", culprit_row="row"), on="culprit")
             .select("t_end_s", "row", "culprit_row", "seq", "culprit"))
    return marks, links


def excluded_spans(v: RunViews, start_s: float | None = None, end_s: float | None = None) -> pl.DataFrame:
    """start_s, end_s, what and requests: the stretches whose sends no figure counts, clipped to [start_s,
    end_s] — the declared warm-up (to the origin, 0 s), the detected warm-up (to the first measured send) and
    the detected drain (from the last measured send to the run's end)."""
    r = v.requests
    if "transient" not in r.columns or r.is_empty():
        return pl.DataFrame(schema=SPAN_SCHEMA)
    kept = r.filter(~pl.col("warmup"))["t_intended_s"]
    first, last = (float(kept.min()), float(kept.max())) if kept.len() else (0.0, v.span_s)  # type: ignore[arg-type]
    kind = (pl.when(~pl.col("transient")).then(pl.lit("declared warm-up"))
            .when(pl.col("t_intended_s") < first).then(pl.lit("detected warm-up"))
            .otherwise(pl.lit("detected drain")))
    spans = r.filter(pl.col("warmup")).group_by(what=kind).agg(start_s=pl.col("t_intended_s").min(),
                                                               requests=pl.len())
    ends = {"declared warm-up": 0.0, "detected warm-up": first, "detected drain": max(v.span_s, last)}
    spans = spans.with_columns(
        start_s=pl.when(pl.col("what") == "detected drain").then(pl.lit(last)).otherwise(pl.col("start_s")),
        end_s=pl.col("what").replace_strict(ends, return_dtype=pl.Float64))
    lo = -math.inf if start_s is None else start_s
    hi = math.inf if end_s is None else end_s
    return (spans.with_columns(start_s=pl.col("start_s").clip(lo, hi), end_s=pl.col("end_s").clip(lo, hi))
            .filter(pl.col("end_s") > pl.col("start_s")).select(list(SPAN_SCHEMA)).sort("start_s"))


SPAN_SCHEMA = {"start_s": pl.Float64, "end_s": pl.Float64, "what": pl.String, "requests": pl.UInt32}
