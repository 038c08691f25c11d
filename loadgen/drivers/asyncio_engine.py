"""Theory of operation: the asyncio driver (``loadgen run``'s default engine).

Open loop: every planned request is sent at ``t0 + offset`` (absolute deadlines from the seeded plan; a slow
response never delays a later send). The scheduler sleeps until ``SPIN_MS`` before a deadline and then yields
to the loop (``sleep(0)``) until it passes, so sends are not late by asyncio's millisecond timer grain while
streams keep being read. Closed loop (``concurrency``, drivers/closed_loop.py): N users each send the next request when their last
one ends; its body is built while the last one streams (a prompt counted by the server's ``/tokenize``, one in
a sample: plan/prompt_model.py, costs no wait then), and the intended time is when it is ready to go.
``max_in_flight`` caps concurrent requests; the wait shows as ``queue_delay_ms``. Each open-loop request's body
is serialized before its deadline and sent ``send_ahead_ms`` early; the lean transport holds the bytes until
the deadline.

Each response's bytes go to a ``StreamTracker`` with a timestamp; nothing is parsed here. A watchdog task
checks every request in flight every 100 ms and cancels, with its reason, one that passed ``ttft_timeout_s``
(``timeout_ttft``), ``idle_timeout_s`` (``timeout_idle``) or ``request_timeout_s`` (``timeout_request``), or whose
stream broke the SSE size cap (``protocol``). The run has a hard end, known before the first send: the last
planned send (closed loop: the end of warm-up + duration) plus ``drain_timeout_s``; whatever is still in flight
then is cancelled with that reason, so a server that trickles tokens forever cannot hold the run open. Stopping
(end of plan, Ctrl-C, SIGTERM) cancels what is in flight; each cancelled request is still recorded, as
``cancelled``. A request whose body cannot be prepared is recorded, never raised: ``protocol`` when the server
failed it (/tokenize mid-run), else ``internal``, as any exception while a request is sent or read. With
``capture``, a failed response as received (heads as sent, body as fed: up to 64 KiB) goes with the record.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any, Awaitable, Callable

import httpx

from loadgen.core.tracker import StreamTracker
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.plan.request_bodies import output_cap
from loadgen.plan.schedule import Plan, PlannedRequest
from loadgen.drivers.timing import RateCeiling, error_kind, overdue, preparation_error, quiet_runtime, sleep_until
from loadgen.drivers.schedulers import CallFor, TurnFor, make_scheduler
from loadgen.drivers.engine_config import EngineConfig, EngineStats
from loadgen.drivers.sender import Outcome, finish_tracker, request_meta
from loadgen.drivers.closed_loop import closed_loop_user
from loadgen.drivers.fast_parse import FAST_PARSERS
from loadgen.drivers.streamed_post import StreamContext, direct_post, send_post

WATCHDOG_PERIOD_S = 0.1
START_LEAD_MS = 20.0  # t0 is this far in the future, so the first sends are not already late

BodyFor = Callable[[PlannedRequest], Awaitable[dict[str, Any]]]
OnRecord = Callable[[RequestRecord, list[ChunkRecord], str], None]  # and a conversation turn's answer
OnCapture = Callable[[RequestRecord, bytes], None]


class AsyncioEngine:
    def __init__(self, cfg: EngineConfig, plan: Plan, body_for: BodyFor, on_record: OnRecord,
                 client: httpx.AsyncClient, turn_for: TurnFor | None = None, capture: OnCapture | None = None,
                 call_for: CallFor | None = None) -> None:
        self.cfg, self.plan, self.body_for, self.on_record, self.client = cfg, plan, body_for, on_record, client
        self.capture = capture
        self.conversations = make_scheduler(self, turn_for, call_for)  # sessions', or conversations', or none
        self.stats = EngineStats()
        self._sem = asyncio.Semaphore(cfg.max_in_flight)
        self._timeouts: dict[int, tuple[str, str]] = {}
        self._stop_sending, self._seqs = False, itertools.count()  # closed loop: the next plan index
        self.hard_end_ns: int | None = None  # the run's hard end (monotonic ns): what is in flight then is cut
        self.t0_ns: int | None = None  # a given start (monotonic ns): --workers' one start for every process
        self._owns_schedule = False  # True: at the hard end it also stops sending (Locust owns its schedule)
        self.ceiling = RateCeiling(cfg.max_rate_per_s)
        self._direct = direct_post(client, cfg.url, cfg.headers)  # the lean transport's path, no httpx objects

    def stop(self, reason: str | None = None, drain: bool = False) -> None:
        """Stop sending and cancel what is in flight (each is recorded as cancelled, with ``reason``); ``drain``:
        let it end instead, by the run's hard end at the latest (``load.until: decided``: run/until.py)."""
        self._stop_sending = True
        for seq, (task, _) in [] if drain else list(self.stats.in_flight.items()):
            if reason is not None:
                self._timeouts.setdefault(seq, ("cancelled", reason))
            task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop_sending

    def next_seq(self) -> int:
        return next(self._seqs)

    async def send(self, req: PlannedRequest, t_intended_ns: int, body: bytes, after: int | None = None) -> Outcome:
        """Send ``req`` now and stream it to its end (drivers/sender.py's port, for the schedulers)."""
        task = self.spawn(req, t_intended_ns, body, after)
        tracker = self.stats.in_flight[req.seq][1]
        await asyncio.gather(task, return_exceptions=True)
        return Outcome(tracker.record, tracker.answer if tracker.meta.keep_text else "", tracker.tool_calls)

    async def run(self) -> EngineStats:
        with quiet_runtime():  # its collections before and after are not the run's: measured inside
            cpu0, wall0 = time.process_time(), time.monotonic()
            try:
                return await self._run()
            finally:
                self.stats.cpu_s, self.stats.wall_s = time.process_time() - cpu0, time.monotonic() - wall0

    async def _run(self) -> EngineStats:
        self.stats.t0_ns = self.t0_ns or time.monotonic_ns() + int(START_LEAD_MS * 1e6)
        end_s = self.plan.hard_end_s(self.cfg.drain_timeout_s)
        self.hard_end_ns = self.stats.t0_ns + int(end_s * 1e9) if end_s is not None else None
        self._owns_schedule = True
        watchdog = asyncio.create_task(self._watchdog())
        try:
            if self.plan.closed_loop:
                await asyncio.gather(*(closed_loop_user(self) for _ in range(self.cfg.concurrency or 1)))
            else:
                await self._open_loop()
            if self.conversations:
                await self.conversations.wait()
            while self.stats.in_flight:
                await asyncio.gather(*(t for t, _ in list(self.stats.in_flight.values())), return_exceptions=True)
        finally:
            watchdog.cancel()
        return self.stats

    def start_watchdog(self) -> asyncio.Task[None]:  # the Locust driver's entry: one request at a time
        return asyncio.create_task(self._watchdog())

    async def execute_one(self, req: PlannedRequest, t_intended_ns: int, body: bytes) -> None:
        """Send ``req`` at ``t_intended_ns`` and stream it to the end; the record goes to ``on_record``."""
        await sleep_until(t_intended_ns - int(self.cfg.send_ahead_ms * 1e6), lambda: self._stop_sending)
        await self.spawn(req, t_intended_ns, body)

    async def _open_loop(self) -> None:
        assert self.plan.requests is not None
        for req in self.plan.requests:
            deadline = self.stats.t0_ns + req.t_intended_offset_ns
            if req.conversation is not None or req.session is not None:  # its unit's task sends every one
                if req.turn == 0 and self.conversations:
                    self.conversations.start(req, deadline)
                continue
            body = await self._body(req, deadline)  # built before the deadline, not after it
            await sleep_until(deadline - int(self.cfg.send_ahead_ms * 1e6), lambda: self._stop_sending)
            if self._stop_sending:
                return
            if body is not None:
                self.spawn(req, deadline, body)

    async def _body(self, req: PlannedRequest, t_intended_ns: int) -> bytes | None:
        """The request's JSON body; None (the request recorded as failed) when it cannot be built."""
        body = await self.build(req)
        if isinstance(body, Exception):
            self.record_failure(req, t_intended_ns, body)
            return None
        return body

    async def build(self, req: PlannedRequest) -> bytes | Exception:
        """The request's JSON body, or what stopped it being built (recorded by the caller, when it is due)."""
        try:
            return json.dumps(await self.body_for(req)).encode()
        except Exception as exc:  # noqa: BLE001 - a fault during the run is a counted error, never a crash
            return exc

    def record_failure(self, req: PlannedRequest, t_intended_ns: int, exc: Exception) -> None:
        """Record ``req`` as failed, never sent (its body could not be prepared; a bug unless a ServerFault)."""
        tracker = StreamTracker(request_meta(req, t_intended_ns), t_sent_ns=t_intended_ns)
        self._record(tracker, 0, *preparation_error(exc))

    def spawn(self, req: PlannedRequest, t_intended_ns: int, body: bytes,
               after_call: int | None = None) -> asyncio.Task[None]:
        tracker = StreamTracker(request_meta(req, t_intended_ns, after_call), 0, self.cfg.max_event_bytes, self.cfg.api,
                                FAST_PARSERS.get(self.cfg.api))  # t_sent stamped when the request leaves
        # what bounds the usage a server may claim (core/usage_claims.py): the body's size, its max_tokens
        tracker.meta.body_bytes = len(body)
        tracker.meta.output_cap = output_cap(self.plan.scenario, self.plan.class_of(req.class_name), req.output_tokens)
        task = asyncio.create_task(self._send(req, tracker, body))
        task.add_done_callback(lambda done: self._unstarted(done, req.seq, tracker))
        self.stats.in_flight[req.seq] = (task, tracker)
        return task

    def _unstarted(self, task: asyncio.Task[None], seq: int, tracker: StreamTracker) -> None:
        """A task cancelled before its coroutine ran never reached _send's ``try``: its record, here, once."""
        if task.cancelled() and self.stats.in_flight.get(seq, (None,))[0] is task:
            del self.stats.in_flight[seq]
            self._record(tracker, 0, *self._timeouts.pop(seq, ("cancelled", "run stopped before it was sent")))

    async def _send(self, req: PlannedRequest, tracker: StreamTracker, body: bytes) -> None:
        status, kind, message = 0, None, None  # the lean transport holds it until its time, stamps the send
        ctx = StreamContext(feed=tracker.feed, not_before_ns=tracker.meta.t_intended_ns,
                            raw=bytearray() if self.capture is not None else None)
        try:
            async with self._sem:
                tracker.t_sent_ns = time.monotonic_ns()  # until the transport's own stamp (other transports)
                self.stats.sent += 1
                status = await send_post(self.client, self._direct, self.cfg.url, self.cfg.headers, body, ctx,
                                         self.cfg.follow_redirects)
        except asyncio.CancelledError:
            kind, message = self._timeouts.pop(req.seq, ("cancelled", "run stopped before the response ended"))
        except Exception as exc:  # noqa: BLE001 - httpx's faults, and any bug of ours: a record, never a crash
            kind, message = error_kind(exc)
            status = getattr(exc, "status", 0)  # a redirect's
        finally:
            self.stats.in_flight.pop(req.seq, None)
            tracker.t_sent_ns = ctx.t_sent_ns or tracker.t_sent_ns
        record = self._record(tracker, status or 200, kind, message, ctx)
        if ctx.raw is not None and record.error_kind not in (None, "cancelled") and self.capture is not None:
            self.capture(record, bytes(ctx.raw))

    def _record(self, tracker: StreamTracker, status: int, kind: str | None, message: str | None,
                ctx: StreamContext | None = None) -> RequestRecord:
        """Finish the tracker's records, with what the transport measured (``ctx``), and hand them on."""
        now = time.monotonic_ns()
        if tracker.t_sent_ns == 0:  # stopped while waiting for the in-flight cap: never sent
            tracker.t_sent_ns = now
        record, chunks = finish_tracker(tracker, now, status, kind, message, ctx)  # status 0: nothing came back
        self.stats.count(record)
        self.on_record(record, chunks, tracker.answer if tracker.meta.keep_text else "")
        return record

    # ---- timeouts -------------------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            now = time.monotonic_ns()
            if self.hard_end_ns is not None and now >= self.hard_end_ns:
                self.hard_end_ns = None
                self._end_run()
            for seq, (task, tracker) in list(self.stats.in_flight.items()):
                if tracker.t_sent_ns == 0 or seq in self._timeouts:
                    continue  # not sent yet (waiting for the in-flight cap)
                reason = overdue(tracker, self.cfg, now)
                if reason is not None:
                    self._timeouts[seq] = reason
                    task.cancel()

    def _end_run(self) -> None:
        """The hard end: cancel what is in flight, saying why (and stop sending, when this engine schedules)."""
        self.stats.cut_at_end += len(self.stats.in_flight)
        reason = ("cancelled", f"still in flight {self.cfg.drain_timeout_s:g} s after the last send "
                  "(load.drain_timeout_s): cut at the run's end")
        for seq, (task, _) in list(self.stats.in_flight.items()):
            self._timeouts.setdefault(seq, reason)
            task.cancel()
        if self._owns_schedule:
            self._stop_sending = True

