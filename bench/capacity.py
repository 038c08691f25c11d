"""How many tokens per second one client core measures truthfully: loadgen against bench/precise_emitter.py.

    python bench/capacity.py                       # asyncio and --engine locust, 64/128/192/256 streams
    python bench/capacity.py --engines asyncio --streams 256 --duration-s 20
    python bench/capacity.py --engines locust:1,locust:2 --streams 256 --cpus 0,1   # scale-out: 1 and 2 workers

The emitter runs on CPU 0 (real-time priority where allowed), ``loadgen run`` on CPU 1 (taskset), both reading
CLOCK_MONOTONIC. Closed loop: N users each send one streaming request after another; every stream is 128 tokens,
the first TTFT (20 ms, plus a seeded 0–ITL spread so that the users' streams do not tick in step) after the
request, then one every ITL (5 ms). Requests of the warm-up (the first 2 s) are left out.

Per row: tokens/s (loadgen's measured output throughput); chunk-gap p99 error (|loadgen's gap between two chunks
− the emitter's gap between writing them|, p99); TTFT p99 error (loadgen's first-token stamp − the emitter's
write of that token, p99: the whole error of the client's TTFT, since loadgen stamps its send just before the
write syscall); loadgen's CPU per 1k tokens (its process CPU while the engine ran, over every token it read);
the emitter's own lateness p99 (its write − the scheduled instant; the truth is the write, so lateness does not
enter the errors, but it says the emitter kept the load it was asked for). The goal line: chunk-gap and TTFT
p99 error ≤ 2 ms at ≥ 37,000 tokens/s, ≤ 15 ms of CPU per 1k tokens. Keep the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
TTFT_MS, ITL_MS, TOKENS, WARMUP_S = 20.0, 5.0, 128, 2.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def scenario(port: int, streams: int, duration_s: float) -> str:
    return f"""
name: capacity
target: {{base_url: "http://127.0.0.1:{port}/v1", model: auto, ttft_timeout_s: 30, idle_timeout_s: 30}}
load: {{arrival: concurrency, concurrency: {streams}, duration_s: {duration_s}, warmup_s: {WARMUP_S},
        max_in_flight: {streams}}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: {TOKENS}}}}}]
slo: {{max_generator_lag_ms: 1000}}
"""


def run_once(engine: str, streams: int, duration_s: float, tmp: Path, cpus: str = "1") -> dict:
    """``engine``: asyncio, locust (one process) or locust:N (a master and N local workers)."""
    engine, _, workers = engine.partition(":")
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "writes.json"
    emitter = subprocess.Popen([sys.executable, str(ROOT / "bench/precise_emitter.py"), "--cpu", "0",
                                "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--ttft-spread-ms", str(ITL_MS),
                                "--log", str(log)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(emitter.stdout.readline().split()[1])
        (tmp / "s.yaml").write_text(scenario(port, streams, duration_s))
        res = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "loadgen", "run", str(tmp / "s.yaml"),
                              "--out", str(tmp / "run"), "--no-progress", "--no-png", "--no-server-metrics",
                              "--engine", engine, *(["--workers", workers] if workers else [])],
                             cwd=ROOT, capture_output=True, text=True)
    finally:
        emitter.terminate()
        emitter.wait()
    if res.returncode not in (0, 1, 3):
        raise SystemExit(f"loadgen run failed ({res.returncode}): {res.stderr[-2000:]}")
    return measure(json.loads(log.read_text()), tmp / "run")


def measure(truth: dict, run_dir: Path) -> dict:
    req = pl.read_parquet(run_dir / "requests.parquet")
    chunks = pl.read_parquet(run_dir / "chunks.parquet").sort("t_ns")
    summary = json.loads((run_dir / "summary.json").read_text())
    by_seq = {seq: g["t_ns"].to_list() for (seq,), g in chunks.group_by("seq")}
    ttft_err, gap_err = [], []
    for row in req.filter(pl.col("error_kind").is_null() & ~pl.col("warmup")).iter_rows(named=True):
        writes = truth[row["request_id"]][1:]  # [0] is the emitter's receipt of the request
        ttft_err.append((row["t_first_token_ns"] - writes[0]) / 1e6)
        seen = by_seq[row["seq"]]
        gap_err += [abs((b - a) - (wb - wa)) / 1e6 for a, b, wa, wb in zip(seen, seen[1:], writes, writes[1:])]
    gen, em = summary["generator"], truth["__emitter__"]
    cpu_ms = gen["cpu_s"] / int(req["output_tokens"].sum()) * 1e6 if "cpu_s" in gen else float("nan")  # workers: -
    return {"tokens_per_s": summary["throughput"]["output_tokens_per_s"], "gap_p99_ms": pct(gap_err, 0.99),
            "ttft_p99_ms": pct(ttft_err, 0.99), "cpu_ms_per_1k": cpu_ms,
            "cpu_utilization": gen.get("cpu_utilization") or float("nan"),
            "emitter_lateness_p99_us": em["lateness_us"]["p99"],
            "emitter_scheduler": em["scheduler"], "requests": req.height, "errors": summary["requests"]["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="asyncio,locust",
                    help="asyncio, locust (one process), locust:N (a master and N local workers), comma-separated")
    ap.add_argument("--cpus", default="1", help="loadgen's CPUs (taskset -c); the emitter keeps CPU 0")
    ap.add_argument("--streams", default="64,128,192,256")
    ap.add_argument("--duration-s", type=float, default=10.0, help="measured seconds per row (after the warm-up)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for engine in args.engines.split(","):
            print(f"\n{engine}:\n| streams | tokens/s | chunk-gap p99 error | TTFT p99 error | loadgen CPU per 1k "
                  "tokens | loadgen CPU use | emitter lateness p99 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for n in (int(x) for x in args.streams.split(",")):
                r = run_once(engine, n, args.duration_s, Path(d) / f"{engine.replace(':', '-')}-{n}", args.cpus)
                rows.append({"engine": engine, "streams": n, **r})
                print(f"| {n} | {r['tokens_per_s']:,.0f} | {r['gap_p99_ms']:.2f} ms | {r['ttft_p99_ms']:.2f} ms | "
                      f"{r['cpu_ms_per_1k']:.1f} ms | {r['cpu_utilization']:.2f} | "
                      f"{r['emitter_lateness_p99_us']:.0f} µs |", flush=True)
    print(f"\nemitter: {rows[0]['emitter_scheduler'] if rows else '-'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
