"""A sweep's outcome, typed: every step's figures and calls, the capacity as an interval (for the SLOs and for
DistServe's attainment), the knee and the saturation point, and the exit code. ``sweep.json`` is ``to_dict``.

Exit codes: 0 when the capacity meets ``--require`` (or none was asked and the search bracketed a capacity),
1 when it is below ``--require`` or no load passed, 3 when the search could not decide (budget or steps spent
before a passing load sat below a failing one, or ``--require`` falls inside the capacity interval). Fixed steps
without ``--require`` are SLO tests: 0 every step passed, 1 one failed, 3 one was undecided. An exit other
than 0 ends the reasons with a line that says it plainly (``exit_line``): 3 is "not decided", never a failure,
and for undecided steps it names the step duration that would decide them (docs/exit-codes.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from loadgen.analysis.capacity import Backlog, Call, Probe, interval
from loadgen.analysis.capacity_curve import CurvePoint, CurveCapacity, ObjectiveCurve, capacity_of_curves, curves_of
from loadgen.analysis.result import RunResult

SCHEMA_VERSION = 1
KNEE_FACTOR = 2.0  # the knee: TTFT p90 rose less than this up to it and rises more than this beyond it
KNEE_BEYOND = 2  # ... at this many tested loads above it, at least (one load's rise is not a knee)
STEP_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "ttft_answer_ms", "session_ms", "agent_step_ms")


@dataclass
class Step:
    load: float
    duration_s: float
    attempt: int
    wall_s: float
    call: Call
    saturated: bool
    verdict: str  # the run's own verdict (point estimates)
    objectives: list[dict[str, Any]]
    attainment: Optional[Call]
    requests_per_s: Optional[float]
    output_tokens_per_s: Optional[float]
    goodput_requests_per_s: Optional[float]
    offered_per_s: Optional[float]
    completed: int
    failed: int
    metrics: dict[str, dict[str, Optional[float]]]  # STEP_METRICS the run has → p50, p90, p99
    stalls_per_1k_tokens: Optional[float]
    prefill_induced_per_1k_tokens: Optional[float]
    backlog: Optional[dict[str, Any]] = None
    jobs_per_hour: Optional[float] = None  # sessions completed with every call OK (a run of agentic sessions)
    session_attainment: Optional[float] = None  # share of good sessions
    run_dir: str = ""
    phase: str = ""  # fixed | bracket | bisect | narrow | again: why the step ran (docs/verdicts.md, "sweep")
    curve: list[CurvePoint] = field(default_factory=list, repr=False, compare=False)  # not in sweep.json

    @classmethod
    def from_result(cls, r: RunResult, load: float, duration_s: float, attempt: int, wall_s: float,
                    objectives: list[dict[str, Any]], call: Call, attainment: Optional[Call],
                    log: Optional[Backlog], offered_per_s: Optional[float]) -> "Step":
        """``objectives``: each ObjectiveCall's dict, with ``samples`` and ``needed`` (run/sweep.py)."""
        tput, st = r.throughput or {}, r.stalls or {}
        metrics = {k: {p: r.metrics[k].get(p) for p in ("p50", "p90", "p99")}  # type: ignore[misc]
                   for k in STEP_METRICS if k in r.metrics}
        sessions = r.sessions or {}
        return cls(load, duration_s, attempt, wall_s, call, bool(log and log.saturated), r.verdict,
                   objectives, attainment, tput.get("requests_per_s"),
                   tput.get("output_tokens_per_s"), tput.get("goodput_requests_per_s"), offered_per_s,
                   r.requests.get("completed", 0), r.requests.get("failed", 0), metrics, st.get("per_1k_tokens"),
                   st.get("prefill_induced_per_1k_tokens"), asdict(log) if log else None,
                   sessions.get("jobs_per_hour"), sessions.get("attainment"))

    def line(self, mode: str) -> str:
        unit = "req/s" if mode == "rate" else "users"
        ttft, itl = self.metrics.get("ttft_ms", {}), self.metrics.get("itl_ms", {})
        sat = ", saturated" if self.saturated else ""
        why = f" ({'; '.join(self.undecided_reasons())})" if self.call == "undecided" else ""
        again = ", again" if self.attempt > 1 else ""
        return (f"step {self.load:g} {unit} ({self.duration_s:.3g} s{again}): {self.call.upper()}{sat}{why} — "
                f"{_n(self.requests_per_s)} req/s done, TTFT p99 {_n(ttft.get('p99'))} ms, ITL p99 "
                f"{_n(itl.get('p99'))} ms" + _job_text(self))

    def undecided_reasons(self) -> list[str]:
        """Each undecided objective and its shortfall, e.g. "ttft_ms.p99: 80 samples, needs 100"."""
        return [undecided_text(o) for o in self.objectives if o.get("call") == "undecided"]


