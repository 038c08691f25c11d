"""The session scheduler (drivers/sessions.py): a call waits for every parent and then its wait, exactly
(``t_intended = t_ready + wait``, ``t_ready = max(parents' t_done)``); fan-out siblings are in flight together,
a join leaves after all of them, a background sub-agent is not waited for, a failed call's descendants are not
sent; closed loop: a user runs one session at a time. First with a fake sender (milliseconds), then each agent
trace fixture replayed on the embedded simulator, checked against the send timestamps."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from loadgen import api
from loadgen.core.records import RequestRecord, ToolCall
from loadgen.core.tracker import bare_record
from loadgen.drivers.schedulers import make_scheduler
from loadgen.drivers.sender import Outcome, request_meta
from loadgen.drivers.sessions import CallResult, Sessions
from loadgen.drivers.timing import RateCeiling
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import PlannedRequest, build_plan
from tests.run_helpers import ROOT, records

MS = 1_000_000
HOLD_S = 5.0  # a hold not released by then: the scheduler never allowed the order it asks for (the call fails)
Key = tuple[int, int]  # (session, call)


# ---- a fake sender: each call takes 10 ms, answers with a tool call when it is a tool turn --------------------
def call(session: int, c: int, parents: tuple[int, ...] = (), context: int | None = None, wait_ms: float = 0,
         agent: int = 0, step: int = 0, kind: str = "none", tool: bool = False) -> PlannedRequest:
    return PlannedRequest(0, 0, "agent", 10, 5, False, session=session, call=c, parents=parents, context=context,
                          wait_ns=int(wait_ms * MS), wait_kind=kind, agent=agent, step=step, tool_turn=tool)


def fan_out_join(session: int = 0) -> list[PlannedRequest]:
    """The WEKA fixture 7c3e9a10's graph (1 recorded second = 10 ms here): a tool round trip, 3 sub-agents,
    a tool wait inside sub-agent 1, the join, a user follow-up."""
    return [call(session, 0, tool=True), call(session, 1, (0,), 0, 5, kind="tool", step=1, tool=True),
            call(session, 2, (1,), None, 1, agent=1, tool=True), call(session, 3, (1,), None, 1, agent=2),
            call(session, 4, (1,), None, 1, agent=3), call(session, 5, (2,), 2, 2, agent=1, step=1, kind="tool"),
            call(session, 6, (1, 5, 3, 4), 1, 3, step=2), call(session, 7, (6,), 6, 10, step=3, kind="think")]


def background(session: int = 0) -> list[PlannedRequest]:
    """The WEKA fixture e05a7f3b's graph: an async sub-agent (calls 1, 3) that nothing joins."""
    return [call(session, 0, tool=True), call(session, 1, (0,), None, 1, agent=1, tool=True),
            call(session, 2, (0,), 0, 5, step=1), call(session, 3, (1,), 1, 2, agent=1, step=1, kind="tool")]


Sent = collections.namedtuple("Sent", "req body record")  # a call as the fake sender received and answered it


