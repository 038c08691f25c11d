"""Capacity from the curve (analysis/capacity_curve.py): each objective fitted monotone in the load over all of
a sweep's steps, the load where it crosses its limit with a bootstrap interval, an objective flat at its limit
said in words, and the search placing its next step inside the crossing's interval."""

from __future__ import annotations

import io
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, strategies as st
from rich.console import Console
from scipy.optimize import isotonic_regression

from loadgen.analysis.capacity_curve import (CurvePoint, capacity_of_curves, crossings, curves_of, isotonic,
                                             objective_curve, step_points)
from loadgen.analysis.compare import RunSamples, censored_waits
from loadgen.plan.scenario import Scenario
from loadgen.analysis.sweep_result import Step, SweepResult, summarize_sweep
from loadgen.report.sweep_curves import curve_lines
from loadgen.report.sweep_report import headline, render_html, summary_markdown
from loadgen.run import sweep as sweep_mod
from loadgen.run.search import CapacitySearch, CurveSpan, Trial
from loadgen.run.sweep import SweepOptions, run_sweep


def point(load: float, value: float, weight: float = 1000.0, objective: str = "ttft_ms.p99", level: float = 0.01,
          comparison: str = "<=", threshold: float = 500.0, kind: str = "exceedance", spread: float = 0.0,
          own: float | None = None, seed: int = 0) -> CurvePoint:
    """A step's point on an objective's curve; its replicates scattered by ``spread`` around its value."""
    reps = value + spread * np.random.default_rng(seed).standard_normal(1000)
    return CurvePoint(objective, comparison, threshold, level, kind, load, value, weight, reps, own)


@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.floats(0.01, 1e3)), min_size=1, max_size=14))
def test_the_fit_is_scipys_weighted_isotonic_regression(rows: list[tuple[float, float]]) -> None:
    y, w = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    assert np.allclose(isotonic(y, w)[0], isotonic_regression(y, weights=w).x, rtol=1e-9, atol=1e-6)


def test_the_crossing_is_interpolated_between_fitted_steps_and_censored_beyond_them() -> None:
    loads = np.array([10.0, 20.0, 30.0])
    got = crossings(loads, np.array([[0.0, 0.005, 0.03], [0.02, 0.03, 0.04], [0.0, 0.0, 0.001]]), 0.01)
    assert got[0] == pytest.approx(22.0)  # 0.005 → 0.03 over 20 → 30: 0.01 at 22
    assert got[1] == -np.inf and got[2] == np.inf


def test_a_jump_between_two_probes_leaves_the_crossing_anywhere_between_them() -> None:
    """No share above the limit at 24 req/s, all of them at 48 (a saturated step): the interpolation's 36 is a
    guess, and the interval is the whole gap, never a width of zero."""
    c = objective_curve([point(x, v, spread=0.0) for x, v in ((6, 0.0), (24, 0.0), (48, 1.0))], 0.95)
    assert c is not None and c.crossing == pytest.approx(24.24) and (c.low, c.high) == (24, 48)


def test_a_noisy_non_monotone_curve_is_fitted_monotone_and_steps_at_one_load_pool() -> None:
    pts = [point(10, 0.002), point(20, 0.012, weight=1000), point(20, 0.004, weight=3000), point(25, 0.004),
           point(30, 0.05)]
    c = objective_curve(pts, 0.95)
    assert c is not None and c.loads == [10, 20, 25, 30]
    assert c.values[1] == pytest.approx(0.006)  # 1000 × 0.012 + 3000 × 0.004 over 4000 samples
    assert c.fitted == pytest.approx([0.002, 0.0056, 0.0056, 0.05])  # 20 (4000 samples) and 25 (1000) pooled
    assert c.side == "inside" and c.crossing == pytest.approx(25 + 5 * (0.01 - 0.0056) / (0.05 - 0.0056))


def test_the_interval_comes_from_the_replicates_and_narrows_with_more_samples() -> None:
    def curve(spread: float) -> Any:
        return objective_curve([point(10, 0.0, spread=spread, seed=1), point(20, 0.005, spread=spread, seed=2),
                                point(30, 0.015, spread=spread, seed=3), point(40, 0.03, spread=spread, seed=4)],
                               0.95)
    wide, narrow = curve(0.003), curve(0.0005)
    assert narrow.crossing == pytest.approx(25.0)
    assert wide.low < narrow.low <= 25.0 <= narrow.high < wide.high


