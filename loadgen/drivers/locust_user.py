"""Locust users that stream with loadgen's core (the only module that imports locust or gevent).

Theory of operation: Locust keeps what it is good at — users, its web UI, master/worker distribution — and
the streaming stays on asyncio. Each Locust process runs one ``EngineThread`` (a native thread with a uvloop
loop, the lean transport and the same ``StreamTracker`` as ``loadgen run``). A user greenlet takes the next
request of its process's slice of the seeded plan (``seq % workers == index``), sleeps (gevent) until just
before its intended time, hands it to the engine thread, which sends it at that time exactly (the lean
transport holds it), and waits for the record. Lateness — no free user, a slow hand-off — is recorded as
``queue_delay_ms`` as in the asyncio engine; Locust's own pacing (``constant_throughput``) is never used.
Finished records come back to the gevent hub through one ``async_`` watcher (thread-safe), then go to the
run's sink (one process) or, batched, to the master over Locust's messaging. Each request also fires Locust's
``request`` event (time = TTFT ms, length = output tokens). Every wait has a deadline (plan/deadlines.py).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import signal
import time
from typing import Any, Callable

import gevent
from gevent import monkey
from gevent.event import AsyncResult
import locust
from locust import LoadTestShape, User, constant, task
from locust.argument_parser import default_args_dict
from locust.env import Environment
from locust.exception import StopUser

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import PlannedRequest
from loadgen.drivers.engine_thread import Done, EngineThread, Preparation, Turn
from loadgen.drivers.locust_conversation import converse, next_arrival
from loadgen.drivers.locust_messages import fire_request_event
from loadgen.plan.deadlines import ORPHAN_S
from loadgen.plan.slicing import PlanSlice

LEAD_MS = 50.0  # a request is handed to the engine thread this early (prompt building, hand-off)


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
        self.slice = PlanSlice(self.plan, scenario)
        self.abandoned = 0  # answers not waited for past the give-up point (an engine thread that never said)
        self.in_flight, self.sent, self.exhausted = 0, 0, False
        self.counts = collections.Counter()
        self.arrivals: list[list[PlannedRequest]] | None = None  # open loop, conversational: by arrival
        self.conversing = 0  # users inside a conversation (between turns nothing is in flight)

    def set_slice(self, index: int, workers: int, t0_ns: int) -> None:
        self.slice.start(index, workers, t0_ns)
        self.engine.set_hard_end(self.slice.hard_end_ns())
        ceiling = self.scenario.load.max_rate_per_s
        self.engine.set_rate_ceiling(ceiling / workers if ceiling is not None else None)

    def next_request(self) -> PlannedRequest | None:
        if not self.wait_for_slice():
            return None
        seq = self.slice.take_position()
        size = self.plan.size
        if (size is not None and seq >= size) or self.slice.sending_over(time.monotonic_ns()):
            self.exhausted = True
            return None
        self.in_flight += 1  # claimed: the run is not over until it is recorded
        return self.plan.request(seq)

    def wait_for_slice(self) -> bool:
        """Until this process has its slice (False: none came within ``ORPHAN_S``; the slice is then over)."""
        deadline = time.monotonic() + ORPHAN_S
        while self.slice.t0_ns is None:
            if time.monotonic() > deadline:
                self.exhausted = True
                return False
            gevent.sleep(0.01)
        return True

    @property
    def finished(self) -> bool:
        return self.exhausted and self.in_flight == 0 and self.conversing == 0

    def execute(self, req: PlannedRequest, t_due_ns: int | None = None,
                history: list[tuple[str, str]] | None = None) -> Done:
        """Send ``req`` at its intended time (open loop; a later turn: ``t_due_ns``) or now (closed loop, turn
        0); block this greenlet until done."""
        t0_ns = self.slice.t0_ns
        assert t0_ns is not None
        if t_due_ns is not None:
            intended = t_due_ns
            gevent.sleep(max(0.0, (intended - time.monotonic_ns()) / 1e9 - LEAD_MS / 1e3))
        elif self.plan.closed_loop:
            intended = 0  # the engine thread stamps when the body is ready
            req = _with_warmup(req, time.monotonic_ns() - t0_ns < self.scenario.load.warmup_s * 1e9)
        else:
            intended = t0_ns + req.t_intended_offset_ns
            gevent.sleep(max(0.0, (intended - time.monotonic_ns()) / 1e9 - LEAD_MS / 1e3))
        result: AsyncResult = AsyncResult()
        self.sent += 1
        self.engine.submit(req, intended, lambda rec, chunks, turn: self.handoff.put(self._finish, rec, chunks, turn,
                                                                                   result), history)
        give_up_ns = self.slice.give_up_ns()
        wait_s = None if give_up_ns is None else max(0.0, (give_up_ns - time.monotonic_ns()) / 1e9)
        try:
            return result.get(timeout=wait_s)
        except gevent.Timeout:  # the engine thread never answered by the give-up point: this user stops
            self.abandoned += 1
            raise StopUser() from None

    def _finish(self, record: RequestRecord, chunks: list[ChunkRecord], turn: Turn | None,
                result: AsyncResult) -> None:
        """On the hub: record it even if the user that sent it was stopped meanwhile (the web UI's Stop)."""
        self.in_flight -= 1
        self.counts["cancelled" if record.error_kind == "cancelled" else "failed" if record.error_kind else "ok"] += 1
        self.on_record(record, chunks)
        result.set(Done(record, chunks, turn))

    def reset(self) -> None:
        """For the next run of the same process (the web UI's next Start)."""
        gc.collect()  # the last run's cycles (no automatic collection while the engine serves: quiet_runtime)
        self.exhausted, self.sent, self.conversing, self.abandoned = False, 0, 0, 0
        self.slice.reset()
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
        record = state.execute(req).record
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


def sleep(seconds: float) -> None:
    gevent.sleep(seconds)


def spawn(fn: Callable[..., Any], *args: Any) -> Any:
    return gevent.spawn(fn, *args)


def joined(group: Any, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a greenlet group (a Locust runner's) to end; True when it has."""
    group.join(timeout=timeout_s)
    return len(group) == 0


def every(period_s: float, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` every ``period_s`` on a greenlet of its own; returns what stops it."""
    def loop() -> None:
        while True:
            gevent.sleep(period_s)
            fn()
    return gevent.spawn(loop).kill


def within(timeout_s: float, fn: Callable[..., Any], *args: Any) -> bool:
    """Call ``fn`` here, abandoned after ``timeout_s`` (a runner's quit: no deadline of its own); True if in time."""
    timer = gevent.Timeout.start_new(timeout_s)
    try:
        fn(*args)
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        return False
    finally:
        timer.cancel()
    return True


def on_signals(callback: Callable[[str], None]) -> None:
    """``callback("SIGTERM" | "Ctrl-C")`` in a greenlet, not an exception where the process is (gevent prints it)."""
    for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")):
        gevent.signal_handler(signum, callback, name)


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` on gevent's native threads; only the calling greenlet waits (polars mostly frees the GIL)."""
    return gevent.get_hub().threadpool.apply(fn, args)


def new_environment(**kwargs: Any) -> Environment:
    """A Locust environment with the LLM user (kwargs: host, parsed_options, ...)."""
    return Environment(user_classes=[LLMUser], events=locust.events, **kwargs)


def web_ui_options(**overrides: Any) -> argparse.Namespace:
    """Locust's command-line options with its defaults, as its web UI reads them (the start form's values)."""
    return argparse.Namespace(**{**default_args_dict(), **overrides})
