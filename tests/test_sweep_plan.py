"""The sweep's time and its words, without real runs: the planner sizes steps from the samples objectives need,
fixed steps run the duration given (longer only with --until decided, announced with its cap), the search
narrows a capacity in virtual time within its budget, UNDECIDED names its objective and shortfall, the console
never says None, and the knee is reported only where the curve turns."""

from __future__ import annotations

import io
import math
import types
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from loadgen.analysis.capacity import ObjectiveCall
from loadgen.analysis.sweep_result import Step, knee_of, summarize_sweep
from loadgen.plan.scenario import Scenario
from loadgen.report.sweep_report import points_text
from loadgen.run import sweep as sweep_mod
from loadgen.run.search import CapacitySearch, Need, StepPlanner, Trial, steps_left
from loadgen.run.sweep import SweepOptions, run_sweep, with_evidence

WARMUP_S, OVERHEAD_S = 5.0, 6.0  # the simulated world's warm-up and per-step start, drain and analysis


def _step(load: float, duration_s: float, call: str, objectives: list[dict[str, Any]] | None = None,
          ttft_p90: float | None = 50.0, saturated: bool = False, attempt: int = 1) -> Step:
    wall_s = duration_s + WARMUP_S + OVERHEAD_S
    return Step(load, duration_s, attempt, wall_s, call, saturated,  # type: ignore[arg-type]
                {"pass": "pass", "fail": "fail"}.get(call, "inconclusive"), objectives or [], None, load, None,
                None, load, int(load * duration_s), 0, {"ttft_ms": {"p50": None, "p90": ttft_p90, "p99": None}},
                None, None)


# ---- the planner -------------------------------------------------------------------------------------------
def test_planner_sizes_a_step_by_the_samples_its_neighbours_need_at_the_new_load() -> None:
    planner = StepPlanner(min_s=5, max_s=100)
    near = Trial(10.0, "undecided", duration_s=10, needs=(Need("ttft_ms.p99", samples=50, needed=100),))
    # 5 samples/s at 10 req/s → 10/s at 20 req/s; 100 samples × 1.25 margin / 10 per s = 12.5 s
    assert planner.needed_s(20.0, [near])[0] == pytest.approx(12.5)
    assert planner.needed_s(20.0, [near])[1].startswith("ttft_ms.p99: ~1")
    assert planner.duration_s(20.0, [near], "bisect", allowed_s=1000) == pytest.approx(12.5)
    assert planner.duration_s(20.0, [near], "bracket", allowed_s=1000) == 5  # bracketing: the shortest
    assert planner.duration_s(20.0, [near], "bisect", allowed_s=8) == 8  # what the budget allows
    assert planner.duration_s(2.0, [near], "bisect", allowed_s=1000) == 100  # 125 s wanted: the maximum
    # running a load again: what it needs, and at least 1.5× its last
    assert planner.duration_s(10.0, [near], "again", allowed_s=1000) == pytest.approx(25.0)
    almost = Trial(10.0, "undecided", duration_s=10, needs=(Need("ttft_ms.p99", samples=95, needed=100),))
    assert planner.duration_s(10.0, [almost], "again", allowed_s=1000) == 15  # 13.2 s needed: 1.5× the last
    decided = Trial(40.0, "fail", duration_s=10)
    assert planner.needed_s(30.0, [decided])[0] == 0 and planner.duration_s(30.0, [decided], "bisect", 99) == 5


def test_the_planner_reads_the_nearest_load_below_and_above_only() -> None:
    far = Trial(1.0, "undecided", duration_s=10, needs=(Need("itl_ms.p99", 10, 10_000),))
    below = Trial(8.0, "pass", duration_s=10)
    above = Trial(16.0, "undecided", duration_s=10, needs=(Need("ttft_ms.p99", 160, 320),))
    planner = StepPlanner(1, 1000)
    # 16/s at 16 → 12/s at 12: 320 × 1.25 / 12 (8 passed: it asks for nothing of ttft_ms.p99)
    assert planner.needed_s(12.0, [far, below, above])[0] == pytest.approx(320 * 1.25 / 12)


