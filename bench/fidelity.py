"""loadgen's measurement error against a reference emitter whose true send times are known.

    python bench/fidelity.py                 # the accuracy table (TTFT 100 ms, ITL 20 ms, 128 tokens)
    python bench/fidelity.py --capacity      # highest tokens/s at chunk-gap p99 error <= 2 ms (ITL 5 ms)
    python bench/fidelity.py --poisson       # open-loop Poisson at 200 req/s: achieved rate and send lag
    python bench/fidelity.py --tls           # 64 streams over http and over https (lean transport + TLS)

The emitter runs pinned to CPU 0, ``loadgen run`` pinned to CPU 1 (taskset); both read CLOCK_MONOTONIC.
Errors, in ms: TTFT error = loadgen's first-token stamp − the emitter's write of that token (loadgen stamps
its send immediately before the write syscall, so this is the whole error of ttft_service_ms; the emitter's own
receipt stamp is not used: in a burst of N requests it lags the kernel's arrival by the emitter's backlog);
chunk-gap error = loadgen's gap − the emitter's gap between the same two writes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


TLS: dict[str, str] = {}  # --tls: {"cert": server PEM, "ca": CA PEM}; empty: plain http


def scenario_yaml(port: int, load: str, tokens: int) -> str:
    scheme, tls = ("https", f", tls: {{ca_bundle: {TLS['ca']}}}") if TLS else ("http", "")
    return f"""