def _job_text(step: Step) -> str:
    """A session step's job figures for its line (nothing for a run without sessions)."""
    session = step.metrics.get("session_ms")
    if session is None:
        return ""
    return f", session p90 {_n(session.get('p90'))} ms, {_n(step.jobs_per_hour)} jobs/h"


def undecided_text(o: dict[str, Any]) -> str:
    """Why one objective is undecided, in a few words: the samples it had against those it needs (e.g.
    "ttft_ms.p99: 62 of ~381 samples") where more are needed than it had, else the run's reason (what is
    missing: an end of its interval, or where the estimate sits) or where its interval lies. Keys are read
    defensively: older sweep.json files lack some."""
    samples, needed = o.get("samples"), wanted(o)
    reason = str(o.get("reason") or "")
    tail = reason.partition("straddles the limit: ")[2]
    if " end (has " in tail:  # an end of the interval is what is missing, and its exact count
        why = tail
    elif samples is not None and needed is not None and needed > samples:
        why = f"{samples} of ~{needed:g} samples"
    elif reason:
        why = tail or reason
    elif o.get("ci_low") is not None and o.get("ci_high") is not None:
        why = f"its interval {_n(o['ci_low'])}–{_n(o['ci_high'])} holds the limit {_n(o.get('threshold'))}"
    else:
        why = "too few samples to judge"
    return f"{o.get('objective', '?')}: {why}"


def wanted(o: dict[str, Any]) -> Optional[float]:
    """The samples an undecided objective's evidence says it needs: the largest of its ``needed`` and a "needs
    >= N" of its reason (the exact count a percentile's interval needs for an end); None where none is stated."""
    counts = [float(x) for x in re.findall(r"needs >= (\d+)", str(o.get("reason") or ""))]
    counts += [] if o.get("needed") is None else [math.ceil(float(o["needed"]))]
    return max(counts) if counts else None


def wanted_factor(o: dict[str, Any]) -> Optional[float]:
    """How many times its samples an undecided objective wants (None where its evidence states no more)."""
    samples, need = o.get("samples") or 0, wanted(o)
    return need / samples if samples and need is not None and need > samples else None


def longer_step_s(steps: list["Step"]) -> Optional[float]:
    """A step duration that would decide the undecided steps (the largest of duration × wanted factor, with a
    fifth more, up to the next 10 s); None where an undecided objective states no count to reach."""
    out = 0.0
    for s in steps:
        for o in (o for o in s.objectives if s.call == "undecided" and o.get("call") == "undecided"):
            factor = wanted_factor(o)
            if factor is None:
                return None
            out = max(out, s.duration_s * factor * 1.2)
    return float(10 * math.ceil(out / 10)) if out else None


def exit_line(code: int, reasons: list[str], steps: list["Step"], fixed: bool) -> str:
    """What the exit code means for this sweep, in one line (the console's last)."""
    if code == 1:
        return f"exit 1: failed — {reasons[0] if reasons else 'a load failed its SLOs'}"
    undecided = [s for s in final_steps(steps) if s.call == "undecided"]
    if not fixed or not undecided:
        return f"exit 3: not decided (INCONCLUSIVE, not a failure) — {reasons[0] if reasons else ''}".rstrip(" —")
    longer = longer_step_s(undecided)
    fix = f"--step-duration {longer:g}" if longer else "--until decided"
    return (f"exit 3: not decided (INCONCLUSIVE, not a failure) — {len(undecided)} undecided step"
            f"{'s' if len(undecided) > 1 else ''} had too few samples to decide; run longer steps to decide: {fix}")


