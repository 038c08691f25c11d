"""The true capacity of a scenario by brute force, against what ``loadgen sweep --find-max rate`` finds.

    python bench/capacity_grid.py --rates 10:30:1 --grid-duration-s 120 --out /tmp/capgrid

1. The grid: one long run per rate (fine steps), each judged by its own verdict — with long runs the point
   estimates are the truth the search must find. The capacity is the highest passing rate below the first
   failing one.
2. The search: ``api.sweep(find_max="rate")`` with the scenario's own step duration and ``--tolerance``.
3. Printed and written to OUT/capacity_grid.json: both capacities, the search's error against the grid
   (the interval's midpoint), and the wall time of each (the search should take ≤ 1/3 of the grid's).

Runs against the embedded simulator by default (the scenario's target); not part of the tests (minutes to
tens of minutes of wall time). Keep the machine otherwise idle: both sides run in real time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console

from loadgen import api


def parse_rates(text: str) -> list[float]:
    """``LO:HI:STEP`` or ``a,b,c``."""
    if ":" in text:
        lo, hi, step = (float(x) for x in text.split(":"))
        n = int(round((hi - lo) / step)) + 1
        return [round(lo + i * step, 6) for i in range(n)]
    return [float(x) for x in text.split(",")]


def grid(scenario: str, rates: list[float], duration_s: float, out: Path) -> dict:
    rows, t0 = [], time.monotonic()
    for rate in rates:
        sc = api.load_scenario(scenario, overrides={"load.rate_per_s": rate, "load.duration_s": duration_s})
        w0 = time.monotonic()
        r = api.run(sc, out=out / f"grid-{rate:g}")
        failed = [o["objective"] for o in r.slo if o["passed"] is False]
        rows.append({"rate": rate, "verdict": r.verdict, "failed": failed, "wall_s": time.monotonic() - w0,
                     "requests_per_s": r.throughput["requests_per_s"], "ttft_p99_ms": r.metrics["ttft_ms"]["p99"],
                     "itl_p99_ms": r.metrics["itl_ms"]["p99"], "tpot_p99_ms": r.metrics["tpot_ms"]["p99"]})
        print(f"grid {rate:g}/s: {r.verdict} {failed} ({rows[-1]['wall_s']:.0f} s)", flush=True)
    first_fail = min((x["rate"] for x in rows if x["verdict"] != "pass"), default=None)
    passes = [x["rate"] for x in rows if x["verdict"] == "pass" and (first_fail is None or x["rate"] < first_fail)]
    return {"steps": rows, "capacity": max(passes) if passes else None, "first_fail": first_fail,
            "wall_s": time.monotonic() - t0}


def search(scenario: str, tolerance: float, out: Path) -> dict:
    t0 = time.monotonic()
    r = api.sweep(scenario, find_max="rate", tolerance=tolerance, out=out / "search", console=Console())
    cap = r.capacity
    return {"low": cap.low, "high": cap.high, "decided": cap.decided, "steps": len(r.steps),
            "calls": [(s.load, s.call, s.saturated, round(s.duration_s)) for s in r.steps],
            "wall_s": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="scenarios/chat.yaml")
    ap.add_argument("--rates", default="10:30:1", help="the grid: LO:HI:STEP or a,b,c (requests/s)")
    ap.add_argument("--grid-duration-s", type=float, default=120.0, help="measured seconds per grid run")
    ap.add_argument("--tolerance", type=float, default=0.05, help="the search's tolerance (fraction)")
    ap.add_argument("--skip-grid", action="store_true", help="only the search")
    ap.add_argument("--skip-search", action="store_true", help="only the grid")
    ap.add_argument("--out", type=Path, default=Path("/tmp/capacity_grid"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict = {"scenario": args.scenario}
    if not args.skip_grid:
        doc["grid"] = grid(args.scenario, parse_rates(args.rates), args.grid_duration_s, args.out)
    if not args.skip_search:
        doc["search"] = search(args.scenario, args.tolerance, args.out)
    g, s = doc.get("grid"), doc.get("search")
    if g and s and g["capacity"] and s["low"] and s["high"]:
        mid = (s["low"] + s["high"]) / 2
        doc["error_pct"] = 100 * (mid / g["capacity"] - 1)
        doc["wall_ratio"] = s["wall_s"] / g["wall_s"]
        print(f"grid capacity {g['capacity']:g}/s (first failure {g['first_fail']}) in {g['wall_s']:.0f} s; "
              f"search {s['low']:g}–{s['high']:g}/s in {s['wall_s']:.0f} s ({s['steps']} steps): error "
              f"{doc['error_pct']:+.1f} %, wall {doc['wall_ratio']:.2f} of the grid's")
    (args.out / "capacity_grid.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