name: fidelity
target: {{base_url: "{scheme}://127.0.0.1:{port}/v1", model: auto, ttft_timeout_s: 30, idle_timeout_s: 30{tls}}}
load: {load}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: {tokens}}}}}]
slo: {{max_generator_lag_ms: 1000}}
"""

ENGINE = "asyncio"


def run(ttft_ms: float, itl_ms: float, tokens: int, load: str, tmp: Path) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "writes.json"
    emitter = subprocess.Popen(["taskset", "-c", "0", sys.executable, str(ROOT / "bench/reference_emitter.py"),
                                "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--log", str(log),
                                *(["--tls-cert", TLS["cert"]] if TLS else [])],
                               stdout=subprocess.PIPE, text=True)
    port = int(emitter.stdout.readline().split()[1])
    path = tmp / "s.yaml"
    path.write_text(scenario_yaml(port, load, tokens))
    out = tmp / "run"
    res = subprocess.run(["taskset", "-c", "1", sys.executable, "-m", "loadgen", "run", str(path), "--out",
                          str(out), "--no-progress", "--no-png", "--engine", ENGINE], cwd=ROOT, capture_output=True,
                         text=True)
    emitter.terminate()
    emitter.wait()
    if res.returncode not in (0, 1, 3):
        raise SystemExit(res.stderr)
    return {"truth": json.loads(log.read_text()), "requests": pl.read_parquet(out / "requests.parquet"),
            "chunks": pl.read_parquet(out / "chunks.parquet"),
            "summary": json.loads((out / "summary.json").read_text())}


def errors(result: dict) -> tuple[list[float], list[float]]:
    truth, req, chunks = result["truth"], result["requests"], result["chunks"]
    by_seq = {seq: g["t_ns"].to_list() for (seq,), g in chunks.sort("t_ns").group_by("seq")}
    ttft_err, gap_err = [], []
    for row in req.filter(pl.col("error_kind").is_null()).iter_rows(named=True):
        t = truth[row["request_id"]]
        writes = t[1:]  # t[0] is the emitter's receipt of the request
        ttft_err.append((row["t_first_token_ns"] - writes[0]) / 1e6)
        seen = by_seq[row["seq"]]
        gap_err += [((b - a) - (wb - wa)) / 1e6 for a, b, wa, wb in zip(seen, seen[1:], writes, writes[1:])]
    return ttft_err, gap_err


def accuracy(tmp: Path, streams: tuple[int, ...] = (1, 16, 64, 256)) -> None:
    print("| streams | TTFT err median | TTFT err p99 | chunk-gap err median | chunk-gap err p99 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in streams:
        r = run(100, 20, 128, f"{{arrival: concurrency, concurrency: {n}, requests: {2 * n}, max_in_flight: {n}}}",
                tmp / f"a{n}")
        t, g = errors(r)
        print(f"| {n} | {statistics.median(t):.3f} | {pct(t, .99):.3f} | {statistics.median(g):.3f} | "
              f"{pct([abs(x) for x in g], .99):.3f} |", flush=True)


def capacity(tmp: Path) -> None:
    """Sustained load: open-loop constant arrivals sized so ~N streams are in flight (a closed loop of
    identical requests would start and end all N in lock-step waves, which is not a steady state)."""
    print("| streams | tokens/s | chunk-gap err p99 | TTFT err p99 | loadgen CPU s per 1k tokens | CPU use |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    ttft_ms, itl_ms, tokens = 50, 5, 400
    per_request_s = (ttft_ms + tokens * itl_ms) / 1e3
    for n in (32, 64, 128, 192, 256, 320):
        rate = n / per_request_s
        r = run(ttft_ms, itl_ms, tokens, f"{{arrival: constant, rate_per_s: {rate:.3f}, duration_s: 8, "
                f"max_in_flight: {2 * n}}}", tmp / f"c{n}")
        t, g = errors(r)
        toks = r["summary"]["throughput"]["output_tokens_per_s"]
        total = int(r["requests"]["output_tokens"].sum())
        gen = r["summary"]["generator"]  # CPU of the engine's run only (no start-up, no analysis)
        cpu = (f"{gen['cpu_s'] / total * 1000:.4f} | {gen['cpu_utilization']:.2f}" if "cpu_s" in gen
               else "– | –")  # the Locust engine does not measure it
        print(f"| {n} | {toks:.0f} | {pct([abs(x) for x in g], .99):.3f} | {pct(t, .99):.3f} | {cpu} |", flush=True)


def tls_vs_http(tmp: Path, repeats: int) -> None:
    """The same 64-stream accuracy run over http and over https (a trustme CA; the emitter serves TLS)."""
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
    for label, tls in (("http", {}), ("https", {"cert": str(tmp / "server.pem"), "ca": str(tmp / "ca.pem")})):
        TLS.clear()
        TLS.update(tls)
        print(f"\n{label}, 64 streams (TTFT 100 ms, ITL 20 ms, 128 tokens), {repeats} runs:")
        for i in range(repeats):
            accuracy(tmp / f"{label}{i}", streams=(64,))


def poisson(tmp: Path) -> None:
    r = run(20, 5, 8, "{arrival: poisson, rate_per_s: 200, duration_s: 20, max_in_flight: 512}", tmp / "p")
    s, req = r["summary"], r["requests"]
    window_s = (req["t_sent_ns"].max() - req["t_sent_ns"].min()) / 1e9
    planned_window_s = (req["t_intended_ns"].max() - req["t_intended_ns"].min()) / 1e9
    lag = ((req["t_sent_ns"] - req["t_intended_ns"]) / 1e6).to_list()
    print(f"sent {req.height} in {window_s:.2f} s = {(req.height - 1) / window_s:.1f} req/s "
          f"(plan: {(req.height - 1) / planned_window_s:.1f} req/s); send lag median {statistics.median(lag):.3f} "
          f"ms, p99 {pct(lag, .99):.3f} ms, max {max(lag):.3f} ms; errors {s['requests']['failed']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--poisson", action="store_true")
    ap.add_argument("--tls", action="store_true", help="64 streams over http, then over https")
    ap.add_argument("--repeats", type=int, default=3, help="--tls: runs of each")
    ap.add_argument("--engine", default="asyncio", choices=["asyncio", "locust"],
                    help="loadgen run --engine (locust: one Locust process, the same CPU pin)")
    args = ap.parse_args()
    ENGINE = args.engine
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.tls:
            tls_vs_http(tmp, args.repeats)
        elif args.capacity:
            capacity(tmp)
        elif args.poisson:
            poisson(tmp)
        else:
            accuracy(tmp)
