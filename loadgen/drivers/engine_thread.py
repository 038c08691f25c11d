"""The asyncio engine on a native thread, for drivers whose own world is not asyncio (Locust's gevent).

Theory of operation: the thread runs a uvloop loop (libuv does the socket I/O, so gevent's monkey-patching of
``socket``/``select`` in the same process does not reach it) with one httpx client on the lean transport and
one ``AsyncioEngine`` used request by request (``execute_one``). A caller hands a planned request over with
``submit``; the body is built on the loop (a prompt in the counted sample waits for the server's /tokenize,
plan/prompt_model.py; the others are built locally), the request leaves at its intended time exactly as in
``loadgen run``, and ``on_done(record, chunks)`` is called *on the engine thread* when it ends: the caller
must hand the result back to its own world thread-safely.

This module imports neither locust nor gevent; the thread is started with a function the caller supplies
(under gevent, the original ``_thread.start_new_thread``). What to send is prepared by the run stage's
``Preparation`` (run/prepare.py), the same path as ``loadgen run``'s, handed in by the caller. Its records carry
the transport's ``connect_ns`` and ``t_headers_ns`` as ``loadgen run``'s do; it runs no loop sampler
(``loadgen run``'s runner does), so a Locust run has no client_metrics.parquet.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import httpx

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.drivers.asyncio_engine import AsyncioEngine, EngineConfig
from loadgen.drivers.scrape import Scraper
from loadgen.drivers.timing import RateCeiling, quiet_runtime
from loadgen.plan.deadlines import SHUTDOWN_S
from loadgen.plan.schedule import Plan, PlannedRequest

Turn = tuple[str, str]  # a conversation turn's message and the answer received
OnDone = Callable[[RequestRecord, list[ChunkRecord], Turn | None], None]


class Done(NamedTuple):
    """A handed-over request's end, back in the caller's world: its records, and a conversation turn's message
    and answer (None for a request outside a conversation)."""
    record: RequestRecord
    chunks: list[ChunkRecord]
    turn: Turn | None


@dataclass
class Submitted:
    """A request handed over and not yet recorded: whom to tell, and a conversation turn's message."""
    on_done: OnDone
    message: str = ""


class Prepared(Protocol):
    """A run ready to send (run/prepare.py's ``Prepared``)."""

    target: Any  # the resolved target: model, headers, ``redact``

    def engine_config(self) -> EngineConfig: ...

    async def turn(self, req: PlannedRequest, history: list[tuple[str, str]]) -> tuple[dict[str, Any], str]: ...


class Preparation(Protocol):
    """How to get there (run/prepare.py's ``Preparation``)."""

    plan: Plan
    capture: Any  # None, or where failed responses go as received (the engine's ``capture``)

    def open_client(self) -> httpx.AsyncClient: ...

    async def prepare(self, client: httpx.AsyncClient) -> Prepared: ...


