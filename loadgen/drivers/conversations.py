"""Multi-turn conversations on the asyncio engine: each conversation is a task that sends its turns one after
another through the driver's ``Sender`` port (drivers/sender.py: the same transport, tracker, timeouts and records as
every other request).

Turn 0 leaves at its planned time (open loop) or when its user is ready (closed loop). Every later turn is
built when the previous one has ended: its body carries the history (each earlier message and the answer
actually received, from the tracker's kept text), and it is due ``think_ns`` after that answer's last byte,
which is its intended time (lateness past it shows as queue delay, as for any request). A turn that fails
ends its conversation: a real client has no answer to continue from. No turn is sent after the run stops
sending (the hard end; closed loop: the end of warm-up + duration).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from typing import Any, Awaitable, Callable

from loadgen.drivers.sender import Sender
from loadgen.drivers.timing import sleep_until
from loadgen.plan.schedule import PlannedRequest

History = list[tuple[str, str]]
TurnFor = Callable[[PlannedRequest, History], Awaitable[tuple[dict[str, Any], str]]]


class Conversations:
    def __init__(self, engine: Sender, turn_for: TurnFor) -> None:
        self.engine, self.turn_for = engine, turn_for
        self.tasks: set[asyncio.Task[None]] = set()
        self._turns: dict[int, list[PlannedRequest]] = {}
        self._arrivals = itertools.count()  # closed loop: the next conversation of the plan
        for req in engine.plan.requests or []:
            if req.conversation is not None:
                self._turns.setdefault(req.conversation, []).append(req)

    # ---- open loop ------------------------------------------------------------------------------------
    def start(self, first: PlannedRequest, t_intended_ns: int) -> None:
        """Run ``first``'s conversation from ``t_intended_ns`` (a task; ``wait`` awaits them all)."""
        assert first.conversation is not None
        task = asyncio.create_task(self.converse(self._turns[first.conversation], t_intended_ns))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    # ---- closed loop ----------------------------------------------------------------------------------
    async def user(self, end_ns: int | None) -> None:
        """A closed-loop user: one conversation after another until the end or the plan's request count."""
        e = self.engine
        while not e.stopping and (end_ns is None or time.monotonic_ns() < end_ns):
            turns = e.plan.unit(next(self._arrivals))
            if not await self.converse(turns, None, end_ns):
                return

    # ---- one conversation -----------------------------------------------------------------------------
    async def converse(self, turns: list[PlannedRequest], t_first_ns: int | None,
                       end_ns: int | None = None) -> bool:
        """Send ``turns`` in order; False once the closed-loop plan's request count is used up."""
        e, history = self.engine, []
        t_due_ns = t_first_ns
        for req in turns:
            if e.plan.closed_loop:
                req = self._numbered(req)
                if req is None:
                    return False
            body, sent = await self._body(req, history, t_due_ns)
            if body is None or e.stopping:
                return True
            t_ns = await self._when(t_due_ns, end_ns)
            if t_ns is None:
                return True
            if e.plan.closed_loop and req.turn == 0:
                req = dataclasses.replace(req, warmup=t_ns - e.stats.t0_ns < e.cfg.warmup_s * 1e9)
            outcome = await e.send(req, t_ns, body)
            record = outcome.record
            if record is None or record.error_kind is not None:
                return True
            history.append((sent, outcome.answer))
            t_due_ns = record.t_done_ns + next_think_ns(turns, req)
        return True

    def _numbered(self, req: PlannedRequest) -> PlannedRequest | None:
        seq = self.engine.next_seq()
        size = self.engine.plan.size
        return None if size is not None and seq >= size else dataclasses.replace(req, seq=seq)

    async def _body(self, req: PlannedRequest, history: History,
                    t_due_ns: int | None) -> tuple[bytes | None, str]:
        try:
            body, sent = await self.turn_for(req, history)
        except Exception as exc:  # noqa: BLE001 - a fault during the run is a counted error, never a crash
            self.engine.record_failure(req, t_due_ns or time.monotonic_ns(), exc)
            return None, ""
        return json.dumps(body).encode(), sent

    async def _when(self, t_due_ns: int | None, end_ns: int | None) -> int | None:
        """The turn's intended time (None: the run stopped sending first): its due time, held until then;
        closed loop, turn 0: now, once the rate ceiling allows."""
        e = self.engine
        if t_due_ns is None:
            await e.ceiling.wait()
            t_due_ns = time.monotonic_ns()
        else:
            await sleep_until(t_due_ns - int(e.cfg.send_ahead_ms * 1e6), lambda: e.stopping)
        if e.stopping or (end_ns is not None and t_due_ns >= end_ns):
            return None
        return t_due_ns


def next_think_ns(turns: list[PlannedRequest], req: PlannedRequest) -> int:
    following = [t for t in turns if t.turn == req.turn + 1]
    return following[0].think_ns if following else 0
