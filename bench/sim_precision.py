"""The simulator's own emission precision: when each token's bytes hit the socket vs the modelled step end.

    python bench/sim_precision.py                      # h11 raw protocol (the shipped stack), 1/64/256 streams
    python bench/sim_precision.py --stack aiohttp      # the same engine behind aiohttp handlers, for comparison

The server runs in a child process pinned to CPU 0; a lean raw-socket reader pinned to CPU 1 consumes the
streams (it only reads, so it never holds the server back). Error = write time - modelled emission time, over
every token of every stream. Goal: p99 <= 1 ms at 64 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_target.sim import build_config, read_trace, start_simulator  # noqa: E402


async def _one_stream(port: int, body: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    while await reader.read(65536):
        pass
    writer.close()


async def _drive(port: int, streams: int, tokens: int, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi " * 50}],
                       "max_tokens": tokens, "ignore_eos": True, "stream": True}).encode()
    await asyncio.gather(*(_one_stream(port, body) for _ in range(streams)))


def _errors_h11(trace_path: Path) -> list[float]:
    errors = []
    for e in read_trace(trace_path):
        if e["type"] == "step":
            errors += [(t_write - e["t_end_ns"]) / 1e6 for _, _, t_write in e["tokens"]]
    return errors


def run_once(stack: str, streams: int, tokens: int) -> list[float]:
    cfg = build_config("a100-llama-7b")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("trace.jsonl" if stack == "h11" else "errors.json")
        if stack == "h11":
            sim = start_simulator(cfg, trace_path=out, cpu=0)
            stop = sim.stop
            port = int(sim.base_url.rsplit(":", 1)[1].split("/")[0])
        else:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sim_aiohttp_variant.py")),
                                     str(out)], stdout=subprocess.PIPE, text=True,
                                    preexec_fn=lambda: os.sched_setaffinity(0, {0}))
            port = int(proc.stdout.readline().split()[-1])

            def stop() -> None:
                proc.terminate()
                proc.wait()
        try:
            os.sched_setaffinity(0, {1})
            asyncio.run(_drive(port, streams, tokens, cfg.model))
        finally:
            stop()
        return _errors_h11(out) if stack == "h11" else json.loads(out.read_text())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", choices=["h11", "aiohttp"], default="h11")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    args = ap.parse_args()
    print(f"stack={args.stack}  error = socket write - modelled emission (ms), every token")
    print(f"{'streams':>8} {'tokens':>8} {'median':>8} {'p99':>8} {'max':>8}")
    for n in args.streams:
        errors = run_once(args.stack, n, args.tokens)
        print(f"{n:>8} {len(errors):>8} {statistics.median(errors):>8.3f} {pct(errors, 0.99):>8.3f} "
              f"{max(errors):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
