"""Locust users that stream with loadgen's core (the only module that imports locust or gevent).

Theory of operation: Locust keeps what it is good at — users, its web UI, master/worker distribution — and
the streaming stays on asyncio. Each Locust process runs one ``EngineThread`` (a native thread with a uvloop
loop, the lean transport and the same ``StreamTracker`` as ``loadgen run``). A user greenlet takes the next
request of its process's slice of the seeded plan (``seq % workers == index``), sleeps (gevent) until just
before its intended time, hands it to the engine thread, which sends it at that time exactly (the lean
transport holds it), and waits for the record. Lateness — no free user, a slow hand-off — is recorded as
``queue_delay_ms`` as in the asyncio engine; Locust's own pacing (``constant_throughput``) is never used.
Finished records come back to the gevent hub through one ``async_`` watcher (thread-safe), then go to the
run's sink (one process) or, batched, to the master over Locust's messaging (distributed). Each request also
fires Locust's ``request`` event: response time = TTFT (ms), length = output tokens.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time
from typing import Any, Callable

import gevent
from gevent import monkey
from gevent.event import AsyncResult
import locust
from locust import User, constant, task
from locust.argument_parser import default_args_dict
from locust.env import Environment
from locust.exception import StopUser

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import PlannedRequest
from loadgen.drivers.engine_thread import EngineThread, Preparation
from loadgen.drivers.locust_conversation import converse, next_arrival
from loadgen.drivers.locust_messages import pack

LEAD_MS = 50.0  # a request is handed to the engine thread this early (prompt building, hand-off)
RECORDS_MESSAGE, SLICE_MESSAGE, DONE_MESSAGE = "loadgen_records", "loadgen_slice", "loadgen_done"


class Handoff:
    """Calls from the engine thread, run on the gevent hub (``async_`` watchers are thread-safe)."""

    def __init__(self) -> None:
        self._calls: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.start(self._drain)

    def put(self, fn: Callable[..., None], *args: Any) -> None:
        self._calls.append((fn, args))
        self._watcher.send()

    def _drain(self) -> None:
        while self._calls:
            fn, args = self._calls.popleft()
            fn(*args)

    def close(self) -> None:
        self._watcher.stop()
        self._watcher.close()


class ProcessState:
    """One Locust process's share of the run: its slice of the plan, its engine thread, its records."""

    def __init__(self, scenario: Scenario, preparation: Preparation,
                 on_record: Callable[[RequestRecord, list[ChunkRecord]], None]) -> None:
        self.scenario, self.plan, self.on_record = scenario, preparation.plan, on_record
        self.engine = EngineThread(preparation, monkey.get_original("_thread", "start_new_thread"))
        self.handoff = Handoff()
        self.index, self.workers = 0, 1
        self.t0_ns: int | None = None
        self._next = 0  # position in this process's slice
        self.in_flight = 0
        self.sent = 0
        self.exhausted = False
        self.counts = collections.Counter()
        self.arrivals: list[list[PlannedRequest]] | None = None  # open loop, conversational: by arrival
        self.conversing = 0  # users inside a conversation (between turns nothing is in flight)

    def set_slice(self, index: int, workers: int, t0_ns: int) -> None:
        self.index, self.workers, self.t0_ns = index, workers, t0_ns
        end_s = self.plan.hard_end_s(self.scenario.load.drain_timeout_s)
        self.engine.set_hard_end(t0_ns + int(end_s * 1e9) if end_s is not None else None)
        ceiling = self.scenario.load.max_rate_per_s
        self.engine.set_rate_ceiling(ceiling / workers if ceiling is not None else None)

    def next_request(self) -> PlannedRequest | None:
        while self.t0_ns is None:
            gevent.sleep(0.01)
        seq = self.index + self._next * self.workers
        self._next += 1
        size = self.plan.size
        if (size is not None and seq >= size) or self._past_end():
            self.exhausted = True
            return None
        self.in_flight += 1  # claimed: the run is not over until it is recorded
        return self.plan.request(seq)

    def _past_end(self) -> bool:
        load = self.scenario.load
        if not self.plan.closed_loop or load.duration_s is None or self.t0_ns is None:
            return False
        return time.monotonic_ns() >= self.t0_ns + int((load.warmup_s + load.duration_s) * 1e9)

    @property
    def finished(self) -> bool:
        return self.exhausted and self.in_flight == 0 and self.conversing == 0

    def execute(self, req: PlannedRequest, t_due_ns: int | None = None,
                history: list[tuple[str, str]] | None = None) -> tuple[RequestRecord, list[ChunkRecord]]:
        """Send ``req`` at its intended time (open loop; a later turn: ``t_due_ns``) or now (closed loop, turn
        0); block this greenlet until done."""
        assert self.t0_ns is not None
        if t_due_ns is not None:
            intended = t_due_ns
            gevent.sleep(max(0.0, (intended - time.monotonic_ns()) / 1e9 - LEAD_MS / 1e3))
        elif self.plan.closed_loop:
            intended = 0  # the engine thread stamps when the body is ready
            req = _with_warmup(req, time.monotonic_ns() - self.t0_ns < self.scenario.load.warmup_s * 1e9)
        else:
            intended = self.t0_ns + req.t_intended_offset_ns
            gevent.sleep(max(0.0, (intended - time.monotonic_ns()) / 1e9 - LEAD_MS / 1e3))
        result: AsyncResult = AsyncResult()
        self.sent += 1
        self.engine.submit(req, intended, lambda rec, chunks: self.handoff.put(self._finish, rec, chunks, result),
                           history)
        return result.get()

    def _finish(self, record: RequestRecord, chunks: list[ChunkRecord], result: AsyncResult) -> None:
        """On the hub: record it even if the user that sent it was stopped meanwhile (the web UI's Stop)."""
        self.in_flight -= 1
        self.counts["cancelled" if record.error_kind == "cancelled" else "failed" if record.error_kind else "ok"] += 1
        self.on_record(record, chunks)
        result.set((record, chunks))

    def reset(self) -> None:
        """For the next run of the same process (the web UI's next Start)."""
        self._next, self.exhausted, self.t0_ns, self.sent, self.conversing = 0, False, None, 0, 0
        self.counts.clear()

    def close(self) -> None:
        self.engine.close(gevent.sleep)
        self.handoff.close()


