"""A sweep step judged with confidence: does this load meet every SLO, fail one, or is it too close to tell?

Theory of operation
-------------------
One run's p99 is one noisy draw. Each objective is called by the step's own interval, the one its summary
carries (analysis/intervals.py: order statistics for percentiles, exact Poisson and binomial intervals for rates
and shares, batch means where samples are autocorrelated): it *passes* when the whole interval meets the
threshold, *fails* when the whole interval misses it, and is *undecided* otherwise — the run's verdict, the
sweep's step and advise read one implementation. A summary written before intervals (no ``basis``), or an
objective decided on its point value (``slo.decision: point``), is called by ``compare``'s Poisson bootstrap
over requests (analysis/compare.py) where it can reach the statistic, else by the run's own pass/fail. The
step fails if any objective fails, is undecided if any is undecided, and passes otherwise.

A limit of zero (the default ``error_rate.max: 0``) is judged on what was seen: one failure fails it.

Saturation (open loop): the server completes requests more slowly than they arrive, so the requests in flight
grow over the send window. Measured over its last two thirds: completions fell short of sends by more than
10 % of the sends and by more than three standard deviations of the number in flight (a Poisson count).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import polars as pl

from loadgen.analysis.compare import RunSamples, statistic
from loadgen.analysis.result import SloResult
from loadgen.core.vocabulary import ObjectiveId
from loadgen.plan.slo_spec import Goodput

Call = Literal["pass", "fail", "undecided"]
# the objectives that are limits on a statistic compare bootstraps under another name
ALIASES = {ObjectiveId("error_rate", "max"): "error_rate",
           ObjectiveId("stalls", "max_per_1k_tokens"): "stalls_per_1k_tokens",
           ObjectiveId("goodput", "min_ratio"): "goodput_ratio"}


@dataclass
class ObjectiveCall:
    objective: str
    threshold: float
    comparison: str  # "<=" or ">="
    value: float | None
    ci_low: float | None
    ci_high: float | None
    call: Call
    basis: str  # "interval" (the run's own, analysis/intervals.py) | "bootstrap" | "observed" | "point"
    samples: int = 0
    needed: float | None = None  # samples (tokens for a stall rate) at which it would be decided
    reason: str = ""  # why it is undecided, in words (the run's note)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bootstrap_name(objective: ObjectiveId) -> str | None:
    """The statistic ``compare`` can bootstrap for an SLO objective, if any."""
    if objective in ALIASES:
        return ALIASES[objective]
    return str(objective) if objective.bootstrappable else None


def _stat(name: str, s: RunSamples, w: np.ndarray, goodput: Goodput | None) -> np.ndarray:
    if name != "goodput_ratio":
        return statistic(name, s, w)
    good = s.ok.copy()
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        limit = getattr(goodput, metric) if goodput is not None else None
        if limit is not None:
            good &= np.nan_to_num(getattr(s, metric), nan=0.0) <= limit
    with np.errstate(invalid="ignore", divide="ignore"):
        return (w @ good.astype(float)) / w.sum(axis=1)


def _decide(comparison: str, threshold: float, lo: float, hi: float) -> Call:
    if comparison == ">=":
        return "pass" if lo >= threshold else "fail" if hi < threshold else "undecided"
    return "pass" if hi <= threshold else "fail" if lo > threshold else "undecided"


def judge(slo: list[SloResult], samples: RunSamples, goodput: Goodput | None, confidence: float = 0.95,
          replicates: int = 1000, seed: int = 0) -> list[ObjectiveCall]:
    """Every SLO objective of one run (its summary's ``slo`` list) called pass / fail / undecided: by the run's
    own interval where its summary has one (one implementation for the run, the sweep and advise); a summary
    written before intervals is judged by the Poisson bootstrap over requests, as it was."""
    rng = np.random.default_rng(seed)
    w = rng.poisson(1.0, size=(replicates, samples.n)).astype(np.float64) if samples.n else np.zeros((0, 0))
    out = []
    for o in slo:
        d: dict[str, Any] = dict(o)
        if d.get("basis") in ("interval", "observed"):
            call: Call = "undecided" if o["passed"] is None else "pass" if o["passed"] else "fail"
            out.append(ObjectiveCall(o["objective"], o["threshold"], o["comparison"], o["value"], d.get("ci_low"),
                                     d.get("ci_high"), call, str(d.get("basis")), o["samples"], d.get("needed"),
                                     o["note"] if call == "undecided" else ""))
        else:
            out.append(_bootstrap_call(o, samples, goodput, w, confidence, replicates))
    return out


def _bootstrap_call(o: SloResult, samples: RunSamples, goodput: Goodput | None, w: np.ndarray,
                    confidence: float, replicates: int) -> ObjectiveCall:
    name, thr, cmp_, value = bootstrap_name(ObjectiveId.of(o)), o["threshold"], o["comparison"], o["value"]
    alpha = (1 - confidence) / 2
    if o["passed"] is None:
        return ObjectiveCall(o["objective"], thr, cmp_, value, None, None, "undecided", "point", o["samples"],
                             None, o["note"])
    if thr == 0 and cmp_ == "<=":
        return ObjectiveCall(o["objective"], thr, cmp_, value, value, value, "pass" if o["passed"] else "fail",
                             "observed", o["samples"])
    if name is None or samples.n == 0:
        return ObjectiveCall(o["objective"], thr, cmp_, value, None, None, "pass" if o["passed"] else "fail",
                             "point", o["samples"])
    reps = _stat(name, samples, w, goodput)
    reps = reps[np.isfinite(reps)]
    if len(reps) < 0.9 * replicates:
        return ObjectiveCall(o["objective"], thr, cmp_, value, None, None, "undecided", "bootstrap",
                             o["samples"], None, "too few bootstrap replicates had a value")
    lo, hi = (float(x) for x in np.quantile(reps, [alpha, 1 - alpha]))
    return ObjectiveCall(o["objective"], thr, cmp_, value, lo, hi, _decide(cmp_, thr, lo, hi), "bootstrap",
                         o["samples"])


def samples_factor(slo: list[SloResult]) -> float:
    """How many times more samples the run needed to judge every objective (1.0: enough)."""
    factor = 1.0
    for o in slo:
        found = re.search(r"needs >= (\d+) samples", o.get("note") or "")
        if o["passed"] is None and found:
            factor = max(factor, int(found.group(1)) / max(1, o["samples"]))
    return factor


def step_call(calls: list[ObjectiveCall]) -> Call:
    if any(c.call == "fail" for c in calls):
        return "fail"
    return "undecided" if any(c.call == "undecided" for c in calls) else "pass"


def attainment_call(calls: list[ObjectiveCall]) -> Call | None:
    """The call of DistServe's goodput objective alone (``goodput.min_ratio``), if the scenario has one."""
    return next((c.call for c in calls if c.objective == "goodput.min_ratio"), None)


@dataclass
class Backlog:
    """Sends and completions over the last two thirds of the send window (open loop)."""

    sent: int
    completed: int
    in_flight_start: int
    saturated: bool


def backlog(requests: pl.DataFrame) -> Backlog | None:
    """Did the requests in flight grow over the send window? (None: too few requests to tell.) ``requests``:
    the run's measured request records (t_intended_ns, t_done_ns)."""
    if requests.height < 30:
        return None
    t_start, t_end = requests["t_intended_ns"].min(), requests["t_intended_ns"].max()
    t1 = t_start + (t_end - t_start) / 3  # type: ignore[operator]
    intended, done = pl.col("t_intended_ns"), pl.col("t_done_ns")
    row = requests.select(
        ((intended > t1) & (intended <= t_end)).sum().alias("sent"),
        ((done > t1) & (done <= t_end)).sum().alias("completed"),
        ((intended <= t1) & (done > t1)).sum().alias("in_flight")).row(0)
    sent, completed, in_flight = (int(x) for x in row)
    if sent < 20:
        return None
    growth = sent - completed
    saturated = growth > 0.1 * sent and growth > 3 * math.sqrt(in_flight + 1)
    return Backlog(sent, completed, in_flight, saturated)


# ---- what the probes so far say (the search and the sweep's result both read it) ---------------------------
@dataclass(frozen=True)
class Probe:
    load: float
    call: Call
    saturated: bool = False

    @property
    def failed(self) -> bool:
        return self.call == "fail" or self.saturated


@dataclass(frozen=True)
class Interval:
    low: float | None  # highest load that passed below the lowest failure (None: none passed)
    high: float | None  # lowest load that failed (None: none failed)

    @property
    def bracketed(self) -> bool:
        return self.low is not None and self.high is not None


def interval(probes: list[Probe]) -> Interval:
    fails = [p.load for p in probes if p.failed]
    high = min(fails) if fails else None
    passes = [p.load for p in probes if p.call == "pass" and not p.failed and (high is None or p.load < high)]
    return Interval(max(passes) if passes else None, high)
