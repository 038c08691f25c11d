"""Per-request and per-token metrics (DESIGN §4) and their summaries, recomputed from raw records.

- ``queue_delay_ms`` = t_sent − t_intended; ``ttft_ms`` = t_first_token − t_intended (coordinated omission
  corrected); ``ttft_service_ms`` = t_first_token − t_sent; ``e2e_ms`` = t_done − t_intended;
  ``tpot_ms`` = (t_last_token − t_first_token) / (output_tokens − 1).
- ``chunk_gap_ms``: between consecutive content chunks of a stream; ``itl_ms``: a gap divided by the tokens
  its later chunk carried, one sample per token (a chunk of k tokens gives k samples of gap/k).
- Reasoning (issue 38; ``t_first_answer_ns``: the first chunk not all reasoning): ``ttft_answer_ms`` =
  t_first_answer − t_intended; ``reasoning_ms`` = t_first_answer − t_first_token and ``tpot_reasoning_ms`` =
  (t_last_reasoning − t_first_token) / (reasoning_tokens − 1), for requests that reasoned; ``tpot_answer_ms`` =
  (t_last_token − t_first_answer) / (answer_tokens − 1); ``answer_tokens`` = output − reasoning tokens (tool
  calls are answer). TTFT stays the first token of any kind (MLPerf LoadGen counts reasoning fragments).
Warm-up requests are excluded from every figure; failed requests from latency figures.
"""

from __future__ import annotations

from typing import Any

import polars as pl

# the metrics and their statistics, declared once in core/vocabulary.py
from loadgen.core.vocabulary import QUANTILES as QUANTILES, REQUEST_METRICS as REQUEST_METRICS
from loadgen.core.vocabulary import STATS as STATS, TOKEN_METRICS as TOKEN_METRICS
from loadgen.core.vocabulary import METRICS, family_metrics


def with_request_metrics(requests: pl.DataFrame) -> pl.DataFrame:
    ms = 1e6
    return requests.with_columns(
        queue_delay_ms=(pl.col("t_sent_ns") - pl.col("t_intended_ns")) / ms,
        ttft_ms=(pl.col("t_first_token_ns") - pl.col("t_intended_ns")) / ms,
        ttft_service_ms=(pl.col("t_first_token_ns") - pl.col("t_sent_ns")) / ms,
        e2e_ms=(pl.col("t_done_ns") - pl.col("t_intended_ns")) / ms,
        tpot_ms=pl.when(pl.col("output_tokens") > 1)
        .then((pl.col("t_last_token_ns") - pl.col("t_first_token_ns")) / ms / (pl.col("output_tokens") - 1)),
        ok=pl.col("error_kind").is_null(),
    ).pipe(with_reasoning_metrics)


def with_reasoning_metrics(requests: pl.DataFrame) -> pl.DataFrame:
    """The reasoning family's columns (records written before issue 38 have no ``t_first_answer_ns``: as is)."""
    if "t_first_answer_ns" not in requests.columns:
        return requests
    ms, first_answer = 1e6, pl.col("t_first_answer_ns")
    reasoned = pl.col("reasoning_tokens").fill_null(0)
    answer = pl.col("output_tokens") - reasoned
    return requests.with_columns(
        ttft_answer_ms=(first_answer - pl.col("t_intended_ns")) / ms,
        reasoning_ms=pl.when(reasoned > 0).then((first_answer - pl.col("t_first_token_ns")) / ms),
        tpot_reasoning_ms=pl.when(reasoned > 1).then(
            (pl.col("t_last_reasoning_ns") - pl.col("t_first_token_ns")) / ms / (reasoned - 1)),
        tpot_answer_ms=pl.when(answer > 1).then((pl.col("t_last_token_ns") - first_answer) / ms / (answer - 1)),
        answer_tokens=answer,
    )


def families(requests: pl.DataFrame) -> tuple[str, ...]:
    """The metric families these records have: latency always; reasoning when a request reasoned; session when
    a request was a session's call."""
    out = ["latency"]
    if "reasoning_tokens" in requests.columns and bool((requests["reasoning_tokens"].fill_null(0) > 0).any()):
        out.append("reasoning")
    if "session" in requests.columns and requests["session"].null_count() < requests.height:
        out.append("session")
    return tuple(out)


def chunk_gaps(requests: pl.DataFrame, chunks: pl.DataFrame) -> pl.DataFrame:
    """One row per content chunk after a stream's first: seq, class_name, t_ns, tokens, chunk_gap_ms, itl_ms."""
    meta = requests.select("seq", "worker", "class_name", "warmup")
    return (chunks.sort("worker", "seq", "t_ns")
            .with_columns(chunk_gap_ms=(pl.col("t_ns") - pl.col("t_ns").shift(1).over("worker", "seq")) / 1e6)
            .filter(pl.col("chunk_gap_ms").is_not_null())
            .with_columns(itl_ms=pl.col("chunk_gap_ms") / pl.col("tokens"))
            .join(meta, on=["worker", "seq"], how="left"))


def itl_samples(gaps: pl.DataFrame) -> pl.Series:
    """Per-token ITL: each chunk's itl repeated once per token it carried."""
    if gaps.is_empty():
        return pl.Series("itl_ms", [], dtype=pl.Float64)
    return gaps.select(pl.col("itl_ms").repeat_by(pl.col("tokens")).explode()).to_series()


