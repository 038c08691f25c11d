"""Which scheduler sends a plan's multi-request units on the asyncio engine: agentic sessions
(drivers/sessions.py) or multi-turn conversations (drivers/conversations.py). Both have the same three entry
points: ``start`` (open loop: a unit from its planned time), ``wait`` (until every started unit ended) and ``user``
(closed loop: one unit after another)."""

from __future__ import annotations

from typing import Protocol

from loadgen.drivers.conversations import Conversations, TurnFor
from loadgen.drivers.sender import Sender
from loadgen.drivers.sessions import CallFor, Sessions
from loadgen.plan.schedule import PlannedRequest

__all__ = ["CallFor", "Scheduler", "TurnFor", "make_scheduler"]


class Scheduler(Protocol):
    def start(self, first: PlannedRequest, t_intended_ns: int) -> None: ...

    async def wait(self) -> None: ...

    async def user(self, end_ns: int | None) -> None: ...


def make_scheduler(engine: Sender, turn_for: TurnFor | None, call_for: CallFor | None) -> Scheduler | None:
    """The plan's scheduler: sessions when it has session classes (conversations, if any, and a closed loop's
    requests on their own then go through its ``others``), conversations when it has conversations, else None
    (every request is sent on its own)."""
    if call_for is not None and engine.plan.sessional:
        return Sessions(engine, call_for, Conversations(engine, turn_for) if turn_for is not None else None)
    if turn_for is not None and engine.plan.conversational:
        return Conversations(engine, turn_for)
    return None
