"""Where to probe next in a capacity search, and what the probes so far say. Pure: no runs, no I/O.

Bracket, then bisect. From the start load, double while steps pass (halve while they fail) until a passing load
sits below a failing one; then probe the middle of the widest gap between the highest pass, any undecided loads
and the lowest fail, until every gap is within the tolerance. Capacity is the interval [highest pass below the
lowest fail, lowest fail]; an undecided load (too close to call, even re-run longer) stays inside it. A
saturated step counts as failed, so the search never climbs past saturation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadgen.analysis.capacity import Interval, Probe, interval

__all__ = ["CapacitySearch", "Interval", "Probe", "interval"]


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

    def next_load(self, probes: list[Probe]) -> tuple[float | None, str]:
        """The next load to probe, or None and why the search stops."""
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
        return self._bisect(span, probes, tried)

    def _bisect(self, span: Interval, probes: list[Probe], tried: set[float]) -> tuple[float | None, str]:
        assert span.low is not None and span.high is not None
        inside = sorted({span.low, span.high} | {p.load for p in probes if span.low < p.load < span.high})
        gaps = sorted(((b - a, a, b) for a, b in zip(inside, inside[1:])), reverse=True)
        for width, a, b in gaps:
            if self._narrow(a, b):
                break
            mid = self._fit((a + b) / 2)
            if a < mid < b and mid not in tried:
                return mid, ""
        return None, "within tolerance"

    def _narrow(self, a: float, b: float) -> bool:
        if self.integer:
            return b - a <= max(1.0, self.tolerance * b)
        return b - a <= self.tolerance * b

    def _fit(self, load: float) -> float:
        load = min(self.max_load, max(self.min_load, load))
        return float(math.floor(load + 0.5)) if self.integer else float(f"{load:.4g}")
