"""The plan: (Scenario, seed) → every request's intended send offset, class and lengths. Pure.

Open-loop arrivals are computed in full before the first send (arrivals.py). Arrival ``i``'s class and lengths
come from its own seeded generator, so they do not depend on how many arrivals come before it or on timing; a
closed-loop run of unknown length takes them one by one with ``Plan.unit(i)``.

An arrival of a class with a ``conversation`` is a conversation: its turns are planned up front (count,
lengths, think times, from the conversation's own generator) and sent one after another by the driver, each
when the previous answer has ended plus its think time. In an open-loop plan every turn is a
``PlannedRequest`` with its own ``seq`` (turns follow their conversation's first); ``t_intended_offset_ns`` of a
later turn is its conversation's start, the driver stamps the real time.

An arrival of a class with a ``session`` is an agent session (plan/sessions.py): a graph of calls from the
class's template or an agent trace (plan/agent_traces.py), planned up front from the session's own generator
(``Plan.session``). Its calls are all planned requests of an open-loop plan, each with the session's start and
warm-up (a session is warm-up whole or not at all); the driver sends a call when its parents ended plus its wait.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadgen.plan.arrivals import arrival_offsets_s, read_trace_file, sample_length
from loadgen.plan.datasets import Row, class_rows
from loadgen.plan.scenario import MAX_PLAN_REQUESTS, MAX_TURNS, Conversation, RequestClass, Scenario, ScenarioError
from loadgen.plan.agent_traces import read_agent_trace
from loadgen.plan.sessions import SessionCall, SessionPlan, check_session, critical_wait_ns, synthetic_session


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    seq: int
    t_intended_offset_ns: int  # from the run's start; 0 in closed loop (the driver stamps the real time)
    class_name: str
    prompt_tokens: int  # a conversation's turn: its new message (the history comes on top)
    output_tokens: int
    warmup: bool
    conversation: int | None = None  # the arrival index of its conversation (None: a request on its own)
    turn: int = 0
    think_ns: int = 0  # a later turn: sent this long after the previous turn's answer ended
    row: int | None = None  # a dataset class: the row of ``datasets.rows_for`` its prompt comes from
    group: int = 0  # its class's prefix group (arrival index mod prefix_groups)
    blocks: tuple[int, ...] | None = None  # a Mooncake trace's hash ids: its prompt is those blocks' text
    session: int | None = None  # a session's call: the session's arrival index (plan/sessions.py)
    call: int = 0  # its call index in the session (topological order)
    parents: tuple[int, ...] = ()  # calls that must have ended before it is sent
    context: int | None = None  # the call whose transcript it extends; None: a fresh context
    wait_ns: int = 0  # after its last parent ended: this long (tool wait or think time), then sent
    wait_kind: str = "none"  # none | tool | think
    agent: int = 0  # 0: the main agent; k: the session's k-th sub-agent
    step: int = 0  # the agent's step
    tool_turn: bool = False  # expected to end in a tool call (tool_choice "required")
    block_tokens: int = 0  # an agent trace's calls with ``blocks``: tokens per block (0: load.trace's)


# ---- the plan ------------------------------------------------------------------------------------------
class Plan:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.closed_loop = scenario.load.arrival == "concurrency"
        self._classes = scenario.workload.classes
        self._weights = [c.weight for c in self._classes]
        self._trace = read_trace_file(scenario) if scenario.load.arrival == "trace" else None
        rng = random.Random(f"arrivals:{scenario.seed}")
        self.offsets_s: list[float] | None = (None if self.closed_loop else
                                              [r.offset_s for r in self._trace] if self._trace else
                                              arrival_offsets_s(scenario, rng))
        self.conversational = any(c.conversation is not None for c in self._classes)
        self.sessional = any(c.session is not None for c in self._classes)
        base = scenario.source[0].parent if scenario.source else None  # session.trace.path is relative to it
        self._agent_traces = {c.name: read_agent_trace(c.session.trace, base)
                              for c in self._classes if c.session is not None and c.session.trace is not None}
        self.requests: list[PlannedRequest] | None = (
            self._expand(len(self.offsets_s)) if self.offsets_s is not None else None)

    def _expand(self, arrivals: int) -> list[PlannedRequest]:
        if not self.conversational and not self.sessional:
            return [self._arrival(i) for i in range(arrivals)]
        out: list[PlannedRequest] = []
        for i in range(arrivals):
            out += [dataclasses.replace(r, seq=len(out) + k) for k, r in enumerate(self.unit(i))]
            if len(out) > MAX_PLAN_REQUESTS:
                raise ScenarioError(f"the plan's conversations or sessions hold over {MAX_PLAN_REQUESTS:,} "
                                    "requests: lower the rate, the duration, the turns or the steps")
        return out

    @property
    def size(self) -> int | None:
        """Number of planned requests; None for a closed loop bounded by time only."""
        if self.requests is not None:
            return len(self.requests)
        return self.scenario.load.requests

    def request(self, seq: int) -> PlannedRequest:
        """Request ``seq``: of the open-loop plan, or (closed loop, no conversations) the ``seq``-th arrival."""
        if self.requests is not None:
            return self.requests[seq]
        return self._arrival(seq)

    def unit(self, index: int) -> list[PlannedRequest]:
        """Arrival ``index``'s requests: itself, or its conversation's turns (each ``seq`` is ``index``: an
        open-loop plan renumbers them, a closed-loop driver numbers them as it sends)."""
        first = self._arrival(index)
        if self.class_of(first.class_name).session is not None:
            return self.session(index)[1]
        conv = self.class_of(first.class_name).conversation
        if conv is None:
            return [first]
        cls = self.class_of(first.class_name)
        rng = random.Random(f"conversation:{self.scenario.seed}:{index}")
        out = [dataclasses.replace(first, conversation=index)]
        if conv.first_prompt_tokens is not None:
            out[0] = dataclasses.replace(out[0], prompt_tokens=sample_length(conv.first_prompt_tokens, rng))
        for turn in range(1, self._turns(cls, conv, first, rng)):
            prompt, output = self._lengths(cls, rng, first.row, turn)
            out.append(dataclasses.replace(first, prompt_tokens=prompt, output_tokens=output, conversation=index,
                                           turn=turn, think_ns=int(think_time_s(conv, rng) * 1e9)))
        return out

    def session(self, index: int) -> tuple[SessionPlan, list[PlannedRequest]]:
        """Arrival ``index``'s session (a class with ``session``): its graph and one request per call, in call
        order (each ``seq`` is ``index``: an open-loop plan renumbers them, a closed-loop driver numbers them as
        it sends)."""
        first = self._arrival(index)
        cls = self.class_of(first.class_name)
        if cls.session is None:
            raise ValueError(f"arrival {index} is of class {cls.name}, which has no session")
        rng = random.Random(f"session:{self.scenario.seed}:{index}")
        traced = self._agent_traces.get(cls.name)
        if traced is None:
            plan = synthetic_session(index, cls, rng)
            check_session(plan, f"workload.classes[{cls.name}].session")
        else:
            pick = rng.randrange(len(traced)) if cls.session.trace and cls.session.trace.sample == "random" else \
                index % len(traced)
            plan = dataclasses.replace(traced[pick], index=index, class_name=cls.name)
        bust = (index + 1) * 10**15 if cls.cache_bust or cls.session.cache_bust_calls else 0  # own block text
        per_call = 10**12 if cls.session.cache_bust_calls else 0
        return plan, [dataclasses.replace(
            first, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens, session=index, call=c.call,
            parents=c.parents, context=c.context, wait_ns=c.wait_ns, wait_kind=c.wait_kind, agent=c.agent,
            step=c.step, tool_turn=c.tool_turn, block_tokens=plan.block_tokens if c.blocks else 0,
            blocks=None if c.blocks is None else tuple(b + bust + per_call * (c.call + 1) for b in c.blocks))
            for c in plan.calls]

    def _turns(self, cls: RequestClass, conv: Conversation, first: PlannedRequest, rng: random.Random) -> int:
        """A conversation's turns: drawn; with a dataset, the row's turns (those with a recorded answer when
        the output lengths come from it), at most the draw."""
        asked = sample_length(conv.turns, rng) if conv.turns is not None else MAX_TURNS
        if first.row is None:
            return asked
        row = self._rows(cls)[first.row]
        usable = len(row.turns)
        if cls.output_tokens is None:
            usable = next((k for k in range(len(row.turns)) if not row.answer_estimate(k)), usable)
        return min(asked, usable)

    def _rows(self, cls: RequestClass) -> tuple[Row, ...]:
        return class_rows(cls, self.scenario.target.api)

    def _lengths(self, cls: RequestClass, rng: random.Random, row: int | None, turn: int) -> tuple[int, int]:
        """(prompt, output) tokens: drawn, or a dataset row's estimates (output: drawn if the class says; none
        for embeddings)."""
        if cls.traced:
            return 1, 1  # a trace's session: every call's lengths come from the trace (Plan.session)
        if self.scenario.target.api == "embeddings":
            prompt = sample_length(cls.prompt_tokens, rng) if cls.prompt_tokens else self._rows(cls)[row or 0]
            return (prompt if isinstance(prompt, int) else max(1, prompt.prompt_estimate(turn))), 0
        if row is None:
            assert cls.prompt_tokens is not None and cls.output_tokens is not None
            return sample_length(cls.prompt_tokens, rng), sample_length(cls.output_tokens, rng)
        r = self._rows(cls)[row]
        output = sample_length(cls.output_tokens, rng) if cls.output_tokens else r.answer_estimate(turn)
        return max(1, r.prompt_estimate(turn)), max(1, output or 1)

    def _row_of(self, cls: RequestClass, seq: int, rng: random.Random) -> int | None:
        if cls.dataset is None:
            return None
        rows = len(self._rows(cls))
        return rng.randrange(rows) if cls.dataset.sample == "random" else seq % rows

    def _arrival(self, seq: int) -> PlannedRequest:
        rng = random.Random(f"request:{self.scenario.seed}:{seq}")
        cls: RequestClass = rng.choices(self._classes, weights=self._weights)[0]
        row = self._row_of(cls, seq, rng)
        prompt, output = self._lengths(cls, rng, row, 0)
        offset_s = self.offsets_s[seq] if self.offsets_s is not None else 0.0
        blocks = None
        if self._trace is not None:
            prompt, output, blocks = self._trace[seq].prompt_tokens, self._trace[seq].output_tokens, \
                self._trace[seq].blocks
        warmup = offset_s < self.scenario.load.warmup_s if not self.closed_loop else False
        return PlannedRequest(seq, int(offset_s * 1e9), cls.name, prompt, output, warmup, row=row,
                              group=seq % cls.prefix_groups, blocks=blocks)

    def hard_end_s(self, drain_timeout_s: float) -> float | None:
        """Seconds after the first planned send at which the run ends, whatever is still in flight: the last
        send (closed loop: the end of warm-up + duration) plus the drain. None: a closed loop bounded only by
        its request count, each request bounded by ``target.request_timeout_s``."""
        if self.offsets_s is not None:
            return (self.offsets_s[-1] if self.offsets_s else 0.0) + self._longest_think_s() + drain_timeout_s
        load = self.scenario.load
        if load.duration_s is not None:
            return load.warmup_s + load.duration_s + drain_timeout_s
        return None

    def _longest_think_s(self) -> float:
        """An open-loop plan: the most think time of any one conversation (its turns wait that long in all), or
        the most wait along any one session's critical path."""
        totals: dict[int, int] = {}
        calls: dict[int, list[SessionCall]] = {}
        for r in self.requests or []:
            if r.conversation is not None:
                totals[r.conversation] = totals.get(r.conversation, 0) + r.think_ns
            if r.session is not None:
                calls.setdefault(r.session, []).append(SessionCall(
                    r.call, r.parents, r.context, r.wait_ns, "none", 0, 0, 1, 1, False))
        waits = [critical_wait_ns(c) for c in calls.values()]
        return max([*totals.values(), *waits], default=0) / 1e9

    def class_of(self, name: str) -> RequestClass:
        return next(c for c in self._classes if c.name == name)


def think_time_s(conv: Conversation, rng: random.Random) -> float:
    if conv.think_time_dist == "exponential" and conv.think_time_s > 0:
        return rng.expovariate(1.0 / conv.think_time_s)
    return conv.think_time_s


def build_plan(scenario: Scenario) -> Plan:
    return Plan(scenario)
