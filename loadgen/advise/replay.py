"""A run's plan replayed through the simulator's scheduler in virtual time: the same requests (lengths,
classes, send times or closed-loop users) through ``local_target.sim.engine.Engine``, whose steps last what
the cost model says; the result is records in the run's own schema, so every figure is computed by the same
analysis as a measured run. Pure: no clock, no sockets; seconds of traffic replay in a fraction of that.

Open loop: a request is sent at its intended time, or when one of ``max_in_flight`` slots frees (as the
driver does). Closed loop: ``concurrency`` users each send their next request when the last one ends. A request
reaches the engine ``arrival_delay_ms`` after it is sent (the fixed cost outside the engine's steps); requests
that arrive during a step wait for the next one; an idle engine starts at the arrival. Anything still running
``drain_timeout_s`` after the last send is cancelled, as a measured run does. Each step lasts the cost model's
time plus one of ``step_noise_ms`` drawn by the seeded generator (never less than half the model's time).

``replay_observed`` injects faults on purpose (server errors, network delay, loadgen's loop blocked) and returns
what a real run would have observed beside the records (server scrapes, client metrics, response headers) and
the simulator's trace as the truth (``replay_observe.py``); ``replay`` is it with none of that.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from local_target.sim.config import EngineConfig
from local_target.sim.engine import Engine, SimRequest, Step
from loadgen.advise.replay_observe import NO_FAULTS, Observer, ReplayFaults, client_rows
from loadgen.core.records import REQUEST_COLUMNS, ChunkRecord, RequestRecord

NS_PER_MS = 1_000_000
MAX_STEPS = 5_000_000
# Called after each engine step with the step, its start and end (ns from the replay's start: ``t0_ns`` is not
# added, unlike the records) and the (request, token index) pairs it emitted: the replay's ground truth, as the
# simulator's trace holds it for a real run.
OnStep = Callable[[Step, int, int, list[tuple[SimRequest, int]]], None]


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    seq: int
    worker: int
    class_name: str
    warmup: bool
    t_intended_ns: int  # from the run's start
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ReplayLoad:
    closed_loop_users: int | None  # None: open loop
    max_in_flight: int
    arrival_delay_ms: float
    drain_timeout_s: float
    step_noise_ms: tuple[float, ...] = ()
    seed: int = 0


class _Sends:
    """Which request goes out next and when (the client side)."""

    def __init__(self, requests: list[ReplayRequest], load: ReplayLoad) -> None:
        self.queue = deque(sorted(requests, key=lambda r: (r.t_intended_ns, r.worker, r.seq)) if
                           load.closed_loop_users is None else sorted(requests, key=lambda r: (r.worker, r.seq)))
        self.slots = load.closed_loop_users or load.max_in_flight
        self.closed = load.closed_loop_users is not None
        self.free_at: list[int] = [0] * self.slots  # heap of the times slots free up
        self.last_send_ns = 0

    def due(self, t_ns: int) -> list[tuple[ReplayRequest, int]]:
        """The requests sent by ``t_ns``, each with its send time."""
        out = []
        while self.queue and self.free_at and self.free_at[0] <= t_ns:
            req = self.queue[0]
            t_send = self.free_at[0] if self.closed else max(req.t_intended_ns, self.free_at[0])
            if t_send > t_ns:
                break
            heapq.heappop(self.free_at)
            self.queue.popleft()
            self.last_send_ns = t_send
            out.append((req, t_send))
        return out

    def next_time(self) -> int | None:
        if not self.queue or not self.free_at:
            return None
        return self.free_at[0] if self.closed else max(self.queue[0].t_intended_ns, self.free_at[0])

    def done(self, t_ns: int) -> None:
        heapq.heappush(self.free_at, t_ns)


@dataclass
class _Flight:
    req: ReplayRequest
    sim: SimRequest
    t_sent_ns: int
    t_arrival_ns: int
    tokens: list[int]  # when loadgen read each token (its emission, or the end of the hog it fell in)
    error: bool = False
    delay_ms: float = 0.0
    t_headers_ns: int | None = None  # read; None: the request never reached the engine
    t_done_ns: int | None = None  # an error's answer, read


@dataclass
class Replayed:
    """A replay's records and what a real run would have observed beside them (``replay_observe.py``): the
    server's scrapes and loadgen's client metrics as (t_ns, name, value) rows, each request's ``t_headers_ns``
    (worker, seq), and the simulator's trace as truth. Every instant is on the records' clock (``t0_ns`` added)."""
    records: list[RequestRecord]
    chunks: list[ChunkRecord]
    server: list[tuple[int, str, float]]
    client: list[tuple[int, str, float]]
    headers_ns: dict[tuple[int, int], int]
    trace: list[dict[str, Any]]


def replay(cfg: EngineConfig, requests: list[ReplayRequest], load: ReplayLoad, t0_ns: int = 0,
           on_step: OnStep | None = None) -> tuple[list[RequestRecord], list[ChunkRecord]]:
    """Replay ``requests`` through an engine configured by ``cfg``; records are stamped from ``t0_ns``. A request's
    engine id is ``"<worker>-<seq>"``."""
    out = replay_observed(cfg, requests, load, t0_ns=t0_ns, on_step=on_step, observe=False)
    return out.records, out.chunks


def replay_observed(cfg: EngineConfig, requests: list[ReplayRequest], load: ReplayLoad,
                    faults: ReplayFaults = NO_FAULTS, t0_ns: int = 0, on_step: OnStep | None = None,
                    scrape_interval_s: float = 0.5, observe: bool = True) -> Replayed:
    """``replay`` with ``faults`` injected, and the observations and truth of ``Replayed`` (``observe`` off:
    no scrapes, no trace)."""
    engine, sends = Engine(cfg), _Sends(requests, load)
    obs = Observer(engine, t0_ns, scrape_interval_s, tracing=observe, faults=faults)
    delay_ns = int(load.arrival_delay_ms * NS_PER_MS)
    rng, noise = random.Random(load.seed), load.step_noise_ms
    arriving: list[tuple[int, int, _Flight]] = []  # heap of (arrival, order, flight)
    flights: list[_Flight] = []
    live: dict[int, _Flight] = {}  # id(SimRequest) → its flight, while it runs
    t_ns, steps = 0, 0
    while steps < MAX_STEPS:
        for req, t_due in sends.due(t_ns):
            flight = _send(req, faults.read_at(t_due), delay_ns, faults)
            flights.append(flight)
            live[id(flight.sim)] = flight
            heapq.heappush(arriving, (flight.t_arrival_ns, len(flights), flight))
        while arriving and arriving[0][0] <= t_ns:
            _arrive(heapq.heappop(arriving)[2], engine, obs, faults, sends, live)
        obs.scrape_until(t_ns)
        if t_ns > sends.last_send_ns + load.drain_timeout_s * 1e9 and not sends.queue:
            break
        step = engine.plan_step() if engine.has_work() else None
        if not step:
            upcoming = [t for t in (sends.next_time(), arriving[0][0] if arriving else None) if t is not None]
            if not upcoming:
                break
            t_ns = max(t_ns, min(upcoming))
            continue
        steps += 1
        model_ms = engine.step_duration_ms(step)
        step_ms = max(model_ms + noise[rng.randrange(len(noise))], model_ms / 2) if noise else model_ms
        t_start_ns, t_ns = t_ns, t_ns + max(int(step_ms * NS_PER_MS), 1)
        obs.scrape_until(t_ns - 1)  # a scrape during the step sees it as planned
        emitted = engine.finish_step(step, t_ns)
        obs.stepped(step, t_start_ns, t_ns, emitted)
        if on_step is not None:
            on_step(step, t_start_ns, t_ns, emitted)
        t_read = faults.read_at(t_ns)
        for sim, _ in emitted:
            live[id(sim)].tokens.append(t_read)
            if sim.finish_reason is not None:
                del live[id(sim)]
                sends.done(t_read)
    records, chunks = _records(flights, t0_ns, t_ns)
    return Replayed(records, chunks, obs.server, client_rows(faults, t_ns, t0_ns) if observe else [],
                    {(f.req.worker, f.req.seq): t0_ns + f.t_headers_ns for f in flights
                     if f.t_headers_ns is not None}, obs.trace)


def _send(req: ReplayRequest, t_send_ns: int, delay_ns: int, faults: ReplayFaults) -> _Flight:
    error, delay_ms = faults.draw(req.worker, req.seq)
    sim = SimRequest(f"{req.worker}-{req.seq}", req.prompt_tokens, req.output_tokens, req.output_tokens)
    t_arrival = t_send_ns + delay_ns + int(delay_ms * NS_PER_MS)
    return _Flight(req, sim, t_send_ns, t_arrival, [], error, delay_ms)


def _arrive(flight: _Flight, engine: Engine, obs: Observer, faults: ReplayFaults, sends: _Sends,
            live: dict[int, _Flight]) -> None:
    """The request reaches the engine: its headers leave now; an injected error is its whole answer."""
    obs.arrived(flight.sim, flight.t_arrival_ns, flight.delay_ms, flight.error)
    flight.t_headers_ns = faults.read_at(flight.t_arrival_ns)
    if flight.error:
        flight.t_done_ns = flight.t_headers_ns
        del live[id(flight.sim)]
        sends.done(flight.t_done_ns)
    else:
        engine.add(flight.sim)


def _records(flights: list[_Flight], t0_ns: int, t_end_ns: int) -> tuple[list[RequestRecord], list[ChunkRecord]]:
    requests, chunks = [], []
    for f in flights:
        r, done = f.req, f.sim.finish_reason is not None
        t_done = f.t_done_ns if f.error and f.t_done_ns is not None else f.tokens[-1] if done else t_end_ns
        requests.append(RequestRecord(
            seq=r.seq, class_name=r.class_name, warmup=r.warmup, t_intended_ns=t0_ns + r.t_intended_ns,
            t_sent_ns=t0_ns + f.t_sent_ns,
            t_first_token_ns=t0_ns + f.tokens[0] if f.tokens else None,
            t_last_token_ns=t0_ns + f.tokens[-1] if f.tokens else None, t_done_ns=t0_ns + t_done,
            prompt_tokens_asked=r.prompt_tokens, prompt_tokens=r.prompt_tokens, prompt_tokens_source="server",
            output_tokens_asked=r.output_tokens, output_tokens=len(f.tokens), output_tokens_source="server",
            chunks=len(f.tokens), finish_reason="length" if done else None,
            http_status=500 if f.error else None,
            error_kind="http_5xx" if f.error else None if done else "cancelled",
            error_message="HTTP 500 (injected)" if f.error else None, worker=r.worker,
            **_transport(f, t0_ns)))
        chunks += [ChunkRecord(seq=r.seq, t_ns=t0_ns + t, tokens=1, worker=r.worker) for t in f.tokens]
    return requests, chunks


def _transport(f: _Flight, t0_ns: int) -> dict[str, int | None]:
    """``connect_ns`` (0: the replay's connections are pooled) and ``t_headers_ns``, where RequestRecord has them."""
    out: dict[str, int | None] = {}
    if "connect_ns" in REQUEST_COLUMNS:
        out["connect_ns"] = 0
    if "t_headers_ns" in REQUEST_COLUMNS:
        out["t_headers_ns"] = None if f.t_headers_ns is None else t0_ns + f.t_headers_ns
    return out