def _n(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3g}"


@dataclass
class Capacity:
    low: Optional[float]  # the highest load that met the objectives, below the lowest that did not
    high: Optional[float]  # the lowest load that did not (None: none failed)
    decided: bool  # a passing load sits below a failing one (curve: both ends of the interval are known)
    estimate: Optional[float] = None  # the curve's crossing (method "curve"; at a flat limit, the interval's low)
    objective: str = ""  # the objective whose crossing is lowest (method "curve")
    method: str = "steps"  # "curve": the objectives' curves over the load; "steps": the steps' own calls
    flat: str = ""  # the limiting objective flat at its limit over a range, in words ("" if not)
    crossing: Optional[float] = None  # where the limiting objective's curve crosses its limit (method "curve")
    flat_range: Optional[list[float]] = None  # [from, to]: the loads over which it is flat at its limit
    bound: str = ""  # why the estimate is a bound, not a crossing: a step saturated or failed an uncovered objective
    pending: str = ""  # objectives the curves do not cover left undecided at loads the curves meet, in words

    def text(self, unit: str) -> str:
        if self.low is None and self.high is None:
            return "unknown (no step decided)" if self.method == "steps" else "unknown (no curve crossed)"
        if self.low is None:
            why = f"not decided: {self.pending}" if self.pending else "no load passed"
            return f"below {self.high:.4g} {unit} ({why})"
        if self.high is None:
            return f"at least {self.low:.4g} {unit} (no load failed)"
        span = f"{self.low:.4g}–{self.high:.4g} {unit} ({self.width_share:.0%} of its upper end)"
        if self.method != "curve" or self.estimate is None:
            return span
        if self.bound:
            return f"at most {self.estimate:.4g} {unit} ({self.bound}), interval {span}"
        if self.flat_range and self.estimate == self.low:
            crosses = "" if self.crossing is None else f" and crosses at {self.crossing:.4g} {unit}"
            return (f"{self.estimate:.4g} {unit} (the interval's low end: {self.objective} is flat at its limit "
                    f"from {self.flat_range[0]:g} to {self.flat_range[1]:g}{crosses}), interval {span}")
        return f"{self.estimate:.4g} {unit}, interval {span}, where {self.objective} crosses its limit"

    @property
    def width_share(self) -> Optional[float]:
        """(high − low) / high: the sweep's --tolerance measure (None unless bracketed)."""
        return (self.high - self.low) / self.high if self.low is not None and self.high else None


@dataclass
class SweepResult:
    name: str
    mode: str  # rate | concurrency
    unit: str
    steps: list[Step]
    capacity: Capacity
    attainment_capacity: Optional[Capacity]  # DistServe's goodput (slo.goodput.min_ratio), if in the scenario
    knee: Optional[float]
    saturation: Optional[float]
    require: Optional[float]
    tolerance: float
    confidence: float
    stop_reason: str
    wall_s: float
    exit_code: int
    reasons: list[str] = field(default_factory=list)
    out_dir: Optional[Path] = field(default=None, compare=False)
    curves: list[dict[str, Any]] = field(default_factory=list)  # per objective: ObjectiveCurve.as_dict

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "out_dir"}
        out["steps"] = [{f.name: getattr(s, f.name) for f in fields(s) if f.name != "curve"} for s in self.steps]
        out["capacity"] = asdict(self.capacity)
        out["attainment_capacity"] = asdict(self.attainment_capacity) if self.attainment_capacity else None
        return {**out, "schema_version": SCHEMA_VERSION}

    @classmethod
    def from_dict(cls, data: dict[str, Any], out_dir: Optional[Path] = None) -> "SweepResult":
        kwargs = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)} - {"out_dir"}}
        kwargs["steps"] = [Step(**s) for s in data["steps"]]
        kwargs["capacity"] = Capacity(**data["capacity"])
        kwargs["attainment_capacity"] = Capacity(**data["attainment_capacity"]) if data.get(
            "attainment_capacity") else None
        return cls(**kwargs, out_dir=out_dir)


