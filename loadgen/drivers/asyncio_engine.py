"""Theory of operation: the asyncio driver (``loadgen run``'s default engine).

Open loop: every planned request is sent at ``t0 + offset`` (absolute deadlines from the seeded plan; a slow
response never delays a later send). The scheduler sleeps until ``SPIN_MS`` before a deadline and then yields
to the loop (``sleep(0)``) until it passes, so sends are not late by asyncio's millisecond timer grain while
streams keep being read. Closed loop (``concurrency``): N workers each send the next request when their last
one ends. ``max_in_flight`` caps concurrent requests; the wait shows as ``queue_delay_ms``.

Each response's bytes go to a ``StreamTracker`` with a timestamp; nothing is parsed here. A watchdog task
enforces ``ttft_timeout_s``/``idle_timeout_s`` every 100 ms. Stopping (end of plan, Ctrl-C, SIGTERM) cancels
what is in flight; each cancelled request is still recorded, as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx

from ..core import RequestMeta, StreamTracker
from ..core.records import ChunkRecord, RequestRecord
from ..schedule import Plan, PlannedRequest
from .lean_transport import CONTEXT_KEY, StreamContext

SPIN_MS = 1.0
WATCHDOG_PERIOD_S = 0.1
START_LEAD_MS = 20.0  # t0 is this far in the future, so the first sends are not already late

BodyFor = Callable[[PlannedRequest], Awaitable[dict[str, Any]]]
OnRecord = Callable[[RequestRecord, list[ChunkRecord]], None]


@dataclass
class EngineStats:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    output_tokens: int = 0
    t0_ns: int = 0
    in_flight: dict[int, tuple[asyncio.Task[None], StreamTracker]] = field(default_factory=dict)


@dataclass
class EngineConfig:
    url: str  # full URL of the completions endpoint
    headers: dict[str, str]
    ttft_timeout_s: float
    idle_timeout_s: float
    max_in_flight: int
    duration_s: float | None  # closed loop: stop sending after warmup + duration
    warmup_s: float
    concurrency: int | None


class AsyncioEngine:
    def __init__(self, cfg: EngineConfig, plan: Plan, body_for: BodyFor, on_record: OnRecord,
                 client: httpx.AsyncClient) -> None:
        self.cfg, self.plan, self.body_for, self.on_record, self.client = cfg, plan, body_for, on_record, client
        self.stats = EngineStats()
        self._sem = asyncio.Semaphore(cfg.max_in_flight)
        self._timeouts: dict[int, tuple[str, str]] = {}
        self._stopping = False
        self._seqs = itertools.count()  # closed loop: the next plan index

    def stop(self) -> None:
        """Stop sending and cancel what is in flight (each is recorded as cancelled)."""
        self._stopping = True
        for task, _ in list(self.stats.in_flight.values()):
            task.cancel()

    async def run(self) -> EngineStats:
        self.stats.t0_ns = time.monotonic_ns() + int(START_LEAD_MS * 1e6)
        watchdog = asyncio.create_task(self._watchdog())
        try:
            if self.plan.closed_loop:
                await asyncio.gather(*(self._worker() for _ in range(self.cfg.concurrency or 1)))
            else:
                await self._open_loop()
            while self.stats.in_flight:
                await asyncio.gather(*(t for t, _ in list(self.stats.in_flight.values())), return_exceptions=True)
        finally:
            watchdog.cancel()
        return self.stats

    # ---- sending --------------------------------------------------------------------------------------
    async def _open_loop(self) -> None:
        assert self.plan.requests is not None
        for req in self.plan.requests:
            deadline = self.stats.t0_ns + req.t_intended_offset_ns
            await _sleep_until(deadline, lambda: self._stopping)
            if self._stopping:
                return
            self._spawn(req, deadline)

    async def _worker(self) -> None:
        end_ns = (self.stats.t0_ns + int((self.cfg.warmup_s + self.cfg.duration_s) * 1e9)
                  if self.cfg.duration_s is not None else None)
        await _sleep_until(self.stats.t0_ns, lambda: self._stopping)
        while not self._stopping:
            seq = next(self._seqs)
            if self.plan.size is not None and seq >= self.plan.size:
                return
            now = time.monotonic_ns()
            if end_ns is not None and now >= end_ns:
                return
            warmup = now - self.stats.t0_ns < self.cfg.warmup_s * 1e9
            req = self.plan.request(seq)
            req = PlannedRequest(req.seq, now - self.stats.t0_ns, req.class_name, req.prompt_tokens,
                                 req.output_tokens, warmup)
            task = self._spawn(req, now)
            await asyncio.gather(task, return_exceptions=True)

    def _spawn(self, req: PlannedRequest, t_intended_ns: int) -> asyncio.Task[None]:
        meta = RequestMeta(req.seq, req.class_name, req.warmup, t_intended_ns, req.prompt_tokens,
                           req.output_tokens)
        tracker = StreamTracker(meta, t_sent_ns=0)  # stamped when the request leaves
        task = asyncio.create_task(self._send(req, tracker))
        self.stats.in_flight[req.seq] = (task, tracker)
        return task

    async def _send(self, req: PlannedRequest, tracker: StreamTracker) -> None:
        status, kind, message = 0, None, None
        try:
            body = await self.body_for(req)
            async with self._sem:
                ctx = StreamContext(feed=tracker.feed)  # the lean transport stamps the send and feeds reads
                tracker.t_sent_ns = time.monotonic_ns()  # fallback for other transports (https)
                self.stats.sent += 1
                async with self.client.stream("POST", self.cfg.url, json=body, headers=self.cfg.headers,
                                              extensions={CONTEXT_KEY: ctx}) as resp:
                    tracker.t_sent_ns = ctx.t_sent_ns or tracker.t_sent_ns
                    status = resp.status_code
                    async for data in resp.aiter_raw():  # empty with the lean transport
                        tracker.feed(data, time.monotonic_ns())
        except asyncio.CancelledError:
            kind, message = self._timeouts.pop(req.seq, ("cancelled", "run stopped before the response ended"))
        except httpx.ConnectError as exc:
            kind, message = "connect", f"cannot connect: {exc}"
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError) as exc:
            kind, message = "protocol", f"connection broken: {type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            kind, message = "protocol", f"{type(exc).__name__}: {exc}"
        finally:
            self.stats.in_flight.pop(req.seq, None)
        self._record(tracker, status or 200, kind, message)

    def _record(self, tracker: StreamTracker, status: int, kind: str | None, message: str | None) -> None:
        now = time.monotonic_ns()
        if tracker.t_sent_ns == 0:  # stopped while waiting for the in-flight cap: never sent
            tracker.t_sent_ns = now
        record, chunks = tracker.finish(now, status, kind, message)
        if record.error_kind == "cancelled":
            self.stats.cancelled += 1
        elif record.error_kind:
            self.stats.failed += 1
        else:
            self.stats.completed += 1
        self.stats.output_tokens += record.output_tokens
        self.on_record(record, chunks)

    # ---- timeouts -------------------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        ttft_ns, idle_ns = int(self.cfg.ttft_timeout_s * 1e9), int(self.cfg.idle_timeout_s * 1e9)
        while True:
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            now = time.monotonic_ns()
            for seq, (task, tracker) in list(self.stats.in_flight.items()):
                if tracker.t_sent_ns == 0 or seq in self._timeouts:
                    continue  # not sent yet (waiting for the in-flight cap)
                last = tracker.pieces[-1][0] if tracker.pieces else tracker.t_sent_ns
                if now - tracker.t_sent_ns > ttft_ns and not tracker.has_content():
                    self._timeouts[seq] = ("timeout_ttft", f"no token within {self.cfg.ttft_timeout_s:g} s")
                elif now - last > idle_ns:
                    self._timeouts[seq] = ("timeout_idle", f"no bytes for {self.cfg.idle_timeout_s:g} s")
                else:
                    continue
                task.cancel()


async def _sleep_until(deadline_ns: int, stopping: Callable[[], bool]) -> None:
    coarse_s = (deadline_ns - time.monotonic_ns()) / 1e9 - SPIN_MS / 1e3
    if coarse_s > 0:
        await asyncio.sleep(coarse_s)
    while time.monotonic_ns() < deadline_ns and not stopping():
        await asyncio.sleep(0)