class EngineThread:
    def __init__(self, preparation: Preparation,
                 start_thread: Callable[[Callable[[], None], tuple[()]], Any]) -> None:
        self.preparation, self.plan = preparation, preparation.plan
        self.loop: asyncio.AbstractEventLoop | None = None
        self.target: Any = None  # the resolved target, once ready
        self.error: BaseException | None = None  # set if the target could not be resolved
        self.ready = False
        self.closed = False
        self._submitted: dict[int, Submitted] = {}  # by seq, until its record
        self._pending: set[asyncio.Task[None]] = set()  # submitted, not yet sent (waiting for their time)
        self._hard_end_ns: int | None = None
        self._ceiling_per_s: float | None = None
        start_thread(self._main, ())

    # ---- caller side (any thread) ---------------------------------------------------------------------
    def wait_ready(self, sleep: Callable[[float], None], timeout_s: float = 60.0) -> Any:
        """Until the target is resolved and prompts can be built; raises what stopped it. ``sleep`` is the
        caller's own (gevent's under Locust): plain flags, no lock shared with a monkey-patched world."""
        deadline = time.monotonic() + timeout_s
        while not (self.ready or self.error) and time.monotonic() < deadline:
            sleep(0.01)
        if self.error is not None:
            raise self.error
        if not self.ready or self.target is None:
            raise TimeoutError(f"the engine thread was not ready within {timeout_s:g} s")
        return self.target

    def submit(self, req: PlannedRequest, t_intended_ns: int, on_done: OnDone,
               history: list[tuple[str, str]] | None = None) -> None:
        """Send ``req`` (a conversation's turn: with ``history``; ``on_done`` then gets its message and the
        answer received)."""
        loop = self.loop
        assert loop is not None
        self._submitted[req.seq] = Submitted(on_done)
        loop.call_soon_threadsafe(self._start_one, req, t_intended_ns, history)

    def _start_one(self, req: PlannedRequest, t_intended_ns: int, history: list[tuple[str, str]] | None) -> None:
        task = self.loop.create_task(self._one(req, t_intended_ns, history))  # type: ignore[union-attr]
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def set_hard_end(self, t_ns: int | None) -> None:
        """This run's hard end (monotonic ns; None: none): requests still in flight then are cancelled."""
        self._hard_end_ns = t_ns  # applied when the engine exists, if it does not yet
        if self.loop is not None and self.ready:
            self.loop.call_soon_threadsafe(self._apply_limits)

    def set_rate_ceiling(self, per_s: float | None) -> None:
        """This process's share of ``load.max_rate_per_s`` (closed loop), applied before the next send."""
        self._ceiling_per_s = per_s
        if self.loop is not None and self.ready:
            self.loop.call_soon_threadsafe(self._apply_limits)

    def _apply_limits(self) -> None:
        """On the loop's thread: the hard end and the rate ceiling the caller set last."""
        self.engine.hard_end_ns = self._hard_end_ns
        self.engine.ceiling = RateCeiling(self._ceiling_per_s)

    @property
    def cut_at_end(self) -> int:
        """Requests this thread's engine cancelled at the run's hard end (0 before it is ready)."""
        return self.engine.stats.cut_at_end if self.ready else 0

    def cancel_in_flight(self) -> None:
        """Cancel every request in flight (each is recorded as cancelled); later submits still go."""
        loop = self.loop
        if loop is not None and not self.closed:
            loop.call_soon_threadsafe(self._cancel_all)

    def _cancel_all(self) -> None:
        if not self.ready:
            return
        for task in list(self._pending):
            task.cancel()
        for task, _ in list(self.engine.stats.in_flight.values()):
            task.cancel()

    def close(self, sleep: Callable[[float], None], timeout_s: float = 10.0) -> None:
        """Cancel what is in flight (recorded as cancelled) and stop the thread."""
        if self.loop is not None and not self.closed:
            self.loop.call_soon_threadsafe(self._stop.set)
            deadline = time.monotonic() + timeout_s
            while not self.closed and time.monotonic() < deadline:
                sleep(0.01)

    def start_scraper(self, scraper: Scraper) -> None:
        """Scrape the server's /metrics on this thread's loop until ``stop_scraper``."""
        loop = self.loop
        assert loop is not None
        self._scrape_done = False
        loop.call_soon_threadsafe(self._start_scrape, scraper)

    def stop_scraper(self, sleep: Callable[[float], None], timeout_s: float = 10.0) -> None:
        if self.loop is None or self.closed or self._scrape_done:
            return
        self.loop.call_soon_threadsafe(lambda: self._scrape_stop.set())
        deadline = time.monotonic() + timeout_s
        while not self._scrape_done and time.monotonic() < deadline:
            sleep(0.01)

    def _start_scrape(self, scraper: Scraper) -> None:
        self._scrape_stop = asyncio.Event()

        async def scrape() -> None:
            try:
                await scraper.run_own_client(self._scrape_stop)
            finally:
                self._scrape_done = True

        self.loop.create_task(scrape())  # type: ignore[union-attr]

    _scrape_done = True

    def _main(self) -> None:
        try:
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        try:
            with quiet_runtime():  # no collection on the users' thread holds the GIL past a token (fidelity.md)
                self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            self.error = exc
        finally:
            self.loop.close()
            self.closed = True

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.preparation.open_client() as client:
            self.prepared = await self.preparation.prepare(client)
            self.target = self.prepared.target
            self.engine = self._engine(client)
            self._apply_limits()
            watchdog = self.engine.start_watchdog()
            self.ready = True
            await self._stop.wait()
            self.engine.stop()
            self._cancel_all()  # what waits for its time, and what is in flight (recorded as cancelled)
            await asyncio.gather(*self._pending, return_exceptions=True)
            in_flight = [task for task, _ in self.engine.stats.in_flight.values()]
            if in_flight:  # on the tasks, not the engine's table: a task cancelled before it ran stays in it
                await asyncio.wait(in_flight, timeout=SHUTDOWN_S)
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)  # none left pending when the loop closes

    def _engine(self, client: httpx.AsyncClient) -> AsyncioEngine:
        target = self.target

        async def no_body(req: PlannedRequest) -> dict[str, Any]:  # bodies are built in _one
            raise AssertionError("unused")

        def on_record(record: RequestRecord, chunks: list[ChunkRecord], answer: str) -> None:
            record.error_message = target.redact(record.error_message)  # the worker's records leave by message
            submitted = self._submitted.pop(record.seq, None)
            if submitted is not None:
                turn = (submitted.message, answer) if record.conversation is not None else None
                submitted.on_done(record, chunks, turn)

        return AsyncioEngine(self.prepared.engine_config(), self.plan, no_body, on_record, client,
                             capture=self.preparation.capture)

    async def _one(self, req: PlannedRequest, t_intended_ns: int, history: list[tuple[str, str]] | None) -> None:
        try:
            body, message = await self.prepared.turn(req, history or [])
            if req.seq in self._submitted:
                self._submitted[req.seq].message = message
        except Exception as exc:  # noqa: BLE001 - e.g. /tokenize failed mid-run: a record, and on_done runs
            self.engine.record_failure(req, t_intended_ns if t_intended_ns > 0 else time.monotonic_ns(), exc)
            return
        if t_intended_ns <= 0:  # closed loop: intended = when the body is ready and the ceiling lets it go
            await self.engine.ceiling.wait()
            t_intended_ns = time.monotonic_ns()
        await self.engine.execute_one(req, t_intended_ns, json.dumps(body).encode())