def describe(values: pl.Series) -> dict[str, float | int | None]:
    values = values.drop_nulls()
    n = len(values)
    if n == 0:
        return {k: (0 if k == "count" else None) for k in STATS}
    out: dict[str, float | int | None] = {"count": n, "mean": float(values.mean())}  # type: ignore[arg-type]
    for key, q in QUANTILES.items():
        out[key] = float(values.quantile(q, interpolation="linear"))  # type: ignore[arg-type]
    out["max"] = float(values.max())  # type: ignore[arg-type]
    return out


def measured(requests: pl.DataFrame) -> pl.DataFrame:
    return requests.filter(~pl.col("warmup"))


def metric_table(requests: pl.DataFrame, gaps: pl.DataFrame | None = None,
                 token_stats: dict[str, dict[str, Any]] | None = None, kinds: tuple[str, ...] | None = None,
                 session_stats: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Every metric's statistics; the per-token ones from ``gaps`` (its successful requests' rows), or given
    already described (``token_stats``: itl_ms and chunk_gap_ms, as ``RunAnalysis.token_stats`` makes them,
    and the reasoning phases' ITL); the session family's from ``session_stats`` (analysis/sessions.py).
    ``kinds``: the families whose rows the table has (default: those the requests have, ``families``)."""
    ok = requests.filter(pl.col("ok"))
    wanted = set(family_metrics(*(kinds if kinds is not None else families(requests))))
    out = {name: describe(ok[name] if name in ok.columns else pl.Series([], dtype=pl.Float64))
           for name in REQUEST_METRICS if name != "queue_delay_ms" and name in wanted}
    out["queue_delay_ms"] = describe(requests["queue_delay_ms"])  # the generator's lag, whatever the outcome
    if token_stats is None:
        assert gaps is not None
        ok_gaps = gaps.join(ok.select("worker", "seq"), on=["worker", "seq"], how="semi")
        token_stats = {"itl_ms": describe(itl_samples(ok_gaps)), "chunk_gap_ms": describe(ok_gaps["chunk_gap_ms"])}
    out.update(token_stats)
    out.update(session_stats or {})
    empty = describe(pl.Series([], dtype=pl.Float64))
    return {k: out.get(k, empty) for k in METRICS if k in wanted}


def window_s(requests: pl.DataFrame) -> float:
    """The measured window: first intended send to last completion of the measured requests."""
    if requests.is_empty():
        return 0.0
    return max(1e-9, (requests["t_done_ns"].max() - requests["t_intended_ns"].min()) / 1e9)  # type: ignore[operator]


def request_counts(requests: pl.DataFrame) -> dict[str, Any]:
    kinds = requests.filter(pl.col("error_kind").is_not_null()).group_by("error_kind").len().sort("error_kind")
    by_kind = {row["error_kind"]: row["len"] for row in kinds.iter_rows(named=True)}
    cancelled = by_kind.get("cancelled", 0)
    failed = sum(n for k, n in by_kind.items() if k != "cancelled")
    completed = requests.height - failed - cancelled
    return {"completed": completed, "failed": failed, "cancelled": cancelled,
            "error_rate": failed / (completed + failed) if completed + failed else 0.0,
            "errors_by_kind": dict(sorted(by_kind.items()))}


def is_good(requests: pl.DataFrame, ttft_ms: float | None, tpot_ms: float | None,
            e2e_ms: float | None) -> pl.Series:
    """Per request: finished without error within every per-request limit given (DistServe's goodput)."""
    cond = pl.col("ok")
    for name, limit in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms), ("e2e_ms", e2e_ms)):
        if limit is not None:
            cond = cond & (pl.col(name).fill_null(0.0) <= limit)
    return requests.select(cond.alias("good")).to_series()


def throughput(requests: pl.DataFrame, good: pl.Series) -> dict[str, float]:
    window = window_s(requests)
    if window == 0:
        return {"requests_per_s": 0.0, "output_tokens_per_s": 0.0, "goodput_requests_per_s": 0.0,
                "prompt_tokens_per_s": 0.0}
    ok = requests.filter(pl.col("ok"))
    return {"requests_per_s": ok.height / window,
            "output_tokens_per_s": float(ok["output_tokens"].sum()) / window,
            "goodput_requests_per_s": int(good.sum()) / window,
            "prompt_tokens_per_s": float(ok["prompt_tokens"].sum()) / window}


def fluidity(requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame, target_itl_ms: float) -> dict[str, Any]:
    """Metron's fluidity index: the share of tokens after the first that met ``t_first + i·target`` deadlines,
    slack carried forward; after a miss the schedule restarts from that token (one stall, one miss)."""
    ok = requests.filter(pl.col("ok")).select("worker", "seq")
    by_req = (chunks.lazy().join(ok.lazy(), on=["worker", "seq"], how="semi").collect()
              .sort("worker", "seq", "t_ns").group_by("worker", "seq", maintain_order=True).agg("t_ns", "tokens"))
    step = int(target_itl_ms * 1_000_000)
    met = total = 0
    for times, tokens in by_req.select("t_ns", "tokens").iter_rows():
        deadline = times[0] + step
        for i, (t, n) in enumerate(zip(times, tokens)):
            for _ in range(n if i else n - 1):
                total += 1
                if t <= deadline:
                    met += 1
                    deadline += step
                else:
                    deadline = t + step
    return {"target_itl_ms": target_itl_ms, "index": met / total if total else None, "tokens": total}
