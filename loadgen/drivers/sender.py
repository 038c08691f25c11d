"""The port a scheduler sends through: what the conversation and session schedulers (drivers/conversations.py,
drivers/sessions.py) need of the asyncio driver, and nothing of its internals. ``AsyncioEngine`` implements it;
a scheduler never reaches into the engine's private members, and the engine's module is not imported here (no
import circle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from loadgen.core.records import ChunkRecord, RequestRecord, ToolCall
from loadgen.core.tracker import RequestMeta, StreamTracker, bare_record
from loadgen.drivers.engine_config import EngineConfig, EngineStats
from loadgen.drivers.stream_context import StreamContext
from loadgen.drivers.timing import RateCeiling
from loadgen.plan.schedule import Plan, PlannedRequest


@dataclass(frozen=True, slots=True)
class Outcome:
    """One sent request's end: its record (None only if the engine was torn down first), the answer text
    received (kept for conversation turns and session calls, whose next call carries it; "" otherwise) and the
    tool calls it made (a session's next call carries their results)."""
    record: RequestRecord | None
    answer: str
    tool_calls: tuple[ToolCall, ...] = ()


class Sender(Protocol):
    plan: Plan
    cfg: EngineConfig
    stats: EngineStats
    ceiling: RateCeiling

    @property
    def stopping(self) -> bool:
        """True once the run stops sending (end of plan, hard end, Ctrl-C)."""

    def next_seq(self) -> int:
        """Closed loop: the next index into the plan."""

    async def send(self, req: PlannedRequest, t_intended_ns: int, body: bytes, after: int | None = None) -> Outcome:
        """Send ``req`` now (intended at ``t_intended_ns``) and stream it to its end; its record goes the
        usual way (the run's sink) and comes back in the outcome. ``after``: a session call's parent that
        ended last (its record's)."""

    def record_failure(self, req: PlannedRequest, t_intended_ns: int, exc: Exception) -> None:
        """Record ``req`` as failed, never sent (its body could not be prepared)."""


def request_meta(req: PlannedRequest, t_intended_ns: int, after_call: int | None = None) -> RequestMeta:
    """What the core's tracker keeps of a planned request (a conversation turn and a session call keep their
    answer's text). A session call's: its place in the session, and ``t_ready_ns = t_intended_ns − wait_ns``
    (the scheduler intends it exactly its wait after it was ready)."""
    turn = req.turn if req.conversation is not None else None
    meta = RequestMeta(req.seq, req.class_name, req.warmup, t_intended_ns, req.prompt_tokens, req.output_tokens,
                       conversation=req.conversation, turn=turn,
                       keep_text=req.conversation is not None or req.session is not None)
    if req.session is not None:
        meta.session, meta.call, meta.agent, meta.step = req.session, req.call, req.agent, req.step
        meta.after_call, meta.t_ready_ns = after_call, t_intended_ns - req.wait_ns
        meta.wait_ns, meta.wait_kind = req.wait_ns, req.wait_kind
    return meta


def finish_tracker(tracker: StreamTracker, now_ns: int, status: int, kind: str | None, message: str | None,
                   ctx: StreamContext | None = None) -> tuple[RequestRecord, list[ChunkRecord]]:
    """The tracker's records, with what the transport measured of the request (``ctx``: its connection's
    opening time, its response head); a bug in the core still leaves the request its record (``internal``)."""
    try:
        record, chunks = tracker.finish(now_ns, status, kind, message)
    except Exception as exc:  # noqa: BLE001 - a bug in the core: the request still has its record
        record, chunks = bare_record(tracker.meta, tracker.t_sent_ns, now_ns, status, "internal",
                                     f"loadgen failed on this response (a bug; please report it): "
                                     f"{type(exc).__name__}: {exc}"), []
    if ctx is not None:
        record.connect_ns, record.t_headers_ns = ctx.connect_ns, ctx.t_headers_ns
    return record, chunks