def test_between_two_loads_the_smaller_need_counts_never_below_the_floor() -> None:
    decided = Trial(20.0, "pass", duration_s=10, needs=(Need("x", 200, None, decided=True, room=0.5),))
    undecided = Trial(30.0, "undecided", duration_s=10, needs=(Need("x", 300, 4800, room=0.01),))
    planner = StepPlanner(10, 1000)  # a decided objective counts as decided in a shortest step (here its 10 s)
    # at 25 req/s both gather 25 samples/s: 200 sufficed at 20 (8 s), 4800 are needed at 30 (192 s): the smaller
    assert planner.needed_s(25.0, [decided, undecided])[0] == pytest.approx(1.25 * 8)
    # a floor: 600 samples were needed at 10 req/s with 50 % room (too few samples, not too little margin)
    floor = Trial(10.0, "undecided", duration_s=10, needs=(Need("x", 100, 600, room=0.5),))
    assert planner.needed_s(25.0, [floor, decided, undecided])[0] == pytest.approx(1.25 * 600 / 25)
    # a decided objective alone asks for nothing more at its own load, nor beyond the loads probed
    assert planner.needed_s(20.0, [decided])[0] == 0 == planner.needed_s(40, [decided])[0]


def test_steps_left_counts_the_bisections_to_the_tolerance() -> None:
    from loadgen.run.search import Probe

    assert steps_left([Probe(24, "pass"), Probe(48, "fail")], 0.05) == 4  # 24 wide → 2.4: log2(10) → 4
    assert steps_left([Probe(24, "pass"), Probe(25, "fail")], 0.05) == 1
    assert steps_left([Probe(24, "pass")], 0.05) == 3


def test_evidence_is_read_defensively_from_the_call_and_the_summary() -> None:
    call = ObjectiveCall("ttft_ms.p99", 1500.0, "<=", 900.0, None, None, "undecided", "point")
    floor = [{"objective": "ttft_ms.p99", "samples": 60, "note": "needs >= 100 samples"}]
    assert (with_evidence(call, floor)["samples"], with_evidence(call, floor)["needed"]) == (60, 100)
    stated = [{"objective": "ttft_ms.p99", "samples": 300, "needed": 812.4, "note": ""}]
    assert with_evidence(call, stated)["needed"] == 813  # type: ignore[arg-type]
    unknown = [{"objective": "ttft_ms.p99", "samples": 300, "note": ""}]
    assert with_evidence(call, unknown)["needed"] == 1200  # type: ignore[arg-type]  # 4× its samples
    assert with_evidence(call, [])["needed"] is None and not with_evidence(call, [])["samples"]
    passed = ObjectiveCall("itl_ms.p99", 100.0, "<=", 50.0, 40.0, 60.0, "pass", "bootstrap")
    assert with_evidence(passed, stated)["needed"] is None  # type: ignore[arg-type]


# ---- the words ---------------------------------------------------------------------------------------------
def test_undecided_names_the_objective_and_its_shortfall() -> None:
    short = {"objective": "ttft_ms.p99", "call": "undecided", "samples": 80, "needed": 100, "ci_low": None,
             "ci_high": None, "threshold": 1500}
    close = {"objective": "itl_ms.p99", "call": "undecided", "samples": 9000, "needed": 36000, "ci_low": 95.0,
             "ci_high": 104.0, "threshold": 100}
    line = _step(8, 10, "undecided", [short, close]).line("rate")
    assert "UNDECIDED (ttft_ms.p99: 80 of ~100 samples; itl_ms.p99: 9000 of ~36000 samples)" in line
    assert "(10 s)" in line
    close.pop("needed")
    assert _step(8, 10, "undecided", [close]).undecided_reasons() == [
        "itl_ms.p99: its interval 95–104 holds the limit 100"]
    close["reason"] = "95% interval 95–104 straddles the limit"
    assert _step(8, 10, "undecided", [close]).undecided_reasons() == [
        "itl_ms.p99: 95% interval 95–104 straddles the limit"]
    assert "None" not in line
    bare = _step(8, 10, "undecided", [{"objective": "ttft_ms.p99", "call": "undecided"}]).line("rate")
    assert "ttft_ms.p99: too few samples to judge" in bare


@pytest.mark.parametrize("curve, knee", [
    ([(4, 50), (8, 55), (16, 60), (24, 400), (32, 3000)], 16),  # flat, then a turn seen at two loads
    ([(4, 50), (8, 55), (16, 60), (24, 70), (32, 3000)], None),  # rises only at the last load: no knee
    ([(4, 50), (8, 55), (16, 62)], None),  # never rises: the highest load is not a knee
    ([(4, 50), (8, 90), (16, 170), (24, 330), (32, 650)], None),  # rises all along: no turn
    ([(4, 50), (8, 300), (16, 900)], None),  # no load before the turn
])
def test_the_knee_is_only_where_the_curve_turns(curve: list[tuple[float, float]], knee: float | None) -> None:
    assert knee_of([_step(load, 10, "pass", ttft_p90=p90) for load, p90 in curve]) == knee


