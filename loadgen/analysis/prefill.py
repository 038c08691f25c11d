"""How long each long prompt's prefill took, from a run's records alone (DESIGN §5).

**Evidence per request**: the prefill of a prompt can take no longer than its ``ttft_service_ms`` (first token
minus send). Queueing makes that an overestimate, so it is lowered where the other streams show the prefill
itself: a prefill that pauses the running decodes makes their chunk gaps far longer than a decode step (the
analysis passes those gaps as ``stalls``, whether or not they pass the SLO's floor), and the **stall episode** that
began after the request was sent (within ``tol_ms``) and reached its first token (within ``tol_ms``) is how long
the engine worked for it — the one long step of an unchunked prefill (vLLM), its consecutive chunks (chunked
prefill, llama.cpp's ``n_batch`` slices) or the prefill-only batch the decodes waited for (SGLang, TGI). An
episode that began before the request was sent belongs to an earlier prefill and lowers nothing; a gap that is
not a stall (a stream that had just resumed) is no evidence at all. So one coincidence cannot collapse the
estimate, and the evidence does not need a spread of prompt lengths.

**Fit**: ``a + b·P + c·P²`` (all >= 0) through the lower envelope of the evidence against prompt length P —
the fastest request of each length bin, made monotone (prefill never gets cheaper with length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class PrefillFit:
    """prefill_ms ≈ a + b·P + c·P² on the lower envelope (P = prompt tokens)."""

    a: float
    b: float
    c: float
    points: int

    def ms(self, prompt_tokens: pl.Expr) -> pl.Expr:
        return (self.a + self.b * prompt_tokens + self.c * prompt_tokens * prompt_tokens).clip(lower_bound=0.0)

    def as_dict(self) -> dict[str, Any]:
        return {"a_ms": self.a, "b_ms_per_token": self.b, "c_ms_per_token2": self.c, "envelope_points": self.points}


def prefill_evidence(requests: pl.DataFrame, episodes: pl.DataFrame | None) -> pl.DataFrame:
    """Per completed request: ``ttft_service_ms`` lowered to its stall episode's length where one shows it."""
    ok = requests.filter(pl.col("ok") & pl.col("ttft_service_ms").is_not_null())
    if episodes is None or episodes.is_empty() or ok.is_empty():
        return ok
    return (ok.join(episodes, on=["worker", "seq"], how="left")
            .with_columns(ttft_service_ms=pl.min_horizontal("ttft_service_ms", "episode_ms")).drop("episode_ms"))


EPISODE_SCHEMA = {"worker": pl.Int64, "seq": pl.Int64, "episode_ms": pl.Float64}


