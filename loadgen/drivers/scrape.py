"""The server's own view during a run: its Prometheus ``/metrics`` scraped every ``period_s`` into
``server_metrics.parquet`` (t_ns, name, value; one row per sample of a series of ``core/engines.py``).

Each engine's names (vLLM's ``vllm:*``, SGLang's ``sglang:*``, llama.cpp's ``llamacpp:*``, TGI's ``tgi_*``) are
mapped to one vocabulary: requests running and waiting, KV-cache usage, preemptions, prompt and generation token
counters, tokens per step and steps taken, as far as the engine exposes them. The text is fetched on the run's
loop with a client of its own (never one of the streams' connections) and read by ``core/prom_text.py``'s line
scan, which costs well under a millisecond. A target without ``/metrics`` is skipped with one warning.

``target.power_metrics`` (docs/figures.md): the GPUs' exporters, scraped on the same period into the same file
as ``gpu_power_w`` (W) and ``gpu_energy_j`` (J), each summed over every GPU of every URL at one instant: the DCGM
exporter's ``DCGM_FI_DEV_POWER_USAGE`` (W) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since boot), or
nvidia_gpu_exporter's ``nvidia_smi_power_draw_watts``. A /path is on the target's host and gets its headers; an
exporter elsewhere gets none (never the API key).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from loadgen.core.prom_text import parse_or_none, parse_power
from loadgen.core.secrets import redact_url
from loadgen.drivers.streamed_post import drop_stream

SCHEMA = {"t_ns": pl.Int64, "name": pl.String, "value": pl.Float64}


@dataclass
class PowerScraper:
    """Every power URL at each tick; one row per name summed over them all (a name some URL lacks is left
    out: a sum missing GPUs would be wrong)."""
    urls: list[tuple[str, dict[str, str]]]  # (url, headers)
    period_s: float = 0.5
    rows: list[tuple[int, str, float]] = field(default_factory=list)
    warning: str | None = None

    async def _one(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> dict[str, float] | str:
        try:
            resp = await client.get(url, headers=headers, timeout=5.0)
        except httpx.HTTPError as exc:
            return f"{redact_url(url)} unreachable ({type(exc).__name__})"
        if resp.status_code != 200:
            return f"{redact_url(url)} answered HTTP {resp.status_code}"
        values = parse_power(resp.text)
        drop_stream(resp)
        if not values:
            return f"{redact_url(url)} has no DCGM or nvidia_smi power series"
        return values

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t_ns = time.monotonic_ns()
            got = await asyncio.gather(*(self._one(client, url, headers) for url, headers in self.urls))
            failed = [g for g in got if isinstance(g, str)]
            if failed:
                self.warning = f"power metrics: {failed[0]}; no energy figures"
                return
            for name in set.intersection(*(set(g) for g in got if isinstance(g, dict))):
                self.rows.append((t_ns, name, sum(g[name] for g in got if isinstance(g, dict))))
            try:
                await asyncio.wait_for(stop.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass


@dataclass
class Scraper:
    url: str  # …/metrics
    headers: dict[str, str]
    period_s: float = 0.5
    rows: list[tuple[int, str, float]] = field(default_factory=list)
    warning: str | None = None
    verify: Any = True  # https: the run's ssl.SSLContext (target.tls)
    proxy: Any = None  # the streams' proxy (drivers/proxy.Proxy), so that scrapes take the same route
    power: list[str] = field(default_factory=list)  # target.power_metrics: scraped beside /metrics
    ready: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # the first scrape is over

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        """Scrape until ``stop`` is set; a missing or non-Prometheus /metrics ends it with ``warning``."""
        try:
            await self._every_period(client, stop)
        finally:
            self.ready.set()

    async def _every_period(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
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
            values = parse_or_none(resp.text)
            drop_stream(resp)
            if values is None or (not values and not self.rows):
                self.warning = f"server metrics: {redact_url(self.url)} has no series of a known engine (vLLM, SGLang, llama.cpp, TGI); not scraped"
                return
            self.rows += [(t_ns, k, v) for k, v in values.items()]
            self.ready.set()
            try:
                await asyncio.wait_for(stop.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass

    async def run_own_client(self, stop: asyncio.Event) -> None:
        """``run`` on a client of its own: a scrape never takes, or waits for, one of the streams' connections.
        It goes through the streams' proxy or none, never the environment's own choice (``trust_env`` off)."""
        proxy = None
        if self.proxy is not None:
            auth = {"proxy-authorization": self.proxy.authorization} if self.proxy.authorization else None
            proxy = httpx.Proxy(self.proxy.url, headers=auth)
        try:
            await self._scrape(proxy, stop)
        finally:
            self.ready.set()

    async def started(self) -> None:
        """Until the first scrape is over (answered, refused or timed out): its client built and its connection
        open. A run awaits it before its first send: the first scrape's one-time work (the client's SSL context,
        httpcore's first-use imports of anyio, its connection; a proxy's too) held the run's loop for 20-70 ms as
        the first sends fell due (issue 50: the first request through HTTP_PROXY went out 66 ms late)."""
        await self.ready.wait()

    async def _scrape(self, proxy: httpx.Proxy | None, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5.0, verify=self.verify, proxy=proxy, trust_env=False) as client:
            power = self.power_scraper()
            await asyncio.gather(self.run(client, stop), *([power.run(client, stop)] if power else []))
        if power is not None:
            self.rows += power.rows
            self.warning = "; ".join(w for w in (self.warning, power.warning) if w) or None

    def power_scraper(self) -> PowerScraper | None:
        """The scraper of ``power`` (a /path resolved on the target's host, with its headers), or None."""
        if not self.power:
            return None
        root = self.url.removesuffix("/metrics")
        urls = [(root + u, self.headers) if u.startswith("/") else (u, {}) for u in self.power]
        return PowerScraper(urls, self.period_s)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=SCHEMA, orient="row")

    def write(self, run_dir: Path) -> None:
        if self.rows:
            self.frame().write_parquet(run_dir / "server_metrics.parquet")
