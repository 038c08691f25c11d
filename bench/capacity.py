"""How many tokens per second one client core measures truthfully: loadgen against the precise emitter
(local_target/precise_emitter.py; bench/precise_emitter.py starts the same). Each row is one step of
``loadgen bench-client`` (loadgen/run/bench_client.py: the same step and scoring), here with engines and CPUs to
choose and no stopping rule.

    python bench/capacity.py                       # asyncio and --engine locust, 64/128/192/256 streams
    python bench/capacity.py --engines asyncio --streams 256 --duration-s 20
    python bench/capacity.py --engines asyncio:1,asyncio:2 --streams 256 --cpus 1-2   # scale-out: 1 and 2 processes

The emitter runs on CPU 0 (real-time priority where allowed), ``loadgen run`` on CPU 1 (sched_setaffinity), both reading
CLOCK_MONOTONIC. Closed loop: N users each send one streaming request after another; every stream is 128 tokens,
the first TTFT (20 ms, plus a seeded 0–ITL spread so that the users' streams do not tick in step) after the
request, then one every ITL (5 ms). Requests of the warm-up (the first 2 s) are left out.

Per row: tokens/s (loadgen's measured output throughput); chunk-gap p99 error (|loadgen's gap between two chunks
− the emitter's gap between writing them|, p99); TTFT p99 error (loadgen's first-token stamp − the emitter's
write of that token, p99: the whole error of the client's TTFT, since loadgen stamps its send just before the
write syscall); loadgen's CPU per 1k tokens (its process CPU while the engine ran, over every token it read);
the emitter's own lateness p99 (its write − the scheduled instant; the truth is the write, so lateness does not
enter the errors, but it says the emitter kept the load it was asked for). The goal line (the issue's): chunk-gap
and TTFT p99 error ≤ 1 ms at 192 and 256 streams, ≤ 15 ms of CPU per 1k tokens. Keep the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.run.bench_client import Pinning, measure, run_step  # noqa: E402  the product's step, one emitter

__all__ = ["measure", "run_once"]


def run_once(engine: str, streams: int, duration_s: float, tmp: Path, cpus: str = "1") -> dict:
    """``engine``: asyncio or locust, ``:N`` for N sending processes (run --workers N; Locust: N workers and a
    master); ``cpus``: loadgen's (taskset -c syntax: 1 or 1,2 or 1-3), the emitter keeps CPU 0. The step is
    ``loadgen bench-client``'s."""
    engine, _, workers = engine.partition(":")
    row = run_step(streams, duration_s, tmp, Pinning(0, tuple(sorted(_cpus(cpus)))), engine, int(workers or 1))
    row.pop("streams")
    return row


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out |= set(range(int(first), int(last or first) + 1))
    return out


def _diff(row: dict, name: str) -> str:
    """summary.json's p99 − the emitter's true p99 over the same requests (ms)."""
    reported, true = row.get(f"reported_{name}_p99_ms"), row.get(f"true_{name}_p99_ms")
    return "-" if reported is None or true != true else f"{reported - true:+.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="asyncio,locust",
                    help="asyncio or locust, :N for N sending processes (asyncio:2; locust:2 is a master and 2 "
                    "workers), comma-separated")
    ap.add_argument("--cpus", default="1", help="loadgen's CPUs (taskset -c); the emitter keeps CPU 0")
    ap.add_argument("--streams", default="64,128,192,256")
    ap.add_argument("--duration-s", type=float, default=10.0, help="measured seconds per row (after the warm-up)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each row (each reported)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for engine in args.engines.split(","):
            print(f"\n{engine}:\n| streams | tokens/s | chunk-gap p99 error | TTFT p99 error | loadgen CPU per 1k "
                  "tokens | loadgen CPU use | emitter lateness p99 | reported − true gap p99 | reported − true "
                  "TTFT p99 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for n in (int(x) for x in args.streams.split(",") for _ in range(args.repeat)):
                r = run_once(engine, n, args.duration_s, Path(d) / f"{engine.replace(':', '-')}-{n}-{len(rows)}",
                             args.cpus)
                rows.append({"engine": engine, "streams": n, **r})
                print(f"| {n} | {r['tokens_per_s']:,.0f} | {r['gap_p99_ms']:.2f} ms | {r['ttft_p99_ms']:.2f} ms | "
                      f"{r['cpu_ms_per_1k']:.1f} ms | {r['cpu_utilization']:.2f} | "
                      f"{r['emitter_lateness_p99_us']:.0f} µs | {_diff(r, 'gap')} | {_diff(r, 'ttft')} |", flush=True)
    print(f"\nemitter: {rows[0]['emitter_scheduler'] if rows else '-'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