def stall_episodes(requests: pl.DataFrame, stalls: pl.DataFrame, tol_ms: float,
                   cuts: pl.DataFrame | None = None) -> pl.DataFrame:
    """(worker, seq, episode_ms): the merged stalls of other streams that began after the request was sent and
    reached its first token, each within ``tol_ms``. An episode holding several prefills back to back is cut at
    the last first token of another request in ``cuts`` (the long prompts) before this one's: the engine's
    work for this request began no earlier than the previous prefill's end. An episode no longer than
    ``tol_ms`` shows nothing: it began with this request's own first token (within one step), not before it."""
    tol_ns = int(tol_ms * NS_PER_MS)
    r = requests.filter(pl.col("t_first_token_ns").is_not_null()).select(
        pl.col("worker").alias("r_worker"), pl.col("seq").alias("r_seq"), "t_sent_ns", "t_first_token_ns")
    s = stalls.select("worker", "seq", "t_start_ns", "t_end_ns")
    near = (s.join_where(r, pl.col("t_end_ns") >= pl.col("t_sent_ns") - tol_ns,
                         pl.col("t_start_ns") <= pl.col("t_first_token_ns") + tol_ns)
            .filter((pl.col("seq") != pl.col("r_seq")) | (pl.col("worker") != pl.col("r_worker")))
            .sort("r_worker", "r_seq", "t_start_ns"))
    if near.is_empty():
        return pl.DataFrame(schema=EPISODE_SCHEMA)
    reach = pl.col("t_end_ns").cum_max().shift(1).over("r_worker", "r_seq")
    merged = (near.with_columns(new=(pl.col("t_start_ns") > reach + tol_ns).fill_null(True))
              .with_columns(episode=pl.col("new").cum_sum().over("r_worker", "r_seq"))
              .group_by("r_worker", "r_seq", "episode")
              .agg(pl.col("t_start_ns").min(), pl.col("t_end_ns").max(), pl.col("t_sent_ns").first(),
                   pl.col("t_first_token_ns").first()))
    own = _cut(merged.filter((pl.col("t_start_ns") >= pl.col("t_sent_ns") - tol_ns)
                             & (pl.col("t_end_ns") >= pl.col("t_first_token_ns") - tol_ns)), cuts, tol_ns)
    ms = (pl.min_horizontal("t_end_ns", "t_first_token_ns") - pl.col("t_start_ns")) / NS_PER_MS
    # no longer than one step (tol_ms): a stall that began with this first token's step (the streams whose first
    # tokens the same step wrote, pausing for the next prefill), not one the engine spent on this prompt
    return (own.with_columns(episode_ms=ms).filter(pl.col("episode_ms") > tol_ms)
            .group_by("r_worker", "r_seq").agg(pl.col("episode_ms").min())
            .select(pl.col("r_worker").alias("worker").cast(pl.Int64), pl.col("r_seq").alias("seq").cast(pl.Int64),
                    "episode_ms"))


def _cut(episodes: pl.DataFrame, cuts: pl.DataFrame | None, tol_ns: int) -> pl.DataFrame:
    if cuts is None or cuts.is_empty() or episodes.is_empty():
        return episodes
    c = cuts.select(pl.col("worker").alias("c_worker"), pl.col("seq").alias("c_seq"),
                    pl.col("t_first_token_ns").alias("c_first_ns"))
    keys = ["r_worker", "r_seq", "episode"]
    latest = (episodes.join_where(c, pl.col("c_first_ns") > pl.col("t_start_ns"),
                                  pl.col("c_first_ns") < pl.col("t_first_token_ns") - tol_ns)
              .filter((pl.col("c_seq") != pl.col("r_seq")) | (pl.col("c_worker") != pl.col("r_worker")))
              .group_by(keys).agg(cut_ns=pl.col("c_first_ns").max()))
    return (episodes.join(latest, on=keys, how="left")
            .with_columns(t_start_ns=pl.max_horizontal("t_start_ns", "cut_ns")).drop("cut_ns"))


def fit_prefill(requests: pl.DataFrame, episodes: pl.DataFrame | None = None, bins: int = 16) -> PrefillFit:
    ok = prefill_evidence(requests, episodes).sort("prompt_tokens", "ttft_service_ms", "worker", "seq")
    if ok.is_empty():
        return PrefillFit(0.0, 0.0, 0.0, 0)
    lo, hi = ok["prompt_tokens"].min(), ok["prompt_tokens"].max()
    width = max((hi - lo) / bins, 1e-9)  # type: ignore[operator]
    quantile_bin = pl.int_range(pl.len()) * bins // pl.len()  # dense where most prompts are
    width_bin = ((pl.col("prompt_tokens") - lo) / width).floor().clip(upper_bound=bins - 1) + bins  # long tail
    points = (pl.concat([_envelope(ok, quantile_bin), _envelope(ok, width_bin)])
              .group_by("prompt_tokens").agg(pl.col("ttft_service_ms").min()).sort("prompt_tokens"))
    # Prefill never gets cheaper with length: the fastest request at P or longer bounds the cost at P. Without
    # this, a bin of equal-length requests that all waited behind a long prefill lifted the line (a = 196 ms
    # for 200-token prompts whose fastest TTFT was 20 ms).
    points = (points.with_columns(pl.col("ttft_service_ms").reverse().cum_min().reverse()).unique()
              .sort("prompt_tokens", "ttft_service_ms"))
    xs, ys = points["prompt_tokens"].cast(pl.Float64).to_list(), points["ttft_service_ms"].to_list()
    a, b, c = _nonnegative_quadratic(xs, ys)
    return PrefillFit(a, b, c, len(xs))


