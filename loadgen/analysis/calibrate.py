"""The server's costs, fitted from a run's own records: the simulator's cost model (``local_target/sim``'s
``EngineConfig``) made to match the measured server. Pure: polars and numpy over the records.

- **Decode step** ≈ base + per_seq × n + per_kv_token × K, where n is the number of streams decoding when a
  step ended and K their summed context (prompt + tokens so far). Each chunk gap gives one sample (its ITL: a
  chunk of k tokens spans k steps); steps in which another request got its first token held a prefill and
  are left out; the median per batch size is fitted, non-negative least squares weighted by the samples.
- **Prefill** ≈ a + b·P + c·P² from the stall analysis's ``prefill_fit`` (the lower envelope of each request's
  prefill evidence, ``analysis/prefill.py``): compute per prompt token ≈ b, attention ≈ 2c (Σ positions ≈ P²/2),
  and a − base is a fixed cost per request outside the engine's steps (HTTP, tokenizing), replayed as a delay
  before the request reaches the engine.
- **Step noise**: what the decode fit leaves unexplained in each sample (measured ITL − fitted step), kept as
  ``NOISE_QUANTILES`` quantiles; the replay adds one drawn at random to every step, so a server whose steps
  jitter (a CPU, a busy host) has the same tail of ordinary steps in the replay as in the run.
- **Held deliveries**: a gap that ends in a burst of ``BURST_CHUNKS`` or more chunks of one stream within
  ``BURST_WINDOW_MS`` is not an engine step: the tokens were made in time and held between the engine and the
  reader (a starved API-server process, a busy client), then delivered at once. Those gaps and the burst's are
  left out of the fit, and counted, since the replay does not model them.
- **KV capacity** from the scraped ``kv_cache_usage``: the streams' summed context over the usage, at each
  scrape; without it, from the context held when the preemption counter rose; else unknown (no limit).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis.metrics import chunk_gaps

MIN_BIN_SAMPLES = 5
MIN_CLEAN_SAMPLES = 300
BURST_CHUNKS = 5
BURST_WINDOW_MS = 1.0
NOISE_QUANTILES = 200
NS_PER_MS = 1e6


@dataclass(frozen=True)
class DecodeFit:
    base_ms: float
    per_seq_ms: float
    per_kv_token_ms: float
    samples: int
    batch_sizes: int  # distinct batch sizes fitted

    def ms(self, n: float, kv_tokens: float) -> float:
        return self.base_ms + self.per_seq_ms * n + self.per_kv_token_ms * kv_tokens


@dataclass
class Calibration:
    """The fitted cost model in the simulator's terms (``cost``), what it was fitted from, and notes on
    what the records could not show."""

    cost: dict[str, float]
    arrival_delay_ms: float
    kv_cache_tokens: int | None
    decode: DecodeFit
    prefill: dict[str, float]
    step_noise_ms: list[float] = field(default_factory=list)  # quantiles of the decode fit's residuals
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        noise = np.array(self.step_noise_ms or [0.0])
        return {"cost": self.cost, "arrival_delay_ms": self.arrival_delay_ms,
                "kv_cache_tokens": self.kv_cache_tokens, "decode_fit": asdict(self.decode),
                "prefill_fit": self.prefill, "notes": self.notes,
                "step_noise_ms": {"p1": float(np.quantile(noise, 0.01)), "p50": float(np.quantile(noise, 0.5)),
                                  "p99": float(np.quantile(noise, 0.99))}}


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with every coefficient >= 0: the best of the unconstrained fits over each
    subset of free coefficients whose solution is feasible (exact for the few columns used here)."""
    sw = np.sqrt(w)
    best, best_sse = np.zeros(x.shape[1]), float(np.sum(w * y * y))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            sol, *_ = np.linalg.lstsq(x[:, cols] * sw[:, None], y * sw, rcond=None)
            if (sol < 0).any():
                continue
            coef = np.zeros(x.shape[1])
            coef[list(cols)] = sol
            sse = float(np.sum(w * (y - x @ coef) ** 2))
            if sse < best_sse - 1e-12:
                best, best_sse = coef, sse
    return best


