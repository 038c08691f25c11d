"""Agentic sessions on the asyncio engine (plan.md §2.8): each session is a task, and each of its calls a task that
sends through the driver's ``Sender`` port (drivers/sender.py: the same transport, tracker, timeouts, records
and error rules as every other request).

A session is a graph of calls (plan/sessions.py): a call waits for every parent to end; it is then *ready*, at
``t_ready = max(t_done of its parents)`` (a root: the session's start), and due ``wait_ns`` later (a tool wait or
the user's think time): ``t_intended = t_ready + wait_ns``, exactly; lateness past it shows as queue delay, as for
any request. Its body is built then (``CallFor``): the transcript of its ``context`` call (that call's messages
and the answer it received) plus its new messages, which carry its parents' results back (tool results; a
join: the joined sub-agents' answers). Calls whose parents have all ended are in flight together (a fan-out),
a join leaves only after every parent, and a sub-agent that nothing joins (a background one) is not waited
for by the parent's next call; the session ends when every call has ended. Its record carries ``session``,
``call``, ``agent``, ``step``, ``after_call`` (the parent that ended last), ``t_ready_ns``, ``wait_ns`` and
``wait_kind``.

A call that fails (an error of any kind, or a body that cannot be built) ends its branch: its descendants are
not sent, as a failed conversation turn ends its conversation (drivers/conversations.py) — a real agent has
no answer to go on from. The session then counts as failed, and every call it did not send is counted
(``calls_not_sent``). No call is sent after the run stops sending (the hard end; closed loop: the end of
warm-up + duration), nor, closed loop, past the plan's request count. A session the run's end cut short — a
call not sent for that reason, or cancelled in flight (``error_kind`` "cancelled": neither success nor error)
— with no call failed is neither a job nor a failure (run.json ``sessions_not_finished``).

Open loop: a session starts at its planned arrival (``start``). Closed loop: each user runs one session at a
time, the next of the plan (``Plan.session``), numbering its calls as it sends them; a session is warm-up
whole or not at all (its start decides).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from loadgen.core.records import RequestRecord, ToolCall
from loadgen.drivers.conversations import Conversations
from loadgen.drivers.sender import Sender
from loadgen.drivers.timing import sleep_until
from loadgen.plan.schedule import PlannedRequest
from loadgen.plan.session_bodies import Message, Transcript

COARSE_SLEEP_S = 0.1  # a long wait is slept in steps this long, so a stopped run does not wait it out


@dataclass(frozen=True, slots=True)
class CallResult:
    """A call's end as its children see it: the answer received and the tool calls it made."""
    call: int
    agent: int
    answer: str
    tool_calls: tuple[ToolCall, ...] = ()


# a call's body and the new messages it adds to its context's transcript: (request, context's transcript,
# every parent's result in call order)
CallFor = Callable[[PlannedRequest, Transcript, list[CallResult]], Awaitable[tuple[dict[str, Any], Transcript]]]


@dataclass
class SessionState:
    """One session as it runs: which calls ended (and when), their results and transcripts."""
    calls: list[PlannedRequest]
    t_start_ns: int
    warmup: bool | None = None  # closed loop: the whole session's (open loop: the plan's, per call)
    done: dict[int, asyncio.Event] = field(default_factory=dict)
    t_done_ns: dict[int, int] = field(default_factory=dict)  # calls that ended without an error
    results: dict[int, CallResult] = field(default_factory=dict)
    transcripts: dict[int, Transcript] = field(default_factory=dict)
    failed: bool = False
    not_sent: int = 0
    cut: bool = False  # a call not sent as the run stopped sending (its end, a stop, the plan's size), or cancelled
    exhausted: bool = False  # closed loop: the plan's request count ran out during it

    def __post_init__(self) -> None:
        self.done = {r.call: asyncio.Event() for r in self.calls}