def _envelope(ok: pl.DataFrame, bin_expr: pl.Expr) -> pl.DataFrame:
    """The fastest request of each bin (prompt length, ttft_service_ms)."""
    return (ok.with_columns(bin=bin_expr).group_by("bin")
            .agg(pl.col("prompt_tokens").sort_by("ttft_service_ms", "prompt_tokens").first(),
                 pl.col("ttft_service_ms").min())
            .select("prompt_tokens", "ttft_service_ms"))


def _nonnegative_quadratic(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Best least-squares a + b·x + c·x² with a, b, c >= 0 (prefill never gets cheaper with length): with
    three terms, trying every subset of them is the whole active-set search."""
    best: tuple[float, tuple[float, float, float]] | None = None
    for terms in ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,)):
        if len(set(xs)) < len(terms):
            continue
        coef = _lstsq(xs, ys, terms)
        if any(v < 0 for v in coef):
            continue
        full = [0.0, 0.0, 0.0]
        for t, v in zip(terms, coef):
            full[t] = v
        err = sum((y - (full[0] + full[1] * x + full[2] * x * x)) ** 2 for x, y in zip(xs, ys))
        if best is None or err < best[0]:
            best = (err, (full[0], full[1], full[2]))
    return best[1] if best else (min(ys), 0.0, 0.0)


def _lstsq(xs: list[float], ys: list[float], powers: tuple[int, ...]) -> list[float]:
    """Least-squares coefficients of ``Σ c_k x^powers[k]`` (normal equations, x scaled for stability)."""
    scale = max(max(xs), 1.0)
    cols = [[(x / scale) ** p for x in xs] for p in powers]
    n = len(powers)
    m = [[sum(a * b for a, b in zip(cols[i], cols[j])) for j in range(n)] for i in range(n)]
    r = [sum(a * y for a, y in zip(cols[i], ys)) for i in range(n)]
    for col in range(n):  # Gaussian elimination with partial pivoting
        piv = max(range(col, n), key=lambda k: abs(m[k][col]))
        m[col], m[piv], r[col], r[piv] = m[piv], m[col], r[piv], r[col]
        if abs(m[col][col]) < 1e-12:
            return [-1.0] * n  # singular: reported as invalid (negative)
        for k in range(col + 1, n):
            f = m[k][col] / m[col][col]
            m[k] = [a - f * b for a, b in zip(m[k], m[col])]
            r[k] -= f * r[col]
    sol = [0.0] * n
    for i in reversed(range(n)):
        sol[i] = (r[i] - sum(m[i][j] * sol[j] for j in range(i + 1, n))) / m[i][i]
    return [c / scale ** p for c, p in zip(sol, powers)]


def prefill_windows(requests: pl.DataFrame, fit: PrefillFit, long_prompt_tokens: int,
                    episodes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each long prompt's prefill: ``[t_first − est, t_first]``, never before its send; ``est`` is the fit, or
    the request's own stall episode where that is longer (a fit through few lengths can fall short of one)."""
    est_ms = fit.ms(pl.col("prompt_tokens").cast(pl.Float64))
    if episodes is not None and not episodes.is_empty():
        requests = requests.join(episodes, on=["worker", "seq"], how="left")
        est_ms = pl.max_horizontal(est_ms, pl.col("episode_ms"))
    est_ns = (est_ms * NS_PER_MS).cast(pl.Int64)
    return (requests.filter(pl.col("t_first_token_ns").is_not_null())
            .select("worker", "seq", "prompt_tokens",
                    w_start_ns=pl.max_horizontal(pl.col("t_first_token_ns") - est_ns, pl.col("t_sent_ns")),
                    w_end_ns=pl.col("t_first_token_ns"))
            .filter(pl.col("prompt_tokens") >= long_prompt_tokens))