def test_a_greater_or_equal_objective_falls_with_the_load() -> None:
    """goodput.min_ratio >= 0.95: the good share falls as the load rises; it crosses where it drops below."""
    pts = [point(x, v, objective="goodput.min_ratio", level=0.95, comparison=">=", threshold=0.95, kind="statistic")
           for x, v in ((10, 1.0), (20, 0.99), (30, 0.91), (40, 0.97), (50, 0.5))]
    c = objective_curve(pts, 0.95)
    assert c is not None and all(a >= b for a, b in zip(c.fitted, c.fitted[1:]))
    assert c.fitted[2] == c.fitted[3] == pytest.approx(0.94)  # 30 and 40 pooled: non-increasing
    assert c.crossing == pytest.approx(20 + 10 * (0.99 - 0.95) / (0.99 - 0.94))


def test_the_capacity_is_the_lowest_crossing_and_an_objective_never_crossed_does_not_bound_it() -> None:
    ttft = [point(x, v, spread=0.001, seed=x) for x, v in ((10, 0.0), (20, 0.005), (30, 0.015), (40, 0.03))]
    errors = [point(x, 0.0, objective="error_rate.max", level=0.01, threshold=0.01, kind="statistic")
              for x in (10, 20, 30, 40)]
    curves = curves_of(ttft + errors, 0.95)
    assert [c.side for c in curves] == ["inside", "above"]
    cap = capacity_of_curves(curves, 0.95, "req/s")
    assert cap is not None and cap.objective == "ttft_ms.p99" and cap.estimate == pytest.approx(25.0)
    assert cap.low is not None and cap.high is not None and cap.low < 25 < cap.high


def test_an_objective_flat_at_its_limit_says_so_and_the_capacity_is_the_intervals_low_end() -> None:
    """ITL p99 within ±5 % of its 100 ms limit from 21.8 to 28.5 req/s (the issue's sweep): said in words, and
    the capacity is where the curve's upper bound still meets the limit."""
    pts = [point(x, v, objective="itl_ms.p99", threshold=100.0, spread=0.002, own=ms, seed=int(x))
           for x, v, ms in ((12, 0.002, 60), (21.8, 0.0095, 97), (25, 0.0099, 99.5), (28.5, 0.0104, 103),
                            (40, 0.05, 300))]
    curves = curves_of(pts, 0.95)
    assert curves[0].flat == (21.8, 28.5)
    cap = capacity_of_curves(curves, 0.95, "req/s")
    assert cap is not None and cap.flat == "itl_ms.p99 within ±5 % of its limit from 21.8 to 28.5 req/s"
    assert cap.estimate == cap.low


def test_step_points_count_each_token_of_a_per_token_metric_by_its_request() -> None:
    """itl_ms.p99 <= 100: the share of tokens above 100 ms, a token weighted by its request's weight."""
    n = 4
    s = RunSamples(np.full(n, 50.0), np.full(n, 10.0), np.full(n, 500.0), np.ones(n, bool), np.zeros(n, bool),
                   np.ones(n, bool), np.full(n, 3.0), np.zeros(n), np.array([10, 200, 10, 10, 10, 10, 150, 10.0]),
                   np.array([0, 0, 1, 1, 2, 2, 3, 3]), 10.0, np.arange(n))
    slo = [{"objective": "itl_ms.p99", "threshold": 100.0, "comparison": "<=", "value": 180.0},
           {"objective": "ttft_ms.p50", "threshold": 40.0, "comparison": "<=", "value": 50.0},
           {"objective": "error_rate.max", "threshold": 0.01, "comparison": "<=", "value": 0.0},
           {"objective": "ttft_ms[1-512 prompt tokens].p99", "threshold": 40.0, "comparison": "<=", "value": 50}]
    pts = {p.objective: p for p in step_points(slo, s, 12.0, replicates=200, seed=1)}
    assert set(pts) == {"itl_ms.p99", "ttft_ms.p50", "error_rate.max"}  # a scoped objective: judged per step
    itl = pts["itl_ms.p99"]
    assert (itl.value, itl.weight, itl.level, itl.kind) == (0.25, 8.0, pytest.approx(0.01), "exceedance")
    assert pts["ttft_ms.p50"].value == 1.0 and pts["ttft_ms.p50"].level == 0.5
    assert pts["error_rate.max"].value == 0.0 and pts["error_rate.max"].kind == "statistic"
    assert len(itl.replicates) == 200 and 0 <= np.nanmin(itl.replicates) <= np.nanmax(itl.replicates) <= 0.5


