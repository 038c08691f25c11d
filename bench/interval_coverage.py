"""The coverage table of docs/verdicts.md: each interval kind of the verdict, as tests/test_interval_coverage.py
draws it (2,000 seeded replications a row, the same seeds), printed as a Markdown table.

    python bench/interval_coverage.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loadgen.analysis import intervals as iv  # noqa: E402
from loadgen.analysis import objective_intervals as oi  # noqa: E402
from tests import test_interval_coverage as t  # noqa: E402


def rows() -> list[tuple[str, str, float]]:
    out = []
    for n, q in ((400, 0.99), (1000, 0.99), (500, 0.9), (300, 0.5)):
        true = float(stats.lognorm.ppf(q, 1.0))
        out.append(("percentile, one value per request (order statistics)", f"p{100 * q:g}, n = {n}",
                    t.coverage(lambda r: oi.quantile(r.lognormal(0, 1, n), q, 1e9, 0.95).interval.contains(true))))
    for q, requests, tokens in ((0.5, 200, 50), (0.9, 200, 50), (0.99, 500, 20)):
        true = 20 * math.exp(float(stats.norm.ppf(q)) * math.sqrt(0.5))

        def draw(r: np.random.Generator) -> bool:
            run = t._clustered_run(r, requests, tokens, 0.5, 0.5)
            estimate = float(run.gaps["gap_ns"].quantile(q, "linear")) / 1e6
            judged = oi.token_quantile(run, "itl_ms", q, estimate, 1e9, 0.95)  # type: ignore[arg-type]
            return judged.interval is not None and judged.interval.contains(true)
        out.append(("percentile of clustered tokens (batch means)", f"p{100 * q:g}, {requests} streams × {tokens}",
                    t.coverage(draw)))
    for mean in (5.0, 10.0, 20.0, 50.0, 200.0):
        out.append(("rate (mid-p Poisson)", f"mean {mean:g} events",
                    t.coverage(lambda r: oi.rate(int(r.poisson(mean)), 40_000.0, 1e9, "<=", 0.95, 1.0, 1000)
                               .interval.contains(1000 * mean / 40_000.0))))
    out.append(("bursty rate, dispersion measured (quasi-Poisson)", "bursts of mean 5, 20 batches",
                _bursty()))
    for p, n in ((0.01, 1000), (0.3, 200), (0.95, 500)):
        out.append(("share (mid-p binomial)", f"p = {p:g}, n = {n}",
                    t.coverage(lambda r: oi.proportion(int(r.binomial(n, p)), n, 2.0, "<=", 0.95)
                               .interval.contains(p))))
    out.append(("mean (Student t)", "lognormal, n = 200",
                t.coverage(lambda r: iv.mean_interval(r.lognormal(0, 0.5, 200)).contains(math.exp(0.125)))))
    return out


def _bursty() -> float:
    def draw(r: np.random.Generator) -> bool:
        bursts = r.poisson(0.4 * 1000 / 20 / 5, size=20)
        counts = np.array([r.geometric(0.2, size=b).sum() for b in bursts], dtype=float)
        d = iv.dispersion(counts, np.full(20, 1000 / 20))
        return iv.poisson_rate_interval(int(counts.sum()), 1000.0, 0.95, d).contains(0.4)
    return t.coverage(draw)


if __name__ == "__main__":
    print("| interval | case | coverage of nominal 95 % |\n| --- | --- | ---: |")
    for kind, case, got in rows():
        print(f"| {kind} | {case} | {100 * got:.1f} % |")