def test_no_knee_and_no_saturation_are_said_in_words() -> None:
    r = summarize_sweep("s", "rate", [_step(4, 10, "pass"), _step(8, 10, "pass")], None, 0.05, 0.95, "", 1.0, None,
                        fixed=True)
    assert points_text(r) == "no knee, not saturated"


# ---- the sweep's time, in virtual time ---------------------------------------------------------------------
class World:
    """A server whose capacity is ``capacity`` req/s: at load L for d seconds, an objective whose margin is
    |C − L| / C needs 2 / margin² samples (and at least 100) to be decided; above 1.3 C it saturates. The clock
    advances by each step's warm-up, duration and overhead."""

    def __init__(self, capacity: float) -> None:
        self.capacity, self.now, self.runs = capacity, 0.0, []  # type: list[tuple[float, float]]
        self.runs: list[tuple[float, float]] = []

    def clock(self) -> float:
        return self.now

    def run_step(self, sc: Scenario, run_dir: Path) -> Any:
        load = sc.load.rate_per_s
        assert load is not None and sc.load.duration_s is not None
        self.runs.append((load, sc.load.duration_s))
        self.now += WARMUP_S + sc.load.duration_s + OVERHEAD_S
        return types.SimpleNamespace(interrupted=False, run_dir=run_dir)

    def judge(self, result: Any, sc: Scenario, opts: Any, load: float, duration_s: float, attempt: int,
              wall_s: float) -> Step:
        samples = int(load * duration_s)
        margin = abs(self.capacity - load) / self.capacity
        needed = max(100, math.ceil(2 / max(margin, 1e-6) ** 2))
        call = "undecided" if samples < needed else "pass" if load < self.capacity else "fail"
        objective = {"objective": "ttft_ms.p99", "call": call, "samples": samples, "threshold": 1500.0,
                     "value": 1500.0 * load / self.capacity, "comparison": "<=",
                     "needed": needed if call == "undecided" else None, "ci_low": None, "ci_high": None}
        step = _step(load, duration_s, call, [objective], saturated=load > 1.3 * self.capacity, attempt=attempt)
        step.wall_s = WARMUP_S + duration_s + OVERHEAD_S
        return step


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(27.5)
    monkeypatch.setattr(sweep_mod, "judge_step", w.judge)
    monkeypatch.setattr(sweep_mod.time, "monotonic", w.clock)
    monkeypatch.setattr(sweep_mod, "write_sweep", lambda result: None)
    return w


def _scenario(duration_s: float = 60.0) -> Scenario:
    return Scenario.model_validate({
        "name": "virtual", "target": {"base_url": "embedded"}, "seed": 1,
        "load": {"arrival": "poisson", "rate_per_s": 6, "duration_s": duration_s, "warmup_s": WARMUP_S},
        "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 16},
                                  "output_tokens": {"dist": "fixed", "value": 8}}]},
        "slo": {"ttft_ms": {"p99": 1500}}})


def _sweep(world: World, opts: SweepOptions, tmp_path: Path) -> tuple[Any, str]:
    out = io.StringIO()
    result = run_sweep(_scenario(), opts, tmp_path / "sweep", world.run_step, Console(file=out, width=300))
    return result, out.getvalue()


def test_find_max_narrows_to_a_fifth_within_its_budget(world: World, tmp_path: Path) -> None:
    result, text = _sweep(world, SweepOptions("rate", budget_s=480), tmp_path)
    cap = result.capacity
    print(text, world.runs)
    assert cap.decided and cap.low < world.capacity < cap.high
    assert cap.high - cap.low <= 0.20 * cap.high
    assert world.now <= 480  # the time asked, in the world's time
    assert world.runs[0] == (6.0, 10.0) and world.runs[1] == (12.0, 10.0)  # bracketing: the shortest steps
    assert max(d for _, d in world.runs) > 10.0  # near the capacity the planner gives its objectives time
    assert "None" not in text and "search by rate from 6, steps sized by the planner, 10–480 s" in text


