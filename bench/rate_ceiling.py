"""Does ``load.max_rate_per_s`` add send lag? Closed loop on the embedded simulator, three ways: no ceiling, a
ceiling far above what the users reach (not binding), and a binding one. Prints the achieved request rate and the
generator's send lag (``queue_delay_ms``: intended send to the bytes leaving) for each.

    python bench/rate_ceiling.py --concurrency 64 --duration-s 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

from loadgen import api
from loadgen.plan.scenario import Scenario

BASE = {
    "name": "rate-ceiling",
    "target": {"base_url": "embedded", "simulator": {"preset": "h100-llama-8b"}},
    "seed": 4,
    "load": {"arrival": "concurrency", "concurrency": 64, "duration_s": 20, "warmup_s": 2},
    "workload": {"classes": [{"name": "short", "prompt_tokens": {"dist": "uniform", "min": 64, "max": 256},
                              "output_tokens": {"dist": "fixed", "value": 32}}]},
    "slo": {"error_rate": {"max": 0.01}},
}


def one(ceiling: float | None, concurrency: int, duration_s: float, out: Path) -> dict:
    doc = {**BASE, "load": {**BASE["load"], "concurrency": concurrency, "duration_s": duration_s}}
    if ceiling is not None:
        doc["load"]["max_rate_per_s"] = ceiling
    r = api.run(Scenario.model_validate(doc), out=out)
    req = pl.read_parquet(out / "requests.parquet").filter(~pl.col("warmup")).sort("t_intended_ns")
    gap_s = req["t_intended_ns"].diff().drop_nulls() / 1e9
    lag = r.metrics["queue_delay_ms"]
    return {"ceiling_per_s": ceiling, "requests_per_s": r.throughput["requests_per_s"],
            "lag_p50_ms": lag["p50"], "lag_p99_ms": lag["p99"], "lag_max_ms": lag["max"],
            "min_spacing_ms": 1000 * float(gap_s.min()) if gap_s.len() else None}  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--binding-share", type=float, default=0.5, help="the binding ceiling: this × the uncapped rate")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        free = one(None, args.concurrency, args.duration_s, Path(tmp) / "free")
        rows = [free, one(round(100 * free["requests_per_s"]), args.concurrency, args.duration_s, Path(tmp) / "loose"),
                one(round(args.binding_share * free["requests_per_s"], 1), args.concurrency, args.duration_s,
                    Path(tmp) / "binding")]
    print("| ceiling (req/s) | achieved req/s | send lag p50 (ms) | p99 (ms) | max (ms) | min spacing (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['ceiling_per_s'] or 'none'} | {r['requests_per_s']:.1f} | {r['lag_p50_ms']:.3f} | "
              f"{r['lag_p99_ms']:.3f} | {r['lag_max_ms']:.3f} | {r['min_spacing_ms']:.2f} |")


if __name__ == "__main__":
    main()
