"""One process's share of a plan (plan/slicing.py) and the deadlines every Locust wait derives from
(plan/deadlines.py): pure arithmetic, tested on a clock the test holds."""

from __future__ import annotations

from loadgen import api
from loadgen.plan.deadlines import SHUTDOWN_S, START_LEAD_S, WORKER_GRACE_S, give_up_s, hard_end_s, run_bound_s
from loadgen.plan.schedule import build_plan
from loadgen.plan.slicing import PlanSlice
from tests.run_helpers import ROOT

SMOKE = ROOT / "scenarios" / "smoke.yaml"


def test_a_slice_takes_every_nth_arrival_from_its_index():
    sc = api.load_scenario(SMOKE)
    part = PlanSlice(build_plan(sc), sc)
    part.start(index=1, workers=3, t0_ns=0)
    assert [part.take_position() for _ in range(4)] == [1, 4, 7, 10]
    part.reset()
    assert part.t0_ns is None and part.give_up_ns() is None and part.take_position() == 1


def test_every_plan_has_a_finite_hard_end_and_the_bound_adds_the_grace_and_the_shutdown():
    sc = api.load_scenario(SMOKE, overrides={"load.drain_timeout_s": 5})
    plan = build_plan(sc)
    end_s = hard_end_s(plan, sc)
    assert end_s == plan.hard_end_s(5)  # the plan's own when it has one
    assert give_up_s(plan, sc) == end_s + WORKER_GRACE_S
    assert run_bound_s(plan, sc) == START_LEAD_S + end_s + WORKER_GRACE_S + 6 * SHUTDOWN_S
    counted = api.load_scenario(SMOKE, overrides={"load": {"arrival": "concurrency", "concurrency": 4,
                                                           "requests": 10}, "target.request_timeout_s": 2})
    counted_plan = build_plan(counted)
    assert counted_plan.hard_end_s(counted.load.drain_timeout_s) is None  # bounded by its count only
    # 10 requests by 4 users: 3 rounds, each at most the request timeout, then the drain
    assert hard_end_s(counted_plan, counted) == counted.load.warmup_s + 3 * 2 + counted.load.drain_timeout_s


def test_a_slice_stops_sending_at_its_time_and_gives_up_after_the_grace():
    sc = api.load_scenario(SMOKE, overrides={"load": {"arrival": "concurrency", "concurrency": 2,
                                                      "duration_s": 10, "warmup_s": 2, "drain_timeout_s": 5}})
    part = PlanSlice(build_plan(sc), sc)
    assert not part.sending_over(10**18) and not part.past_give_up(10**18)  # no slice yet: no clock to read
    part.start(0, 1, t0_ns=1_000)
    assert not part.sending_over(1_000 + 11_999_999_999) and part.sending_over(1_000 + 12 * 10**9)
    assert part.turn_too_late(1_000 + 12 * 10**9) and not part.turn_too_late(1_000)
    assert part.hard_end_ns() == 1_000 + 17 * 10**9
    assert not part.past_give_up(part.hard_end_ns()) and part.past_give_up(1_000 + int((17 + WORKER_GRACE_S) * 1e9))
