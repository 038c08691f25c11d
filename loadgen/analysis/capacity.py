"""A sweep step judged with confidence: does this load meet every SLO, fail one, or is it too close to tell?

Theory of operation
-------------------
One run's p99 is one noisy draw. Each objective a bootstrap can reach (a percentile of TTFT, ITL, TPOT or E2E,
the error rate, stalls per 1k tokens, the goodput ratio) gets a confidence interval from ``compare``'s Poisson
bootstrap over requests (analysis/compare.py): it *passes* when the whole interval meets the threshold, *fails*
when the whole interval misses it, and is *undecided* otherwise. Objectives the bootstrap does not model
(prompt-aware TTFT, fluidity, chunk gaps, ...) keep the run's own pass/fail; an objective the run could not
judge (too few samples) is undecided. The step fails if any objective fails, is undecided if any is undecided,
and passes otherwise.

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
    basis: str  # "bootstrap" | "observed" | "point"

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
    """Every SLO objective of one run (its summary's ``slo`` list) called pass / fail / undecided."""
    rng = np.random.default_rng(seed)
    w = rng.poisson(1.0, size=(replicates, samples.n)).astype(np.float64) if samples.n else np.zeros((0, 0))
    alpha = (1 - confidence) / 2
    out = []
    for o in slo:
        name, thr, cmp_, value = bootstrap_name(ObjectiveId.of(o)), o["threshold"], o["comparison"], o["value"]
        if o["passed"] is None:
            out.append(ObjectiveCall(o["objective"], thr, cmp_, value, None, None, "undecided", "point"))
        elif thr == 0 and cmp_ == "<=":
            out.append(ObjectiveCall(o["objective"], thr, cmp_, value, value, value,
                                     "pass" if o["passed"] else "fail", "observed"))
        elif name is None or samples.n == 0:
            out.append(ObjectiveCall(o["objective"], thr, cmp_, value, None, None,
                                     "pass" if o["passed"] else "fail", "point"))
        else:
            reps = _stat(name, samples, w, goodput)
            reps = reps[np.isfinite(reps)]
            if len(reps) < 0.9 * replicates:
                out.append(ObjectiveCall(o["objective"], thr, cmp_, value, None, None, "undecided", "bootstrap"))
                continue
            lo, hi = (float(x) for x in np.quantile(reps, [alpha, 1 - alpha]))
            out.append(ObjectiveCall(o["objective"], thr, cmp_, value, lo, hi, _decide(cmp_, thr, lo, hi),
                                     "bootstrap"))
    return out


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