def final_steps(steps: list[Step]) -> list[Step]:
    """One step per load (a re-run replaces its first attempt), by load."""
    return sorted({s.load: s for s in steps}.values(), key=lambda s: s.load)


def capacity_of(steps: list[Step], call_of: Any) -> Capacity:
    """[highest pass below the lowest failure, lowest failure]: saturation counts as failure."""
    span = interval([Probe(s.load, call_of(s), s.saturated) for s in final_steps(steps)])
    return Capacity(span.low, span.high, span.bracketed)


def curve_capacity(steps: list[Step], curves: list[ObjectiveCurve], confidence: float,
                   unit: str) -> Optional[Capacity]:
    """The capacity from the objectives' curves (analysis/capacity_curve.py), bounded by what they do not reach.
    A saturated step, or one that failed an objective the curves do not cover (scoped, session, chunk gaps),
    lies above the capacity: ``high`` is at most that load and so is the estimate (then a bound, not a
    crossing). ``low`` is a probed load below it that the curves meet — the curves' own low end while it lies
    below that load — at which every uncovered objective passed: one undecided there holds ``low`` down to the
    highest load where all passed (none: not decided, ``pending`` says which and where)."""
    found: Optional[CurveCapacity] = capacity_of_curves(curves, confidence, unit)
    if found is None:
        return None
    on_curve, final = {c.objective for c in curves}, final_steps(steps)
    stop = next((s for s in final if s.saturated or _uncovered(s, on_curve, "fail")), None)
    cap = stop.load if stop is not None else math.inf
    high = cap if found.high is None or found.high > cap else found.high
    if found.low is None:
        candidates: list[Step] = []
    elif found.low < cap:
        candidates = [s for s in final if s.load <= found.low]
    else:  # the curves' low end is at or above the bound: the highest load below it the curves meet
        candidates = [s for s in final if s.load < cap and all(c.meets(s.load) for c in curves)]
    low = max((s.load for s in candidates if not _uncovered(s, on_curve, "undecided")), default=None)
    held = [s for s in candidates if low is None or s.load > low]
    pending = sorted({o for s in held for o in _uncovered(s, on_curve, "undecided")})
    bounded = stop is not None and found.side != "below" and (found.estimate is None or found.estimate >= cap)
    estimate = cap if bounded else low if found.flat else found.estimate
    return Capacity(low, None if math.isinf(high) else high, low is not None and not math.isinf(high), estimate,
                    found.objective, "curve", found.flat, found.crossing,
                    list(found.flat_range) if found.flat_range else None,
                    _bound_text(stop, on_curve, unit) if bounded else "",
                    f"{', '.join(pending)} undecided at {_loads_text(held, unit)}" if pending else "")


def _uncovered(step: Step, on_curve: set[str], call: str) -> list[str]:
    """The objectives of ``step`` that the curves do not cover and whose call is ``call``."""
    return [str(o.get("objective")) for o in step.objectives
            if o.get("call") == call and o.get("objective") not in on_curve]


def _bound_text(stop: Optional[Step], on_curve: set[str], unit: str) -> str:
    """Why the capacity is below ``stop``'s load, in words."""
    if stop is None:
        return ""
    if stop.saturated:
        return f"the step at {stop.load:.4g} {unit} saturated"
    return f"{', '.join(_uncovered(stop, on_curve, 'fail'))} failed at {stop.load:.4g} {unit}"


def _loads_text(steps: list[Step], unit: str) -> str:
    """Steps' loads in words: "25.24 and 26.74 req/s"."""
    loads = [f"{s.load:.4g}" for s in steps]
    return (", ".join(loads[:-1]) + " and " + loads[-1] if len(loads) > 1 else "".join(loads)) + f" {unit}"


