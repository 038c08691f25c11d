"""``loadgen sweep``: the scenario at several loads, each step a full run (warm-up, seeded plan, its own run
directory under the sweep's), judged with confidence (analysis/capacity.py); fixed steps or a capacity search
(run/search.py). Writes sweep.json, summary.md, junit.xml and sweep.html (report/sweep_report.py).

A rate step sets ``load.rate_per_s`` (open loop) or, on a closed-loop scenario, the ceiling
``load.max_rate_per_s`` (its users, never more than R requests/s); a concurrency step sets ``load.concurrency``.
An undecided step is run again, once: ``retry_factor`` times longer, or long enough for the samples a
percentile needs (p99: 100) if that is more (at most 8×); still undecided, it stays undecided.
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

from loadgen.analysis.capacity import attainment_call, backlog, judge, samples_factor, step_call
from loadgen.analysis.metrics import measured, with_request_metrics
from loadgen.analysis.result import RunResult
from loadgen.analysis.sweep_result import Step, SweepResult, final_steps, summarize_sweep
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.run.comparison import load_run_frames
from loadgen.run.search import CapacitySearch, Probe
from loadgen.run.target import TargetError

Mode = Literal["rate", "concurrency"]
MAX_FACTOR = 1024.0  # a search goes at most this far above or below its start
MAX_RETRY_FACTOR = 8.0  # an undecided step's re-run: at most this many times longer


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
    retry_factor: float = 2.0
    confidence: float = 0.95
    replicates: int = 1000
    engine: str = "asyncio"
    workers: int = 0
    png: bool = True

    def check(self, sc: Scenario) -> None:
        """One clear line before anything is sent."""
        load = sc.load
        if self.mode == "concurrency" and load.arrival != "concurrency":
            raise ScenarioError(f"a concurrency sweep needs a closed-loop scenario (load.arrival: concurrency); "
                                f"{sc.name!r} has arrival {load.arrival!r}: sweep its rate instead")
        if self.mode == "rate" and load.arrival not in ("constant", "poisson", "gamma", "concurrency"):
            raise ScenarioError(f"a rate sweep needs arrival constant, poisson, gamma or concurrency (capped by "
                                f"load.max_rate_per_s); {sc.name!r} has {load.arrival!r}")
        if (self.step_duration_s or load.duration_s) is None:
            raise ScenarioError("every sweep step runs for a time: give load.duration_s or --step-duration-s")
        if self.loads is not None and (not self.loads or min(self.loads) <= 0):
            raise ScenarioError("give at least one load, every one above 0")
        if self.mode == "concurrency" and any(x != int(x) for x in self.loads or []):
            raise ScenarioError(f"concurrency steps are whole users: {self.loads}")
        for name, value, lo in (("--tolerance", self.tolerance, 0.001), ("--budget-s", self.budget_s, 1.0),
                                ("--retry-factor", self.retry_factor, 1.0), ("--max-steps", self.max_steps, 1)):
            if not value >= lo:
                raise ScenarioError(f"{name} {value}: must be at least {lo:g}")
        if not 0.5 <= self.confidence < 1:
            raise ScenarioError(f"--confidence {self.confidence}: must be in [0.5, 1)")
        if self.require is not None and self.require <= 0:
            raise ScenarioError(f"--require {self.require}: must be above 0")

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

    def execute(self) -> SweepResult:
        self.out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        loads = iter(self.opts.loads) if self.opts.loads is not None else None
        search = self._search()
        while not self.stop_reason:
            if len(self.steps) >= self.opts.max_steps:
                self.stop_reason = f"--max-steps {self.opts.max_steps} reached"
                break
            load, reason = (next(loads, None), "every step run") if loads is not None else \
                search.next_load(self._probes())
            if load is None:
                self.stop_reason = reason
            elif self._within_budget(t0):
                self._probe_or_stop(load, t0)
        o = self.opts
        return summarize_sweep(self.scenario.name, o.mode, self.steps, o.require, o.tolerance, o.confidence,
                               self.stop_reason, time.monotonic() - t0, self.out, self.interrupted,
                               fixed=o.loads is not None)

    def _probe_or_stop(self, load: float, t0: float) -> None:
        """Probe ``load``; a step that cannot be planned, or a target gone after the first step, ends the sweep
        with what it has (before the first step, the error is the user's: exit 2)."""
        try:
            self._probe(load, t0)
        except (ScenarioError, TargetError) as exc:
            if not self.steps:
                raise
            self.stop_reason = f"the step at {load:g} could not run: {exc}"

    def _search(self) -> CapacitySearch:
        start = self.opts.start_load(self.scenario)
        hi = min(start * MAX_FACTOR, 10_000.0) if self.opts.mode == "concurrency" else start * MAX_FACTOR
        lo = 1.0 if self.opts.mode == "concurrency" else start / MAX_FACTOR
        return CapacitySearch(start, lo, hi, self.opts.tolerance, integer=self.opts.mode == "concurrency")

    def _probes(self) -> list[Probe]:
        return [Probe(s.load, s.call, s.saturated) for s in final_steps(self.steps)]

    def _within_budget(self, t0: float) -> bool:
        elapsed = time.monotonic() - t0
        need = self._estimate_s(self.opts.step_duration_s or self.scenario.load.duration_s or 0.0)
        if elapsed + need > self.opts.budget_s:
            self.stop_reason = (f"--budget-s {self.opts.budget_s:g} spent: {elapsed:.0f} s used, the next step "
                                f"needs ~{need:.0f} s")
            return False
        return True

    def _estimate_s(self, duration_s: float) -> float:
        overhead = max((s.wall_s - s.duration_s - self.scenario.load.warmup_s for s in self.steps), default=5.0)
        return self.scenario.load.warmup_s + duration_s + max(0.0, overhead)

    def _probe(self, load: float, t0: float) -> None:
        duration = self.opts.step_duration_s or self.scenario.load.duration_s
        assert duration is not None
        step, factor = self._step(load, duration)
        if step.call == "undecided" and not step.saturated and self.opts.retry_factor > 1 and not self.interrupted \
                and len(self.steps) < self.opts.max_steps:
            longer = duration * min(MAX_RETRY_FACTOR, max(self.opts.retry_factor, 1.2 * factor))
            if time.monotonic() - t0 + self._estimate_s(longer) <= self.opts.budget_s:
                self._step(load, longer, attempt=2)

    def _step(self, load: float, duration_s: float, attempt: int = 1) -> tuple[Step, float]:
        index = len(self.steps) + 1
        name = f"{index:02d}-{self.opts.mode}-{load:g}" + (f"-retry{attempt - 1}" if attempt > 1 else "")
        run_dir = self.out / "steps" / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        sc = step_scenario(self.scenario, self.opts.mode, load, duration_s)
        wall0 = time.monotonic()
        result = self.run_step(sc, run_dir)
        if result.interrupted:  # Ctrl-C or SIGTERM: this step is judged, no other starts
            self.interrupted, self.stop_reason = True, "interrupted"
        step = judge_step(result, sc, self.opts, load, duration_s, attempt, time.monotonic() - wall0)
        step.run_dir = str(run_dir.relative_to(self.out))
        self.steps.append(step)
        self._mark_plateau()
        self.console.print(step.line(self.opts.mode), highlight=False)
        return step, samples_factor(result.slo)

    def _mark_plateau(self) -> None:
        """Closed loop: more users, no more throughput (≤ +5 % for ≥ 1.25× the users) is saturation."""
        if self.opts.mode != "concurrency":
            return
        done = sorted((s for s in self.steps if s.requests_per_s is not None), key=lambda s: s.load)
        for lower, upper in zip(done, done[1:]):
            if upper.load >= 1.25 * lower.load and upper.requests_per_s <= 1.05 * lower.requests_per_s:
                upper.saturated = True


def step_scenario(sc: Scenario, mode: Mode, load: float, duration_s: float) -> Scenario:
    """The scenario at one step's load and duration (validated again; the file it came from is kept, so Locust
    workers load the same step)."""
    if mode == "concurrency":
        update: dict[str, Any] = {"concurrency": int(load)}
    elif sc.load.arrival == "concurrency":
        update = {"max_rate_per_s": load}
    else:
        update = {"rate_per_s": load}
    update.update(duration_s=duration_s, requests=None)  # a step lasts its duration, whatever its rate
    if sc.source is not None:
        path, items = sc.source
        return load_scenario(path, items + [f"load.{k}={json.dumps(v)}" for k, v in update.items()])
    data = sc.model_dump(mode="json", by_alias=False, exclude_none=True)
    data["load"].update(update)
    try:
        return Scenario.model_validate(data)
    except ValueError as exc:
        raise ScenarioError(f"the step at {load:g}: {exc}") from None


def judge_step(result: RunResult, sc: Scenario, opts: SweepOptions, load: float, duration_s: float,
               attempt: int, wall_s: float) -> Step:
    """One finished step: its objectives called with confidence, its backlog, its figures."""
    assert result.run_dir is not None
    _, requests, samples = load_run_frames(result.run_dir)
    calls = judge(result.slo, samples, sc.slo.goodput, opts.confidence, opts.replicates, seed=sc.seed)
    log = backlog(measured(with_request_metrics(requests))) if sc.load.arrival != "concurrency" else None
    offered = load if opts.mode == "rate" else None  # closed loop with a ceiling: at most this
    return Step.from_result(result, load, duration_s, attempt, wall_s, calls, step_call(calls),
                            attainment_call(calls), log, offered)


def sweep_dir(sc: Scenario, out: Path | None, reports_dir: Path) -> Path:
    if out is not None:
        return out
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', sc.name)}-sweep"


def write_sweep(result: SweepResult) -> None:
    """sweep.json, summary.md, junit.xml and sweep.html in the sweep's directory (redacted, whole or not at all)."""
    from loadgen.core.secrets import write_bytes, write_text
    from loadgen.report import sweep_report as rep

    out = result.out_dir
    assert out is not None
    write_text(out / "sweep.json", json.dumps(result.to_dict(), indent=2, default=str))
    write_text(out / "summary.md", rep.summary_markdown(result))
    write_bytes(out / "junit.xml", rep.junit_xml(result))
    write_text(out / "sweep.html", rep.render_html(result))


def run_sweep(sc: Scenario, opts: SweepOptions, out: Path, run_step: RunStep, console: Console) -> SweepResult:
    opts.check(sc)
    console.print(f"sweep {sc.name!r}: {'fixed steps ' + str(opts.loads) if opts.loads is not None else 'search'}"
                  f" by {opts.mode}, each step {opts.step_duration_s or sc.load.duration_s:g} s (+ "
                  f"{sc.load.warmup_s:g} s warm-up); budget {opts.budget_s:g} s → {out}", highlight=False)
    result = Sweep(sc, opts, out, run_step, console).execute()
    write_sweep(result)
    from loadgen.report.sweep_report import headline

    console.print(f"[bold]{headline(result)}[/]; knee {result.knee}, saturation {result.saturation}; "
                  f"{len(result.steps)} steps in {result.wall_s:.0f} s → {out / 'sweep.html'}", highlight=False)
    for reason in result.reasons:
        console.print(f"  {reason}", highlight=False)
    return result
