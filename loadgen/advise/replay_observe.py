"""What a virtual-time replay (``advise/replay.py``) would have observed and what really happened, beside its
records: the faults injected on purpose (all off by default), the server's ``/metrics`` scraped every
``scrape_interval_s`` from the engine's state exactly as the simulator exposes it (``local_target/sim/metrics.py``
rendered, read by ``core/prom_text.py``: the engine's own series, so llama.cpp and TGI show no KV usage or
preemptions, as for real), loadgen's own loop lag (client_metrics.parquet's ``loop_lag_ms`` and
``cpu_busy_share``), and the simulator's trace (``local_target/sim/trace.py``'s engine, request, step and finish
events, on the records' clock) as the ground truth. Pure: no clock, no sockets.

Faults, each a seeded draw of its own per request (``"<seed>:<worker>:<seq>"``):
- ``error_rate``: the share answered HTTP 500 at arrival (no tokens), as the simulator's ``faults.error_rate``;
- ``network_delay_rate`` × ``network_delay_ms``: the share that reach the engine that much later, their response
  headers with them (``faults.network_delay_*``); an errored request is not also delayed;
- ``hogs_ns``: windows [start, end) (ns from the replay's start) in which loadgen's loop is blocked: a send due
  then goes out at the window's end, and whatever the server wrote then (headers, tokens, the end) is read then.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from local_target.sim.engine import Engine, SimRequest, Step
from local_target.sim.metrics import EngineMetrics, render
from local_target.sim.trace import engine_event
from loadgen.core.prom_text import parse

NS_PER_MS = 1_000_000
LOOP_TICK_NS = 50 * NS_PER_MS  # the driver's loop-lag timer (drivers/loop_sampler.py PERIOD_NS)
KEEP_LAG_MS = 2.0  # lags this large are all stored, smaller ones once a second (loop_sampler.py's)
HEARTBEAT_NS = 1_000_000_000  # loop_sampler.py's HEARTBEAT_NS
Row = tuple[int, str, float]


@dataclass(frozen=True)
class ReplayFaults:
    error_rate: float = 0.0
    network_delay_ms: float = 0.0
    network_delay_rate: float = 0.0
    hogs_ns: tuple[tuple[int, int], ...] = ()
    seed: int = 0

    def draw(self, worker: int, seq: int) -> tuple[bool, float]:
        """(answered 500, network delay in ms) of one request."""
        if not (self.error_rate or self.network_delay_rate):
            return False, 0.0
        rng = random.Random(f"{self.seed}:{worker}:{seq}")
        error, delayed = rng.random() < self.error_rate, rng.random() < self.network_delay_rate
        return error, (self.network_delay_ms if delayed and not error else 0.0)

    def read_at(self, t_ns: int) -> int:
        """When loadgen's loop gets to something due (or written to it) at ``t_ns``: a hog's end, or then."""
        for start, end in self.hogs_ns:
            if start <= t_ns < end:
                return end
        return t_ns


NO_FAULTS = ReplayFaults()


@dataclass
class Observer:
    """Collects the server's scrapes and the truth events while the replay runs (times: replay ns + t0_ns)."""

    engine: Engine
    t0_ns: int
    scrape_interval_s: float = 0.5
    model: str = "replay"
    tracing: bool = True  # off: neither trace nor scrapes (``replay``'s plain records, at no extra cost)
    faults: ReplayFaults = NO_FAULTS  # a scrape due in a hog waits for its end (the scraper is on loadgen's loop)
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    server: list[Row] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    _next_scrape_ns: int = 0

    def __post_init__(self) -> None:
        if self.tracing:  # the trace's first line, as the simulator writes it: whose scheduler, KV reserved or not
            self.trace.append(engine_event(self.engine.cfg))

    def arrived(self, sim: SimRequest, t_arrival_ns: int, delay_ms: float, error: bool) -> None:
        if not self.tracing:
            return
        self.trace.append({"type": "request", "id": sim.id, "t_arrival_ns": self.t0_ns + t_arrival_ns,
                           "prompt_tokens": sim.prompt_tokens, "max_tokens": sim.max_tokens,
                           "stop_after": 0 if error else sim.stop_after, "network_delay_ms": delay_ms})
        if error:
            self.trace.append({"type": "finish", "id": sim.id, "t_ns": self.t0_ns + t_arrival_ns,
                               "reason": "error", "status": 500, "output_tokens": 0, "preemptions": 0})
        else:
            sim.t_arrival_ns = t_arrival_ns
            self.metrics.prompt_tokens_total += sim.prompt_tokens

    def scrape_until(self, t_ns: int) -> None:
        """Every scrape due by ``t_ns`` (replay ns) reads the engine's state as it is now; one due while
        loadgen's loop is blocked goes out at the block's end, and the next is due a period after it."""
        if not self.tracing or self.scrape_interval_s <= 0 or self.faults.read_at(self._next_scrape_ns) > t_ns:
            return
        values = parse(render(self.engine, self.metrics, self.model).decode())
        period_ns = int(self.scrape_interval_s * 1e9)
        while (at_ns := self.faults.read_at(self._next_scrape_ns)) <= t_ns:
            self.server += [(self.t0_ns + at_ns, k, v) for k, v in values.items()]
            self._next_scrape_ns = at_ns + period_ns

    def stepped(self, step: Step, t_start_ns: int, t_end_ns: int, emitted: list[tuple[SimRequest, int]]) -> None:
        if not self.tracing:
            return
        t0, e = self.t0_ns, self.engine
        for sim, _ in emitted:
            if sim.finish_reason is not None:
                self.metrics.record_finish(sim)
                self.trace.append({"type": "finish", "id": sim.id, "t_ns": t0 + t_end_ns,
                                   "reason": sim.finish_reason, "output_tokens": sim.generated,
                                   "preemptions": sim.preemptions})
        self.metrics.record_step(e, step, emitted, t_start_ns, t_end_ns)
        self.trace.append({"type": "step", "t_start_ns": t0 + t_start_ns, "t_end_ns": t0 + t_end_ns,
                           "prefill": [[r.id, c.tokens, c.start] for r, c in step.prefills],
                           "decode": [r.id for r in step.decodes], "preempted": [r.id for r in step.preempted],
                           "kv_usage": round(e.kv_used / e.cfg.kv_cache_tokens, 4),
                           "tokens": [[r.id, index, t0 + t_end_ns] for r, index in emitted]})


