"""An hour-long run at a steady rate: does loadgen's memory stay flat, are the record parts merged as it goes, and
is the report of such a run still small and quick to open?

    python bench/soak.py                                  # 3,600 s at 50 requests/s on the embedded simulator
    python bench/soak.py --duration-s 180 --out /tmp/soak  # a short rehearsal

Runs ``loadgen run`` as a child process and samples, every ``--every-s`` seconds: the resident memory of loadgen
and of its embedded simulator (psutil), and the record part files in the run directory. After the run: the size
of report.html and the time chromium (driven by Playwright) takes from opening it to every chart drawn
(``body[data-charts-done]``), best of three. Prints a table and writes OUT/soak.json. Not a test: it takes the
run's duration; keep the machine otherwise quiet (loadgen and the simulator share its cores).

Memory growth is the resident memory at the end of sending less the resident memory one minute after sending
began (or a third of a shorter run); sending begins when the first record part appears, after the plan's
prompts are built (~110 s for the hour's 180,000). The issue's line is < 100 MB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """
name: soak
target: {{base_url: embedded, model: auto, simulator: {{preset: h100-llama-8b}}}}
seed: 11
load: {{arrival: poisson, rate_per_s: {rate}, duration_s: {duration}, warmup_s: 0, max_in_flight: 512}}
workload:
  classes:
    - name: chat
      prompt_tokens: {{dist: lognormal, median: 200, sigma: 0.5, min: 32, max: 1500}}
      output_tokens: {{dist: lognormal, median: 100, sigma: 0.4, min: 16, max: 300}}
slo:
  ttft_ms: {{p99: 1500}}
  itl_ms: {{p99: 100}}
  error_rate: {{max: 0.01}}
"""


def rss_mb(proc: psutil.Process) -> tuple[float, float]:
    """(loadgen's RSS, its children's RSS) in MB; zeros when gone."""
    try:
        own = proc.memory_info().rss / 2**20
        kids = sum(c.memory_info().rss for c in proc.children(recursive=True)) / 2**20
        return own, kids
    except psutil.Error:
        return 0.0, 0.0


def sample_run(cmd: list[str], out: Path, every_s: float, duration_s: float) -> tuple[list[dict], int]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ps = psutil.Process(proc.pid)
    samples, t0 = [], time.monotonic()
    while proc.poll() is None:
        own, kids = rss_mb(ps)
        parts = len(list(out.glob("requests.part-*.parquet"))) if out.exists() else 0
        samples.append({"t_s": round(time.monotonic() - t0, 1), "loadgen_rss_mb": round(own, 1),
                        "simulator_rss_mb": round(kids, 1), "parts": parts})
        if len(samples) % max(1, int(60 / every_s)) == 0:
            print(f"{samples[-1]['t_s']:7.0f} s  loadgen {own:7.1f} MB  simulator {kids:6.1f} MB  "
                  f"parts {parts}", flush=True)
        try:
            proc.wait(timeout=every_s)  # a sampling period, or the run's end
        except subprocess.TimeoutExpired:
            pass
    tail = proc.stdout.read() if proc.stdout else ""
    print(tail[-3000:])
    return samples, proc.returncode


def render_s(report: Path) -> float:
    """Seconds from opening report.html in chromium to every chart drawn (best of three)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    best = float("inf")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(3):
                page = browser.new_context(offline=True).new_page()
                t0 = time.monotonic()
                page.goto(report.as_uri())
                page.wait_for_selector("body[data-charts-done]", timeout=120_000)
                best = min(best, time.monotonic() - t0)
                page.close()
        finally:
            browser.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--rate-per-s", type=float, default=50.0)
    ap.add_argument("--every-s", type=float, default=5.0, help="sampling period")
    ap.add_argument("--out", type=Path, default=Path("/tmp/soak"))
    ap.add_argument("--engine", default="asyncio", choices=["asyncio", "locust"])
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    scenario = args.out / "soak.yaml"
    scenario.write_text(SCENARIO.format(rate=args.rate_per_s, duration=args.duration_s))
    run_dir = args.out / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", str(scenario), "--out", str(run_dir), "--no-progress",
           "--no-png", "--engine", args.engine]
    samples, rc = sample_run(cmd, run_dir, args.every_s, args.duration_s)
    doc = summarise(samples, rc, run_dir, args)
    (args.out / "soak.json").write_text(json.dumps({**doc, "samples": samples}, indent=1))
    print(json.dumps(doc, indent=1))


def summarise(samples: list[dict], rc: int, run_dir: Path, args: argparse.Namespace) -> dict:
    # sending starts when the first part appears (after the prompts are built) and ends with the simulator
    start = next((s["t_s"] for s in samples if s["parts"] > 0), 0.0) - 1.0
    sending = [s for s in samples if start <= s["t_s"] <= start + args.duration_s and s["simulator_rss_mb"] > 0]
    ref = next(s for s in sending if s["t_s"] >= start + min(60.0, args.duration_s / 3))
    end = sending[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    report = run_dir / "report.html"
    return {
        "exit_code": rc, "duration_s": args.duration_s, "rate_per_s": args.rate_per_s, "engine": args.engine,
        "requests": summary["requests"], "output_tokens_per_s": summary["throughput"]["output_tokens_per_s"],
        "sending_started_s": start, "analysis_s": round(samples[-1]["t_s"] - end["t_s"], 1),
        "loadgen_rss_mb": {"at_ref": ref["loadgen_rss_mb"], "ref_t_s": ref["t_s"], "end_of_sending":
                           end["loadgen_rss_mb"], "growth": round(end["loadgen_rss_mb"] - ref["loadgen_rss_mb"], 1),
                           "max_while_sending": max(s["loadgen_rss_mb"] for s in sending),
                           "max_overall": max(s["loadgen_rss_mb"] for s in samples)},
        "simulator_rss_mb": {"at_ref": ref["simulator_rss_mb"], "end_of_sending": end["simulator_rss_mb"]},
        "parts_max": max(s["parts"] for s in samples), "parts_at_end_of_sending": end["parts"],
        "files": {p.name: p.stat().st_size for p in sorted(run_dir.iterdir()) if p.is_file()},
        "report_html_bytes": report.stat().st_size, "report_render_s": round(render_s(report), 3),
    }


if __name__ == "__main__":
    main()