# ---- the search and the sweep's result -----------------------------------------------------------------------
def test_the_search_probes_the_wider_side_of_the_crossing_interval_and_stops_within_tolerance() -> None:
    search = CapacitySearch(6, 0.1, 1000, tolerance=0.05)
    load, phase, _ = search.next_step([], lambda x, p: 60.0, curve=CurveSpan(20.0, 30.0, 27.0))
    assert (load, phase) == (23.5, "narrow")  # 20–27 is the wider side: its middle
    load, _, _ = search.next_step([], lambda x, p: 60.0, curve=CurveSpan(20.0, 30.0, 22.0))
    assert load == 26.0
    assert search.next_step([], lambda x, p: 60.0, curve=CurveSpan(27.0, 28.0, 27.5))[::2] == (None,
                                                                                              "within tolerance")


def test_a_load_within_a_quarter_of_the_tolerance_of_one_tried_runs_that_one_again() -> None:
    """The real sweep probed 25.26 beside 25.24: a step there adds nothing a second step at 25.24 would not."""
    search = CapacitySearch(6, 0.1, 1000, tolerance=0.05)
    tried = [Trial(23.49, "pass", duration_s=60.0)]
    load, phase, _ = search.next_step(tried, lambda x, p: 60.0, curve=CurveSpan(20.0, 30.0, 27.0))
    assert (load, phase) == (23.49, "narrow")  # 23.5 is 0.04 % from 23.49: pooled with it
    tried = [Trial(23.0, "pass", duration_s=60.0)]
    assert search.next_step(tried, lambda x, p: 60.0, curve=CurveSpan(20.0, 30.0, 27.0))[0] == 23.5  # 2 %


def test_a_flat_limiting_objective_stops_the_search_instead_of_spending_the_budget() -> None:
    search = CapacitySearch(6, 0.1, 1000, tolerance=0.05)
    load, _, why = search.next_step([], lambda x, p: 60.0, curve=CurveSpan(22.0, 28.0, 22.0, (21.8, 28.5)))
    assert load is None and "flat at its limit from 21.8 to 28.5" in why
    assert "the interval 22–28: 21% of its upper end, wider than the tolerance 5% because more samples in a " \
        "flat range do not narrow it" in why


def _step(load: float, value: float, call: str) -> Step:
    step = Step(load, 60.0, 1, 70.0, call, False, call, [{"objective": "ttft_ms.p99", "call": call,
                                                             "threshold": 500.0, "comparison": "<="}],
                None, load, None, None, load, int(load * 60), 0, {}, None, None)
    step.curve = [point(load, value, spread=0.0015, seed=int(load))]
    return step


def test_the_sweep_result_takes_its_capacity_from_the_curve_and_shows_it() -> None:
    steps = [_step(10, 0.0, "pass"), _step(20, 0.006, "undecided"), _step(30, 0.014, "undecided"),
             _step(40, 0.04, "fail")]
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 300.0, None)
    cap = r.capacity
    assert cap.method == "curve" and cap.objective == "ttft_ms.p99" and cap.estimate == pytest.approx(25.0)
    assert cap.decided and (cap.low, cap.high) == (20, 30) and r.exit_code == 0
    assert headline(r).startswith("capacity 25 req/s, interval ") and "% of its upper end" in headline(r)
    doc = r.to_dict()
    assert "curve" not in doc["steps"][0] and doc["curves"][0]["points"][1] == {
        "load": 20.0, "value": 0.006, "fitted": 0.006, "weight": 1000.0}
    again = SweepResult.from_dict(doc)
    assert again.capacity == cap and again.curves == doc["curves"]
    line = curve_lines(r)[0]
    assert line.startswith("ttft_ms.p99 ≤ 500: crosses at 25 req/s (interval ") and "20: 0.60%" in line
    assert "Capacity curves" in render_html(r) and "- curve: ttft\\_ms.p99" in summary_markdown(r)


def test_fixed_steps_stay_slo_tests_and_steps_without_records_keep_the_calls() -> None:
    steps = [_step(10, 0.0, "pass"), _step(40, 0.04, "fail")]
    assert summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None, fixed=True).capacity.method == "steps"
    for s in steps:
        s.curve = []
    cap = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None).capacity
    assert (cap.method, cap.low, cap.high) == ("steps", 10, 40)