class FakeEngine:
    """drivers/sender.py's port: ``send`` takes 10 ms, then answers (``fail``: HTTP 500; ``cancel``: cancelled by
    the run's end). ``holds[(session, call)]``: that call ends only once each of these marks is set, ("sent" or
    "done", session, call), so the order a test asserts is forced by events, not by service times."""

    def __init__(self, plan: Any, fail: set[Key] = frozenset(), warmup_s: float = 0.0, stop_at: Key | None = None,
                 broken: set[Key] = frozenset(), cancel: set[Key] = frozenset(),
                 holds: dict[Key, set[tuple[str, int, int]]] | None = None) -> None:
        self.plan, self.fail, self.stop_at, self.broken, self.cancel = plan, fail, stop_at, broken, cancel
        self.holds, self.marks = holds or {}, collections.defaultdict(asyncio.Event)
        self.cfg = SimpleNamespace(send_ahead_ms=0.0, warmup_s=warmup_s)
        self.stats, self.ceiling = SimpleNamespace(t0_ns=time.monotonic_ns()), RateCeiling(None)
        self.sent: list[Sent] = []
        self.failed_bodies: list[PlannedRequest] = []
        self.stopping, self._seq = False, 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    async def send(self, req: PlannedRequest, t_intended_ns: int, body: bytes, after: int | None = None) -> Outcome:
        key = (req.session, req.call)
        if key in self.broken:
            raise RuntimeError("a bug")
        t_sent_ns = time.monotonic_ns()
        self.marks[("sent", *key)].set()
        self.stopping = self.stopping or key == self.stop_at  # the run stops as it goes
        await asyncio.wait_for(asyncio.gather(*(self.marks[m].wait() for m in self.holds.get(key, ()))), HOLD_S)
        await asyncio.sleep(0.01)
        failed = key in self.fail
        kind = "cancelled" if key in self.cancel else "http_5xx" if failed else None
        record = bare_record(request_meta(req, t_intended_ns, after), t_sent_ns, time.monotonic_ns(),
                             500 if failed else 200, kind, None)  # type: ignore[arg-type]
        self.sent.append(Sent(req, body, record))
        self.marks[("done", *key)].set()
        tools = (ToolCall(f"t{req.call}", "run_tests", "{}"),) if req.tool_turn else ()
        return Outcome(record, f"answer {req.call}", tools)

    def record_failure(self, req: PlannedRequest, t_intended_ns: int, exc: Exception) -> None:
        self.failed_bodies.append(req)


def open_plan(*sessions: list[PlannedRequest]) -> SimpleNamespace:
    reqs = [dataclasses.replace(r, seq=i) for i, r in enumerate(r for s in sessions for r in s)]
    return SimpleNamespace(requests=reqs, closed_loop=False, size=len(reqs), sessional=True, conversational=False)


