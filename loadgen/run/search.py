"""Where to probe next in a capacity search, for how long, and what the probes so far say. Pure: no runs, no I/O.

The search spends its budget where the verdict changes (docs/verdicts.md, "sweep"):

1. **Bracket** fast: from the start load, double while no step failed (halve while steps fail and none passed),
   each step the shortest allowed: far from the capacity a verdict comes quickly, and an undecided step on the
   way up does not stop the climb.
2. **Certify the low end**: a failure with only undecided loads below it runs one of them again, as long as
   the planner says its objectives need: the highest that leans pass and whose need the budget can pay, else the
   highest that leans pass, else the highest (halving below them only when none can run longer).
3. **Bisect**: probe the middle of a gap between the highest pass, the undecided loads and the lowest failure,
   until every gap is within the tolerance: first the widest gap across which the verdict changes (an undecided
   load leans the way its point estimates do: "fail" if one misses its limit), then the widest of the others —
   a gap between an undecided load and a decided call on the same side is probed no farther than
   max(10 %, 2 × tolerance) from the undecided load, where a decided call narrows the interval most; then an
   undecided load left inside an interval still wider than the tolerance runs again, if the planner
   gives it at least 1.5× its last duration.

4. **Narrow the curve** (``CurveSpan``, analysis/capacity_curve.py): once the objectives' curves over the load
   give the crossing an interval with both ends, that interval replaces the bisection: the next step goes to
   the middle of the interval's wider side (between its low end and the crossing, or the crossing and its high
   end), where the replicates' crossings that make that side lie, so its samples shrink the widest side; a load
   already probed runs again and its samples pool with the earlier step's. The search stops when the interval
   is within the tolerance, or when the limiting objective is flat at its limit over a range of probed loads
   that holds the interval (within ± the tolerance, however wide the interval: more samples in a flat range
   do not narrow it, and the stop reason gives the interval's width and says so), or when the budget is spent.

Capacity is the interval [highest pass below the lowest failure, lowest failure]; undecided loads stay inside
it — or, where the steps have records, the curve's crossing and its interval (analysis/sweep_result.py). A
saturated step counts as failed, so the search never climbs past saturation.

**The planner** (``StepPlanner``) sizes a step by what its objectives need to be decided: an objective's
seconds at a probed load are the samples it needs there (``needed``; for a decided objective, the samples a
shortest step gathers there) over the rate at which it gathered samples (samples / duration), scaled to the new load (samples
arrive in proportion to the load); between two probed loads the smaller of the two counts, and never less than
the objective's floor (the fewest samples it was said to need while 20 % inside its limit); the step gets the most any objective
needs, times a 1.25 margin. Bracketing steps take the minimum; every step stays within
[minimum, maximum] and within what the remaining budget allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

from loadgen.analysis.capacity import Call, Interval, Probe, interval

__all__ = ["CapacitySearch", "CurveSpan", "Interval", "Need", "Phase", "Probe", "StepPlanner", "Trial", "interval",
           "final_trials", "steps_left"]

Phase = Literal["bracket", "bisect", "narrow", "again"]
AGAIN_FACTOR = 1.5  # a load runs again only this many times longer than its last step, or not at all
MARGIN = 1.25  # a planned step runs this much longer than its objectives' estimate needs
FLOOR_ROOM = 0.2  # an objective this far inside its limit and undecided lacks samples, not margin


@dataclass(frozen=True)
class Need:
    """One objective of a finished step: the samples it had, whether it was decided and, if not, the samples
    it needs."""

    objective: str
    samples: int
    needed: int | None = None
    decided: bool = False
    room: float | None = None  # how far its point estimate is inside its limit, as a share of it (< 0: outside)


@dataclass(frozen=True)
class Trial:
    """A finished step as the search and the planner see it."""

    load: float
    call: Call
    saturated: bool = False
    duration_s: float = 0.0
    needs: tuple[Need, ...] = ()
    lean: Call | None = None  # an undecided step: "fail" if a point estimate misses its limit, else "pass"

    @property
    def probe(self) -> Probe:
        return Probe(self.load, self.call, self.saturated)


@dataclass(frozen=True)
class CurveSpan:
    """What the objectives' curves say so far: the crossing's interval (an end None: beyond the probed loads),
    its point estimate and, where the limiting objective is flat at its limit, the loads over which it is."""

    low: float | None
    high: float | None
    estimate: float | None = None
    flat: tuple[float, float] | None = None


def final_trials(trials: list[Trial]) -> list[Trial]:
    """The last trial at each load (a load run again is judged on its latest step), by load."""
    return sorted({t.load: t for t in trials}.values(), key=lambda t: t.load)


@dataclass
class StepPlanner:
    """Step durations within [min_s, max_s]; ``needed_s`` is what the objectives ask, unbounded."""

    min_s: float
    max_s: float
    margin: float = MARGIN

    def needed_s(self, load: float, trials: list[Trial]) -> tuple[float, str]:
        """Seconds the objectives need at ``load`` (0: nothing known), and why. Per objective: at a load already
        probed, what it needs there if undecided; between two probed loads, the smaller of the two neighbours'
        seconds at ``load`` (an undecided one's ``needed`` samples; a decided one's — or any objective's of a
        step that passed or failed — samples in a shortest step: how much sooner it was decided is unknown,
        and the floor below keeps a percentile's own minimum);
        beyond them, the nearest one's if undecided — and never less than its floor: the fewest samples it was
        said to need where it had ample room (a p99's interval needs some hundreds of samples whatever the
        margin)."""
        final = final_trials(trials)
        below = [t for t in final if t.load <= load]
        above = [t for t in final if t.load > load]
        if below and below[-1].load == load:
            seconds = self._seconds(load, below[-1], decided_too=False)
        elif below and above:
            a, b = self._seconds(load, below[-1], True), self._seconds(load, above[0], True)
            seconds = {o: min(a.get(o, math.inf), b.get(o, math.inf)) for o in a.keys() | b.keys()}
        else:
            seconds = self._seconds(load, (below[-1:] or above[:1])[0], False) if final else {}
        for objective, floor_s in self._floors(load, final).items():
            seconds[objective] = max(seconds.get(objective, 0.0), floor_s)
        objective, most = max(seconds.items(), key=lambda kv: kv[1], default=("", 0.0))
        return most, f"{objective}: ~{most:.0f} s" if objective else ""

    def _seconds(self, load: float, t: Trial, decided_too: bool) -> dict[str, float]:
        out = {}
        for n in t.needs:  # a step that passed or failed needed no more than it had, on every objective
            sufficed = n.decided or t.call != "undecided"
            shortest = n.samples * min(1.0, self.min_s / t.duration_s) if t.duration_s > 0 else None
            want = shortest if sufficed and decided_too else n.needed if not sufficed else None
            if want is not None and n.samples > 0 and t.duration_s > 0:
                per_s = n.samples / t.duration_s * load / t.load  # samples per second at ``load``
                out[n.objective] = self.margin * want / per_s
        return out

    def _floors(self, load: float, final: list[Trial]) -> dict[str, float]:
        """Per objective, the fewest samples it was said to need where its point estimate had FLOOR_ROOM of
        room inside its limit (what its interval needs at all, whatever the margin), in seconds at ``load``
        (its sample rate from the nearest probed load)."""
        fewest: dict[str, int] = {}
        for t in final:
            for n in t.needs:
                if n.needed is not None and n.room is not None and n.room >= FLOOR_ROOM:
                    fewest[n.objective] = min(n.needed, fewest.get(n.objective, n.needed))
        out = {}
        for objective, needed in fewest.items():
            rated = [(abs(math.log(t.load / load)), t, n) for t in final for n in t.needs
                     if n.objective == objective and n.samples > 0 and t.duration_s > 0]
            if rated:
                _, t, n = min(rated, key=lambda x: x[0])
                out[objective] = self.margin * needed / (n.samples / t.duration_s * load / t.load)
        return out

    def duration_s(self, load: float, trials: list[Trial], phase: Phase, allowed_s: float) -> float:
        """The step's duration: the minimum when bracketing, else what its objectives need (a load run again: at
        least AGAIN_FACTOR × its last); never above the maximum or ``allowed_s`` (what the budget leaves)."""
        want = self.min_s if phase == "bracket" else max(self.min_s, self.needed_s(load, trials)[0])
        if phase == "again":
            last = max((t.duration_s for t in trials if t.load == load), default=0.0)
            want = max(want, AGAIN_FACTOR * last)
        return min(want, self.max_s, allowed_s)


def steps_left(probes: list[Probe], tolerance: float) -> int:
    """How many more bisections narrow the interval to the tolerance (3 while it is not bracketed)."""
    span = interval(probes)
    if span.low is None or span.high is None:
        return 3
    width = span.high - span.low
    return max(1, math.ceil(math.log2(max(1.0, width / (tolerance * span.high)))))


Plan = Callable[[float, Phase], float]  # (load, phase) → the seconds that step would run


@dataclass
class CapacitySearch:
    """``integer``: a concurrency search (whole users); ``tolerance``: the widest gap left, as a share of the
    gap's upper end; loads stay within [min_load, max_load]."""

    start: float
    min_load: float
    max_load: float
    tolerance: float = 0.05
    integer: bool = False
    factor: float = 2.0

    def next_step(self, trials: list[Trial], plan: Plan, decisive: Callable[[float], bool] = lambda load: True,
                  curve: CurveSpan | None = None) -> tuple[float | None, Phase, str]:
        """The next load, its phase, or None and why the search stops. ``plan``: the duration a step would get
        (a load runs again only if it would get ``AGAIN_FACTOR`` × its last duration); ``decisive``: whether
        that duration covers all its objectives need (the low end is certified on such a load first);
        ``curve``: the curves' crossing so far (with both ends, it places the step: ``_narrow_curve``)."""
        final = final_trials(trials)
        probes = [t.probe for t in final]
        span = interval(probes)
        if curve is not None and curve.low is not None and curve.high is not None:
            return self._narrow_curve(curve, {t.load for t in final})
        if span.high is not None and span.low is None:  # failures, no pass below: certify a load below first
            undecided = [t for t in final if t.call == "undecided" and not t.probe.failed and t.load < span.high]
            order = sorted(undecided, key=lambda t: (t.lean == "fail", not decisive(t.load), -t.load))
            again = self._again(order, plan)
            if again is not None:
                return again, "again", ""
        leans = {t.load: t.lean for t in final if t.call == "undecided"}
        load, why = self.next_load(probes, leans)
        if load is not None:
            return load, "bisect" if span.bracketed else "bracket", ""
        if span.low is not None and span.high is not None and not self._narrow(span.low, span.high):
            inside = [t for t in final if t.call == "undecided" and span.low < t.load < span.high]
            again = self._again(sorted(inside, key=lambda t: plan(t.load, "again")), plan)
            if again is not None:
                return again, "again", ""
            why = (f"the loads inside {span.low:g}–{span.high:g} stay undecided: deciding them needs longer "
                   f"steps than the budget and --max-step-duration allow") if inside else why
        return None, "bisect", why

    def _narrow_curve(self, curve: CurveSpan, tried: set[float]) -> tuple[float | None, Phase, str]:
        """The middle of the crossing interval's wider side (a load already tried within a quarter of the
        tolerance of it instead: 25.26 beside 25.24 adds nothing a second step at 25.24 would not), or None when
        it is within the tolerance or the limiting objective is flat at its limit over the probed loads that
        hold it."""
        low, high = curve.low, curve.high
        assert low is not None and high is not None
        if self._narrow(low, high):
            return None, "narrow", "within tolerance"
        if curve.flat is not None and curve.flat[0] * (1 - self.tolerance) <= low \
                and high <= curve.flat[1] * (1 + self.tolerance):
            return None, "narrow", (f"the limiting objective is flat at its limit from {curve.flat[0]:g} to "
                                    f"{curve.flat[1]:g}, which holds the interval {low:.4g}–{high:.4g}: "
                                    f"{(high - low) / high:.0%} of its upper end, wider than the tolerance "
                                    f"{self.tolerance:.0%} because more samples in a flat range do not narrow it")
        mid = curve.estimate if curve.estimate is not None and low <= curve.estimate <= high else (low + high) / 2
        load = self._fit((low + mid) / 2 if mid - low >= high - mid else (mid + high) / 2)
        near = min(tried, key=lambda t: abs(t - load), default=None)
        if near is not None and abs(near - load) <= self.tolerance / 4 * load:
            load = near  # as good as a load already tried: run it again, its steps pool on the curve
        return load, "narrow", ""

    def _again(self, candidates: list[Trial], plan: Plan) -> float | None:
        return next((t.load for t in candidates if plan(t.load, "again") >= AGAIN_FACTOR * t.duration_s), None)

    def next_load(self, probes: list[Probe], leans: dict[float, Call | None] | None = None
                  ) -> tuple[float | None, str]:
        """The next new load to probe (bracket, then bisect), or None and why the search stops. ``leans``: the
        way each undecided load leans (its point estimates), which puts the gap where it changes first."""
        if not probes:
            return self._fit(self.start), ""
        span = interval(probes)
        tried = {p.load for p in probes}
        if span.high is None:  # nothing failed yet: climb from the highest load tried
            up = self._fit(max(tried) * self.factor)
            return (up, "") if up not in tried and max(tried) < self.max_load else \
                (None, f"no load up to {self.max_load:g} failed")
        if span.low is None:  # nothing passed below the lowest failure: descend
            down = self._fit(min(tried) / self.factor)
            return (down, "") if down not in tried and min(tried) > self.min_load else \
                (None, f"no load down to {self.min_load:g} passed")
        return self._bisect(span, probes, tried, leans or {})

    def _bisect(self, span: Interval, probes: list[Probe], tried: set[float],
                leans: dict[float, Call | None]) -> tuple[float | None, str]:
        """A load inside the widest gap wider than the tolerance, a gap across which the verdict changes (a
        pass or pass-leaning load below a fail or fail-leaning one) first: its middle, or, in a gap that only
        certifies an undecided load's side, no farther than ``fog_step`` from that load."""
        assert span.low is not None and span.high is not None
        inside = sorted({span.low, span.high} | {p.load for p in probes if span.low < p.load < span.high})
        side = {x: "pass" if x == span.low else "fail" if x == span.high else leans.get(x) or "pass"
                for x in inside}
        undecided = set(leans)
        gaps = sorted(((side[a] != side[b], b - a, a, b) for a, b in zip(inside, inside[1:])
                       if not self._narrow(a, b)), reverse=True)
        for changes, width, a, b in gaps:
            mid = (a + b) / 2
            if not changes and side[a] == "fail" and a in undecided:  # a decided failure just above the fog
                mid = min(mid, a * (1 + self.fog_step))
            elif not changes and side[b] == "pass" and b in undecided:  # a decided pass just below it
                mid = max(mid, b / (1 + self.fog_step))
            load = self._fit(mid)
            if a < load < b and load not in tried:
                return load, ""
        return None, "within tolerance"

    @property
    def fog_step(self) -> float:
        """How far beyond an undecided load to look for a decided call: twice the tolerance, at least 10 %."""
        return max(0.1, 2 * self.tolerance)

    def _narrow(self, a: float, b: float) -> bool:
        if self.integer:
            return b - a <= max(1.0, self.tolerance * b)
        return b - a <= self.tolerance * b

    def _fit(self, load: float) -> float:
        load = min(self.max_load, max(self.min_load, load))
        return float(math.floor(load + 0.5)) if self.integer else float(f"{load:.4g}")
