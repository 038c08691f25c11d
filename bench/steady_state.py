"""How often steady-state detection (loadgen/analysis/steady.py) cuts a stationary series, and how well it finds
a transient: the table of docs/verdicts.md, "Steady state".

    python bench/steady_state.py                 # 1,000 replications per cell (240 for 6,000 values)
    python bench/steady_state.py --reps 200      # a quicker look

Every series goes through the rule as a run's would (ranks, MSER-5 at the front, then on the reversed rest):

- stationary from the first value: iid lognormal (σ 1.5), AR(1) (φ 0.5, 0.9, 0.98, started from its stationary
  law), M/M/1 waiting + service times (Lindley's recursion after 5,000 values of burn-in, ρ 0.8 and 0.9);
- with a transient: a cold start (the first 5 % three times slower, iid lognormal σ 0.5) and an overload
  (M/M/1 at ρ 1.2 from empty: the queue grows to the end).

Columns: ``cut`` the share of runs that lost requests at either end; ``mean cut`` the requests cut, as a share
of the series; ``not reached`` the share flagged ``reached: false``. Seeded: the same table every time.
"""

from __future__ import annotations

import argparse
from typing import Callable

import numpy as np

from loadgen.analysis import steady as st

SIZES = (100, 300, 1500, 6000)
Generator = Callable[[np.random.Generator, int], np.ndarray]


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0] / np.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def mm1(rng: np.random.Generator, n: int, rho: float, burn_in: int = 5000) -> np.ndarray:
    total = n + burn_in
    arrivals, service = rng.exponential(1 / rho, total), rng.exponential(1.0, total)
    wait = np.zeros(total)
    for i in range(1, total):
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - arrivals[i])
    return (wait + service)[burn_in:]


def cold_start(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.lognormal(0.0, 0.5, n)
    x[: n // 20] *= 3.0
    return x


GENERATORS: dict[str, Generator] = {
    "iid lognormal σ 1.5": lambda rng, n: rng.lognormal(0.0, 1.5, n),
    "AR(1) φ 0.5": lambda rng, n: ar1(rng, n, 0.5),
    "AR(1) φ 0.9": lambda rng, n: ar1(rng, n, 0.9),
    "AR(1) φ 0.98": lambda rng, n: ar1(rng, n, 0.98),
    "M/M/1 ρ 0.8": lambda rng, n: mm1(rng, n, 0.8),
    "M/M/1 ρ 0.9": lambda rng, n: mm1(rng, n, 0.9),
    "cold start (first 5 % ×3)": cold_start,
    "overload (M/M/1 ρ 1.2)": lambda rng, n: mm1(rng, n, 1.2, burn_in=0),
}


def ranks(x: np.ndarray) -> np.ndarray:
    return (np.argsort(np.argsort(x, kind="stable"), kind="stable") + 1.0) / (len(x) + 1)


def cell(gen: Generator, n: int, reps: int, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    cut = cut_share = flagged = 0.0
    for _ in range(reps):
        series = ranks(gen(rng, n))
        head = st.truncation(series)
        tail = st.truncation(series[head.requests:][::-1]) if head.reached else head
        if not (head.reached and tail.reached):
            flagged += 1
            continue
        lost = head.requests + tail.requests
        cut += lost > 0
        cut_share += lost / n
    return cut / reps, cut_share / reps, flagged / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1000, help="replications per cell (a quarter at 6,000)")
    args = parser.parse_args()
    print("| series | n | cut | mean cut | not reached |\n| --- | --- | --- | --- | --- |")
    for i, (name, gen) in enumerate(GENERATORS.items()):
        for j, n in enumerate(SIZES):
            reps = args.reps if n < 6000 else max(1, args.reps // 4)
            cut, share, flagged = cell(gen, n, reps, seed=1000 * i + j)
            print(f"| {name} | {n:,} | {cut:.1%} | {share:.1%} | {flagged:.1%} |", flush=True)


if __name__ == "__main__":
    main()
