"""Locust's users as conversations (a conversational plan): one user task runs one arrival of the plan, its
turns one after another, as ``drivers/conversations.py`` does on asyncio. Turn 0 leaves at its planned time
(closed loop: when the user is ready); each later turn ``think_ns`` after the previous answer ended, with the
history (each turn's message and the answer received come back with its record, ``Done.turn``). A failed turn ends
its conversation. This module imports neither locust nor gevent: it works through ``ProcessState``.

Slicing: open loop, arrival ``i`` (a conversation or a single request, in plan order) belongs to the process
with ``i % workers == index``; closed loop, the process takes arrivals ``index, index + workers, …`` and
numbers their turns ``arrival × MAX_TURNS + turn``, so seqs never collide across processes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol

from loadgen.core.records import RequestRecord
from loadgen.drivers.conversations import next_think_ns
from loadgen.drivers.engine_thread import Done
from loadgen.plan.scenario import MAX_TURNS, Scenario
from loadgen.plan.schedule import Plan, PlannedRequest
from loadgen.plan.slicing import PlanSlice


class ConversingState(Protocol):
    """What a conversation needs of its process (``drivers/locust_user.py``'s ``ProcessState``)."""

    scenario: Scenario
    plan: Plan
    slice: PlanSlice
    sent: int
    in_flight: int
    arrivals: list[list[PlannedRequest]] | None

    def execute(self, req: PlannedRequest, t_due_ns: int | None = None,
                history: list[tuple[str, str]] | None = None) -> Done: ...


def arrivals_of(plan: Plan) -> list[list[PlannedRequest]]:
    """An open-loop plan's requests grouped by arrival (a conversation's turns together), in plan order."""
    out: list[list[PlannedRequest]] = []
    for req in plan.requests or []:
        if req.turn == 0:
            out.append([])
        out[-1].append(req)
    return out


def next_arrival(state: ConversingState) -> list[PlannedRequest] | None:
    """This process's next arrival (None: its slice is done or the run's time is up)."""
    index = state.slice.take_position()
    plan = state.plan
    if plan.closed_loop:
        if state.slice.sending_over(time.monotonic_ns()) or (plan.size is not None and state.sent >= plan.size):
            return None
        return [dataclasses.replace(r, seq=index * MAX_TURNS + r.turn) for r in plan.unit(index)]
    if state.arrivals is None:
        state.arrivals = arrivals_of(plan)
    return state.arrivals[index] if index < len(state.arrivals) else None


def converse(state: ConversingState, turns: list[PlannedRequest], fire: Callable[[RequestRecord], None]) -> None:
    """Send ``turns`` in order; each record also goes to ``fire`` (Locust's request event)."""
    history: list[tuple[str, str]] = []
    t_due_ns: int | None = None
    for req in turns:
        if t_due_ns is not None and state.slice.turn_too_late(t_due_ns):
            return
        state.in_flight += 1  # claimed: the run is not over until it is recorded
        record, _, turn = state.execute(req, t_due_ns, history if req.conversation is not None else None)
        fire(record)
        if record.error_kind is not None or req.conversation is None:
            return
        history.append(turn or ("", ""))
        t_due_ns = record.t_done_ns + next_think_ns(turns, req)