def client_rows(faults: ReplayFaults, t_end_ns: int, t0_ns: int) -> list[Row]:
    """client_metrics.parquet's rows over [0, t_end_ns], as loadgen's sampler (drivers/loop_sampler.py) stores
    them: a timer due every 50 ms fires at once, or at the end of the hog it fell in (``loop_lag_ms`` its
    lateness), and is due again 50 ms after it fired; a lag of ``KEEP_LAG_MS`` or more is stored, a smaller one
    once a second (a heartbeat); ``cpu_busy_share`` once a second, the hogs' share of the time since the last
    one (the replay's loop is otherwise idle)."""
    rows: list[Row] = []
    due_ns, lag_kept_ns, cpu_ns = LOOP_TICK_NS, 0, 0
    while due_ns <= t_end_ns:
        fired_ns = faults.read_at(due_ns)
        lag_ms = (fired_ns - due_ns) / NS_PER_MS
        if lag_ms >= KEEP_LAG_MS or fired_ns - lag_kept_ns >= HEARTBEAT_NS:
            rows.append((t0_ns + fired_ns, "loop_lag_ms", lag_ms))
            lag_kept_ns = fired_ns
        if fired_ns - cpu_ns >= HEARTBEAT_NS:
            busy_ns = sum(max(0, min(end, fired_ns) - max(start, cpu_ns)) for start, end in faults.hogs_ns)
            rows.append((t0_ns + fired_ns, "cpu_busy_share", busy_ns / (fired_ns - cpu_ns)))
            cpu_ns = fired_ns
        due_ns = fired_ns + LOOP_TICK_NS
    return rows
