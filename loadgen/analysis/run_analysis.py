"""One run's analysis inputs, computed once and kept narrow: the requests with their metric columns, and the
measured, successful requests' chunk gaps — the frame every per-token figure reads (the summary's ITL and
chunk-gap statistics, the stalls, the SLOs, the report's views, compare's samples).

The chunk source is read in slices (``BATCH_ROWS``), never whole: an hour at 50 requests/s is ≈19 M chunk
rows, 0.6 GB as written (Int64 columns), and the gaps are kept as ≈18 B a row:

- ``i`` (UInt32): the request's row in ``requests`` (its worker, seq, class and flags are looked up there);
- ``t_ns`` (Int64): when the gap ended (the chunk's stamp, as stored);
- ``gap_ns`` (Int32, or Int64 where a gap passes 2.1 s): the stamp less the stream's previous chunk's;
- ``tokens`` (UInt16, or UInt32 past 65,535): the tokens the later chunk carried.

``chunk_gap_ms`` and ``itl_ms`` are expressions over those (``wide``), exactly the values the records give
(an integer nanosecond difference, divided as a float).

**The invariant relied on** (no global sort): the records hold each request's chunks together and in the order
they were read. ``RecordSink.add`` appends one request's chunks at once (records/sink.py), parts are merged in
order (records/parts.py), the replay writes each request's chunks together (advise/replay.py), and Locust's
messages are grouped per request (drivers/locust_messages.py). It is checked as the slices are read (every
request starts once, no gap is negative); records that break it are sorted instead, as before, narrowly.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from functools import cached_property
from typing import Iterator

import polars as pl

from loadgen.analysis import metrics as m
from loadgen.analysis import steady
from loadgen.analysis.steady import SteadyWindow
from loadgen.plan.steady_spec import SteadyState

BATCH_ROWS = 100_000
KEY = ["worker", "seq"]
PHASES = ("reasoning", "answer")  # the token phases of a reasoning run (metrics itl_reasoning_ms, itl_answer_ms)
GAP_COLUMNS = {"i": pl.UInt32, "t_ns": pl.Int64, "gap_ns": pl.Int64, "tokens": pl.Int64}
CHUNK_GAP_MS = pl.col("gap_ns") / 1e6
ITL_MS = CHUNK_GAP_MS / pl.col("tokens")


class RunAnalysis:
    """A run's records, analysed once: ``requests`` (eager, one row a request) and ``chunks`` (a frame or a
    lazy scan of the chunk files, read in slices). ``steady``: the steady window (``load.steady_state``:
    detect, the default, or declared); ``measured`` is the requests in it, after the declared warm-up."""

    def __init__(self, requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame,
                 steady_state: SteadyState = "detect") -> None:
        self.requests = requests
        self.chunks = chunks.lazy()
        self.req, self.steady = steady_requests(m.with_request_metrics(requests), steady_state)
        self.measured = m.measured(self.req)
        self.families = m.families(requests)

    @property
    def t0_ns(self) -> int | None:
        """The run's time origin: the first intended send after the declared warm-up."""
        return self.steady.origin_ns

    @cached_property
    def ok_index(self) -> pl.DataFrame:
        """The measured, successful requests: worker, seq and their row ``i`` in ``req``."""
        return (self.req.with_row_index("i").filter(~pl.col("warmup") & pl.col("ok"))
                .select("worker", "seq", "i"))

    @cached_property
    def gaps(self) -> pl.DataFrame:
        """The measured, successful requests' chunk gaps (narrow: i, t_ns, gap_ns, tokens), in record order."""
        batches: list[pl.DataFrame] = []
        starts: list[pl.DataFrame] = []
        carry: pl.DataFrame | None = None
        ordered = True
        for batch in _slices(self.chunks.select("worker", "seq", "t_ns", "tokens")):
            gaps, first_rows, carry = _batch_gaps(batch, carry, self.ok_index)
            ordered = ordered and not bool((gaps["gap_ns"] < 0).any())
            batches.append(_narrow(gaps))
            starts.append(first_rows)
        every_start = pl.concat(starts) if starts else pl.DataFrame(schema={"worker": pl.Int64, "seq": pl.Int64})
        if not ordered or every_start.height != every_start.unique().height:
            batches = [_narrow(_sorted_gaps(self.chunks, self.ok_index))]  # not contiguous and time-ordered: sort
        return _joined(batches)

    @cached_property
    def meta(self) -> pl.DataFrame:
        """Per request row ``i``: worker, seq, class_name, warmup (the columns a wide gap row carries)."""
        return self.req.with_row_index("i").select("i", "worker", "seq", "class_name", "warmup")

    def wide(self, gaps: pl.DataFrame | None = None) -> pl.LazyFrame:
        """The gaps as ``metrics.chunk_gaps`` gave them (worker, seq, t_ns, tokens, chunk_gap_ms, itl_ms,
        class_name, warmup), lazily: each request column is looked up by ``i`` only where a query uses it."""
        g = self.gaps if gaps is None else gaps
        meta = {c: pl.lit(self.meta[c]).gather(pl.col("i")).alias(c) for c in ("worker", "seq", "class_name",
                                                                                "warmup")}
        return g.lazy().select(meta["worker"], meta["seq"], pl.col("t_ns"), pl.col("tokens").cast(pl.Int64),
                               CHUNK_GAP_MS.alias("chunk_gap_ms"), ITL_MS.alias("itl_ms"), meta["class_name"],
                               meta["warmup"])

    def with_keys(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (with a request row ``i``) with that request's worker and seq in front."""
        return frame.select(self.meta["worker"].gather(frame["i"]), self.meta["seq"].gather(frame["i"]),
                            pl.all())

    def stall_candidates(self, baseline: dict[str, float], factor: float, floor_ms: float) -> pl.DataFrame:
        """The gaps (narrow) that ``spikes.find_stalls`` can keep: its own test, on the narrow columns (the
        same floats), so that the wide rows are made only for these."""
        if len(baseline) == 1 and self.classes == list(baseline):
            base = pl.lit(next(iter(baseline.values())), dtype=pl.Float64)
        else:
            per_request = self.meta["class_name"].replace_strict(baseline, default=0.0, return_dtype=pl.Float64)
            base = pl.lit(per_request).gather(pl.col("i"))
        threshold = pl.max_horizontal(factor * base, pl.lit(floor_ms))
        keep = CHUNK_GAP_MS - (pl.col("tokens").cast(pl.Int64) - 1) * base > threshold
        return self.gaps.filter(keep)

    @cached_property
    def classes(self) -> list[str]:
        return sorted(set(self.meta["class_name"].gather(self.gaps["i"].unique()).to_list()))

    def class_gaps(self, name: str) -> pl.DataFrame:
        """One class's gaps (all of them when the run has one class)."""
        if self.classes == [name]:
            return self.gaps
        rows = self.meta.filter(pl.col("class_name") == name).select("i")
        return self.gaps.join(rows, on="i", how="semi", maintain_order="left")

    def token_stats(self, class_name: str | None = None) -> dict[str, dict[str, float | int | None]]:
        """``itl_ms`` (per token) and ``chunk_gap_ms`` as ``metrics.metric_table`` describes them: the run's,
        or one class's (the run's own when it is its only class; none when it has no gaps)."""
        if class_name is not None and self.classes != [class_name]:
            return {**_token_stats(self.class_gaps(class_name)), **self._phase_stats(class_name)}
        if "_token_stats" not in self.__dict__:
            self.__dict__["_token_stats"] = {**_token_stats(self.gaps), **self._phase_stats(None)}
        return self.__dict__["_token_stats"]

    def _phase_stats(self, class_name: str | None) -> dict[str, dict[str, float | int | None]]:
        """``itl_reasoning_ms`` and ``itl_answer_ms`` (a run that reasoned; none otherwise)."""
        if "reasoning" not in self.families:
            return {}
        whole = self.gaps if class_name is None else self.class_gaps(class_name)
        out = {}
        for phase in PHASES:
            g = self.phase_gaps(phase, whole)
            out[f"itl_{phase}_ms"] = m.describe(itl_per_token(g))
        return out

    def phase_gaps(self, phase: str, gaps: pl.DataFrame | None = None) -> pl.DataFrame:
        """The gaps of one phase (``reasoning`` | ``answer``), split by each request's ``t_first_answer_ns``: a
        gap ending before it is reasoning (or any gap of a request with reasoning tokens and no answer), one
        ending after it answer (interleaved reasoning after the answer included); the gap ending AT the first
        answer chunk is the transition, inside time to first answer, and in neither phase."""
        g = self.gaps if gaps is None else gaps
        if "t_first_answer_ns" not in self.req.columns:
            return g if phase == "answer" else g.head(0)
        first = pl.lit(self.req["t_first_answer_ns"]).gather(pl.col("i"))
        reasoned = pl.lit(self.req["reasoning_tokens"].fill_null(0) > 0).gather(pl.col("i"))
        keep = ((pl.col("t_ns") < first) | (first.is_null() & reasoned) if phase == "reasoning"
                else pl.col("t_ns") > first)
        return g.filter(keep.fill_null(False))

    def phase_run(self, phase: str) -> "RunAnalysis":
        """This analysis with only one phase's gaps (the token-level intervals read ``gaps``)."""
        view = copy.copy(self)
        view.__dict__ = {k: v for k, v in self.__dict__.items() if k not in ("_token_stats", "classes")}
        view.__dict__["gaps"] = self.phase_gaps(phase)
        return view


def steady_requests(req: pl.DataFrame, steady_state: SteadyState) -> tuple[pl.DataFrame, SteadyWindow]:
    """``req`` with the steady window applied, and the window (analysis/steady.py). ``transient``: cut by
    detection; ``warmup`` becomes "outside the measured set" (the declared warm-up, or ``transient``), so that
    every reader of it (the gaps, compare's samples, the report's views) takes the same requests."""
    req = whole_sessions(req, "warmup")
    declared = m.measured(req)
    window = steady.detect(declared) if steady_state == "detect" else steady.declared(declared)
    cut = ~pl.col("warmup") & window.outside(pl.col("t_intended_ns"))
    out = whole_sessions(req.with_columns(transient=cut), "transient")
    return out.with_columns(warmup=pl.col("warmup") | pl.col("transient")), _recounted(out, window)


def _recounted(req: pl.DataFrame, window: SteadyWindow) -> SteadyWindow:
    """The window's cut counts once whole sessions were cut: a request (a session by its first call) intended
    before the window's start is warm-up, any other cut one drain."""
    if "session" not in req.columns or req["session"].null_count() == req.height:
        return window
    first = pl.col("t_intended_ns").min().over("worker", "session")
    start = pl.when(pl.col("session").is_not_null()).then(first).otherwise(pl.col("t_intended_ns"))
    early = start < window.start_ns if window.start_ns is not None else pl.lit(False)
    cut = req.select(pl.col("transient").sum().alias("all"), (pl.col("transient") & early).sum().alias("early"))
    total, warm = (int(x) for x in cut.row(0))
    return dataclasses.replace(window, warmup=warm, drain=total - warm)


def whole_sessions(req: pl.DataFrame, flag: str) -> pl.DataFrame:
    """``flag`` made one value per agentic session: its first call's (by intended send), so that a session is
    kept or cut whole — a session whose first call is warm-up (or before the steady window) is cut, one that
    started inside is kept to its end. Requests of no session keep their own."""
    if "session" not in req.columns or req["session"].null_count() == req.height:
        return req
    first = pl.col(flag).sort_by("t_intended_ns").first().over("worker", "session")
    return req.with_columns(pl.when(pl.col("session").is_not_null()).then(first).otherwise(pl.col(flag))
                            .alias(flag))


def _token_stats(g: pl.DataFrame) -> dict[str, dict[str, float | int | None]]:
    gap = describe_gap_ms(g)
    # a chunk of one token: its itl is its gap (x / 1.0 is x), so where every chunk carried one, one describe
    itl = dict(gap) if bool((g["tokens"] == 1).all()) else m.describe(itl_per_token(g))
    return {"itl_ms": itl, "chunk_gap_ms": gap}


def gap_ms(gap_ns: list[int], dtype: pl.DataType) -> list[float]:
    """chunk_gap_ms of these gap_ns values, computed as the column is (the same floats)."""
    return pl.DataFrame({"gap_ns": gap_ns}, schema={"gap_ns": dtype}).select(CHUNK_GAP_MS).to_series().to_list()


def describe_gap_ms(g: pl.DataFrame) -> dict[str, float | int | None]:
    """``metrics.describe`` of chunk_gap_ms, from the integer gaps: the mean over the floats, each order
    statistic the float of the integer at its rank (gap_ns → ms is monotone), interpolated as polars'
    ``quantile(q, "linear")`` does; the floats are never sorted (half the memory)."""
    n = g.height
    if n == 0:
        return m.describe(pl.Series([], dtype=pl.Float64))
    # the mean over one contiguous column, as the summary always took it (a sum over chunks differs in its
    # last bits): the integers made contiguous (4 B a row), then the floats
    ints = g["gap_ns"].rechunk()
    mean = pl.DataFrame({"gap_ns": ints}).select(CHUNK_GAP_MS.mean()).item()
    ranks = {key: (n - 1.0) * q for key, q in m.QUANTILES.items()}
    wanted = sorted({r for f in ranks.values() for r in (int(f), min(math.ceil(f), n - 1))} | {n - 1})
    ints = ints.sort().gather(wanted).to_list()
    at = dict(zip(wanted, gap_ms(ints, g.schema["gap_ns"])))
    out: dict[str, float | int | None] = {"count": n, "mean": float(mean)}
    for key, f in ranks.items():
        lo, hi = at[int(f)], at[min(math.ceil(f), n - 1)]
        out[key] = lo if lo == hi else (f - int(f)) * (hi - lo) + lo
    out["max"] = at[n - 1]
    return out


def itl_per_token(gaps: pl.DataFrame) -> pl.Series:
    """Per-token ITL of narrow gaps: each chunk's itl once per token it carried (no repeat where every chunk
    carried one token)."""
    if gaps.is_empty():
        return pl.Series("itl_ms", [], dtype=pl.Float64)
    if bool((gaps["tokens"] == 1).all()):
        return gaps.select(ITL_MS.alias("itl_ms")).to_series().rechunk()
    return gaps.select(ITL_MS.alias("itl_ms").repeat_by(pl.col("tokens")).explode()).to_series().rechunk()


def _slices(chunks: pl.LazyFrame) -> Iterator[pl.DataFrame]:
    rows = chunks.select(pl.len()).collect().item()
    for offset in range(0, rows, BATCH_ROWS):
        yield chunks.slice(offset, BATCH_ROWS).collect()


def _batch_gaps(batch: pl.DataFrame, carry: pl.DataFrame | None,
                ok: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """One slice's gaps (the previous slice's last row ``carry`` in front), the (worker, seq) of each stream
    that starts in it, and its own last row."""
    frame = pl.concat([carry, batch]) if carry is not None else batch
    same = (pl.col("worker") == pl.col("worker").shift(1)) & (pl.col("seq") == pl.col("seq").shift(1))
    marked = frame.with_columns(same=same.fill_null(False))
    firsts = marked.slice(1 if carry is not None else 0).filter(~pl.col("same")).select(KEY)
    gaps = (marked.with_columns(gap_ns=pl.col("t_ns") - pl.col("t_ns").shift(1)).filter(pl.col("same"))
            .join(ok, on=KEY, how="inner", maintain_order="left").select(list(GAP_COLUMNS)))
    return gaps, firsts, (batch.tail(1) if batch.height else carry)


def _sorted_gaps(chunks: pl.LazyFrame, ok: pl.DataFrame) -> pl.DataFrame:
    """Gaps of records that are not contiguous per request: the ok requests' chunks sorted by stream, then
    time (ties kept in record order)."""
    frame = (chunks.select("worker", "seq", "t_ns", "tokens").join(ok.lazy(), on=KEY, how="semi")
             .collect().sort("worker", "seq", "t_ns", maintain_order=True))
    gaps, _, _ = _batch_gaps(frame, None, ok)
    return gaps


def _narrow(gaps: pl.DataFrame) -> pl.DataFrame:
    """gap_ns and tokens in the narrowest type that holds them exactly (Int32, UInt16), else Int64."""
    gap_max, tok_min, tok_max = gaps.select(pl.col("gap_ns").max(), pl.col("tokens").min().alias("lo"),
                                            pl.col("tokens").max()).row(0)
    gap_type = pl.Int32 if (gap_max or 0) < 2**31 else pl.Int64
    tok_type = pl.UInt16 if 0 <= (tok_min or 0) and (tok_max or 0) < 2**16 else pl.Int64
    return gaps.with_columns(pl.col("gap_ns").cast(gap_type), pl.col("tokens").cast(tok_type))


def _joined(batches: list[pl.DataFrame]) -> pl.DataFrame:
    """The batches as one frame (each column in the widest type a batch needed)."""
    if not batches:
        return pl.DataFrame(schema={"i": pl.UInt32, "t_ns": pl.Int64, "gap_ns": pl.Int32, "tokens": pl.UInt16})
    types = {c: ({b.schema[c] for b in batches}) for c in ("gap_ns", "tokens")}
    wide = {c: pl.Int64 for c, t in types.items() if len(t) > 1}
    out = pl.concat([b.with_columns([pl.col(c).cast(t) for c, t in wide.items()]) for b in batches], rechunk=False)
    batches.clear()
    return out