def _with_warmup(req: PlannedRequest, warmup: bool) -> PlannedRequest:
    return dataclasses.replace(req, warmup=warmup)


class LLMUser(User):
    """One Locust user: sends the next request of its process's plan slice and waits for it to end."""

    wait_time = constant(0)
    state: ProcessState | None = None  # set by loadgen before the users start

    @task
    def one_request(self) -> None:
        state = LLMUser.state
        assert state is not None, "LLMUser.state is set by loadgen (loadgen ui / run --engine locust)"
        if state.plan.conversational:
            return self._conversation(state)
        req = state.next_request()
        if req is None:
            raise StopUser()
        record, _ = state.execute(req)
        fire_request_event(self.environment, record)


    def _conversation(self, state: ProcessState) -> None:
        turns = next_arrival(state)
        if turns is None:
            state.exhausted = True
            raise StopUser()
        state.conversing += 1
        try:
            converse(state, turns, lambda record: fire_request_event(self.environment, record))
        finally:
            state.conversing -= 1


def fire_request_event(environment: Any, record: RequestRecord) -> None:
    """Locust's tables, charts and CSV: response time = TTFT (ms; E2E when no token came), length = tokens."""
    end_ns = record.t_first_token_ns or record.t_done_ns
    exception = RuntimeError(f"{record.error_kind}: {record.error_message}") if record.error_kind else None
    environment.events.request.fire(request_type="POST", name=record.class_name,
                                    response_time=(end_ns - record.t_intended_ns) / 1e6,
                                    response_length=record.output_tokens, exception=exception, context={})


class Outbox:
    """A worker's finished records, sent to the master every ``period_s`` and when the worker stops."""

    def __init__(self, runner: Any, worker: int, period_s: float = 0.5) -> None:
        self.runner, self.worker, self.period_s = runner, worker, period_s
        self.pending: list[tuple[RequestRecord, list[ChunkRecord]]] = []
        self._loop = gevent.spawn(self._run)

    def add(self, record: RequestRecord, chunks: list[ChunkRecord]) -> None:
        self.pending.append((record, chunks))

    def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.runner.send_message(RECORDS_MESSAGE, pack(batch, self.worker))

    def _run(self) -> None:
        while True:
            gevent.sleep(self.period_s)
            self.flush()

    def close(self) -> None:
        self._loop.kill()
        self.flush()


def sleep(seconds: float) -> None:
    gevent.sleep(seconds)


def spawn(fn: Callable[..., Any], *args: Any) -> Any:
    return gevent.spawn(fn, *args)


def on_sigterm(callback: Callable[[], None]) -> None:
    """Run ``callback`` in a greenlet on SIGTERM (``kill PID``), so cleanup runs as it does on Ctrl-C."""
    import signal

    gevent.signal_handler(signal.SIGTERM, callback)


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` on gevent's pool of native threads; only the calling greenlet waits (polars releases the
    GIL for most of its work, so the users' greenlets keep their timing)."""
    return gevent.get_hub().threadpool.apply(fn, args)


def new_environment(**kwargs: Any) -> Environment:
    """A Locust environment with the LLM user (kwargs: host, parsed_options, ...)."""
    return Environment(user_classes=[LLMUser], events=locust.events, **kwargs)


def web_ui_options(**overrides: Any) -> argparse.Namespace:
    """Locust's command-line options with its defaults, as its web UI reads them (the start form's values)."""
    return argparse.Namespace(**{**default_args_dict(), **overrides})
