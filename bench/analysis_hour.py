"""The analysis of an hour-long run: how long ``loadgen report`` takes and how much memory it peaks at.

    python bench/analysis_hour.py                       # synthesise (once, cached under --out) and measure
    python bench/analysis_hour.py --requests 20000      # a smaller rehearsal (its own cache directory)

Synthesises the records of an hour at 50 requests/s (≈180,000 requests, ≈19 M chunk rows) in the run's own
Parquet schema, without running the hour: lognormal prompt (median 200) and output (median 100, one token a
chunk) lengths, chunk gaps of 10–30 ms with an occasional stall of 100–800 ms, a few errors (no chunks). The
records are written as a real run leaves them when it is cut off before its final merge: tiered part pairs
(``requests.part-00001-00256.parquet``...) in completion order, each request's chunks together, so the report
merges them as ``loadgen run``'s close does. run.json is the one of a 5 s run of the same scenario on the
embedded simulator (its scenario, its target), with ``planned`` set to the hour's.

Each measurement copies the cached parts into a fresh run directory, runs ``loadgen report DIR --no-png`` as a
child process and samples its resident memory (psutil, children included) every 50 ms. Prints and writes
OUT/analysis_hour.json: wall seconds, peak RSS in MB, the rows and a few summary figures (so a change that
makes the analysis faster but different shows).

Measured on a 2-core, 24 GiB machine shared with other work (180,000 requests, 19.4 M chunk rows; the same
summary.json before and after, key for key and bit for bit):

- before (at 910943a): 274 s, peak 5,650 MB;
- after (one narrow RunAnalysis, b6617d2): 14–15 s, peak 987–1,016 MB across runs. About 430 MB of it is live
  (the narrow gaps, 330 MB; the requests); the rest is the largest transient (≈300 MB: one float column of
  the hour and the copy a quantile or sort makes) and freed pages polars' allocator (jemalloc) keeps for a
  while: with ``_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`` in the environment an earlier state
  (1,046 MB without it) peaked at 903 MB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:  # the records' schema: loadgen/records/schema.py (before the records stage: analysis/frames.py)
    from loadgen.records.schema import CHUNK_SCHEMA, REQUEST_SCHEMA  # noqa: E402
except ImportError:  # a commit before the records stage, for a "before" figure
    from loadgen.analysis.frames import CHUNK_SCHEMA, REQUEST_SCHEMA  # type: ignore[no-redef]  # noqa: E402

SCENARIO = """
name: soak
target: {base_url: embedded, model: auto, simulator: {preset: h100-llama-8b}}
seed: 11
load: {arrival: poisson, rate_per_s: 20, duration_s: 5, warmup_s: 0, max_in_flight: 512}
workload:
  classes:
    - name: chat
      prompt_tokens: {dist: lognormal, median: 200, sigma: 0.5, min: 32, max: 1500}
      output_tokens: {dist: lognormal, median: 100, sigma: 0.4, min: 16, max: 300}
slo:
  ttft_ms: {p99: 1500}
  itl_ms: {p99: 100}
  error_rate: {max: 0.01}
"""
PART_REQUESTS = 4_000  # requests a part holds (a real run flushes about every second; tiers merge them)


def template_run_json(out: Path) -> dict:
    """run.json of a 5 s run of the scenario on the embedded simulator."""
    tpl = out / "template"
    if not (tpl / "run.json").exists():
        shutil.rmtree(tpl, ignore_errors=True)
        (out / "scenario.yaml").write_text(SCENARIO)
        subprocess.run([sys.executable, "-m", "loadgen", "run", str(out / "scenario.yaml"), "--out", str(tpl),
                        "--no-progress", "--no-png"], cwd=ROOT, check=False, capture_output=True)
    return json.loads((tpl / "run.json").read_text())


def synthesise(n: int, rate_per_s: float, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(requests, chunks) of ``n`` requests at ``rate_per_s``, requests in completion order."""
    rng = np.random.default_rng(seed)
    t0 = 1_000_000_000_000
    intended = t0 + np.cumsum(rng.exponential(1e9 / rate_per_s, n)).astype(np.int64)
    sent = intended + rng.integers(10_000, 2_000_000, n)
    prompt = np.clip(np.round(rng.lognormal(np.log(200), 0.5, n)), 32, 1500).astype(np.int64)
    out_tok = np.clip(np.round(rng.lognormal(np.log(100), 0.4, n)), 16, 300).astype(np.int64)
    failed = rng.random(n) < 0.002
    ttft = (20e6 + prompt * 0.15e6 + rng.exponential(30e6, n)).astype(np.int64)
    first = sent + ttft
    n_chunks = np.where(failed, 0, out_tok)
    total = int(n_chunks.sum())
    gaps = rng.integers(10_000_000, 30_000_000, total)
    stalls = rng.random(total) < 0.0005
    gaps[stalls] = rng.integers(100_000_000, 800_000_000, int(stalls.sum()))
    starts = np.concatenate([[0], np.cumsum(n_chunks)[:-1]])
    owner = np.repeat(np.arange(n), n_chunks)
    gaps[starts[n_chunks > 0]] = 0  # a stream's first chunk is its first token
    cum = np.cumsum(gaps)
    t_ns = first[owner] + cum - cum[starts[owner]]
    last = np.where(failed, first, first)
    has = n_chunks > 0
    last[has] = t_ns[starts[has] + n_chunks[has] - 1]
    done = np.where(failed, sent + rng.integers(1_000_000, 50_000_000, n), last + 200_000)
    seq = np.arange(n, dtype=np.int64)
    requests = pl.DataFrame({
        "seq": seq, "class_name": ["chat"] * n, "warmup": np.zeros(n, bool), "t_intended_ns": intended,
        "t_sent_ns": sent, "t_first_token_ns": pl.Series(np.where(failed, 0, first)),
        "t_last_token_ns": pl.Series(last), "t_done_ns": done, "prompt_tokens_asked": prompt,
        "prompt_tokens": prompt, "prompt_tokens_source": ["server"] * n, "output_tokens_asked": out_tok,
        "output_tokens": np.where(failed, 0, out_tok), "output_tokens_source": ["server"] * n, "chunks": n_chunks,
        "request_id": [f"chatcmpl-{i:08d}" for i in range(n)], "finish_reason": ["length"] * n,
        "http_status": np.where(failed, 500, 200), "error_kind": pl.Series([None] * n, dtype=pl.String),
        "error_message": pl.Series([None] * n, dtype=pl.String), "reasoning": np.zeros(n, bool),
        "worker": np.zeros(n, np.int64), "conversation": pl.Series([None] * n, dtype=pl.Int64),
        "turn": pl.Series([None] * n, dtype=pl.Int64), "cached_tokens": pl.Series([None] * n, dtype=pl.Int64),
    }, schema=REQUEST_SCHEMA)
    requests = requests.with_columns(
        t_first_token_ns=pl.when(pl.Series(failed)).then(None).otherwise(pl.col("t_first_token_ns")),
        t_last_token_ns=pl.when(pl.Series(failed)).then(None).otherwise(pl.col("t_last_token_ns")),
        error_kind=pl.when(pl.Series(failed)).then(pl.lit("http")).otherwise(None),
        error_message=pl.when(pl.Series(failed)).then(pl.lit("HTTP 500: overloaded")).otherwise(None),
        finish_reason=pl.when(pl.Series(failed)).then(None).otherwise(pl.col("finish_reason")))
    chunks = pl.DataFrame({"seq": seq[owner], "t_ns": t_ns, "tokens": np.ones(total, np.int64),
                           "reasoning": np.zeros(total, bool), "worker": np.zeros(total, np.int64)},
                          schema=CHUNK_SCHEMA)
    order = np.argsort(done, kind="stable")  # the sink writes a request when it ends
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    requests = requests.with_columns(_rank=pl.Series(rank)).sort("_rank").drop("_rank")
    chunks = (chunks.with_columns(_rank=pl.Series(rank[owner]), _i=pl.int_range(pl.len()))
              .sort("_rank", "_i").drop("_rank", "_i"))
    return requests, chunks


