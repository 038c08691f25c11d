"""Agentic sessions: a session is a DAG of LLM calls, planned up front (plan/schedule.py ``Plan.session``).

Whatever its source (the class's synthetic ``session:`` template or an agent trace, plan/agent_traces.py), a
session is a ``SessionPlan``: its calls in topological order. A call waits for every parent to end, then its
``wait_ns`` (a tool wait or the user's think time), then is sent carrying the transcript of its ``context``
call (that call's messages and the answer it received) plus its own new messages (a user message, tool
results, or the results of joined sub-agents).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from loadgen.plan.arrivals import sample_length
from loadgen.plan.scenario import RequestClass, ScenarioError

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
    block_tokens: int = 0  # calls with ``blocks``: tokens per block (WEKA's block_size)


def check_session(plan: SessionPlan, where: str) -> None:
    """The graph rules (ScenarioError naming ``where`` and the call): parents precede, the context is an
    ancestor, at least one root, at most ``MAX_SESSION_CALLS`` calls."""
    if not plan.calls:
        raise ScenarioError(f"{where}: a session without calls")
    if len(plan.calls) > MAX_SESSION_CALLS:
        raise ScenarioError(f"{where}: {len(plan.calls)} calls, over the {MAX_SESSION_CALLS} a session may have")
    ancestors: list[set[int]] = []
    for k, c in enumerate(plan.calls):
        if c.call != k:
            raise ScenarioError(f"{where}: call {k} is numbered {c.call} (calls go in order from 0)")
        if any(not 0 <= p < k for p in c.parents) or len(set(c.parents)) != len(c.parents):
            raise ScenarioError(f"{where}: call {k}'s parents {list(c.parents)} must be distinct earlier calls")
        mine = set(c.parents).union(*(ancestors[p] for p in c.parents))
        if c.context is not None and c.context not in mine:
            raise ScenarioError(f"{where}: call {k}'s context {c.context} is not one of its ancestors")
        if c.wait_ns < 0 or c.prompt_tokens < 1 or c.output_tokens < 1:
            raise ScenarioError(f"{where}: call {k} needs wait >= 0 and prompt/output tokens >= 1")
        ancestors.append(mine)


def synthetic_session(index: int, cls: RequestClass, rng: random.Random) -> SessionPlan:
    """A session from the class's ``session:`` template, every draw from ``rng`` (the session's own generator):
    user turns of main-agent steps, each step but a turn's last ending in a tool call (then a tool wait), a
    step that may spawn sub-agents whose last calls the next step joins, think time between user turns."""
    spec = cls.session
    assert spec is not None and spec.steps is not None and cls.prompt_tokens and cls.output_tokens
    calls: list[SessionCall] = []
    last: int | None = None  # the main agent's latest call
    joined: tuple[int, ...] = ()  # sub-agents' last calls the next main step waits for
    agents = 0
    for turn in range(sample_length(spec.turns, rng) if spec.turns is not None else 1):
        steps = sample_length(spec.steps, rng)
        for s in range(steps):
            first = not calls
            prompt = sample_length(spec.first_prompt_tokens if first and spec.first_prompt_tokens
                                   else cls.prompt_tokens, rng)
            kind: WaitKind = "none" if first else "think" if s == 0 else "tool"
            mean, dist = (spec.think_time_s, spec.think_time_dist) if kind == "think" else \
                (spec.tool_wait_s, spec.tool_wait_dist)
            wait = 0 if first else wait_ns(mean, dist, rng)
            tool_turn = s < steps - 1
            parents = () if last is None else (last, *joined)
            calls.append(SessionCall(len(calls), parents, last, wait, kind if wait else "none", 0,
                                     sum(c.agent == 0 for c in calls), prompt,
                                     sample_length(cls.output_tokens, rng), tool_turn))
            last, joined = len(calls) - 1, ()
            sub = spec.subagents
            if tool_turn and sub is not None and rng.random() < sub.probability:
                ends = []
                for _ in range(sample_length(sub.width, rng)):
                    agents += 1
                    ends.append(_subagent(calls, last, agents, cls, rng))
                joined = tuple(ends)
    return SessionPlan(index, cls.name, tuple(calls), "synthetic")


def _subagent(calls: list[SessionCall], spawner: int, agent: int, cls: RequestClass, rng: random.Random) -> int:
    """Append sub-agent ``agent``'s calls (a fresh context, tool waits between its steps); its last call."""
    spec = cls.session
    assert spec is not None and spec.subagents is not None and cls.prompt_tokens and cls.output_tokens
    steps = sample_length(spec.subagents.steps, rng)
    prev = None
    for step in range(steps):
        wait = 0 if prev is None else wait_ns(spec.tool_wait_s, spec.tool_wait_dist, rng)
        calls.append(SessionCall(len(calls), (spawner,) if prev is None else (prev,), prev, wait,
                                 "tool" if wait else "none", agent, step, sample_length(cls.prompt_tokens, rng),
                                 sample_length(cls.output_tokens, rng), step < steps - 1))
        prev = len(calls) - 1
    assert prev is not None
    return prev


def wait_ns(mean_s: float, dist: str, rng: random.Random) -> int:
    """A tool wait or think time: ``mean_s`` as it is (fixed) or drawn (exponential with that mean)."""
    if dist == "exponential" and mean_s > 0:
        return int(rng.expovariate(1.0 / mean_s) * 1e9)
    return int(mean_s * 1e9)


def critical_wait_ns(calls: tuple[SessionCall, ...] | list[SessionCall]) -> int:
    """The most wait along any path of the graph: what the session waits in all, however fast its calls."""
    longest: list[int] = []
    for c in calls:
        longest.append(c.wait_ns + max((longest[p] for p in c.parents), default=0))
    return max(longest, default=0)
