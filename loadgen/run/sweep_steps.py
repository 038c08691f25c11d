"""One sweep step, as the sweep and the search see it: the scenario at the step's load, the finished run judged
with confidence (analysis/capacity.py) and its objectives' points on the capacity curve
(analysis/capacity_curve.py), and the step as the search's ``Trial``."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from loadgen.analysis.capacity import ObjectiveCall, attainment_call, backlog, judge, step_call
from loadgen.analysis.capacity_curve import step_points
from loadgen.analysis.metrics import measured, with_request_metrics
from loadgen.analysis.result import RunResult, SloResult
from loadgen.analysis.sweep_result import Step
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.run.comparison import load_run_frames
from loadgen.run.search import Need, Trial

SATURATION_MIN_SENT = 300  # fewer sends in the backlog's window: 10 % of them is within the in-flight noise
UNKNOWN_NEED_FACTOR = 4  # an undecided objective without a stated need: 4× its samples halve its interval


def room(o: dict[str, Any]) -> float | None:
    """How far an objective's point estimate is inside its limit, as a share of the limit (< 0: outside)."""
    value, limit = o.get("value"), o.get("threshold")
    sign = 1 if o.get("comparison") == ">=" else -1
    return None if value is None or not limit else sign * (value - limit) / limit


def trial_of(step: Step) -> Trial:
    """A step as the search and the planner see it: its call, duration and each undecided objective's need."""
    needs = tuple(Need(o["objective"], int(o.get("samples") or 0), o.get("needed") if o.get("call") ==
                       "undecided" else None, o.get("call") != "undecided", room(o)) for o in step.objectives)
    misses = any((room(o) or 0.0) < 0 for o in step.objectives)
    lean = ("fail" if misses else "pass") if step.call == "undecided" else None
    return Trial(step.load, step.call, step.saturated, step.duration_s, needs, lean)


def step_scenario(sc: Scenario, mode: str, load: float, duration_s: float) -> Scenario:
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


def judge_step(result: RunResult, sc: Scenario, opts: Any, load: float, duration_s: float,
               attempt: int, wall_s: float) -> Step:
    """One finished step: its objectives called with confidence, its backlog, its figures."""
    assert result.run_dir is not None
    _, requests, samples = load_run_frames(result.run_dir)
    calls = judge(result.slo, samples, sc.slo.goodput, opts.confidence, opts.replicates, seed=sc.seed)
    log = backlog(measured(with_request_metrics(requests))) if sc.load.arrival != "concurrency" else None
    if log is not None and log.saturated and log.sent < SATURATION_MIN_SENT:  # too short to tell
        log = dataclasses.replace(log, saturated=False)
    offered = load if opts.mode == "rate" else None  # closed loop with a ceiling: at most this
    objectives = [with_evidence(c, result.slo) for c in calls]
    step = Step.from_result(result, load, duration_s, attempt, wall_s, objectives, step_call(calls),
                            attainment_call(calls), log, offered)
    seed = sc.seed * 7919 + int(load * 1000) * 31 + attempt  # each step's own replicates (independent steps)
    step.curve = step_points([dict(o) for o in result.slo], samples, load, sc.slo.goodput, opts.replicates, seed)
    return step


def with_evidence(call: ObjectiveCall, slo: list[SloResult]) -> dict[str, Any]:
    """The call's dict with ``samples`` and, when undecided, ``needed``: the call's own, else the run's
    summary (its ``needed``, or the "needs >= N samples" of a percentile with too few), else an estimate of
    UNKNOWN_NEED_FACTOR × its samples. Read defensively: a key may be missing or None."""
    out = call.as_dict()
    row: dict[str, Any] = next((dict(o) for o in slo if o.get("objective") == call.objective), {})
    if not out.get("samples") and row.get("samples") is not None:  # 0: the call did not count them
        out["samples"] = row["samples"]
    if call.call != "undecided":
        out.setdefault("needed", None)
        return out
    needed = out.get("needed") if out.get("needed") is not None else row.get("needed")
    if needed is None:
        found = re.search(r"needs >= (\d+) samples", str(row.get("note") or ""))
        needed = int(found.group(1)) if found else None
    if needed is None and out["samples"]:
        needed = UNKNOWN_NEED_FACTOR * int(out["samples"])
    out["needed"] = math.ceil(needed) if needed is not None else None
    return out
