"""Runs the pure ``Engine`` in real time on an asyncio loop.

Step boundaries are absolute deadlines on ``time.monotonic_ns()``: a step that starts at ``t`` ends at
``t + duration``, and the next step starts at that *modelled* end, so wake-up lateness never accumulates.
The loop sleeps until ``spin_ms`` before the deadline (asyncio timers are millisecond-grained) and busy-waits
the rest, which keeps emission within tens of microseconds of the model. If the process falls more than
``RESYNC_MS`` behind (CPU starved), the next step restarts from now and the trace shows it.
Requests that arrive during a step wait for the next one, as in a real engine; an idle engine starts its step
at the arrival (first byte) of the request that woke it.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from typing import Callable

from .config import EngineConfig
from .engine import Engine, SimRequest, Step
from .metrics import EngineMetrics
from .reasoning import PhasePlan
from .trace import TraceWriter, engine_event

RESYNC_MS = 5.0
NO_PLAN = PhasePlan()


class EngineRuntime:
    def __init__(self, cfg: EngineConfig, trace: TraceWriter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.cfg = cfg
        self.engine = Engine(cfg)
        self.metrics = EngineMetrics()
        self.trace = trace
        self.clock = clock
        self.rng = random.Random(cfg.seed)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_no = 0
        self._next_stall_ns: int | None = None
        self._writes: list[list[object]] = []  # token writes reported by the server since the last step
        if trace:
            trace.write(engine_event(cfg))

    # ---- requests -------------------------------------------------------------------------------------
    def natural_output_tokens(self) -> int:
        """Output length of a request that may stop early (no ``ignore_eos``), from the seeded lognormal."""
        return max(1, round(self.rng.lognormvariate(0.0, self.cfg.natural_output_sigma)
                            * self.cfg.natural_output_median))

    def submit(self, req: SimRequest, t_arrival_ns: int | None = None, network_delay_ms: float = 0.0) -> None:
        """Queue ``req``; ``t_arrival_ns`` is when its first byte reached the server (default: now), after
        ``network_delay_ms`` held in front of it (``faults.network_delay_ms``)."""
        req.t_arrival_ns = t_arrival_ns or self.clock()
        self.engine.add(req)
        self.metrics.prompt_tokens_total += req.prompt_tokens
        if self.trace:
            plan = req.plan
            self.trace.write({"type": "request", "id": req.id, "t_arrival_ns": req.t_arrival_ns,
                              "prompt_tokens": req.prompt_tokens, "max_tokens": req.max_tokens,
                              "stop_after": req.stop_after, "effort": plan.effort if plan else None,
                              "reasoning_tokens": plan.reasoning_tokens if plan else 0,
                              "tool_tokens": plan.tool.tokens if plan and plan.tool else 0,
                              "network_delay_ms": round(network_delay_ms, 3)})
        self._wake.set()

    def refused(self, request_id: str, prompt_tokens: int, max_tokens: int, t_arrival_ns: int,
                network_delay_ms: float, status: int) -> None:
        """An injected refusal (500, 429) answered at arrival: its request and its finish (reason ``error``)."""
        if self.trace:
            self.trace.write({"type": "request", "id": request_id, "t_arrival_ns": t_arrival_ns,
                              "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "stop_after": 0,
                              "effort": None, "reasoning_tokens": 0, "tool_tokens": 0,
                              "network_delay_ms": round(network_delay_ms, 3)})
            self.trace.write({"type": "finish", "id": request_id, "t_ns": self.clock(), "reason": "error",
                              "status": status, "output_tokens": 0, "preemptions": 0, "cached_tokens": 0,
                              **NO_PLAN.counts(0)})

    def abort(self, req: SimRequest, reason: str | None = None) -> None:
        """Drop ``req`` (its client went away); ``reason`` (an injected cut: ``disconnect``) is traced as its
        finish."""
        self.engine.abort(req)
        if reason is not None and self.trace:
            self.trace.write({"type": "finish", "id": req.id, "t_ns": self.clock(), "reason": reason,
                              "output_tokens": req.generated, "preemptions": req.preemptions,
                              "cached_tokens": req.cached_tokens, **(req.plan or NO_PLAN).counts(req.generated)})

    # ---- loop -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.trace:
            self.trace.close()

    async def _run(self) -> None:
        t_start = self.clock()
        while True:
            if not self.engine.has_work():
                if self.trace:
                    self.trace.flush()
                self._wake.clear()
                await self._wake.wait()
                # an idle engine starts at the request's arrival: parsing and tokenizing it happen inside the
                # modelled step, so TTFT at low load is the model's, whatever the body's size
                t_start = max(t_start, self.engine.waiting[0].t_arrival_ns) if self.engine.waiting else self.clock()
            step = self.engine.plan_step()
            if not step:  # waiting requests that cannot be admitted (nothing running): wait for a change
                self._wake.clear()
                await self._wake.wait()
                continue
            stall_ms = self._injected_stall_ms(t_start)
            t_end = t_start + int((self.engine.step_duration_ms(step) + stall_ms) * 1e6)
            # Apply the step and format every chunk now, while the modelled step runs; at its end only the
            # socket writes remain, so the last stream of a large batch is not late by everyone's formatting.
            emitted = self.engine.finish_step(step, t_end)
            deliveries = [d for req, index in emitted if (d := req.on_token(req, index)) is not None]
            await self._sleep_until(t_end)
            gc.disable()  # a collection here would delay every stream after it
            for deliver in deliveries:
                deliver()
            gc.enable()
            self._complete(step, emitted, t_start, t_end, stall_ms)
            late_ms = (self.clock() - t_end) / 1e6
            t_start = self.clock() if late_ms > RESYNC_MS else t_end

    def _injected_stall_ms(self, t_ns: int) -> float:
        faults = self.cfg.faults
        if not (faults.stall_ms and faults.stall_every_s):
            return 0.0
        period_ns = int(faults.stall_every_s * 1e9)
        if self._next_stall_ns is None:
            self._next_stall_ns = t_ns + period_ns
        if t_ns < self._next_stall_ns:
            return 0.0
        self._next_stall_ns += period_ns
        return faults.stall_ms * self.cfg.time_scale

    async def _sleep_until(self, deadline_ns: int) -> None:
        # Always yield at least once: with steps shorter than spin_ms (a small time_scale) the loop would
        # otherwise spin from step to step and never read a new request off the network.
        coarse_s = (deadline_ns - self.clock()) / 1e9 - self.cfg.spin_ms / 1e3
        await asyncio.sleep(max(coarse_s, 0.0))
        while self.clock() < deadline_ns:
            pass

    def _complete(self, step: Step, emitted: list[tuple[SimRequest, int]], t_start: int, t_end: int,
                  stall_ms: float) -> None:
        for req, _ in emitted:
            if req.finish_reason is not None:  # finished in this step: each request is emitted once a step
                req.on_finish(req, req.finish_reason)
                self.metrics.record_finish(req)
                self._record_finish(req)
        self.metrics.record_step(self.engine, step, emitted, t_start, t_end)
        if self.trace:
            self._trace_step(step, t_start, t_end, stall_ms)
        self._step_no += 1

    def _record_finish(self, req: SimRequest) -> None:
        if self.trace:
            self.trace.write({"type": "finish", "id": req.id, "t_ns": req.t_last_token_ns,
                              "reason": req.finish_reason, "output_tokens": req.generated,
                              "preemptions": req.preemptions, "cached_tokens": req.cached_tokens,
                              **(req.plan or NO_PLAN).counts(req.generated)})

    def _trace_step(self, step: Step, t_start: int, t_end: int, stall_ms: float) -> None:
        assert self.trace is not None
        self.trace.write({
            "type": "step", "step": self._step_no, "t_start_ns": t_start, "t_end_ns": t_end,
            "prefill": [[r.id, c.tokens, c.start] for r, c in step.prefills],
            "decode": [r.id for r in step.decodes],
            "preempted": [r.id for r in step.preempted],
            "stall_ms": stall_ms,
            "kv_usage": round(self.engine.kv_used / self.cfg.kv_cache_tokens, 4),
            "tokens": self._writes,
        })
        self._writes = []

    def note_write(self, req: SimRequest, first_index: int, count: int, t_write_ns: int) -> None:
        """The server wrote tokens ``first_index..+count`` of ``req`` to its socket at ``t_write_ns``."""
        if self.trace is None:
            return
        if count == 1:
            self._writes.append([req.id, first_index, t_write_ns])
        else:
            self._writes.extend([req.id, first_index + k, t_write_ns] for k in range(count))
