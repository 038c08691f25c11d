"""``loadgen sweep``: the scenario at several loads, each step a full run (warm-up, seeded plan, its own run
directory under the sweep's), judged with confidence (analysis/capacity.py); fixed steps or a capacity search
(run/search.py). Writes sweep.json, summary.md, junit.xml and sweep.html (report/sweep_report.py).

A rate step sets ``load.rate_per_s`` (open loop) or, on a closed-loop scenario, the ceiling
``load.max_rate_per_s`` (its users, never more than R requests/s); a concurrency step sets ``load.concurrency``.
Fixed steps run exactly the duration given. Only ``until="decided"`` (``--until decided``) runs an undecided
step again, as long as the planner says its objectives need (at least 1.5× its last), up to
``max_step_duration_s``. A search sizes every step with the planner (run/search.py) within its budget.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from rich.console import Console

from loadgen.analysis.figures import pareto_steps
from loadgen.analysis.result import RunResult
from loadgen.analysis.capacity_curve import curves_of
from loadgen.analysis.sweep_result import Step, SweepResult, curve_capacity, summarize_sweep
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.run.search import AGAIN_FACTOR, CapacitySearch, CurveSpan, Phase, StepPlanner, Trial, steps_left
from loadgen.run.sweep_steps import judge_step, room, step_scenario, trial_of, with_evidence  # noqa: F401 (API)
from loadgen.run.target import TargetError

Mode = Literal["rate", "concurrency"]
Until = Literal["time", "decided"]
MAX_FACTOR = 1024.0  # a search goes at most this far above or below its start
MAX_STEP_FACTOR = 8.0  # default --max-step-duration: this many times the step duration
MIN_STEP_S = 10.0  # default --min-step-duration (or the step duration, if shorter)


@dataclass
class SweepOptions:
    mode: Mode
    loads: list[float] | None = None  # fixed steps; None: a search (--find-max)
    require: float | None = None
    tolerance: float = 0.05
    budget_s: float = 3600.0
    max_steps: int = 20
    start: float | None = None  # default: the scenario's own rate or concurrency
    step_duration_s: float | None = None  # default: the scenario's load.duration_s
    until: Until = "time"
    max_step_duration_s: float | None = None  # default: MAX_STEP_FACTOR × the step duration
    min_step_duration_s: float | None = None  # a search's shortest step; default min(MIN_STEP_S, step duration)
    confidence: float = 0.95
    replicates: int = 1000
    engine: str = "asyncio"
    workers: int = 0
    png: bool = True

    def step_s(self, sc: Scenario) -> float:
        duration = self.step_duration_s or sc.load.duration_s
        if duration is None:
            raise ScenarioError("every sweep step runs for a time: give load.duration_s or --step-duration")
        return float(duration)

    def max_s(self, sc: Scenario) -> float:
        return self.max_step_duration_s or MAX_STEP_FACTOR * self.step_s(sc)

    def min_s(self, sc: Scenario) -> float:
        return self.min_step_duration_s or min(MIN_STEP_S, self.step_s(sc))

    def check(self, sc: Scenario) -> None:
        """One clear line before anything is sent."""
        load = sc.load
        if self.mode == "concurrency" and load.arrival != "concurrency":
            raise ScenarioError(f"a concurrency sweep needs a closed-loop scenario (load.arrival: concurrency); "
                                f"{sc.name!r} has arrival {load.arrival!r}: sweep its rate instead")
        if self.mode == "rate" and load.arrival not in ("constant", "poisson", "gamma", "concurrency"):
            raise ScenarioError(f"a rate sweep needs arrival constant, poisson, gamma or concurrency (capped by "
                                f"load.max_rate_per_s); {sc.name!r} has {load.arrival!r}")
        self.step_s(sc)
        if self.loads is not None and (not self.loads or min(self.loads) <= 0):
            raise ScenarioError("give at least one load, every one above 0")
        if self.mode == "concurrency" and any(x != int(x) for x in self.loads or []):
            raise ScenarioError(f"concurrency steps are whole users: {self.loads}")
        for name, value, lo in (("--tolerance", self.tolerance, 0.001), ("--budget", self.budget_s, 1.0),
                                ("--max-steps", self.max_steps, 1)):
            if not value >= lo:
                raise ScenarioError(f"{name} {value}: must be at least {lo:g}")
        self._check_durations(sc)
        if not 0.5 <= self.confidence < 1:
            raise ScenarioError(f"--confidence {self.confidence:.0%}: must be from 50% to below 100%")
        if self.require is not None and self.require <= 0:
            raise ScenarioError(f"--require {self.require}: must be above 0")

    def _check_durations(self, sc: Scenario) -> None:
        if self.until not in ("time", "decided"):
            raise ScenarioError(f"--until {self.until!r}: choose time or decided")
        if self.max_s(sc) < self.step_s(sc) and (self.until == "decided" or self.loads is None):
            raise ScenarioError(f"--max-step-duration {self.max_s(sc):g}: at least the step duration "
                                f"{self.step_s(sc):g} s")
        if self.loads is None and self.min_s(sc) > self.max_s(sc):
            raise ScenarioError(f"--min-step-duration {self.min_s(sc):g}: at most --max-step-duration "
                                f"{self.max_s(sc):g}")

    def start_load(self, sc: Scenario) -> float:
        if self.start is not None:
            return self.start
        load = sc.load
        if self.mode == "concurrency":
            return float(load.concurrency or 1)
        return float(load.max_rate_per_s or load.rate_per_s or 1.0)


RunStep = Callable[[Scenario, Path], RunResult]


@dataclass
class Sweep:
    scenario: Scenario
    opts: SweepOptions
    out: Path
    run_step: RunStep
    console: Console
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""
    interrupted: bool = False
    t0: float = 0.0
    fit_s: float = 0.0  # the longest the curves' fit between two steps took (each step pays it again)

    def __post_init__(self) -> None:
        self.planner = StepPlanner(self.opts.min_s(self.scenario), self.opts.max_s(self.scenario))

    def execute(self) -> SweepResult:
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        loads = iter(self.opts.loads) if self.opts.loads is not None else None
        search = self._search()
        while not self.stop_reason:
            if len(self.steps) >= self.opts.max_steps:
                self.stop_reason = f"--max-steps {self.opts.max_steps} reached"
            elif loads is not None:
                load = next(loads, None)
                if load is None:
                    self.stop_reason = "every step run"
                else:
                    self._guarded(self._fixed_step, load)
            else:
                self._search_step(search)
        o = self.opts
        return summarize_sweep(self.scenario.name, o.mode, self.steps, o.require, o.tolerance, o.confidence,
                               self.stop_reason, time.monotonic() - self.t0, self.out, self.interrupted,
                               fixed=o.loads is not None)

    def _guarded(self, probe: Callable[..., None], load: float, *args: Any) -> None:
        """Probe ``load``; a step that cannot be planned, or a target gone after the first step, ends the sweep
        with what it has (before the first step, the error is the user's: exit 2)."""
        try:
            probe(load, *args)
        except (ScenarioError, TargetError) as exc:
            if not self.steps:
                raise
            self.stop_reason = f"the step at {load:g} could not run: {exc}"

    def _search(self) -> CapacitySearch:
        start = self.opts.start_load(self.scenario)
        hi = min(start * MAX_FACTOR, 10_000.0) if self.opts.mode == "concurrency" else start * MAX_FACTOR
        lo = 1.0 if self.opts.mode == "concurrency" else start / MAX_FACTOR
        return CapacitySearch(start, lo, hi, self.opts.tolerance, integer=self.opts.mode == "concurrency")

    # ---- time ------------------------------------------------------------------------------------------------
    def _overhead_s(self) -> float:
        """A step's wall time beyond its measured duration: its warm-up, plus the most any step took for start,
        drain, analysis and judging (5 s before the first), plus the longest fit of the curves between steps."""
        extra = max((s.wall_s - s.duration_s - self.scenario.load.warmup_s for s in self.steps), default=5.0)
        return self.scenario.load.warmup_s + max(0.0, extra) + self.fit_s

    def _left_s(self) -> float:
        """Measured seconds the budget leaves for one more step."""
        return self.opts.budget_s - (time.monotonic() - self.t0) - self._overhead_s()

    def _budget_stop(self, need_s: float) -> None:
        elapsed = time.monotonic() - self.t0
        self.stop_reason = (f"--budget {self.opts.budget_s:g} s spent: {elapsed:.0f} s used, the next step "
                            f"needs ~{need_s + self._overhead_s():.0f} s")

    def _allowed_s(self, k: int, need_s: float) -> float:
        """What one step may take: all it needs if half of what is left of the budget pays for it (one decided
        step is worth more than several undecided ones), else its share of the budget over the ``k`` steps
        still wanted, and at least a shortest step while one fits."""
        left = self._left_s()
        if 0 < need_s <= left / 2:  # need_s has the planner's margin in it already
            return left
        remaining = self.opts.budget_s - (time.monotonic() - self.t0)
        share = remaining / max(1, k) - self._overhead_s()
        return max(share, min(self.planner.min_s, left))

    def trials(self) -> list[Trial]:
        return [trial_of(s) for s in self.steps]

    # ---- fixed steps -----------------------------------------------------------------------------------------
    def _fixed_step(self, load: float) -> None:
        duration = self.opts.step_s(self.scenario)
        if duration > self._left_s():
            self._budget_stop(duration)
            return
        step = self._step(load, duration, "fixed")
        while self.opts.until == "decided" and step.call == "undecided" and not step.saturated \
                and not self.interrupted and len(self.steps) < self.opts.max_steps:
            longer = self.planner.duration_s(load, [trial_of(step)], "again", self._left_s())
            if longer < AGAIN_FACTOR * step.duration_s:
                self.console.print(f"  {load:g} stays undecided: a longer step would need ~"
                                   f"{self.planner.needed_s(load, [trial_of(step)])[0]:.0f} s, more than "
                                   f"--max-step-duration {self.planner.max_s:g} s or the budget allow",
                                   highlight=False)
                return
            step = self._step(load, longer, "again", attempt=step.attempt + 1)

    # ---- the search ------------------------------------------------------------------------------------------
    def _search_step(self, search: CapacitySearch) -> None:
        trials = self.trials()
        k = steps_left([t.probe for t in trials], self.opts.tolerance)

        def plan(load: float, phase: Phase) -> float:
            need = self.planner.needed_s(load, trials)[0] if phase != "bracket" else 0.0
            return self.planner.duration_s(load, trials, phase, self._allowed_s(k, need))
        def decisive(load: float) -> bool:
            return plan(load, "again") >= self.planner.needed_s(load, trials)[0]
        load, phase, reason = search.next_step(trials, plan, decisive, self._curve_span())
        if load is None:
            self.stop_reason = reason
            return
        duration = plan(load, phase)
        if duration < self.planner.min_s:
            self._budget_stop(self.planner.min_s)
            return
        attempt = 1 + sum(s.load == load for s in self.steps)
        self._guarded(self._step, load, duration, phase, attempt)
        if self.opts.until == "decided" and self.steps and self.steps[-1].load == load and not self.stop_reason:
            self._decide_again(self.steps[-1])

    def _curve_span(self) -> CurveSpan | None:
        """What the objectives' curves say so far (None: no step has records for them)."""
        fit0 = time.monotonic()
        curves = curves_of([p for s in self.steps for p in s.curve], self.opts.confidence)
        unit = "req/s" if self.opts.mode == "rate" else "users"
        cap = curve_capacity(self.steps, curves, self.opts.confidence, unit)
        self.fit_s = max(self.fit_s, time.monotonic() - fit0)
        if cap is None:
            return None
        flat = next((c.flat for c in curves if c.objective == cap.objective), None) if cap.flat else None
        return CurveSpan(cap.low, cap.high, cap.estimate, flat)

    def _decide_again(self, step: Step) -> None:
        """--until decided in a search: an undecided step runs again while the planner can give it longer."""
        while step.call == "undecided" and not step.saturated and not self.interrupted \
                and len(self.steps) < self.opts.max_steps:
            longer = self.planner.duration_s(step.load, [trial_of(step)], "again", self._left_s())
            if longer < AGAIN_FACTOR * step.duration_s:
                return
            step = self._step(step.load, longer, "again", attempt=step.attempt + 1)

    # ---- one step --------------------------------------------------------------------------------------------
    def _step(self, load: float, duration_s: float, phase: str, attempt: int = 1) -> Step:
        index = len(self.steps) + 1
        name = f"{index:02d}-{self.opts.mode}-{load:g}" + (f"-again{attempt - 1}" if attempt > 1 else "")
        run_dir = self.out / "steps" / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        duration_s = round(duration_s, 1)
        sc = step_scenario(self.scenario, self.opts.mode, load, duration_s)
        wall0 = time.monotonic()
        result = self.run_step(sc, run_dir)
        if result.interrupted:  # Ctrl-C or SIGTERM: this step is judged, no other starts
            self.interrupted, self.stop_reason = True, "interrupted"
        step = judge_step(result, sc, self.opts, load, duration_s, attempt, time.monotonic() - wall0)
        step.wall_s = time.monotonic() - wall0  # judging (its curve points' bootstrap) is the step's time too
        step.run_dir, step.phase = str(run_dir.relative_to(self.out)), phase
        self.steps.append(step)
        self._mark_plateau()
        self.console.print(step.line(self.opts.mode), highlight=False)
        return step

    def _mark_plateau(self) -> None:
        """Closed loop: more users, no more throughput (≤ +5 % for ≥ 1.25× the users) is saturation."""
        if self.opts.mode != "concurrency":
            return
        done = sorted((s for s in self.steps if s.requests_per_s is not None), key=lambda s: s.load)
        for lower, upper in zip(done, done[1:]):
            if upper.load >= 1.25 * lower.load and upper.requests_per_s <= 1.05 * lower.requests_per_s:
                upper.saturated = True


def sweep_dir(sc: Scenario, out: Path | None, reports_dir: Path) -> Path:
    if out is not None:
        return out
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', sc.name)}-sweep"


def write_sweep(result: SweepResult) -> None:
    """sweep.json, summary.md, junit.xml and sweep.html in the sweep's directory (redacted, whole or not at all)."""
    from loadgen.core.secrets import write_bytes, write_text
    from loadgen.report import sweep_report as rep

    assert (out := result.out_dir) is not None
    doc = {**result.to_dict(), "pareto": pareto_steps(result.steps)}  # MLPerf Endpoints' chart (figures.py)
    write_text(out / "sweep.json", json.dumps(doc, indent=2, default=str))
    write_text(out / "summary.md", rep.summary_markdown(result))
    write_bytes(out / "junit.xml", rep.junit_xml(result))
    write_text(out / "sweep.html", rep.render_html(result, doc["pareto"]))  # the front drawn as sweep.json has it


def announce(sc: Scenario, opts: SweepOptions, out: Path) -> str:
    """The sweep's first line: what it runs, for how long, and the cap on any extension."""
    warmup = f"(+ {sc.load.warmup_s:g} s warm-up)"
    if opts.loads is not None:
        what = f"fixed steps {', '.join(f'{x:g}' for x in opts.loads)} by {opts.mode}, each {opts.step_s(sc):g} s"
    else:
        what = (f"search by {opts.mode} from {opts.start_load(sc):g}, steps sized by the planner, "
                f"{opts.min_s(sc):g}–{opts.max_s(sc):g} s each")
    until = (f"; --until decided: an undecided step runs again, as long as its objectives need, up to "
             f"{opts.max_s(sc):g} s (--max-step-duration)") if opts.until == "decided" else ""
    return f"sweep {sc.name!r}: {what} {warmup}{until}; budget {opts.budget_s:g} s → {out}"


def run_sweep(sc: Scenario, opts: SweepOptions, out: Path, run_step: RunStep, console: Console) -> SweepResult:
    opts.check(sc)
    console.print(announce(sc, opts, out), highlight=False)
    result = Sweep(sc, opts, out, run_step, console).execute()
    write_sweep(result)
    from loadgen.report.sweep_curves import curve_lines
    from loadgen.report.sweep_report import headline, points_text

    console.print(f"[bold]{headline(result)}[/]; {points_text(result)}; {len(result.steps)} steps in "
                  f"{result.wall_s:.0f} s → {out / 'sweep.html'}", highlight=False)
    for line in curve_lines(result):
        console.print(f"  {line}", highlight=False, markup=False)
    for reason in result.reasons:
        console.print(f"  {reason}", highlight=False)
    return result