def _active(ok: pl.DataFrame, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At each time: streams decoding (first token < t <= last token) and their summed context, each stream's
    context growing linearly from prompt + 1 at its first token to prompt + output at its last."""
    first = ok["t_first_token_ns"].to_numpy().astype(np.float64)
    last = ok["t_last_token_ns"].to_numpy().astype(np.float64)
    out = ok["output_tokens"].to_numpy().astype(np.float64)
    span = np.maximum(last - first, 1.0)
    beta = np.where(last > first, (out - 1) / span, 0.0)
    alpha = ok["prompt_tokens"].to_numpy().astype(np.float64) + 1 - beta * first
    by_first, by_last = np.argsort(first), np.argsort(last)
    i_first = np.searchsorted(first[by_first], t_ns, side="left")
    i_last = np.searchsorted(last[by_last], t_ns, side="left")

    def summed(values: np.ndarray) -> np.ndarray:
        a = np.concatenate([[0.0], np.cumsum(values[by_first])])
        b = np.concatenate([[0.0], np.cumsum(values[by_last])])
        return a[i_first] - b[i_last]

    n = summed(np.ones_like(first))
    return n, summed(alpha) + t_ns * summed(beta)


def with_bursts(chunks: pl.DataFrame) -> pl.DataFrame:
    """The chunks with ``burst_start`` (the first of ``BURST_CHUNKS`` or more of its stream within
    ``BURST_WINDOW_MS``: the gap before it was a held delivery) and ``in_burst`` (it or a later chunk of one)."""
    window_ns = int(BURST_WINDOW_MS * NS_PER_MS)
    by_stream = ("worker", "seq")
    return (chunks.sort(*by_stream, "t_ns")
            .with_columns(burst_start=(pl.col("t_ns").shift(-(BURST_CHUNKS - 1)).over(by_stream) - pl.col("t_ns"))
                          .le(window_ns).fill_null(False)
                          & (pl.col("t_ns") - pl.col("t_ns").shift(1).over(by_stream)).gt(window_ns).fill_null(True))
            .with_columns(until=pl.when("burst_start").then(pl.col("t_ns") + window_ns).cum_max().over(by_stream))
            .with_columns(in_burst=pl.col("until").is_not_null() & (pl.col("t_ns") <= pl.col("until")))
            .drop("until"))


def held_deliveries(requests: pl.DataFrame, chunks: pl.DataFrame) -> pl.Series:
    """The gap (ms) before each burst: a stream's tokens held in delivery, then handed over at once."""
    gaps = chunk_gaps(requests, with_bursts(chunks))
    return gaps.filter("burst_start")["chunk_gap_ms"]


def decode_samples(requests: pl.DataFrame, chunks: pl.DataFrame, tol_ms: float = 1.0) -> pl.DataFrame:
    """One row per chunk gap of a pure decode step: n (decoding streams), kv_tokens, itl_ms.

    A gap during which another request was waiting for its first token (sent, not yet answered) may hold
    that request's prefill, whole, chunked or as a batch of its own (SGLang, TGI): it is left out. When that
    leaves fewer than ``MIN_CLEAN_SAMPLES`` (a server that always has a queue), only the gaps that end with
    another request's first token are left out."""
    ok = requests.filter(pl.col("ok") & pl.col("t_first_token_ns").is_not_null() & (pl.col("output_tokens") > 1))
    if ok.is_empty():
        return pl.DataFrame(schema={"n": pl.Float64, "kv_tokens": pl.Float64, "itl_ms": pl.Float64})
    gaps = chunk_gaps(ok, with_bursts(chunks.join(ok.select("worker", "seq"), on=["worker", "seq"], how="semi")))
    gaps = gaps.filter(~pl.col("in_burst"))  # held deliveries are not engine steps
    t_end = gaps["t_ns"].to_numpy().astype(np.float64)
    t_start = t_end - gaps["chunk_gap_ms"].to_numpy() * NS_PER_MS
    answered = requests.filter(pl.col("t_first_token_ns").is_not_null())
    sent = np.sort(answered["t_sent_ns"].to_numpy().astype(np.float64))
    firsts = np.sort(answered["t_first_token_ns"].to_numpy().astype(np.float64))
    tol_ns = tol_ms * NS_PER_MS
    # requests whose [sent, first token] overlaps the gap: sent before its end, answered after its start
    waiting = np.searchsorted(sent, t_end, side="left") - np.searchsorted(firsts, t_start + tol_ns, side="right")
    ended = (np.searchsorted(firsts, t_end + tol_ns, side="right")
             - np.searchsorted(firsts, t_end - tol_ns, side="left")) > 0
    n, kv = _active(ok, t_end)
    frame = pl.DataFrame({"n": n, "kv_tokens": kv, "itl_ms": gaps["itl_ms"].to_numpy(), "waiting": waiting > 0,
                          "ended": ended}).filter(pl.col("n") >= 1)
    clean = frame.filter(~pl.col("waiting"))
    if clean.height < MIN_CLEAN_SAMPLES:
        clean = frame.filter(~pl.col("ended"))
    return clean.drop("waiting", "ended")


def fit_decode(samples: pl.DataFrame) -> DecodeFit:
    """Median ITL per batch size, fitted as base + per_seq × n + per_kv_token × K (all >= 0)."""
    bins = (samples.group_by(pl.col("n").round(0)).agg(pl.col("itl_ms").median(), pl.col("kv_tokens").mean(),
                                                       count=pl.len())
            .filter(pl.col("count") >= MIN_BIN_SAMPLES).sort("n"))
    if bins.is_empty():
        median = float(samples["itl_ms"].median() or 0.0) if samples.height else 0.0  # type: ignore[arg-type]
        return DecodeFit(median, 0.0, 0.0, samples.height, 0)
    y, w = bins["itl_ms"].to_numpy(), bins["count"].to_numpy().astype(np.float64)
    x = np.column_stack([np.ones(bins.height), bins["n"].to_numpy(), bins["kv_tokens"].to_numpy()])
    if bins.height < 3:
        x = x[:, :1]
    coef = np.concatenate([nonnegative_lstsq(x, y, w), np.zeros(3)])[:3]
    return DecodeFit(float(coef[0]), float(coef[1]), float(coef[2]), samples.height, bins.height)


def step_noise(samples: pl.DataFrame, fit: DecodeFit) -> list[float]:
    """``NOISE_QUANTILES`` evenly spaced quantiles of measured ITL − fitted step over the decode samples."""
    if samples.is_empty():
        return []
    residual = samples["itl_ms"].to_numpy() - np.array(
        [fit.ms(n, kv) for n, kv in zip(samples["n"].to_list(), samples["kv_tokens"].to_list())])
    probs = (np.arange(NOISE_QUANTILES) + 0.5) / NOISE_QUANTILES
    return [float(v) for v in np.quantile(residual, probs)]


def kv_capacity(requests: pl.DataFrame, server: pl.DataFrame | None) -> tuple[int | None, str | None]:
    """KV-cache capacity in tokens, and how it was found (None: unknown)."""
    if server is None or server.is_empty():
        return None, None
    ok = requests.filter(pl.col("ok") & pl.col("t_first_token_ns").is_not_null())
    usage = server.filter((pl.col("name") == "kv_cache_usage") & (pl.col("value") >= 0.05)).sort("t_ns")
    if usage.height and ok.height:
        _, held = _active(ok, usage["t_ns"].to_numpy().astype(np.float64))
        ratio = held / usage["value"].to_numpy()
        ratio = ratio[held > 0]
        if len(ratio):
            return int(np.median(ratio)), f"kv_cache_usage ({len(ratio)} scrapes)"
    return None, None


def calibrate(requests: pl.DataFrame, chunks: pl.DataFrame, prefill_fit: dict[str, float],
              server: pl.DataFrame | None = None) -> Calibration:
    """Fit the simulator's cost model to a run (``requests`` with ``with_request_metrics``' columns)."""
    samples = decode_samples(requests, chunks)
    decode = fit_decode(samples)
    a = float(prefill_fit.get("a_ms", 0.0))
    b = float(prefill_fit.get("b_ms_per_token", 0.0))
    c = float(prefill_fit.get("c_ms_per_token2", 0.0))
    notes = []
    if decode.batch_sizes < 3:
        notes.append("the run held too few batch sizes to fit decode cost against batch size: decode steps are "
                     "replayed at their median length")
    if b <= 0:
        notes.append("no prefill cost per token could be fitted (no spread of prompt lengths or stalls)")
    cost = {"overhead_ms": 0.0, "weights_read_ms": decode.base_ms,
            "compute_ms_per_token": max(b - c - decode.per_kv_token_ms, 0.0),
            "decode_ms_per_token": decode.per_seq_ms, "attention_ms_per_token2": 2 * c,
            "kv_read_ms_per_token": decode.per_kv_token_ms}
    held = held_deliveries(requests, chunks)
    if held.len():
        notes.append(f"{held.len()} gap(s) in the run were held deliveries, the tokens then arriving at once "
                     f"(worst {held.max():,.0f} ms): not engine steps, left out of the fit and not replayed")
    kv_tokens, source = kv_capacity(requests, server)
    if kv_tokens is None:
        notes.append("KV-cache capacity unknown (no kv_cache_usage of 5 % or more scraped): the replay assumes the "
                     "cache never fills (no preemption)")
    else:
        notes.append(f"KV-cache capacity {kv_tokens:,} tokens, from {source}")
    return Calibration(cost, max(a - decode.base_ms, 0.0), kv_tokens, decode,
                       {"a_ms": a, "b_ms_per_token": b, "c_ms_per_token2": c}, step_noise(samples, decode), notes)