class Bodies:
    """``CallFor``: the body names the call, its context's transcript and its parents' results, as received."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[list[dict[str, Any]], list[CallResult]]] = {}

    async def __call__(self, req: PlannedRequest, transcript: list[dict[str, Any]],
                       parents: list[CallResult]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.seen[(req.session, req.call)] = (transcript, parents)
        new = [{"role": "user", "content": f"call {req.call}"}]
        return {"messages": transcript + new}, new


def replay(engine: FakeEngine, bodies: Any = None) -> Sessions:
    sessions = make_scheduler(engine, None, bodies or Bodies())  # type: ignore[arg-type]
    assert isinstance(sessions, Sessions)

    async def main() -> None:
        t0 = time.monotonic_ns()
        for req in engine.plan.requests:
            sessions.start(req, t0 + req.t_intended_offset_ns)
        await sessions.wait()
    asyncio.run(main())
    return sessions


def by_call(engine: FakeEngine, session: int = 0) -> dict[int, RequestRecord]:
    return {s.record.call: s.record for s in engine.sent if s.record.session == session}


def check_schedule(plan_calls: list[PlannedRequest], records: dict[int, RequestRecord],
                   t_start_ns: int | None = None) -> None:
    """Every sent call: ``t_intended = t_ready + wait`` exactly, ``t_ready = max(parents' t_done)`` (a root's: the
    session's start), ``after_call`` the parent that ended last, sent no earlier than intended (1 ms grace)."""
    for req in plan_calls:
        r = records[req.call]
        assert r.t_intended_ns == r.t_ready_ns + r.wait_ns and r.wait_ns == req.wait_ns, req.call
        if req.parents:
            last = max(req.parents, key=lambda p: records[p].t_done_ns)
            assert r.t_ready_ns == records[last].t_done_ns and r.after_call == last, req.call
        else:
            assert r.after_call is None and (t_start_ns is None or r.t_ready_ns == t_start_ns), req.call
        assert r.t_sent_ns >= r.t_intended_ns - MS, req.call
        assert (r.agent, r.step, r.wait_kind) == (req.agent, req.step, req.wait_kind)


# ---- the scheduler, with a fake sender ------------------------------------------------------------------------
def test_a_fan_out_runs_together_and_the_join_waits_for_every_branch_even_the_slowest():
    calls = fan_out_join()
    fan = {("sent", 0, c) for c in (2, 3, 4)}  # the three sub-agents end only once all three were sent, and
    # sub-agent 2 (call 3) only after the other two branches ended (as "takes 2.0 s"): orders forced, not timed
    slowest = fan | {("done", 0, 5), ("done", 0, 4)}
    engine = FakeEngine(open_plan(calls), holds={(0, 2): fan, (0, 4): fan, (0, 3): slowest})
    replay(engine)
    r = by_call(engine)
    assert sorted(r) == list(range(8)) and all(x.error_kind is None for x in r.values())
    check_schedule(calls, r)
    siblings = [r[2], r[3], r[4]]
    assert max(x.t_sent_ns for x in siblings) < min(x.t_done_ns for x in siblings)  # all three in flight at once
    assert r[6].t_sent_ns >= max(r[p].t_done_ns for p in (1, 3, 4, 5)) and r[6].after_call == 3
    assert r[6].t_intended_ns == r[3].t_done_ns + 3 * MS  # the join's wait counts from the slowest branch


def test_each_call_extends_its_context_and_gets_its_parents_results():
    bodies = Bodies()
    replay(FakeEngine(open_plan(fan_out_join())), bodies)
    transcript, parents = bodies.seen[(0, 6)]  # the join: the transcript of call 1, the results of 1, 5, 3, 4
    assert [p.call for p in parents] == [1, 5, 3, 4] and [p.agent for p in parents] == [0, 1, 2, 3]
    assert [m["content"] for m in transcript] == ["call 0", "answer 0", "call 1", "answer 1"]
    assert transcript[1]["tool_calls"] == [{"id": "t0", "type": "function",
                                            "function": {"name": "run_tests", "arguments": "{}"}}]
    assert parents[0].tool_calls == (ToolCall("t1", "run_tests", "{}"),) and parents[1].answer == "answer 5"
    assert bodies.seen[(0, 2)][0] == []  # a sub-agent starts a fresh context
    assert [m["content"] for m in bodies.seen[(0, 7)][0]][-2:] == ["call 6", "answer 6"]


def test_a_background_sub_agent_is_not_waited_for_but_ends_its_session():
    calls = background()
    engine = FakeEngine(open_plan(calls), holds={(0, 1): {("sent", 0, 2)}})  # the sub-agent's call ends only
    # once the parent's next turn was sent: a scheduler that waited for the sub-agent would never send it
    sessions = replay(engine)
    r = by_call(engine)
    check_schedule(calls, r)
    assert r[2].t_sent_ns < r[1].t_done_ns  # the parent's next turn went while the sub-agent ran
    assert sessions.sessions == 1 and len(engine.sent) == 4  # the session ended with its last call


def test_a_failed_call_ends_its_branch_and_its_session_counts_failed():
    calls = fan_out_join()
    engine = FakeEngine(open_plan(calls, fan_out_join(1)), fail={(0, 2)})  # sub-agent 1's first call
    sessions = replay(engine)
    assert sorted(by_call(engine)) == [0, 1, 2, 3, 4]  # not 5 (its child), 6 (the join), 7 (after the join)
    assert sorted(by_call(engine, 1)) == list(range(8))  # the other session is whole
    assert (sessions.sessions, sessions.failed, sessions.calls_not_sent) == (2, 1, 3)
    assert "1 of 2 session(s) failed" in sessions.note()
    assert sessions.unfinished == []  # failed, not cut short by the run's end (sessions_not_finished: none)


def test_a_call_the_runs_end_cancelled_cuts_its_session_short_and_is_no_failure():
    # its descendants are not sent and the session is cut (run.json sessions_not_finished: neither a job nor a
    # failure), unless another call of it failed
    engine = FakeEngine(open_plan(fan_out_join(0), fan_out_join(1)), cancel={(0, 2), (1, 2)}, fail={(1, 4)})
    sessions = replay(engine)
    assert sorted(by_call(engine)) == sorted(by_call(engine, 1)) == [0, 1, 2, 3, 4]
    assert by_call(engine)[2].error_kind == "cancelled"
    assert (sessions.sessions, sessions.failed, sessions.calls_not_sent) == (2, 1, 6)
    assert sessions.unfinished == [0]  # session 1 also had a call fail: it counts failed


async def no_body_for_call_1(req: PlannedRequest, transcript: Any, parents: Any) -> Any:
    if req.call == 1:
        raise ValueError("no prompt")
    return {}, []


@pytest.mark.parametrize("fault", ["body", "driver"])
def test_a_body_that_cannot_be_built_or_a_fault_of_the_driver_is_recorded_failed_and_ends_its_branch(fault):
    engine = FakeEngine(open_plan(background()), broken={(0, 1)} if fault == "driver" else set())
    sessions = replay(engine, no_body_for_call_1 if fault == "body" else None)
    assert [r.call for r in engine.failed_bodies] == [1] and sorted(by_call(engine)) == [0, 2]
    assert (sessions.failed, sessions.calls_not_sent) == (1, 1)


def test_sessions_start_at_their_arrival_and_overlap_in_an_open_loop():
    engine = FakeEngine(open_plan(background(0), [dataclasses.replace(r, t_intended_offset_ns=20 * MS)
                                                  for r in background(1)]),
                        holds={(0, 3): {("sent", 1, 0)}})  # the first session ends only once the second began
    replay(engine)
    first, second = by_call(engine, 0), by_call(engine, 1)
    assert second[0].t_ready_ns - first[0].t_ready_ns == 20 * MS  # a root is ready at its session's start
    assert second[0].t_sent_ns < max(x.t_done_ns for x in first.values())


class ClosedPlan(SimpleNamespace):
    def unit(self, index: int) -> list[PlannedRequest]:
        """Sessions; with ``plain``, every other arrival is a request on its own."""
        if getattr(self, "plain", False) and index % 2:
            return [PlannedRequest(index, 0, "chat", 10, 5, False)]
        return background(index)


@pytest.mark.parametrize("size", [None, 10])
def test_a_closed_loop_user_runs_one_session_at_a_time_and_stops_at_the_plans_size(size):
    """Ended by the plan's size, or by the run's stop as the sixth session's first call goes out (never by a
    clock: on a loaded machine a 150 ms window held fewer sessions); the end time is only a bound."""
    engine = FakeEngine(ClosedPlan(requests=None, closed_loop=True, size=size, sessional=True,
                                   conversational=False), warmup_s=0.03, stop_at=None if size else (5, 0))
    sessions = make_scheduler(engine, None, Bodies())  # type: ignore[arg-type]
    end_ns = time.monotonic_ns() + 30_000 * MS

    async def main() -> None:
        await asyncio.gather(*(sessions.user(end_ns) for _ in range(2)))
    asyncio.run(main())
    spans = {}
    for s in engine.sent:
        r = s.record
        lo, hi, warm = spans.get(r.session, (r.t_ready_ns, 0, r.warmup))
        spans[r.session] = (min(lo, r.t_sent_ns), max(hi, r.t_done_ns), warm)
        assert r.warmup == warm  # a session is warm-up whole or not at all
    starts = sorted(spans.values())
    assert all(sum(lo <= t < hi for lo, hi, _ in starts) <= 2 for t, _, _ in starts)  # never 3 sessions at once
    assert len({s.req.seq for s in engine.sent}) == len(engine.sent)  # each call numbered as it goes
    assert all(s.record.t_sent_ns < end_ns for s in engine.sent)
    if size is None:
        assert len(spans) >= 4 and {w for *_, w in starts} == {True, False}
    else:
        assert len(engine.sent) == size and sessions.calls_not_sent >= 1


def test_a_stop_sends_nothing_more_and_the_session_ends():
    engine = FakeEngine(open_plan(fan_out_join()), stop_at=(0, 1))  # the run stops as call 1 is sent
    sessions = replay(engine)
    assert sorted(by_call(engine)) == [0, 1] and (sessions.calls_not_sent, sessions.failed) == (6, 0)
    assert sessions.unfinished == [0]  # cut by the stop: its calls were all OK, yet it is no completed job


def test_a_closed_loop_mixing_sessions_and_plain_requests_sends_both():
    engine = FakeEngine(ClosedPlan(requests=None, closed_loop=True, size=9, sessional=True, conversational=False,
                                   plain=True))

    async def turn_for(req: PlannedRequest, history: Any) -> tuple[dict[str, Any], str]:
        return {"prompt": "plain"}, "plain"
    sessions = make_scheduler(engine, turn_for, Bodies())  # type: ignore[arg-type]
    asyncio.run(sessions.user(None))
    kinds = [s.record.session for s in engine.sent]
    assert kinds == [0, 0, 0, 0, None, 2, 2, 2, 2]  # one unit after another: a session, a request, a session
    assert engine.sent[4].body == b'{"prompt": "plain"}' and engine.sent[4].record.call is None


# ---- agent traces replayed on the embedded simulator, checked against the send timestamps ---------------------
TRACES = ROOT / "tests" / "data" / "agent_traces"
FAN_OUT = ([(0, 0.0), (1, 0.1), (1, 0.1), (1, 0.1), (1, 0.2), (1, 0.5), (1, 1.0), (4, 0.3)], [0, 1, 1, 1, 1, 1, 1, 4])
CHAIN = ([(0, 0.0), (1, 0.25), (1, 0.75), (1, 1.0)], [0, 1, 1, 1])  # the 8 s user gap capped at max_wait_s: 1
BACKGROUND = ([(0, 0.0), (1, 0.1), (1, 0.2), (1, 0.5)], [0, 0, 1, 2])
OURS = [([(0, 0.0), (1, 0.0), (1, 0.0), (1, 0.0), (4, 0.3)], [0, 1, 1, 1, 4]),  # a plan call, 3 sub-agents, a join
        ([(0, 0.0), (1, 0.25), (1, 1.0)], [0, 1, 1])]  # a chain: its 2 s think time capped at max_wait_s: 1
# trace file, format, sessions (file order): (parents, wait s) of every call, sorted; children of every call, sorted
REPLAYS = {"weka": ("weka_traces.jsonl", "weka", [FAN_OUT, CHAIN, BACKGROUND]),
           "otel": ("otel_fanout_join.json", "otel", [FAN_OUT]),
           "otlp": ("otlp_tool_chain.json", "otel", [CHAIN]),  # the OTLP/JSON export
           "loadgen": ("loadgen_sessions.jsonl", "loadgen", OURS)}


def sim_scenario(trace: str, fmt: str, load: dict[str, Any], max_wait_s: float = 1.0, **sim: Any) -> Scenario:
    return Scenario.model_validate({
        "name": "replay", "seed": 3, "target": {"simulator": {"time_scale": 0.05, **sim}},
        "load": {"fail_fast_requests": 0, "drain_timeout_s": 10, **load},
        "workload": {"classes": [{"name": "agent", "session": {"trace": {
            "path": str(TRACES / trace), "format": fmt, "max_wait_s": max_wait_s}}}]}})


def run_records(scenario: Scenario, out: Path) -> tuple[pl.DataFrame, dict[tuple[int, int], PlannedRequest]]:
    """The run's session records, and each (session, call)'s plan (its parents)."""
    api.run(scenario, out=out)
    requests, _ = records(out)
    plan = build_plan(scenario)
    planned = {(r.session, r.call): r for s in requests["session"].unique().to_list()
               for r in plan.session(s)[1]}
    return requests.filter(pl.col("session").is_not_null()), planned


@pytest.fixture(scope="module", params=sorted(REPLAYS))
def replayed(request, tmp_path_factory):
    trace, fmt, expected = REPLAYS[request.param]
    scenario = sim_scenario(trace, fmt, {"arrival": "constant", "rate_per_s": 20, "requests": len(expected)})
    return (*run_records(scenario, tmp_path_factory.mktemp(request.param) / "run"), expected)


@pytest.mark.slow
def test_each_trace_replays_with_its_fan_out_join_and_tool_waits(replayed):
    requests, planned, expected = replayed
    assert requests["error_kind"].null_count() == requests.height
    backgrounds = 0
    for session, (waits, children) in enumerate(expected):
        plan_calls = [planned[key] for key in sorted(k for k in planned if k[0] == session)]
        assert sorted((len(r.parents), round(r.wait_ns / 1e9, 3)) for r in plan_calls) == waits, session
        assert sorted(sum(r.call in o.parents for o in plan_calls) for r in plan_calls) == children, session
        got = {r["call"]: SimpleNamespace(**r) for r in requests.filter(pl.col("session") == session).iter_rows(
            named=True)}
        assert sorted(got) == [r.call for r in plan_calls]  # every call sent, a background sub-agent's too
        check_schedule(plan_calls, got)  # type: ignore[arg-type]
        check_fan_out_and_join(plan_calls, got)
        backgrounds += check_background(plan_calls, got)
    assert backgrounds == (1 if len(expected) == 3 else 0)


def check_fan_out_and_join(plan_calls: list[PlannedRequest], got: dict[int, Any]) -> None:
    """A join is sent after every branch it joins; the sub-agents it joins ran together."""
    for join in (r for r in plan_calls if len(r.parents) > 1):
        assert got[join.call].t_sent_ns >= max(got[p].t_done_ns for p in join.parents)
        fan = [r.call for r in plan_calls if r.parents == (join.context,) and r.agent != 0]
        assert len(fan) == 3 and max(got[c].t_sent_ns for c in fan) < min(got[c].t_done_ns for c in fan)


def check_background(plan_calls: list[PlannedRequest], got: dict[int, Any]) -> int:
    """A sub-agent nothing joins: the main agent's next call was ready before the sub-agent ended (how many)."""
    found = 0
    for last in (r for r in plan_calls if r.agent != 0 and not any(r.call in o.parents for o in plan_calls)):
        spawner = next(r.parents[0] for r in plan_calls if r.agent == last.agent and r.context is None)
        for main in (r for r in plan_calls if r.agent == 0 and spawner in r.parents):
            assert got[main.call].t_ready_ns == got[spawner].t_done_ns < got[last.call].t_done_ns
            found += 1
    return found


@pytest.mark.slow
def test_a_closed_loop_user_runs_one_whole_session_at_a_time(tmp_path):
    scenario = sim_scenario("weka_traces.jsonl", "weka", {"arrival": "concurrency", "concurrency": 2,
                                                          "duration_s": 1.5, "warmup_s": 0.5}, max_wait_s=0.2)
    requests, _ = run_records(scenario, tmp_path / "run")
    spans = requests.group_by("session").agg(pl.col("t_ready_ns").min().alias("start"),
                                             pl.col("t_done_ns").max().alias("end"), pl.col("warmup").n_unique())
    assert spans.height >= 4 and spans["warmup"].max() == 1  # a session is warm-up whole or not at all
    assert requests["warmup"].n_unique() == 2
    for start in spans["start"]:  # two users: never three sessions at once
        assert spans.filter((pl.col("start") <= start) & (pl.col("end") > start)).height <= 2


@pytest.mark.slow
def test_a_failed_call_stops_its_descendants_and_the_session_counts_failed(tmp_path):
    scenario = sim_scenario("weka_traces.jsonl", "weka", {"arrival": "constant", "rate_per_s": 20, "requests": 6},
                            max_wait_s=0.2, faults={"error_rate": 0.25})
    requests, planned = run_records(scenario, tmp_path / "run")
    failed = {(r["session"], r["call"]) for r in requests.filter(pl.col("error_kind").is_not_null()).iter_rows(
        named=True)}
    sent = set(zip(requests["session"], requests["call"]))
    assert failed and sent < set(planned)
    for (session, c), req in planned.items():  # sent exactly when every parent was sent and did not fail
        assert ((session, c) in sent) == all((session, p) in sent - failed for p in req.parents), (session, c)
    notes = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "session(s) failed" in json.dumps(notes)