def test_a_saturated_step_bounds_the_capacity_from_above_and_the_low_end_stays_below_it() -> None:
    """The curves meet their limits up to 30 req/s but the step at 30 saturated: the capacity lies below 30 — a
    bound, not a crossing — and its low end is the highest load below 30 the curves meet, never 30–30 (0 %)."""
    steps = [_step(10, 0.0, "pass"), _step(20, 0.001, "pass"), _step(30, 0.002, "pass")]
    steps[2].saturated = True
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None)
    cap = r.capacity
    assert (cap.low, cap.high, cap.estimate, cap.decided, r.exit_code) == (20, 30, 30, True, 0)
    assert headline(r) == ("capacity at most 30 req/s (the step at 30 req/s saturated), interval 20–30 req/s "
                           "(33% of its upper end)")
    assert any("wider than --tolerance 5%" in x for x in r.reasons)  # the search is not done "within tolerance"


def test_a_failed_objective_the_curves_do_not_cover_bounds_the_capacity_below_the_crossing() -> None:
    steps = [_step(10, 0.0, "pass"), _step(20, 0.006, "pass"), _step(30, 0.014, "pass"), _step(40, 0.04, "fail")]
    steps[1].objectives.append({"objective": "session_ms.p90", "call": "pass"})
    steps[2].objectives.append({"objective": "session_ms.p90", "call": "fail"})
    cap = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None).capacity
    assert (cap.low, cap.high) == (20, 30) and cap.estimate == pytest.approx(25.0) and not cap.bound
    steps[1].objectives[-1]["call"] = "fail"  # now at 20, below the crossing's low end: 10–20, a bound
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None)
    assert (r.capacity.low, r.capacity.high, r.capacity.estimate) == (10, 20, 20)
    assert headline(r).startswith("capacity at most 20 req/s (session_ms.p90 failed at 20 req/s), interval 10–20")


def test_an_uncovered_objective_left_undecided_holds_the_low_end_down_or_leaves_it_undecided() -> None:
    """A scoped objective the curves cannot reach, undecided at 20 (the curves' low end): the low end is the
    highest load at which it passed (10); undecided at every load the curves meet: not decided, exit 3."""
    scoped = "ttft_ms[1-512 prompt tokens].p99"
    steps = [_step(10, 0.0, "pass"), _step(20, 0.006, "undecided"), _step(30, 0.014, "undecided"),
             _step(40, 0.04, "fail")]
    for s, call in zip(steps, ("pass", "undecided", "undecided", "undecided")):
        s.objectives.append({"objective": scoped, "call": call})
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None)
    assert (r.capacity.low, r.capacity.high, r.capacity.decided) == (10, 30, True)
    assert f"{scoped} undecided at 20 req/s: the capacity's low end is 10 req/s" in " ".join(r.reasons)
    steps[0].objectives[-1]["call"] = "undecided"
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None)
    assert (r.capacity.low, r.capacity.decided, r.exit_code) == (None, False, 3)
    assert headline(r) == f"capacity below 30 req/s (not decided: {scoped} undecided at 10 and 20 req/s)"
    assert r.reasons[-1].startswith("exit 3: not decided")


def test_a_request_cancelled_past_a_limit_counts_above_it_on_the_curve_as_in_the_step() -> None:
    """Two requests answered in 100 ms, two cancelled after waiting 3 s and 0.5 s (no first token), one stream
    that reasoned and never answered: against ttft_ms.p99 <= 2000 the 3-s wait is one sample above the limit
    (the 0.5-s one is no sample), as objective_samples counts it; ttft_answer_ms counts the unanswered one too."""
    ms = 1_000_000
    req = pl.DataFrame({"ok": [True, True, False, False, True], "error_kind": [None, None, "cancelled", "cancelled",
                                                                                None],
                        "t_intended_ns": [0] * 5, "t_sent_ns": [0] * 5, "t_done_ns": [900 * ms, 900 * ms,
                                                                                       3000 * ms, 500 * ms, 900 * ms],
                        "t_first_token_ns": [100 * ms, 100 * ms, None, None, 100 * ms],
                        "t_first_answer_ns": [100 * ms, 100 * ms, None, None, None],
                        "reasoning_tokens": [0, 0, 0, 0, 30]})
    censored = censored_waits(req)
    assert censored["ttft_ms"][2:4].tolist() == [3000.0, 500.0] and np.isnan(censored["ttft_ms"][[0, 1, 4]]).all()
    assert censored["ttft_answer_ms"][4] == np.inf
    n, zeros = 5, np.zeros(5)
    ok = req["ok"].to_numpy()
    s = RunSamples(np.array([100.0, 100, np.nan, np.nan, 100]), zeros, zeros, ok, np.zeros(n, bool), ok, zeros,
                   zeros, np.zeros(0), np.zeros(0, int), 10.0, np.arange(n),
                   ttft_answer_ms=np.array([100.0, 100, np.nan, np.nan, np.nan]), censored_ms=censored)
    slo = [{"objective": "ttft_ms.p99", "threshold": 2000.0, "comparison": "<="},
           {"objective": "ttft_answer_ms.p99", "threshold": 2000.0, "comparison": "<="}]
    pts = {p.objective: p for p in step_points(slo, s, 12.0, replicates=50)}
    assert (pts["ttft_ms.p99"].value, pts["ttft_ms.p99"].weight) == (pytest.approx(1 / 4), 4.0)
    # ttft_answer_ms: the 3-s wait (no answer token either) and the stream never answered
    assert (pts["ttft_answer_ms.p99"].value, pts["ttft_answer_ms.p99"].weight) == (pytest.approx(2 / 4), 4.0)


