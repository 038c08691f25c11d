"""Each candidate's capacity on the calibrated simulator (``loadgen advise --capacity``): the highest multiple of
the run's request rate at which the replay still meets every objective. Pure.

At a factor f the run's open-loop plan is tiled f times over its own duration (copy k of every request is sent
at (k·D + t) / f, those past D dropped), so the load is f times the run's with the same mix and duration. The
search doubles or halves from f = 1 until it brackets a pass and a fail, then bisects until the bracket is
within ``tolerance`` of its lower end (the capacity); every probe is one replay judged on point estimates.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from loadgen.advise.replay import ReplayRequest

MAX_FACTOR = 64.0
SEQ_STRIDE = 1_000_000  # copy k of request s gets seq k × SEQ_STRIDE + s


def plan_span_ns(requests: list[ReplayRequest]) -> int:
    """The plan's duration D: first to last intended send, plus one mean interval."""
    times = sorted(r.t_intended_ns for r in requests)
    if len(times) < 2:
        return max(times[-1], 1) if times else 1
    return times[-1] - times[0] + (times[-1] - times[0]) // (len(times) - 1)


def tiled(requests: list[ReplayRequest], factor: float) -> list[ReplayRequest]:
    """The plan at ``factor`` times its rate over the same duration (warm-up: the first copy's only)."""
    span = plan_span_ns(requests)
    out = []
    for k in range(math.ceil(factor)):
        for r in requests:
            t = int((k * span + r.t_intended_ns) / factor)
            if t < span:
                out.append(replace(r, seq=k * SEQ_STRIDE + r.seq, t_intended_ns=t, warmup=r.warmup and k == 0))
    return out


def search(meets: Callable[[float], bool], tolerance: float = 0.05,
           progress: Callable[[float, bool], None] = lambda f, ok: None) -> tuple[float | None, float | None]:
    """(highest passing factor, lowest failing factor); None for a side never reached within
    [1/MAX_FACTOR, MAX_FACTOR]."""
    def probe(f: float) -> bool:
        ok = meets(f)
        progress(f, ok)
        return ok

    lo: float | None = None
    hi: float | None = None
    f = 1.0
    while lo is None or hi is None:
        if probe(f):
            lo = f
            if hi is None and f * 2 > MAX_FACTOR:
                return lo, None
            f = f * 2 if hi is None else f
        else:
            hi = f
            if lo is None and f / 2 < 1 / MAX_FACTOR:
                return None, hi
            f = f / 2 if lo is None else f
    while hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
