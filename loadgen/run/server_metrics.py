"""The server's own view during a run: its Prometheus ``/metrics`` scraped every ``period_s`` into
``server_metrics.parquet`` (t_ns, name, value; one row per sample of the series below).

Each engine's names (vLLM's ``vllm:*``, SGLang's ``sglang:*``, llama.cpp's ``llamacpp:*``, TGI's ``tgi_*``) are
mapped to one vocabulary in ``engines.py``: requests running and waiting, KV-cache usage, preemptions, prompt
and generation token counters, tokens per step and steps taken, as far as the engine exposes them. The text is
fetched on the run's loop with a client of its own (never one of the streams' connections) and read by a line
scan that costs well under a millisecond. A target without ``/metrics`` is skipped with one warning.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from loadgen.core.engines import PREFIXES, SERIES
from loadgen.core.secrets import redact_url

if TYPE_CHECKING:  # the scraper's client; the analysis imports this module for its pure helpers, not httpx
    import httpx

SCHEMA = {"t_ns": pl.Int64, "name": pl.String, "value": pl.Float64}


def parse(text: str) -> dict[str, float]:
    """The series above from one text exposition, summed over label sets (e.g. per model or engine).

    A line scan rather than prometheus_client's parser: vLLM's exposition is ~55 kB, mostly histogram buckets,
    which that parser takes ~12 ms to read (holding the GIL); this takes well under a millisecond, so it runs on
    the loop itself. Raises ValueError on a sample line of ours whose value is not a number."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIXES):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        key = SERIES.get(name)
        if key is None:
            continue
        try:
            value = float(rest.split()[0])  # an optional timestamp may follow
        except (ValueError, IndexError):
            raise ValueError(f"bad sample line: {line[:120]}") from None
        out[key] = out.get(key, 0.0) + value
    return out


@dataclass
class Scraper:
    url: str  # …/metrics
    headers: dict[str, str]
    period_s: float = 0.5
    rows: list[tuple[int, str, float]] = field(default_factory=list)
    warning: str | None = None
    verify: Any = True  # https: the run's ssl.SSLContext (target.tls)

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        """Scrape until ``stop`` is set; a missing or non-Prometheus /metrics ends it with ``warning``."""
        import httpx
        while not stop.is_set():
            t_ns = time.monotonic_ns()
            try:
                resp = await client.get(self.url, headers=self.headers, timeout=5.0)
            except httpx.HTTPError as exc:
                self.warning = f"server metrics: {redact_url(self.url)} unreachable ({type(exc).__name__}); not scraped"
                return
            if resp.status_code != 200:
                self.warning = f"server metrics: {redact_url(self.url)} answered HTTP {resp.status_code}; not scraped"
                return
            values = _parse_or_none(resp.text)
            if values is None or (not values and not self.rows):
                self.warning = f"server metrics: {redact_url(self.url)} has no series of a known engine (vLLM, SGLang, llama.cpp, TGI); not scraped"
                return
            self.rows += [(t_ns, k, v) for k, v in values.items()]
            try:
                await asyncio.wait_for(stop.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass

    async def run_own_client(self, stop: asyncio.Event) -> None:
        """``run`` on a client of its own: a scrape never takes, or waits for, one of the streams' connections."""
        import httpx

        async with httpx.AsyncClient(timeout=5.0, verify=self.verify) as client:
            await self.run(client, stop)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=SCHEMA, orient="row")

    def write(self, run_dir: Path) -> None:
        if self.rows:
            self.frame().write_parquet(run_dir / "server_metrics.parquet")


def _parse_or_none(text: str) -> dict[str, float] | None:
    try:
        return parse(text)
    except ValueError:
        return None


def load(run_dir: Path) -> pl.DataFrame | None:
    path = run_dir / "server_metrics.parquet"
    return pl.read_parquet(path) if path.exists() else None


def wide(metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per scrape: t_ns and a column per series."""
    return metrics.pivot(on="name", index="t_ns", values="value", aggregate_function="sum").sort("t_ns")


def preemption_windows(metrics: pl.DataFrame | None) -> list[tuple[int, int]]:
    """(t_prev_ns, t_ns) of every scrape interval in which the preemption counter rose."""
    if metrics is None or metrics.is_empty():
        return []
    p = metrics.filter(pl.col("name") == "preemptions_total").sort("t_ns")
    if p.height < 2:
        return []
    rose = p.with_columns(prev_t=pl.col("t_ns").shift(1), prev_v=pl.col("value").shift(1)).filter(
        pl.col("value") > pl.col("prev_v"))
    return list(zip(rose["prev_t"].to_list(), rose["t_ns"].to_list()))


def summary_of(metrics: pl.DataFrame | None) -> dict[str, Any]:
    if metrics is None or metrics.is_empty():
        return {}
    w = wide(metrics)
    out: dict[str, Any] = {"scrapes": w.height}
    for col in ("running", "waiting", "kv_cache_usage"):
        if col in w.columns:
            out[f"{col}_max"] = float(w[col].max())  # type: ignore[arg-type]
    if "preemptions_total" in w.columns:
        out["preemptions"] = float(w["preemptions_total"].max() - w["preemptions_total"].min())  # type: ignore
    return out
