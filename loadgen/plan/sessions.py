"""Agentic sessions: a session is a DAG of LLM calls, planned up front (plan/schedule.py ``Plan.session``).

Whatever its source (the class's synthetic ``session:`` template or an agent trace, plan/agent_traces.py), a
session is a ``SessionPlan``: its calls in topological order. A call waits for every parent to end, then its
``wait_ns`` (a tool wait or the user's think time), then is sent carrying the transcript of its ``context``
call (that call's messages and the answer it received) plus its own new messages (a user message, tool
results, or the results of joined sub-agents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_SESSION_CALLS = 1000
WaitKind = Literal["none", "tool", "think"]


@dataclass(frozen=True, slots=True)
class SessionCall:
    call: int  # index in the session, topological order (parents < call)
    parents: tuple[int, ...]  # calls that must have ended before it is sent (a join: several)
    context: int | None  # the call whose transcript (messages + its answer) this call extends; None: fresh
    wait_ns: int  # after the last parent ended: tool wait (or session think time), then send
    wait_kind: WaitKind
    agent: int  # 0: the main agent; k: the k-th sub-agent spawned in this session
    step: int  # the agent's step (its LLM call number, from 0)
    prompt_tokens: int  # tokens this call ADDS: the task, the user message or the tool result
    output_tokens: int
    tool_turn: bool  # the call is expected to end in a tool call (tool_choice "required")
    t_offset_ns: int | None = None  # trace replay: recorded offset from the session start (informative)
    blocks: tuple[int, ...] | None = None  # trace replay: hash ids of the call's whole prompt (shared bytes)


@dataclass(frozen=True, slots=True)
class SessionPlan:
    index: int  # the arrival index (the session id in records)
    class_name: str
    calls: tuple[SessionCall, ...]
    source: str  # "synthetic" | "weka:<trace id>" | "otel:<trace id>" | "loadgen:<session>"