class Sessions:
    """The scheduler of a plan with session classes; ``others`` sends the units of its other classes (a
    conversation, or a request on its own in a closed loop)."""

    def __init__(self, engine: Sender, call_for: CallFor, others: Conversations | None = None) -> None:
        self.engine, self.call_for, self.others = engine, call_for, others
        self.tasks: set[asyncio.Task[bool]] = set()
        self._calls: dict[int, list[PlannedRequest]] = {}
        self._arrivals = itertools.count()  # closed loop: the next session of the plan
        self.sessions = self.failed = self.calls_not_sent = 0  # run figures (the runner's notes)
        self.unfinished: list[int] = []  # sessions the run's end cut short, none failed: not judged (run.json)
        for req in engine.plan.requests or []:
            if req.session is not None:
                self._calls.setdefault(req.session, []).append(req)

    def note(self) -> str:
        """The run's note on failed sessions (a failed call ends its branch: its descendants are not sent)."""
        return (f"{self.failed} of {self.sessions} session(s) failed (a call ended in an error); "
                f"{self.calls_not_sent} call(s) of the run's sessions were not sent (after a failed call, or cut "
                "by the run's end)")

    # ---- open loop ------------------------------------------------------------------------------------
    def start(self, first: PlannedRequest, t_intended_ns: int) -> None:
        """Run ``first``'s session from ``t_intended_ns`` (once: its other calls are the session's own)."""
        if first.session is None:
            if self.others is not None:
                self.others.start(first, t_intended_ns)
            return
        calls = self._calls.pop(first.session, None)
        if calls is None:  # already started (or not a session of this plan)
            return
        task = asyncio.create_task(self.run_session(calls, t_intended_ns))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if self.others is not None:
            await self.others.wait()

    # ---- closed loop ----------------------------------------------------------------------------------
    async def user(self, end_ns: int | None) -> None:
        """A closed-loop user: one session after another until the end, a stop or the plan's request count."""
        e = self.engine
        while not e.stopping and (end_ns is None or time.monotonic_ns() < end_ns):
            calls = e.plan.unit(next(self._arrivals))
            if calls[0].session is None:  # another class's arrival: a conversation, or a request on its own
                if self.others is None or not await self.others.converse(calls, None, end_ns):
                    return
                continue
            await e.ceiling.wait()
            t_start_ns = time.monotonic_ns()  # the user is ready: the session starts now
            if e.stopping or (end_ns is not None and t_start_ns >= end_ns):
                return
            warmup = t_start_ns - e.stats.t0_ns < e.cfg.warmup_s * 1e9
            if not await self.run_session(calls, t_start_ns, end_ns, warmup):
                return

    # ---- one session ----------------------------------------------------------------------------------
    async def run_session(self, calls: list[PlannedRequest], t_start_ns: int, end_ns: int | None = None,
                          warmup: bool | None = None) -> bool:
        """Send every call of one session, each when its parents have ended; False once the closed-loop plan's
        request count is used up."""
        s = SessionState(calls, t_start_ns, warmup)
        await asyncio.gather(*(self._call(s, req, end_ns) for req in calls), return_exceptions=True)
        self.sessions += 1
        self.failed += s.failed
        self.calls_not_sent += s.not_sent
        if s.cut and not s.failed and calls[0].session is not None:
            self.unfinished.append(calls[0].session)
        return not s.exhausted

    async def _call(self, s: SessionState, req: PlannedRequest, end_ns: int | None) -> None:
        try:
            for parent in req.parents:
                await s.done[parent].wait()
            if all(p in s.t_done_ns for p in req.parents):
                if await self._send(s, req, end_ns):
                    return
                s.cut = True
            s.not_sent += 1
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the call still has its record (internal)
            s.failed = True
            self.engine.record_failure(req, time.monotonic_ns(), exc)
        finally:
            s.done[req.call].set()

    async def _send(self, s: SessionState, req: PlannedRequest, end_ns: int | None) -> bool:
        """Send ``req`` once it is due (its parents have ended); False: not sent (the run stopped sending, or the
        closed-loop plan's request count ran out)."""
        after = max(req.parents, key=lambda p: (s.t_done_ns[p], p), default=None)
        t_ready_ns = s.t_done_ns[after] if after is not None else s.t_start_ns
        t_intended_ns = t_ready_ns + req.wait_ns
        numbered = self._numbered(s, req)
        if numbered is None:
            return False
        body = await self._body(s, numbered, t_intended_ns)
        if body is None:
            s.failed = True  # recorded as failed (never sent): its branch ends here
            return True
        if not await self._until(t_intended_ns, end_ns):
            return False
        outcome = await self.engine.send(numbered, t_intended_ns, body, after)
        self._ended(s, req, outcome.record, outcome.answer, outcome.tool_calls)
        return True

    def _ended(self, s: SessionState, req: PlannedRequest, record: RequestRecord | None, answer: str,
               tool_calls: tuple[ToolCall, ...]) -> None:
        if record is not None and record.error_kind == "cancelled":  # by the run's end: cut, not failed
            s.cut = True
            return
        if record is None or record.error_kind is not None:
            s.failed = True
            return
        s.t_done_ns[req.call] = record.t_done_ns
        s.results[req.call] = CallResult(req.call, req.agent, answer, tool_calls)
        s.transcripts[req.call] += [assistant_message(answer, tool_calls)]

    def _numbered(self, s: SessionState, req: PlannedRequest) -> PlannedRequest | None:
        """Closed loop: ``req`` with the next plan index and its session's warm-up (None: the plan's request count
        is used up); open loop: as planned."""
        e = self.engine
        if not e.plan.closed_loop:
            return req
        seq = e.next_seq()
        if e.plan.size is not None and seq >= e.plan.size:
            s.exhausted = True
            return None
        return dataclasses.replace(req, seq=seq, warmup=bool(s.warmup))

    async def _body(self, s: SessionState, req: PlannedRequest, t_intended_ns: int) -> bytes | None:
        """The call's JSON body (None: recorded as failed); its transcript is kept for the calls that extend it."""
        context = s.transcripts[req.context] if req.context is not None else []
        try:
            body, new = await self.call_for(req, context, [s.results[p] for p in req.parents])
        except Exception as exc:  # noqa: BLE001 - a fault during the run is a counted error, never a crash
            self.engine.record_failure(req, t_intended_ns, exc)
            return None
        s.transcripts[req.call] = context + new
        return json.dumps(body).encode()

    async def _until(self, t_due_ns: int, end_ns: int | None) -> bool:
        """Hold until the call is due; False when the run stops sending first (or the call is due past the end)."""
        e = self.engine
        if end_ns is not None and t_due_ns >= end_ns:
            return False
        t_wake_ns = t_due_ns - int(e.cfg.send_ahead_ms * 1e6)
        while not e.stopping and t_wake_ns - time.monotonic_ns() > 2 * COARSE_SLEEP_S * 1e9:
            await asyncio.sleep(COARSE_SLEEP_S)
        await sleep_until(t_wake_ns, lambda: e.stopping)
        return not e.stopping


def assistant_message(answer: str, tool_calls: tuple[ToolCall, ...]) -> Message:
    """The answer as the next call's transcript carries it (OpenAI chat shape; reasoning is not carried, as
    clients drop it)."""
    message: Message = {"role": "assistant", "content": answer}
    if tool_calls:
        message["tool_calls"] = [{"id": t.id, "type": "function",
                                  "function": {"name": t.name, "arguments": t.arguments}} for t in tool_calls]
    return message