def test_a_search_that_cannot_narrow_says_so_and_why(world: World, tmp_path: Path) -> None:
    result, text = _sweep(world, SweepOptions("rate", budget_s=120, tolerance=0.01), tmp_path)
    assert any("wider than --tolerance 1%" in r and "--budget 120 s spent" in r for r in result.reasons), text
    assert world.now <= 120


def test_fixed_steps_take_exactly_the_duration_given(world: World, tmp_path: Path) -> None:
    result, text = _sweep(world, SweepOptions("rate", loads=[2, 4], step_duration_s=10), tmp_path)
    assert world.runs == [(2.0, 10.0), (4.0, 10.0)]  # both undecided (20 and 40 samples): no re-run
    assert [s.call for s in result.steps] == ["undecided", "undecided"] and result.exit_code == 3
    assert "ttft_ms.p99: 20 of ~100 samples" in text and "--until" not in text and "None" not in text


def test_until_decided_runs_undecided_steps_again_up_to_the_cap_it_announces(world: World, tmp_path: Path) -> None:
    opts = SweepOptions("rate", loads=[2, 4], step_duration_s=10, until="decided", max_step_duration_s=40)
    result, text = _sweep(world, opts, tmp_path)
    assert "--until decided: an undecided step runs again, as long as its objectives need, up to 40 s" in \
        text.splitlines()[0]
    # 2 req/s needs 100 samples: 62.5 s wanted, 40 allowed → still undecided, no further try
    # 4 req/s: 31.25 s → 400 × ... decided
    assert world.runs == [(2.0, 10.0), (2.0, 40.0), (4.0, 10.0), (4.0, 31.2)]
    assert [(s.load, s.call, s.attempt) for s in result.steps][-1] == (4.0, "pass", 2)
    assert "2 stays undecided" in text


def test_search_climbs_past_undecided_steps_and_certifies_the_low_end(world: World, tmp_path: Path) -> None:
    search = CapacitySearch(1.0, 0.01, 1000.0, tolerance=0.05)
    trials = [Trial(1.0, "undecided", duration_s=10, needs=(Need("x", 10, 100),))]
    plan = lambda load, phase: StepPlanner(10, 100).duration_s(load, trials, phase, 1000)  # noqa: E731
    assert search.next_step(trials, plan) == (2.0, "bracket", "")  # undecided on the way up: climb on
    trials += [Trial(2.0, "undecided", duration_s=10, needs=(Need("x", 20, 100),)), Trial(4.0, "fail")]
    assert search.next_step(trials, plan) == (2.0, "again", "")  # a failure, none passed: decide 2 first
    # ... unless 2 cannot be decided within the budget while 1 can
    assert search.next_step(trials, plan, decisive=lambda load: load < 2) == (1.0, "again", "")


def test_bisection_goes_first_where_the_verdict_changes() -> None:
    search = CapacitySearch(6.0, 0.01, 1000.0, tolerance=0.05)
    plan = lambda load, phase: 10.0  # noqa: E731  # nothing can run again: only new loads
    leaning_fail = [Trial(12.0, "pass"), Trial(24.0, "undecided", duration_s=10, lean="fail"), Trial(48.0, "fail")]
    assert search.next_step(leaning_fail, plan) == (18.0, "bisect", "")  # not 36: 24 leans fail
    leaning_pass = [Trial(12.0, "pass"), Trial(24.0, "undecided", duration_s=10, lean="pass"), Trial(48.0, "fail")]
    assert search.next_step(leaning_pass, plan) == (36.0, "bisect", "")
    narrow = [Trial(23.0, "pass"), Trial(24.0, "undecided", duration_s=10, lean="fail"), Trial(48.0, "fail")]
    # the changing gap is narrow: a decided failure is sought just above the undecided load, not at 36
    assert search.next_step(narrow, plan) == (26.4, "bisect", "")
    below = [Trial(10.0, "pass"), Trial(20.0, "undecided", duration_s=10, lean="pass"),
             Trial(20.5, "undecided", duration_s=10, lean="fail"), Trial(30.0, "fail")]
    assert search.next_step(below, plan) == (18.18, "bisect", "")  # [10, 20], the widest: just below 20 (/1.1)
    below[0] = Trial(19.0, "pass")
    assert search.next_step(below, plan) == (22.55, "bisect", "")  # [20.5, 30]: just above 20.5 (× 1.1)