def knee_of(steps: list[Step]) -> Optional[float]:
    """The load where the latency curve turns: the highest tested load L with at least one tested load below
    it and KNEE_BEYOND above, whose TTFT p90 is within KNEE_FACTOR × the lightest load's (it rose less than
    that up to L) while at every tested load above L it is more than KNEE_FACTOR × L's. None: no knee shown
    (a curve that rises gradually, or only at its last load, has none; the highest load is never the knee)."""
    curve = [(s.load, p90) for s in final_steps(steps)
             if (p90 := s.metrics.get("ttft_ms", {}).get("p90")) is not None and p90 > 0]
    for i in range(len(curve) - KNEE_BEYOND - 1, 0, -1):
        load, p90 = curve[i]
        if p90 <= KNEE_FACTOR * curve[0][1] and all(v > KNEE_FACTOR * p90 for _, v in curve[i + 1:]):
            return load
    return None


def exit_code(cap: Capacity, require: Optional[float], calls: Optional[list[Call]] = None) -> tuple[int, list[str]]:
    """``calls``: fixed steps' calls (None for a search). Without ``require``, fixed steps are SLO tests: 0 when
    every step passed, 1 when one failed, 3 when one was undecided."""
    if require is None and calls is not None:
        if "fail" in calls:
            return 1, [f"{calls.count('fail')} of {len(calls)} steps failed their SLOs"]
        return (3, [f"{calls.count('undecided')} of {len(calls)} steps undecided"]) if "undecided" in calls else (0, [])
    if require is not None:
        if cap.low is not None and cap.low >= require:
            return 0, [f"capacity ≥ {cap.low:g} meets --require {require:g}"]
        if cap.high is not None and cap.high <= require:
            return 1, [f"capacity < {cap.high:g}, below --require {require:g}"]
        return 3, [f"--require {require:g} lies within the capacity interval: undecided"]
    if cap.decided:
        return 0, []
    if cap.low is None and cap.high is not None and cap.pending:
        return 3, [f"{cap.pending}: no load the curves meet is decided on every objective"]
    if cap.low is None and cap.high is not None:
        return 1, [f"no load passed: the capacity is below {cap.high:g}"]
    return 3, ["the capacity is not bracketed: no passing load sits below a failing one"]


def summarize_sweep(name: str, mode: str, steps: list[Step], require: Optional[float], tolerance: float,
                    confidence: float, stop_reason: str, wall_s: float, out_dir: Optional[Path],
                    interrupted: bool = False, fixed: bool = False) -> SweepResult:
    unit = "req/s" if mode == "rate" else "users"
    curves = curves_of([p for s in steps for p in s.curve], confidence)
    cap = capacity_of(steps, lambda s: s.call)
    cap = (curve_capacity(steps, curves, confidence, unit) or cap) if not fixed else cap
    has_attainment = any(s.attainment is not None for s in steps)
    attain = capacity_of(steps, lambda s: s.attainment) if has_attainment else None
    calls = [s.call if not s.saturated else "fail" for s in final_steps(steps)] if fixed else None
    code, reasons = exit_code(cap, require, calls)
    share = cap.width_share
    if not fixed and share is not None and share > tolerance:
        reasons.append(f"the capacity interval is {share:.0%} of its upper end wide, wider than --tolerance "
                       f"{tolerance:.0%}: {stop_reason or 'the search stopped'}")
    if interrupted:
        code, reasons = 3, ["the sweep was interrupted: " + (reasons[0] if reasons else cap.text("")).strip()]
    saturated = [s.load for s in final_steps(steps) if s.saturated]
    reasons += [stop_reason] if stop_reason and code == 3 else []
    if cap.pending and cap.low is not None:
        reasons.append(f"{cap.pending}: the capacity's low end is {cap.low:.4g} {unit}, the highest load the "
                       f"curves meet at which every objective they do not cover passed")
    if cap.flat and cap.low is not None:
        reasons.append(f"{cap.flat}: the capacity is the interval's low end, {cap.low:.4g} {unit}, at "
                       f"{confidence:.0%} confidence")
    reasons += [exit_line(code, reasons, steps, fixed and not interrupted)] if code else []
    return SweepResult(name, mode, unit, steps, cap, attain, knee_of(steps), min(saturated) if saturated else None,
                       require, tolerance, confidence, stop_reason, wall_s, code, reasons, out_dir,
                       [c.as_dict() for c in curves])