def write_parts(src: Path, requests: pl.DataFrame, chunks: pl.DataFrame) -> None:
    """Part pairs of PART_REQUESTS requests each, named as tier-merged parts (16 flushes a part)."""
    src.mkdir(parents=True, exist_ok=True)
    counts = requests["chunks"].to_numpy()
    ends = np.cumsum(counts)
    for k, lo in enumerate(range(0, requests.height, PART_REQUESTS)):
        hi = min(lo + PART_REQUESTS, requests.height)
        c_lo, c_hi = (int(ends[lo - 1]) if lo else 0), int(ends[hi - 1])
        span = f"{k * 16 + 1:05d}-{k * 16 + 16:05d}"
        requests.slice(lo, hi - lo).write_parquet(src / f"requests.part-{span}.parquet")
        chunks.slice(c_lo, c_hi - c_lo).write_parquet(src / f"chunks.part-{span}.parquet")


def ensure_source(out: Path, n: int, rate_per_s: float) -> Path:
    src = out / f"source-{n}"
    if (src / "run.json").exists():
        return src
    info = template_run_json(out)
    shutil.rmtree(src, ignore_errors=True)
    t = time.monotonic()
    requests, chunks = synthesise(n, rate_per_s, seed=11)
    write_parts(src, requests, chunks)
    info.update(planned=n, findings=[], notes=[])
    info["scenario"]["load"].update(rate_per_s=rate_per_s, duration_s=n / rate_per_s)
    (src / "run.json").write_text(json.dumps(info, indent=2))
    print(f"synthesised {requests.height:,} requests, {chunks.height:,} chunks in {time.monotonic() - t:.0f} s "
          f"→ {src}", flush=True)
    return src


def measure(src: Path, work: Path, every_s: float = 0.05) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    cmd = [sys.executable, "-m", "loadgen", "report", str(work), "--no-png"]
    t = time.monotonic()
    proc = psutil.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(every_s)
    wall = time.monotonic() - t
    output = proc.stdout.read() if proc.stdout else ""
    summary = json.loads((work / "summary.json").read_text()) if (work / "summary.json").exists() else {}
    met = summary.get("metrics", {})
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 2**20), "rc": proc.returncode,
            "requests": summary.get("requests", {}).get("sent"), "verdict": summary.get("verdict"),
            "ttft_p99_ms": met.get("ttft_ms", {}).get("p99"), "itl_p99_ms": met.get("itl_ms", {}).get("p99"),
            "itl_count": met.get("itl_ms", {}).get("count"), "stalls": summary.get("stalls", {}).get("count"),
            "output_tail": output[-600:] if proc.returncode not in (0, 1) else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/analysis_hour"))
    ap.add_argument("--requests", type=int, default=180_000)
    ap.add_argument("--rate-per-s", type=float, default=50.0)
    ap.add_argument("--label", default="", help="a name for this measurement in the JSON")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    src = ensure_source(args.out, args.requests, args.rate_per_s)
    figures = {"label": args.label, **measure(src, args.out / f"work-{args.requests}")}
    print(json.dumps(figures, indent=2))
    (args.out / "analysis_hour.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