def test_the_headline_at_a_flat_limit_says_the_capacity_is_the_intervals_low_end_and_where_it_crosses() -> None:
    def step(load: float, value: float, own: float) -> Step:
        s = _step(load, value, "undecided")
        s.objectives[0]["objective"] = "itl_ms.p99"
        s.curve = [point(load, value, objective="itl_ms.p99", threshold=100.0, spread=0.002, own=own,
                         seed=int(load))]
        return s
    steps = [step(x, v, ms) for x, v, ms in ((12, 0.002, 60), (21.8, 0.0095, 97), (25, 0.0099, 99.5),
                                             (28.5, 0.0104, 103), (40, 0.05, 300))]
    r = summarize_sweep("s", "rate", steps, None, 0.05, 0.95, "", 1.0, None)
    cap = r.capacity
    assert cap.estimate == cap.low and cap.crossing is not None and cap.crossing > cap.low
    assert headline(r) == (f"capacity {cap.low:.4g} req/s (the interval's low end: itl_ms.p99 is flat at its "
                           f"limit from 21.8 to 28.5 and crosses at {cap.crossing:.4g} req/s), interval "
                           f"{cap.low:.4g}–{cap.high:.4g} req/s ({cap.width_share:.0%} of its upper end)")
    assert SweepResult.from_dict(json.loads(json.dumps(r.to_dict()))).capacity == cap


class Clock:
    """Virtual time: a step's run takes its warm-up, duration and 6 s; judging it 30 s; fitting the curves 20 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def run_step(self, sc: Any, run_dir: Any) -> Any:
        self.now += sc.load.warmup_s + sc.load.duration_s + 6.0
        return types.SimpleNamespace(interrupted=False, run_dir=run_dir)

    def judge(self, result: Any, sc: Any, opts: Any, load: float, duration_s: float, attempt: int,
              wall_s: float) -> Step:
        self.now += 30.0
        step = _step(load, 0.0, "pass")
        step.duration_s, step.wall_s, step.curve = duration_s, wall_s, []
        return step

    def fit(self, points: Any, confidence: float) -> list[Any]:
        self.now += 20.0
        return []


def test_the_sweep_counts_judging_and_the_curves_fit_against_its_budget(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """Each step costs 5 + 10 + 6 s to run, 30 s to judge and 20 s to fit the curves after it: 71 s. A budget of
    200 s pays for two such steps and not a third (which would end at 213 s)."""
    clock = Clock()
    monkeypatch.setattr(sweep_mod.time, "monotonic", clock)
    monkeypatch.setattr(sweep_mod, "judge_step", clock.judge)
    monkeypatch.setattr(sweep_mod, "curves_of", clock.fit)
    monkeypatch.setattr(sweep_mod, "write_sweep", lambda result: None)
    sc = Scenario.model_validate({
        "name": "virtual", "target": {"base_url": "embedded"}, "seed": 1,
        "load": {"arrival": "poisson", "rate_per_s": 6, "duration_s": 10, "warmup_s": 5},
        "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 16},
                                  "output_tokens": {"dist": "fixed", "value": 8}}]},
        "slo": {"ttft_ms": {"p99": 1500}}})
    result = run_sweep(sc, SweepOptions("rate", budget_s=200), tmp_path / "sweep", clock.run_step,
                       Console(file=io.StringIO()))
    assert [s.wall_s for s in result.steps] == [51.0, 51.0]  # run and judging
    assert clock.now <= 200 and "--budget 200 s spent" in result.stop_reason
